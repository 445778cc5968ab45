"""The Store: one object per open store, holding the engine, the blob files,
the spool and the domain APIs (``sessions``, ``messages``, ``state``, ``effects``).

Every write goes through ``Store.submit(operation)``: applied now within the
write budget, or, past it, appended to this process's spool and applied later
in order (``on_busy="spool"``, the default) or refused with ``StoreBusy``
(``on_busy="raise"``).  Once anything is spooled, later writes of the process
queue behind it, so a process's writes land in the order it made them.
"""

from __future__ import annotations

import collections
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from fleetstore import errors, sql
from fleetstore.core import telemetry
from fleetstore.core.logs import logger
from fleetstore.core.metrics import OutboxMetrics
from fleetstore.core.settings import Settings
from fleetstore.core.targets import (
    CATALOG,
    DEFAULT_FILENAME,
    local_base,
    parse_target,
    redact,
    resolve_target,
)
from fleetstore.core.validate import (
    check_bool,
    check_int,
    check_opt_id,
    check_opt_timeout,
    check_str,
    check_timeout,
)
from fleetstore.domain import registry, session_jobs
from fleetstore.domain.blobs import BlobStore, DbBlobStore, referenced_shas
from fleetstore.domain.history import Messages, Sessions
from fleetstore.domain.operations import Operation
from fleetstore.domain.outbox import Effects
from fleetstore.domain.ports import Flushable
from fleetstore.domain.search import Search
from fleetstore.domain.state import State
from fleetstore.engine.base import Engine, Tx
from fleetstore.engine.foreign import read_foreign
from fleetstore.engine.inspect import InspectFailed, read_header
from fleetstore.store import observe
from fleetstore.store.backend import Backend
from fleetstore.store.indexer import Indexer
from fleetstore.store.procstats import Publisher
from fleetstore.store.server import open_server
from fleetstore.store.sharded import Router, open_sharded
from fleetstore.store.sidecars import check_sidecars
from fleetstore.store.single import open_file
from fleetstore.store.spool import (
    REJECTED,
    Recovered,
    Spool,
    is_rejectable,
    journal_pid,
    journals,
    recover_journal,
    reject,
    remove_stale_new_files,
)

T = TypeVar("T")
log = logger("fleetstore")


_live: weakref.WeakSet[Store] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_live):
        store._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)

#: After a transient failure to replay (the lock), wait this long before the next
#: attempt; the attempt itself already waited up to the write budget.
_RETRY_PAUSE = 0.01
#: After the store itself failed a replay (I/O error, disk full...): backoff cap.
_MAX_PAUSE = 10.0
#: The background thread waits this long for more work before it exits.
_LINGER = 2.0
#: Seconds between looks at forks that other live processes are copying (their
#: process may die, and its fork must then be given up).
_JOBS_POLL = 2.0


def _process_alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _due(stream: Flushable, now: float) -> bool:
    due = stream.due()
    return due is not None and due <= now


class Store:
    """An open fleetstore store.  Use ``fleetstore.open()``; thread-safe."""

    def __init__(self, backend: Backend, settings: Settings) -> None:
        #: The layout: where each write and read goes (store/backend.py).
        self.backend = backend
        #: The database the store names (a sharded store: its catalog).
        self.db = backend.db
        self.settings = settings
        #: "sqlite" or "postgresql"; only the engine and the SQL files differ.
        self.dialect: str = backend.db.dialect
        #: "file" (one SQLite file), "sharded" (a directory) or "server" (PostgreSQL).
        self.layout = backend.layout
        #: The store file (SQLite; sharded: the catalog) or this host's base path for a
        #: server store.
        self.path = backend.path
        #: What messages name: the file, the directory, or the URL without its password.
        self.url: str = backend.url
        self.queries = sql.queries(self.dialect)
        #: The sharded layout's router, for the tools that work file by file (None:
        #: another layout).
        self.router: Router | None = backend if isinstance(backend, Router) else None
        self.blobs: BlobStore | DbBlobStore = backend.blobs
        self.spool_dir = Path(str(self.path) + ".spool")
        self.spool = Spool(self.spool_dir)
        self.sessions = Sessions(self)
        self.messages = Messages(self)
        self.state = State(self)
        self.effects = Effects(self)
        #: OpenTelemetry's ``db.namespace``: the store's file (or directory), or a
        #: PostgreSQL store's database name.
        self.namespace = observe.namespace(self)
        #: Full-text search of every session (docs/search.md).
        self.search = Search(self)
        self._closed = False
        self._init_process()
        _live.add(self)

    def _init_process(self) -> None:
        self._counts_lock = threading.Lock()
        self._op_counts: collections.Counter[str] = collections.Counter()
        #: This process's outbox figures (enqueued, claimed, settled, waits, runs).
        self.outbox_metrics = OutboxMetrics()
        self._rejected = 0
        #: Operations of dead processes' journals this process replayed.
        self._recovered = 0
        #: The spool's replayed count when the last replay was logged.
        self._replayed_logged = 0
        self._failures = 0
        # _cond guards _streams, _thread, _running and _stop, and is notified
        # whenever the spool shrinks (flush() waits on it).
        self._cond = threading.Condition()
        self._streams: set[Flushable] = set()
        self._thread: threading.Thread | None = None
        self._running = False
        #: When the background thread plans to wake (monotonic; 0: not sleeping).
        self._wake_at = 0.0
        self._stop = self._closed
        #: Set by a close() that found the background thread still inside the engine:
        #: the thread runs it as it leaves, so the engine never closes under it.
        self._last_out: Callable[[], None] | None = None
        #: Journals of processes that died could not all be replayed at open (the store
        #: was busy): this process's writes queue behind them, or a restarted agent's
        #: new turns would land before its old spooled ones (found by `fleetstore stress
        #: --kill-rate` with a short budget; tests/store/test_spool.py::test_writes_of_a_restarted_*).
        self._behind = False
        # Started by the first write or read, not here: this also runs in a child
        # right after fork, where starting threads is best left to the child's own code.
        self._publisher: Publisher | None = None
        #: The thread finishing deletes and forks under way (``finish_jobs``).
        self._jobs: threading.Thread | None = None
        self._jobs_running = False
        self._jobs_again = False
        #: The search indexer, started by this process's first write (store/indexer.py).
        keys = self.router.take_search_keys if self.router is not None else None
        self._indexer = Indexer(self, keys, self._left)
        self._indexing = not self.settings.search_index

    def _after_fork(self) -> None:
        # Threads do not survive a fork: a child starts its own spool and
        # background thread.  (Spool's own at-fork hook did the same; doing it
        # here too does not depend on the order the hooks run in.)
        self.spool._after_fork()
        self.backend.after_fork()
        if isinstance(self.blobs, BlobStore):
            self.blobs.after_fork()
        self._init_process()

    # -- writing ---------------------------------------------------------------------------

    def submit(
        self,
        op: Operation,
        *,
        spool: bool = True,
        must_land: bool = False,
        independent: bool = False,
    ) -> dict[str, Any] | None:
        """Apply *op*; returns its result, or None if it went to the spool.

        Past the write budget the operation is spooled (``on_busy="spool"`` and
        *spool*) or ``StoreBusy`` is raised.  Once anything is spooled, later
        operations queue behind it; one that must not be spooled (*spool* False:
        a conditional write, whose outcome the caller needs) raises
        ``SpoolPending`` instead of overtaking them.  *must_land* (an effect's
        settlement): spooled past the budget even with ``on_busy="raise"``.
        *independent* (claims, heartbeats, sweeps): neither depends on this
        process's spooled writes nor they on it: applied now even while the
        spool holds writes, never spooled.  If the journal cannot be written
        either, ``StorageFull`` (disk full) or ``StorageError``: nothing was written.
        An operation the API made (``trusted``) is not checked again."""
        if op.__class__ is not Operation or not op.trusted:
            op = check_operation(op)
            for name, flag in (
                ("spool", spool),
                ("must_land", must_land),
                ("independent", independent),
            ):
                check_bool(flag, name)
        # An attribute read while no OpenTelemetry SDK is installed: no call
        # (core/telemetry.py; tests/store/test_cost.py's ceilings).
        if telemetry.ACTIVE is not None:
            return observe.traced(self, op, spool, must_land, independent)
        blobs = self.blobs
        if blobs.__class__ is BlobStore and blobs._kept:
            return self._settling(op, spool, must_land, independent)
        return self._submit(op, spool, must_land, independent)

    def _dispatch(
        self, op: Operation, spool: bool, must_land: bool, independent: bool
    ) -> dict[str, Any] | None:
        blobs = self.blobs
        if blobs.__class__ is BlobStore and blobs._kept:
            return self._settling(op, spool, must_land, independent)
        return self._submit(op, spool, must_land, independent)

    def _settling(
        self, op: Operation, spool: bool, must_land: bool, independent: bool
    ) -> dict[str, Any] | None:
        # The blob files this write stored before it waited: see BlobStore.settle.
        blobs = self.blobs
        assert isinstance(blobs, BlobStore)
        shas = referenced_shas(op.args)
        try:
            result = self._submit(op, spool, must_land, independent)
        except BaseException:
            blobs.settle(shas, written=False)
            raise
        blobs.settle(shas, written=True)
        return result

    def _submit(
        self, op: Operation, spool: bool, must_land: bool, independent: bool
    ) -> dict[str, Any] | None:
        if self._closed:
            raise errors.StoreClosed(f"{self.path}: the store was closed")
        if self._publisher is None:
            self._start_publisher()
        if not self._indexing:
            self._indexing = True
            self._indexer.start()
        with self._counts_lock:
            self._op_counts[op.name] += 1
        if independent:
            return self.backend.apply(op)
        if self.spool._pending or self._behind:
            may_spool = must_land or (spool and self.settings.on_busy == "spool")
            if not may_spool:
                raise errors.SpoolPending(
                    f"{len(self.spool)} earlier write(s) of this process wait in its spool"
                    + (" behind the journals of processes that died" if self._behind else "")
                    + "; "
                    f"a {op.name} that must not be spooled cannot overtake them; "
                    "retry after store.flush()"
                )
            self._spool(op, None)
            return None
        try:
            return self.backend.apply(op)  # checked above
        except errors.StoreBusy as busy:
            if not (must_land or (spool and self.settings.on_busy == "spool")):
                raise
            self._spool(op, busy)
            return None
        except errors.CommitUncertain as unknown:
            # Not known within the budget whether it is in the file (its holder stopped
            # while committing): replayed from the spool it is found there, or written.
            may_spool = must_land or (spool and self.settings.on_busy == "spool")
            if not may_spool or not registry.spec_of(op.name).retry_safe:
                raise
            self._spool(op, unknown)
            return None

    def apply(self, op: Operation) -> dict[str, Any]:
        """Apply *op* now, in its own write transaction (``StoreBusy`` past the budget)."""
        return self.backend.apply(check_operation(op))

    def _spool(self, op: Operation, busy: errors.FleetstoreError | None) -> None:
        try:
            self.spool.append(op)
        except OSError as exc:
            why = "the store is busy" if busy is not None else "earlier writes are spooled"
            raise errors.storage_error(
                exc,
                f"{self.path}: {op.name} could not be written now ({why}) nor spooled in "
                f"{self.spool_dir}; nothing was written",
            ) from exc
        if busy is not None:
            observe.log_spooled(self, op, busy)
        else:
            log.debug("%s: %s queued in the spool behind earlier writes", self.path, op.name)
        self._wake()

    @property
    def notifies(self) -> bool:
        """Whether ``notify_wait`` wakes on another process's ring (PostgreSQL's
        LISTEN/NOTIFY, the gate file's futex words on SQLite) rather than sleeping its
        timeout (no futex here)."""
        return self.db.notifies

    @property
    def spans_files(self) -> bool:
        """Whether the catalog's index and the sessions live in different files."""
        return self.layout == "sharded"

    def notify_token(self, channel: str) -> int:
        """The token of ``notify_wait``: take it before looking for what a ring of
        *channel* announces (engine/notify.py)."""
        self._check_open()
        return self.db.notify_token(channel)

    def notify_wait(self, channel: str, timeout: float, token: int | None = None) -> bool:
        """Wait up to *timeout* seconds for a ring of *channel* after *token* (from
        ``notify_token``; None: after this call); True if one came."""
        check_str(channel, "channel", limit=63, empty=False)
        check_timeout(timeout)
        if token is not None:
            check_int(token, "token", minimum=0)
        self._check_open()
        return self.db.notify_wait(channel, timeout, token)

    def listen(self, channel: str, fn: Callable[[], None]) -> Callable[[], None]:
        """Call *fn* (in a listener thread: it must return quickly) after each ring of
        *channel* heard from now on; returns the function that stops it."""
        check_callable(fn)
        self._check_open()
        return self.db.listen(channel, fn)

    def spool_pending(self, session_id: str | None = None) -> int:
        """This process's writes waiting in its spool (only those that touch
        *session_id*, if given: then 0 or the whole count)."""
        check_opt_id(session_id, "session_id")
        pending = len(self.spool)
        if pending and session_id is not None and not self.spool.touches(session_id):
            return 0
        return pending

    def check_visible(self, session_id: str | None) -> None:
        """Raise ``SpoolPending`` if a read of *session_id* (None: of anything) would
        miss writes of this process still in its spool."""
        check_opt_id(session_id, "session_id")
        self._check_open()
        pending = len(self.spool)
        if not pending:
            return
        if session_id is not None and not self.spool.touches(session_id):
            return
        raise errors.SpoolPending(
            f"{pending} write(s) of this process wait in its spool"
            + (f", some to session {session_id!r}" if session_id else "")
            + "; this read would not see them. store.flush() waits until they are applied."
        )

    def flush(self, timeout: float | None = None) -> bool:
        """Write pending stream text and wait until this process's spool is empty
        (at most *timeout* seconds; default: the write budget).  True if it is."""
        check_opt_timeout(timeout)
        self._check_open()
        return self._drain(timeout)

    def _drain(self, timeout: float | None) -> bool:
        with self._cond:
            streams = list(self._streams)
        for stream in streams:
            stream.flush()
        deadline = time.monotonic() + (self.settings.write_budget if timeout is None else timeout)
        if threading.current_thread() is self._thread:
            return not (len(self.spool) or self._behind)  # it cannot wait for itself
        self._wake()
        with self._cond:
            while len(self.spool) or self._behind:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stop:
                    return False
                self._cond.wait(remaining)
        return True

    # -- reading ---------------------------------------------------------------------------

    def read(self, fn: Callable[[Tx], T], *, session_id: str | None = None) -> T:
        """``fn(tx)`` in one read transaction.  A sharded store reads the file of
        *session_id*'s tree, or the catalog (sessions index, effects) without one."""
        check_callable(fn)
        check_opt_id(session_id, "session_id")
        self._check_open()
        if self._publisher is None:
            self._start_publisher()
        return self.backend.read(fn, session_id)

    def read_first(self, fn: Callable[[Tx], list[T]]) -> list[T]:
        """``fn(tx)`` for a lookup by an id that does not name its session (a message
        id): a sharded store asks the catalog, then each shard, until one has rows."""
        check_callable(fn)
        self._check_open()
        return self.backend.read_first(fn)

    def sync_catalog(self, timeout: float | None = None) -> bool:
        """A sharded store: bring the catalog's sessions index up to date with what
        this process wrote.  *timeout* None: now, in this thread (up to the write
        budget); else wait at most *timeout* seconds for the background refresh
        (``sessions.list`` waits 0.5 s: a listing does not wait for a locked
        catalog).  True if the index is up to date with this process's writes."""
        check_opt_timeout(timeout)
        self._check_open()
        return self.backend.sync_catalog(timeout)

    def search_files(
        self, *, session_id: str | None, root_id: str | None, project: str | None
    ) -> list[str | None]:
        """The files a search with these filters reads (None: the store's database, or
        a sharded store's catalog)."""
        return self.backend.search_files(session_id=session_id, root_id=root_id, project=project)

    def with_file(self, key: str | None, fn: Callable[[Engine], T]) -> T:
        """``fn(db)`` with file *key*'s database (``search_files``)."""
        check_callable(fn)
        self._check_open()
        return self.backend.with_file(key, fn)

    def _start_publisher(self) -> None:
        """This process's figures, published for ``fleetstore top`` (a child after
        fork publishes under its own PID: threads do not survive a fork)."""
        with self._counts_lock:
            if self._publisher is not None:
                return
            self._publisher = Publisher(
                str(self.path), self.settings.publish_interval, self._published_figures
            )
        observe.watch(self)
        self._publisher.start()

    # -- background work: the spool drain and timed stream flushes -------------------------

    def finish_jobs(self) -> None:
        """Finish, in a thread of this store's, the deletes and forks under way that
        nobody is finishing (fleetstore.domain.session_jobs): a process killed
        mid-way, a purge that met a busy store, a spooled delete replayed.  Returns
        at once; the thread ends when nothing is left, or at ``close``."""
        with self._cond:
            if self._stop:
                return
            self._jobs_again = True
            if self._jobs is not None and self._jobs.is_alive():
                return
            self._jobs = threading.Thread(
                target=self._jobs_thread, name="fleetstore-jobs", daemon=True
            )
            self._jobs_running = True
            self._jobs.start()

    def _jobs_thread(self) -> None:
        try:
            self._jobs_loop()
        finally:
            with self._cond:
                self._jobs_running = False
            self._left()

    def _jobs_loop(self) -> None:
        pause = 0.0
        while True:
            with self._cond:
                if pause:
                    self._cond.wait(pause)
                if self._stop:
                    return
                self._jobs_again = False
            try:
                left = session_jobs.finish_jobs(self, stop=lambda: self._stop)
            except Exception as exc:  # the store busy, failing or closing: again later
                log.warning("%s: finishing deletes and forks under way: %s", self.path, exc)
                pause = min(_MAX_PAUSE, max(pause * 2, 0.5))
                continue
            with self._cond:
                if not left and not self._jobs_again:
                    self._jobs = None
                    return
            # Forks that live processes copy: look again later (their owner may die).
            pause = 0.0 if self._jobs_again else _JOBS_POLL

    def _noting_jobs(self, op: Operation) -> dict[str, Any]:
        """*op* applied now; a delete (replayed from a spool journal) then has its
        rows purged by the job thread."""
        result = self.apply(op)
        if result.get("purge"):
            self.finish_jobs()
        return result

    def streams_opened(self, stream: Flushable) -> None:
        """*stream* has buffered something: flush it when it is due.  The background
        thread is woken only if it would otherwise sleep past that (a reply written
        whole within its flush window never wakes it: a wake-up per turn measured
        about a tenth of a lone agent's turn)."""
        due = stream.due()
        with self._cond:
            self._streams.add(stream)
            if self._running and not self._stop and (due is None or due >= self._wake_at > 0):
                return
        self._wake()

    def streams_closed(self, stream: Flushable) -> None:
        with self._cond:
            self._streams.discard(stream)

    def _wake(self) -> None:
        """Make sure the background thread runs and looks at the spool again."""
        with self._cond:
            if self._stop:
                return
            if not self._running:
                # _running, not Thread.is_alive(): a thread that has decided to exit
                # (below, under this lock) but not yet ended is alive, and a write
                # spooled in that moment would wait for a thread that never looks.
                thread = threading.Thread(
                    target=self._background, name="fleetstore-background", daemon=True
                )
                thread.start()
                self._thread, self._running = thread, True
            self._cond.notify_all()

    def _background(self) -> None:
        try:
            self._background_loop()
        finally:
            # Whatever ended it, the next _wake must be able to start another.
            with self._cond:
                if self._thread is threading.current_thread():
                    self._running = False
            self._left()

    def _left(self) -> None:
        """A background thread has ended: the last one out closes the store's engine if
        close() came while it was inside (see close)."""
        with self._cond:
            if self._running or self._jobs_running or self._indexer.running:
                return
            last_out, self._last_out = self._last_out, None
        if last_out is not None:
            last_out()

    def _background_loop(self) -> None:
        """Replay the spool in order, one operation per transaction, and flush
        streams when due; exit when there is neither (``_wake`` starts it again).
        tests/store/test_spool.py::test_outside_lock_past_the_budget_spools_then_drains_in_order"""
        pause_until = 0.0
        idle_since: float | None = None
        while True:
            with self._cond:
                while True:
                    if self._stop:
                        self._running = False
                        return
                    behind = self._behind
                    op = self.spool.head()
                    now = time.monotonic()
                    if op is None and not self._streams and not behind:
                        # Linger a while before exiting: a stream opened next turn
                        # then needs no new thread.
                        if idle_since is None:
                            idle_since = now
                        if now - idle_since >= _LINGER:
                            self._running = False
                            self._wake_at = 0.0
                            return
                        self._wake_at = idle_since + _LINGER
                        self._cond.wait(self._wake_at - now)
                        continue
                    idle_since = None
                    paused = now < pause_until
                    dues = [d for s in self._streams if (d := s.due()) is not None]
                    ready = [] if paused else [s for s in self._streams if _due(s, now)]
                    replay = (op is not None or behind) and not paused
                    if replay or ready:
                        break
                    waits = [d - now for d in dues if d > now]
                    if paused:
                        waits.append(pause_until - now)
                    wait = min(waits) if waits else max(self.settings.stream_flush_interval, 0.01)
                    self._wake_at = now + wait
                    self._cond.wait(wait)
                    self._wake_at = 0.0
            for stream in ready:
                try:
                    stream.flush()
                except Exception as exc:
                    log.error("%s: timed flush of message %s failed: %s", self.path, stream.id, exc)
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
            self._noting_jobs(op)
        except errors.TransientError:
            return _RETRY_PAUSE  # still locked: the next attempt waits for the lock again
        except Exception as exc:
            if not is_rejectable(exc) or self._stop:
                # (A failure met while closing may be the close's: never a rejection.)
                # The store itself failed (I/O error, disk full, closed): the
                # operation is fine and keeps its place; back off and retry.
                self._failures += 1
                pause = min(_MAX_PAUSE, 0.1 * 2.0 ** min(self._failures, 10))
                log.error(
                    "%s: replaying spooled %s failed (%s: %s); retrying in %.1fs",
                    self.path,
                    op.name,
                    type(exc).__name__,
                    exc,
                    pause,
                )
                return pause
            # It can never apply (e.g. its session was deleted meanwhile): keep it
            # with the reason in rejected.jsonl, loudly; never drop it silently.
            # tests/store/test_spool.py::test_spooled_write_that_cannot_apply_is_rejected_not_dropped
            path = self.spool.path
            try:
                reject(self.spool_dir, op, exc, path.name if path else None)
            except OSError as err:
                log.error("%s: cannot record rejected %s: %s", self.path, op.name, err)
                return _MAX_PAUSE
            with self._counts_lock:
                self._rejected += 1
            log.error(
                "%s: spooled %s (op %s) rejected on replay, kept in %s: %s: %s",
                self.path,
                op.name,
                op.op_id,
                self.spool_dir / REJECTED,
                type(exc).__name__,
                exc,
            )
        self._failures = 0
        self.spool.done(op)
        if not len(self.spool):
            self._replayed_logged = observe.log_replayed(self, self._replayed_logged)
        with self._cond:
            self._cond.notify_all()
        return 0.0

    def _catch_up(self) -> float:
        """Replay the journals of dead processes before anything of this process's
        spool; the seconds to wait before trying again (0: caught up).  A damaged
        journal (kept for a person) does not hold this process back."""
        try:
            results = self.recover()
        except Exception as exc:
            log.error("%s: replaying journals of dead processes failed: %s", self.path, exc)
            return _RETRY_PAUSE
        waiting = [
            r
            for r in results
            if r.status == "unfinished"
            # "busy" with its owner dead: another process is replaying it right now
            or (r.status == "busy" and not _process_alive(journal_pid(Path(r.journal))))
        ]
        if waiting:
            return _RETRY_PAUSE
        with self._cond:
            self._behind = False
            self._cond.notify_all()
        return 0.0

    def recover(self) -> list[Recovered]:
        """Replay the journals of processes that died with writes in their spool
        (and of stores closed before theirs drained).  Journals of live processes
        are left alone ("busy").  Once one stops "unfinished" (the store stayed
        locked past the budget), the rest are not tried."""
        self._check_open()
        remove_stale_new_files(self.spool_dir)
        results: list[Recovered] = []
        stopped = ""
        own = self.spool.path
        for path in journals(self.spool_dir):
            if path == own:
                continue
            if not stopped and self._stop:
                stopped = "the store is closing"
            if stopped:
                results.append(Recovered(str(path), 0, "unfinished", f"not tried: {stopped}"))
                continue
            # Stops between two operations once close() begins: the rest waits for the
            # next open or `fleetstore recover` (issue 23, cause 7).
            result = recover_journal(path, self._noting_jobs, self._check_blobs, lambda: self._stop)
            if result.status == "unfinished":
                stopped = f"the replay of {path.name} stopped"
            with self._counts_lock:
                self._recovered += result.replayed
            if result.replayed:
                observe.log_recovered(self, path, result.replayed, result.status)
            if result.rejected:
                with self._counts_lock:
                    self._rejected += result.rejected
                for r in result.rejections:
                    log.error(
                        "%s: %s (op %s) from %s rejected, kept in %s: %s",
                        self.path,
                        r.op,
                        r.op_id,
                        path.name,
                        self.spool_dir / REJECTED,
                        r.error,
                    )
            results.append(result)
        return results

    def _check_blobs(self, op: Operation) -> None:
        """``BlobCorrupt`` if a blob *op* refers to is missing or damaged."""
        for sha in sorted(set(referenced_shas(op.args))):
            if not self.blobs.verify(sha):
                raise errors.BlobCorrupt(
                    f"blob {sha} ({self.blobs.describe(sha)}) is missing or damaged"
                )

    # -- observing and closing -------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """This process's figures: the engine's, plus operations, spool and streams."""
        with self._counts_lock:
            counts, rejected, recovered = dict(self._op_counts), self._rejected, self._recovered
        engine = self.backend.metrics()
        return {
            **engine,
            "operations": counts,
            "spool_pending": len(self.spool),
            "spooled": self.spool.spooled_total,
            "replayed": self.spool.replayed_total,
            "recovered": recovered,
            "rejected": rejected,
            "open_streams": len(self._streams),
            "outbox": self.outbox_metrics.snapshot(),
            **self._indexer.figures(),
        }

    def histograms(self) -> dict[str, Any]:
        """The raw histograms of ``metrics()`` (lock wait and hold, checkpoints, effect
        waits and runs), to be merged with other processes'
        (``fleetstore.core.metrics.Histogram.from_buckets``)."""
        return {**self.db.histograms(), **self.outbox_metrics.export()}

    def _published_figures(self) -> dict[str, Any]:
        # With every publish (about once a second): an SDK installed after the store
        # was opened is found within one interval.
        telemetry.refresh()
        return {"metrics": self.metrics(), "histograms": self.histograms()}

    def _check_open(self) -> None:
        if self._closed:
            raise errors.StoreClosed(f"{self.path}: the store was closed")

    def close(self, timeout: float | None = None) -> None:
        """Flush open streams, wait (up to *timeout*, default the write budget) for the
        spool to drain, and close.  Writes still spooled stay in the journal, and
        journals of dead processes not yet replayed stay too, for ``fleetstore
        recover`` or the next ``fleetstore.open``; the operation being replayed may
        add up to one write budget to the wait.  Idempotent."""
        check_opt_timeout(timeout)
        if self._closed:
            return
        drained = False
        try:
            drained = self._drain(timeout)
            if not drained:
                log.error(
                    "%s: closing with %d write(s) still in the spool journal %s%s; "
                    "`fleetstore recover` or the next open applies them",
                    self.path,
                    len(self.spool),
                    self.spool.path,
                    " and journals of processes that died not all replayed" if self._behind else "",
                )
        finally:
            with self._cond:
                self._stop = True  # the replay stops before its next operation
                self._cond.notify_all()
            here = threading.current_thread() in (self._thread, self._jobs)
            self._indexer.stop(self.settings.write_budget + 5)
            for thread in (self._thread, self._jobs):
                if thread is not None and thread is not threading.current_thread():
                    # The operation under way ends within one write budget.
                    # tests/store/test_spool.py::test_close_while_locked_*
                    thread.join(self.settings.write_budget + 5)
            self._closed = True
            telemetry.unwatch(self)
            if self._publisher is not None:
                self._publisher.stop()
            # A sharded store's index refresh may wait for the catalog's lock: not when
            # the caller asked not to wait, nor when the spool says it is locked.
            sync = drained and (timeout is None or timeout > 0)

            def last_out() -> None:
                self.spool.close()
                self.backend.close(sync=sync)
                _live.discard(self)

            with self._cond:
                # Still inside the engine (an operation stuck longer than that): the
                # thread closes it as it leaves.  Closing it here met the operation in
                # flight with a closed gate, and it went to rejected.jsonl as a bug
                # (issue 23, cause 7; tests/store/test_spool.py::test_close_during_the_*).
                inside = (self._running or self._jobs_running or self._indexer.running) and not here
                if inside:
                    self._last_out = last_out
            if inside:
                log.error(
                    "%s: closing while the background thread is still inside an operation; "
                    "it closes the database when that operation ends",
                    self.path,
                )
            else:
                last_out()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<fleetstore.Store {str(self.path)!r}{' closed' if self._closed else ''}>"


def check_operation(op: object) -> Operation:
    """*op*, an ``Operation`` naming a registered operation, with an id and arguments
    (a JSON object); ``InvalidInput`` otherwise."""
    if not isinstance(op, Operation):
        raise errors.InvalidInput(f"not an Operation: {type(op).__name__}")
    if op.trusted:
        return op
    if not isinstance(op.args, Mapping) or not all(isinstance(k, str) for k in op.args):
        raise errors.InvalidInput(f"operation {op.name!r:.80}: args must be a dict")
    return registry.decode({"op": op.name, "id": op.op_id, "args": dict(op.args)})


def check_callable(fn: object) -> None:
    if not callable(fn):
        raise errors.InvalidInput(f"fn must be a function of the transaction, not {fn!r:.80}")


def _open_store(path: Path | str, config: Settings, kind: str = "") -> Store:
    backend: Backend
    if isinstance(path, Path):
        check_sidecars(path / CATALOG if kind == "sharded" else path)
    if kind == "sharded":
        assert isinstance(path, Path)
        backend = open_sharded(path, config, sql.queries("sqlite"))
    elif isinstance(path, str):  # a PostgreSQL URL
        backend = open_server(path, config, sql.queries("postgresql"))
    else:
        backend = open_file(path, config, sql.queries("sqlite"))
    try:
        return Store(backend, config)
    except BaseException:
        backend.close(sync=False)
        raise


def open(url_or_path: str | os.PathLike[str] | None = None, **settings: Any) -> Store:
    """Open (creating if needed) a store.  *url_or_path*: a file path, a directory,
    or ``sqlite:///absolute/path``; default ``$FLEETSTORE_URL``, else
    ``<data dir>/fleetstore.db``.  *settings* are ``Settings`` fields (each also
    ``FLEETSTORE_<NAME>``).  Journals left by processes that died are replayed."""
    config = Settings.load(**settings)
    kind, target = parse_target(url_or_path)
    path = redact(target) if isinstance(target, str) else target
    store = _open_store(target, config, kind)
    try:
        store.backend.recover()
        q = store.queries
        if store.read(lambda tx: tx.execute(q["session_jobs"], (1,))):
            store.finish_jobs()  # a process died mid-delete or mid-fork
        if journals(store.spool_dir):
            results = store.recover()
            if any(r.status == "unfinished" for r in results):
                with store._cond:
                    store._behind = True
                store._wake()
            for result in results:
                if result.status in ("damaged", "unfinished"):
                    log.error(
                        "%s: recovering %s: %s: %s",
                        path,
                        result.journal,
                        result.status,
                        result.detail,
                    )
    except (errors.FleetstoreError, OSError) as exc:
        # The store itself is fine; the journals wait for the next open or recover.
        log.error("%s: journals of dead processes not replayed: %s", path, exc)
    except BaseException:
        store.close(timeout=0)
        raise
    return store


def check_store_file(path: Path) -> None:
    """``CorruptStore`` unless *path* is a fleetstore store's file, read without
    changing it (recover must not make a store of whatever file it is pointed at)."""
    try:
        header = read_header(str(path))
    except InspectFailed:
        raise errors.CorruptStore(
            f"{path} is not a SQLite database, so not a fleetstore store; nothing was changed"
        ) from None
    except OSError as exc:
        raise errors.NotFound(f"no store at {path}: {exc.strerror}") from exc
    if header is None:
        raise errors.CorruptStore(f"{path} is empty, not a fleetstore store; nothing was changed")
    try:
        tables = read_foreign(
            path,
            lambda db: {
                r[0] for r in db.query("SELECT name FROM sqlite_schema WHERE type='table'")
            },
        )
    except errors.FleetstoreError:
        return  # cannot tell now (busy, a WAL without its index...): the open decides
    if "fleetstore_migrations" not in tables:
        raise errors.CorruptStore(
            f"{path} is a SQLite database of another program, not a fleetstore store; "
            "nothing was changed"
        )


def recover_journals(
    url_or_path: str | os.PathLike[str] | None = None, **settings: Any
) -> tuple[Path, list[Recovered]]:
    """``fleetstore recover``: replay the journals that processes which died left
    beside the store at *url_or_path* (resolved as by ``open``).  Returns the
    store's path and what happened to each journal.  ``NotFound`` if there is no
    store there (nothing is created); the store is opened only if a journal exists."""
    config = Settings.load(**settings)
    kind, target = parse_target(url_or_path)
    if isinstance(target, str):
        path = local_base(target, config)
    else:
        path = target / CATALOG if kind == "sharded" else target
        if not path.is_file():
            raise errors.NotFound(f"no store at {target}")
    if not isinstance(target, str):
        check_store_file(path)
    spool_dir = Path(str(path) + ".spool")
    if not journals(spool_dir) and kind != "sharded":
        remove_stale_new_files(spool_dir)
        return path, []
    store = _open_store(target, config, kind)
    try:
        store.backend.recover()
        return path, store.recover()
    finally:
        store.close(timeout=0)


__all__ = ["DEFAULT_FILENAME", "Store", "open", "recover_journals", "resolve_target"]
