"""Reading an ADK SQLite database (the file of ADK's ``DatabaseSessionService`` or
``SqliteSessionService``) into plain records, for ``fleetstore import --from
adk-sqlite`` (``fleetstore.integrations.adk.importer``, which imports them).

Reads the schema ADK's ``DatabaseSessionService`` writes (schema version 1: tables
``sessions``, ``events`` with an ``event_data`` JSON column, ``app_states``,
``user_states``; times as naive UTC ``DATETIME`` text) and the one of
``SqliteSessionService`` (the same tables, times as REAL seconds).  The legacy v0
schema (an event as one column per field, actions pickled) is refused: ADK's
migration tool converts it.

The file is opened read-only (``fleetstore.files.foreign``: nothing is created
beside it, nothing written to it) and read whole, in one read transaction; a file
that changed during a read without locks is refused (``FileChanged``).  Every name
is a non-empty string, every state a JSON object, every time a time, and every
event parses as an ADK ``Event`` and belongs to a session of the file: else
``InvalidInput`` (``NotFound`` if there is no file).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fleetstore import errors
from fleetstore.core.extras import requires
from fleetstore.core.validate import dump_json
from fleetstore.domain.adk import adk_fs_id
from fleetstore.files import foreign, inspect

with requires("adk", "reading an ADK session file"):
    from google.adk.events.event import Event
    from pydantic import ValidationError

_TABLES = ("sessions", "events", "app_states", "user_states")


@dataclass
class AdkSourceSession:
    """A session of the file, with its events in the order ADK reads them."""

    app_name: str
    user_id: str
    session_id: str
    state: dict[str, Any]
    create_time: float
    update_time: float
    events: list[Event] = field(default_factory=list)

    @property
    def fs_id(self) -> str:
        return adk_fs_id(self.app_name, self.user_id, self.session_id)


@dataclass
class AdkSource:
    """What the file holds."""

    schema: str  # "database-v1" or "sqlite-service"
    sessions: list[AdkSourceSession]
    app_states: dict[str, dict[str, Any]]
    user_states: dict[tuple[str, str], dict[str, Any]]
    events: int


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


def read_adk_source(path: str) -> AdkSource:
    """The ADK SQLite database at *path*, read whole (see the module doc)."""
    try:
        return foreign.read_foreign(path, lambda db: _read_tables(db, path))
    except inspect.InspectFailed as exc:
        if exc.reason == "empty":
            raise _bad(path, "the file is empty") from None
        if exc.reason == "wal-without-shm":
            raise errors.InvalidInput(str(exc)) from None
        raise _bad(path, str(exc)) from None


def _read_tables(db: inspect.ReadOnlyDatabase, path: str) -> AdkSource:
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
    sessions: dict[tuple[str, str, str], AdkSourceSession] = {}
    for app, user, sid, state, created, updated in db.query(
        "SELECT app_name, user_id, id, state, create_time, update_time FROM sessions"
    ):
        where = f"session {sid!r} (app {app!r}, user {user!r})"
        key = (_name(app, path, where), _name(user, path, where), _name(sid, path, where))
        sessions[key] = AdkSourceSession(
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
    parsed: dict[tuple[str, str, str], list[tuple[float, int, Event]]] = {}
    for rowid, eid, app, user, sid, invocation, ts, data in db.query(
        "SELECT rowid, id, app_name, user_id, session_id, invocation_id, timestamp, event_data "
        "FROM events"
    ):
        where = f"event {eid!r} of session {sid!r}"
        key = (app, user, sid)
        if key not in sessions:
            raise _bad(path, f"{where}: the session (app {app!r}, user {user!r}) is not in it")
        event = _event(eid, invocation, ts, data, path, where)
        parsed.setdefault(key, []).append((event.timestamp, rowid, event))
        count += 1
    for key, items in parsed.items():
        # ADK reads a session's events by time; ties in the order they were written.
        items.sort(key=lambda item: (item[0], item[1]))
        sessions[key].events = [item[2] for item in items]
    return AdkSource(schema, list(sessions.values()), app_states, user_states, count)


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


__all__ = ["AdkSource", "AdkSourceSession", "read_adk_source"]
