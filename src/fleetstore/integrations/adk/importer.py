"""``fleetstore import --from adk-sqlite FILE``: bring the sessions of an ADK SQLite
database into a store, where ``FleetstoreSessionService`` serves them.

The file is read whole by ``fleetstore.integrations.adk.reader`` (the schemas of
``DatabaseSessionService`` v1 and of ``SqliteSessionService``; the legacy v0 schema
is refused), read-only, in one read transaction; a file that changed during a read
without locks is refused (``FileChanged``), nothing imported.  Then, in order:

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
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetstore import errors
from fleetstore.core.extras import requires
from fleetstore.core.ids import is_valid_id, new_id
from fleetstore.core.validate import dump_json
from fleetstore.domain.adk import adk_message_id
from fleetstore.domain.codec import decode_value, encode_payload, redacted_copy
from fleetstore.domain.operations import Operation
from fleetstore.domain.ports import Tx
from fleetstore.integrations.adk.adapter import _text_of
from fleetstore.integrations.adk.reader import AdkSource, AdkSourceSession, read_adk_source
from fleetstore.store.facade import Store

with requires("adk", "importing an ADK session file"):
    from google.adk.events.event import Event

#: Events per import transaction, and the encoded bytes after which a batch ends early.
_BATCH = 200
_BATCH_BYTES = 4 * 1024 * 1024

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
        "text": redacted_copy(store, _text_of(event)),
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


def _check_against_store(store: Store, source: AdkSource) -> None:
    """``AlreadyExists`` naming the first event of the file that contradicts the store."""
    q = store.queries

    def check(tx: Tx) -> None:
        for s in source.sessions:
            if not tx.execute(q["adk_session_by_name"], (s.app_name, s.user_id, s.session_id)):
                if tx.execute(q["session_exists"], (s.fs_id,)):
                    raise errors.AlreadyExists(f"session {s.fs_id} exists and is no ADK session")
                continue
            stored = dict(_stored_events(store, tx, s.fs_id))
            for event in s.events:
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
    source = read_adk_source(path)
    step = progress or (lambda stage, done, total: None)
    for s in source.sessions:
        for event in s.events:
            if not is_valid_id(adk_message_id(s.fs_id, event.id)):
                raise errors.InvalidInput(f"event id {event.id!r} cannot be stored")
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
        for n, event in enumerate(s.events):
            args = _event_args(store, s.fs_id, event)
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


def _verify_session(store: Store, s: AdkSourceSession, state: dict[str, Any] | None) -> None:
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
    for event in s.events:
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


def run_cli(file: str, store: str | None, *, as_json: bool = False) -> int:
    """The body of ``fleetstore import --from adk-sqlite FILE`` (see ``run_import``)."""
    from fleetstore.integrations import run_import

    return run_import(
        store, lambda opened: import_adk_sqlite(opened, file), summary_line, as_json=as_json
    )


__all__ = ["AdkImportSummary", "import_adk_sqlite", "run_cli", "summary_line"]
