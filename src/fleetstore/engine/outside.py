"""SQLite's write lock taken from outside the gate, as a program that does not use
fleetstore would take it: for ``fleetstore lock`` and for testing how a fleet copes.

It uses apsw, never the stdlib ``sqlite3`` module: two SQLite libraries in one
process silently drop each other's POSIX locks (DESIGN.md, "Two SQLite
libraries in one process").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import apsw

from fleetstore import errors
from fleetstore.engine.proclocks import lock_holders
from fleetstore.engine.translate import translate

# A lock freed by its holder is taken within about a millisecond.
_BUSY_NAP = 0.001


@contextlib.contextmanager
def outside_write_lock(
    path: str, *, exclusive: bool = False, wait: float = 30.0, stop: Callable[[], bool] = bool
) -> Iterator[None]:
    """Hold ``BEGIN IMMEDIATE`` (``BEGIN EXCLUSIVE`` if *exclusive*) on *path* for the
    body of the ``with`` block, then roll back.  Never creates a database:
    ``FileNotFoundError`` if *path* cannot be opened.  ``StoreBusy`` if the lock is
    not taken within *wait* seconds or *stop()* turns true while waiting."""
    try:
        conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READWRITE)
    except apsw.CantOpenError as exc:
        raise FileNotFoundError(f"{path}: cannot open: {exc}") from exc
    except apsw.Error as exc:
        raise translate(exc, path) from exc
    try:
        started = time.monotonic()
        deadline = started + wait
        attempts = 1

        def busy(count: int) -> bool:
            nonlocal attempts
            attempts = count + 2
            if stop() or time.monotonic() >= deadline:
                return False
            time.sleep(_BUSY_NAP)
            return True

        conn.set_busy_handler(busy)
        try:
            conn.execute("BEGIN EXCLUSIVE" if exclusive else "BEGIN IMMEDIATE")
        except apsw.BusyError:
            raise errors.StoreBusy(
                path, time.monotonic() - started, attempts, lock_holders(path), stage="sqlite"
            ) from None
        except apsw.Error as exc:
            raise translate(exc, path) from exc
        try:
            yield
        finally:
            with contextlib.suppress(apsw.Error):
                conn.execute("ROLLBACK")
    finally:
        conn.close()


__all__ = ["outside_write_lock"]
