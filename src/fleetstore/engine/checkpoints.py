"""A database's checkpoints, run off its writers' path by a thread of their own."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import apsw

from fleetstore import errors
from fleetstore.core.logs import logger
from fleetstore.core.metrics import WriteMetrics
from fleetstore.core.settings import Settings
from fleetstore.core.validate import check_bool
from fleetstore.engine.forkguard import GUARD as _guard
from fleetstore.engine.gate import GateTimeout, WriterGate
from fleetstore.engine.translate import translate


class _Checkpointing(Protocol):
    path: str

    def checkpoint(self, *, truncate: bool = False, wait: bool = True) -> tuple[int, int]: ...

    def _background_error(self, what: str, exc: BaseException) -> None: ...


log = logger("fleetstore")


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
            except errors.FleetstoreError as exc:
                # Counted by checkpoint(); the next commit past the line asks again.
                # Nobody else hears of it: logged here, once.
                log.error(
                    "%s: a checkpoint could not run (committed writes stay in the WAL; "
                    "the next one tries again): %s: %s",
                    db.path,
                    type(exc).__name__,
                    exc,
                    extra={
                        "event": "checkpoint_failed",
                        "store": db.path,
                        "error": f"{type(exc).__name__}: {exc}",
                    },
                )
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


class CatchUp:
    """A checkpoint that could not copy the whole WAL while writers went on (it copies
    the frames there were when it began) asks this process's next writer to copy the
    rest with the gate held, before it releases it: then the writer after it starts
    the WAL over.  The gate itself goes to a thread of the process whose writers hold
    it only when they pause, so asking is faster than waiting for it."""

    def __init__(self) -> None:
        self._asked = threading.Event()
        self._done = threading.Event()
        #: Whether a checkpoint asks: a plain attribute, read after every commit.
        self.wanted = False

    def ask(self, timeout: float) -> bool:
        """(The checkpoint thread.)  True once a writer did it within *timeout*."""
        self._done.clear()
        self._asked.set()
        self.wanted = True
        if self._done.wait(timeout):
            return True
        self._asked.clear()
        self.wanted = False
        return False

    def asked(self) -> bool:
        return self._asked.is_set()

    def run(self, conn: apsw.Connection, before: Callable[[], None] | None) -> Exception | None:
        """(A writer, gate held, just committed.)  Copy the WAL's last frames; the
        error if that failed.  Nothing here may turn the commit into an error (issue
        18: a failed checkpoint after COMMIT once reached the caller); the next
        checkpoint retries."""
        self._asked.clear()
        self.wanted = False
        try:
            if before is not None:
                before()  # what the frames refer to, durable first (blob files)
            conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
        except apsw.BusyError:
            return None  # another process's checkpoint is running: it copies them
        except (OSError, apsw.Error) as exc:
            return exc
        self._done.set()
        return None


#: How long a checkpoint waits for this process's next writer to copy the WAL's last
#: frames, and then for the gate to copy them itself.
_CATCH_UP_ASK = 0.05
_CATCH_UP_WAIT = 0.5


class Checkpoints:
    """``Database``'s checkpoints (engine/sqlite.py): run by a ``Checkpointer`` thread,
    caught up by its writers (``CatchUp``).  A mixin: the attributes are Database's."""

    path: str
    settings: Settings
    _metrics: WriteMetrics
    _gate: WriterGate
    _writer: apsw.Connection | None
    _checkpointer: apsw.Connection | None
    _checkpoint_lock: threading.Lock
    _checkpoint_due: bool
    _checkpoint_step: int
    _checkpoints: Checkpointer
    _catch_up: CatchUp
    _wal_frames: int
    _before_checkpoint: Callable[[], None] | None

    if TYPE_CHECKING:  # Database's own; nothing here at run time

        def _check_process(self) -> None: ...
        def _connect(self, role: str, outcome: str = "") -> apsw.Connection: ...
        def _hand_on(self, gate: WriterGate) -> None: ...
        def _background_error(self, what: str, exc: BaseException) -> None: ...

    def _maybe_checkpoint(self) -> None:
        if self._checkpoint_due:
            self._checkpoint_due = False
            self._checkpoints.request()

    def checkpoint(self, *, truncate: bool = False, wait: bool = True) -> tuple[int, int]:
        """Passive checkpoint, outside the gate; then, if the WAL is past
        ``truncate_bytes`` (or *truncate*: whatever its size) and no reader holds
        frames back, one non-waiting try to truncate it.  Returns (frames in the
        WAL, frames checkpointed).  A checkpoint of this process already running (the
        background one) is waited for first; with *wait* False, (-1, -1) instead."""
        check_bool(truncate, "truncate")
        check_bool(wait, "wait")
        self._check_process()
        if not self._checkpoint_lock.acquire(blocking=wait):
            return (-1, -1)
        try:
            return self._checkpoint(truncate)
        except errors.StoreClosed:
            raise
        except errors.FleetstoreError as exc:
            # The WAL keeps the frames (every committed write stands); the next
            # checkpoint tries again.  Counted and shown: metrics(), doctor.
            self._metrics.note_error("checkpoint_errors", "checkpoint", exc)
            raise
        finally:
            self._checkpoint_lock.release()

    def _checkpoint(self, truncate: bool) -> tuple[int, int]:
        outcome = "the checkpoint did not finish; committed writes stay in the WAL"
        if self._checkpointer is None:
            with _guard.inside():
                self._checkpointer = self._connect("checkpointer", outcome)
        conn = self._checkpointer
        if self._before_checkpoint is not None:
            try:
                self._before_checkpoint()
            except OSError as exc:
                raise errors.storage_error(
                    exc,
                    f"{self.path}: checkpoint put off: what it would make durable refers "
                    "to files that could not be synced",
                ) from exc
        began = time.monotonic()
        with _guard.inside():
            try:
                log, done = conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
                # Writers went on while it copied (it copies the frames there were
                # when it began): SQLite starts the WAL over only once every frame
                # is copied, so a fleet (or one agent, with the checkpoint in a
                # thread) that never pauses grew it without bound (226 MiB after
                # 3,000 lone turns).  Copy what they added, then the last few
                # frames with the gate held.
                for _ in range(2):
                    if not 0 <= done < self._frames_now():
                        break
                    log, done = conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
                if 0 <= done < self._frames_now():
                    log, done = self._checkpoint_gated(conn, (log, done))
            except apsw.BusyError:
                return (-1, -1)
            except apsw.Error as exc:
                raise translate(exc, self.path, conn, outcome=outcome) from exc
            self._metrics.record_checkpoint(time.monotonic() - began)
            # TRUNCATE holds SQLite's write lock through a full backfill and an
            # fsync (22-28 ms stalls of the gate holder, measured): only for a WAL
            # file grown large, e.g. while a reader pinned it, and fully copied.
            limit = 1 if truncate else self.settings.truncate_bytes
            if done == log and self._wal_file_bytes() >= limit:
                conn.setbusytimeout(0)
                try:
                    log, done = conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
                except apsw.BusyError:
                    pass
                except apsw.Error as exc:
                    raise translate(exc, self.path, conn, outcome=outcome) from exc
                finally:
                    conn.setbusytimeout(self.settings.busy_timeout_ms)
            return (log, done)

    def _checkpoint_gated(self, conn: apsw.Connection, before: tuple[int, int]) -> tuple[int, int]:
        """The WAL's last frames copied with the writer gate held (no fleetstore writer
        adds frames meanwhile), so that the next writer starts the WAL over: by this
        process's next writer before it releases the gate (the gate passes to a thread
        of the same process only when its writers pause), else, if none comes soon,
        here.  Given up if the gate is not free within a moment."""
        if self._catch_up.ask(_CATCH_UP_ASK):
            return (0, 0)
        gate = self._gate
        try:
            gate.acquire(time.monotonic() + _CATCH_UP_WAIT)
        except GateTimeout:
            return before
        try:
            result: tuple[int, int] = conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
            return result
        finally:
            self._hand_on(gate)

    def _frames_now(self) -> int:
        shared = self._gate.wal_frames()
        return self._wal_frames if shared is None else shared

    def _catch_up_if_asked(self) -> None:
        """Gate held, just committed: copy the WAL's last frames if a checkpoint asked.
        Never raises (the commit stands)."""
        writer, catch_up = self._writer, self._catch_up
        if catch_up.asked() and writer is not None:
            failed = catch_up.run(writer, self._before_checkpoint)
            if failed is not None:
                self._background_error("checkpoint", failed)

    def _wal_file_bytes(self) -> int:
        try:
            return os.stat(self.path + "-wal").st_size
        except OSError:
            return 0


__all__ = ["CatchUp", "Checkpointer", "Checkpoints"]
