"""The sharded layout (``sqlite+sharded:///DIR``): which file each write and read goes to.

A session tree (a root session, its subagents and its forks) lives in one shard
file; the catalog (``DIR/catalog.db``) holds an index row per session (what
``sessions.list`` reads), the map ``shard_sessions`` from session to shard, the
effect outbox, and the data of the integrations whose rows span sessions
(LangGraph checkpoints, ADK sessions with their app and user state).

Most writes touch one file: a message, a part, a state value go to their
session's shard, an effect or a checkpoint to the catalog.  A write that changes
a shard and then the catalog (a session created, renamed, archived, forked or
deleted; a message whose transaction enqueues effects) follows this protocol:

1. catalog: record the operation in ``shard_intents`` (owner: this process);
2. shard: apply the operation (idempotent by its op_id, as every operation);
   if it fails for good (bad input, no such session...), delete the intent and
   raise: nothing was written;
3. catalog, in one transaction: copy the shard's session rows into the index,
   enqueue the effects, delete the intent.  The intent row is read again first:
   gone means another process finished it.

A crash after 1 or after 2 leaves the intent; the next ``open`` (any process)
finishes the intents of dead owners by running 2 and 3 again: 2 finds its op_id
and returns the first result, 3 is guarded by the intent row.  So the catalog
never lists a session its shard lacks for longer than a crash's recovery, and
effects are enqueued exactly once, iff their message was written.
tests/store/test_sharded.py::test_kill_between_catalog_and_shard_*

Messages touch their session's ``updated_at`` in the shard only; the catalog's
copy is refreshed by this process within ``_SYNC_INTERVAL`` (and before its own
``sessions.list``), so a listing's ``updated_at`` may lag other processes' last
writes by about a second; ``sessions.get`` reads the shard.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from fleetstore import errors
from fleetstore.core import liveness
from fleetstore.core.crash import crash_point
from fleetstore.core.keys import keyring_of
from fleetstore.core.logs import logger
from fleetstore.core.settings import Settings
from fleetstore.core.targets import CATALOG, sharded_url
from fleetstore.domain import registry
from fleetstore.domain.blobs import BlobStore, DbBlobStore
from fleetstore.domain.operations import Operation, Scope, earlier_result
from fleetstore.domain.outbox_ops import check_effect_list, insert_effect
from fleetstore.engine.base import Engine, Tx
from fleetstore.engine.sqlite import Database
from fleetstore.store.backend import (
    OPS_TAG,
    OpItem,
    blobs_durable,
    migrations,
    op_applier,
    wal_file_bytes,
)
from fleetstore.store.sharded.shards import ShardSet, is_key, shard_files, shard_key
from fleetstore.store.spool import decode_line, encode_line, is_rejectable

T = TypeVar("T")
log = logger("fleetstore")

#: Seconds between refreshes of the catalog's copy of sessions this process wrote.
_SYNC_INTERVAL = 1.0
_HOMES_CACHED = 4096


class Router:
    """The sharded layout's backend (store/backend.py): routes each operation and read
    to its file, and keeps the catalog's index of the shards."""

    layout = "sharded"
    spans_files = True

    def __init__(self, shards: ShardSet, queries: Mapping[str, str], settings: Settings) -> None:
        self.shards = shards
        self.catalog = shards.catalog
        self.db: Engine = shards.catalog
        self.path = Path(shards.catalog.path)
        self.url = sharded_url(shards.root)
        # One blob directory for every file: a fork shares its tree's blobs, and a
        # blob's file outlives any one shard (maintain collects it store-wide).
        self.blobs: BlobStore | DbBlobStore = BlobStore(
            str(self.path) + ".blobs",
            settings.max_payload_bytes,
            durable=blobs_durable(settings),
            wait_for_space=settings.write_budget,
            keyring=keyring_of(settings.encryption_key_file),
        )
        self.q = queries
        self._homes: collections.OrderedDict[str, str | None] = collections.OrderedDict()
        self._init_process()

    def _init_process(self) -> None:
        """The state of this process (a forked child starts its own: threads, locks
        and writes under way do not survive a fork)."""
        self.owner = liveness.token()
        self._lock = threading.Lock()
        self._dirty: set[str] = set()
        #: Shards whose refresh is under way (taken from _dirty, not yet committed).
        self._syncing = 0
        #: op ids of this process's catalog+shard writes under way, and whether one of
        #: them stopped after its intent was recorded.
        self._active: set[str] = set()
        self._stalled = False
        self._sync_cond = threading.Condition()
        self._sync_thread: threading.Thread | None = None
        self._running = False
        self._urgent = False
        self._generation = 0
        self._stopped = False
        #: Shards this process wrote to since its search indexer last looked.
        self._search_keys: set[str] = set()

    def after_fork(self) -> None:
        self.shards.after_fork()
        self._init_process()

    # -- where a session lives -------------------------------------------------------------

    def home(self, session_id: str | None, *, fresh: bool = False) -> str | None:
        """The shard key of *session_id*'s tree, or None: the catalog holds it (or
        nobody does: the catalog then answers NotFound as a single file would)."""
        if session_id is None:
            return None
        if not fresh:
            with self._lock:
                if session_id in self._homes:
                    return self._homes[session_id]
        rows = self.catalog.read(lambda tx: tx.execute(self.q["shard_of"], (session_id,)))
        if not rows:
            # Never cached: the session may be made in a shard by another process
            # next, and a write routed to the catalog would then find the catalog's
            # index row of it and land in the wrong file.
            with self._lock:
                self._homes.pop(session_id, None)
            return None
        key = str(rows[0][0])
        self._remember(session_id, key)
        return key

    def _remember(self, session_id: str, key: str | None) -> None:
        with self._lock:
            self._homes[session_id] = key
            self._homes.move_to_end(session_id)
            while len(self._homes) > _HOMES_CACHED:
                self._homes.popitem(last=False)

    def _in_catalog(self, session_id: str) -> bool:
        return bool(
            self.catalog.read(lambda tx: tx.execute(self.q["session_exists"], (session_id,)))
        )

    def route(self, op: Operation) -> tuple[str | None, bool]:
        """(shard key or None for the catalog, whether the write is catalog+shard),
        from the operation's declared scope (domain/operations.py, ``Scope``)."""
        spec = registry.spec_of(op.name)
        if spec.scope is Scope.CATALOG:
            return None, False
        args = op.args
        cross = spec.scope is Scope.TREE or bool(args.get("effects"))
        anchor = next((v for a in spec.session_args if isinstance(v := args.get(a), str)), None)
        if anchor is None:
            return None, cross  # names no session: the catalog answers (NotFound)
        key = self.home(anchor)
        if (
            key is None
            and spec.creates is not None
            and args.get(spec.creates) == anchor
            and not self._in_catalog(anchor)
        ):
            return shard_key(anchor), True  # it creates a session of no tree: a new tree
        return key, cross

    # -- writing ---------------------------------------------------------------------------

    def apply(self, op: Operation) -> dict[str, Any]:
        key, cross = self.route(op)
        if key is None:
            return self._apply_in(self.catalog, op)
        try:
            return self._apply_to_shard(key, op, cross)
        except errors.FileMoved:
            # The tree was archived (its file moved away) since this process opened it.
            self.shards.drop(key)
            sid = op.args.get("source_id") if op.name == "fork_session" else op.session_id
            if (
                isinstance(sid, str)
                and self.home(sid, fresh=True) is None
                and not self._in_catalog(sid)
            ):
                raise errors.NotFound(
                    f"session {sid!r}: its tree's file was moved out of the store (archived?)"
                ) from None
            return self.apply(op)
        except errors.NotFound:
            sid = op.args.get("source_id") if op.name == "fork_session" else op.session_id
            if not isinstance(sid, str):
                raise
            if self.home(sid, fresh=True) != key:
                # A session deleted and made again in another tree since this process
                # looked it up: look again, once.
                return self.apply(op)
            if self._recover_quietly():
                # A process that died half-way through making it left an intent that
                # no open has finished yet: finish it, then try once more.
                return self._apply_to_shard(key, op, cross)
            raise

    def _apply_in(self, db: Database, op: Operation) -> dict[str, Any]:
        # Group commit: committed with what other processes write to that file now.
        return cast(dict[str, Any], db.submit(OpItem(op, self.q)))

    def _apply_to_shard(self, key: str, op: Operation, cross: bool) -> dict[str, Any]:
        with self._lock:
            self._search_keys.add(key)
        if not cross:
            with self.shards.use(key, create=False) as db:
                result = self._apply_in(db, op)
            self._mark_dirty(key)
            return result
        if not op.trusted:
            op = registry.checked(op)  # (an intent's record is replayed by other processes)
        try:
            text = encode_line(op).decode("utf-8")
        except UnicodeEncodeError as exc:
            raise errors.InvalidInput(f"{op.name}: text that is not valid Unicode: {exc}") from None
        created = _created_id(op)

        def begin(tx: Tx) -> tuple[bool, str | None]:
            """(whether the intent is new, the session id this call reserved)."""
            reserved = None
            if created is not None:
                # Session ids are unique across the store: reserve this one for the
                # shard now (a clash with a session of another tree is refused here;
                # the reservation goes with the intent if the write does not apply).
                home = tx.execute(self.q["shard_of"], (created,))
                if (home and str(home[0][0]) != key) or (
                    not home and tx.execute(self.q["session_exists"], (created,))
                ):
                    raise errors.AlreadyExists(f"a session {created!r} exists")
                if not home:
                    reserved = created
                tx.execute(self.q["shard_index_put"], (created, key))
            new = not tx.execute(self.q["shard_intent_get"], (op.op_id,))
            tx.execute(self.q["shard_intent_add"], (op.op_id, key, text, self.owner, time.time()))
            return new, reserved

        with self._lock:
            self._active.add(op.op_id)
        begun = False
        try:
            new, reserved = self.catalog.run_write(begin)
            begun = True
            crash_point("after-intent")
            existed = self.shards.exists(key)
            try:
                result, applied = self._shard_part(key, op)
            except Exception as exc:
                # A new intent is this call's alone: nothing else can have applied it,
                # and a shard part that raised wrote nothing (but for a COMMIT that
                # cannot tell), so the write is abandoned whatever the error (a file
                # that cannot be opened, a full disk, a busy shard: the caller is told
                # it failed, or spools it, and a later retry starts afresh).  An
                # intent found (a retry of a write that stopped half-way) may have
                # been applied by its first try: only an error the operation itself
                # always meets abandons it.
                if is_rejectable(exc) or (new and not isinstance(exc, errors.CommitUncertain)):
                    self._abandon(key, op, existed, reserved)
                    begun = False  # nothing of it is left to finish
                raise
            crash_point("after-shard")
            self._catalog_part(key, op, applied)
        except BaseException:
            if begun:
                # Its intent may remain (the shard or the catalog was busy past the
                # budget): this process finishes it in the background, as another
                # would after a crash; the caller's retry or spool replay is a duplicate.
                with self._lock:
                    self._stalled = True
                self._mark_dirty(key)
            raise
        finally:
            with self._lock:
                self._active.discard(op.op_id)
        return result

    def _shard_part(self, key: str, op: Operation) -> tuple[dict[str, Any], dict[str, Any]]:
        """Apply *op* to its shard: (what the caller gets, what its first run returned)."""
        q = self.q
        args = {k: v for k, v in op.args.items() if k != "effects"}
        shard_op = Operation(op.name, args, op.op_id, op.trusted)
        logged = registry.spec_of(op.name).logged

        def run(tx: Tx) -> tuple[dict[str, Any], dict[str, Any]]:
            found = tx.execute(q["op_applied"], (op.op_id,)) if logged else []
            if found:  # applied before (a recovery, a spool replay)
                first = earlier_result(found[0][1])
                return {**first, "duplicate": True}, first
            result = registry.apply(tx, q, shard_op, tx.now)
            return result, result

        # Only a write that starts a tree makes its file; any other finding no file
        # (a tree archived, a file removed by hand) is NotFound, not a new empty shard.
        created = _created_id(op)
        new_tree = created is not None and shard_key(created) == key
        with self.shards.use(key, create=new_tree) as db:
            outcome: tuple[dict[str, Any], dict[str, Any]] = db.run_write(run)
            return outcome

    def _abandon(self, key: str, op: Operation, existed: bool, reserved: str | None = None) -> None:
        """Forget a catalog+shard write whose shard part raised (nothing was written):
        its intent, the catalog's index rows of sessions the shard lacks (the
        reservation of the session it was to make) and, if this write made the file
        and nothing else is in it, the file: a refused write leaves no trace."""
        q = self.q

        def run(tx: Tx) -> bool:
            try:
                rows = self._shard_sessions(key)
            except errors.FleetstoreError:
                # The shard cannot be read (the file that could not be opened: not
                # ours, damaged): only the session this write reserved goes.
                if reserved is None:
                    raise
                tx.execute(q["shard_index_drop"], (reserved,))
            else:
                self._sync_index(tx, key, rows)  # drops a reservation the shard lacks
            tx.execute(q["shard_intent_done"], (op.op_id,))
            return not tx.execute(q["shard_index_ids"], (key,))

        if self.catalog.run_write(run) and not existed:
            self.shards.discard(key)

    def _catalog_part(self, key: str, op: Operation, applied: dict[str, Any]) -> None:
        q = self.q
        # A write that found its content already there (the same message again)
        # enqueues nothing, as in one file.
        effects = [] if applied.get("duplicate") else op.args.get("effects") or []
        if effects and not op.trusted:
            effects = check_effect_list(effects)

        def run(tx: Tx) -> None:
            if not tx.execute(q["shard_intent_get"], (op.op_id,)):
                return  # finished by another process (a recovery)
            self._sync_index(tx, key)
            for effect in effects:
                insert_effect(tx, q, effect, tx.now)
            tx.execute(q["shard_intent_done"], (op.op_id,))

        self.catalog.run_write(run)
        with self._lock:
            self._dirty.discard(key)

    def _sync_index(self, tx: Tx, key: str, rows: list[Any] | None = None) -> None:
        """Inside a catalog write: make the catalog's index of shard *key* equal the
        shard's sessions now, *rows* if given (read under the catalog's write lock, so
        the last sync to commit copied the newest rows)."""
        q = self.q
        if rows is None:
            rows = self._shard_sessions(key)
        present = {str(r[0]) for r in rows}
        indexed = {str(r[0]) for r in tx.execute(q["shard_index_ids"], (key,))}
        for sid in sorted(indexed - present):
            tx.execute(q["session_delete"], (sid,))
            tx.execute(q["shard_index_drop"], (sid,))
        for row in _parents_first(rows):
            tx.execute(q["shard_session_upsert"], tuple(row))
            tx.execute(q["shard_index_put"], (row[0], key))
        with self._lock:
            for sid in indexed - present:
                self._homes.pop(sid, None)
        for sid in present:
            self._remember(sid, key)

    def _shard_sessions(self, key: str) -> list[Any]:
        """Shard *key*'s session rows, as the index copies them (none: no file)."""
        if not self.shards.exists(key):
            return []
        with self.shards.use(key, create=False) as db:
            return db.read(lambda rtx: rtx.execute(self.q["shard_session_rows"]))

    # -- the catalog's copy of updated_at ----------------------------------------------

    def _mark_dirty(self, key: str) -> None:
        with self._lock:
            self._dirty.add(key)
        with self._sync_cond:
            self._ensure_thread()

    def _ensure_thread(self) -> None:
        # Under _sync_cond.  _running, not is_alive(): a thread that has decided to exit
        # (under this lock) but not ended yet would leave a new dirty key unseen.
        if self._stopped or self._running:
            return
        self._running = True
        self._sync_thread = threading.Thread(
            target=self._sync_loop, name="fleetstore-catalog-sync", daemon=True
        )
        self._sync_thread.start()

    def request_sync(self, timeout: float) -> bool:
        """Have the background thread refresh the index now and wait up to *timeout*
        seconds for it (a read must not wait out a locked catalog's write budget).
        True if the index holds this process's writes made before the call."""
        with self._lock:
            if not self._dirty and not self._syncing and not self._stalled:
                return True
        deadline = time.monotonic() + timeout
        with self._sync_cond:
            target = self._generation + 1
            self._urgent = True
            self._ensure_thread()
            self._sync_cond.notify_all()
            while self._generation < target and not self._stopped:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._sync_cond.wait(remaining)
        return self._generation >= target

    def _sync_loop(self) -> None:
        while True:
            with self._sync_cond:
                if not self._urgent and not self._stopped:
                    self._sync_cond.wait(_SYNC_INTERVAL)
                self._urgent = False
                if self._stopped:
                    self._running = False
                    return
            synced = False
            try:
                if self._stalled:
                    with self._lock:
                        self._stalled = False
                    try:
                        self.recover(own=True)
                    except BaseException:
                        with self._lock:
                            self._stalled = True
                        raise
                self.sync_dirty()
                synced = True
            except Exception as exc:  # the store is busy or closing: try again later
                log.warning("%s: refreshing the catalog's index failed: %s", self.shards.root, exc)
            with self._sync_cond:
                if synced:
                    self._generation += 1
                    self._sync_cond.notify_all()
                with self._lock:
                    idle = not self._dirty and not self._stalled
                if synced and idle and not self._urgent:
                    # Nothing written for a while: the next write starts another.
                    self._running = False
                    return

    def reindex(self, keys: list[str] | None = None) -> int:
        """Make the catalog's index of each shard in *keys* (default: every shard file
        on disk) equal to the shard's sessions: for a shard file put back by hand or
        restored from an archive.  Returns the number of shards indexed."""
        todo = self.shards.keys() if keys is None else list(keys)
        for i in range(0, len(todo), 64):  # short catalog transactions
            part = todo[i : i + 64]

            def run(tx: Tx, part: list[str] = part) -> None:
                for key in part:
                    self._sync_index(tx, key)

            self.catalog.run_write(run)
        return len(todo)

    def resync(self, keys: Iterable[str]) -> int:
        """Copy the session rows of shards *keys*, and of those this process wrote,
        into the catalog's index now (up to the write budget): after rows were
        rewritten in place (``fleetstore redact``).  The number of shards refreshed."""
        with self._lock:
            self._dirty.update(keys)
        return self.sync_dirty()

    def sync_dirty(self) -> int:
        """Copy the session rows of the shards this process wrote into the catalog's
        index; the number of shards refreshed."""
        with self._lock:
            keys, self._dirty = sorted(self._dirty), set()
            self._syncing += len(keys)
        if not keys:
            return 0

        def run(tx: Tx) -> None:
            for k in keys:
                self._sync_index(tx, k)

        try:
            self.catalog.run_write(run)
        except BaseException:
            with self._lock:
                self._dirty.update(keys)
            raise
        finally:
            with self._lock:
                self._syncing -= len(keys)
        return len(keys)

    # -- reading ---------------------------------------------------------------------------

    def sync_catalog(self, timeout: float | None) -> bool:
        """Bring the catalog's sessions index up to date with what this process wrote.
        *timeout* None: now, in this thread (up to the write budget); else wait at most
        *timeout* seconds for the background refresh (a listing does not wait for a
        locked catalog).  True if the index holds this process's writes."""
        if timeout is None:
            self.sync_dirty()
            return True
        return self.request_sync(timeout)

    def metrics(self) -> dict[str, Any]:
        return self.shards.metrics()

    def wal_bytes(self) -> int:
        root = self.shards.root
        files = [root / CATALOG, *(path for _key, path in shard_files(root))]
        return sum(wal_file_bytes(path) for path in files)

    def read(self, fn: Callable[[Tx], T], session_id: str | None) -> T:
        key = self.home(session_id)
        if key is None:
            return self.catalog.read(fn)
        try:
            return self._read_shard(key, fn)
        except errors.NotFound:
            assert session_id is not None
            fresh = self.home(session_id, fresh=True)
            if fresh == key:
                if self._recover_quietly():  # a dead process's half-made session (see apply)
                    return self._read_shard(key, fn)
                raise
            return self.catalog.read(fn) if fresh is None else self._read_shard(fresh, fn)

    def _read_shard(self, key: str, fn: Callable[[Tx], T]) -> T:
        try:
            with self.shards.use(key, create=False) as db:
                return db.read(fn)
        except errors.FileMoved:
            self.shards.drop(key)
            with self.shards.use(key, create=False) as db:
                return db.read(fn)
        except errors.NotFound as exc:
            where = self.shards.path_of(key) if is_key(key) else "not a shard key"
            raise errors.NotFound(
                f"{self.shards.root}: the shard {key!r} of this session is missing "
                f"({where}); was it archived?"
            ) from exc

    def read_first(self, fn: Callable[[Tx], list[T]]) -> list[T]:
        """*fn* on the catalog, then on each shard, until one returns rows (a lookup
        by an id that does not name its session, such as ``messages.get``)."""
        found = self.catalog.read(fn)
        if found:
            return found
        for key in self.shards:
            with self.shards.use(key, create=False) as db:
                found = db.read(fn)
            if found:
                return found
        return found

    def search_files(
        self, *, session_id: str | None, root_id: str | None, project: str | None
    ) -> list[str | None]:
        """The catalog (ADK sessions, sessions made there) and the shards a search with
        these filters may find something in: one tree's, a project's, or every one."""
        anchor = session_id if session_id is not None else root_id
        if anchor is not None:
            return [self.home(anchor)]
        if project is not None:
            rows = self.catalog.read(
                lambda tx: tx.execute(self.q["shard_keys_of_project"], (project,))
            )
            return [None, *sorted(str(r[0]) for r in rows)]
        return [None, *self.shards.keys()]

    def with_file(self, key: str | None, fn: Callable[[Engine], T]) -> T:
        if key is None:
            return fn(self.catalog)
        with self.shards.use(key, create=False) as db:
            return fn(db)

    def take_search_keys(self) -> list[str]:
        """The shards this process wrote to since the last call (its indexer looks at
        them)."""
        with self._lock:
            keys, self._search_keys = sorted(self._search_keys), set()
        return keys

    def file_keys(self) -> list[str | None]:
        return [None, *self.shards.keys()]

    @contextlib.contextmanager
    def use(self, key: str | None, *, create: bool = False) -> Iterator[Engine]:
        if key is None:
            yield self.catalog
            return
        with self.shards.use(key, create=create) as db:
            yield db

    def each(self, fn: Callable[[str | None, Any], None]) -> None:
        """``fn(key, database)`` for the catalog (key None), then every shard on disk."""
        fn(None, self.catalog)
        for key in self.shards:
            with self.shards.use(key, create=False) as db:
                fn(key, db)

    # -- crashes ---------------------------------------------------------------------------

    def _recover_quietly(self) -> int:
        try:
            return self.recover()
        except errors.FleetstoreError as exc:
            log.warning("%s: finishing intents of dead processes failed: %s", self.shards.root, exc)
            return 0

    def recover(self, *, all_owners: bool = False, own: bool = False) -> int:
        """Finish the catalog+shard writes whose process died (every one, with
        *all_owners*; with *own*, also this process's that stopped half-way); the
        number finished or abandoned."""
        rows = self.catalog.read(lambda tx: tx.execute(self.q["shard_intents"]))
        with self._lock:
            active = set(self._active)
        done = 0
        for op_id, key, text, owner in rows:
            if owner == self.owner:
                if not (own or all_owners) or op_id in active:
                    continue
            elif not all_owners and liveness.token_alive(owner):
                continue
            op = decode_line(str(text).encode("utf-8"))
            existed = self.shards.exists(str(key))
            try:
                _, applied = self._shard_part(str(key), op)
            except Exception as exc:
                if not is_rejectable(exc):
                    raise
                # It can never apply: nothing was written, and nothing will be.
                self._abandon(str(key), op, existed)
                log.error(
                    "%s: %s (op %s) of a process that died could not be applied and was "
                    "dropped: %s",
                    self.shards.root,
                    op.name,
                    op_id,
                    exc,
                )
                done += 1
                continue
            self._catalog_part(str(key), op, applied)
            done += 1
        return done

    def close(self, *, sync: bool = True) -> None:
        """Stop the background refresh, bring the index up to date (if *sync*: the
        store is not known to be locked) and close every file."""
        with self._sync_cond:
            self._stopped = True
            self._sync_cond.notify_all()
            thread = self._sync_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)
        try:
            if sync:
                if self._stalled:
                    self.recover(own=True)
                self.sync_dirty()
        except errors.FleetstoreError as exc:
            log.warning(
                "%s: the catalog's index was not refreshed at close: %s", self.shards.root, exc
            )
        self.shards.close()


def _created_id(op: Operation) -> str | None:
    """The id of the session *op* may create (None: it creates none)."""
    spec = registry.spec_of(op.name)
    value = op.args.get(spec.creates) if spec.creates is not None else None
    return value if isinstance(value, str) else None


def _parents_first(rows: list[Any]) -> list[Any]:
    """Session rows ordered so that each parent comes before its children (the
    catalog's sessions rows have a foreign key to their parent)."""
    by_id = {str(r[0]): r for r in rows}
    out: list[Any] = []
    seen: set[str] = set()

    def visit(sid: str, depth: int) -> None:
        if sid in seen or depth > len(by_id):
            return
        row = by_id[sid]
        parent = row[1]
        if parent is not None and str(parent) in by_id:
            visit(str(parent), depth + 1)
        seen.add(sid)
        out.append(row)

    for sid in by_id:
        visit(sid, 0)
    return out


def open_sharded(directory: Path, settings: Settings, queries: Mapping[str, str]) -> Router:
    """Open (creating if needed) the sharded store in *directory*: its catalog now,
    each shard file on first use."""
    blobs = BlobStore(
        str(directory / CATALOG) + ".blobs",
        settings.max_payload_bytes,
        durable=blobs_durable(settings),
        wait_for_space=settings.write_budget,
    )
    shards = ShardSet(
        directory,
        migrations(),
        dataclasses.asdict(settings),
        settings.max_open_shards,
        serve=(OPS_TAG, op_applier(queries)),
        before_checkpoint=None if blobs.durable else blobs.sync,
    )
    try:
        return Router(shards, queries, settings)
    except BaseException:
        shards.close()
        raise
