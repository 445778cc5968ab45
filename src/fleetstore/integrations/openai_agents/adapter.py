"""OpenAI Agents SDK sessions in a fleetstore store: ``FleetstoreSession``.

Before::

    from agents import Agent, Runner, SQLiteSession
    session = SQLiteSession("user-42", "conversations.db")
    result = await Runner.run(agent, "hello", session=session)

After::

    from fleetstore.integrations.openai_agents import FleetstoreSession
    session = FleetstoreSession("user-42", "conversations.db")   # or a Store / AsyncStore
    result = await Runner.run(agent, "hello", session=session)

It implements the SDK's ``Session`` protocol (``get_items``, ``add_items``,
``pop_item``, ``clear_session``, ``session_settings``) over fleetstore history
(see ``fleetstore.domain.openai_agents`` for what is stored how), so a whole fleet of
processes may share one store: writes go through fleetstore's write path (the
writer gate, the write budget, the spool) and none fails with "database is
locked".  ``list_sessions`` / ``alist_sessions`` page through the stored sessions.

Semantics:

* ``add_items`` is one transaction: all of the batch or none of it.
* Cancelling a call (the awaiting task) never cuts a write in half: a call
  already handed to a thread runs to its end, whole or not at all, and the
  session's later calls run after it, so they see it and land after it.
* Past the write budget (default 60 s) an ``add_items`` or ``clear_session`` is
  spooled and returns normally; it lands later, in order, and ``get_items`` in
  this process returns it at once, so a Runner carries on turn after turn while
  another program holds the lock.  Other processes see it when it lands.
* ``pop_item`` is a conditional write (it removes the item it returns), never
  spooled: it first waits up to *read_wait* for this process's spool to drain,
  then raises ``fleetstore.errors.SpoolPending``; past the budget ``StoreBusy``.
* The SDK's compaction (``OpenAIResponsesCompactionSession``) finds the hooks its
  own SQLite and Redis sessions have: ``_get_compaction_snapshot`` (a suffix
  replaced only if the session still ends with it), ``_atomic_replace_items`` and
  ``_read_compaction_items``.  Each replacement is one operation in one
  transaction, and refused if the session changed since the compaction read it:
  an item another process appended meanwhile is never lost.
* Errors are fleetstore's and the SDK's: ``SessionClosed`` is a ``RuntimeError``,
  ``InvalidItem`` and ``InvalidSessionSettings`` are ``TypeError``s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import dataclasses
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Final, TypeVar, cast

from fleetstore import errors
from fleetstore.core.extras import requires
from fleetstore.core.logs import logger
from fleetstore.domain import openai_agents as agents_ops
from fleetstore.domain.openai_agents import AgentSession, SessionPage
from fleetstore.integrations import adopt_store
from fleetstore.store.aio import AsyncStore, _bridge
from fleetstore.store.facade import Store

with requires("openai-agents", "fleetstore's OpenAI Agents SDK support"):
    from agents.items import TResponseInputItem
    from agents.memory.session import _CompactionSnapshot
    from agents.memory.session_settings import SessionSettings

T = TypeVar("T")
log = logger("fleetstore.agents")

#: Threads per store for the sessions' calls (see ``fleetstore.store.aio``).
DEFAULT_THREADS = 4

_executors_lock = threading.Lock()
_executors: weakref.WeakKeyDictionary[Store, ThreadPoolExecutor] = weakref.WeakKeyDictionary()


def _after_fork_in_child() -> None:
    # A pool's threads do not survive a fork; the child makes its own.
    global _executors_lock
    _executors_lock = threading.Lock()
    _executors.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _shared_executor(store: Store) -> ThreadPoolExecutor:
    """One pool per Store for every session of that store in this process."""
    with _executors_lock:
        pool = _executors.get(store)
        if pool is None:
            pool = ThreadPoolExecutor(DEFAULT_THREADS, thread_name_prefix="fleetstore-agents")
            _executors[store] = pool
        return pool


def _after(jobs: Sequence[concurrent.futures.Future[Any]], fn: Callable[[], T]) -> Callable[[], T]:
    def job() -> T:
        # The jobs waited for were queued earlier on a FIFO pool, so they have
        # started already: waiting here cannot deadlock the bounded pool.
        if jobs:
            concurrent.futures.wait(jobs)
        return fn()

    return job


class SessionClosed(errors.StoreClosed, RuntimeError):
    """The session was closed (the SDK's sessions raise ``RuntimeError``)."""


class InvalidItem(errors.InvalidInput, TypeError):
    """An item the store cannot hold: not a dict, or not JSON (the SDK's sessions
    raise ``TypeError``); nothing was written."""


class InvalidSessionSettings(errors.ConfigError, TypeError):
    """``session_settings`` the SDK would refuse (it raises ``TypeError``)."""


class CompactionConflict(errors.VersionConflict):
    """The session changed (another process appended, popped or cleared) since the
    SDK's compaction read it: nothing was replaced, nothing lost.  Compact again."""


class _Unread:
    """No ``_read_compaction_items`` since the last replacement."""


_UNREAD: Final = _Unread()


async def _never_replace(start: int, output: list[TResponseInputItem]) -> bool:
    return False


class FleetstoreSession:
    """An Agents SDK session (the ``Session`` protocol) kept in a fleetstore store.

    *store*: an open ``Store`` or ``AsyncStore`` (shared by many sessions; the
    caller closes it), or a path or URL as for ``fleetstore.open`` (None:
    ``$FLEETSTORE_URL`` or the default), which the session opens with
    *settings* and closes in ``close()``.  *session_settings*: the SDK's
    ``SessionSettings`` (its ``limit`` is the default of ``get_items``).
    *read_wait*: seconds ``pop_item`` waits for this process's spooled writes
    (None: the write budget).
    """

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        store: Store | AsyncStore | str | os.PathLike[str] | None = None,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        read_wait: float | None = None,
        **settings: Any,
    ) -> None:
        self.session_id = agents_ops.check_session_id(session_id)
        self.fleetstore_id = agents_ops.session_key(session_id)
        if session_settings is None:
            self.session_settings = SessionSettings()
        elif isinstance(session_settings, SessionSettings):
            self.session_settings = session_settings
        elif isinstance(session_settings, dict):
            known = {f.name for f in dataclasses.fields(SessionSettings) if f.init}
            unknown = sorted(map(str, set(session_settings) - known))
            if unknown:  # the SDK's own wording (agents._config_coercion)
                raise InvalidSessionSettings(f"Unknown session settings: {', '.join(unknown)}")
            try:
                self.session_settings = SessionSettings(**session_settings)
            except (TypeError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
                raise InvalidSessionSettings(f"session_settings: {exc}") from None
        else:
            raise InvalidSessionSettings(
                f"session_settings must be a SessionSettings or a dict, not {session_settings!r}"
            )
        if read_wait is not None and (
            not isinstance(read_wait, int | float) or isinstance(read_wait, bool) or read_wait < 0
        ):
            raise errors.ConfigError(f"read_wait must be seconds >= 0 or None, not {read_wait!r}")
        self.read_wait = read_wait
        self._astore: AsyncStore | None = None
        self._own_executor: ThreadPoolExecutor | None = None
        self.store, self._owns_store = adopt_store(store, settings, "session")
        if isinstance(store, AsyncStore):
            self._astore = store
        elif self._owns_store:
            self._own_executor = ThreadPoolExecutor(1, thread_name_prefix="fleetstore-agents")
        self._lock = threading.Lock()
        self._last: concurrent.futures.Future[Any] | None = None
        self._closed = False
        # The stored message ids the last _read_compaction_items saw (None: this
        # process's spool held writes of the session): what _atomic_replace_items
        # may replace.  Set and read in the session's calls, which run one by one.
        self._compaction_basis: tuple[str, ...] | _Unread | None = _UNREAD

    # -- running calls in threads, one after the other -------------------------------------

    def _call(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Run *fn* in a worker thread after this session's earlier calls; the
        returned future's cancellation leaves the call running to its end."""
        with self._lock:
            if self._closed:
                raise SessionClosed(f"FleetstoreSession {self.session_id!r} is closed")
            after = [self._last] if self._last is not None and not self._last.done() else []
            job: concurrent.futures.Future[T]
            if self._astore is not None:
                job = self._astore._submit(fn, after)
            else:
                pool = self._own_executor or _shared_executor(self.store)
                job = pool.submit(_after(after, fn))
            self._last = job
        return _bridge(job)

    # -- the Session protocol --------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The history, oldest first; with *limit* (default ``session_settings.limit``)
        the latest *limit* items.  Includes this process's spooled writes."""
        settings = self.session_settings
        resolved = limit if limit is not None or settings is None else settings.limit
        items = await self._call(
            lambda: agents_ops.get_items(self.store, self.session_id, resolved)
        )
        return cast(list[TResponseInputItem], items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append *items* in one transaction (all or none); spooled past the budget."""
        batch = list(items) if isinstance(items, list | tuple) else items

        def add() -> None:
            try:
                agents_ops.add_items(self.store, self.session_id, batch)
            except errors.InvalidInput as exc:
                raise InvalidItem(str(exc)) from exc

        await self._call(add)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the most recent item (None if there is none)."""
        item = await self._call(
            lambda: agents_ops.pop_item(self.store, self.session_id, read_wait=self.read_wait)
        )
        return cast(TResponseInputItem | None, item)

    async def clear_session(self) -> None:
        """Remove every item of this session."""
        await self._call(lambda: agents_ops.clear_items(self.store, self.session_id))

    # -- the hooks the SDK's compaction and encryption look for ---------------------------

    async def _pop_item_with_validation(
        self, validate: Callable[[TResponseInputItem], None] | None = None
    ) -> TResponseInputItem | None:
        """``pop_item``, but *validate(item)* runs first and, if it raises, nothing is
        removed (``EncryptedSession`` authenticates there: see
        ``fleetstore.integrations.openai_agents.encrypted``)."""
        check = cast(Callable[[dict[str, Any]], None] | None, validate)
        item = await self._call(
            lambda: agents_ops.pop_item(
                self.store, self.session_id, read_wait=self.read_wait, validate=check
            )
        )
        return cast(TResponseInputItem | None, item)

    async def _read_compaction_items(
        self, limit: int | None
    ) -> tuple[list[TResponseInputItem], bool]:
        """The compaction's read: ``get_items(limit)``, always from the store (the
        SDK caches nothing of a session that has this hook, and other processes
        write it), and whether that is the whole history.  Remembers the stored
        messages it saw: ``_atomic_replace_items`` replaces only those."""
        settings = self.session_settings
        resolved = limit if limit is not None or settings is None else settings.limit

        def read() -> list[dict[str, Any]]:
            items, self._compaction_basis = agents_ops.compaction_read(
                self.store, self.session_id, resolved
            )
            return items

        items = await self._call(read)
        complete = limit is not None and limit > 0 and len(items) < limit
        return cast(list[TResponseInputItem], items), complete

    async def _note_compaction_basis(self) -> None:
        """Remember the stored messages as they are now, as ``_read_compaction_items``
        does (for a wrapper that reads the items itself)."""

        def note() -> None:
            self._compaction_basis = agents_ops.compaction_read(self.store, self.session_id, 0)[1]

        await self._call(note)

    async def _atomic_replace_items(self, items: list[TResponseInputItem]) -> bool:
        """Replace the history the compaction read (``_read_compaction_items``; if
        it read none, the history as stored now) with *items*, in one operation,
        one transaction.  ``CompactionConflict`` if the session changed since that
        read (an item appended by another process is never lost), nothing replaced."""
        batch = list(items)

        def replace() -> bool:
            basis, self._compaction_basis = self._compaction_basis, _UNREAD
            if isinstance(basis, _Unread):
                basis = agents_ops.compaction_read(self.store, self.session_id, 0)[1]
            if basis is None:
                raise CompactionConflict(
                    f"session {self.session_id!r}: this process's spool holds writes of it "
                    "that the compaction read but that are not stored yet; nothing replaced"
                )
            try:
                agents_ops.replace_items(
                    self.store, self.session_id, batch, expect=basis, whole=True
                )
            except errors.InvalidInput as exc:
                raise InvalidItem(str(exc)) from exc
            except errors.VersionConflict as exc:
                raise CompactionConflict(str(exc)) from exc
            return True

        return await self._call(replace)

    async def _get_compaction_snapshot(
        self,
        limit: int,
        *,
        prune_prefix: Callable[[TResponseInputItem], bool] | None = None,
    ) -> _CompactionSnapshot | None:
        """The last *limit* items with a ``replace_suffix`` that replaces items
        ``start:`` of them only if the session still ends with exactly those (else
        False: the SDK keeps the history), and first removes the oldest items
        *prune_prefix* accepts (``EncryptedSession``'s expired ones), all in one
        transaction.  Past the write budget it returns False too: compaction waits
        for a later turn.  None if a stored item does not parse (as ``SQLiteSession``)."""
        snap = await self._call(lambda: agents_ops.snapshot(self.store, self.session_id, limit))
        if snap.pending:
            # This process's spool holds writes of the session: they are not among
            # the stored items, so no suffix of those can be replaced yet.
            return _CompactionSnapshot([], False, _never_replace)
        if any(s.item is None for s in snap.items):
            return None
        rows = list(snap.items)
        items = cast(list[TResponseInputItem], [copy.deepcopy(s.item) for s in rows])
        prune = cast(Callable[[dict[str, Any]], bool] | None, prune_prefix)

        async def replace_suffix(start: int, output: list[TResponseInputItem]) -> bool:
            expected = rows[start:]
            if not expected:
                return False
            batch = list(output)

            def replace() -> bool:
                pruned = self._expired_prefix(expected[0].seq, prune, max(limit, 100))
                try:
                    agents_ops.replace_items(
                        self.store,
                        self.session_id,
                        batch,
                        expect=[s.id for s in expected],
                        whole=False,
                        prune=pruned,
                    )
                except errors.InvalidInput as exc:
                    raise InvalidItem(str(exc)) from exc
                except errors.VersionConflict:
                    return False  # someone wrote since the snapshot: keep the history
                except errors.StoreBusy as exc:
                    log.warning(
                        "%s: compaction of %r skipped: %s", self.store.path, self.session_id, exc
                    )
                    return False
                return True

            return await self._call(replace)

        return _CompactionSnapshot(items, snap.complete, replace_suffix)

    def _expired_prefix(
        self, before: int, accept: Callable[[dict[str, Any]], bool] | None, page: int
    ) -> list[str]:
        """The ids of the oldest stored items, up to the first *accept* refuses."""
        if accept is None:
            return []
        ids: list[str] = []
        after = 0
        while True:
            found = agents_ops.items_before(self.store, self.session_id, before, after, page)
            for s in found:
                if s.item is None or not accept(copy.deepcopy(s.item)):
                    return ids
                ids.append(s.id)
            if len(found) < page:
                return ids
            after = found[-1].seq

    # -- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for this session's calls in flight (cancelled ones too), then close
        the store if the session opened it.  Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            last = self._last
        if last is not None:
            concurrent.futures.wait([last])
        if self._owns_store:
            if self._own_executor is not None:
                self._own_executor.shutdown(wait=True)
            self.store.close()

    async def aclose(self) -> None:
        """``close()`` without blocking the event loop."""
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> FleetstoreSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<FleetstoreSession {self.session_id!r} in {str(self.store.path)!r}>"


def _sync(store: Store | AsyncStore) -> Store:
    if isinstance(store, AsyncStore):
        return store.sync
    if isinstance(store, Store):
        return store
    raise errors.InvalidInput(f"store must be a Store or AsyncStore, not {type(store).__name__}")


def list_sessions(
    store: Store | AsyncStore, *, limit: int = 100, cursor: str | None = None
) -> SessionPage:
    """The SDK sessions in *store*, newest first: a page of at most *limit*, and the
    cursor of the next page (None on the last)::

        page = list_sessions(store, limit=50)
        while True:
            for s in page.sessions:
                print(s.session_id, s.items, s.updated_at)
            if page.next_cursor is None:
                break
            page = list_sessions(store, limit=50, cursor=page.next_cursor)
    """
    return agents_ops.list_sessions(_sync(store), limit=limit, cursor=cursor)


async def alist_sessions(
    store: Store | AsyncStore, *, limit: int = 100, cursor: str | None = None
) -> SessionPage:
    """``list_sessions`` in a worker thread."""
    sync = _sync(store)

    def run() -> SessionPage:
        return agents_ops.list_sessions(sync, limit=limit, cursor=cursor)

    if isinstance(store, AsyncStore):
        return await _bridge(store._submit(run))
    return await _bridge(_shared_executor(sync).submit(run))


__all__ = [
    "DEFAULT_THREADS",
    "AgentSession",
    "CompactionConflict",
    "FleetstoreSession",
    "InvalidItem",
    "InvalidSessionSettings",
    "SessionClosed",
    "SessionPage",
    "alist_sessions",
    "list_sessions",
]
