"""``fleetstore stress``: N agent processes write one database through ``Database``.

Each agent is a separate OS process (``python -m fleetstore.ops.stress --agent
CONFIG``) that opens the store, says ``ready`` and waits for a common start
time, so the slow start of many interpreters is not counted in the run.  Until
the end time it thinks (exponential, mean ``think_ms``; 0 is a closed loop),
then inserts one row ``(agent, seq, payload, t)`` in ``with db.write()``.  A
write is acknowledged only once the block has returned.  At exit each agent
writes a JSON report (acknowledged seqs, failures with their error type, the
latency of every acknowledged write).

The parent then reads the file from disk with its own connection and checks it
against those reports: lost = acknowledged but absent, duplicated = an
``(agent, seq)`` present more than once, plus ``PRAGMA integrity_check``.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import random
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import fleetstore
from fleetstore import Database, Migration, ReadTx, Settings

# No UNIQUE(agent, seq) on purpose: a write committed twice must show up as a
# second row, not be hidden behind a constraint error.
STRESS_MIGRATIONS = (
    Migration(
        1,
        "stress_writes",
        "CREATE TABLE stress_writes("
        "id INTEGER PRIMARY KEY, agent INTEGER NOT NULL, seq INTEGER NOT NULL, "
        "payload BLOB NOT NULL, t REAL NOT NULL)",
    ),
)
INSERT_SQL = "INSERT INTO stress_writes(agent, seq, payload, t) VALUES (?,?,?,?)"

# Details of at most this many failures are kept per agent; all are counted.
_FAILURE_DETAILS = 50
_START_DELAY = 0.25  # seconds between "start" being sent and the common start time
_POLL = 0.05


class StressError(Exception):
    """The stress run could not be carried out (an agent failed to start, ...)."""


@dataclass(frozen=True, slots=True)
class ExternalLock:
    """``HOLD@AT``: at second AT of the run, hold the write lock for HOLD seconds."""

    hold: float
    at: float

    @classmethod
    def parse(cls, text: str) -> ExternalLock:
        hold_s, sep, at_s = text.strip().partition("@")
        try:
            hold, at = float(hold_s), float(at_s)
        except ValueError:
            hold = at = math.nan
        if not sep or not (math.isfinite(hold) and math.isfinite(at)) or hold <= 0 or at < 0:
            raise ValueError(
                f"{text!r} is not HOLD@AT (seconds, e.g. 3@0.5: hold the lock 3 s "
                "from second 0.5 of the run; HOLD > 0, AT >= 0)"
            )
        return cls(hold, at)

    def __str__(self) -> str:
        return f"{self.hold:g}@{self.at:g}"


@dataclass(frozen=True, slots=True)
class StressConfig:
    agents: int = 16
    duration: float = 10.0
    think_ms: float = 10.0
    path: str | None = None
    payload_bytes: int = 200
    large_rate: float = 0.0
    large_bytes: int = 4 * 1024 * 1024
    synchronous: str | None = None
    write_budget: float | None = None
    seed: int | None = None
    external_locks: tuple[ExternalLock, ...] = ()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first option that cannot be used."""
        if self.agents < 1:
            raise ValueError("--agents must be at least 1")
        if not (math.isfinite(self.duration) and self.duration > 0):
            raise ValueError("--duration must be a number of seconds > 0")
        if not (math.isfinite(self.think_ms) and self.think_ms >= 0):
            raise ValueError("--think-ms must be a number >= 0")
        if self.payload_bytes < 0 or self.large_bytes < 0:
            raise ValueError("--payload-bytes and --large-bytes must be >= 0")
        if not 0 <= self.large_rate <= 1:
            raise ValueError("--large-rate must be between 0 and 1")
        for lock in self.external_locks:
            if lock.at >= self.duration:
                raise ValueError(
                    f"--external-lock {lock}: starts at {lock.at:g}s, "
                    f"after the run ends ({self.duration:g}s)"
                )


def default_path() -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return fleetstore.default_data_dir() / "stress" / f"stress-{stamp}-{os.getpid()}.db"


# --------------------------------------------------------------------------- agent


def _agent_main(argv: Sequence[str]) -> int:
    # Ctrl-C reaches the whole process group; the parent decides when agents stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if len(argv) != 2 or argv[0] != "--agent":
        print("usage: python -m fleetstore.ops.stress --agent CONFIG_JSON", file=sys.stderr)
        return 2
    cfg: dict[str, Any] = json.loads(argv[1])
    parent = os.getppid()
    agent: int = cfg["agent"]
    db = Database.open(cfg["path"], migrations=STRESS_MIGRATIONS, **cfg["settings"])
    db.read(lambda tx: tx.execute("SELECT count(*) FROM stress_writes WHERE 0"))
    print("ready", flush=True)
    line = sys.stdin.readline().split()
    if len(line) != 3 or line[0] != "start":
        return 1  # the parent went away before the start
    # CLOCK_MONOTONIC is one clock for every process on the host, so the
    # parent's start and end times mean the same instant here.
    start, end = float(line[1]), float(line[2])

    rng = random.Random(f"{cfg['seed']}/{agent}")
    small = rng.randbytes(cfg["payload_bytes"])
    large_rate: float = cfg["large_rate"]
    large = rng.randbytes(cfg["large_bytes"]) if large_rate > 0 else b""
    think = cfg["think_ms"] / 1000.0

    acked: list[list[int]] = []
    waits: list[float] = []
    failed_seqs: list[list[int]] = []
    failures_by_type: Counter[str] = Counter()
    failure_details: list[dict[str, Any]] = []
    _sleep_until(start)
    seq = 0
    while True:
        if think > 0:
            wake = time.monotonic() + rng.expovariate(1.0 / think)
            if wake >= end:
                break
            _sleep_until(wake)
        elif time.monotonic() >= end:
            break
        if os.getppid() != parent:
            break  # orphaned: nobody will read the report
        seq += 1
        payload = large if large_rate > 0 and rng.random() < large_rate else small
        began = time.monotonic()
        try:
            with db.write() as tx:
                tx.execute(INSERT_SQL, (agent, seq, payload, time.time()))
        except Exception as exc:
            kind = _error_name(exc)
            _add_to_runs(failed_seqs, seq)
            failures_by_type[kind] += 1
            if len(failure_details) < _FAILURE_DETAILS:
                failure_details.append(
                    {
                        "seq": seq,
                        "type": kind,
                        "message": str(exc)[:500],
                        "waited": time.monotonic() - began,
                    }
                )
            continue
        waits.append(time.monotonic() - began)
        _add_to_runs(acked, seq)
    ended = time.monotonic()
    metrics = db.metrics()
    db.close()
    report = {
        "agent": agent,
        "pid": os.getpid(),
        "acked_runs": acked,
        "acked_count": len(waits),
        "waits": waits,
        "failed_runs": failed_seqs,
        "failed_count": sum(failures_by_type.values()),
        "failures_by_type": dict(failures_by_type),
        "failures": failure_details,
        "started": start,
        "ended": ended,
        "metrics": metrics,
    }
    tmp = cfg["result"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f)
    os.replace(tmp, cfg["result"])
    return 0


def _add_to_runs(runs: list[list[int]], seq: int) -> None:
    # Seqs only grow, and mostly by one: runs keep a long run's report small.
    if runs and runs[-1][1] == seq - 1:
        runs[-1][1] = seq
    else:
        runs.append([seq, seq])


class _Runs:
    """Sorted, disjoint runs ``[first, last]`` of sequence numbers, with membership."""

    __slots__ = ("_ends", "_starts")

    def __init__(self, runs: Sequence[Sequence[int]] = ()) -> None:
        self._starts = [int(r[0]) for r in runs]
        self._ends = [int(r[1]) for r in runs]

    def __contains__(self, seq: int) -> bool:
        i = bisect.bisect_right(self._starts, seq) - 1
        return i >= 0 and seq <= self._ends[i]

    def __iter__(self) -> Iterator[int]:
        for start, end in zip(self._starts, self._ends, strict=True):
            yield from range(start, end + 1)


def _error_name(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__.startswith("fleetstore"):
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"  # e.g. an apsw error that leaked through


def _sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        time.sleep(delay)


# -------------------------------------------------------------------------- parent


@dataclass(slots=True)
class _Agent:
    index: int
    proc: subprocess.Popen[bytes]
    result: Path
    errfile: Path


@dataclass(slots=True)
class _LockRun:
    spec: ExternalLock
    proc: subprocess.Popen[str] | None = None
    thread: threading.Thread | None = None
    started_at: float | None = None
    locked_at: float | None = None
    released_at: float | None = None
    held: float | None = None
    exit_code: int | None = None
    stderr: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "spec": str(self.spec),
            "hold": self.spec.hold,
            "at": self.spec.at,
            "started_at": _round(self.started_at),
            "locked_at": _round(self.locked_at),
            "released_at": _round(self.released_at),
            "held": _round(self.held),
            "exit_code": self.exit_code,
            "stderr": self.stderr.strip(),
        }


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


class _Progress:
    """One line on stderr: a redrawn bar on a terminal, a line every few seconds otherwise."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.tty = bool(stream is not None and stream.isatty())
        self.interval = 0.5 if self.tty else 3.0
        self._next = 0.0
        self._drawn = False

    def due(self) -> bool:
        return self.stream is not None and time.monotonic() >= self._next

    def show(self, text: str) -> None:
        if self.stream is None:
            return
        self._next = time.monotonic() + self.interval
        if self.tty:
            self.stream.write("\r\x1b[2K" + text)
            self._drawn = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        """A line that stays: ends any bar first."""
        if self.stream is None:
            return
        self.done()
        self.stream.write(text + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.stream is not None and self._drawn:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self._drawn = False


def _bar(fraction: float, width: int = 24) -> str:
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    # Agents import the same fleetstore as this process, installed or not.
    src = str(Path(fleetstore.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def _stop_processes(procs: Sequence[subprocess.Popen[Any]], grace: float = 3.0) -> None:
    live = [p for p in procs if p.poll() is None]
    for p in live:
        with suppress(ProcessLookupError):
            p.terminate()
    deadline = time.monotonic() + grace
    for p in live:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                p.kill()
            p.wait()


class _Fleet:
    """The child processes of one run; leaving the context kills whatever still runs."""

    def __init__(self, config: StressConfig, path: Path, seed: int, settings: dict[str, Any]):
        self.config = config
        self.path = path
        self.seed = seed
        self.settings = settings
        self.env = _child_env()
        self.agents: list[_Agent] = []
        self.locks: list[_LockRun] = []
        self.start = 0.0
        self.end = 0.0

    def __enter__(self) -> _Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        procs: list[subprocess.Popen[Any]] = [a.proc for a in self.agents]
        procs += [r.proc for r in self.locks if r.proc is not None]
        _stop_processes(procs)
        for a in self.agents:
            for stream in (a.proc.stdin, a.proc.stdout):
                if stream is not None:
                    with suppress(OSError):
                        stream.close()
        for r in self.locks:
            if r.thread is not None:
                r.thread.join(5)

    def spawn(self, workdir: Path) -> None:
        for i in range(self.config.agents):
            result = workdir / f"agent-{i}.json"
            errfile = workdir / f"agent-{i}.err"
            cfg = {
                "agent": i,
                "path": str(self.path),
                "settings": self.settings,
                "seed": self.seed,
                "think_ms": self.config.think_ms,
                "payload_bytes": self.config.payload_bytes,
                "large_rate": self.config.large_rate,
                "large_bytes": self.config.large_bytes,
                "result": str(result),
            }
            with open(errfile, "wb") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "fleetstore.ops.stress", "--agent", json.dumps(cfg)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    env=self.env,
                )
            self.agents.append(_Agent(i, proc, result, errfile))

    def wait_ready(self, timeout: float, progress: _Progress) -> None:
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            for a in self.agents:
                assert a.proc.stdout is not None
                sel.register(a.proc.stdout, selectors.EVENT_READ, a)
            waiting = len(self.agents)
            while waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StressError(
                        f"{waiting} of {len(self.agents)} agents not ready after {timeout:.0f}s"
                    )
                for key, _ in sel.select(min(left, 0.5)):
                    a = key.data
                    data = os.read(key.fd, 64)
                    sel.unregister(key.fileobj)
                    waiting -= 1
                    if b"ready" not in data:
                        a.proc.wait()
                        raise StressError(
                            f"agent {a.index} exited with code {a.proc.returncode} before it was "
                            f"ready: {_tail(a.errfile)}"
                        )
                if progress.due():
                    ready = len(self.agents) - waiting
                    progress.show(
                        f"starting agents {_bar(ready / len(self.agents))} {ready}/"
                        f"{len(self.agents)} ready"
                    )

    def go(self) -> None:
        self.start = time.monotonic() + _START_DELAY
        self.end = self.start + self.config.duration
        line = f"start {self.start!r} {self.end!r}\n".encode()
        for a in self.agents:
            assert a.proc.stdin is not None
            try:
                a.proc.stdin.write(line)
                a.proc.stdin.close()
            except BrokenPipeError:
                pass  # it died; reported as crashed when results are collected

    def launch_lock(self, run: _LockRun) -> None:
        wait = max(1.0, self.end - time.monotonic())
        run.started_at = time.monotonic() - self.start
        run.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "fleetstore", "lock", str(self.path)),
                *("--hold", f"{run.spec.hold:g}", "--wait", f"{wait:.3f}"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        run.thread = threading.Thread(target=self._watch_lock, args=(run,), daemon=True)
        run.thread.start()
        self.locks.append(run)

    def _watch_lock(self, run: _LockRun) -> None:
        proc = run.proc
        assert proc is not None and proc.stdout is not None and proc.stderr is not None
        with proc.stdout, proc.stderr:
            for line in proc.stdout:
                now = time.monotonic() - self.start
                if line.startswith("locked "):
                    run.locked_at = now
                elif line.startswith("released "):
                    run.released_at = now
                    with suppress(ValueError):
                        run.held = float(line.rsplit(" after ", 1)[1].strip().rstrip("s"))
            run.stderr = proc.stderr.read()
        run.exit_code = proc.wait()

    def running_agents(self) -> int:
        return sum(1 for a in self.agents if a.proc.poll() is None)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no output)"
    return " | ".join(text[-lines:]) or "(no output)"


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM ends a run like Ctrl-C does, so the children are killed on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(config: StressConfig, progress_stream: TextIO | None = None) -> dict[str, Any]:
    """Run the stress test; return the report (JSON-serialisable).

    Raises ``ValueError`` for unusable options, ``StressError`` (or a
    ``FleetstoreError``) when the run cannot be carried out, and
    ``KeyboardInterrupt`` if interrupted (SIGINT or SIGTERM); every child
    process is killed before it propagates.
    """
    config.validate()
    progress = _Progress(progress_stream)
    explicit: dict[str, Any] = {}
    if config.write_budget is not None:
        explicit["write_budget"] = config.write_budget
    if config.synchronous is not None:
        explicit["synchronous"] = config.synchronous
    effective = Settings.load(**explicit)  # what the agents will get, env included
    seed = config.seed if config.seed is not None else random.SystemRandom().randrange(2**31)
    path = Path(config.path).expanduser().resolve() if config.path else default_path()
    progress.note(f"fleetstore stress: database {path}")

    with _sigterm_interrupts():
        db = Database.open(str(path), migrations=STRESS_MIGRATIONS, **explicit)
        try:
            baseline = _max_id(db)
            with (
                tempfile.TemporaryDirectory(prefix="fleetstore-stress-") as tmp,
                _Fleet(config, path, seed, explicit) as fleet,
            ):
                began = time.monotonic()
                fleet.spawn(Path(tmp))
                fleet.wait_ready(30.0 + 1.0 * config.agents, progress)
                startup = time.monotonic() - began
                fleet.go()
                progress.note(
                    f"fleetstore stress: {config.agents} agents ready after {startup:.1f}s; "
                    f"writing for {config.duration:g}s"
                )
                _drive(fleet, db, baseline, effective.write_budget, progress)
                _stop_processes([r.proc for r in fleet.locks if r.proc is not None], grace=5.0)
                for r in fleet.locks:
                    if r.thread is not None:
                        r.thread.join(5)
                agents = _collect(fleet)
        finally:
            progress.done()
            db.close()
        progress.note(f"fleetstore stress: checking {path}")
        check = _read_back(path, baseline, agents)
    return _report(config, effective, seed, path, startup, fleet, agents, check)


def _drive(fleet: _Fleet, db: Database, baseline: int, budget: float, progress: _Progress) -> None:
    pending = sorted(fleet.config.external_locks, key=lambda lock: lock.at)
    longest_lock = max((lock.hold for lock in pending), default=0.0)
    hard_stop = fleet.end + budget + longest_lock + 30.0
    duration = fleet.config.duration
    while True:
        running = fleet.running_agents()
        if not running:
            return
        now = time.monotonic()
        while pending and now >= fleet.start + pending[0].at:
            fleet.launch_lock(_LockRun(pending.pop(0)))
        if now >= hard_stop:
            progress.note(f"fleetstore stress: {running} agents still running; killing them")
            _stop_processes([a.proc for a in fleet.agents], grace=1.0)
            return
        if progress.due():
            elapsed = max(0.0, now - fleet.start)
            written = _committed(db, baseline)
            rate = written / elapsed if elapsed > 0 else 0.0
            if now < fleet.end:
                progress.show(
                    f"stress {_bar(elapsed / duration)} {elapsed:5.1f}/{duration:g}s "
                    f"{written:,} writes ({rate:,.0f}/s)"
                )
            else:
                progress.show(f"stress finishing: {running} agents completing their last write")
        time.sleep(_POLL)


def _max_id(db: Database) -> int:
    rows = db.read(lambda tx: tx.execute("SELECT coalesce(max(id), 0) FROM stress_writes"))
    return int(rows[0][0])


def _committed(db: Database, baseline: int) -> int:
    try:
        return max(0, _max_id(db) - baseline)
    except fleetstore.FleetstoreError:
        return 0  # progress is cosmetic; the verdict comes from the final check


def _collect(fleet: _Fleet) -> list[dict[str, Any]]:
    results = []
    for a in fleet.agents:
        code = a.proc.wait()
        entry: dict[str, Any] = {"agent": a.index, "pid": a.proc.pid, "exit_code": code}
        try:
            data = json.loads(a.result.read_text())
        except (OSError, ValueError):
            entry["error"] = f"no report (exit code {code}): {_tail(a.errfile)}"
        else:
            entry.update(data)
            if code != 0:
                entry["error"] = f"exit code {code}: {_tail(a.errfile)}"
        results.append(entry)
    return results


@dataclass(slots=True)
class _Check:
    """The file read back from disk, compared with what the agents reported."""

    rows: int = 0
    acked_present: int = 0
    duplicated: int = 0
    failed_present: int = 0
    unacknowledged: int = 0
    lost_samples: list[list[int]] = field(default_factory=list)
    duplicated_samples: list[list[int]] = field(default_factory=list)
    integrity: list[str] = field(default_factory=list)


def _seqs_on_disk(tx: ReadTx, baseline: int, agent: int) -> list[tuple[Any, ...]]:
    return tx.execute("SELECT seq FROM stress_writes WHERE id > ? AND agent = ?", (baseline, agent))


def _read_back(path: Path, baseline: int, agents: Sequence[dict[str, Any]]) -> _Check:
    # A Database opened afresh, after every agent has exited: new connections,
    # nothing cached from the run, only what is on disk.
    acked = {int(a["agent"]): _Runs(a.get("acked_runs", ())) for a in agents}
    failed = {int(a["agent"]): _Runs(a.get("failed_runs", ())) for a in agents}
    check = _Check()
    present_by_agent: Counter[int] = Counter()
    with Database.open(str(path)) as db:
        counted = db.read(
            lambda tx: tx.execute(
                "SELECT agent, seq, count(*) FROM stress_writes WHERE id > ? "
                "GROUP BY agent, seq ORDER BY agent, seq",
                (baseline,),
            )
        )
        for agent, seq, n in counted:
            check.rows += n
            if n > 1:
                check.duplicated += 1
                if len(check.duplicated_samples) < 10:
                    check.duplicated_samples.append([agent, seq, n])
            if seq in acked.get(agent, _Runs()):
                check.acked_present += 1
                present_by_agent[agent] += 1
            elif seq in failed.get(agent, _Runs()):
                check.failed_present += 1
            else:
                check.unacknowledged += 1
        del counted
        for a in agents:
            agent = int(a["agent"])
            if present_by_agent[agent] < a.get("acked_count", 0) and len(check.lost_samples) < 10:
                on_disk = {
                    int(row[0])
                    for row in db.read(partial(_seqs_on_disk, baseline=baseline, agent=agent))
                }
                missing = (seq for seq in acked[agent] if seq not in on_disk)
                for seq in missing:
                    check.lost_samples.append([agent, seq])
                    if len(check.lost_samples) >= 10:
                        break
        check.integrity = [
            str(row[0]) for row in db.read(lambda tx: tx.execute("PRAGMA integrity_check"))
        ]
    return check


def _percentile(ordered: Sequence[float], q: float) -> float:
    if not ordered:
        return 0.0
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _report(
    config: StressConfig,
    effective: Settings,
    seed: int,
    path: Path,
    startup: float,
    fleet: _Fleet,
    agents: list[dict[str, Any]],
    check: _Check,
) -> dict[str, Any]:
    acknowledged = 0
    waits: list[float] = []
    by_type: Counter[str] = Counter()
    failure_samples: list[dict[str, Any]] = []
    engine: Counter[str] = Counter()
    engine_max = {"lock_wait": 0.0, "lock_hold": 0.0}
    per_agent = []
    ends = []
    for a in agents:
        i = a["agent"]
        acknowledged += a.get("acked_count", 0)
        waits.extend(a.get("waits", ()))
        by_type.update(a.get("failures_by_type", {}))
        failure_samples.extend({"agent": i, **f} for f in a.get("failures", ())[:3])
        if "ended" in a:
            ends.append(a["ended"])
        for name, value in a.get("metrics", {}).items():
            if isinstance(value, int) and not isinstance(value, bool) and name != "pid":
                engine[name] += value
            elif name in engine_max and isinstance(value, dict):
                engine_max[name] = max(engine_max[name], float(value.get("max", 0.0)))
        per_agent.append(
            {
                "agent": i,
                "pid": a["pid"],
                "exit_code": a["exit_code"],
                "acknowledged": a.get("acked_count", 0),
                "failed": a.get("failed_count", 0),
                **({"error": a["error"]} if "error" in a else {}),
            }
        )
    lost = acknowledged - check.acked_present
    crashed = [p for p in per_agent if "error" in p]
    integrity = "ok" if check.integrity == ["ok"] else "; ".join(check.integrity[:10])
    # Agents that stop early (their next write would start after the end) idle to the end.
    elapsed = max(config.duration, max(ends, default=fleet.end) - fleet.start)
    waits.sort()
    per_count = [p["acknowledged"] for p in per_agent]
    low, high = min(per_count), max(per_count)

    problems = []
    if by_type:
        problems.append(f"{sum(by_type.values())} writes failed")
    if lost:
        problems.append(f"{lost} acknowledged writes are missing from the file")
    if check.duplicated:
        problems.append(f"{check.duplicated} writes are in the file more than once")
    if check.failed_present:
        problems.append(f"{check.failed_present} writes reported as failed were committed")
    if check.unacknowledged:
        problems.append(f"{check.unacknowledged} rows in the file were never acknowledged")
    if crashed:
        problems.append(f"{len(crashed)} agents crashed or did not report")
    if integrity != "ok":
        problems.append(f"integrity_check: {integrity}")

    return {
        "verdict": "fail" if problems else "pass",
        "problems": problems,
        "path": str(path),
        "agents": config.agents,
        "duration": config.duration,
        "think_ms": config.think_ms,
        "payload_bytes": config.payload_bytes,
        "large_rate": config.large_rate,
        "large_bytes": config.large_bytes,
        "synchronous": effective.synchronous,
        "write_budget": effective.write_budget,
        "seed": seed,
        "startup_s": round(startup, 3),
        "elapsed_s": round(elapsed, 3),
        "acknowledged": acknowledged,
        "failed": sum(by_type.values()),
        "failures_by_type": dict(by_type),
        "lost": lost,
        "duplicated": check.duplicated,
        "failed_but_present": check.failed_present,
        "unacknowledged_rows": check.unacknowledged,
        "rows": check.rows,
        "writes_per_s": round(acknowledged / elapsed, 1) if elapsed > 0 else 0.0,
        "lock_wait_ms": {
            "p50": round(_percentile(waits, 0.50) * 1000, 3),
            "p99": round(_percentile(waits, 0.99) * 1000, 3),
            "max": round((waits[-1] if waits else 0.0) * 1000, 3),
            "mean": round(sum(waits) / len(waits) * 1000, 3) if waits else 0.0,
        },
        "fairness": {"min": low, "max": high, "ratio": round(low / high, 3) if high else 0.0},
        "integrity": integrity,
        "agents_crashed": len(crashed),
        "external_locks": [r.as_dict() for r in fleet.locks],
        "engine": {
            **dict(engine),
            "lock_wait_max_ms": round(engine_max["lock_wait"] * 1000, 3),
            "lock_hold_max_ms": round(engine_max["lock_hold"] * 1000, 3),
        },
        "per_agent": per_agent,
        "samples": {
            "lost": check.lost_samples,
            "duplicated": check.duplicated_samples,
            "failures": failure_samples[:10],
        },
    }


def format_report(report: dict[str, Any]) -> str:
    """The one table ``fleetstore stress`` prints."""
    r = report
    wait = r["lock_wait_ms"]
    fair = r["fairness"]
    think = f"think {r['think_ms']:g} ms mean" if r["think_ms"] > 0 else "closed loop"
    large = (
        f", {r['large_rate']:.1%} of writes {_size(r['large_bytes'])} inline"
        if r["large_rate"] > 0
        else ""
    )
    failed = f"{r['failed']:,}"
    if r["failures_by_type"]:
        failed += "  (" + ", ".join(f"{k} {v:,}" for k, v in r["failures_by_type"].items()) + ")"
    rows: list[tuple[str, str]] = [
        ("acknowledged", f"{r['acknowledged']:,}"),
        ("failed", failed),
        ("lost", f"{r['lost']:,}"),
        ("duplicated", f"{r['duplicated']:,}"),
        ("writes/s", f"{r['writes_per_s']:,.1f}"),
        ("lock wait p50", f"{wait['p50']:.2f} ms"),
        ("lock wait p99", f"{wait['p99']:.2f} ms"),
        ("lock wait max", f"{wait['max']:.2f} ms"),
        (
            "fairness",
            f"min {fair['min']:,} / max {fair['max']:,} writes per agent (ratio {fair['ratio']:.2f})",
        ),
        ("integrity", r["integrity"]),
    ]
    if r["failed_but_present"] or r["unacknowledged_rows"]:
        rows.append(("failed but present", f"{r['failed_but_present']:,}"))
        rows.append(("unacknowledged rows", f"{r['unacknowledged_rows']:,}"))
    if r["agents_crashed"]:
        rows.append(("agents crashed", f"{r['agents_crashed']}"))
    for lock in r["external_locks"]:
        if lock["locked_at"] is None:
            what = f"not taken (exit {lock['exit_code']}) {lock['stderr']}".strip()
        else:
            released = lock["released_at"]
            end = f"{released:.2f}s" if released is not None else "?"
            held = f"{lock['held']:.2f}s" if lock["held"] is not None else "?"
            what = f"held from {lock['locked_at']:.2f}s to {end} ({held})"
        rows.append((f"external lock {lock['spec']}", what))
    width = max(len(k) for k, _ in rows)
    lines = [
        f"fleetstore stress: {r['agents']} agents, {r['duration']:g}s ({r['elapsed_s']:.2f}s "
        f"measured), {think}, payload {_size(r['payload_bytes'])}{large}",
        f"  synchronous {r['synchronous']}, write budget {r['write_budget']:g}s, seed {r['seed']}, "
        f"startup {r['startup_s']:.1f}s",
        f"  database {r['path']}",
        "",
        *(f"  {k:<{width}}  {v}" for k, v in rows),
        "",
    ]
    if r["verdict"] == "pass":
        lines.append("PASS: no failed write; every acknowledged write is on disk exactly once")
    else:
        lines.append("FAIL: " + "; ".join(r["problems"]))
        for sample in r["samples"]["failures"][:3]:
            lines.append(
                f"  agent {sample['agent']} seq {sample['seq']}: {sample['type']} after "
                f"{sample['waited']:.2f}s: {_clip(sample['message'])}"
            )
        for a in r["per_agent"]:
            if "error" in a:
                lines.append(f"  agent {a['agent']} (pid {a['pid']}): {a['error']}")
    return "\n".join(lines)


def _clip(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _size(n: int) -> str:
    for unit, factor in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor:
            return f"{n / factor:.3g} {unit}"
    return f"{n} B"


__all__ = [
    "STRESS_MIGRATIONS",
    "ExternalLock",
    "StressConfig",
    "StressError",
    "default_path",
    "format_report",
    "run",
]


if __name__ == "__main__":
    sys.exit(_agent_main(sys.argv[1:]))
