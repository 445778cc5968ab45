"""``fleetstore import --from adk-sqlite FILE``: bring the sessions of an ADK SQLite
database into a store, where ``FleetstoreSessionService`` serves them.

Reads the schema ADK's ``DatabaseSessionService`` writes (schema version 1: tables
``sessions``, ``events`` with an ``event_data`` JSON column, ``app_states``,
``user_states``; times as naive UTC ``DATETIME`` text) and the one of
``SqliteSessionService`` (the same tables, times as REAL seconds).  The legacy v0
schema (an event as one column per field, actions pickled) is refused: ADK's
migration tool converts it.

The file is opened read-only (``fleetstore.engine.foreign``: nothing is created
beside it, nothing written to it) and read whole, in one read transaction; a file
that changed during a read without locks is refused (``FileChanged``), nothing
imported.  Then, in order:

1. *check*, writing nothing: every state is a JSON object, every event parses as an
   ADK ``Event`` and belongs to a session of the file, every id can be stored, and
   no event contradicts the store (an event of the same session with the same id
   but other contents): any failure rejects the whole file;
2. *write*: app states, user states, then each session (with its own state) and its
   events in order, a batch of events per transaction (``Store.apply``: past the
   write budget ``StoreBusy``, and importing again is safe);
3. *verify*: read back, every event of the file is stored once, in the file's
   order, with the same contents, and each new session's state is the file's.

Importing is idempotent: a session present already keeps its state and gets the
events it lacks; an app or user state key present already keeps its value (the
store is newer), reported as ``newer`` when it differs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from google.adk.events.event import Event
from pydantic import ValidationError

from fleetstore import errors
from fleetstore.core.ids import is_valid_id, new_id
from fleetstore.core.validate import dump_json
from fleetstore.domain.codec import decode_value, encode_payload
from fleetstore.domain.frameworks.adk import adk_fs_id, adk_message_id
from fleetstore.domain.operations import Operation
from fleetstore.engine import foreign, inspect
from fleetstore.engine.base import Tx
from fleetstore.integrations.adk import _text_of
from fleetstore.store.facade import Store

#: Events per import transaction, and the encoded bytes after which a batch ends early.
_BATCH = 200
_BATCH_BYTES = 4 * 1024 * 1024
_TABLES = ("sessions", "events", "app_states", "user_states")

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True)
class AdkImportSummary:
    source: str
    schema: str  # "database-v1" or "sqlite-service"
    sessions: int
    events: int
    #: Sessions created by this import / present in the store already.
    new_sessions: int
    existing_sessions: int
    #: Events stored by this import / present already and equal.
    new_events: int
    unchanged_events: int
    #: app: and user: state keys: added / present and equal / present with another value.
    state_inserted: int
    state_unchanged: int
    state_newer: int


@dataclass
class _SourceSession:
    app_name: str
    user_id: str
    session_id: str
    state: dict[str, Any]
    create_time: float
    update_time: float
    events: list[dict[str, Any]] = field(default_factory=list)  # operation JSON, in order

    @property
    def fs_id(self) -> str:
        return adk_fs_id(self.app_name, self.user_id, self.session_id)


@dataclass
class _Source:
    schema: str
    sessions: list[_SourceSession]
    app_states: dict[str, dict[str, Any]]
    user_states: dict[tuple[str, str], dict[str, Any]]
    events: int


# -- reading the file ------------------------------------------------------------------------


def _bad(path: str, why: str) -> errors.InvalidInput:
    return errors.InvalidInput(f"{path}: not an importable ADK SQLite database: {why}")


def _time(value: object, path: str, what: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        result = float(value)
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise _bad(path, f"{what}: not a time: {value[:40]!r}") from None
        if parsed.tzinfo is None:  # ADK writes naive UTC
            parsed = parsed.replace(tzinfo=UTC)
        result = parsed.timestamp()
    else:
        raise _bad(path, f"{what}: not a time: {str(value)[:40]!r}")
    if not math.isfinite(result):
        raise _bad(path, f"{what}: not a time: {value!r}")
    return result


def _state(value: object, path: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(value) if isinstance(value, str | bytes) else None
    except ValueError:
        data = None
    if not isinstance(data, dict) or not all(isinstance(k, str) and k for k in data):
        raise _bad(path, f"{what} is not a JSON object with non-empty string keys")
    dump_json(data, what)
    return data


def _name(value: object, path: str, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 1024:
        raise _bad(path, f"{what} is not a non-empty string: {str(value)[:80]!r}")
    return value


def _read_source(path: str) -> _Source:
    try:
        return foreign.read_foreign(path, lambda db: _read_tables(db, path))
    except inspect.InspectFailed as exc:
        if exc.reason == "empty":
            raise _bad(path, "the file is empty") from None
        if exc.reason == "wal-without-shm":
            raise errors.InvalidInput(str(exc)) from None
        raise _bad(path, str(exc)) from None


def _read_tables(db: inspect.ReadOnlyDatabase, path: str) -> _Source:
    tables = {r[0] for r in db.query("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    missing = [t for t in _TABLES if t not in tables]
    if missing:
        raise _bad(path, f"no table {', '.join(missing)}")
    columns = {r[1] for r in db.query("PRAGMA table_info(events)")}
    if "event_data" not in columns:
        raise _bad(
            path,
            "it uses ADK's legacy v0 schema (no events.event_data); convert it with "
            "`python -m google.adk.sessions.migration.migration_runner` first",
        )
    schema = "database-v1" if "adk_internal_metadata" in tables else "sqlite-service"
    sessions: dict[tuple[str, str, str], _SourceSession] = {}
    for app, user, sid, state, created, updated in db.query(
        "SELECT app_name, user_id, id, state, create_time, update_time FROM sessions"
    ):
        where = f"session {sid!r} (app {app!r}, user {user!r})"
        key = (_name(app, path, where), _name(user, path, where), _name(sid, path, where))
        sessions[key] = _SourceSession(
            *key,
            state=_state(state, path, f"state of {where}"),
            create_time=_time(created, path, f"create_time of {where}"),
            update_time=_time(updated, path, f"update_time of {where}"),
        )
    app_states = {
        _name(app, path, "app_states.app_name"): _state(state, path, f"app state of {app!r}")
        for app, state in db.query("SELECT app_name, state FROM app_states")
    }
    user_states = {
        (_name(app, path, "user_states.app_name"), _name(user, path, "user_states.user_id")): (
            _state(state, path, f"user state of {user!r} in {app!r}")
        )
        for app, user, state in db.query("SELECT app_name, user_id, state FROM user_states")
    }
    count = 0
    parsed: dict[tuple[str, str, str], list[tuple[float, int, dict[str, Any]]]] = {}
    for rowid, eid, app, user, sid, invocation, ts, data in db.query(
        "SELECT rowid, id, app_name, user_id, session_id, invocation_id, timestamp, event_data "
        "FROM events"
    ):
        where = f"event {eid!r} of session {sid!r}"
        key = (app, user, sid)
        if key not in sessions:
            raise _bad(path, f"{where}: the session (app {app!r}, user {user!r}) is not in it")
        event = _event(eid, invocation, ts, data, path, where)
        parsed.setdefault(key, []).append((event.timestamp, rowid, {"event": event}))
        count += 1
    for key, items in parsed.items():
        # ADK reads a session's events by time; ties in the order they were written.
        items.sort(key=lambda item: (item[0], item[1]))
        sessions[key].events = [item[2] for item in items]
    return _Source(schema, list(sessions.values()), app_states, user_states, count)


def _event(
    eid: object, invocation: object, ts: object, data: object, path: str, where: str
) -> Event:
    _name(eid, path, where)
    try:
        body = json.loads(data) if isinstance(data, str | bytes) else {}
    except ValueError:
        raise _bad(path, f"{where}: event_data is not JSON") from None
    if not isinstance(body, dict):
        raise _bad(path, f"{where}: event_data is not a JSON object")
    timestamp = body.get("timestamp")
    if timestamp is None:
        timestamp = _time(ts, path, f"{where}: timestamp")
    try:
        return Event.model_validate(
            {**body, "id": eid, "invocation_id": invocation or "", "timestamp": timestamp}
        )
    except ValidationError as exc:
        raise _bad(path, f"{where} is not an ADK event: {exc}") from None


# -- checking against the store, writing, verifying ------------------------------------------


def _event_args(store: Store, fs_id: str, event: Event) -> dict[str, Any]:
    raw = event.model_dump_json(exclude_none=True).encode("utf-8")
    if not is_valid_id(adk_message_id(fs_id, event.id)):
        raise errors.InvalidInput(f"event id {event.id!r} cannot be stored")
    return {
        "message_id": adk_message_id(fs_id, event.id),
        "event_id": event.id,
        "invocation_id": event.invocation_id,
        "author": event.author,
        "timestamp": event.timestamp,
        "event": encode_payload(store, raw, "bytes"),
        "text": _text_of(event),
    }


def _digest_of(event: Event) -> tuple[str, int]:
    return _sha(event.model_dump_json(exclude_none=True).encode("utf-8"))


def _stored_events(store: Store, tx: Tx, fs_id: str) -> list[tuple[str, tuple[str, int]]]:
    """(event id, digest) of a session's stored events, in order."""
    q = store.queries
    rows = tx.execute(q["adk_events"], {"fs_id": fs_id, "after": None, "limit": -1})
    out = []
    for _seq, enc, body, sha, size in reversed(rows):
        raw = decode_value(store, enc, body, sha, size)
        out.append((Event.model_validate_json(raw).id, _sha(raw)))
    return out


def _sha(raw: bytes) -> tuple[str, int]:
    return hashlib.sha256(raw).hexdigest(), len(raw)


def _check_against_store(store: Store, source: _Source) -> None:
    """``AlreadyExists`` naming the first event of the file that contradicts the store."""
    q = store.queries

    def check(tx: Tx) -> None:
        for s in source.sessions:
            if not tx.execute(q["adk_session_by_name"], (s.app_name, s.user_id, s.session_id)):
                if tx.execute(q["session_exists"], (s.fs_id,)):
                    raise errors.AlreadyExists(f"session {s.fs_id} exists and is no ADK session")
                continue
            stored = dict(_stored_events(store, tx, s.fs_id))
            for item in s.events:
                event: Event = item["event"]
                if event.id in stored and stored[event.id] != _digest_of(event):
                    raise errors.AlreadyExists(
                        f"event {event.id!r} of session {s.session_id!r} (app {s.app_name!r}, "
                        f"user {s.user_id!r}) is in the store with other contents"
                    )

    store.read(check)


def _encode_state(store: Store, values: dict[str, Any]) -> dict[str, Any]:
    return {
        k: encode_payload(store, dump_json(v, f"state {k!r}"), "json") for k, v in values.items()
    }


def _apply(store: Store, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return store.apply(Operation(name, {**args, "now": _now()}, new_id()))


def _now() -> float:
    return time.time()


def import_adk_sqlite(
    store: Store, path: str | os.PathLike[str], *, progress: Progress | None = None
) -> AdkImportSummary:
    """Import the ADK SQLite database at *path* into *store* (see the module doc).
    ``InvalidInput`` / ``NotFound`` / ``AlreadyExists``: nothing was written;
    ``StoreBusy``: stopped midway, importing again is safe; ``IntegrityError``: the
    verification found the store does not hold what the file does."""
    path = os.fspath(path)
    if Path(path).resolve() == Path(store.path).resolve():
        raise errors.InvalidInput(f"{path} is the store itself")
    source = _read_source(path)
    step = progress or (lambda stage, done, total: None)
    for s in source.sessions:
        for item in s.events:
            if not is_valid_id(adk_message_id(s.fs_id, item["event"].id)):
                raise errors.InvalidInput(f"event id {item['event'].id!r} cannot be stored")
    _check_against_store(store, source)
    counts = {"inserted": 0, "unchanged": 0, "newer": 0}
    for app, values in sorted(source.app_states.items()):
        if values:
            args = {"app_name": app, "values": _encode_state(store, values), "updated_at": _now()}
            for k, v in _apply(store, "adk_import_scoped_state", args).items():
                counts[k] += v
    for (app, user), values in sorted(source.user_states.items()):
        if values:
            args = {
                "app_name": app,
                "user_id": user,
                "values": _encode_state(store, values),
                "updated_at": _now(),
            }
            for k, v in _apply(store, "adk_import_scoped_state", args).items():
                counts[k] += v
    new_sessions = new_events = unchanged = 0
    for i, s in enumerate(source.sessions):
        step("import", i, len(source.sessions))
        result = _apply(
            store,
            "adk_import_session",
            {
                "session_id": s.fs_id,
                "app_name": s.app_name,
                "user_id": s.user_id,
                "adk_session_id": s.session_id,
                "revision": new_id(),
                "create_time": s.create_time,
                "update_time": s.update_time,
                "state": {"session": _encode_state(store, s.state)} if s.state else {},
            },
        )
        new_sessions += not result["existed"]
        s_existed = bool(result["existed"])
        batch: list[dict[str, Any]] = []
        size = 0
        for n, item in enumerate(s.events):
            args = _event_args(store, s.fs_id, item["event"])
            batch.append(args)
            size += len(json.dumps(args))
            if len(batch) >= _BATCH or size >= _BATCH_BYTES or n == len(s.events) - 1:
                done = _apply(
                    store,
                    "adk_import_events",
                    {
                        "session_id": s.fs_id,
                        "revision": new_id(),
                        "update_time": s.update_time,
                        "events": batch,
                    },
                )
                new_events += done["inserted"]
                unchanged += done["unchanged"]
                batch, size = [], 0
        item_state = None if s_existed else s.state
        _verify_session(store, s, item_state)
    step("import", len(source.sessions), len(source.sessions))
    return AdkImportSummary(
        source=path,
        schema=source.schema,
        sessions=len(source.sessions),
        events=source.events,
        new_sessions=new_sessions,
        existing_sessions=len(source.sessions) - new_sessions,
        new_events=new_events,
        unchanged_events=unchanged,
        state_inserted=counts["inserted"],
        state_unchanged=counts["unchanged"],
        state_newer=counts["newer"],
    )


def _verify_session(store: Store, s: _SourceSession, state: dict[str, Any] | None) -> None:
    """``IntegrityError`` unless the store holds every event of *s* once, in the
    file's order, with the same contents (and, for a new session, its state)."""
    q = store.queries

    def read(tx: Tx) -> tuple[list[tuple[str, tuple[str, int]]], dict[str, Any]]:
        stored = _stored_events(store, tx, s.fs_id)
        rows = tx.execute(q["adk_session_state"], (s.fs_id,))
        values = {r[0]: decode_value(store, r[1], r[2], r[3], r[4]) for r in rows}
        return stored, values

    stored, values = store.read(read)
    ids = [eid for eid, _digest in stored]
    digests = dict(stored)
    where = f"session {s.session_id!r} (app {s.app_name!r}, user {s.user_id!r})"
    if len(ids) != len(set(ids)):
        raise errors.IntegrityError(f"import check: {where} holds an event twice")
    positions = []
    for item in s.events:
        event: Event = item["event"]
        if digests.get(event.id) != _digest_of(event):
            raise errors.IntegrityError(f"import check: event {event.id!r} of {where} differs")
        positions.append(ids.index(event.id))
    if positions != sorted(positions):
        raise errors.IntegrityError(f"import check: the events of {where} are out of order")
    if state is not None and values != state:
        raise errors.IntegrityError(f"import check: the state of {where} differs")


def summary_line(summary: AdkImportSummary) -> str:
    """What ``fleetstore import --from adk-sqlite`` prints."""
    return (
        f"fleetstore import: {summary.sessions} ADK sessions ({summary.new_sessions} new), "
        f"{summary.events} events ({summary.new_events} new, {summary.unchanged_events} "
        f"unchanged), app/user state keys: {summary.state_inserted} new, "
        f"{summary.state_unchanged} unchanged, {summary.state_newer} newer in the store; "
        f"verified"
    )


def run_cli(file: str, store: str | None) -> int:
    """The body of ``fleetstore import --from adk-sqlite FILE`` (see ``run_import``)."""
    from fleetstore.integrations import run_import

    return run_import(store, lambda opened: import_adk_sqlite(opened, file), summary_line)


__all__ = ["AdkImportSummary", "import_adk_sqlite", "run_cli", "summary_line"]
