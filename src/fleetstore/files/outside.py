"""SQLite's write lock taken from outside the gate, as a program that does not use
fleetstore would take it: for ``fleetstore lock``, for testing how a fleet copes, and
for ``fleetstore maintain`` on another program's database (``OutsideFile``).

It uses apsw, never the stdlib ``sqlite3`` module: two SQLite libraries in one
process silently drop each other's POSIX locks (DESIGN.md, "Two SQLite
libraries in one process").
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import apsw

from fleetstore import errors
from fleetstore.engine import cipher
from fleetstore.engine.proclocks import lock_holders
from fleetstore.engine.translate import translate
from fleetstore.engine.tx import ReadTx, WriteTx

T = TypeVar("T")

# A lock freed by its holder is taken within about a millisecond.
_BUSY_NAP = 0.001


@contextlib.contextmanager
def outside_write_lock(
    path: str,
    *,
    exclusive: bool = False,
    wait: float = 30.0,
    stop: Callable[[], bool] = bool,
    key: bytes | None = None,
) -> Iterator[None]:
    """Hold ``BEGIN IMMEDIATE`` (``BEGIN EXCLUSIVE`` if *exclusive*) on *path* for the
    body of the ``with`` block, then roll back.  Never creates a database:
    ``FileNotFoundError`` if *path* cannot be opened.  ``StoreBusy`` if the lock is
    not taken within *wait* seconds or *stop()* turns true while waiting."""
    try:
        conn = cipher.connect(path, apsw.SQLITE_OPEN_READWRITE, key)
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


class OutsideFile:
    """Another program's SQLite file, opened as that program's peers open it: one plain
    connection, no writer gate, nothing of fleetstore's made beside it (``fleetstore
    maintain`` on a foreign file left an ``opencode.db.gate`` there, issue 28).

    Never creates a database, never changes its journal mode or any setting stored in
    the file; what it makes beside it is SQLite's own (``-wal``/``-shm``, which the
    program's own connections make and SQLite removes after the last one closes).  A
    write waits for the lock with a busy handler that naps a millisecond, up to
    *wait* seconds, then raises ``StoreBusy`` with nothing written: the program's own
    writers are never made to wait longer than one short transaction of ours."""

    dialect = "sqlite"

    def __init__(self, path: str, *, wait: float = 60.0, key: bytes | None = None) -> None:
        self.path = os.path.abspath(path)
        self.wait = wait
        try:
            st = os.lstat(self.path)
        except OSError as exc:
            raise errors.NotFound(f"{self.path}: cannot open: {exc.strerror}") from exc
        if not stat.S_ISREG(st.st_mode):
            raise errors.UnsafeFile(f"{self.path}: not a regular file; it was not opened")
        try:
            self._conn = cipher.connect(
                self.path, apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_NOFOLLOW, key
            )
        except apsw.Error as exc:
            raise translate(exc, self.path) from exc
        self._deadline = 0.0
        self._attempts = 0
        self._conn.set_busy_handler(self._busy)

    def _busy(self, count: int) -> bool:
        self._attempts = count + 1
        if time.monotonic() >= self._deadline:
            return False
        time.sleep(_BUSY_NAP)
        return True

    def _begin(self, sql: str, stage: str) -> None:
        started = time.monotonic()
        self._deadline = started + self.wait
        try:
            self._conn.execute(sql)
        except apsw.BusyError:
            raise errors.StoreBusy(
                self.path,
                time.monotonic() - started,
                self._attempts,
                lock_holders(self.path),
                stage=stage,
            ) from None
        except apsw.Error as exc:
            raise translate(exc, self.path, self._conn) from exc

    @contextlib.contextmanager
    def write(self) -> Iterator[WriteTx]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (rolled back if the body raises)."""
        self._begin("BEGIN IMMEDIATE", "sqlite")
        tx = WriteTx(self._conn, self.path, time.time())
        try:
            yield tx
            tx._drop_cursor()
            self._conn.execute("COMMIT")
        except BaseException as exc:
            tx._drop_cursor()
            with contextlib.suppress(apsw.Error):
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
            if isinstance(exc, apsw.Error):
                raise translate(exc, self.path, self._conn, commit=True) from exc
            raise
        finally:
            tx._open = False

    def run_write(self, fn: Callable[[WriteTx], T], *, single_statement: bool = False) -> T:
        with self.write() as tx:
            return fn(tx)

    def read(self, fn: Callable[[ReadTx], T]) -> T:
        """``fn(tx)`` in a read transaction (one snapshot), rolled back after."""
        self._begin("BEGIN", "sqlite")
        tx = ReadTx(self._conn, self.path, time.time())
        try:
            return fn(tx)
        finally:
            tx._open = False
            tx._drop_cursor()
            with contextlib.suppress(apsw.Error):
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")

    def checkpoint(self, *, truncate: bool = False) -> tuple[int, int]:
        """A passive checkpoint (it waits for nobody and makes nobody wait); then, if
        every frame was copied and *truncate*, one try at truncating the WAL that
        gives up at once if a reader or writer is there (a TRUNCATE that waited would
        make the program's writers wait behind it).  (frames in the WAL, copied);
        (-1, -1) if another checkpoint was running."""
        conn = self._conn
        try:
            log, done = conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
            if truncate and 0 <= done == log:
                self._deadline = 0.0  # no busy wait
                with contextlib.suppress(apsw.BusyError):
                    log, done = conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
        except apsw.BusyError:
            return (-1, -1)
        except apsw.Error as exc:
            raise translate(exc, self.path, conn) from exc
        return (int(log), int(done))

    def pragma(self, name: str) -> Any:
        return self._conn.execute(f"PRAGMA {name}").fetchall()[0][0]

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> OutsideFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


__all__ = ["OutsideFile", "outside_write_lock"]
