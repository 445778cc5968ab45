"""Every write is a named operation with JSON arguments, applied by one registry.

An operation carries client-chosen ids (its own ``op_id``, and the ids of the
rows it creates) and, where it matters, an expected version.  Applying it twice
has the effect of applying it once: logged operations record their ``op_id``
in ``applied_ops`` inside the same transaction and are skipped when found
there; the others (stream chunks, hot and many) are idempotent by their primary
keys.  Retries, the spool, export/import and metrics all go through ``apply``.

Arguments are checked here, inside the transaction, because operations also
arrive from spool journals and export files: a bad one raises ``InvalidInput``
(or ``NotFound``, ``AlreadyExists``, ``VersionConflict``) and the transaction
rolls back whole.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fleetstore import errors
from fleetstore.core.ids import derived_id, is_valid_id
from fleetstore.domain.blobs import CODEC, check_sha
from fleetstore.engine.base import Tx
from fleetstore.models import PART_KINDS, STREAMED_KINDS, USAGE_FIELDS

Args = Mapping[str, Any]
Result = dict[str, Any]
Queries = Mapping[str, str]

MAX_TEXT = 64 * 1024 * 1024  # one inline string (far above blob_threshold)
ROLES_MAX = 64


@dataclass(frozen=True, slots=True)
class Operation:
    """One write: ``name`` in the registry, JSON ``args``, a unique ``op_id``."""

    name: str
    args: Mapping[str, Any]
    op_id: str

    def to_json(self) -> dict[str, Any]:
        return {"op": self.name, "id": self.op_id, "args": dict(self.args)}

    @classmethod
    def from_json(cls, data: object) -> Operation:
        if not isinstance(data, dict) or set(data) != {"op", "id", "args"}:
            raise errors.InvalidInput(f"not an operation record: {str(data)[:200]}")
        name, op_id, args = data["op"], data["id"], data["args"]
        if not isinstance(name, str) or name not in REGISTRY:
            raise errors.InvalidInput(f"unknown operation {str(name)[:80]!r}")
        if not is_valid_id(op_id):
            raise errors.InvalidInput(f"operation {name}: bad id {str(op_id)[:80]!r}")
        if not isinstance(args, dict):
            raise errors.InvalidInput(f"operation {name}: arguments must be an object")
        return cls(name, args, op_id)

    @property
    def session_id(self) -> str | None:
        value = self.args.get("session_id", self.args.get("id"))
        return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class OpSpec:
    name: str
    fn: Callable[[Tx, Queries, Args], Result]
    #: Recorded in applied_ops (and skipped when found there).
    logged: bool
    #: One statement that re-checks its own conditions (a claim): the engine may run
    #: it at a weaker isolation (PostgreSQL: READ COMMITTED with SKIP LOCKED).
    single_statement: bool = False


REGISTRY: dict[str, OpSpec] = {}


def register(
    name: str, logged: bool = True, single_statement: bool = False
) -> Callable[[Callable[[Tx, Queries, Args], Result]], Any]:
    """Decorator: register an operation's apply function under *name*."""

    def decorate(fn: Callable[[Tx, Queries, Args], Result]) -> Any:
        if name in REGISTRY:
            raise ValueError(f"operation {name!r} registered twice")
        REGISTRY[name] = OpSpec(name, fn, logged, single_statement)
        return fn

    return decorate


def apply(tx: Tx, q: Queries, op: Operation, now: float) -> Result:
    """Apply *op* inside the write transaction *tx*.  Returns the operation's
    result, or ``{"duplicate": True}`` if it had been applied before."""
    spec = REGISTRY.get(op.name)
    if spec is None:
        raise errors.InvalidInput(f"unknown operation {op.name!r}")
    if spec.logged:
        found = tx.execute(q["op_applied"], (op.op_id,))
        if found:
            return {**earlier_result(found[0][1]), "duplicate": True}
    args = dict(op.args)
    args.setdefault("now", now)
    # The transactional outbox: effects named by a history operation commit
    # (or roll back) with it, and a duplicate of the operation adds none.
    effects = args.pop("effects", None)
    result = spec.fn(tx, q, args)
    if effects is not None and not result.get("duplicate"):
        enqueue = REGISTRY["enqueue_effect"].fn
        for effect in check_effects(spec, effects):
            enqueue(tx, q, {**effect, "now": args["now"]})
    if spec.logged:
        tx.execute(q["op_record"], (op.op_id, op.name, op.session_id, now, _result_json(result)))
    return result


def check_effects(spec: OpSpec, effects: object) -> list[dict[str, Any]]:
    """The ``effects`` argument of a history operation: a list of objects, on a logged
    operation (a duplicate must be recognised to add none), else ``InvalidInput``."""
    if not spec.logged or not isinstance(effects, list):
        raise errors.InvalidInput(f"{spec.name}: effects must be a list, on a logged operation")
    for effect in effects:
        if not isinstance(effect, dict):
            raise errors.InvalidInput(f"{spec.name}: each effect must be an object")
    return effects


#: Results longer than this are not kept (a duplicate then returns only its flag);
#: every result of the registry's logged operations is far smaller.
MAX_KEPT_RESULT = 4096


def _result_json(result: Result) -> str | None:
    try:
        text = json.dumps(result, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return None
    return text if len(text) <= MAX_KEPT_RESULT else None


def earlier_result(text: object) -> Result:
    if not isinstance(text, str):
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# -- argument checks -------------------------------------------------------------------------


def _id(args: Args, key: str, optional: bool = False) -> Any:
    value = args.get(key)
    if value is None and optional:
        return None
    if not is_valid_id(value):
        raise errors.InvalidInput(
            f"{key} must be an id (a short string without '/'), not {value!r}"
        )
    return value


def _str(args: Args, key: str, optional: bool = True, limit: int = 4096) -> Any:
    value = args.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise errors.InvalidInput(f"{key} must be a string of at most {limit} characters")
    return check_text(value, key)


def check_text(value: str, what: str) -> str:
    """*value*, or ``InvalidInput`` if it cannot be stored as UTF-8 (a lone surrogate,
    which would otherwise fail deep in the driver with a bare UnicodeEncodeError)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise errors.InvalidInput(
            f"{what} is not valid Unicode text (a lone surrogate at position {exc.start})"
        ) from None
    return value


def _int(args: Args, key: str, optional: bool = True, minimum: int = 0) -> Any:
    value = args.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise errors.InvalidInput(f"{key} must be an integer >= {minimum}, not {value!r}")
    return value


def _time(args: Args, key: str) -> float:
    value = args.get(key, args["now"])
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise errors.InvalidInput(f"{key} must be a time in seconds, not {value!r}")
    return float(value)


def dump_json(value: object, what: str) -> str:
    """JSON text for *value*, or ``InvalidInput`` naming *what* could not be stored."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise errors.InvalidInput(f"{what} is not JSON-serialisable: {exc}") from None
    return check_text(text, what)


def _meta(args: Args, key: str = "metadata") -> str:
    value = args.get(key)
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise errors.InvalidInput(
            f"{key} must be a JSON object (a dict), not {type(value).__name__}"
        )
    return dump_json(value, key)


def _session_row(tx: Tx, q: Queries, session_id: str) -> tuple[Any, ...]:
    rows = tx.execute(q["session_for_write"], (session_id,))
    if not rows:
        raise errors.NotFound(f"no session {session_id!r}")
    return rows[0]


def _blob_ref(tx: Tx, q: Queries, ref: object, now: float) -> tuple[str, int]:
    if not isinstance(ref, dict):
        raise errors.InvalidInput("blob reference must be an object")
    sha = check_sha(ref.get("sha256"))
    size = _int(ref, "size", optional=False)
    stored = _int(ref, "stored_size", optional=False)
    tx.execute(q["blob_insert"], (sha, size, stored, CODEC, now))
    return sha, size


def encoded_body(
    tx: Tx, q: Queries, item: Args, what: str, now: float
) -> tuple[str, Any, str | None, int]:
    """(enc, inline body, blob sha, size) from an encoded payload:
    ``{"enc": "str"|"json"|"bytes", "body": ...}`` or ``{"enc": ..., "blob": {...}}``."""
    enc = item.get("enc")
    if enc not in ("str", "json", "bytes"):
        raise errors.InvalidInput(f"{what}: unknown encoding {enc!r}")
    if "blob" in item:
        sha, size = _blob_ref(tx, q, item["blob"], now)
        return enc, None, sha, size
    body = item.get("body")
    if not isinstance(body, str) or len(body) > MAX_TEXT:
        raise errors.InvalidInput(f"{what}: body must be a string")
    check_text(body, what)
    if enc == "bytes":
        try:
            raw = base64.b64decode(body, validate=True)
        except ValueError:
            raise errors.InvalidInput(f"{what}: body is not base64") from None
        return enc, raw, None, len(raw)
    if enc == "json":
        try:
            json.loads(body)
        except ValueError:
            raise errors.InvalidInput(f"{what}: body is not JSON") from None
    if "\x00" in body:
        # PostgreSQL text cannot hold NUL (the body column is BYTEA there): such a body
        # goes as its UTF-8 bytes on both engines, and reads decode it (decode_value).
        return enc, body.encode("utf-8"), None, len(body.encode("utf-8"))
    return enc, body, None, len(body.encode("utf-8"))


# -- sessions --------------------------------------------------------------------------------


@register("create_session")
def _create_session(tx: Tx, q: Queries, a: Args) -> Result:
    sid = _id(a, "id")
    parent = _id(a, "parent_id", optional=True)
    project = _str(a, "project")
    title = _str(a, "title")
    metadata = _meta(a)
    now = _time(a, "created_at")
    existing = tx.execute(q["session_identity"], (sid,))
    if existing:
        if existing[0] == (parent, project, title, metadata):
            return {"id": sid}  # the same create, retried under a new op id
        raise errors.AlreadyExists(f"session {sid!r} already exists with other contents")
    root = sid
    if parent is not None:
        root = _session_row(tx, q, parent)[1]
    tx.execute(
        q["session_insert"], (sid, parent, root, None, None, project, title, metadata, now, now)
    )
    return {"id": sid}


@register("update_session")
def _update_session(tx: Tx, q: Queries, a: Args) -> Result:
    sid = _id(a, "id")
    expected = _int(a, "expected_version", minimum=1)
    row = _session_row(tx, q, sid)
    version = row[2]
    if expected is not None and expected != version:
        raise errors.VersionConflict(
            f"session {sid!r} is at version {version}, not {expected}", expected, version
        )
    title = _str(a, "title") if "title" in a else row[3]
    metadata = _meta(a) if "metadata" in a else row[4]
    tx.execute(q["session_update"], (title, metadata, _time(a, "now"), sid))
    return {"id": sid, "version": version + 1}


@register("archive_session")
def _archive_session(tx: Tx, q: Queries, a: Args) -> Result:
    sid = _id(a, "id")
    archived = a.get("archived", True)
    if not isinstance(archived, bool):
        raise errors.InvalidInput("archived must be true or false")
    _session_row(tx, q, sid)
    now = _time(a, "now")
    tx.execute(
        q["session_archive"],
        ("archived" if archived else "active", now if archived else None, now, sid),
    )
    return {"id": sid}


@register("delete_session")
def _delete_session(tx: Tx, q: Queries, a: Args) -> Result:
    sid = _id(a, "id")
    _session_row(tx, q, sid)
    # Subagent sessions go with their parent (ON DELETE CASCADE on parent_id).
    tx.execute(q["session_delete"], (sid,))
    return {"id": sid}


@register("fork_session")
def _fork_session(tx: Tx, q: Queries, a: Args) -> Result:
    sid = _id(a, "id")
    source = _id(a, "source_id")
    at_seq = _int(a, "at_seq", minimum=0)
    title = _str(a, "title")
    now = _time(a, "created_at")
    src = _session_row(tx, q, source)
    last = tx.execute(q["message_last_seq"], (source,))[0][0]
    if at_seq is None:
        at_seq = last
    elif at_seq > last:
        raise errors.NotFound(f"session {source!r} has no message {at_seq} (it has {last})")
    existing = tx.execute(q["session_fork_origin"], (sid,))
    if existing:
        if existing[0] == (source, at_seq):
            return {"id": sid, "fork_seq": at_seq, "duplicate": True}  # the same fork, retried
        raise errors.AlreadyExists(f"session {sid!r} already exists")
    src_parent, src_root, src_project, src_title, src_meta = src[5], src[1], src[6], src[3], src[4]
    # A fork stays in its source's tree (same parent_id and root_id): the tree is
    # the unit a sharded store keeps in one file, and a fork shares its blobs.
    root = src_root
    tx.execute(
        q["session_insert"],
        (
            sid,
            src_parent,
            root,
            source,
            at_seq,
            src_project,
            title if title is not None else src_title,
            src_meta,
            now,
            now,
        ),
    )
    for (old_id,) in tx.execute(q["fork_message_ids"], (source, at_seq)):
        new = derived_id("fork", sid, old_id)
        tx.execute(q["fork_copy_message"], (new, sid, old_id))
        tx.execute(q["fork_copy_parts"], (new, sid, old_id))
        tx.execute(q["fork_copy_chunks"], (new, old_id))
        tx.execute(q["fork_copy_usage"], (new, sid, old_id))
    return {"id": sid, "fork_seq": at_seq}


# -- messages --------------------------------------------------------------------------------


def _part_meta(part: Args, what: str) -> str:
    meta = part.get("meta")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise errors.InvalidInput(f"{what}: meta must be an object")
    return dump_json(meta, f"{what} metadata")


def _insert_part(
    tx: Tx, q: Queries, message_id: str, session_id: str, seq: int, part: object, now: float
) -> None:
    what = f"part {seq} of message {message_id}"
    if not isinstance(part, dict):
        raise errors.InvalidInput(f"{what}: must be an object")
    kind = part.get("kind")
    if kind not in PART_KINDS:
        raise errors.InvalidInput(
            f"{what}: unknown part kind {kind!r}; known: {', '.join(PART_KINDS)}"
        )
    enc, body, sha, size = encoded_body(tx, q, part, what, now)
    tx.execute(
        q["part_insert"],
        (message_id, seq, session_id, kind, _part_meta(part, what), enc, body, sha, size),
    )


def _usage(
    tx: Tx, q: Queries, message_id: str, session_id: str, model: str | None, usage: object
) -> None:
    if usage is None:
        return
    if not isinstance(usage, dict):
        raise errors.InvalidInput("usage must be an object")
    unknown = set(usage) - set(USAGE_FIELDS)
    if unknown:
        raise errors.InvalidInput(f"usage has unknown fields: {', '.join(sorted(unknown))}")
    counts = [_int(usage, f) or 0 for f in USAGE_FIELDS if f != "cost"]
    cost = usage.get("cost", 0.0)
    if (
        not isinstance(cost, int | float)
        or isinstance(cost, bool)
        or not math.isfinite(cost)
        or cost < 0
    ):
        raise errors.InvalidInput(f"usage cost must be a number >= 0, not {cost!r}")
    tx.execute(q["usage_upsert"], (message_id, session_id, model, *counts, float(cost)))


@register("append_message")
def _append_message(tx: Tx, q: Queries, a: Args) -> Result:
    mid = _id(a, "id")
    sid = _id(a, "session_id")
    role = _str(a, "role", optional=False, limit=ROLES_MAX)
    if not role:
        raise errors.InvalidInput("role must not be empty")
    status = a.get("status", "complete")
    if status not in ("complete", "streaming"):
        raise errors.InvalidInput(f"a new message is 'complete' or 'streaming', not {status!r}")
    model = _str(a, "model", limit=256)
    metadata = _meta(a)
    parts = a.get("parts")
    if parts is None:
        parts = []
    if not isinstance(parts, list):
        raise errors.InvalidInput("parts must be a list")
    now = _time(a, "created_at")
    existing = tx.execute(q["message_identity"], (mid,))
    if existing:
        if existing[0][0] == sid:
            return {"id": mid, "seq": existing[0][1], "duplicate": True}
        raise errors.AlreadyExists(f"message {mid!r} already exists in another session")
    _session_row(tx, q, sid)
    seq = tx.execute(q["message_last_seq"], (sid,))[0][0] + 1
    tx.execute(
        q["message_insert"],
        (mid, sid, seq, role, status, model, metadata, now, now if status == "complete" else None),
    )
    for i, part in enumerate(parts):
        _insert_part(tx, q, mid, sid, i, part, now)
    _usage(tx, q, mid, sid, model, a.get("usage"))
    tx.execute(q["session_touch"], (now, sid))
    return {"id": mid, "seq": seq, "created_at": now}


def _streaming_message(tx: Tx, q: Queries, mid: str, sid: str) -> str:
    rows = tx.execute(q["message_identity"], (mid,))
    if not rows or rows[0][0] != sid:
        raise errors.NotFound(f"no message {mid!r} in session {sid!r}")
    return str(rows[0][2])


@register("append_chunks", logged=False)
def _append_chunks(tx: Tx, q: Queries, a: Args) -> Result:
    """Streamed text: each chunk is a new row keyed (message, part, seq), so a
    replay inserts nothing and no part is ever rewritten whole."""
    mid = _id(a, "message_id")
    sid = _id(a, "session_id")
    chunks = a.get("chunks")
    if not isinstance(chunks, list) or not chunks:
        raise errors.InvalidInput("chunks must be a non-empty list")
    if _streaming_message(tx, q, mid, sid) != "streaming":
        return {"duplicate": True}  # the message was finished: this is a replay
    for c in chunks:
        if not isinstance(c, dict):
            raise errors.InvalidInput("each chunk must be an object")
        part_seq = _int(c, "part_seq", optional=False)
        seq = _int(c, "seq", optional=False)
        kind = c.get("kind")
        if kind not in STREAMED_KINDS:
            raise errors.InvalidInput(
                f"only {' and '.join(STREAMED_KINDS)} parts stream, not {kind!r}"
            )
        text = _str(c, "text", optional=False, limit=MAX_TEXT)
        tx.execute(q["part_insert_streamed"], (mid, part_seq, sid, kind))
        tx.execute(q["chunk_insert"], (mid, part_seq, seq, text))
    return {"id": mid}


@register("add_part", logged=False)
def _add_part(tx: Tx, q: Queries, a: Args) -> Result:
    mid = _id(a, "message_id")
    sid = _id(a, "session_id")
    seq = _int(a, "seq", optional=False)
    if _streaming_message(tx, q, mid, sid) != "streaming":
        return {"duplicate": True}
    if tx.execute(q["part_exists"], (mid, seq)):
        return {"duplicate": True}
    _insert_part(tx, q, mid, sid, seq, a.get("part"), _time(a, "now"))
    return {"id": mid}


@register("finish_message")
def _finish_message(tx: Tx, q: Queries, a: Args) -> Result:
    mid = _id(a, "message_id")
    sid = _id(a, "session_id")
    status = a.get("status")
    if status not in ("complete", "error"):
        raise errors.InvalidInput(f"a message finishes 'complete' or 'error', not {status!r}")
    error = _str(a, "error", limit=64 * 1024)
    now = _time(a, "now")
    if _streaming_message(tx, q, mid, sid) != "streaming":
        return {"duplicate": True}
    model = tx.execute(q["message_model"], (mid,))[0][0]
    _usage(tx, q, mid, sid, model, a.get("usage"))
    tx.execute(q["message_finish"], (status, error, now, mid))
    tx.execute(q["session_touch"], (now, sid))
    return {"id": mid}


# -- state -----------------------------------------------------------------------------------


def _state_key(a: Args) -> tuple[str, str, str]:
    key = (
        _id(a, "session_id"),
        _str(a, "namespace", optional=False, limit=256),
        _str(a, "key", optional=False, limit=1024),
    )
    if not key[1] or not key[2]:
        raise errors.InvalidInput("a state namespace and key must not be empty")
    return key


def _check_version(current: int | None, expected: int | None, what: str) -> None:
    if expected is None:
        return
    if (current or 0) != expected:
        raise errors.VersionConflict(
            f"{what} is at version {current or 0}, not {expected}", expected, current or 0
        )


@register("put_state")
def _put_state(tx: Tx, q: Queries, a: Args) -> Result:
    sid, ns, key = _state_key(a)
    expected = _int(a, "expected_version", minimum=0)
    value = a.get("value")
    if not isinstance(value, dict):
        raise errors.InvalidInput("state value must be an encoded payload")
    now = _time(a, "now")
    enc, body, sha, size = encoded_body(tx, q, value, f"state {ns}/{key}", now)
    if enc == "str":
        raise errors.InvalidInput("state values are JSON or bytes")
    _session_row(tx, q, sid)
    rows = tx.execute(q["state_version"], (sid, ns, key))
    current = rows[0][0] if rows else None
    _check_version(current, expected, f"state {ns}/{key} of session {sid!r}")
    version = (current or 0) + 1
    tx.execute(q["state_upsert"], (sid, ns, key, version, enc, body, sha, size, now))
    return {"version": version, "updated_at": now}


@register("delete_state")
def _delete_state(tx: Tx, q: Queries, a: Args) -> Result:
    sid, ns, key = _state_key(a)
    expected = _int(a, "expected_version", minimum=0)
    rows = tx.execute(q["state_version"], (sid, ns, key))
    if not rows:
        _session_row(tx, q, sid)  # an unknown session is NotFound, as for put_state
    current = rows[0][0] if rows else None
    _check_version(current, expected, f"state {ns}/{key} of session {sid!r}")
    if current is not None:
        tx.execute(q["state_delete"], (sid, ns, key))
    return {"deleted": current is not None}


__all__ = [
    "REGISTRY",
    "OpSpec",
    "Operation",
    "apply",
    "check_text",
    "dump_json",
    "encoded_body",
    "register",
]
