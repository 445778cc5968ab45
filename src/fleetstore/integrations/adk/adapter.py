"""Google ADK sessions in a fleetstore store: ``FleetstoreSessionService``.

Before::

    from google.adk.sessions import DatabaseSessionService
    service = DatabaseSessionService("sqlite+aiosqlite:///sessions.db")
    runner = Runner(agent=agent, app_name="app", session_service=service)

After::

    from fleetstore.integrations.adk import FleetstoreSessionService
    service = FleetstoreSessionService("sessions.db")     # or (store), or () for the default
    runner = Runner(agent=agent, app_name="app", session_service=service)

Every process of a fleet may open the same store: writes go through fleetstore's
write path (the writer gate, the write budget, the spool), so none fails with
"database is locked".  The service implements ADK's ``BaseSessionService``
(create, get, list, delete, ``append_event``, ``get_user_state``, ``flush``) with
ADK's semantics: ``app:`` state shared by the sessions of an app, ``user:`` state
by the sessions of a user in an app, ``temp:`` state never stored; ``get_session``
with ``num_recent_events`` / ``after_timestamp``; ``list_sessions`` oldest update
first, without events, here also by pages (``page_size``, ``page_token``).

``append_event`` writes the event and its state delta in one operation, one
transaction, and raises ``StaleSession`` (an ADK ``StaleSessionError``) if the
session was written by someone else since the session object was read.

Past the write budget (default 60 s) a write is spooled and the call returns as if
it had landed: the session object is updated, the write lands later, in order.
Until it does, reads of this service in this process show it (they overlay the
spooled writes on what is stored), so an agent's next turn does not fail.  A
spooled append's stale check is made when it lands: if another writer wrote the
session meanwhile it is rejected then (logged, kept in the spool folder's
``rejected.jsonl``) instead of raising at the call.  See docs/integrations-adk.md.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import dataclasses
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

from fleetstore import errors
from fleetstore.core.extras import requires
from fleetstore.core.ids import new_id
from fleetstore.core.logs import logger
from fleetstore.core.validate import check_text, dump_json
from fleetstore.domain.adk import adk_fs_id, adk_message_id
from fleetstore.domain.codec import decode_value, encode_payload, redacted_copy
from fleetstore.domain.operations import Operation
from fleetstore.domain.ports import Tx
from fleetstore.integrations import adopt_store, check_threads
from fleetstore.store.aio import AsyncStore, _bridge
from fleetstore.store.facade import Store

with requires("adk", "fleetstore's ADK support"):
    from google.adk.errors import StaleSessionError
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event
    from google.adk.sessions.base_session_service import (
        BaseSessionService,
        GetSessionConfig,
        ListSessionsResponse,
    )
    from google.adk.sessions.session import Session
    from google.adk.sessions.state import State
    from pydantic import ValidationError
    from pydantic_core import to_jsonable_python

T = TypeVar("T")
log = logger("fleetstore.adk")

#: Threads per service: store calls run there, so the event loop never waits on a lock.
DEFAULT_THREADS = 4


#: The message of ADK's DatabaseSessionService, which ADK's own tests match.
STALE_MESSAGE = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)

#: How ``get_session`` orders events (``event_order=``): as fleetstore appended
#: them (ADK's InMemorySessionService), by timestamp with ties in append order
#: (SqliteSessionService), or by timestamp then event id (DatabaseSessionService).
EVENT_ORDERS = ("append", "timestamp", "timestamp_id")
_EVENT_QUERIES = {
    "append": "adk_events",
    "timestamp": "adk_events_by_time",
    "timestamp_id": "adk_events_by_time_id",
}


class StaleSession(errors.VersionConflict, StaleSessionError):
    """The session was written by someone else since this session object was read:
    reload it with ``get_session``.  Nothing was written."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"{STALE_MESSAGE} ({detail})")


class SessionNotFound(errors.NotFound, SessionNotFoundError):
    """No such ADK session."""


class SessionExists(errors.AlreadyExists, AlreadyExistsError):
    """An ADK session with this id exists already; nothing was written."""


class SessionPage(ListSessionsResponse):
    """A page of ``list_sessions``; ``next_page_token`` is None on the last page."""

    next_page_token: str | None = None


# -- what this process spooled, overlaid on reads until it lands -----------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Pending:
    op_id: str
    kind: str  # create, append or delete
    fs_id: str
    app_name: str
    user_id: str
    session_id: str
    time: float
    revision: str
    deltas: Mapping[str, Mapping[str, Any]]  # scope -> key -> value (JSON data)
    event: Event | None = None


@dataclasses.dataclass
class _View:
    """A session as stored, before ADK's ``Session`` is built from it."""

    app_name: str
    user_id: str
    session_id: str
    fs_id: str
    revision: str
    create_time: float
    update_time: float
    state: dict[str, Any]
    events: list[Event]


def _split_state(state: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """``{"session", "app", "user": {key: value}}`` from ADK state keys; ``temp:`` dropped."""
    deltas: dict[str, dict[str, Any]] = {"session": {}, "app": {}, "user": {}}
    for key, value in (state or {}).items():
        if not isinstance(key, str):
            raise errors.InvalidInput(f"ADK state keys are strings, not {key!r}")
        if key.startswith(State.APP_PREFIX):
            deltas["app"][key.removeprefix(State.APP_PREFIX)] = value
        elif key.startswith(State.USER_PREFIX):
            deltas["user"][key.removeprefix(State.USER_PREFIX)] = value
        elif not key.startswith(State.TEMP_PREFIX):
            deltas["session"][key] = value
    return deltas


def _json_data(value: Any, what: str) -> Any:
    """*value* as JSON data (datetimes, pydantic models... converted as ADK does)."""
    try:
        data = to_jsonable_python(value)
    except Exception as exc:
        raise errors.InvalidInput(f"{what} cannot be stored as JSON: {exc}") from None
    dump_json(data, what)  # NaN, lone surrogates...: InvalidInput
    return data


def _merged(view: _View, app_state: Mapping[str, Any], user_state: Mapping[str, Any]) -> Session:
    state = copy.deepcopy(view.state)
    for key, value in app_state.items():
        state[State.APP_PREFIX + key] = copy.deepcopy(value)
    for key, value in user_state.items():
        state[State.USER_PREFIX + key] = copy.deepcopy(value)
    session = Session(
        id=view.session_id,
        app_name=view.app_name,
        user_id=view.user_id,
        state=state,
        events=view.events,
        last_update_time=view.update_time,
    )
    session._storage_update_marker = view.revision
    return session


def _check_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 1024:
        raise errors.InvalidInput(f"{what} must be a non-empty string, not {value!r}")
    return check_text(value, what)


def _encode_token(row: Sequence[Any]) -> str:
    raw = json.dumps([row[0], row[1], row[2]]).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii")


def _decode_token(token: str) -> tuple[float, str, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))
        after_time, after_user, after_session = data
        if not isinstance(after_time, int | float) or not all(
            isinstance(v, str) for v in (after_user, after_session)
        ):
            raise ValueError
        return float(after_time), after_user, after_session
    except (ValueError, TypeError, UnicodeError, binascii.Error):
        raise errors.InvalidInput(f"not a page token of list_sessions: {token[:80]!r}") from None


class FleetstoreSessionService(BaseSessionService):
    """ADK's session service over a fleetstore store.

    *store*: an open ``Store`` or ``AsyncStore`` (the caller closes it), or a path or
    URL as for ``fleetstore.open`` (None: ``$FLEETSTORE_URL`` or the default), which
    the service opens with *settings* and closes in ``close()``.  *event_order*:
    how ``get_session`` orders events, one of ``EVENT_ORDERS`` (default ``append``;
    ``timestamp`` or ``timestamp_id`` to match the service you migrate from)."""

    def __init__(
        self,
        store: Store | AsyncStore | str | os.PathLike[str] | None = None,
        *,
        threads: int = DEFAULT_THREADS,
        event_order: str = "append",
        **settings: Any,
    ) -> None:
        check_threads(threads)
        if event_order not in EVENT_ORDERS:
            raise errors.ConfigError(
                f"event_order must be one of {', '.join(EVENT_ORDERS)}, not {event_order!r}"
            )
        self.event_order = event_order
        self.store, self._owns_store = adopt_store(store, settings, "service")
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="fleetstore-adk")
        self._pending: list[_Pending] = []
        self._pending_lock = threading.Lock()
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._closed = False

    # -- plumbing --------------------------------------------------------------------------

    async def _run(self, fn: Callable[[], T]) -> T:
        if self._closed:
            raise errors.StoreClosed(f"{self.store.path}: the session service was closed")
        # A call handed to a thread runs to its end even if the caller is cancelled
        # (fleetstore.store.aio): a write is then applied, or not, whole.
        return await _bridge(self._executor.submit(fn))

    def _submit(self, op: Operation, pending: _Pending) -> dict[str, Any] | None:
        result = self.store.submit(op)
        if result is None:
            with self._pending_lock:
                self._pending.append(pending)
        return result

    def _encode_state(self, deltas: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        return {
            scope: {
                key: encode_payload(self.store, dump_json(value, f"state {key!r}"), "json")
                for key, value in items.items()
            }
            for scope, items in deltas.items()
            if items
        }

    def _settle(self, tx: Tx) -> list[_Pending]:
        """This process's spooled writes that have not landed yet, in order (inside a
        read transaction: what it does not see applied is overlaid on what it reads)."""
        with self._pending_lock:
            pending = list(self._pending)
        if not pending:
            return []
        spool = self.store.spool
        # Asked before the read: a write still spooled then and not applied in the
        # read's snapshot is pending; one in neither was rejected on replay.
        queued = {p.fs_id: spool.touches(p.fs_id) for p in pending}
        q = self.store.queries
        landed = {p.op_id for p in pending if tx.execute(q["op_applied"], (p.op_id,))}
        rejected = [p for p in pending if p.op_id not in landed and not queued[p.fs_id]]
        for p in rejected:
            log.error(
                "%s: spooled ADK %s of session %r (app %r, user %r) was rejected on replay; see %s",
                self.store.path,
                p.kind,
                p.session_id,
                p.app_name,
                p.user_id,
                self.store.spool_dir / "rejected.jsonl",
            )
        gone = landed | {p.op_id for p in rejected}
        if gone:
            with self._pending_lock:
                self._pending = [p for p in self._pending if p.op_id not in gone]
        return [p for p in pending if p.op_id not in gone]

    def _values(self, rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
        return {r[0]: decode_value(self.store, r[1], r[2], r[3], r[4]) for r in rows}

    def _event(self, enc: str, body: Any, sha: str | None, size: int) -> Event:
        raw = decode_value(self.store, enc, body, sha, size)
        try:
            return Event.model_validate_json(raw)
        except ValidationError as exc:
            raise errors.CorruptStore(f"a stored ADK event does not parse: {exc}") from exc

    def _scoped(
        self, tx: Tx, app_name: str, user_id: str, pending: Sequence[_Pending]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        q = self.store.queries
        app_state = self._values(tx.execute(q["adk_app_state"], (app_name,)))
        user_state = self._values(tx.execute(q["adk_user_state"], (app_name, user_id)))
        for p in pending:
            if p.app_name == app_name:
                app_state.update(p.deltas.get("app", {}))
                if p.user_id == user_id:
                    user_state.update(p.deltas.get("user", {}))
        return app_state, user_state

    def _read_view(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None,
    ) -> Session | None:
        fs_id = adk_fs_id(app_name, user_id, session_id)
        q = self.store.queries
        recent = None if config is None else config.num_recent_events
        after = None if config is None or not config.after_timestamp else config.after_timestamp

        def read(tx: Tx) -> Session | None:
            pending = self._settle(tx)
            mine = [p for p in pending if p.fs_id == fs_id]
            view: _View | None = None
            rows = tx.execute(q["adk_session_by_name"], (app_name, user_id, session_id))
            if rows:
                _fs, revision, created, updated = rows[0]
                events: list[Event] = []
                if recent != 0:
                    limit = -1 if recent is None else recent
                    params = {"fs_id": fs_id, "after": after, "limit": limit}
                    found = tx.execute(q[_EVENT_QUERIES[self.event_order]], params)
                    events = [self._event(*r[1:]) for r in reversed(found)]
                state = self._values(tx.execute(q["adk_session_state"], (fs_id,)))
                view = _View(
                    app_name, user_id, session_id, fs_id, revision, created, updated, state, events
                )
            for p in mine:
                view = _apply(view, p)
            if view is None:
                return None
            if mine:  # pending events were added after the stored ones: filter again
                if self.event_order != "append":
                    view.events.sort(key=_EVENT_KEYS[self.event_order])
                if after is not None:
                    view.events = [e for e in view.events if e.timestamp >= after]
                if recent is not None:
                    view.events = view.events[-recent:] if recent else []
            app_state, user_state = self._scoped(tx, app_name, user_id, pending)
            return _merged(view, app_state, user_state)

        return self.store.read(read)

    # -- the BaseSessionService interface --------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """A new session; ``app:``/``user:`` keys of *state* go to the app's / user's
        state, ``temp:`` keys are dropped.  ``SessionExists`` if *session_id* is taken."""
        _check_name(app_name, "app_name")
        _check_name(user_id, "user_id")
        # A blank id is none: a new one is made, as ADK's in-memory and SQLite
        # services do (DatabaseSessionService keeps it as given).
        given = session_id.strip() if isinstance(session_id, str) else session_id
        sid = given or str(uuid.uuid4())
        _check_name(sid, "session_id")
        if state is not None and not isinstance(state, Mapping):
            raise errors.InvalidInput(f"state must be a dict, not {type(state).__name__}")
        deltas = {
            scope: {k: _json_data(v, f"state {k!r}") for k, v in items.items()}
            for scope, items in _split_state(state).items()
        }

        def create() -> Session:
            if given and self._read_view(app_name, user_id, sid, _NO_EVENTS) is not None:
                raise SessionExists(f"Session with id {sid} already exists.")
            fs_id = adk_fs_id(app_name, user_id, sid)
            op_id = new_id()
            now = time.time()
            args = {
                "session_id": fs_id,
                "app_name": app_name,
                "user_id": user_id,
                "adk_session_id": sid,
                "revision": op_id,
                "created_at": now,
                "state": self._encode_state(deltas),
            }
            pending = _Pending(op_id, "create", fs_id, app_name, user_id, sid, now, op_id, deltas)
            try:
                self._submit(Operation("adk_create_session", args, op_id, True), pending)
            except errors.AlreadyExists as exc:
                raise SessionExists(str(exc)) from exc
            found = self._read_view(app_name, user_id, sid, _NO_EVENTS)
            if found is None:  # deleted by someone else in between
                raise SessionNotFound(f"Session {sid} not found.")
            return found

        return await self._run(create)

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """The session with its events (all, or as *config* says) and merged state;
        None if there is none."""
        sid = session_id.strip() if isinstance(session_id, str) else session_id
        return await self._run(lambda: self._read_view(app_name, user_id, sid, config))

    async def list_sessions(
        self,
        *,
        app_name: str,
        user_id: str | None = None,
        page_size: int | None = None,
        page_token: str | None = None,
    ) -> SessionPage:
        """The app's sessions (of *user_id*, or of every user), least recently updated
        first, with merged state and without events.  With *page_size*, one page of
        them; pass its ``next_page_token`` to get the next.  A session updated while
        you page moves to the end and may be listed again; none is skipped."""
        if page_size is not None and (
            not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1
        ):
            raise errors.InvalidInput(f"page_size must be an integer >= 1, not {page_size!r}")
        after = _decode_token(page_token) if page_token is not None else (None, None, None)
        return await self._run(lambda: self._list(app_name, user_id, page_size, after))

    def _list(
        self,
        app_name: str,
        user_id: str | None,
        page_size: int | None,
        after: tuple[float | None, str | None, str | None],
    ) -> SessionPage:
        q = self.store.queries

        def read(tx: Tx) -> SessionPage:
            pending = [p for p in self._settle(tx) if p.app_name == app_name]
            params = {
                "app_name": app_name,
                "user_id": user_id,
                "after_time": after[0],
                "after_user": after[1],
                "after_session": after[2],
                "limit": -1 if page_size is None else page_size + 1,
            }
            rows = tx.execute(q["adk_session_list"], params)
            more = page_size is not None and len(rows) > page_size
            rows = rows[:page_size] if page_size is not None else rows
            token = _encode_token(rows[-1][6:7] + rows[-1][1:3]) if more else None
            fs_ids = json.dumps([r[3] for r in rows])
            states: dict[str, list[tuple[Any, ...]]] = {}
            for srow in tx.execute(q["adk_states_of_sessions"], (fs_ids,)):
                states.setdefault(srow[0], []).append(srow[1:])
            views: dict[str, _View | None] = {
                r[3]: _View(
                    r[0], r[1], r[2], r[3], r[4], r[5], r[6], self._values(states.get(r[3], [])), []
                )
                for r in rows
            }
            for p in pending:
                if user_id is not None and p.user_id != user_id:
                    continue
                if p.fs_id in views:
                    views[p.fs_id] = _apply(views[p.fs_id], p)
                elif p.kind == "create" and not more:
                    views[p.fs_id] = _apply(None, p)  # spooled: listed on the last page
            app_state = self._values(tx.execute(q["adk_app_state"], (app_name,)))
            user_states: dict[str, dict[str, Any]] = {}
            for urow in tx.execute(q["adk_user_states_of_app"], (app_name,)):
                user_states.setdefault(urow[0], {}).update(self._values([urow[1:]]))
            for p in pending:
                app_state.update(p.deltas.get("app", {}))
                user_states.setdefault(p.user_id, {}).update(p.deltas.get("user", {}))
            listed = sorted(
                (v for v in views.values() if v is not None),
                key=lambda v: (v.update_time, v.user_id, v.session_id),
            )
            sessions = [_merged(v, app_state, user_states.get(v.user_id, {})) for v in listed]
            return SessionPage(sessions=sessions, next_page_token=token)

        return self.store.read(read)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete the session with its events and state (no error if there is none)."""
        sid = session_id.strip() if isinstance(session_id, str) else session_id
        _check_name(app_name, "app_name")
        _check_name(user_id, "user_id")
        _check_name(sid, "session_id")
        fs_id = adk_fs_id(app_name, user_id, sid)

        def delete() -> None:
            op_id = new_id()
            pending = _Pending(op_id, "delete", fs_id, app_name, user_id, sid, time.time(), "", {})
            self._submit(
                Operation("adk_delete_session", {"session_id": fs_id}, op_id, True), pending
            )

        await self._run(delete)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's state in the app, keys without their ``user:`` prefix."""

        def read(tx: Tx) -> dict[str, Any]:
            return self._scoped(tx, app_name, user_id, self._settle(tx))[1]

        return await self._run(lambda: self.store.read(read))

    async def append_event(self, session: Session, event: Event) -> Event:
        """Store *event* and apply its state delta, in one transaction; update
        *session* as ADK does.  ``StaleSession`` if the session was written by
        someone else since *session* was read; ``SessionNotFound`` if it is gone."""
        if event.partial:
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        fs_id = adk_fs_id(session.app_name, session.user_id, session.id)
        delta = event.actions.state_delta if event.actions and event.actions.state_delta else {}
        deltas = {
            scope: {k: _json_data(v, f"state delta {k!r}") for k, v in items.items()}
            for scope, items in _split_state(delta).items()
        }
        async with self._session_lock(fs_id):
            expected = session._storage_update_marker
            last_event_id = session.events[-1].id if session.events else None

            def append() -> dict[str, Any] | None:
                raw = event.model_dump_json(exclude_none=True).encode("utf-8")
                op_id = new_id()
                args: dict[str, Any] = {
                    "session_id": fs_id,
                    "adk_session_id": session.id,
                    "revision": op_id,
                    "expected_revision": expected,
                    "expected_time": None if expected is not None else session.last_update_time,
                    "last_event_id": last_event_id,
                    "message_id": adk_message_id(fs_id, event.id),
                    "event_id": event.id,
                    "invocation_id": event.invocation_id,
                    "author": event.author,
                    "timestamp": event.timestamp,
                    "event": encode_payload(self.store, raw, "bytes"),
                    "text": redacted_copy(self.store, _text_of(event)),
                    "state": self._encode_state(deltas),
                }
                pending = _Pending(
                    op_id,
                    "append",
                    fs_id,
                    session.app_name,
                    session.user_id,
                    session.id,
                    event.timestamp,
                    op_id,
                    deltas,
                    event.model_copy(deep=True),
                )
                try:
                    result = self._submit(Operation("adk_append_event", args, op_id, True), pending)
                except errors.VersionConflict as exc:
                    raise StaleSession(str(exc)) from exc
                except errors.NotFound as exc:
                    raise SessionNotFound(str(exc)) from exc
                return {"revision": op_id} if result is None else result

            result = await self._run(append)
            if result is not None and result.get("duplicate"):
                return event  # an equal event stored already: nothing changes
            session._storage_update_marker = result["revision"] if result else None
            session.last_update_time = event.timestamp
        return self._commit_event_to_session(session, event)

    async def flush(self) -> None:
        """Wait (up to the write budget) until this process's spooled writes have
        landed; those that have not stay in the spool journal and land later."""
        if not await self.drain():
            log.warning(
                "%s: ADK writes still in the spool after the write budget; they land "
                "later (or on the next open / `fleetstore recover`)",
                self.store.path,
            )

    async def drain(self, timeout: float | None = None) -> bool:
        """Wait up to *timeout* seconds (default: the write budget) until every write
        this process spooled has landed; True if they have."""
        return await self._run(lambda: self.store.flush(timeout))

    async def close(self) -> None:
        """Wait for calls in flight; close the store if the service opened it."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._close_sync)

    def _close_sync(self) -> None:
        self._executor.shutdown(wait=True)
        if self._owns_store:
            self.store.close()

    async def __aenter__(self) -> FleetstoreSessionService:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- per-session serialisation of appends ----------------------------------------------

    def _session_lock(self, fs_id: str) -> _SessionLock:
        return _SessionLock(self._locks, fs_id)


class _SessionLock:
    """Appends to one session from this service run one at a time (parallel agents of
    one invocation share a session object): each reads the revision the last left."""

    def __init__(self, locks: dict[str, tuple[asyncio.Lock, int]], key: str) -> None:
        self._locks = locks
        self._key = key

    async def __aenter__(self) -> None:
        lock, users = self._locks.get(self._key, (asyncio.Lock(), 0))
        self._locks[self._key] = (lock, users + 1)
        self._lock = lock
        await lock.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        self._lock.release()
        lock, users = self._locks[self._key]
        if users <= 1:
            del self._locks[self._key]
        else:
            self._locks[self._key] = (lock, users - 1)


_NO_EVENTS = GetSessionConfig(num_recent_events=0)
_EVENT_KEYS: dict[str, Callable[[Event], Any]] = {
    "timestamp": lambda e: e.timestamp,  # a stable sort: ties stay in append order
    "timestamp_id": lambda e: (e.timestamp, e.id.encode("utf-8")),
}


def _apply(view: _View | None, p: _Pending) -> _View | None:
    """*view* with the spooled write *p* (of the same session) applied."""
    if p.kind == "delete":
        return None
    if p.kind == "create":
        state = copy.deepcopy(dict(p.deltas.get("session", {})))
        return _View(
            p.app_name, p.user_id, p.session_id, p.fs_id, p.revision, p.time, p.time, state, []
        )
    if view is None:
        return None  # its session is gone: the append will be rejected when replayed
    assert p.event is not None
    if not any(e.id == p.event.id for e in view.events):
        view.events.append(p.event.model_copy(deep=True))
    view.state.update(copy.deepcopy(dict(p.deltas.get("session", {}))))
    view.update_time, view.revision = p.time, p.revision
    return view


def _text_of(event: Event) -> str | None:
    """The plain text an event says (not its thoughts), for fleetstore's own views."""
    if event.content is None or not event.content.parts:
        return None
    text = "".join(p.text for p in event.content.parts if p.text and not p.thought)
    return text or None


__all__ = [
    "DEFAULT_THREADS",
    "EVENT_ORDERS",
    "FleetstoreSessionService",
    "SessionExists",
    "SessionNotFound",
    "SessionPage",
    "StaleSession",
]
