"""``fleetstore stress``: a fleet of agent processes living real sessions, then a verdict
read back from disk.

Every target gets the same workload (same seed, one target after another, each in a
directory of its own): ``--agents`` OS processes start, open the target, say
``ready`` and wait for a common start time, so the slow start of many interpreters
is not counted.  Until the end each agent lives turns (fleetstore.admin.stress.agent):
think, a user message, a streamed reply with a tool call (heavy-tailed output
sizes, up to ``--large-bytes``), usage, a state checkpoint and an outbox effect that
``--workers`` processes settle.  Faults on demand: outside write locks
(``--external-lock HOLD@AT``), SIGKILL of agents and workers with restarts
(``--kill-rate``), ``fleetstore maintain`` during the load (``--maintain``).

Afterwards a separate process reads every target back from disk against the agents'
journals: every acknowledged turn present exactly once, in order, its tool output
intact, its state checkpoint and effect there; no effect ``running`` past its lease;
``integrity_check`` of every file (a sharded store: the catalog and each shard) and,
on a sharded store, the catalog's index equal to the shards.  The processes that
finish their run also report their CPU time and fleetstore's write figures (lock
wait and hold histograms), summed per target.
The verdict (and exit code) is fleetstore's; the other targets are shown beside it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import fleetstore
from fleetstore import Settings
from fleetstore.admin.stress.agent import figures_path, read_journal
from fleetstore.core.metrics import Histogram
from fleetstore.core.targets import redact

_START_DELAY = 0.25  # seconds between "start" being sent and the common start time
_POLL = 0.05
_BUCKET = 0.25  # seconds per point of the lock-wait-over-time series
PEERS = ("opencode", "zcode", "agents-sdk", "langgraph")
PEER_NOTES = {
    "fleetstore": "fleetstore: writer gate, blobs, spool, outbox",
    "opencode": "opencode's pattern: shared WAL, busy_timeout 5000, part rewritten per update",
    "zcode": "zcode's pattern: busy timeout 10 s, deferred transactions",
    "agents-sdk": "OpenAI Agents SDK SQLiteSession (stdlib sqlite3)",
    "langgraph": "LangGraph SqliteSaver under a 3-node graph (stdlib sqlite3)",
}
# A library peer runs when these modules can be imported (looked up, never imported
# here: they would load the stdlib sqlite3 into this process).
_PEER_MODULES = {
    "agents-sdk": ("agents",),
    "langgraph": ("langgraph.graph", "langgraph.checkpoint.sqlite"),
}


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
    url: str | None = None
    directory: str | None = None
    output_bytes: int = 2000
    large_rate: float = 0.02
    large_bytes: int = 8 * 1024 * 1024
    synchronous: str | None = None
    write_budget: float | None = None
    seed: int | None = None
    external_locks: tuple[ExternalLock, ...] = ()
    kill_rate: float = 0.0
    maintain: bool = False
    workers: int = 2
    compare: bool = False
    drop_every: int = 0

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first option that cannot be used."""
        if self.agents < 1:
            raise ValueError("--agents must be at least 1")
        if not (math.isfinite(self.duration) and self.duration > 0):
            raise ValueError("--duration must be a number of seconds > 0")
        if not (math.isfinite(self.think_ms) and self.think_ms >= 0):
            raise ValueError("--think-ms must be a number >= 0")
        if self.output_bytes < 1 or self.large_bytes < 0:
            raise ValueError("--output-bytes must be >= 1 and --large-bytes >= 0")
        if not 0 <= self.large_rate <= 1:
            raise ValueError("--large-rate must be between 0 and 1")
        if not (math.isfinite(self.kill_rate) and self.kill_rate >= 0):
            raise ValueError("--kill-rate must be a number >= 0")
        if self.workers < 0 or self.drop_every < 0:
            raise ValueError("--workers and --drop-every must be >= 0")
        for lock in self.external_locks:
            if lock.at >= self.duration:
                raise ValueError(
                    f"--external-lock {lock}: starts at {lock.at:g}s, "
                    f"after the run ends ({self.duration:g}s)"
                )


def default_dir() -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return fleetstore.default_data_dir() / "stress" / f"run-{stamp}-{os.getpid()}"


def _installed(module: str) -> bool:
    """Whether *module* can be imported, without importing it or its packages."""
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not rest:
        return spec is not None
    rel = rest.replace(".", os.sep)
    return any(
        (Path(d) / rel).is_dir() or (Path(d) / f"{rel}.py").is_file()
        for d in spec.submodule_search_locations or ()
    )


def peers_available() -> list[str]:
    """The peers --compare runs: the SQLite patterns always, libraries when installed."""
    return [p for p in PEERS if all(_installed(m) for m in _PEER_MODULES.get(p, ()))]


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


_MODULE = "fleetstore.admin.stress.agent"


@dataclass(slots=True)
class _Child:
    role: str  # "agent" or "worker"
    index: int
    proc: subprocess.Popen[bytes]
    errfile: Path
    killed: int = 0  # SIGKILLs sent by --kill-rate (each followed by a restart)


class _Fleet:
    """The child processes of one target; leaving the context kills whatever still runs."""

    def __init__(self, config: StressConfig, cfg: dict[str, Any], workdir: Path) -> None:
        self.config = config
        self.cfg = cfg
        self.workdir = workdir
        self.env = _child_env()
        self.children: list[_Child] = []
        self.locks: list[_LockRun] = []
        self.maintenance: list[dict[str, Any]] = []
        self._maint: list[tuple[subprocess.Popen[str], float]] = []
        self.kills: list[dict[str, Any]] = []
        self.start = 0.0
        self.end = 0.0
        self._offsets: dict[int, int] = {}
        self.turns = 0

    def __enter__(self) -> _Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        procs: list[subprocess.Popen[Any]] = [c.proc for c in self.children]
        procs += [r.proc for r in self.locks if r.proc is not None]
        procs += [p for p, _ in self._maint]
        _stop_processes(procs)
        for c in self.children:
            for stream in (c.proc.stdin, c.proc.stdout):
                if stream is not None:
                    with suppress(OSError):
                        stream.close()
        for r in self.locks:
            if r.thread is not None:
                r.thread.join(5)

    def journal(self, index: int) -> Path:
        return self.workdir / f"agent-{index}.jsonl"

    def _popen(self, role: str, index: int, restart: bool) -> _Child:
        cfg = dict(self.cfg)
        if role == "agent":
            cfg.update(agent=index, journal=str(self.journal(index)), restart=restart)
        else:
            cfg.update(worker=index, figures=str(figures_path(self.journal(0))))
        errfile = self.workdir / f"{role}-{index}.err"
        with open(errfile, "ab") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", _MODULE, f"--{role}", json.dumps(cfg)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=self.env,
            )
        return _Child(role, index, proc, errfile)

    def spawn(self) -> None:
        for i in range(self.config.agents):
            self.children.append(self._popen("agent", i, False))
        if self.cfg["target"] == "fleetstore":
            for i in range(self.config.workers):
                self.children.append(self._popen("worker", i, False))

    def wait_ready(self, children: Sequence[_Child], timeout: float, progress: _Progress) -> None:
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            for c in children:
                assert c.proc.stdout is not None
                sel.register(c.proc.stdout, selectors.EVENT_READ, c)
            waiting = len(children)
            while waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StressError(
                        f"{waiting} of {len(children)} processes not ready after {timeout:.0f}s"
                    )
                for key, _ in sel.select(min(left, 0.5)):
                    c = key.data
                    data = os.read(key.fd, 64)
                    sel.unregister(key.fileobj)
                    waiting -= 1
                    if b"ready" not in data:
                        c.proc.wait()
                        raise StressError(
                            f"{self.cfg['target']} {c.role} {c.index} exited with code "
                            f"{c.proc.returncode} before it was ready: {_tail(c.errfile)}"
                        )
                if progress.due():
                    ready = len(children) - waiting
                    progress.show(
                        f"{self.cfg['target']}: starting {_bar(ready / len(children))} "
                        f"{ready}/{len(children)} ready"
                    )

    def go(self) -> None:
        self.start = time.monotonic() + _START_DELAY
        self.end = self.start + self.config.duration
        for c in self.children:
            self._send_start(c)

    def _send_start(self, c: _Child) -> None:
        if c.role != "agent" or c.proc.stdin is None:
            return
        try:
            c.proc.stdin.write(f"start {self.start!r} {self.end!r}\n".encode())
            c.proc.stdin.close()
        except BrokenPipeError:
            pass  # it died; reported as crashed when results are collected

    def kill_one(self, rng: random.Random, progress: _Progress) -> None:
        """SIGKILL a random agent or worker and start its replacement."""
        live = [c for c in self.children if c.proc.poll() is None]
        if not live:
            return
        c = rng.choice(live)
        with suppress(ProcessLookupError):
            c.proc.kill()
        c.proc.wait()
        self.kills.append(
            {"t": round(time.monotonic() - self.start, 3), "role": c.role, "index": c.index}
        )
        fresh = self._popen(c.role, c.index, True)
        fresh.killed = c.killed + 1
        self.children[self.children.index(c)] = fresh
        try:
            self.wait_ready([fresh], 60.0, progress)
        except StressError as exc:
            progress.note(f"fleetstore stress: restart failed: {exc}")
            return
        self._send_start(fresh)

    def launch_lock(self, run: _LockRun) -> None:
        wait = max(1.0, self.end - time.monotonic())
        run.started_at = time.monotonic() - self.start
        run.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "fleetstore", "lock", self.cfg["url"]),
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

    def launch_maintain(self) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetstore", "maintain", self.cfg["url"], "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
        )
        self._maint.append((proc, time.monotonic() - self.start))

    def finish_maintenance(self) -> None:
        for proc, at in self._maint:
            out, _ = proc.communicate()
            ended = time.monotonic() - self.start
            self.maintenance.append(
                {
                    "at": round(at, 3),
                    "exit_code": proc.returncode,
                    "output": out[-400:].strip(),
                    "ended": round(ended, 3),
                }
            )
        self._maint.clear()

    def agents_running(self) -> int:
        return sum(1 for c in self.children if c.role == "agent" and c.proc.poll() is None)

    def count_turns(self) -> int:
        for i in range(self.config.agents):
            path = self.journal(i)
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(i, 0))
                    data = f.read()
            except OSError:
                continue
            self._offsets[i] = self._offsets.get(i, 0) + len(data)
            self.turns += data.count(b'"sha"')
        return self.turns


def _target_url(config: StressConfig, target: str, tdir: Path) -> str:
    if target != "fleetstore":
        return str(tdir / f"{target}.db")
    if config.url is None:
        return str(tdir / "fleetstore.db")
    if "://" in config.url:
        return config.url
    return str(Path(config.url).expanduser().resolve())


def _run_child(args: list[str], env: dict[str, str], what: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", _MODULE, *args], capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise StressError(f"{what} failed (exit {done.returncode}): {tail}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(config: StressConfig, progress_stream: TextIO | None = None) -> dict[str, Any]:
    """Run the stress test on fleetstore (and with ``compare`` on the peers, one after
    another); return the report (JSON-serialisable).

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
    run_dir = Path(config.directory).expanduser().resolve() if config.directory else default_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    targets = ["fleetstore", *(peers_available() if config.compare else ())]
    progress.note(f"fleetstore stress: results under {run_dir}")
    results = []
    not_run: list[dict[str, str]] = []
    with _sigterm_interrupts():
        try:
            for target in targets:
                try:
                    results.append(_run_target(config, target, run_dir, seed, explicit, progress))
                except StressError as exc:
                    if target == "fleetstore":
                        raise
                    # A peer that cannot be run is reported; fleetstore's verdict stands.
                    not_run.append({"target": target, "reason": str(exc)})
                    progress.note(f"fleetstore stress: {target} not run: {exc}")
        finally:
            progress.done()
    main = results[0]
    return {
        "verdict": main["verdict"],
        "problems": main["problems"],
        "dir": str(run_dir),
        "url": main["url"],
        "agents": config.agents,
        "duration": config.duration,
        "think_ms": config.think_ms,
        "output_bytes": config.output_bytes,
        "large_rate": config.large_rate,
        "large_bytes": config.large_bytes,
        "synchronous": effective.synchronous,
        "write_budget": effective.write_budget,
        "seed": seed,
        "workers": config.workers,
        "kill_rate": config.kill_rate,
        "maintain": config.maintain,
        "drop_every": config.drop_every,
        "external_locks": [str(lock) for lock in config.external_locks],
        "targets": results,
        "not_run": not_run,
    }


def _run_target(
    config: StressConfig,
    target: str,
    run_dir: Path,
    seed: int,
    explicit: dict[str, Any],
    progress: _Progress,
) -> dict[str, Any]:
    tdir = run_dir / target
    tdir.mkdir(parents=True, exist_ok=True)
    for old in [*tdir.glob("agent-*.jsonl"), figures_path(tdir / "agent-0.jsonl")]:
        old.unlink(missing_ok=True)  # journals and figures of an earlier run here
    url = _target_url(config, target, tdir)
    cfg: dict[str, Any] = {
        "target": target,
        "url": url,
        "run_id": f"{seed}-{time.time_ns()}",
        "seed": seed,
        "think_ms": config.think_ms,
        "output_bytes": config.output_bytes,
        "large_rate": config.large_rate,
        "large_bytes": config.large_bytes,
        "settings": explicit,
        "synchronous": config.synchronous,
        "drop_every": config.drop_every if target == "fleetstore" else 0,
    }
    env = _child_env()
    progress.note(f"fleetstore stress: {target}: {redact(url)}")
    _run_child(["--verify", json.dumps({**cfg, "prepare": True})], env, f"{target}: set-up")
    rng = random.Random(f"{seed}/faults")
    with _Fleet(config, cfg, tdir) as fleet:
        began = time.monotonic()
        fleet.spawn()
        # Interpreters importing big libraries at once start slowly on few cores.
        fleet.wait_ready(fleet.children, 60.0 + 3.0 * len(fleet.children), progress)
        startup = time.monotonic() - began
        fleet.go()
        _drive(fleet, rng, progress)
        workers = [c.proc for c in fleet.children if c.role == "worker"]
        _stop_processes(workers, grace=15.0)
        _stop_processes([r.proc for r in fleet.locks if r.proc is not None], grace=5.0)
        for r in fleet.locks:
            if r.thread is not None:
                r.thread.join(5)
        fleet.finish_maintenance()
        crashed = [
            {
                "role": c.role,
                "index": c.index,
                "exit_code": c.proc.returncode,
                "error": _tail(c.errfile),
            }
            for c in fleet.children
            if c.proc.returncode not in (0, -signal.SIGTERM)
        ]
        progress.note(f"fleetstore stress: {target}: reading back what was acknowledged")
        journals = [str(fleet.journal(i)) for i in range(config.agents)]
        verified = _run_child(
            ["--verify", json.dumps({**cfg, "journals": journals})], env, f"{target}: verify"
        )
        return _summarize(config, fleet, startup, crashed, verified)


def _drive(fleet: _Fleet, rng: random.Random, progress: _Progress) -> None:
    config = fleet.config
    pending = sorted(config.external_locks, key=lambda lock: lock.at)
    longest_lock = max((lock.hold for lock in pending), default=0.0)
    budget = Settings.load(**fleet.cfg["settings"]).write_budget
    hard_stop = fleet.end + budget + longest_lock + 30.0
    next_kill = (
        fleet.start + rng.expovariate(config.kill_rate) if config.kill_rate > 0 else math.inf
    )
    maintain_at = (
        fleet.start + config.duration / 3
        if config.maintain and fleet.cfg["target"] == "fleetstore"
        else math.inf
    )
    target = fleet.cfg["target"]
    while fleet.agents_running():
        now = time.monotonic()
        while pending and now >= fleet.start + pending[0].at:
            fleet.launch_lock(_LockRun(pending.pop(0)))
        if now >= next_kill and now < fleet.end - 0.5:
            fleet.kill_one(rng, progress)
            next_kill = time.monotonic() + rng.expovariate(config.kill_rate)
        if now >= maintain_at:
            fleet.launch_maintain()
            maintain_at = math.inf
        if now >= hard_stop:
            progress.note("fleetstore stress: agents still running long after the end; killing")
            _stop_processes([c.proc for c in fleet.children], grace=1.0)
            return
        if progress.due():
            elapsed = max(0.0, now - fleet.start)
            turns = fleet.count_turns()
            if now < fleet.end:
                progress.show(
                    f"{target} {_bar(elapsed / config.duration)} {elapsed:5.1f}/"
                    f"{config.duration:g}s {turns:,} turns"
                )
            else:
                progress.show(f"{target}: {fleet.agents_running()} agents finishing their turn")
        time.sleep(_POLL)


def _percentile(ordered: Sequence[float], q: float) -> float:
    if not ordered:
        return 0.0
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _summarize(
    config: StressConfig,
    fleet: _Fleet,
    startup: float,
    crashed: list[dict[str, Any]],
    verified: dict[str, Any],
) -> dict[str, Any]:
    lats: list[float] = []
    by_type: Counter[str] = Counter()
    failure_samples: list[dict[str, Any]] = []
    per_agent = []
    series: dict[int, list[float]] = {}
    ends = []
    for i in range(config.agents):
        journal = read_journal(fleet.journal(i))
        ok = [e for e in journal if "sha" in e]
        failed = [e for e in journal if "fail" in e]
        by_type.update(e["fail"] for e in failed)
        failure_samples += [
            {"agent": i, "turn": e["n"], "type": e["fail"], "message": e["msg"], "waited": e["w"]}
            for e in failed[:3]
        ]
        lats += [float(e["lat"]) for e in ok]
        for e in journal:
            if "w" in e:
                series.setdefault(int(float(e["t"]) / _BUCKET), []).append(float(e["w"]))
                ends.append(float(e["t"]))
        per_agent.append({"agent": i, "acknowledged": len(ok), "failed": len(failed)})
    lats.sort()
    acknowledged = len(lats)
    elapsed = max(config.duration, max(ends, default=0.0))
    counts = [a["acknowledged"] for a in per_agent]
    low, high = min(counts), max(counts)
    lost = int(verified["lost"])
    problems = []
    failed_n = sum(by_type.values())
    if failed_n:
        problems.append(f"{failed_n} turns failed")
    if lost:
        problems.append(f"{lost} acknowledged writes are missing")
    for key, what in (
        ("duplicated", "acknowledged writes are stored more than once"),
        ("out_of_order", "acknowledged writes are out of order"),
        ("corrupt", "tool outputs or messages do not read back intact"),
        ("stuck_effects", "effects are stuck running past their lease"),
    ):
        if verified.get(key):
            problems.append(f"{verified[key]} {what}")
    if crashed:
        problems.append(f"{len(crashed)} processes crashed")
    integrity = verified.get("integrity", "ok")
    if integrity != "ok":
        problems.append(f"integrity_check: {integrity}")
    if verified.get("index_problems"):
        problems.append(
            f"{verified['index_problems']} disagreements between the sharded store's "
            "catalog and its shards"
        )
    points = []
    for b in sorted(series):
        waits = sorted(series[b])
        points.append([round(b * _BUCKET, 3), _ms(_percentile(waits, 0.5)), _ms(waits[-1])])
    quantiles = [
        _ms(_percentile(lats, q / 200)) for q in range(1, 201)
    ]  # 0.5 % steps, for the distribution chart
    target = fleet.cfg["target"]
    return {
        "target": target,
        "note": PEER_NOTES.get(target, target),
        "url": fleet.cfg["url"],
        "verdict": "fail" if problems else "pass",
        "problems": problems,
        "startup_s": round(startup, 3),
        "elapsed_s": round(elapsed, 3),
        "acknowledged": acknowledged,
        "failed": failed_n,
        "failures_by_type": dict(by_type),
        "lost": lost,
        "duplicated": verified.get("duplicated", 0),
        "out_of_order": verified.get("out_of_order", 0),
        "corrupt": verified.get("corrupt", 0),
        "stuck_effects": verified.get("stuck_effects", 0),
        "effects": verified.get("effects", {}),
        "integrity": integrity,
        "layout": verified.get("layout"),
        "files_checked": verified.get("files", 0),
        "index_problems": verified.get("index_problems", 0),
        "turns_per_s": round(acknowledged / elapsed, 1) if elapsed > 0 else 0.0,
        "engine": _engine_figures(fleet, elapsed),
        "latency_ms": {
            "p50": _ms(_percentile(lats, 0.50)),
            "p99": _ms(_percentile(lats, 0.99)),
            "max": _ms(lats[-1] if lats else 0.0),
        },
        "latency_quantiles_ms": quantiles,
        "lock_wait_series": points,
        "fairness": {"min": low, "max": high, "ratio": round(low / high, 3) if high else 0.0},
        "per_agent": per_agent,
        "crashed": crashed,
        "kills": fleet.kills,
        "maintenance": fleet.maintenance,
        "external_locks": [r.as_dict() for r in fleet.locks],
        "samples": {**verified.get("samples", {}), "failures": failure_samples[:10]},
    }


def _engine_figures(fleet: _Fleet, elapsed: float) -> dict[str, Any]:
    """What the processes that finished their run reported (figures.jsonl): their CPU
    time over the run and, for fleetstore, the write transactions they committed and
    the lock wait and hold of those writes (histograms summed across processes, so
    the percentiles are the fleet's).  A process killed by --kill-rate reports nothing."""
    rows = read_journal(figures_path(fleet.journal(0)))
    out: dict[str, Any] = {"processes": len(rows)}
    for role in ("agent", "worker"):
        out[f"{role}_cpu_s"] = round(sum(float(r["cpu_s"]) for r in rows if r["role"] == role), 3)
    engine = [r for r in rows if "histograms" in r]
    if not engine:
        return out
    agents = [r for r in engine if r["role"] == "agent"]
    writes = sum(int(r["writes"]) for r in agents)
    out["agent_writes"] = writes
    out["worker_writes"] = sum(int(r["writes"]) for r in engine if r["role"] == "worker")
    out["writes_per_s"] = round(writes / elapsed, 1) if elapsed > 0 else 0.0
    out["busy_timeouts"] = sum(int(r["busy_timeouts"]) for r in engine)
    out["spooled"] = sum(int(r["spooled"]) for r in engine)
    for name in ("lock_wait", "lock_hold"):
        hist = Histogram()
        for r in agents:
            hist.merge_export(_run_part(r["histograms"][name], r["histograms_before"][name]))
        out[f"{name}_ms"] = {
            "p50": _ms(hist.quantile(0.50)),
            "p99": _ms(hist.quantile(0.99)),
        }
    return out


def _run_part(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The samples a histogram (``Histogram.export()``) gained between two exports."""
    old = {k: int(v) for k, v in dict(before.get("buckets", {})).items()}
    gained = {k: int(v) - old.get(k, 0) for k, v in dict(after.get("buckets", {})).items()}
    return {
        "buckets": {k: v for k, v in gained.items() if v > 0},
        "n": int(after.get("n", 0)) - int(before.get("n", 0)),
        "sum": float(after.get("sum", 0.0)) - float(before.get("sum", 0.0)),
        "max": float(after.get("max", 0.0)),  # only bounds the quantiles from above
    }


def format_report(report: dict[str, Any]) -> str:
    """The table ``fleetstore stress`` prints: one column per target."""
    r = report
    targets = r["targets"]
    think = f"think {r['think_ms']:g} ms mean" if r["think_ms"] > 0 else "closed loop"
    faults = []
    if r["external_locks"]:
        faults.append("outside lock " + ", ".join(r["external_locks"]))
    if r["kill_rate"]:
        faults.append(f"SIGKILL {r['kill_rate']:g}/s")
    if r["maintain"]:
        faults.append("maintenance")
    if r["drop_every"]:
        faults.append(f"BROKEN TARGET: drops every {r['drop_every']}th write")
    rows: list[tuple[str, list[str]]] = [
        ("", [t["target"] for t in targets]),
        ("acknowledged turns", [f"{t['acknowledged']:,}" for t in targets]),
        ("failed turns", [f"{t['failed']:,}" for t in targets]),
        ("lost", [f"{t['lost']:,}" for t in targets]),
        ("duplicated", [f"{t['duplicated']:,}" for t in targets]),
        ("out of order", [f"{t['out_of_order']:,}" for t in targets]),
        ("corrupt", [f"{t['corrupt']:,}" for t in targets]),
        ("turns/s", [f"{t['turns_per_s']:,.1f}" for t in targets]),
        ("turn p50", [f"{t['latency_ms']['p50']:.1f} ms" for t in targets]),
        ("turn p99", [f"{t['latency_ms']['p99']:.1f} ms" for t in targets]),
        ("turn max", [f"{t['latency_ms']['max']:.1f} ms" for t in targets]),
        ("fairness min/max", [f"{t['fairness']['ratio']:.2f}" for t in targets]),
        ("integrity", [t["integrity"] for t in targets]),
        ("verdict", [t["verdict"].upper() for t in targets]),
    ]
    main = targets[0]
    width = max(len(k) for k, _ in rows)
    cols = [max(len(row[1][i]) for row in rows) for i in range(len(targets))]
    if main["effects"] or main["stuck_effects"]:
        eff = ", ".join(f"{k} {v:,}" for k, v in sorted(main["effects"].items()))
        # One cell wider than a column: left as it is, not widening the table.
        rows.append(("effects (fleetstore)", [eff + f"; stuck {main['stuck_effects']}"]))
        width = max(width, len(rows[-1][0]))

    def line(label: str, values: list[str]) -> str:
        if len(values) < len(cols):
            return f"  {label:<{width}}  " + "  ".join(values)
        cells = [v.rjust(cols[i]) for i, v in enumerate(values)]
        return f"  {label:<{width}}  " + "  ".join(cells)

    lines = [
        f"fleetstore stress: {r['agents']} agents x {r['duration']:g}s per target, {think}, "
        f"outputs ~{_size(r['output_bytes'])} ({r['large_rate']:.0%} up to "
        f"{_size(r['large_bytes'])}), seed {r['seed']}",
        f"  faults: {'; '.join(faults) or 'none'}; workers {r['workers']}; "
        f"synchronous {r['synchronous']}, write budget {r['write_budget']:g}s",
        f"  fleetstore target {r['url']}; results under {r['dir']}",
        "",
        *(line(k, v) for k, v in rows),
        "",
    ]
    for t in targets[1:]:
        if t["failures_by_type"]:
            kinds = ", ".join(f"{k} {v:,}" for k, v in t["failures_by_type"].items())
            lines.append(f"  {t['target']} failures: {kinds}")
    for skipped in r.get("not_run", ()):
        lines.append(f"  {skipped['target']} not run: {_clip(skipped['reason'])}")
    if r["verdict"] == "pass":
        lines.append(
            "PASS: fleetstore failed no turn; every acknowledged write is on disk exactly "
            "once, in order, intact"
        )
    else:
        lines.append("FAIL: fleetstore: " + "; ".join(r["problems"]))
        samples = main["samples"]
        for sample in samples.get("failures", [])[:3]:
            lines.append(
                f"  agent {sample['agent']} turn {sample['turn']}: {sample['type']} after "
                f"{sample['waited']:.2f}s: {_clip(sample['message'])}"
            )
        for kind in ("lost", "duplicated", "out_of_order", "corrupt"):
            for s in samples.get(kind, [])[:3]:
                lines.append(f"  {kind}: agent {s[0]} turn {s[1]}: {' '.join(map(str, s[2:]))}")
        for c in main["crashed"][:5]:
            lines.append(f"  {c['role']} {c['index']} exit {c['exit_code']}: {c['error']}")
    return "\n".join(lines)


def _clip(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _size(n: int) -> str:
    for unit, factor in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor:
            return f"{n / factor:.3g} {unit}"
    return f"{n} B"


__all__ = [
    "ExternalLock",
    "StressConfig",
    "StressError",
    "default_dir",
    "format_report",
    "peers_available",
    "run",
]
