"""The child processes of one ``fleetstore stress`` target: agents, outbox workers,
outside lock holders and maintenance, started, watched, killed and restarted."""

from __future__ import annotations

import json
import os
import random
import select
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import fleetstore
import fleetstore_stress as _self
from fleetstore_stress.agent import figures_dir
from fleetstore_stress.config import ExternalLock, StressConfig, StressError

_START_DELAY = 0.25  # seconds between "start" being sent and the common start time


@dataclass(slots=True)
class LockRun:
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


class Progress:
    """What the run is doing, on stderr: a rich bar redrawn in place on a terminal
    (core/render.Bar), a plain line every few seconds otherwise."""

    def __init__(self, stream: TextIO | None) -> None:
        from fleetstore.core.render import Bar

        self.stream = stream
        self.bar = Bar(stream) if stream is not None else None
        self.tty = self.bar is not None and self.bar.enabled
        self.interval = 0.5 if self.tty else 3.0
        self._next = 0.0

    def due(self) -> bool:
        return self.stream is not None and time.monotonic() >= self._next

    def show(self, label: str, done: float, total: float, note: str = "") -> None:
        if self.stream is None or self.bar is None:
            return
        self._next = time.monotonic() + self.interval
        if self.tty:
            self.bar.update(label, done, total, note)
        else:
            share = f" ({min(done / total, 1.0):.0%})" if total > 0 else ""
            self.stream.write(f"{label}{share} {note}".rstrip() + "\n")
            self.stream.flush()

    def note(self, text: str) -> None:
        """A line that stays (above the bar on a terminal)."""
        if self.stream is None or self.bar is None:
            return
        self.bar.print(text)

    def done(self) -> None:
        if self.bar is not None:
            self.bar.close()


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    # Agents import the same fleetstore and harness as this process, installed or not.
    here = [str(Path(m.__file__ or "").resolve().parent.parent) for m in (fleetstore, _self)]
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*here, env.get("PYTHONPATH")) if p)
    return env


def stop_processes(procs: Sequence[subprocess.Popen[Any]], grace: float = 3.0) -> None:
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


def tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no output)"
    return " | ".join(text[-lines:]) or "(no output)"


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
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


MODULE = "fleetstore_stress.child"

#: (role, index): one agent or worker, whatever process plays it now.
Key = tuple[str, int]


@dataclass(slots=True)
class _Restart:
    attempts: int = 0  # launched since the kill
    due: float | None = None  # when to launch the next attempt (None: one is starting)
    errors: int = 0  # attempts that exited before they were ready
    last_error: str = ""


class RestartPolicy:
    """When the replacement of a killed agent or worker is started, and started again.

    At once after the kill.  An attempt that exits before it says ``ready`` (its
    ``open()`` or its first write met a full disk) is started again after a pause,
    *first* seconds doubling up to *cap*, for as long as the run lasts: the soak of
    issue 23 never restarted such an agent again and ran on 11 of 16 agents for its
    last 6 minutes.  An attempt that is alive but not ready yet is waited for without
    a deadline: its ``open()`` may wait out a write budget for each thing it writes (a
    deadline equal to the budget dropped an agent restarted during a 70 s outside
    lock).  Logic without processes: ``Fleet`` feeds it what the processes do."""

    def __init__(self, first: float = 0.5, cap: float = 10.0) -> None:
        self.first = first
        self.cap = cap
        self._pending: dict[Key, _Restart] = {}
        #: Attempts launched, and attempts that exited before they were ready, in all.
        self.attempts = 0
        self.failed = 0

    def killed(self, key: Key, now: float) -> None:
        """*key*'s process was killed: its replacement is due now."""
        self._pending[key] = _Restart(due=now)

    def due(self, now: float, end: float) -> list[Key]:
        """The replacements to launch now (none once the run has ended)."""
        if now >= end:
            return []
        return [k for k, r in self._pending.items() if r.due is not None and r.due <= now]

    def launched(self, key: Key) -> None:
        restart = self._pending[key]
        restart.attempts += 1
        restart.due = None
        self.attempts += 1

    def ready(self, key: Key) -> None:
        """*key*'s replacement is ready: nothing more to do for it."""
        self._pending.pop(key, None)

    def exited(self, key: Key, now: float, error: str) -> float:
        """*key*'s replacement exited before it was ready: the next attempt is due
        after a pause (returned)."""
        restart = self._pending[key]
        restart.errors += 1
        restart.last_error = error
        self.failed += 1
        pause = min(self.cap, self.first * 2.0 ** (restart.errors - 1))
        restart.due = now + pause
        return pause

    def pending(self) -> int:
        """Replacements not ready yet (starting, or waiting for their next attempt)."""
        return len(self._pending)

    def report(self) -> dict[str, Any]:
        """What the run's JSON says of the restarts: the attempts, those that failed,
        and the agents and workers not back when the run ended."""
        return {
            "attempts": self.attempts,
            "failed": self.failed,
            "not_back": [
                {
                    "role": role,
                    "index": index,
                    "attempts": r.attempts,
                    "failed": r.errors,
                    "last_error": r.last_error,
                }
                for (role, index), r in sorted(self._pending.items())
            ],
        }


@dataclass(slots=True, eq=False)
class Child:
    role: str  # "agent" or "worker"
    index: int
    proc: subprocess.Popen[bytes]
    errfile: Path

    @property
    def key(self) -> Key:
        return (self.role, self.index)


class Fleet:
    """The child processes of one target; leaving the context kills whatever still runs."""

    def __init__(self, config: StressConfig, cfg: dict[str, Any], workdir: Path) -> None:
        self.config = config
        self.cfg = cfg
        self.workdir = workdir
        self.env = child_env()
        self.children: list[Child] = []
        self.locks: list[LockRun] = []
        self.maintenance: list[dict[str, Any]] = []
        self._maint: list[tuple[subprocess.Popen[str], float]] = []
        self.kills: list[dict[str, Any]] = []
        self.restarts = RestartPolicy()
        self._starting: set[Child] = set()  # replacements launched, not ready yet
        self.wal_peak = 0  # the largest the WAL file(s) got during the run, in bytes
        self._wal_next = 0.0
        self.start = 0.0
        self.end = 0.0
        self._offsets: dict[int, int] = {}
        self.turns = 0

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        procs: list[subprocess.Popen[Any]] = [c.proc for c in self.children]
        procs += [r.proc for r in self.locks if r.proc is not None]
        procs += [p for p, _ in self._maint]
        stop_processes(procs)
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

    def _popen(self, role: str, index: int, restart: bool) -> Child:
        cfg = dict(self.cfg)
        cfg.update(restart=restart, figures=str(figures_dir(self.workdir)))
        if role == "agent":
            cfg.update(agent=index, journal=str(self.journal(index)))
        else:
            cfg.update(worker=index)
        errfile = self.workdir / f"{role}-{index}.err"
        with open(errfile, "ab") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", MODULE, f"--{role}", json.dumps(cfg)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=self.env,
            )
        return Child(role, index, proc, errfile)

    def spawn(self) -> None:
        for i in range(self.config.agents):
            self.children.append(self._popen("agent", i, False))
        if self.cfg["target"] == "fleetstore":
            for i in range(self.config.workers):
                self.children.append(self._popen("worker", i, False))

    def wait_ready(self, children: Sequence[Child], timeout: float, progress: Progress) -> None:
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
                            f"{c.proc.returncode} before it was ready: {tail(c.errfile)}"
                        )
                if progress.due() or not waiting:  # the last one ready: the bar full
                    ready = len(children) - waiting
                    progress.show(
                        f"{self.cfg['target']}: starting",
                        ready,
                        len(children),
                        f"{ready}/{len(children)} ready",
                    )

    def go(self) -> None:
        self.start = time.monotonic() + _START_DELAY
        self.end = self.start + self.config.duration
        for c in self.children:
            self._send_start(c)

    def _send_start(self, c: Child) -> None:
        if c.role != "agent" or c.proc.stdin is None:
            return
        try:
            c.proc.stdin.write(f"start {self.start!r} {self.end!r}\n".encode())
            c.proc.stdin.close()
        except BrokenPipeError:
            pass  # it died; reported as crashed when results are collected

    def kill_one(self, rng: random.Random) -> None:
        """SIGKILL a random agent or worker and start its replacement, without
        waiting for it: the next kill is due on the clock, not after the restart
        (``poll_restarts`` starts the replacement once it is ready)."""
        live = [c for c in self.children if c.proc.poll() is None]
        if not live:
            return
        c = rng.choice(live)
        with suppress(ProcessLookupError):
            c.proc.kill()
        c.proc.wait()
        now = time.monotonic()
        self.kills.append({"t": round(now - self.start, 3), "role": c.role, "index": c.index})
        self._starting.discard(c)
        self.restarts.killed(c.key, now)
        self._launch_due(now)

    def sample_wal(self) -> None:
        """Every second: the size of the target's WAL files (a WAL is removed when
        its last connection closes, so after the run there is little to see)."""
        now = time.monotonic()
        if now < self._wal_next:
            return
        self._wal_next = now + 1.0
        url = self.cfg["url"]
        if "://" in url and not url.startswith(("sqlite://", "sqlite+sharded://")):
            return  # PostgreSQL
        base = Path(url.split("://", 1)[-1])
        paths = [*base.glob("*.db-wal"), *base.glob("shards/*/*.db-wal")] if base.is_dir() else []
        paths.append(Path(f"{base}-wal"))
        total = 0
        for p in paths:
            with suppress(OSError):
                total += p.stat().st_size
        self.wal_peak = max(self.wal_peak, total)

    def kill_stopped(self) -> list[Child]:
        """SIGKILL the children that are stopped (``--hang-worker`` freezes one with
        SIGSTOP); returns them."""
        stopped = []
        for c in self.children:
            try:
                state = Path(f"/proc/{c.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state in ("T", "t") and c.proc.poll() is None:
                c.proc.kill()
                c.proc.wait()
                stopped.append(c)
        return stopped

    def _launch_due(self, now: float) -> None:
        """Start the replacements the restart policy says are due."""
        for role, index in self.restarts.due(now, self.end):
            slot = next(i for i, c in enumerate(self.children) if c.key == (role, index))
            fresh = self._popen(role, index, True)
            self.children[slot] = fresh
            self._starting.add(fresh)
            self.restarts.launched(fresh.key)

    def poll_restarts(self, progress: Progress) -> None:
        """Send ``start`` to the replacements that said ``ready``; start again, after a
        pause, those that exited before (``RestartPolicy``)."""
        now = time.monotonic()
        for c in list(self._starting):
            assert c.proc.stdout is not None
            ready, _, _ = select.select([c.proc.stdout], [], [], 0)
            if not ready:
                continue  # still starting: no deadline (see RestartPolicy)
            data = os.read(c.proc.stdout.fileno(), 64)
            self._starting.discard(c)
            if b"ready" in data:
                self.restarts.ready(c.key)
                self._send_start(c)
                continue
            c.proc.wait()
            why = f"exited with code {c.proc.returncode} before it was ready: {tail(c.errfile)}"
            pause = self.restarts.exited(c.key, now, why)
            progress.note(
                f"fleetstore stress: restart of {c.role} {c.index} failed ({why}); "
                f"trying again in {pause:g}s"
            )
        self._launch_due(now)

    def restarting(self) -> bool:
        """Whether a replacement is still to come before the run ends."""
        return bool(self.restarts.pending()) and time.monotonic() < self.end

    def launch_lock(self, run: LockRun) -> None:
        wait = max(1.0, self.end - time.monotonic())
        run.started_at = time.monotonic() - self.start
        run.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "fleetstore", "lock", "--store", self.cfg["url"]),
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

    def _watch_lock(self, run: LockRun) -> None:
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
            [sys.executable, "-m", "fleetstore", "maintain", "--store", self.cfg["url"], "--json"],
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
