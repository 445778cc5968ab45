"""A database's checkpoints, run off its writers' path by a thread of their own."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Protocol

import apsw

from fleetstore import errors

log = logging.getLogger("fleetstore")


class _Checkpointing(Protocol):
    def checkpoint(self, *, truncate: bool = False, wait: bool = True) -> tuple[int, int]: ...


class Checkpointer:
    """Runs a database's passive checkpoints off the writers' path: ``request()``
    returns at once; one daemon thread, started on first use, checkpoints while it is
    asked to and exits after a quiet second.  A forked child starts its own."""

    _IDLE = 1.0

    def __init__(self, db: _Checkpointing) -> None:
        self._db = weakref.ref(db)
        self._cond = threading.Condition()
        self._wanted = False
        self._running = False
        self._stopped = False

    def request(self) -> None:
        with self._cond:
            if self._stopped:
                return
            self._wanted = True
            if self._running:
                self._cond.notify()
                return
            self._running = True
        threading.Thread(target=self._loop, name="fleetstore-checkpoint", daemon=True).start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._wanted and not self._stopped:
                    self._cond.wait(self._IDLE)
                if not self._wanted or self._stopped:
                    self._running = False
                    self._cond.notify_all()
                    return
                self._wanted = False
            db = self._db()
            if db is None:
                return
            try:
                db.checkpoint(wait=False)
            except errors.FleetstoreError:
                pass  # a closed or failing store: the next commit past the line asks again
            del db

    def stop(self) -> None:
        """No more checkpoints; wait (briefly) for one under way."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            deadline = time.monotonic() + 5.0
            while self._running and time.monotonic() < deadline:
                self._cond.wait(0.1)


class CatchUp:
    """A checkpoint that could not copy the whole WAL while writers went on (it copies
    the frames there were when it began) asks this process's next writer to copy the
    rest with the gate held, before it releases it: then the writer after it starts
    the WAL over.  The gate itself goes to a thread of the process whose writers hold
    it only when they pause, so asking is faster than waiting for it."""

    def __init__(self) -> None:
        self._asked = threading.Event()
        self._done = threading.Event()

    def ask(self, timeout: float) -> bool:
        """(The checkpoint thread.)  True once a writer did it within *timeout*."""
        self._done.clear()
        self._asked.set()
        if self._done.wait(timeout):
            return True
        self._asked.clear()
        return False

    def asked(self) -> bool:
        return self._asked.is_set()

    def run(self, conn: apsw.Connection, before: Callable[[], None] | None, path: str) -> bool:
        """(A writer, gate held, just committed.)  Copy the WAL's last frames; False if
        it failed.  Nothing here may turn the commit into an error (issue 18: a failed
        checkpoint after COMMIT once reached the caller); the next checkpoint retries."""
        self._asked.clear()
        try:
            if before is not None:
                before()  # what the frames refer to, durable first (blob files)
            conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
        except apsw.BusyError:
            return True  # another process's checkpoint is running: it copies them
        except (OSError, apsw.Error) as exc:
            log.warning("%s: checkpoint after a commit failed (the commit stands): %s", path, exc)
            return False
        self._done.set()
        return True


__all__ = ["CatchUp", "Checkpointer"]
