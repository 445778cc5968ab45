"""A database's checkpoints, run off its writers' path by a thread of their own."""

from __future__ import annotations

import threading
import time
import weakref
from typing import Protocol

from fleetstore import errors


class _Checkpointing(Protocol):
    def checkpoint(self, *, truncate: bool = False, wait: bool = True) -> tuple[int, int]: ...

    def _background_error(self, what: str, exc: BaseException) -> None: ...


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
        try:
            threading.Thread(target=self._loop, name="fleetstore-checkpoint", daemon=True).start()
        except BaseException:
            with self._cond:  # or no later request would start one again
                self._running = False
            raise

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
                pass  # counted by checkpoint(); the next commit past the line asks again
            except Exception as exc:
                # Not ours to raise (the commits stand), and the thread must live on:
                # one that died here left _running set, and no checkpoint ran again.
                db._background_error("checkpoint", exc)
            del db

    def stop(self) -> None:
        """No more checkpoints; wait (briefly) for one under way."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            deadline = time.monotonic() + 5.0
            while self._running and time.monotonic() < deadline:
                self._cond.wait(0.1)


__all__ = ["Checkpointer"]
