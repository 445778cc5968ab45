"""The import operations (``import_session``, ``import_message``, ``import_parts``,
``import_state``): the records of a ``fleetstore export`` file, parsed and checked,
and applied idempotently by content rather than by ``applied_ops``.

An object absent is inserted, one present and equal is left alone, one at an earlier
stage (a lower version, a message still ``streaming``) is brought forward, one at a
later stage is kept, and any other difference is a conflict.  The same parsers run
in an import's first pass (checking the whole file against the store, writing
nothing) and inside each operation's transaction, so the file and the write share
one code path (docs/design.md, "Export, import, merge").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetstore import errors
from fleetstore.core.validate import (
    MAX_ERROR_TEXT,
    MAX_MODEL,
    MAX_PART_META,
    MAX_TEXT,
    check_id,
    check_int,
    check_number,
    check_opt_id,
    check_opt_str,
    check_time,
    object_json,
)
from fleetstore.domain.codec import encoded_body
from fleetstore.domain.operations import Args, Declarations, Queries, Result, Scope
from fleetstore.domain.search_index import requeue
from fleetstore.engine.base import Tx
from fleetstore.models import PART_KINDS, STREAMED_KINDS, USAGE_FIELDS

OPERATIONS = Declarations()

#: Operations an export file may carry; any other is rejected.
IMPORT_OPS = ("import_session", "import_message", "import_parts", "import_state")
INT_MAX = 2**63 - 1  # SQLite's integers
INSERTED, UPDATED, UNCHANGED, NEWER = "inserted", "updated", "unchanged", "newer"
MISSING_PARENT = "missing parent"


# -- argument checks (pure: used on every line of a file before anything is written) ----------


def _fields(a: Args, what: str, required: Sequence[str], optional: Sequence[str] = ()) -> None:
    unknown = set(a) - set(required) - set(optional) - {"now"}
    if unknown:
        raise errors.InvalidInput(f"{what}: unknown field(s) {sorted(map(str, unknown))!r:.200}")
    missing = [k for k in required if k not in a]
    if missing:
        raise errors.InvalidInput(f"{what}: missing field(s) {', '.join(missing)}")


class _DryTx:
    """A transaction that runs nothing: lets ``encoded_body`` check a payload
    without a database, so file checks and writes share one code path."""

    now = 0.0
    uncertain = False

    def execute(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        return []

    def executemany(self, sql: str, seq_of_params: Iterable[Any]) -> None:
        return None

    def notify(self, channel: str) -> None:
        return None


class _AnyQuery(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return ""


_DRY_TX = _DryTx()
_DRY_QUERIES = _AnyQuery()


@dataclass(frozen=True, slots=True)
class _Payload:
    item: Mapping[str, Any]  # the encoded payload, for encoded_body when written
    enc: str
    sha256: str  # of the value's bytes (a blob's own hash)
    size: int
    blob: tuple[str, int, int] | None  # (sha256, size, stored_size)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.enc, self.sha256, self.size)


def _payload(item: Mapping[str, Any], what: str, extra: Sequence[str] = ()) -> _Payload:
    keys = set(item) - set(extra)
    if keys not in ({"enc", "body"}, {"enc", "blob"}):
        raise errors.InvalidInput(f"{what}: a payload has 'enc' and 'body' or 'blob'")
    enc, body, sha, size = encoded_body(_DRY_TX, _DRY_QUERIES, item, what, 0.0)
    if sha is not None:
        ref = item["blob"]
        if set(ref) != {"sha256", "size", "stored_size"}:
            raise errors.InvalidInput(f"{what}: a blob reference has sha256, size, stored_size")
        return _Payload(item, enc, sha, size, (sha, size, ref["stored_size"]))
    raw = body if isinstance(body, bytes) else str(body).encode("utf-8")
    return _Payload(item, enc, hashlib.sha256(raw).hexdigest(), size, None)


def value_key(
    enc: str, body: Any, blob_sha: str | None, size: int, text: str | None = None
) -> tuple[str, str, int]:
    """(encoding, SHA-256 of the value, size) of a stored payload, however stored."""
    if enc == "chunks":
        raw = (text or "").encode("utf-8")
        return ("str", hashlib.sha256(raw).hexdigest(), len(raw))
    if blob_sha is not None:
        return (enc, blob_sha, size)
    if body is None:
        raw = b""
    elif isinstance(body, str):
        raw = body.encode("utf-8")
    else:
        raw = bytes(body)
    return (enc, hashlib.sha256(raw).hexdigest(), len(raw))


@dataclass(frozen=True, slots=True)
class SessionIn:
    id: str
    parent_id: str | None
    root_id: str
    forked_from: str | None
    fork_seq: int | None
    project: str | None
    title: str | None
    status: str
    metadata: str
    created_at: float
    updated_at: float
    archived_at: float | None
    version: int

    def row(self) -> tuple[Any, ...]:
        return (
            self.id,
            self.parent_id,
            self.root_id,
            self.forked_from,
            self.fork_seq,
            self.project,
            self.title,
            self.status,
            self.metadata,
            self.created_at,
            self.updated_at,
            self.archived_at,
            self.version,
        )


SESSION_FIELDS = (
    "id",
    "parent_id",
    "root_id",
    "forked_from",
    "fork_seq",
    "project",
    "title",
    "status",
    "metadata",
    "created_at",
    "updated_at",
    "archived_at",
    "version",
)


def _parse_session(a: Args) -> SessionIn:
    _fields(a, "import_session", SESSION_FIELDS)
    sid = check_id(a["id"], "id")
    what = f"session {sid}"
    parent = check_opt_id(a["parent_id"], f"{what}: parent_id")
    root = check_id(a["root_id"], f"{what}: root_id")
    if parent is None and root != sid and a["forked_from"] is None:
        # (A fork of a top-level session has no parent but stays in its source's tree.)
        raise errors.InvalidInput(
            f"{what} has no parent and is no fork, so its root_id must be its own id"
        )
    if parent == sid:
        raise errors.InvalidInput(f"{what} is its own parent")
    status = a["status"]
    archived_at = a["archived_at"]
    if status not in ("active", "archived"):
        raise errors.InvalidInput(f"{what}: status must be active or archived")
    if (status == "archived") != (archived_at is not None):
        raise errors.InvalidInput(f"{what}: archived_at is set exactly when it is archived")
    fork_seq = a["fork_seq"]
    return SessionIn(
        id=sid,
        parent_id=parent,
        root_id=root,
        forked_from=check_opt_id(a["forked_from"], f"{what}: forked_from"),
        fork_seq=None if fork_seq is None else check_int(fork_seq, f"{what}: fork_seq"),
        project=check_opt_str(a["project"], f"{what}: project", 4096),
        title=check_opt_str(a["title"], f"{what}: title", 4096),
        status=status,
        metadata=object_json(a["metadata"], f"{what}: metadata"),
        created_at=check_time(a["created_at"], f"{what}: created_at"),
        updated_at=check_time(a["updated_at"], f"{what}: updated_at"),
        archived_at=None
        if archived_at is None
        else check_time(archived_at, f"{what}: archived_at"),
        version=check_int(a["version"], f"{what}: version", minimum=1),
    )


@dataclass(frozen=True, slots=True)
class PartIn:
    seq: int
    kind: str
    meta: str
    payload: _Payload | None  # a whole part
    chunks: tuple[tuple[int, str], ...] | None  # a streamed part (or a slice of its chunks)


def _parse_part(p: object, message_id: str) -> PartIn:
    if not isinstance(p, dict):
        raise errors.InvalidInput(f"message {message_id}: a part must be an object")
    seq = check_int(p.get("seq"), f"message {message_id}: part seq")
    what = f"part {seq} of message {message_id}"
    kind = p.get("kind")
    if kind not in PART_KINDS:
        raise errors.InvalidInput(f"{what}: unknown part kind {str(kind)[:40]!r}")
    meta = object_json(p.get("meta"), f"{what}: meta", MAX_PART_META)
    if p.get("enc") != "chunks":
        return PartIn(seq, kind, meta, _payload(p, what, ("seq", "kind", "meta")), None)
    _fields(p, what, ("seq", "kind", "meta", "enc", "chunks"))
    if kind not in STREAMED_KINDS:
        raise errors.InvalidInput(f"{what}: only text and reasoning parts are streamed")
    raw = p["chunks"]
    if not isinstance(raw, list):
        raise errors.InvalidInput(f"{what}: chunks must be a list")
    chunks: list[tuple[int, str]] = []
    for c in raw:
        if not isinstance(c, list) or len(c) != 2:
            raise errors.InvalidInput(f"{what}: a chunk is [seq, text]")
        text = check_opt_str(c[1], f"{what}: chunk text", MAX_TEXT)
        if text is None:
            raise errors.InvalidInput(f"{what}: a chunk's text must be a string")
        chunks.append((check_int(c[0], f"{what}: chunk seq"), text))
    if len({s for s, _ in chunks}) != len(chunks):
        raise errors.InvalidInput(f"{what}: a chunk seq appears twice")
    return PartIn(seq, kind, meta, None, tuple(chunks))


def _parse_parts(raw: object, message_id: str) -> tuple[PartIn, ...]:
    if not isinstance(raw, list):
        raise errors.InvalidInput(f"message {message_id}: parts must be a list")
    return tuple(_parse_part(p, message_id) for p in raw)


def _parse_usage(raw: object, what: str) -> tuple[Any, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != set(USAGE_FIELDS):
        raise errors.InvalidInput(f"{what}: usage has exactly the fields {', '.join(USAGE_FIELDS)}")
    counts = [check_int(raw[f], f"{what}: usage {f}") for f in USAGE_FIELDS[:-1]]
    cost = check_number(raw["cost"], f"{what}: usage cost", minimum=0.0)
    return (*counts, cost)


@dataclass(frozen=True, slots=True)
class MessageIn:
    id: str
    session_id: str
    seq: int
    role: str
    status: str
    model: str | None
    metadata: str
    error: str | None
    created_at: float
    completed_at: float | None
    usage: tuple[Any, ...] | None
    parts: tuple[PartIn, ...]


_MESSAGE_FIELDS = (
    "id",
    "session_id",
    "seq",
    "role",
    "status",
    "model",
    "metadata",
    "error",
    "created_at",
    "completed_at",
    "usage",
    "parts",
)


def _parse_message(a: Args) -> MessageIn:
    _fields(a, "import_message", _MESSAGE_FIELDS)
    mid = check_id(a["id"], "id")
    what = f"message {mid}"
    role = check_opt_str(a["role"], f"{what}: role", 64)
    if not role:
        raise errors.InvalidInput(f"{what}: role must be a non-empty string")
    status = a["status"]
    if status not in ("streaming", "complete", "error"):
        raise errors.InvalidInput(f"{what}: status must be streaming, complete or error")
    completed = a["completed_at"]
    return MessageIn(
        id=mid,
        session_id=check_id(a["session_id"], f"{what}: session_id"),
        seq=check_int(a["seq"], f"{what}: seq", minimum=1),
        role=role,
        status=status,
        model=check_opt_str(a["model"], f"{what}: model", MAX_MODEL),
        metadata=object_json(a["metadata"], f"{what}: metadata"),
        error=check_opt_str(a["error"], f"{what}: error", MAX_ERROR_TEXT),
        created_at=check_time(a["created_at"], f"{what}: created_at"),
        completed_at=None if completed is None else check_time(completed, f"{what}: completed_at"),
        usage=_parse_usage(a["usage"], what),
        parts=_parse_parts(a["parts"], mid),
    )


@dataclass(frozen=True, slots=True)
class PartsIn:
    message_id: str
    session_id: str
    parts: tuple[PartIn, ...]


def _parse_more_parts(a: Args) -> PartsIn:
    _fields(a, "import_parts", ("message_id", "session_id", "parts"))
    mid = check_id(a["message_id"], "message_id")
    return PartsIn(mid, check_id(a["session_id"], "session_id"), _parse_parts(a["parts"], mid))


@dataclass(frozen=True, slots=True)
class StateIn:
    session_id: str
    namespace: str
    key: str
    version: int
    updated_at: float
    value: _Payload

    @property
    def what(self) -> str:
        return f"state {self.namespace}/{self.key} of session {self.session_id}"


def _parse_state(a: Args) -> StateIn:
    _fields(a, "import_state", ("session_id", "namespace", "key", "version", "updated_at", "value"))
    sid = check_id(a["session_id"], "session_id")
    ns = check_opt_str(a["namespace"], "namespace", 256)
    key = check_opt_str(a["key"], "key", 1024)
    if ns is None or key is None:
        raise errors.InvalidInput(f"state of session {sid}: namespace and key are strings")
    what = f"state {ns}/{key} of session {sid}"
    value = a["value"]
    if not isinstance(value, dict):
        raise errors.InvalidInput(f"{what}: value must be an encoded payload")
    payload = _payload(value, what)
    if payload.enc not in ("json", "bytes"):
        raise errors.InvalidInput(f"{what}: state values are json or bytes")
    return StateIn(
        sid,
        ns,
        key,
        check_int(a["version"], f"{what}: version", minimum=1),
        check_time(a["updated_at"], f"{what}: updated_at"),
        payload,
    )


def blob_refs(parsed: object) -> list[tuple[str, int, int]]:
    if isinstance(parsed, MessageIn | PartsIn):
        return [p.payload.blob for p in parsed.parts if p.payload and p.payload.blob]
    if isinstance(parsed, StateIn) and parsed.value.blob:
        return [parsed.value.blob]
    return []


PARSERS: dict[str, Callable[[Args], Any]] = {
    "import_session": _parse_session,
    "import_message": _parse_message,
    "import_parts": _parse_more_parts,
    "import_state": _parse_state,
}


# -- applying: compare with what the store holds, then write (or, dry, only compare) ---------


def _apply_session(tx: Tx, q: Queries, s: SessionIn, write: bool) -> str:
    rows = tx.execute(q["session_get"], (s.id,))
    if not rows:
        if s.parent_id is not None:
            parent = tx.execute(q["transfer_session_root"], (s.parent_id,))
            if not parent:
                if not write:
                    return MISSING_PARENT
                raise errors.NotFound(
                    f"session {s.id}: its parent {s.parent_id} is not in the store"
                )
            if parent[0][0] != s.root_id:
                raise errors.AlreadyExists(
                    f"session {s.id}: its root_id is {s.root_id}, but its parent "
                    f"{s.parent_id} is in the tree of {parent[0][0]} in the store"
                )
        if write:
            tx.execute(q["transfer_session_insert"], s.row())
        return INSERTED
    # session_get: id, root_id, parent_id, forked_from, fork_seq, project, title, status,
    # metadata, created_at, updated_at, archived_at, version
    r = rows[0]
    fixed = {
        "parent_id": (r[2], s.parent_id),
        "root_id": (r[1], s.root_id),
        "forked_from": (r[3], s.forked_from),
        "fork_seq": (r[4], s.fork_seq),
        "project": (r[5], s.project),
        "created_at": (r[9], s.created_at),
    }
    differ = [k for k, (here, there) in fixed.items() if here != there]
    if differ:
        raise errors.AlreadyExists(
            f"session {s.id} is in the store with a different {', '.join(differ)}"
        )
    version, updated = r[12], r[10]
    if s.version < version:
        return NEWER
    same = (r[6], json.loads(r[8]), r[7], r[11]) == (
        s.title,
        json.loads(s.metadata),
        s.status,
        s.archived_at,
    )
    if s.version == version:
        if not same:
            raise errors.AlreadyExists(
                f"session {s.id} is at version {version} in the store and in the file, "
                "with a different title, metadata or status"
            )
        if s.updated_at == updated:
            return UNCHANGED
        if s.updated_at < updated:
            return NEWER
    if write:
        tx.execute(
            q["transfer_session_update"],
            (
                s.title,
                s.metadata,
                s.status,
                s.archived_at,
                max(s.updated_at, updated),
                s.version,
                s.id,
            ),
        )
    return UPDATED


def _apply_part(
    tx: Tx, q: Queries, message_id: str, session_id: str, p: PartIn, write: bool, now: float
) -> bool:
    """Insert the part (or its missing chunks); True if anything was (or would be) written."""
    what = f"part {p.seq} of message {message_id}"
    rows = tx.execute(q["transfer_part_row"], (message_id, p.seq))
    if not rows:
        if write:
            if p.chunks is not None:
                tx.execute(
                    q["transfer_part_insert_chunked"],
                    (message_id, p.seq, session_id, p.kind, p.meta),
                )
                tx.executemany(
                    q["chunk_insert"], [(message_id, p.seq, s, text) for s, text in p.chunks]
                )
            else:
                assert p.payload is not None
                enc, body, sha, size = encoded_body(tx, q, p.payload.item, what, now)
                tx.execute(
                    q["part_insert"],
                    (message_id, p.seq, session_id, p.kind, p.meta, enc, body, sha, size),
                )
        return True
    kind, meta, enc, body, sha, size = rows[0]
    if kind != p.kind or json.loads(meta) != json.loads(p.meta):
        raise errors.AlreadyExists(f"{what} has another kind or metadata in the store")
    if p.chunks is not None:
        if enc != "chunks":
            raise errors.AlreadyExists(f"{what} is stored whole in the store, streamed in the file")
        wrote = False
        for s, chunk in p.chunks:
            have = tx.execute(q["transfer_chunk_text"], (message_id, p.seq, s))
            if not have:
                if write:
                    tx.execute(q["chunk_insert"], (message_id, p.seq, s, chunk))
                wrote = True
            elif have[0][0] != chunk:
                raise errors.AlreadyExists(f"{what}: chunk {s} differs in the store")
        return wrote
    assert p.payload is not None
    text = None
    if enc == "chunks":
        text = tx.execute(q["transfer_part_text"], (message_id, p.seq))[0][0]
    if value_key(enc, body, sha, size, text) != p.payload.key:
        raise errors.AlreadyExists(f"{what} has other contents in the store")
    return False


def _apply_message(tx: Tx, q: Queries, m: MessageIn, write: bool, now: float) -> str:
    rows = tx.execute(q["transfer_message_row"], (m.id,))
    if not rows:
        if tx.execute(q["transfer_session_root"], (m.session_id,)):
            holder = tx.execute(q["transfer_message_at_seq"], (m.session_id, m.seq))
            if holder:
                raise errors.AlreadyExists(
                    f"message {m.id}: session {m.session_id} already has another message "
                    f"({holder[0][0]}) at seq {m.seq} in the store"
                )
        elif write:
            raise errors.NotFound(f"message {m.id}: no session {m.session_id} in the store")
        if write:
            tx.execute(
                q["transfer_message_insert"],
                (
                    m.id,
                    m.session_id,
                    m.seq,
                    m.role,
                    m.status,
                    m.model,
                    m.metadata,
                    m.error,
                    m.created_at,
                    m.completed_at,
                ),
            )
            for p in m.parts:
                _apply_part(tx, q, m.id, m.session_id, p, write, now)
            _write_usage(tx, q, m)
        return INSERTED
    # transfer_message_row: session_id, seq, role, status, model, metadata, error,
    # created_at, completed_at
    r = rows[0]
    fixed = {
        "session": (r[0], m.session_id),
        "seq": (r[1], m.seq),
        "role": (r[2], m.role),
        "model": (r[4], m.model),
        "metadata": (json.loads(r[5]), json.loads(m.metadata)),
        "created_at": (r[7], m.created_at),
    }
    differ = [k for k, (here, there) in fixed.items() if here != there]
    if differ:
        raise errors.AlreadyExists(
            f"message {m.id} is in the store with a different {', '.join(differ)}"
        )
    status = r[3]
    if (status, r[6], r[8]) == (m.status, m.error, m.completed_at):
        stage = UNCHANGED
    elif status == "streaming" and m.status != "streaming":
        stage = UPDATED  # it was still being written when it reached the store; it ended since
    elif status != "streaming" and m.status == "streaming":
        stage = NEWER
    else:
        raise errors.AlreadyExists(
            f"message {m.id} ended {status} in the store but {m.status} in the file"
        )
    changed = False
    for p in m.parts:
        changed = _apply_part(tx, q, m.id, m.session_id, p, write, now) or changed
    here = tx.execute(q["transfer_usage_row"], (m.id,))
    if m.usage is not None and (not here or tuple(here[0]) != m.usage):
        if here and stage != UPDATED:
            raise errors.AlreadyExists(f"message {m.id} has another usage in the store")
        changed = True
        if write:
            _write_usage(tx, q, m)
    if stage == UPDATED and write:
        tx.execute(q["transfer_message_finish"], (m.status, m.error, m.completed_at, m.id))
    if stage == UNCHANGED and changed:
        if write and status != "streaming":
            requeue(tx, q, m.id, float(r[7]))  # parts added to a finished message
        return UPDATED
    return stage


def _write_usage(tx: Tx, q: Queries, m: MessageIn) -> None:
    if m.usage is not None:
        tx.execute(q["usage_upsert"], (m.id, m.session_id, m.model, *m.usage))


def _apply_parts(tx: Tx, q: Queries, ps: PartsIn, write: bool, now: float) -> str:
    rows = tx.execute(q["transfer_message_row"], (ps.message_id,))
    if not rows:
        if write:
            raise errors.NotFound(f"no message {ps.message_id} in the store for its parts")
        return INSERTED
    if rows[0][0] != ps.session_id:
        raise errors.AlreadyExists(f"message {ps.message_id} is in another session in the store")
    changed = False
    for p in ps.parts:
        changed = _apply_part(tx, q, ps.message_id, ps.session_id, p, write, now) or changed
    if changed and write and rows[0][3] != "streaming":
        # A finished message's later parts: no trigger sees them (one on every part
        # insert cost the write path a lookup a part), so the message is queued here.
        requeue(tx, q, ps.message_id, float(rows[0][7]))
    return UPDATED if changed else UNCHANGED


def _apply_state(tx: Tx, q: Queries, s: StateIn, write: bool, now: float) -> str:
    rows = tx.execute(q["state_get"], (s.session_id, s.namespace, s.key))
    if rows:
        version, enc, body, sha, size, updated = rows[0]
        if s.version < version:
            return NEWER
        if s.version == version:
            if value_key(enc, body, sha, size) == s.value.key and updated == s.updated_at:
                return UNCHANGED
            raise errors.AlreadyExists(
                f"{s.what} is at version {version} in the store and in the file, with another value"
            )
    elif not tx.execute(q["transfer_session_root"], (s.session_id,)) and write:
        raise errors.NotFound(f"{s.what}: no such session in the store")
    if write:
        enc, body, sha, size = encoded_body(tx, q, s.value.item, s.what, now)
        tx.execute(
            q["state_upsert"],
            (s.session_id, s.namespace, s.key, s.version, enc, body, sha, size, s.updated_at),
        )
    return UPDATED if rows else INSERTED


def _now(a: Args) -> float:
    return check_time(a.get("now", 0.0), "now")


def run_import(tx: Tx, q: Queries, name: str, parsed: Any, write: bool, now: float) -> str:
    if name == "import_session":
        return _apply_session(tx, q, parsed, write)
    if name == "import_message":
        return _apply_message(tx, q, parsed, write, now)
    if name == "import_parts":
        return _apply_parts(tx, q, parsed, write, now)
    return _apply_state(tx, q, parsed, write, now)


def _declared(name: str) -> None:
    def apply(tx: Tx, q: Queries, a: Args) -> Result:
        return {"action": run_import(tx, q, name, PARSERS[name](a), True, _now(a))}

    apply.__name__ = apply.__qualname__ = f"_{name}"
    # Idempotent by content (see the module docstring), so not logged in applied_ops:
    # importing a file twice leaves every table as it was.
    if name == "import_session":
        declare = OPERATIONS.declare(
            name, scope=Scope.TREE, logged=False, session_args=("parent_id", "id"), creates="id"
        )
    else:
        declare = OPERATIONS.declare(name, scope=Scope.SESSION, logged=False)
    declare(apply)


for _name in IMPORT_OPS:
    _declared(_name)
