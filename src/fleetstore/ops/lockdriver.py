"""Hold a database's write lock the way a process that does not use fleetstore would.

``fleetstore lock PATH --hold SECONDS`` opens PATH with raw apsw (never through
fleetstore's writer gate), runs ``BEGIN IMMEDIATE`` (or ``BEGIN EXCLUSIVE``),
prints ``locked PATH pid=PID``, holds the lock, rolls back and prints
``released PATH after X.XXs``.  SIGTERM and SIGINT release the lock early.

It uses apsw, never the stdlib ``sqlite3`` module: two SQLite libraries in one
process silently drop each other's POSIX locks (DESIGN.md, "Two SQLite
libraries in one process").
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TextIO

import apsw

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_MISSING = 2
EXIT_NOT_LOCKED = 3

# How often the hold loop looks at the stop flag: the release after a signal
# comes at most this late.  Busy-handler naps are finer so that a lock freed by
# its holder is taken within about a millisecond.
_HOLD_POLL = 0.005
_BUSY_NAP = 0.001


class _Stop:
    """Set by SIGTERM/SIGINT: leave the wait or the hold as soon as possible."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signum

    @property
    def requested(self) -> bool:
        return self.signal is not None


@contextmanager
def _stop_on_signals(stop: _Stop) -> Iterator[None]:
    # Signal handlers can only be installed from the main thread; elsewhere
    # (an embedding program, a test runner thread) the caller keeps its own.
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def hold_lock(
    path: str,
    hold: float,
    *,
    exclusive: bool = False,
    wait: float = 30.0,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Take and hold the SQLite write lock on *path*; return the process exit code.

    0: the lock was taken, held for *hold* seconds (or until SIGTERM/SIGINT) and
    released; 1: SQLite error (not a database, I/O error...); 2: *path* is not an
    existing file (nothing is created); 3: the lock was not taken within *wait*
    seconds, or a signal arrived while waiting.
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    if not os.path.isfile(path):
        what = "a directory" if os.path.isdir(path) else "missing"
        print(
            f"fleetstore lock: {path}: no database file there ({what}); lock never creates one",
            file=err,
            flush=True,
        )
        return EXIT_MISSING

    stop = _Stop()
    with _stop_on_signals(stop):
        try:
            # No SQLITE_OPEN_CREATE: should the file vanish after the check above,
            # opening fails instead of creating an empty database.
            conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READWRITE)
        except apsw.CantOpenError as exc:
            print(f"fleetstore lock: {path}: cannot open: {exc}", file=err, flush=True)
            return EXIT_MISSING
        except apsw.Error as exc:
            print(f"fleetstore lock: {path}: {type(exc).__name__}: {exc}", file=err, flush=True)
            return EXIT_ERROR
        try:
            return _lock_and_hold(conn, path, hold, exclusive, wait, stop, out, err)
        finally:
            conn.close()


def _lock_and_hold(
    conn: apsw.Connection,
    path: str,
    hold: float,
    exclusive: bool,
    wait: float,
    stop: _Stop,
    out: TextIO,
    err: TextIO,
) -> int:
    deadline = time.monotonic() + wait

    def busy(_count: int) -> bool:
        if stop.requested or time.monotonic() >= deadline:
            return False
        time.sleep(_BUSY_NAP)
        return True

    conn.set_busy_handler(busy)
    begin = "BEGIN EXCLUSIVE" if exclusive else "BEGIN IMMEDIATE"
    try:
        conn.execute(begin)
    except apsw.BusyError:
        if stop.requested:
            reason = f"interrupted by signal {stop.signal} while waiting"
        else:
            reason = f"lock not taken within {wait:g}s{_holders_hint(path)}"
        print(f"fleetstore lock: {path}: {reason}", file=err, flush=True)
        return EXIT_NOT_LOCKED
    except apsw.Error as exc:
        print(f"fleetstore lock: {path}: {type(exc).__name__}: {exc}", file=err, flush=True)
        return EXIT_ERROR

    locked_at = time.monotonic()
    try:
        _say(out, f"locked {path} pid={os.getpid()}")
        until = locked_at + hold if math.isfinite(hold) else math.inf
        while not stop.requested:
            remaining = until - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(_HOLD_POLL, remaining))
    finally:
        try:
            conn.execute("ROLLBACK")
        except apsw.Error:
            pass  # closing the connection releases the lock anyway
    _say(out, f"released {path} after {time.monotonic() - locked_at:.2f}s")
    return EXIT_OK


def _say(out: TextIO, line: str) -> None:
    try:
        print(line, file=out, flush=True)
    except BrokenPipeError:
        pass  # nobody is listening any more; the lock still has to be released


def _holders_hint(path: str) -> str:
    try:
        from fleetstore.engine.proclocks import lock_holders
    except ImportError:
        return ""
    try:
        holders = lock_holders(path)
    except Exception:
        return ""
    return "; " + "; ".join(str(h) for h in holders) if holders else ""


__all__ = ["EXIT_ERROR", "EXIT_MISSING", "EXIT_NOT_LOCKED", "EXIT_OK", "hold_lock"]
