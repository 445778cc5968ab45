"""The write operations behind Google ADK sessions (``fleetstore.integrations.adk``).

They are registered here, not in the integration, so that any fleetstore process
(``fleetstore recover``, a spool replay, an import) can apply them without
google-adk installed: operations arrive from spool journals long after the
process that made them is gone.

An ADK session is a fleetstore session whose id is derived from
(app name, user id, session id) (``adk_fs_id``): its events are its messages
(part 0 the event's JSON as a ``file`` part, part 1 its plain text if it has
any), its state is its ``adk`` state namespace, and its ``adk_sessions`` row
(migration 0004) holds the ADK names, the update time ADK lists by, and the
*revision*: the id of the last operation that wrote the session.  ``app:`` and
``user:`` state live in ``adk_app_state`` / ``adk_user_state``, one row per key.

``adk_append_event`` applies an event and its state delta in one transaction.
It carries the revision its caller's session object last saw: if the stored
revision differs, someone else wrote the session since, and it raises
``VersionConflict`` (ADK's stale session) with nothing written.  Revisions are
operation ids, so a chain of appends spooled by one process stays consistent
when replayed, and a break in the chain (an append by another writer, or an
earlier append of the chain rejected) fails every later link.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from fleetstore import errors
from fleetstore.core.ids import derived_id, is_valid_id
from fleetstore.core.validate import (
    STATE_KEY_MAX,
    arg_id,
    arg_str,
    arg_when,
    check_str,
    check_text,
    dump_json,
)
from fleetstore.domain.codec import encoded_body
from fleetstore.domain.operations import Args, Declarations, Queries, Result, Scope
from fleetstore.engine.base import Tx

OPERATIONS = Declarations()

#: The state namespace of an ADK session's own state.
NAMESPACE = "adk"
#: State scopes of a delta: the session's own, the app's and the user's.
SCOPES = ("session", "app", "user")
#: The mime type and name of the part that holds an event's JSON.
EVENT_MIME = "application/vnd.google.adk.event+json"
EVENT_NAME = "adk-event.json"
_NAME_LIMIT = 1024


def adk_fs_id(app_name: str, user_id: str, session_id: str) -> str:
    """The fleetstore session id of an ADK session (JSON-joined, so names holding
    '/' cannot collide)."""
    return derived_id("adk-session", json.dumps([app_name, user_id, session_id]))


def adk_message_id(fs_id: str, event_id: str) -> str:
    """The fleetstore message id of an ADK event in its session."""
    return derived_id("adk-event", fs_id, json.dumps(event_id))


# -- argument checks -------------------------------------------------------------------------


def _deltas(a: Args) -> dict[str, dict[str, Any]]:
    raw = a.get("state")
    if raw is None:
        return {}
    if not isinstance(raw, dict) or set(raw) - set(SCOPES):
        raise errors.InvalidInput(f"state must be an object with keys among {SCOPES}")
    out: dict[str, dict[str, Any]] = {}
    for scope, items in raw.items():
        if not isinstance(items, dict):
            raise errors.InvalidInput(f"{scope} state must be an object")
        for key in items:
            check_str(key, "an ADK state key", limit=STATE_KEY_MAX, empty=False)
        out[scope] = items
    return out


def _json_value(tx: Tx, q: Queries, item: object, what: str, now: float) -> tuple[Any, ...]:
    if not isinstance(item, dict):
        raise errors.InvalidInput(f"{what}: must be an encoded payload")
    enc, body, sha, size = encoded_body(tx, q, item, what, now)
    if enc != "json":
        raise errors.InvalidInput(f"{what}: ADK state values are JSON")
    return enc, body, sha, size


def apply_state(
    tx: Tx,
    q: Queries,
    fs_id: str,
    app_name: str,
    user_id: str,
    deltas: Mapping[str, Mapping[str, Any]],
    now: float,
) -> None:
    """Write a state delta: ``{"session"|"app"|"user": {key: payload}}`` (keys without
    their ``app:``/``user:`` prefix), each key replaced whole (ADK's dict.update)."""
    for key, item in deltas.get("session", {}).items():
        enc, body, sha, size = _json_value(tx, q, item, f"session state {key!r}", now)
        rows = tx.execute(q["state_version"], (fs_id, NAMESPACE, key))
        version = (rows[0][0] if rows else 0) + 1
        tx.execute(q["state_upsert"], (fs_id, NAMESPACE, key, version, enc, body, sha, size, now))
    for key, item in deltas.get("app", {}).items():
        enc, body, sha, size = _json_value(tx, q, item, f"app state {key!r}", now)
        tx.execute(q["adk_app_state_put"], (app_name, key, enc, body, sha, size, now))
    for key, item in deltas.get("user", {}).items():
        enc, body, sha, size = _json_value(tx, q, item, f"user state {key!r}", now)
        tx.execute(q["adk_user_state_put"], (app_name, user_id, key, enc, body, sha, size, now))


def payload_digest(item: Mapping[str, Any]) -> tuple[str, int]:
    """(sha256, size) of the bytes an encoded payload stands for."""
    blob = item.get("blob")
    if isinstance(blob, dict):
        return str(blob.get("sha256")), int(blob.get("size", -1))
    body = item.get("body")
    if not isinstance(body, str):
        raise errors.InvalidInput("a payload has a body or a blob")
    raw = base64.b64decode(body) if item.get("enc") == "bytes" else body.encode("utf-8")
    return hashlib.sha256(raw).hexdigest(), len(raw)


def stored_digest(body: Any, blob_sha: str | None, size: int) -> tuple[str, int]:
    """(sha256, size) of a stored payload (inline or blob)."""
    if blob_sha is not None:
        return blob_sha, size
    raw = body.encode("utf-8") if isinstance(body, str) else bytes(body or b"")
    return hashlib.sha256(raw).hexdigest(), len(raw)


# -- sessions --------------------------------------------------------------------------------


def _insert_session(
    tx: Tx,
    q: Queries,
    fs_id: str,
    app_name: str,
    user_id: str,
    session_id: str,
    revision: str,
    created: float,
    updated: float,
) -> None:

    if tx.execute(q["session_job"], (fs_id,)):  # any row, a session being deleted too
        raise errors.AlreadyExists(
            f"ADK session {session_id!r} (app {app_name!r}, user {user_id!r}): its fleetstore "
            f"session {fs_id} exists already"
        )
    meta = dump_json(
        {"adk": {"app_name": app_name, "user_id": user_id, "session_id": session_id}}, "metadata"
    )
    tx.execute(
        q["session_insert"],
        (fs_id, None, fs_id, None, None, None, session_id, meta, created, updated, None, None),
    )
    tx.execute(
        q["adk_session_insert"], (app_name, user_id, session_id, fs_id, revision, created, updated)
    )


def _names(a: Args) -> tuple[str, str, str, str]:
    """(fs_id, app_name, user_id, ADK session id), the fs_id checked against the names."""
    fs_id = arg_id(a, "session_id")
    app_name, user_id, sid = (
        arg_str(a, "app_name", False, _NAME_LIMIT, empty=False),
        arg_str(a, "user_id", False, _NAME_LIMIT, empty=False),
        arg_str(a, "adk_session_id", False, _NAME_LIMIT, empty=False),
    )
    assert app_name is not None and user_id is not None and sid is not None
    if adk_fs_id(app_name, user_id, sid) != fs_id:
        raise errors.InvalidInput(f"session_id {fs_id} is not the id of ADK session {sid!r}")
    return fs_id, app_name, user_id, sid


@OPERATIONS.declare("adk_create_session", scope=Scope.CATALOG)
def _create_session(tx: Tx, q: Queries, a: Args) -> Result:
    fs_id, app_name, user_id, sid = _names(a)
    revision = arg_id(a, "revision")
    now = arg_when(a, "created_at")
    assert now is not None
    deltas = _deltas(a)
    if tx.execute(q["adk_session_by_name"], (app_name, user_id, sid)):
        raise errors.AlreadyExists(f"Session with id {sid} already exists.")
    _insert_session(tx, q, fs_id, app_name, user_id, sid, revision, now, now)
    apply_state(tx, q, fs_id, app_name, user_id, deltas, now)
    return {"id": fs_id, "revision": revision, "update_time": now}


@OPERATIONS.declare("adk_delete_session", scope=Scope.CATALOG)
def _delete_session(tx: Tx, q: Queries, a: Args) -> Result:
    fs_id = arg_id(a, "session_id")
    if not tx.execute(q["adk_session_by_fs"], (fs_id,)):
        return {"deleted": False}  # ADK: deleting a missing session is no error
    tx.execute(q["session_delete"], (fs_id,))  # cascades: messages, state, adk_sessions
    return {"deleted": True}


# -- events ----------------------------------------------------------------------------------


def _event_parts(a: Args, what: str) -> tuple[dict[str, Any], str | None]:
    event = a.get("event")
    if not isinstance(event, dict) or event.get("enc") != "bytes":
        raise errors.InvalidInput(f"{what}: event must be a bytes payload")
    text = a.get("text")
    if text is not None and (not isinstance(text, str) or not text):
        raise errors.InvalidInput(f"{what}: text must be a non-empty string or null")
    return event, text


class _Event:
    """An event's arguments, checked."""

    def __init__(self, fs_id: str, a: Args, what: str) -> None:
        event_id = arg_str(a, "event_id", False, _NAME_LIMIT, empty=False)
        assert event_id is not None
        self.what = f"{what} {event_id!r}"
        self.event_id = event_id
        self.message_id = arg_id(a, "message_id")
        if self.message_id != adk_message_id(fs_id, event_id):
            raise errors.InvalidInput(f"{self.what}: message_id is not derived from the event id")
        self.invocation_id = (
            arg_str(a, "invocation_id", True, _NAME_LIMIT, empty=False)
            if a.get("invocation_id")
            else ""
        )
        author = arg_str(a, "author", False, _NAME_LIMIT, empty=False)
        timestamp = arg_when(a, "timestamp")
        assert author is not None and timestamp is not None
        self.author, self.timestamp = author, timestamp
        self.event, self.text = _event_parts(a, self.what)
        if self.text is not None:
            check_text(self.text, f"{self.what}: text")


def _stored_seq(tx: Tx, q: Queries, fs_id: str, ev: _Event) -> int | None:
    """The seq of *ev* if it is stored already, equal; ``AlreadyExists`` if an event
    with its id but other contents is."""
    found = tx.execute(q["message_identity"], (ev.message_id,))
    if not found:
        return None
    stored = tx.execute(q["adk_event_part"], (ev.message_id,))
    if found[0][0] == fs_id and stored:
        _enc, body, sha, size = stored[0]
        if stored_digest(body, sha, size) == payload_digest(ev.event):
            return int(found[0][1])
    raise errors.AlreadyExists(f"{ev.what} is stored already with other contents")


def _insert(tx: Tx, q: Queries, fs_id: str, ev: _Event, now: float) -> int:
    seq = int(tx.execute(q["message_last_seq"], (fs_id,))[0][0]) + 1
    role = "user" if ev.author == "user" else "assistant"
    meta = dump_json(
        {"adk_event_id": ev.event_id, "invocation_id": ev.invocation_id, "author": ev.author},
        "metadata",
    )
    tx.execute(
        q["message_insert"],
        (ev.message_id, fs_id, seq, role, "complete", None, meta, ev.timestamp, ev.timestamp),
    )
    enc, body, sha, size = encoded_body(tx, q, ev.event, ev.what, now)
    part_meta = dump_json({"mime_type": EVENT_MIME, "name": EVENT_NAME}, "meta")
    tx.execute(q["part_insert"], (ev.message_id, 0, fs_id, "file", part_meta, enc, body, sha, size))
    if ev.text is not None:
        size = len(ev.text.encode("utf-8"))
        tx.execute(
            q["part_insert"], (ev.message_id, 1, fs_id, "text", "{}", "str", ev.text, None, size)
        )
    return seq


@OPERATIONS.declare("adk_append_event", scope=Scope.CATALOG)
def _append_event(tx: Tx, q: Queries, a: Args) -> Result:
    fs_id = arg_id(a, "session_id")
    revision = arg_id(a, "revision")
    expected = a.get("expected_revision")
    if expected is not None and not is_valid_id(expected):
        raise errors.InvalidInput("expected_revision must be an id or null")
    expected_time = arg_when(a, "expected_time", optional=True)
    last_event_id = a.get("last_event_id")
    if last_event_id is not None and not isinstance(last_event_id, str):
        raise errors.InvalidInput("last_event_id must be a string or null")
    now = arg_when(a, "now")
    assert now is not None
    ev = _Event(fs_id, a, "event")
    deltas = _deltas(a)
    rows = tx.execute(q["adk_session_by_fs"], (fs_id,))
    if not rows:
        raise errors.NotFound(f"Session {a.get('adk_session_id', fs_id)} not found.")
    app_name, user_id, sid, stored_revision, _created, update_time = rows[0]
    seq = _stored_seq(tx, q, fs_id, ev)
    if seq is not None:
        # An equal re-delivery of a stored event changes nothing (as in ADK's services).
        return {"duplicate": True, "seq": seq, "revision": stored_revision}
    if expected is not None:
        if expected != stored_revision:
            raise errors.VersionConflict(
                f"ADK session {sid!r} was written by someone else since this session "
                f"object was read (revision {stored_revision}, not {expected}): reload it"
            )
    elif expected_time is not None and update_time > expected_time:
        # A session object without our revision (built by hand, or by another
        # service): stale if storage moved past it, unless it holds the last event.
        last = tx.execute(q["adk_last_event"], (fs_id,))
        if (last[0][0] if last else None) != last_event_id:
            raise errors.VersionConflict(
                f"ADK session {sid!r}: its last_update_time {expected_time} is earlier than "
                f"the stored {update_time}: a stale session; reload it"
            )
    seq = _insert(tx, q, fs_id, ev, now)
    apply_state(tx, q, fs_id, app_name, user_id, deltas, now)
    tx.execute(q["adk_session_revise"], (revision, ev.timestamp, fs_id))
    tx.execute(q["session_touch"], (now, fs_id))
    return {"revision": revision, "update_time": ev.timestamp, "seq": seq}


# -- import (fleetstore.integrations.adk.importer) ---------------------------------------------


@OPERATIONS.declare("adk_import_session", scope=Scope.CATALOG)
def _import_session(tx: Tx, q: Queries, a: Args) -> Result:
    """An ADK session as the source file had it, with its own state; present
    already: left as it is (``existed``)."""
    fs_id, app_name, user_id, sid = _names(a)
    revision = arg_id(a, "revision")
    created, updated = arg_when(a, "create_time"), arg_when(a, "update_time")
    now = arg_when(a, "now")
    assert created is not None and updated is not None and now is not None
    deltas = _deltas(a)
    if set(deltas) - {"session"}:
        raise errors.InvalidInput("adk_import_session: only session state")
    if tx.execute(q["adk_session_by_name"], (app_name, user_id, sid)):
        return {"existed": True}
    _insert_session(tx, q, fs_id, app_name, user_id, sid, revision, created, updated)
    apply_state(tx, q, fs_id, app_name, user_id, deltas, now)
    return {"existed": False}


@OPERATIONS.declare("adk_import_events", scope=Scope.CATALOG)
def _import_events(tx: Tx, q: Queries, a: Args) -> Result:
    """Events of one session, in order; each stored already (equal) is skipped.  If
    any is new, the session's revision changes (session objects read before are stale)."""
    fs_id = arg_id(a, "session_id")
    revision = arg_id(a, "revision")
    update_time = arg_when(a, "update_time")
    now = arg_when(a, "now")
    assert update_time is not None and now is not None
    events = a.get("events")
    if not isinstance(events, list) or not events:
        raise errors.InvalidInput("events must be a non-empty list")
    rows = tx.execute(q["adk_session_by_fs"], (fs_id,))
    if not rows:
        raise errors.NotFound(f"no ADK session {fs_id}")
    inserted = 0
    for item in events:
        if not isinstance(item, dict):
            raise errors.InvalidInput("each event must be an object")
        ev = _Event(fs_id, item, "imported event")
        if _stored_seq(tx, q, fs_id, ev) is None:
            _insert(tx, q, fs_id, ev, now)
            inserted += 1
    if inserted:
        tx.execute(q["adk_session_revise"], (revision, max(update_time, rows[0][5]), fs_id))
        tx.execute(q["session_touch"], (now, fs_id))
    return {"inserted": inserted, "unchanged": len(events) - inserted}


@OPERATIONS.declare("adk_import_scoped_state", scope=Scope.CATALOG)
def _import_scoped_state(tx: Tx, q: Queries, a: Args) -> Result:
    """App state (no ``user_id``) or one user's state: keys the store does not have
    are added; a key it has is left as it is (``newer`` if its value differs)."""
    app_name = arg_str(a, "app_name", False, _NAME_LIMIT, empty=False)
    user_id = arg_str(a, "user_id", True, _NAME_LIMIT, empty=False)
    assert app_name is not None
    updated = arg_when(a, "updated_at")
    assert updated is not None
    values = a.get("values")
    if not isinstance(values, dict):
        raise errors.InvalidInput("values must be an object")
    _deltas({"state": {"app": values}})  # checks the keys
    counts = {"inserted": 0, "unchanged": 0, "newer": 0}
    for key, item in values.items():
        what = f"{'app' if user_id is None else 'user'} state {key!r}"
        enc, body, sha, size = _json_value(tx, q, item, what, updated)
        if user_id is None:
            found = tx.execute(q["adk_app_state_key"], (app_name, key))
        else:
            found = tx.execute(q["adk_user_state_key"], (app_name, user_id, key))
        if found:
            same = stored_digest(*found[0][1:]) == stored_digest(body, sha, size)
            counts["unchanged" if same else "newer"] += 1
            continue
        if user_id is None:
            tx.execute(q["adk_app_state_put"], (app_name, key, enc, body, sha, size, updated))
        else:
            tx.execute(
                q["adk_user_state_put"], (app_name, user_id, key, enc, body, sha, size, updated)
            )
        counts["inserted"] += 1
    return counts


__all__ = [
    "EVENT_MIME",
    "EVENT_NAME",
    "NAMESPACE",
    "SCOPES",
    "adk_fs_id",
    "adk_message_id",
    "apply_state",
    "payload_digest",
    "stored_digest",
]
