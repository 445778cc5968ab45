"""A store's background thread: it replays this process's spool in order, catches up
with the journals of dead processes first, and flushes streamed replies when they are
due (one thread for both: a turn that streams and spools wakes one thread, not two).
It starts on demand (``wake``) and ends once it has nothing to do for ``_LINGER``
seconds.  The store (store/facade.py) owns it and its condition, which the store's
``close`` and its jobs thread share: whichever thread is last out of the engine closes
it (``Store._left``).  tests/store/test_spool.py guards its order, its backoff and its
close."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Protocol

from fleetstore import errors
from fleetstore.core import liveness
from fleetstore.core.logs import logger
from fleetstore.core.settings import Settings
from fleetstore.domain.operations import Operation
from fleetstore.domain.ports import Flushable
from fleetstore.store import observe
from fleetstore.store.spool import REJECTED, Recovered, Spool, is_rejectable, journal_pid, reject

log = logger("fleetstore")

#: After a transient failure to replay (the lock), wait this long before the next
#: attempt; the attempt itself already waited up to the write budget.
_RETRY_PAUSE = 0.01
#: After the store itself failed a replay (I/O error, disk full...): backoff cap.
MAX_PAUSE = 10.0
#: The background thread waits this long for more work before it exits.
_LINGER = 2.0


class Owner(Protocol):
    """What the drain uses of its store (store/facade.py's Store)."""

    path: Path
    settings: Settings
    spool: Spool
    spool_dir: Path
    _stop: bool
    _counts_lock: threading.Lock
    _rejected: int

    def recover(self) -> list[Recovered]: ...

    def _noting_jobs(self, op: Operation) -> dict[str, Any]: ...

    def _left(self) -> None: ...


def _due(stream: Flushable, now: float) -> bool:
    due = stream.due()
    return due is not None and due <= now


class Drain:
    """The background thread of one store in one process (a forked child makes its
    own: threads do not survive a fork)."""

    def __init__(self, store: Owner, cond: threading.Condition) -> None:
        self._store = store
        #: The store's condition: guards what follows and the store's ``_stop``, and
        #: is notified whenever the spool shrinks (``wait`` waits on it).
        self._cond = cond
        #: Streams with buffered text, flushed when due.
        self.streams: set[Flushable] = set()
        self.thread: threading.Thread | None = None
        self.running = False
        #: When the thread plans to wake (monotonic; 0: not sleeping).
        self._wake_at = 0.0
        #: Journals of processes that died could not all be replayed at open (the store
        #: was busy): this process's writes queue behind them, or a restarted agent's
        #: new turns would land before its old spooled ones (found by `fleetstore stress
        #: --kill-rate` with a short budget; tests/store/test_spool.py::test_writes_of_a_restarted_*).
        self.behind = False
        self._failures = 0
        #: The spool's replayed total when the last replay was logged (observe.py).
        self._replayed_logged = 0

    def fall_behind(self) -> None:
        """Journals of dead processes are left to replay before this process's writes."""
        with self._cond:
            self.behind = True
        self.wake()

    def wait(self, timeout: float | None) -> bool:
        """Flush the open streams and wait until the spool is empty and caught up (at
        most *timeout* seconds; default: the write budget).  True if it is."""
        with self._cond:
            streams = list(self.streams)
        for stream in streams:
            stream.flush()
        deadline = time.monotonic() + (
            self._store.settings.write_budget if timeout is None else timeout
        )
        if threading.current_thread() is self.thread:
            return not (len(self._store.spool) or self.behind)  # it cannot wait for itself
        self.wake()
        with self._cond:
            while len(self._store.spool) or self.behind:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._store._stop:
                    return False
                self._cond.wait(remaining)
        return True

    def opened(self, stream: Flushable) -> None:
        """*stream* has buffered something: flush it when it is due.  The background
        thread is woken only if it would otherwise sleep past that (a reply written
        whole within its flush window never wakes it: a wake-up per turn measured
        about a tenth of a lone agent's turn)."""
        due = stream.due()
        with self._cond:
            self.streams.add(stream)
            if self.running and not self._store._stop and (due is None or due >= self._wake_at > 0):
                return
        self.wake()

    def closed(self, stream: Flushable) -> None:
        with self._cond:
            self.streams.discard(stream)

    def wake(self) -> None:
        """Make sure the background thread runs and looks at the spool again."""
        with self._cond:
            if self._store._stop:
                return
            if not self.running:
                # _running, not Thread.is_alive(): a thread that has decided to exit
                # (below, under this lock) but not yet ended is alive, and a write
                # spooled in that moment would wait for a thread that never looks.
                thread = threading.Thread(
                    target=self._run, name="fleetstore-background", daemon=True
                )
                thread.start()
                self.thread, self.running = thread, True
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            # Whatever ended it, the next _wake must be able to start another.
            with self._cond:
                if self.thread is threading.current_thread():
                    self.running = False
            self._store._left()

    def _loop(self) -> None:
        """Replay the spool in order, one operation per transaction, and flush
        streams when due; exit when there is neither (``_wake`` starts it again).
        tests/store/test_spool.py::test_outside_lock_past_the_budget_spools_then_drains_in_order"""
        pause_until = 0.0
        idle_since: float | None = None
        while True:
            with self._cond:
                while True:
                    if self._store._stop:
                        self.running = False
                        return
                    behind = self.behind
                    op = self._store.spool.head()
                    now = time.monotonic()
                    if op is None and not self.streams and not behind:
                        # Linger a while before exiting: a stream opened next turn
                        # then needs no new thread.
                        if idle_since is None:
                            idle_since = now
                        if now - idle_since >= _LINGER:
                            self.running = False
                            self._wake_at = 0.0
                            return
                        self._wake_at = idle_since + _LINGER
                        self._cond.wait(self._wake_at - now)
                        continue
                    idle_since = None
                    paused = now < pause_until
                    dues = [d for s in self.streams if (d := s.due()) is not None]
                    ready = [] if paused else [s for s in self.streams if _due(s, now)]
                    replay = (op is not None or behind) and not paused
                    if replay or ready:
                        break
                    waits = [d - now for d in dues if d > now]
                    if paused:
                        waits.append(pause_until - now)
                    wait = (
                        min(waits)
                        if waits
                        else max(self._store.settings.stream_flush_interval, 0.01)
                    )
                    self._wake_at = now + wait
                    self._cond.wait(wait)
                    self._wake_at = 0.0
            for stream in ready:
                try:
                    stream.flush()
                except Exception as exc:
                    log.error(
                        "%s: timed flush of message %s failed: %s", self._store.path, stream.id, exc
                    )
            if replay and behind:
                pause = self._catch_up()
                pause_until = time.monotonic() + pause if pause else 0.0
            elif replay and op is not None:
                pause = self._replay(op)
                pause_until = time.monotonic() + pause if pause else 0.0

    def _replay(self, op: Operation) -> float:
        """Apply the spool's head *op*; the seconds to wait before trying again
        (0: it is done with, applied or rejected)."""
        try:
            self._store._noting_jobs(op)
        except errors.TransientError:
            return _RETRY_PAUSE  # still locked: the next attempt waits for the lock again
        except Exception as exc:
            if not is_rejectable(exc) or self._store._stop:
                # (A failure met while closing may be the close's: never a rejection.)
                # The store itself failed (I/O error, disk full, closed): the
                # operation is fine and keeps its place; back off and retry.
                self._failures += 1
                pause = min(MAX_PAUSE, 0.1 * 2.0 ** min(self._failures, 10))
                log.error(
                    "%s: replaying spooled %s failed (%s: %s); retrying in %.1fs",
                    self._store.path,
                    op.name,
                    type(exc).__name__,
                    exc,
                    pause,
                )
                return pause
            # It can never apply (e.g. its session was deleted meanwhile): keep it
            # with the reason in rejected.jsonl, loudly; never drop it silently.
            # tests/store/test_spool.py::test_spooled_write_that_cannot_apply_is_rejected_not_dropped
            path = self._store.spool.path
            try:
                reject(self._store.spool_dir, op, exc, path.name if path else None)
            except OSError as err:
                log.error("%s: cannot record rejected %s: %s", self._store.path, op.name, err)
                return MAX_PAUSE
            with self._store._counts_lock:
                self._store._rejected += 1
            log.error(
                "%s: spooled %s (op %s) rejected on replay, kept in %s: %s: %s",
                self._store.path,
                op.name,
                op.op_id,
                self._store.spool_dir / REJECTED,
                type(exc).__name__,
                exc,
            )
        self._failures = 0
        spool = self._store.spool
        spool.done(op)
        if not len(spool):
            self._replayed_logged = observe.log_replayed(self._store, self._replayed_logged)
        with self._cond:
            self._cond.notify_all()
        return 0.0

    def _catch_up(self) -> float:
        """Replay the journals of dead processes before anything of this process's
        spool; the seconds to wait before trying again (0: caught up).  A damaged
        journal (kept for a person) does not hold this process back."""
        try:
            results = self._store.recover()
        except Exception as exc:
            log.error("%s: replaying journals of dead processes failed: %s", self._store.path, exc)
            return _RETRY_PAUSE
        waiting = [
            r
            for r in results
            if r.status == "unfinished"
            # "busy" with its owner dead: another process is replaying it right now
            or (r.status == "busy" and not liveness.alive(journal_pid(Path(r.journal))))
        ]
        if waiting:
            return _RETRY_PAUSE
        with self._cond:
            self.behind = False
            self._cond.notify_all()
        return 0.0


__all__ = ["Drain"]
