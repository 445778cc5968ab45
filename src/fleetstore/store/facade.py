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
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from fleetstore import errors, sql
from fleetstore.core import telemetry
from fleetstore.core.keys import Keyring, keyring_of
from fleetstore.core.logs import logger
from fleetstore.core.metrics import OutboxMetrics
from fleetstore.core.redact import WriteRedaction, write_redaction
from fleetstore.core.settings import Settings
from fleetstore.core.targets import (
    CATALOG,
    DEFAULT_FILENAME,
    local_base,
    parse_target,
    redact,
    refuse_shard,
    resolve_target,
)
from fleetstore.core.validate import (
    check_int,
    check_opt_id,
    check_opt_timeout,
    check_str,
    check_timeout,
)
from fleetstore.domain import registry, session_jobs
from fleetstore.domain.blobs import BlobStore, DbBlobStore, referenced_shas
from fleetstore.domain.history import Messages
from fleetstore.domain.operations import Delivery, Operation
from fleetstore.domain.outbox import Effects
from fleetstore.domain.ports import Flushable
from fleetstore.domain.search import Search
from fleetstore.domain.sessions import Sessions
from fleetstore.domain.state import State
from fleetstore.engine.base import Engine, Tx
from fleetstore.engine.cipher import key_of_file
from fleetstore.files.foreign import read_foreign
from fleetstore.files.inspect import InspectFailed, read_header
from fleetstore.store import observe
from fleetstore.store.backend import Backend
from fleetstore.store.drain import MAX_PAUSE, Drain
from fleetstore.store.indexer import Indexer
from fleetstore.store.procstats import Publisher
from fleetstore.store.server import open_server
from fleetstore.store.sharded.router import Router, open_sharded
from fleetstore.store.sidecars import check_sidecars
from fleetstore.store.single import open_file
from fleetstore.store.spool import (
    REJECTED,
    Recovered,
    Spool,
    journals,
    recover_journal,
    remove_stale_new_files,
)

T = TypeVar("T")
log = logger("fleetstore")
_SPOOLABLE, _MUST_LAND, _INDEPENDENT = Delivery.SPOOLABLE, Delivery.MUST_LAND, Delivery.INDEPENDENT


_live: weakref.WeakSet[Store] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_live):
        store._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)

#: Seconds between looks at forks that other live processes are copying (their
#: process may die, and its fork must then be given up).
_JOBS_POLL = 2.0


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
        #: The keys of a store encrypted at rest (None: not encrypted): its spool
        #: journals, blob files, archives and exports are sealed with the current one.
        self.keyring = keyring_of(settings.encryption_key_file)
        #: What content passes through before it is stored (domain/codec.py; None: off).
        self.redaction: WriteRedaction | None = (
            write_redaction(settings.redaction_rules_file) if settings.redaction else None
        )
        self.spool = Spool(self.spool_dir, self.keyring)
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
        # _cond guards _stop, the jobs thread's fields and the drain's (store/drain.py),
        # and is notified whenever the spool shrinks (flush() waits on it).
        self._cond = threading.Condition()
        self._stop = self._closed
        #: The background thread: the spool drain and timed stream flushes.
        self._drain = Drain(self, self._cond)
        # Bound once: a stream's open costs no forwarding call (tests/store/test_cost.py).
        #: *stream* has buffered something: flush it when it is due (``Drain.opened``).
        self.streams_opened: Callable[[Flushable], None] = self._drain.opened
        self.streams_closed: Callable[[Flushable], None] = self._drain.closed
        #: Set by a close() that found the background thread still inside the engine:
        #: the thread runs it as it leaves, so the engine never closes under it.
        self._last_out: Callable[[], None] | None = None
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
        self, op: Operation, delivery: Delivery = Delivery.SPOOLABLE
    ) -> dict[str, Any] | None:
        """Apply *op*; returns its result, or None if it went to the spool.

        Past the write budget the operation is spooled or ``StoreBusy`` is raised, as
        *delivery* says (``Delivery``: ``SPOOLABLE``, the default, follows
        ``on_busy``).  Once anything is spooled, later operations queue behind it.  If
        the journal cannot be written either, ``StorageFull`` (disk full) or
        ``StorageError``: nothing was written.  An operation the API made
        (``trusted``) is not checked again."""
        if op.__class__ is not Operation or not op.trusted:
            op = check_operation(op)
        if delivery.__class__ is not Delivery:
            raise errors.InvalidInput(
                f"delivery must be a fleetstore.Delivery, not {delivery!r:.80}"
            )
        # An attribute read while no OpenTelemetry SDK is installed: no call
        # (core/telemetry.py; tests/store/test_cost.py's ceilings).
        if telemetry.ACTIVE is not None:
            return observe.traced(self, op, delivery)
        blobs = self.blobs
        if blobs.__class__ is BlobStore and blobs._kept:
            return self._settling(op, delivery)
        return self._submit(op, delivery)

    def _dispatch(self, op: Operation, delivery: Delivery) -> dict[str, Any] | None:
        """``submit`` once *op* is checked (observe.traced's inner call)."""
        blobs = self.blobs
        if blobs.__class__ is BlobStore and blobs._kept:
            return self._settling(op, delivery)
        return self._submit(op, delivery)

    def _settling(self, op: Operation, delivery: Delivery) -> dict[str, Any] | None:
        # The blob files this write stored before it waited: see BlobStore.settle.
        blobs = self.blobs
        assert isinstance(blobs, BlobStore)
        shas = referenced_shas(op.args)
        try:
            result = self._submit(op, delivery)
        except BaseException:
            blobs.settle(shas, written=False)
            raise
        blobs.settle(shas, written=True)
        return result

    def _submit(self, op: Operation, delivery: Delivery) -> dict[str, Any] | None:
        if self._closed:
            raise errors.StoreClosed(f"{self.path}: the store was closed")
        if self._publisher is None:
            self._start_publisher()
        if not self._indexing:
            self._indexing = True
            self._indexer.start()
        with self._counts_lock:
            self._op_counts[op.name] += 1
        if delivery is _INDEPENDENT:
            return self.backend.apply(op)
        may_spool = delivery is _MUST_LAND or (
            delivery is _SPOOLABLE and self.settings.on_busy == "spool"
        )
        if self.spool._pending or self._drain.behind:
            if not may_spool:
                raise errors.SpoolPending(
                    f"{len(self.spool)} earlier write(s) of this process wait in its spool"
                    + (" behind the journals of processes that died" if self._drain.behind else "")
                    + "; "
                    f"a {op.name} that must not be spooled cannot overtake them; "
                    "retry after store.flush()"
                )
            self._spool(op, None)
            return None
        try:
            return self.backend.apply(op)  # checked above
        except errors.StoreBusy as busy:
            if not may_spool:
                raise
            self._spool(op, busy)
            return None
        except errors.CommitUncertain as unknown:
            # Not known within the budget whether it is in the file (its holder stopped
            # while committing): replayed from the spool it is found there, or written.
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
        self._drain.wake()

    @property
    def notifies(self) -> bool:
        """Whether ``notify_wait`` wakes on another process's ring (PostgreSQL's
        LISTEN/NOTIFY, the gate file's futex words on SQLite) rather than sleeping its
        timeout (no futex here)."""
        return self.db.notifies

    @property
    def spans_files(self) -> bool:
        """Whether the catalog's index and the sessions live in different files."""
        return self.backend.spans_files

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
        return self._drain.wait(timeout)

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

    # -- background work: deletes and forks under way (the spool drain: store/drain.py) ----

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
                pause = min(MAX_PAUSE, max(pause * 2, 0.5))
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

    def _left(self) -> None:
        """A background thread has ended: the last one out closes the store's engine if
        close() came while it was inside (see close)."""
        with self._cond:
            if self._drain.running or self._jobs_running or self._indexer.running:
                return
            last_out, self._last_out = self._last_out, None
        if last_out is not None:
            last_out()

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
            result = recover_journal(
                path, self._noting_jobs, self._check_blobs, lambda: self._stop, self.keyring
            )
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
            "open_streams": len(self._drain.streams),
            "outbox": self.outbox_metrics.snapshot(),
            # Secrets replaced by their markers before they were stored, by kind.
            "redacted": dict(self.redaction.counts) if self.redaction is not None else {},
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
            drained = self._drain.wait(timeout)
            if not drained:
                log.error(
                    "%s: closing with %d write(s) still in the spool journal %s%s; "
                    "`fleetstore recover` or the next open applies them",
                    self.path,
                    len(self.spool),
                    self.spool.path,
                    " and journals of processes that died not all replayed"
                    if self._drain.behind
                    else "",
                )
        finally:
            with self._cond:
                self._stop = True  # the replay stops before its next operation
                self._cond.notify_all()
            here = threading.current_thread() in (self._drain.thread, self._jobs)
            self._indexer.stop(self.settings.write_budget + 5)
            for thread in (self._drain.thread, self._jobs):
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
                inside = (
                    self._drain.running or self._jobs_running or self._indexer.running
                ) and not here
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
    if config.redaction:
        # Before anything is made: a rules file that cannot be used is a setting refused
        # (it was NotFound, after the database had been created).
        try:
            write_redaction(config.redaction_rules_file)
        except errors.NotFound as exc:
            raise errors.ConfigError(f"redaction_rules_file: {exc}") from None
    if isinstance(path, Path):
        if kind != "sharded":
            refuse_shard(path)
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
                store._drain.fall_behind()
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


def check_store_file(path: Path, keyring: Keyring | None = None) -> None:
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
            key=key_of_file(str(path), keyring),
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
        check_store_file(path, keyring_of(config.encryption_key_file))
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
