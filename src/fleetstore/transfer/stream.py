"""Export, import and merge: whole stores moved as streams of operations.

An export file is zstd-compressed JSON lines (one record a line)::

    {"format": "fleetstore-export", "version": 1, ...}                header
    {"blob": SHA, "size": N, "stored_size": M, "offset": O, "data": B64}  a piece of a blob
    {"op": "import_session", "id": OP_ID, "args": {...}}              an operation
    ...
    {"end": {"records": R, "blobs": B, "ops": K, "sha256": HEX}}      trailer

A blob's pieces (its zstd bytes as stored, at most 1 MiB a piece) come before the
first operation that refers to it; a session comes before its subagents, messages
and state.  The trailer counts the records and hashes every line before it, so a
truncated or edited file is detected.

Importing reads the file twice.  The first pass checks everything and writes
nothing: each line parses and is at most ``max_line`` bytes, the header's version
is known, every operation is an import operation with valid arguments, every blob
decompresses to its size and hash, every reference names a blob, session or
message earlier in the file, the trailer matches, and no record contradicts what
the store already holds.  Only then the second pass writes the blobs (files,
before any transaction) and applies the operations through ``Store.apply``, one
short transaction each.

The import operations carry whole rows (every column, the parts, the streamed
chunks, the usage), so a store round-trips exactly, and each is idempotent by
content: an object absent from the store is inserted; present and equal, nothing
happens; present at an earlier stage (a session at a lower version, a message
still streaming, state at a lower version) it is brought forward; present at a
later stage it is left alone (reported as ``newer``); anything else is a conflict
(``AlreadyExists``) naming the object.  Importing a file twice changes nothing.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import io
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import zstandard

from fleetstore import errors
from fleetstore.core.ids import is_valid_id, new_id
from fleetstore.domain.blobs import check_sha
from fleetstore.domain.operations import (
    MAX_TEXT,
    Args,
    Operation,
    Queries,
    Result,
    dump_json,
    encoded_body,
    register,
)
from fleetstore.engine.base import Tx
from fleetstore.models import PART_KINDS, STREAMED_KINDS, USAGE_FIELDS

if TYPE_CHECKING:
    from fleetstore.store.facade import Store

FORMAT = "fleetstore-export"
VERSION = 1
#: Longest line an import accepts (a hostile file cannot make it hold more).
MAX_LINE = 64 * 1024 * 1024
#: Most decompressed bytes an import reads from one file.
MAX_TOTAL = 1 << 40
#: Operations an export file may carry; any other is rejected.
IMPORT_OPS = ("import_session", "import_message", "import_parts", "import_state")

_BLOB_PIECE = 1024 * 1024
_RECORD_BUDGET = 4 * 1024 * 1024  # an exported record is split beyond this
_INLINE_LIMIT = 1024 * 1024  # larger inline payloads are exported as blobs
_CHUNK_LIMIT = 8 * 1024 * 1024  # a streamed part with a larger chunk is exported whole
_PAGE = 200  # messages read per read transaction
_CHECK_BATCH = 256  # operations checked against the store per read transaction
_WINDOW = 1 << 27  # largest zstd window accepted (128 MiB, zstd's own default)
_INT_MAX = 2**63 - 1  # SQLite's integers

INSERTED, UPDATED, UNCHANGED, NEWER = "inserted", "updated", "unchanged", "newer"
_MISSING_PARENT = "missing parent"

#: ``progress(stage, done, total)``; stages: export, check, import.
Progress = Callable[[str, int, int], None]


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionDigest:
    """A session's message count and a SHA-256 over its whole content (row,
    messages with parts and usage, state), independent of how payloads are
    stored (inline, blob or streamed chunks)."""

    messages: int
    sha256: str


@dataclass(frozen=True, slots=True)
class ExportSummary:
    path: str
    sessions: int
    messages: int
    states: int
    blobs: int
    blob_bytes: int
    file_bytes: int
    #: session id -> its digest as exported (what a merge verifies against).
    digests: Mapping[str, SessionDigest] = field(repr=False)
    blob_shas: frozenset[str] = field(repr=False)
    #: True when every session of the store was asked for.
    whole_store: bool = True


@dataclass(frozen=True, slots=True)
class ImportSummary:
    path: str
    sessions: int
    messages: int
    states: int
    blobs: int
    blob_bytes: int
    #: Blob files that were not in the store yet.
    new_blobs: int
    #: Sessions, messages and state values: new / brought forward / already
    #: there and equal / already there at a later stage (left as they were).
    inserted: int
    updated: int
    unchanged: int
    newer: int


@dataclass(frozen=True, slots=True)
class SourceResult:
    source: str
    exported: ExportSummary
    imported: ImportSummary


@dataclass(frozen=True, slots=True)
class MergeReport:
    dest: str
    sources: tuple[SourceResult, ...]
    #: What verification found; empty when the merge is verified.
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def sessions(self) -> int:
        return sum(s.exported.sessions for s in self.sources)

    @property
    def messages(self) -> int:
        return sum(s.exported.messages for s in self.sources)

    @property
    def blobs(self) -> int:
        return len(frozenset().union(*(s.exported.blob_shas for s in self.sources)))

    @property
    def blob_bytes(self) -> int:
        return sum(s.exported.blob_bytes for s in self.sources)


# -- argument checks (pure: used on every line of a file before anything is written) ----------


def _fields(a: Args, what: str, required: Sequence[str], optional: Sequence[str] = ()) -> None:
    unknown = set(a) - set(required) - set(optional) - {"now"}
    if unknown:
        raise errors.InvalidInput(f"{what}: unknown field(s) {sorted(map(str, unknown))!r:.200}")
    missing = [k for k in required if k not in a]
    if missing:
        raise errors.InvalidInput(f"{what}: missing field(s) {', '.join(missing)}")


def _id(value: object, what: str) -> str:
    if not is_valid_id(value):
        raise errors.InvalidInput(f"{what} must be an id, not {str(value)[:80]!r}")
    return str(value)


def _opt_id(value: object, what: str) -> str | None:
    return None if value is None else _id(value, what)


def _text(value: object, what: str, limit: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise errors.InvalidInput(f"{what} must be a string of at most {limit} characters")
    return value


def _int(value: object, what: str, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= _INT_MAX:
        raise errors.InvalidInput(
            f"{what} must be an integer from {minimum} to 2**63-1, not {str(value)[:80]}"
        )
    return value


def _time(value: object, what: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise errors.InvalidInput(f"{what} must be a time in seconds, not {str(value)[:80]}")
    return float(value)


def _object(value: object, what: str) -> str:
    if not isinstance(value, dict):
        raise errors.InvalidInput(f"{what} must be a JSON object")
    return dump_json(value, what)


class _DryTx:
    """A transaction that runs nothing: lets ``encoded_body`` check a payload
    without a database, so file checks and writes share one code path."""

    def execute(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        return []

    def executemany(self, sql: str, seq_of_params: Iterable[Any]) -> None:
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


def _value_key(
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
class _SessionIn:
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


_SESSION_FIELDS = (
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


def _parse_session(a: Args) -> _SessionIn:
    _fields(a, "import_session", _SESSION_FIELDS)
    sid = _id(a["id"], "id")
    what = f"session {sid}"
    parent = _opt_id(a["parent_id"], f"{what}: parent_id")
    root = _id(a["root_id"], f"{what}: root_id")
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
    return _SessionIn(
        id=sid,
        parent_id=parent,
        root_id=root,
        forked_from=_opt_id(a["forked_from"], f"{what}: forked_from"),
        fork_seq=None if fork_seq is None else _int(fork_seq, f"{what}: fork_seq"),
        project=_text(a["project"], f"{what}: project", 4096),
        title=_text(a["title"], f"{what}: title", 4096),
        status=status,
        metadata=_object(a["metadata"], f"{what}: metadata"),
        created_at=_time(a["created_at"], f"{what}: created_at"),
        updated_at=_time(a["updated_at"], f"{what}: updated_at"),
        archived_at=None if archived_at is None else _time(archived_at, f"{what}: archived_at"),
        version=_int(a["version"], f"{what}: version", 1),
    )


@dataclass(frozen=True, slots=True)
class _PartIn:
    seq: int
    kind: str
    meta: str
    payload: _Payload | None  # a whole part
    chunks: tuple[tuple[int, str], ...] | None  # a streamed part (or a slice of its chunks)


def _parse_part(p: object, message_id: str) -> _PartIn:
    if not isinstance(p, dict):
        raise errors.InvalidInput(f"message {message_id}: a part must be an object")
    seq = _int(p.get("seq"), f"message {message_id}: part seq")
    what = f"part {seq} of message {message_id}"
    kind = p.get("kind")
    if kind not in PART_KINDS:
        raise errors.InvalidInput(f"{what}: unknown part kind {str(kind)[:40]!r}")
    meta = _object(p.get("meta"), f"{what}: meta")
    if p.get("enc") != "chunks":
        return _PartIn(seq, kind, meta, _payload(p, what, ("seq", "kind", "meta")), None)
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
        text = _text(c[1], f"{what}: chunk text", MAX_TEXT)
        if text is None:
            raise errors.InvalidInput(f"{what}: a chunk's text must be a string")
        chunks.append((_int(c[0], f"{what}: chunk seq"), text))
    if len({s for s, _ in chunks}) != len(chunks):
        raise errors.InvalidInput(f"{what}: a chunk seq appears twice")
    return _PartIn(seq, kind, meta, None, tuple(chunks))


def _parse_parts(raw: object, message_id: str) -> tuple[_PartIn, ...]:
    if not isinstance(raw, list):
        raise errors.InvalidInput(f"message {message_id}: parts must be a list")
    return tuple(_parse_part(p, message_id) for p in raw)


def _parse_usage(raw: object, what: str) -> tuple[Any, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != set(USAGE_FIELDS):
        raise errors.InvalidInput(f"{what}: usage has exactly the fields {', '.join(USAGE_FIELDS)}")
    counts = [_int(raw[f], f"{what}: usage {f}") for f in USAGE_FIELDS[:-1]]
    cost = raw["cost"]
    if not isinstance(cost, int | float) or isinstance(cost, bool) or not math.isfinite(cost):
        raise errors.InvalidInput(f"{what}: usage cost must be a number")
    if cost < 0:
        raise errors.InvalidInput(f"{what}: usage cost must be >= 0")
    return (*counts, float(cost))


@dataclass(frozen=True, slots=True)
class _MessageIn:
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
    parts: tuple[_PartIn, ...]


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


def _parse_message(a: Args) -> _MessageIn:
    _fields(a, "import_message", _MESSAGE_FIELDS)
    mid = _id(a["id"], "id")
    what = f"message {mid}"
    role = _text(a["role"], f"{what}: role", 64)
    if not role:
        raise errors.InvalidInput(f"{what}: role must be a non-empty string")
    status = a["status"]
    if status not in ("streaming", "complete", "error"):
        raise errors.InvalidInput(f"{what}: status must be streaming, complete or error")
    completed = a["completed_at"]
    return _MessageIn(
        id=mid,
        session_id=_id(a["session_id"], f"{what}: session_id"),
        seq=_int(a["seq"], f"{what}: seq", 1),
        role=role,
        status=status,
        model=_text(a["model"], f"{what}: model", 256),
        metadata=_object(a["metadata"], f"{what}: metadata"),
        error=_text(a["error"], f"{what}: error", 64 * 1024),
        created_at=_time(a["created_at"], f"{what}: created_at"),
        completed_at=None if completed is None else _time(completed, f"{what}: completed_at"),
        usage=_parse_usage(a["usage"], what),
        parts=_parse_parts(a["parts"], mid),
    )


@dataclass(frozen=True, slots=True)
class _PartsIn:
    message_id: str
    session_id: str
    parts: tuple[_PartIn, ...]


def _parse_more_parts(a: Args) -> _PartsIn:
    _fields(a, "import_parts", ("message_id", "session_id", "parts"))
    mid = _id(a["message_id"], "message_id")
    return _PartsIn(mid, _id(a["session_id"], "session_id"), _parse_parts(a["parts"], mid))


@dataclass(frozen=True, slots=True)
class _StateIn:
    session_id: str
    namespace: str
    key: str
    version: int
    updated_at: float
    value: _Payload

    @property
    def what(self) -> str:
        return f"state {self.namespace}/{self.key} of session {self.session_id}"


def _parse_state(a: Args) -> _StateIn:
    _fields(a, "import_state", ("session_id", "namespace", "key", "version", "updated_at", "value"))
    sid = _id(a["session_id"], "session_id")
    ns = _text(a["namespace"], "namespace", 256)
    key = _text(a["key"], "key", 1024)
    if ns is None or key is None:
        raise errors.InvalidInput(f"state of session {sid}: namespace and key are strings")
    what = f"state {ns}/{key} of session {sid}"
    value = a["value"]
    if not isinstance(value, dict):
        raise errors.InvalidInput(f"{what}: value must be an encoded payload")
    payload = _payload(value, what)
    if payload.enc not in ("json", "bytes"):
        raise errors.InvalidInput(f"{what}: state values are json or bytes")
    return _StateIn(
        sid,
        ns,
        key,
        _int(a["version"], f"{what}: version", 1),
        _time(a["updated_at"], f"{what}: updated_at"),
        payload,
    )


def _blob_refs(parsed: object) -> list[tuple[str, int, int]]:
    if isinstance(parsed, _MessageIn | _PartsIn):
        return [p.payload.blob for p in parsed.parts if p.payload and p.payload.blob]
    if isinstance(parsed, _StateIn) and parsed.value.blob:
        return [parsed.value.blob]
    return []


_PARSERS: dict[str, Callable[[Args], Any]] = {
    "import_session": _parse_session,
    "import_message": _parse_message,
    "import_parts": _parse_more_parts,
    "import_state": _parse_state,
}


# -- applying: compare with what the store holds, then write (or, dry, only compare) ---------


def _apply_session(tx: Tx, q: Queries, s: _SessionIn, write: bool) -> str:
    rows = tx.execute(q["session_get"], (s.id,))
    if not rows:
        if s.parent_id is not None:
            parent = tx.execute(q["transfer_session_root"], (s.parent_id,))
            if not parent:
                if not write:
                    return _MISSING_PARENT
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
    tx: Tx, q: Queries, message_id: str, session_id: str, p: _PartIn, write: bool, now: float
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
    if _value_key(enc, body, sha, size, text) != p.payload.key:
        raise errors.AlreadyExists(f"{what} has other contents in the store")
    return False


def _apply_message(tx: Tx, q: Queries, m: _MessageIn, write: bool, now: float) -> str:
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
        return UPDATED
    return stage


def _write_usage(tx: Tx, q: Queries, m: _MessageIn) -> None:
    if m.usage is not None:
        tx.execute(q["usage_upsert"], (m.id, m.session_id, m.model, *m.usage))


def _apply_parts(tx: Tx, q: Queries, ps: _PartsIn, write: bool, now: float) -> str:
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
    return UPDATED if changed else UNCHANGED


def _apply_state(tx: Tx, q: Queries, s: _StateIn, write: bool, now: float) -> str:
    rows = tx.execute(q["state_get"], (s.session_id, s.namespace, s.key))
    if rows:
        version, enc, body, sha, size, updated = rows[0]
        if s.version < version:
            return NEWER
        if s.version == version:
            if _value_key(enc, body, sha, size) == s.value.key and updated == s.updated_at:
                return UNCHANGED
            raise errors.AlreadyExists(
                f"{s.what} is at version {version} in the store and in the file, with another value"
            )
    elif not tx.execute(q["transfer_session_root"], (s.session_id,)) and write:
        raise errors.NotFound(f"{s.what}: no such session in the store")
    if write:
        enc, body, sha, size = encoded_body(tx, q, s.value.item, s.what, now)
        tx.execute(
            q["transfer_state_write"],
            (s.session_id, s.namespace, s.key, s.version, enc, body, sha, size, s.updated_at),
        )
    return UPDATED if rows else INSERTED


def _now(a: Args) -> float:
    return _time(a.get("now", 0.0), "now")


def _run(tx: Tx, q: Queries, name: str, parsed: Any, write: bool, now: float) -> str:
    if name == "import_session":
        return _apply_session(tx, q, parsed, write)
    if name == "import_message":
        return _apply_message(tx, q, parsed, write, now)
    if name == "import_parts":
        return _apply_parts(tx, q, parsed, write, now)
    return _apply_state(tx, q, parsed, write, now)


def _register(name: str) -> None:
    def apply(tx: Tx, q: Queries, a: Args) -> Result:
        return {"action": _run(tx, q, name, _PARSERS[name](a), True, _now(a))}

    apply.__name__ = apply.__qualname__ = f"_{name}"
    # Idempotent by content (see the module docstring), so not logged in applied_ops:
    # importing a file twice leaves every table as it was.
    register(name, logged=False)(apply)


for _name in IMPORT_OPS:
    _register(_name)


# -- reading a store -------------------------------------------------------------------------


@dataclass(slots=True)
class _PartRow:
    seq: int
    kind: str
    meta: str
    enc: str
    body: Any
    blob_sha: str | None
    size: int
    chunks: list[tuple[int, str]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(t for _, t in self.chunks)

    def value_key(self) -> tuple[str, str, int]:
        return _value_key(self.enc, self.body, self.blob_sha, self.size, self.text)


@dataclass(slots=True)
class _MessageRow:
    row: tuple[Any, ...]  # message_list: id, session_id, seq, role, status, model, metadata,
    # error, created_at, completed_at
    parts: list[_PartRow]
    usage: tuple[Any, ...] | None


_StateRow = tuple[Any, ...]  # namespace, key, version, enc, value, blob_sha, size, updated_at


def _read_messages(tx: Tx, q: Queries, sid: str, after: int, limit: int) -> list[_MessageRow]:
    rows = tx.execute(q["message_list"], {"session_id": sid, "after": after, "limit": limit})
    if not rows:
        return []
    ids = json.dumps([r[0] for r in rows])
    parts: dict[str, list[_PartRow]] = {r[0]: [] for r in rows}
    index: dict[tuple[str, int], _PartRow] = {}
    for mid, seq, kind, meta, enc, body, sha, size in tx.execute(q["transfer_parts"], (ids,)):
        part = _PartRow(seq, kind, meta, enc, body, sha, size)
        parts[mid].append(part)
        index[(mid, seq)] = part
    for mid, part_seq, seq, text in tx.execute(q["transfer_chunks"], (ids,)):
        owner = index.get((mid, part_seq))
        if owner is not None:
            owner.chunks.append((seq, text))
    usage = {u[0]: tuple(u[1:]) for u in tx.execute(q["usage_of_messages"], (ids,))}
    return [_MessageRow(tuple(r), parts[r[0]], usage.get(r[0])) for r in rows]


def _messages(store: Store, sid: str) -> Iterator[_MessageRow]:
    """A session's messages in order, a page per read transaction (a long read
    would pin the WAL; DESIGN.md, checkpoint starvation)."""
    q = store.queries
    after = 0
    while True:
        page = store.read(
            functools.partial(_read_messages, q=q, sid=sid, after=after, limit=_PAGE),
            session_id=sid,
        )
        yield from page
        if len(page) < _PAGE:
            return
        after = page[-1].row[2]


def _state_rows(store: Store, sid: str) -> list[_StateRow]:
    q = store.queries
    return [
        tuple(r)
        for r in store.read(
            lambda tx: tx.execute(q["transfer_state_of_session"], (sid,)), session_id=sid
        )
    ]


def _session_row(store: Store, sid: str) -> tuple[Any, ...] | None:
    q = store.queries
    rows = store.read(lambda tx: tx.execute(q["session_get"], (sid,)), session_id=sid)
    return tuple(rows[0]) if rows else None


def _canon(text: str) -> Any:
    return json.loads(text)


class _Digest:
    """SHA-256 over a session's content in a canonical form (see SessionDigest)."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self.messages = 0

    def _add(self, item: list[Any]) -> None:
        line = json.dumps(item, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        self._sha.update(line.encode("utf-8") + b"\n")

    def session(self, r: tuple[Any, ...]) -> None:
        self._add(["session", *r[:8], _canon(r[8]), *r[9:]])

    def message(self, m: _MessageRow) -> None:
        self.messages += 1
        r = m.row
        parts = [[p.seq, p.kind, _canon(p.meta), *p.value_key()] for p in m.parts]
        usage = list(m.usage) if m.usage is not None else None
        self._add(["message", *r[:6], _canon(r[6]), *r[7:], usage, parts])

    def state(self, s: _StateRow) -> None:
        ns, key, version, enc, body, sha, size, updated = s
        self._add(["state", ns, key, version, *_value_key(enc, body, sha, size), updated])

    def result(self) -> SessionDigest:
        return SessionDigest(self.messages, self._sha.hexdigest())


def session_digest(store: Store, session_id: str) -> SessionDigest | None:
    """The session's message count and content hash (None if there is no such session)."""
    row = _session_row(store, session_id)
    if row is None:
        return None
    digest = _Digest()
    digest.session(row)
    for m in _messages(store, session_id):
        digest.message(m)
    for s in _state_rows(store, session_id):
        digest.state(s)
    return digest.result()


def _session_order(store: Store, session_ids: Sequence[str] | None) -> list[str]:
    """The sessions to export, parents before their subagents."""
    q = store.queries
    store.sync_catalog()
    rows = store.read(lambda tx: tx.execute(q["transfer_session_tree"]))
    children: dict[str | None, list[str]] = {}
    known = set()
    for sid, parent in rows:
        children.setdefault(parent, []).append(sid)
        known.add(sid)
    if session_ids is None:
        roots = list(children.get(None, []))
    else:
        roots = []
        for sid in session_ids:
            if sid not in known:
                raise errors.NotFound(f"no session {sid!r} to export")
            roots.append(sid)
    order: list[str] = []
    seen: set[str] = set()
    for root in roots:
        stack = [root]
        while stack:
            sid = stack.pop()
            if sid in seen:
                continue
            seen.add(sid)
            order.append(sid)
            stack.extend(reversed(children.get(sid, [])))
    return order


# -- writing an export file ------------------------------------------------------------------


def _dumps(obj: object) -> bytes:
    return (
        json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"
    ).encode("utf-8")


class _Counting:
    """The file an export goes to, counting the bytes written."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.written = 0

    def write(self, data: Any) -> int:
        self._raw.write(data)
        size = len(data)
        self.written += size
        return size


class _Writer:
    def __init__(self, raw: IO[bytes]) -> None:
        self.out = _Counting(raw)
        self._z = zstandard.ZstdCompressor(level=3).stream_writer(
            cast(IO[bytes], self.out), closefd=False
        )
        self._sha = hashlib.sha256()
        self.records = self.blobs = self.ops = 0
        self.blob_bytes = 0
        self.stored: dict[str, int] = {}  # blobs written: sha -> stored size

    def _line(self, obj: object, hashed: bool = True) -> None:
        data = _dumps(obj)
        if len(data) > MAX_LINE:
            raise errors.InvalidInput(
                f"a record of {len(data):,} bytes is over the export line limit ({MAX_LINE:,})"
            )
        if hashed:
            self._sha.update(data)
        self._z.write(data)

    def header(self, info: Mapping[str, Any]) -> None:
        self._line({"format": FORMAT, "version": VERSION, **info})

    def blob(self, sha: str, size: int, packed: bytes) -> None:
        for offset in range(0, len(packed), _BLOB_PIECE):
            piece = base64.b64encode(packed[offset : offset + _BLOB_PIECE]).decode("ascii")
            self._line(
                {
                    "blob": sha,
                    "size": size,
                    "stored_size": len(packed),
                    "offset": offset,
                    "data": piece,
                }
            )
            self.records += 1
        self.stored[sha] = len(packed)
        self.blobs += 1
        self.blob_bytes += size

    def op(self, name: str, args: Mapping[str, Any]) -> None:
        self._line(Operation(name, args, new_id()).to_json())
        self.records += 1
        self.ops += 1

    def close(self) -> None:
        end = {
            "records": self.records,
            "blobs": self.blobs,
            "ops": self.ops,
            "sha256": self._sha.hexdigest(),
        }
        self._line({"end": end}, hashed=False)
        self._z.flush(zstandard.FLUSH_FRAME)


def _check_packed(packed: IO[bytes], sha: str, size: int) -> str | None:
    """None if *packed* (zstd) decompresses to *size* bytes hashing to *sha*, else
    what is wrong.  Streams: a hostile blob cannot make it hold more than 1 MiB."""
    packed.seek(0)
    digest = hashlib.sha256()
    seen = 0
    try:
        dctx = zstandard.ZstdDecompressor(max_window_size=_WINDOW)
        with dctx.stream_reader(packed, closefd=False) as reader:
            while chunk := reader.read(1 << 20):
                seen += len(chunk)
                if seen > size:
                    return f"decompresses to more than its size ({size:,} bytes)"
                digest.update(chunk)
    except zstandard.ZstdError as exc:
        return f"not valid zstd data ({exc})"
    if seen != size:
        return f"decompresses to {seen:,} bytes, not its size {size:,}"
    if digest.hexdigest() != sha:
        return "its bytes do not match its hash"
    return None


class _Exporter:
    def __init__(self, store: Store, writer: _Writer) -> None:
        self.store = store
        self.w = writer
        self.messages = 0
        self.states = 0

    def stored_blob(self, sha: str, size: int, owner: str) -> dict[str, Any]:
        if sha not in self.w.stored:
            packed = self.store.blobs.read_stored(sha)
            problem = _check_packed(io.BytesIO(packed), sha, size)
            if problem:
                raise errors.BlobCorrupt(
                    f"blob {sha} of {owner}: {problem} ({self.store.blobs.describe(sha)}); not exported"
                )
            self.w.blob(sha, size, packed)
        return {"sha256": sha, "size": size, "stored_size": self.w.stored[sha]}

    def payload(
        self, enc: str, body: Any, blob_sha: str | None, size: int, owner: str
    ) -> dict[str, Any]:
        """The encoded payload (history.encode_payload's format) of a stored value."""
        if blob_sha is not None:
            return {"enc": enc, "blob": self.stored_blob(blob_sha, size, owner)}
        if body is None:
            body = b"" if enc == "bytes" else ""
        raw = bytes(body) if enc == "bytes" else str(body).encode("utf-8")
        if len(raw) > _INLINE_LIMIT:
            # Kept out of the record so that no line needs to be long.
            sha = hashlib.sha256(raw).hexdigest()
            if sha not in self.w.stored:
                packed = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(raw)
                self.w.blob(sha, len(raw), packed)
            return {
                "enc": enc,
                "blob": {"sha256": sha, "size": len(raw), "stored_size": self.w.stored[sha]},
            }
        if enc == "bytes":
            return {"enc": enc, "body": base64.b64encode(raw).decode("ascii")}
        return {"enc": enc, "body": str(body)}

    def part_items(self, p: _PartRow, mid: str) -> list[dict[str, Any]]:
        head = {"seq": p.seq, "kind": p.kind, "meta": json.loads(p.meta)}
        owner = f"part {p.seq} of message {mid}"
        if p.enc != "chunks":
            return [{**head, **self.payload(p.enc, p.body, p.blob_sha, p.size, owner)}]
        if any(len(t) > _CHUNK_LIMIT // 4 and len(t.encode()) > _CHUNK_LIMIT for _, t in p.chunks):
            # A huge single chunk cannot fit a line: export the part as one whole text.
            return [{**head, **self.payload("str", p.text, None, 0, owner)}]
        items: list[dict[str, Any]] = []
        batch: list[list[Any]] = []
        used = 0
        for seq, text in p.chunks:
            cost = len(text) + 16
            if batch and used + cost > _RECORD_BUDGET:
                items.append({**head, "enc": "chunks", "chunks": batch})
                batch, used = [], 0
            batch.append([seq, text])
            used += cost
        if batch or not items:
            items.append({**head, "enc": "chunks", "chunks": batch})
        return items

    def message(self, m: _MessageRow) -> None:
        mid, sid, seq, role, status, model, meta, error, created, completed = m.row
        items = [item for p in m.parts for item in self.part_items(p, mid)]
        usage = dict(zip(USAGE_FIELDS, m.usage, strict=True)) if m.usage is not None else None
        args: dict[str, Any] = {
            "id": mid,
            "session_id": sid,
            "seq": seq,
            "role": role,
            "status": status,
            "model": model,
            "metadata": json.loads(meta),
            "error": error,
            "created_at": created,
            "completed_at": completed,
            "usage": usage,
            "parts": [],
        }
        used = len(_dumps(args))
        records: list[list[dict[str, Any]]] = [args["parts"]]
        for item in items:
            cost = len(json.dumps(item, ensure_ascii=False))
            if records[-1] and used + cost > _RECORD_BUDGET:
                records.append([])
                used = 0
            records[-1].append(item)
            used += cost
        self.w.op("import_message", args)
        for more in records[1:]:
            self.w.op("import_parts", {"message_id": mid, "session_id": sid, "parts": more})
        self.messages += 1

    def state(self, sid: str, s: _StateRow) -> None:
        ns, key, version, enc, body, sha, size, updated = s
        value = self.payload(enc, body, sha, size, f"state {ns}/{key} of session {sid}")
        args = {
            "session_id": sid,
            "namespace": ns,
            "key": key,
            "version": version,
            "updated_at": updated,
            "value": value,
        }
        self.w.op("import_state", args)
        self.states += 1

    def session(self, sid: str) -> SessionDigest | None:
        row = _session_row(self.store, sid)
        if row is None:
            return None  # deleted since the list was read
        digest = _Digest()
        digest.session(row)
        args = dict(zip(_SESSION_FIELDS, _session_columns(row), strict=True))
        args["metadata"] = json.loads(args["metadata"])
        self.w.op("import_session", args)
        for m in _messages(self.store, sid):
            digest.message(m)
            self.message(m)
        for s in _state_rows(self.store, sid):
            digest.state(s)
            self.state(sid, s)
        return digest.result()


def _session_columns(r: tuple[Any, ...]) -> tuple[Any, ...]:
    """session_get's columns (id, root_id, parent_id, ...) in _SESSION_FIELDS' order."""
    return (r[0], r[2], r[1], *r[3:])


def export_store(
    store: Store,
    out: str | os.PathLike[str] | IO[bytes],
    session_ids: Sequence[str] | None = None,
    *,
    progress: Progress | None = None,
) -> ExportSummary:
    """Write the store's sessions (all, or *session_ids* with their subagent trees),
    with their messages, state and blobs, to *out*: a path (written to a temporary
    file and renamed, so a failed export leaves nothing) or a binary file."""
    from fleetstore import __version__

    order = _session_order(store, session_ids)
    if isinstance(out, str | os.PathLike):
        target = Path(out)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            with open(tmp, "wb") as fh:
                summary = _export(
                    store, fh, order, session_ids is None, str(target), progress, __version__
                )
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        return summary
    name = getattr(out, "name", "<stream>")
    return _export(store, out, order, session_ids is None, str(name), progress, __version__)


def _export(
    store: Store,
    raw: IO[bytes],
    order: list[str],
    whole: bool,
    name: str,
    progress: Progress | None,
    version: str,
) -> ExportSummary:
    writer = _Writer(raw)
    writer.header({"fleetstore": version, "sessions": len(order), "source": str(store.path)})
    exporter = _Exporter(store, writer)
    digests: dict[str, SessionDigest] = {}
    for i, sid in enumerate(order):
        digest = exporter.session(sid)
        if digest is not None:
            digests[sid] = digest
        if progress is not None:
            progress("export", i + 1, len(order))
    writer.close()
    return ExportSummary(
        path=name,
        sessions=len(digests),
        messages=exporter.messages,
        states=exporter.states,
        blobs=writer.blobs,
        blob_bytes=writer.blob_bytes,
        file_bytes=writer.out.written,
        digests=digests,
        blob_shas=frozenset(writer.stored),
        whole_store=whole,
    )


# -- reading an export file ------------------------------------------------------------------


@dataclass(slots=True)
class _BlobItem:
    line: int
    sha256: str
    size: int
    data: IO[bytes]  # the stored (zstd) bytes


@dataclass(slots=True)
class _OpItem:
    line: int
    op: Operation
    parsed: Any
    #: import_session whose parent comes earlier in the file (else the store must have it).
    parent_in_file: bool = False


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


class _Reader:
    """Reads an export file and checks it record by record, as it streams: at most
    one line (``max_line`` bytes) and one blob piece are held at a time."""

    def __init__(self, path: Path, max_payload: int, max_line: int, max_total: int) -> None:
        self.path = path
        self.max_payload = max_payload
        self.max_line = max_line
        self.max_total = max_total
        self.file_size = path.stat().st_size
        self.position = 0
        self.sha256 = ""

    def fail(self, line: int, message: str) -> errors.InvalidArchive:
        where = f"line {line}: " if line else ""
        return errors.InvalidArchive(f"{self.path}: {where}{message}")

    def lines(self, raw: IO[bytes]) -> Iterator[tuple[int, bytes]]:
        number = 0
        total = 0
        pending = bytearray()
        dctx = zstandard.ZstdDecompressor(max_window_size=_WINDOW)
        with dctx.stream_reader(
            raw, read_size=1 << 20, read_across_frames=True, closefd=False
        ) as z:
            while True:
                try:
                    data = z.read(1 << 20)
                except zstandard.ZstdError as exc:
                    if number == 0 and not pending:
                        raise self.fail(
                            0, "not a fleetstore export (not zstd-compressed)"
                        ) from None
                    raise self.fail(number + 1, f"damaged compressed data ({exc})") from None
                self.position = raw.tell()
                if not data:
                    break
                total += len(data)
                if total > self.max_total:
                    raise self.fail(
                        number + 1, f"more than {self.max_total:,} bytes once decompressed"
                    )
                start = 0
                while True:
                    end = data.find(b"\n", start)
                    if end < 0:
                        pending += data[start:]
                        if len(pending) > self.max_line:
                            raise self.fail(
                                number + 1, f"longer than the limit of {self.max_line:,} bytes"
                            )
                        break
                    if pending:
                        pending += data[start : end + 1]
                        line = bytes(pending)
                        pending.clear()
                    else:
                        line = data[start : end + 1]
                    number += 1
                    if len(line) > self.max_line:
                        raise self.fail(number, f"longer than the limit of {self.max_line:,} bytes")
                    yield number, line
                    start = end + 1
        if pending:
            raise self.fail(number + 1, "the file ends inside a record: it is truncated")

    def items(self) -> Iterator[_BlobItem | _OpItem]:
        with open(self.path, "rb") as raw:
            yield from self._items(raw)

    def _items(self, raw: IO[bytes]) -> Iterator[_BlobItem | _OpItem]:
        sha = hashlib.sha256()
        blobs: dict[str, tuple[int, int]] = {}
        sessions: dict[str, str] = {}  # id -> root_id
        messages: set[str] = set()
        seqs: set[tuple[str, int]] = set()
        # The parts of the current message: seq -> (kind, meta, chunk seqs or None if whole).
        parts_seen: dict[int, tuple[str, str, set[int] | None]] = {}
        states: set[tuple[str, str, str]] = set()
        last_message: tuple[str, str] | None = None
        piece: tuple[str, int, int] | None = None  # the blob being received: sha, size, stored
        received = 0
        spool: IO[bytes] | None = None
        counts = {"records": 0, "blobs": 0, "ops": 0}
        ended = 0
        n = 0
        try:
            for n, line in self.lines(raw):
                try:
                    obj = json.loads(line, parse_constant=_reject_constant)
                except (ValueError, RecursionError) as exc:
                    what = "nested too deeply" if isinstance(exc, RecursionError) else exc
                    raise self.fail(n, f"not JSON ({str(what)[:200]})") from None
                if not isinstance(obj, dict):
                    raise self.fail(n, "a record must be a JSON object")
                if n == 1:
                    self._header(obj)
                    sha.update(line)
                    continue
                if ended:
                    raise self.fail(n, f"data after the end record (line {ended})")
                if "end" in obj:
                    if piece is not None:
                        raise self.fail(n, f"blob {piece[0]} is incomplete")
                    self._trailer(n, obj, counts, sha.hexdigest())
                    self.sha256 = sha.hexdigest()
                    ended = n
                    continue
                sha.update(line)
                counts["records"] += 1
                if "blob" in obj:
                    current, data = self._piece(n, obj, piece, received, blobs)
                    if piece is None:
                        spool = tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024)  # noqa: SIM115  closed below or in finally
                        piece, received = current, 0
                    assert spool is not None
                    spool.write(data)
                    received += len(data)
                    if received == piece[2]:
                        problem = _check_packed(spool, piece[0], piece[1])
                        if problem:
                            raise self.fail(n, f"blob {piece[0]}: {problem}")
                        blobs[piece[0]] = (piece[1], piece[2])
                        counts["blobs"] += 1
                        spool.seek(0)
                        yield _BlobItem(n, piece[0], piece[1], spool)
                        spool.close()
                        spool, piece = None, None
                    continue
                if piece is not None:
                    raise self.fail(
                        n, f"blob {piece[0]} is incomplete ({received:,} of {piece[2]:,} bytes)"
                    )
                if "op" not in obj:
                    raise self.fail(n, "not a record (a blob piece, an operation or the end)")
                counts["ops"] += 1
                item = self._op(n, obj)
                parsed = item.parsed
                for ref in _blob_refs(parsed):
                    if blobs.get(ref[0]) != (ref[1], ref[2]):
                        raise self.fail(
                            n,
                            f"{item.op.name} refers to blob {ref[0]}, which the file does not "
                            "hold (with that size) before this line",
                        )
                if isinstance(parsed, _SessionIn):
                    if parsed.id in sessions:
                        raise self.fail(n, f"session {parsed.id} appears twice")
                    if parsed.parent_id in sessions:
                        item.parent_in_file = True
                        if sessions[parsed.parent_id] != parsed.root_id:
                            raise self.fail(
                                n, f"session {parsed.id}: root_id differs from its parent's"
                            )
                    sessions[parsed.id] = parsed.root_id
                elif isinstance(parsed, _MessageIn):
                    if parsed.id in messages:
                        raise self.fail(n, f"message {parsed.id} appears twice")
                    if parsed.session_id not in sessions:
                        raise self.fail(
                            n,
                            f"message {parsed.id}: its session {parsed.session_id} is not "
                            "earlier in the file",
                        )
                    if (parsed.session_id, parsed.seq) in seqs:
                        raise self.fail(n, f"message {parsed.id}: another message has its seq")
                    messages.add(parsed.id)
                    seqs.add((parsed.session_id, parsed.seq))
                    last_message = (parsed.id, parsed.session_id)
                    parts_seen.clear()
                    self._parts(n, parsed.id, parsed.parts, parts_seen)
                elif isinstance(parsed, _PartsIn):
                    if last_message != (parsed.message_id, parsed.session_id):
                        raise self.fail(n, f"parts of message {parsed.message_id} do not follow it")
                    self._parts(n, parsed.message_id, parsed.parts, parts_seen)
                else:
                    key = (parsed.session_id, parsed.namespace, parsed.key)
                    if parsed.session_id not in sessions:
                        raise self.fail(n, f"{parsed.what}: the session is not earlier in the file")
                    if key in states:
                        raise self.fail(n, f"{parsed.what} appears twice")
                    states.add(key)
                if isinstance(parsed, _SessionIn | _StateIn):
                    last_message = None
                yield item
        finally:
            if spool is not None:
                spool.close()
        if n == 0:
            raise self.fail(0, "empty: not a fleetstore export")
        if not ended:
            raise self.fail(n, "the file ends without its end record: it is truncated")

    def _parts(
        self,
        n: int,
        message_id: str,
        parts: Sequence[_PartIn],
        seen: dict[int, tuple[str, str, set[int] | None]],
    ) -> None:
        """A part appears once, or (streamed) as slices of its chunks, each chunk once."""
        for p in parts:
            what = f"part {p.seq} of message {message_id}"
            before = seen.get(p.seq)
            if before is None:
                chunks: set[int] | None = None if p.chunks is None else set()
                seen[p.seq] = (p.kind, p.meta, chunks)
            elif before[2] is None or p.chunks is None or before[:2] != (p.kind, p.meta):
                raise self.fail(n, f"{what} appears twice")
            known = seen[p.seq][2]
            for seq, _ in p.chunks or ():
                assert known is not None
                if seq in known:
                    raise self.fail(n, f"{what}: chunk {seq} appears twice")
                known.add(seq)

    def _header(self, obj: Mapping[str, Any]) -> None:
        if obj.get("format") != FORMAT:
            raise self.fail(1, f"not a fleetstore export (the header's format is not {FORMAT!r})")
        version = obj.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise self.fail(1, f"bad format version {str(version)[:40]!r}")
        if version > VERSION:
            raise self.fail(
                1,
                f"format version {version} is newer than this fleetstore reads ({VERSION}); "
                "import it with a newer fleetstore",
            )

    def _trailer(
        self, n: int, obj: Mapping[str, Any], counts: Mapping[str, int], digest: str
    ) -> None:
        end = obj.get("end")
        if set(obj) != {"end"} or not isinstance(end, dict):
            raise self.fail(n, "a bad end record")
        expected = {**counts, "sha256": digest}
        if end.get("sha256") != digest:
            raise self.fail(n, "the file does not match its checksum: it was changed or damaged")
        if dict(end) != expected:
            raise self.fail(n, f"the end record counts {dict(end)!r:.200}, the file holds {counts}")

    def _piece(
        self,
        n: int,
        obj: dict[str, Any],
        piece: tuple[str, int, int] | None,
        received: int,
        blobs: Mapping[str, Any],
    ) -> tuple[tuple[str, int, int], bytes]:
        if set(obj) != {"blob", "size", "stored_size", "offset", "data"}:
            raise self.fail(n, "a blob piece has blob, size, stored_size, offset and data")
        try:
            sha = check_sha(obj["blob"])
            size = _int(obj["size"], "size")
            stored = _int(obj["stored_size"], "stored_size", 1)
            offset = _int(obj["offset"], "offset")
            data = obj["data"]
            if not isinstance(data, str):
                raise errors.InvalidInput("data must be base64 text")
            raw = base64.b64decode(data, validate=True)
        except errors.InvalidInput as exc:
            raise self.fail(n, str(exc)) from None
        except ValueError:
            raise self.fail(n, "a blob piece's data is not base64") from None
        if size > self.max_payload:
            raise self.fail(
                n, f"blob {sha} of {size:,} bytes is over max_payload_bytes ({self.max_payload:,})"
            )
        if stored > size + size // 128 + 65536:
            raise self.fail(
                n, f"blob {sha}: stored_size {stored:,} is impossible for {size:,} bytes"
            )
        if not raw:
            raise self.fail(n, f"blob {sha}: an empty piece")
        current = (sha, size, stored)
        if piece is None:
            if sha in blobs:
                raise self.fail(n, f"blob {sha} appears twice")
            if offset != 0:
                raise self.fail(n, f"blob {sha}: its first piece is at offset {offset}, not 0")
        elif current != piece or offset != received:
            raise self.fail(n, f"blob {piece[0]} is incomplete, or its pieces are out of order")
        if offset + len(raw) > stored:
            raise self.fail(n, f"blob {sha}: more bytes than its stored_size ({stored:,})")
        return current, raw

    def _op(self, n: int, obj: object) -> _OpItem:
        try:
            op = Operation.from_json(obj)
        except errors.InvalidInput as exc:
            raise self.fail(n, str(exc)) from None
        if op.name not in IMPORT_OPS:
            raise self.fail(
                n,
                f"operation {op.name!r} cannot be imported (an export holds only "
                f"{', '.join(IMPORT_OPS)})",
            )
        try:
            parsed = _PARSERS[op.name](op.args)
        except errors.InvalidInput as exc:
            raise self.fail(n, f"{op.name}: {exc}") from None
        except RecursionError:
            raise self.fail(n, f"{op.name}: nested too deeply") from None
        return _OpItem(n, op, parsed)


# -- importing -------------------------------------------------------------------------------


def _item_session(store: Store, item: _OpItem) -> str:
    """The session whose file an operation of the file is checked in: its own, or,
    for a session the store does not hold yet, its parent's (a sharded store keeps
    a subagent in its parent's tree)."""
    parsed = item.parsed
    if item.op.name != "import_session":
        return str(parsed.session_id)
    sid = str(parsed.id)
    if store.router is not None and parsed.parent_id is not None and store.router.home(sid) is None:
        return str(parsed.parent_id)
    return sid


def _check_against_store(store: Store, reader: _Reader, batch: list[_OpItem]) -> None:
    """Dry-run a batch of operations against the store: a conflict is found
    before anything is written.  A sharded store checks each operation in the file
    of its session's tree, the operations of one file in one read transaction."""
    if store.router is None:
        _check_in(store, reader, batch, None)
        return
    groups: dict[str | None, tuple[str, list[_OpItem]]] = {}
    for item in batch:
        sid = _item_session(store, item)
        key = store.router.home(sid)
        groups.setdefault(key, (sid, []))[1].append(item)
    # In the order of each file's first operation; within a file, in file order.
    for sid, items in groups.values():
        _check_in(store, reader, items, sid)


def _check_in(store: Store, reader: _Reader, batch: list[_OpItem], session_id: str | None) -> None:
    q = store.queries

    def run(tx: Tx) -> None:
        for item in batch:
            try:
                outcome = _run(tx, q, item.op.name, item.parsed, False, 0.0)
            except errors.AlreadyExists as exc:
                raise errors.AlreadyExists(
                    f"{reader.path}: line {item.line}: {exc}; nothing was imported"
                ) from None
            except errors.InvalidInput as exc:
                raise reader.fail(item.line, str(exc)) from None
            if outcome == _MISSING_PARENT and not item.parent_in_file:
                s = item.parsed
                raise reader.fail(
                    item.line,
                    f"session {s.id}: its parent {s.parent_id} is neither in the file nor in "
                    "the store (export the parent's tree, or import its export first)",
                )

    store.read(run, session_id=session_id)


def import_file(
    store: Store,
    path: str | os.PathLike[str],
    *,
    progress: Progress | None = None,
    max_line: int = MAX_LINE,
    max_total: int = MAX_TOTAL,
) -> ImportSummary:
    """Import an export file into *store*: checked whole first (``InvalidArchive``,
    or ``AlreadyExists`` for a conflict with the store, and nothing is written),
    then blobs and operations written.  Importing a file twice changes nothing."""
    file = Path(path)
    limit = store.settings.max_payload_bytes
    check = _Reader(file, limit, max_line, max_total)
    batch: list[_OpItem] = []
    try:
        for item in check.items():
            if isinstance(item, _OpItem):
                batch.append(item)
                if len(batch) >= _CHECK_BATCH:
                    _check_against_store(store, check, batch)
                    batch.clear()
            if progress is not None:
                progress("check", check.position, check.file_size)
        _check_against_store(store, check, batch)
    except errors.InvalidArchive as exc:
        raise errors.InvalidArchive(f"{exc}; nothing was imported") from None

    counts = {INSERTED: 0, UPDATED: 0, UNCHANGED: 0, NEWER: 0}
    kinds = {"import_session": 0, "import_message": 0, "import_state": 0}
    blobs = new_blobs = blob_bytes = 0
    last: list[Any] = [None, None]  # the last message's id and outcome
    write = _Reader(file, limit, max_line, max_total)
    line = 0
    try:
        for item in write.items():
            line = item.line
            if isinstance(item, _BlobItem):
                fresh = not store.blobs.exists(item.sha256)
                store.blobs.put_stored(item.sha256, item.data.read(), item.size)
                blobs += 1
                new_blobs += fresh
                blob_bytes += item.size
            else:
                action = store.apply(item.op)["action"]
                name = item.op.name
                if name == "import_parts":
                    if action == UPDATED and last[1] in (UNCHANGED, NEWER):
                        counts[last[1]] -= 1
                        counts[UPDATED] += 1
                        last[1] = UPDATED
                else:
                    kinds[name] += 1
                    counts[action] += 1
                    if name == "import_message":
                        last = [item.parsed.id, action]
            if progress is not None:
                progress("import", write.position, write.file_size)
    except errors.InvalidArchive as exc:
        raise errors.InvalidArchive(
            f"{exc} (the file changed while it was imported: records before it were imported)"
        ) from None
    except errors.StoreBusy:
        raise
    except (errors.AlreadyExists, errors.NotFound, errors.InvalidInput) as exc:
        raise type(exc)(
            f"{file}: line {line}: {exc}; the import stopped there (the records before it "
            "were imported; importing the file again is safe)"
        ) from exc
    if write.sha256 != check.sha256:
        raise errors.InvalidArchive(f"{file}: the file changed while it was imported")
    return ImportSummary(
        path=str(file),
        sessions=kinds["import_session"],
        messages=kinds["import_message"],
        states=kinds["import_state"],
        blobs=blobs,
        blob_bytes=blob_bytes,
        new_blobs=new_blobs,
        inserted=counts[INSERTED],
        updated=counts[UPDATED],
        unchanged=counts[UNCHANGED],
        newer=counts[NEWER],
    )


# -- merging ---------------------------------------------------------------------------------


def _verify(source: Store, dest: Store, exported: ExportSummary, name: str) -> list[str]:
    """What differs between the export of *source*, the destination and the source now."""
    problems: list[str] = []
    for sid, want in exported.digests.items():
        got = session_digest(dest, sid)
        if got != want:
            found = (
                "missing" if got is None else f"{got.messages} messages, content {got.sha256[:12]}"
            )
            problems.append(
                f"session {sid}: the destination does not match the export of {name} "
                f"({want.messages} messages, content {want.sha256[:12]}; destination: {found})"
            )
        now = session_digest(source, sid)
        if now != want:
            found = "deleted" if now is None else f"{now.messages} messages"
            problems.append(
                f"session {sid} changed in {name} during the merge (exported with "
                f"{want.messages} messages, now {found}); merge again once its writers stopped"
            )
    if exported.whole_store:
        created = set(_session_order(source, None)) - set(exported.digests)
        if created:
            problems.append(
                f"{len(created)} session(s) were created in {name} during the merge "
                f"(e.g. {min(created)}); merge again once its writers stopped"
            )
    for sha in sorted(exported.blob_shas):
        if not dest.blobs.verify(sha):
            problems.append(
                f"blob {sha} does not verify in the destination ({dest.blobs.describe(sha)})"
            )
    return problems


def merge(
    sources: Sequence[str | os.PathLike[str] | Store],
    dest: str | os.PathLike[str] | Store,
    *,
    progress: Progress | None = None,
) -> MergeReport:
    """Bring every session of each source store into *dest*: export, import, then
    verify that each exported session is in *dest* exactly as exported (message
    count and content hash), that the source did not change meanwhile, and that
    every blob verifies.  Idempotent: merging again changes nothing.  The report's
    ``problems`` say what did not verify."""
    from fleetstore.core.targets import resolve_target
    from fleetstore.store.facade import Store as StoreClass
    from fleetstore.store.facade import open as open_store

    def target(s: str | os.PathLike[str] | Store) -> Path:
        return (s.path if isinstance(s, StoreClass) else resolve_target(s)).resolve()

    dest_path = target(dest)
    for src in sources:
        path = target(src)
        if path == dest_path:
            raise errors.InvalidInput(f"{path} is both a source and the destination")
        if not isinstance(src, StoreClass) and not path.exists():
            raise errors.NotFound(f"no store at {path} to merge from")
    with contextlib.ExitStack() as stack:
        dst = dest if isinstance(dest, StoreClass) else stack.enter_context(open_store(dest))
        results: list[SourceResult] = []
        problems: list[str] = []
        for src in sources:
            with contextlib.ExitStack() as inner:
                store = src if isinstance(src, StoreClass) else inner.enter_context(open_store(src))
                fd, tmp = tempfile.mkstemp(
                    prefix=".fleetstore-merge-", suffix=".jsonl.zst", dir=dst.path.parent
                )
                os.close(fd)
                inner.callback(_unlink, tmp)
                exported = export_store(store, tmp, progress=progress)
                imported = import_file(dst, tmp, progress=progress)
                problems.extend(_verify(store, dst, exported, str(store.path)))
                results.append(SourceResult(str(store.path), exported, imported))
        return MergeReport(str(dst.path), tuple(results), tuple(problems))


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


__all__ = [
    "FORMAT",
    "IMPORT_OPS",
    "MAX_LINE",
    "VERSION",
    "ExportSummary",
    "ImportSummary",
    "MergeReport",
    "SessionDigest",
    "SourceResult",
    "export_store",
    "import_file",
    "merge",
    "session_digest",
]
