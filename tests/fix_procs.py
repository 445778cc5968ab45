"""Process fixtures for the fleet tests: real OS processes, real files, no mocks.

``spawn`` starts a child (``tests/agents/fleet_agent.py COMMAND ...`` or ``-m fleetstore ...``)
whose stdout lines are collected with their arrival time; every child a test started
is killed (SIGKILL) and reaped when the test ends, whatever happened.
"""

from __future__ import annotations

import fcntl
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.agents import script

AGENT = script("fleet_agent.py")


class Proc:
    """A child process whose stdout lines arrive, timestamped (``time.time()``), in a queue."""

    def __init__(self, argv: list[str], name: str, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.popen = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.pid = self.popen.pid
        self.lines: queue.Queue[tuple[float, str | None]] = queue.Queue()
        self.seen: list[tuple[float, str]] = []
        self.stderr_lines: list[str] = []
        self._threads = [
            threading.Thread(target=self._pump_stdout, daemon=True),
            threading.Thread(target=self._pump_stderr, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _pump_stdout(self) -> None:
        stream = self.popen.stdout
        assert stream is not None
        try:
            for line in stream:
                self.lines.put((time.time(), line.rstrip("\n")))
        except (OSError, ValueError):
            pass
        self.lines.put((time.time(), None))

    def _pump_stderr(self) -> None:
        stream = self.popen.stderr
        assert stream is not None
        try:
            for line in stream:
                self.stderr_lines.append(line.rstrip("\n"))
        except (OSError, ValueError):
            pass

    def wait_line(self, prefix: str, timeout: float) -> tuple[float, str]:
        """The first not-yet-consumed stdout line starting with *prefix*, and when it arrived."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{self.name}: no line starting {prefix!r} within {timeout}s; "
                    f"stdout so far {self.seen!r}; stderr {self.stderr_tail()!r}"
                )
            try:
                at, line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self.lines.put((at, None))  # keep the end marker for later callers
                self.popen.wait(timeout=10)
                raise AssertionError(
                    f"{self.name}: exited (rc={self.popen.returncode}) before a line starting "
                    f"{prefix!r}; stdout {self.seen!r}; stderr {self.stderr_tail()!r}"
                )
            self.seen.append((at, line))
            if line.startswith(prefix):
                return at, line

    def finish(self, timeout: float) -> int:
        """Wait for the exit; returns the exit code (collected stdout stays readable)."""
        try:
            rc = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} still running after {timeout}s; stdout {self.seen!r}; "
                f"stderr {self.stderr_tail()!r}"
            ) from None
        for t in self._threads:
            t.join(timeout=5)
        while True:
            try:
                at, line = self.lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.seen.append((at, line))
        return rc

    def last_line(self) -> str:
        return self.seen[-1][1] if self.seen else ""

    def stderr_tail(self, n: int = 20) -> str:
        return "\n".join(self.stderr_lines[-n:])

    def kill(self) -> None:
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.popen.stdout, self.popen.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


Spawn = Callable[..., Proc]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """``spawn(*args, name=...)`` runs ``python tests/agents/fleet_agent.py *args``;
    ``spawn(*args, module="fleetstore")`` runs ``python -m fleetstore *args``."""
    procs: list[Proc] = []

    def _spawn(*args: str, name: str = "", module: str | None = None) -> Proc:
        head = [sys.executable, "-m", module] if module else [sys.executable, AGENT]
        argv = [*head, *args]
        proc = Proc(argv, name or " ".join(args[:2]))
        procs.append(proc)
        return proc

    try:
        yield _spawn
    finally:
        for proc in procs:
            proc.kill()


def start_lock(spawn: Spawn, path: str, hold: float, timeout: float = 30.0) -> tuple[Proc, float]:
    """``fleetstore lock --store PATH --hold HOLD`` in its own process; returns it and the time its
    ``locked PATH pid=PID`` line arrived (the lock is held from at most that instant)."""
    proc = spawn(
        "lock", "--store", path, "--hold", str(hold), module="fleetstore", name="fleetstore lock"
    )
    at, line = proc.wait_line("locked", timeout=timeout)
    assert line == f"locked {path} pid={proc.pid}", line
    return proc, at


class Barrier:
    """A start line for many processes: the test holds an exclusive flock on a file, the
    processes block on a shared flock of it, and all wake together on ``release()``."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self.released_at: float | None = None

    def release(self) -> float:
        self.released_at = time.time()
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        return self.released_at

    def close(self) -> None:
        os.close(self._fd)


@pytest.fixture
def barrier(tmp_path: Path) -> Iterator[Barrier]:
    b = Barrier(tmp_path / "start.barrier")
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Processes a test starts; whatever happens, each is killed and reaped at the end."""
    started: list[Proc] = []
    try:
        yield started
    finally:
        for p in started:
            p.kill()
