"""Hold a database's write lock the way a process that does not use fleetstore would.

``fleetstore lock --store PATH --hold SECONDS`` opens PATH with raw apsw (never through
fleetstore's writer gate), runs ``BEGIN IMMEDIATE`` (or ``BEGIN EXCLUSIVE``),
prints ``locked PATH pid=PID``, holds the lock, rolls back and prints
``released PATH after X.XXs``.  SIGTERM and SIGINT release the lock early.

The lock itself is taken by ``fleetstore.files.outside``: only ``engine/`` and
``files/`` know the SQLite driver.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import FrameType
from typing import TextIO

from fleetstore.core.keys import keyring_of
from fleetstore.core.settings import Settings
from fleetstore.core.targets import CATALOG, SHARDS, sharded_root
from fleetstore.engine.cipher import key_of_file
from fleetstore.errors import FleetstoreError, StoreBusy
from fleetstore.files.outside import outside_write_lock
from fleetstore.store.sharded.shards import shard_files

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_MISSING = 2
EXIT_NOT_LOCKED = 3

# How often the hold loop looks at the stop flag: the release after a signal
# comes at most this late.
_HOLD_POLL = 0.005


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
    as_json: bool = False,
) -> int:
    """Take and hold the SQLite write lock on *path*; return the process exit code.
    It says ``locked PATH pid=PID`` once the lock is taken and ``released PATH after
    X.XXs`` (*as_json*: ``{"event": "locked", "path", "pid"}`` and ``{"event":
    "released", "path", "held_s"}``, one JSON line each).

    0: the lock was taken, held for *hold* seconds (or until SIGTERM/SIGINT) and
    released; 1: SQLite error (not a database, I/O error...); 2: *path* is not an
    existing file (nothing is created); 3: the lock was not taken within *wait*
    seconds, or a signal arrived while waiting.
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    server = path.startswith(("postgresql://", "postgres://"))
    shown = path
    root = None if server else sharded_root(path)
    if root is not None:
        path = str(root / CATALOG)  # a sharded store: its catalog and every shard
    elif path.startswith("sqlite://"):
        path = path[len("sqlite://") :]
    if not server and not os.path.isfile(path):
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
            with _lock(path, server, exclusive, wait, stop):
                locked_at = time.monotonic()
                _say(
                    out,
                    json.dumps({"event": "locked", "path": shown, "pid": os.getpid()})
                    if as_json
                    else f"locked {shown} pid={os.getpid()}",
                )
                until = locked_at + hold if math.isfinite(hold) else math.inf
                while not stop.requested:
                    remaining = until - time.monotonic()
                    if remaining <= 0:
                        break
                    time.sleep(min(_HOLD_POLL, remaining))
        except FileNotFoundError as exc:
            print(f"fleetstore lock: {exc}", file=err, flush=True)
            return EXIT_MISSING
        except StoreBusy as exc:
            if stop.requested:
                reason = f"interrupted by signal {stop.signal} while waiting"
            else:
                holders = "; ".join(str(h) for h in exc.holders)
                reason = f"lock not taken within {wait:g}s" + (f"; {holders}" if holders else "")
            print(f"fleetstore lock: {shown}: {reason}", file=err, flush=True)
            return EXIT_NOT_LOCKED
        except FleetstoreError as exc:
            print(f"fleetstore lock: {type(exc).__name__}: {exc}", file=err, flush=True)
            return EXIT_ERROR
    held = time.monotonic() - locked_at
    _say(
        out,
        json.dumps({"event": "released", "path": shown, "held_s": round(held, 3)})
        if as_json
        else f"released {shown} after {held:.2f}s",
    )
    return EXIT_OK


def _lock(
    path: str, server: bool, exclusive: bool, wait: float, stop: _Stop
) -> AbstractContextManager[None]:
    if server:
        # Every table IN EXCLUSIVE MODE: the closest a server has to one write lock.
        from fleetstore.engine.postgres import outside_write_lock as pg_lock

        return pg_lock(path, exclusive=exclusive, wait=wait)
    shards = Path(path).parent / SHARDS
    if Path(path).name == CATALOG and shards.is_dir():
        found = [shard for _key, shard in shard_files(shards.parent)]
        return _lock_sharded(path, found, exclusive, wait, stop)
    return outside_write_lock(
        path, exclusive=exclusive, wait=wait, stop=lambda: stop.requested, key=_key(path)
    )


def _key(path: str) -> bytes | None:
    """The key of an encrypted store's file, from the keyring the settings name (any
    other SQLite file: none)."""
    return key_of_file(path, keyring_of(Settings.load().encryption_key_file), strict=False)


@contextlib.contextmanager
def _lock_sharded(
    catalog: str, shards: list[Path], exclusive: bool, wait: float, stop: _Stop
) -> Iterator[None]:
    """A sharded store's catalog, then each shard file, within one *wait*: what a
    program holding the whole store would block (a shard created after this
    started is not locked; its first write still needs the catalog)."""
    deadline = time.monotonic() + wait
    with contextlib.ExitStack() as stack:
        for path in [Path(catalog), *shards]:
            left = max(0.0, deadline - time.monotonic())
            stack.enter_context(
                outside_write_lock(
                    str(path),
                    exclusive=exclusive,
                    wait=left,
                    stop=lambda: stop.requested,
                    key=_key(str(path)),
                )
            )
        yield


def _say(out: TextIO, line: str) -> None:
    try:
        print(line, file=out, flush=True)
    except BrokenPipeError:
        pass  # nobody is listening any more; the lock still has to be released


__all__ = ["EXIT_ERROR", "EXIT_MISSING", "EXIT_NOT_LOCKED", "EXIT_OK", "hold_lock"]
