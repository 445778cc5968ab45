"""The operations of session history: sessions (create, fork, update, archive,
delete) and messages (append, stream chunks, parts, finish), as applied inside
the write transaction.  Arguments are checked here again (spool journals and
export files are input too); ids come from the client, so a retry names the
same rows (docs/design.md, "Operations and exactly-once").

A delete or a fork of a large session is not one transaction: as one, deleting
100,000 messages held the write lock 0.7 s and forking them 4 s, and every other
writer of the store waited that long (benchmarks/bench_fork_delete.py).  ``delete_session`` hides the session and its
subagents (``sessions.job = 'delete'``: every read takes it for one that does
not exist) and ``purge_session`` removes their rows in short transactions;
``fork_session`` makes the fork hidden (``job = 'fork'``) and copies the first
batch of messages, ``fork_copy`` the next ones, and the last batch clears the
job in the same transaction: the fork is seen whole or not at all
(docs/design.md, "Deleting and forking large sessions")."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fleetstore import errors
from fleetstore.core.ids import derived_id
from fleetstore.core.validate import (
    MAX_ERROR_TEXT,
    MAX_MODEL,
    MAX_PART_META,
    MAX_TEXT,
    ROLES_MAX,
    arg_id,
    arg_int,
    arg_meta,
    arg_str,
    arg_time,
    check_number,
    dump_json,
    to_json,
)
from fleetstore.domain.codec import check_encoded, columns
from fleetstore.domain.operations import Args, Declarations, Queries, Result, Scope
from fleetstore.engine.base import Tx
from fleetstore.models import PART_KINDS, STREAMED_KINDS, USAGE_FIELDS

OPERATIONS = Declarations()
_COUNTS = tuple(f for f in USAGE_FIELDS if f != "cost")


#: Rows one purge transaction removes at most (chunks, messages with their parts and
#: usage, or state values): about 10 ms of the write lock (docs/design.md).
PURGE_ROWS = 1000
#: Messages one fork transaction copies at most, with their parts, chunks and usage.
FORK_MESSAGES = 100
MAX_BATCH = 100_000


def session_row(tx: Tx, q: Queries, session_id: str) -> tuple[Any, ...]:
    rows = tx.execute(q["session_for_write"], (session_id,))
    if not rows:
        raise errors.NotFound(f"no session {session_id!r}")
    return rows[0]


def _job_in_the_way(tx: Tx, q: Queries, session_id: str) -> None:
    """``AlreadyExists`` if a session of this id is being deleted or forked: hidden
    from reads, its row still holds the id."""
    rows = tx.execute(q["session_job"], (session_id,))
    if rows and rows[0][0] is not None:
        doing = "deleted" if rows[0][0] == "delete" else "forked"
        raise errors.AlreadyExists(
            f"session {session_id!r} is being {doing}; its id is free again once that ends"
        )


# -- sessions --------------------------------------------------------------------------------


def check_create(a: Args) -> dict[str, Any]:
    return {
        "id": arg_id(a, "id"),
        "parent_id": arg_id(a, "parent_id", optional=True),
        "project": arg_str(a, "project"),
        "title": arg_str(a, "title"),
        "metadata": json.loads(arg_meta(a)),
        "created_at": arg_time(a, "created_at"),
    }


@OPERATIONS.declare(
    "create_session",
    scope=Scope.TREE,
    session_args=("parent_id", "id"),
    creates="id",
    check=check_create,
)
def create_session(tx: Tx, q: Queries, a: Args) -> Result:
    sid, parent, project, title = a["id"], a["parent_id"], a["project"], a["title"]
    metadata = meta_json(a["metadata"])
    now = a["created_at"]
    _job_in_the_way(tx, q, sid)
    existing = tx.execute(q["session_identity"], (sid,))
    if existing:
        if existing[0] == (parent, project, title, metadata):
            return {"id": sid}  # the same create, retried under a new op id
        raise errors.AlreadyExists(f"session {sid!r} already exists with other contents")
    root = sid
    if parent is not None:
        root = session_row(tx, q, parent)[1]
    tx.execute(
        q["session_insert"],
        (sid, parent, root, None, None, project, title, metadata, now, now, None, None),
    )
    return {"id": sid}


@OPERATIONS.declare("update_session", scope=Scope.TREE, session_args=("id",))
def update_session(tx: Tx, q: Queries, a: Args) -> Result:
    sid = arg_id(a, "id")
    expected = arg_int(a, "expected_version", minimum=1)
    row = session_row(tx, q, sid)
    version = row[2]
    if expected is not None and expected != version:
        raise errors.VersionConflict(
            f"session {sid!r} is at version {version}, not {expected}", expected, version
        )
    title = arg_str(a, "title") if "title" in a else row[3]
    metadata = arg_meta(a) if "metadata" in a else row[4]
    tx.execute(q["session_update"], (title, metadata, arg_time(a, "now"), sid))
    return {"id": sid, "version": version + 1}


@OPERATIONS.declare("archive_session", scope=Scope.TREE, session_args=("id",))
def archive_session(tx: Tx, q: Queries, a: Args) -> Result:
    sid = arg_id(a, "id")
    archived = a.get("archived", True)
    if not isinstance(archived, bool):
        raise errors.InvalidInput("archived must be true or false")
    session_row(tx, q, sid)
    now = arg_time(a, "now")
    tx.execute(
        q["session_archive"],
        ("archived" if archived else "active", now if archived else None, now, sid),
    )
    return {"id": sid}


@OPERATIONS.declare("delete_session", scope=Scope.TREE, session_args=("id",))
def delete_session(tx: Tx, q: Queries, a: Args) -> Result:
    """Hide the session and its subagents from every read, at once; their rows are
    removed after, by ``purge_session`` (``purge: True`` says so)."""
    sid = arg_id(a, "id")
    owner = arg_str(a, "owner", limit=512)
    session_row(tx, q, sid)
    tx.execute(q["session_mark_deleted"], {"id": sid, "owner": owner})
    return {"id": sid, "purge": True}


def _limit(a: Args, default: int) -> int:
    return int(arg_int(a, "limit", False, 1, MAX_BATCH, default))


@OPERATIONS.declare("purge_session", scope=Scope.TREE, session_args=("id",), logged=False)
def purge_session(tx: Tx, q: Queries, a: Args) -> Result:
    """Remove at most ``limit`` rows of the deleted session ``id`` and its subagents,
    subagents first: the streamed chunks, then the messages (their parts and usage
    cascade), then the state values of one session, then its row.  ``done`` once the
    session's row is gone.  Idempotent; touches only a session hidden for deletion."""
    sid = arg_id(a, "id")
    limit = _limit(a, PURGE_ROWS)
    leaf = tx.execute(q["purge_leaf"], {"id": sid})
    if not leaf:
        return {"id": sid, "done": True, "rows": 0}
    target = str(leaf[0][0])
    rows = len(tx.execute(q["purge_chunks"], {"id": target, "limit": limit}))
    for name in ("purge_messages", "purge_state"):
        if rows < limit:
            rows += len(tx.execute(q[name], {"id": target, "limit": limit - rows}))
    if rows >= limit:
        return {"id": sid, "done": False, "rows": rows}
    tx.execute(q["purge_session_row"], (target,))
    return {"id": sid, "done": target == sid, "rows": rows + 1}


def _copy_batch(
    tx: Tx, q: Queries, sid: str, source: str, upto: int, limit: int, now: float
) -> Result:
    """The next messages (at most *limit*) of *source* up to seq *upto* into the hidden
    fork *sid*; the fork is seen once the last is in.  A source deleted meanwhile
    abandons the fork (its rows are purged; the caller gets ``NotFound``)."""
    if not tx.execute(q["session_exists"], (source,)):
        tx.execute(q["session_fork_abandon"], (sid,))
        return {"id": sid, "abandoned": True}
    after = int(tx.execute(q["message_last_seq"], (sid,))[0][0])
    ids = tx.execute(
        q["fork_message_ids"], {"source": source, "after": after, "upto": upto, "limit": limit}
    )
    for (old_id,) in ids:
        new = derived_id("fork", sid, old_id)
        tx.execute(q["fork_copy_message"], (new, sid, old_id))
        tx.execute(q["fork_copy_parts"], (new, sid, old_id))
        tx.execute(q["fork_copy_chunks"], (new, old_id))
        tx.execute(q["fork_copy_usage"], (new, sid, old_id))
    if len(ids) < limit:
        tx.execute(q["session_fork_done"], (now, sid))
        return {"id": sid, "done": True, "copied": len(ids)}
    tx.execute(q["session_touch"], (now, sid))  # progress: not a fork left for dead
    return {"id": sid, "done": False, "copied": len(ids)}


@OPERATIONS.declare("fork_copy", scope=Scope.TREE, session_args=("id",), logged=False)
def fork_copy(tx: Tx, q: Queries, a: Args) -> Result:
    """The next batch of a fork under way (see ``fork_session``): ``done`` once it is
    whole and seen, ``abandoned`` if it never will be (its source was deleted, or the
    fork was given up on)."""
    sid = arg_id(a, "id")
    limit = _limit(a, FORK_MESSAGES)
    rows = tx.execute(q["session_job"], (sid,))
    if not rows or rows[0][0] == "delete":
        return {"id": sid, "abandoned": True}
    job, _owner, source, upto = rows[0]
    if job is None:
        return {"id": sid, "done": True}
    return _copy_batch(tx, q, sid, str(source), int(upto), limit, float(a["now"]))


@OPERATIONS.declare("abandon_fork", scope=Scope.TREE, session_args=("id",), logged=False)
def abandon_fork(tx: Tx, q: Queries, a: Args) -> Result:
    """Give up a fork under way (its caller failed, or its process died): it will
    never be seen; ``purge_session`` removes what was copied."""
    sid = arg_id(a, "id")
    tx.execute(q["session_fork_abandon"], (sid,))
    rows = tx.execute(q["session_job"], (sid,))
    return {"id": sid, "purge": bool(rows) and rows[0][0] == "delete"}


@OPERATIONS.declare("fork_session", scope=Scope.TREE, session_args=("source_id",), creates="id")
def fork_session(tx: Tx, q: Queries, a: Args) -> Result:
    """A new session holding a copy of the source's messages up to ``at_seq``: made
    hidden (``job = 'fork'``, ``owner``: the process copying it), with the first
    ``limit`` messages; ``done`` if that was all of them, else ``fork_copy`` copies
    the rest, and the fork is seen once the last batch is in."""
    sid = arg_id(a, "id")
    source = arg_id(a, "source_id")
    at_seq = arg_int(a, "at_seq", minimum=0)
    title = arg_str(a, "title")
    owner = arg_str(a, "owner", limit=512)
    now = arg_time(a, "created_at")
    limit = _limit(a, FORK_MESSAGES)
    src = session_row(tx, q, source)
    last = tx.execute(q["message_last_seq"], (source,))[0][0]
    if at_seq is None:
        at_seq = last
    elif at_seq > last:
        raise errors.NotFound(f"session {source!r} has no message {at_seq} (it has {last})")
    existing = tx.execute(q["session_job"], (sid,))
    if existing:
        job, _owner, origin, seq = existing[0]
        if (origin, seq) == (source, at_seq) and job != "delete":
            # The same fork, retried: whole already, or to be carried on.
            return {"id": sid, "fork_seq": at_seq, "duplicate": True, "done": job is None}
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
            "fork",
            owner,
        ),
    )
    copied = _copy_batch(tx, q, sid, source, at_seq, limit, now)
    return {"id": sid, "fork_seq": at_seq, "done": bool(copied.get("done"))}


# -- messages --------------------------------------------------------------------------------


def meta_json(meta: Args) -> str:
    """The JSON text of a checked metadata object (``{}`` costs nothing)."""
    return to_json(meta) if meta else "{}"


def check_part(part: object, what: str) -> dict[str, Any]:
    """A message part's operation JSON from outside, checked."""
    if not isinstance(part, dict):
        raise errors.InvalidInput(f"{what}: must be an object")
    kind = part.get("kind")
    if kind not in PART_KINDS:
        raise errors.InvalidInput(
            f"{what}: unknown part kind {kind!r}; known: {', '.join(PART_KINDS)}"
        )
    meta = part.get("meta")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise errors.InvalidInput(f"{what}: meta must be an object")
    dump_json(meta, f"{what} meta", MAX_PART_META)
    return {"kind": kind, "meta": meta, **check_encoded(part, what)}


def insert_part(
    tx: Tx, q: Queries, message_id: str, session_id: str, seq: int, part: Args, now: float
) -> None:
    """Insert a checked part."""
    enc, body, sha, size = columns(tx, q, part, now)
    meta = meta_json(part["meta"])
    tx.execute(
        q["part_insert"], (message_id, seq, session_id, part["kind"], meta, enc, body, sha, size)
    )


def check_usage(usage: object) -> dict[str, Any] | None:
    """A message's usage from outside, checked: counts and a cost (None: none)."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise errors.InvalidInput("usage must be an object")
    unknown = set(usage) - set(USAGE_FIELDS)
    if unknown:
        raise errors.InvalidInput(f"usage has unknown fields: {', '.join(sorted(unknown))}")
    checked: dict[str, Any] = {f: arg_int(usage, f) or 0 for f in _COUNTS}
    checked["cost"] = check_number(usage.get("cost", 0.0), "usage cost", minimum=0.0)
    return checked


def _usage(
    tx: Tx, q: Queries, message_id: str, session_id: str, model: str | None, usage: Args | None
) -> None:
    if usage is None:
        return
    counts = [usage.get(f) or 0 for f in _COUNTS]
    tx.execute(q["usage_upsert"], (message_id, session_id, model, *counts, usage.get("cost", 0.0)))


def check_chunks(chunks: object) -> list[dict[str, Any]]:
    """Streamed text from outside, checked."""
    if not isinstance(chunks, list) or not chunks:
        raise errors.InvalidInput("chunks must be a non-empty list")
    out = []
    for c in chunks:
        if not isinstance(c, dict):
            raise errors.InvalidInput("each chunk must be an object")
        kind = c.get("kind")
        if kind not in STREAMED_KINDS:
            raise errors.InvalidInput(
                f"only {' and '.join(STREAMED_KINDS)} parts stream, not {kind!r}"
            )
        out.append(
            {
                "part_seq": arg_int(c, "part_seq", optional=False),
                "seq": arg_int(c, "seq", optional=False),
                "kind": kind,
                "text": arg_str(c, "text", optional=False, limit=MAX_TEXT),
            }
        )
    return out


def check_append(a: Args) -> dict[str, Any]:
    mid = arg_id(a, "id")
    role = arg_str(a, "role", optional=False, limit=ROLES_MAX)
    if not role:
        raise errors.InvalidInput("role must not be empty")
    status = a.get("status", "complete")
    if status not in ("complete", "streaming"):
        raise errors.InvalidInput(f"a new message is 'complete' or 'streaming', not {status!r}")
    parts = a.get("parts")
    if parts is None:
        parts = []
    if not isinstance(parts, list):
        raise errors.InvalidInput("parts must be a list")
    return {
        "id": mid,
        "session_id": arg_id(a, "session_id"),
        "role": role,
        "status": status,
        "model": arg_str(a, "model", limit=MAX_MODEL),
        "metadata": json.loads(arg_meta(a)),
        "parts": [check_part(p, f"part {i} of message {mid}") for i, p in enumerate(parts)],
        "usage": check_usage(a.get("usage")),
        "created_at": arg_time(a, "created_at"),
    }


@OPERATIONS.declare("append_message", scope=Scope.SESSION, check=check_append)
def append_message(tx: Tx, q: Queries, a: Args) -> Result:
    mid, sid, role, model = a["id"], a["session_id"], a["role"], a["model"]
    status = a.get("status", "complete")
    now = a["created_at"]
    existing = tx.execute(q["message_identity"], (mid,))
    if existing:
        if existing[0][0] == sid:
            return {"id": mid, "seq": existing[0][1], "duplicate": True}
        raise errors.AlreadyExists(f"message {mid!r} already exists in another session")
    session_row(tx, q, sid)
    seq = tx.execute(q["message_last_seq"], (sid,))[0][0] + 1
    done = now if status == "complete" else None
    metadata = meta_json(a["metadata"])
    tx.execute(q["message_insert"], (mid, sid, seq, role, status, model, metadata, now, done))
    for i, part in enumerate(a["parts"]):
        insert_part(tx, q, mid, sid, i, part, now)
    _usage(tx, q, mid, sid, model, a["usage"])
    tx.execute(q["session_touch"], (now, sid))
    return {"id": mid, "seq": seq, "created_at": now}


def streaming_status(tx: Tx, q: Queries, mid: str, sid: str) -> str:
    """The status of message *mid* of session *sid* (``NotFound`` if it is not there)."""
    rows = tx.execute(q["message_identity"], (mid,))
    if not rows or rows[0][0] != sid:
        raise errors.NotFound(f"no message {mid!r} in session {sid!r}")
    return str(rows[0][2])


def insert_chunks(tx: Tx, q: Queries, mid: str, sid: str, chunks: Sequence[Args]) -> None:
    """Streamed text (checked chunks): each chunk is a new row keyed (message, part,
    seq), so a replay inserts nothing and no part is ever rewritten whole."""
    for c in chunks:
        part_seq = c["part_seq"]
        tx.execute(q["part_insert_streamed"], (mid, part_seq, sid, c["kind"]))
        tx.execute(q["chunk_insert"], (mid, part_seq, c["seq"], c["text"]))


def finish_streaming(
    tx: Tx,
    q: Queries,
    mid: str,
    sid: str,
    a: Args,
    model: str | None = None,
    known: bool = False,
) -> None:
    """Mark the streaming message *mid* ``complete`` or ``error`` (``a``, checked:
    status, error, usage, now), with its usage.  *known*: the caller knows the
    message's *model* (else it is read)."""
    now = a["now"]
    if not known:
        model = tx.execute(q["message_model"], (mid,))[0][0]
    _usage(tx, q, mid, sid, model, a.get("usage"))
    tx.execute(q["message_finish"], (a["status"], a.get("error"), now, mid))
    tx.execute(q["session_touch"], (now, sid))


def check_finish(a: Args) -> dict[str, Any]:
    """How a streamed message ends, from outside, checked."""
    status = a.get("status")
    if status not in ("complete", "error"):
        raise errors.InvalidInput(f"a message finishes 'complete' or 'error', not {status!r}")
    return {
        "status": status,
        "error": arg_str(a, "error", limit=MAX_ERROR_TEXT),
        "usage": check_usage(a.get("usage")),
    }


def check_open(a: Args) -> dict[str, Any]:
    """A streamed message's row, from outside, checked."""
    role = arg_str(a, "role", optional=False, limit=ROLES_MAX)
    if not role:
        raise errors.InvalidInput("role must not be empty")
    return {
        "role": role,
        "model": arg_str(a, "model", limit=256),
        "metadata": json.loads(arg_meta(a)),
        "created_at": arg_time(a, "created_at"),
    }


def create_streaming(tx: Tx, q: Queries, mid: str, sid: str, a: Args) -> tuple[int, bool]:
    """A ``streaming`` message *mid* of session *sid* (``a``, checked: role, model,
    metadata, created_at), unless it exists: (its seq, whether it was made now).  The
    session's ``updated_at`` is not touched (the write that finishes it does)."""
    role, model, metadata, now = a["role"], a["model"], meta_json(a["metadata"]), a["created_at"]
    existing = tx.execute(q["message_identity"], (mid,))
    if existing:
        if existing[0][0] == sid:
            return int(existing[0][1]), False
        raise errors.AlreadyExists(f"message {mid!r} already exists in another session")
    session_row(tx, q, sid)
    seq = int(tx.execute(q["message_last_seq"], (sid,))[0][0]) + 1
    tx.execute(q["message_insert"], (mid, sid, seq, role, "streaming", model, metadata, now, None))
    return seq, True


def _check_chunks(a: Args) -> dict[str, Any]:
    return {
        "message_id": arg_id(a, "message_id"),
        "session_id": arg_id(a, "session_id"),
        "chunks": check_chunks(a.get("chunks")),
    }


@OPERATIONS.declare("append_chunks", scope=Scope.SESSION, logged=False, check=_check_chunks)
def append_chunks(tx: Tx, q: Queries, a: Args) -> Result:
    """Streamed text of one flush (streams now write ``stream_write``; kept for spool
    journals and callers of the operation)."""
    mid, sid = a["message_id"], a["session_id"]
    if streaming_status(tx, q, mid, sid) != "streaming":
        return {"duplicate": True}  # the message was finished: this is a replay
    insert_chunks(tx, q, mid, sid, a["chunks"])
    return {"id": mid}


def _check_add_part(a: Args) -> dict[str, Any]:
    mid = arg_id(a, "message_id")
    seq = arg_int(a, "seq", optional=False)
    return {
        "message_id": mid,
        "session_id": arg_id(a, "session_id"),
        "seq": seq,
        "part": check_part(a.get("part"), f"part {seq} of message {mid}"),
        "now": arg_time(a, "now"),
    }


@OPERATIONS.declare("add_part", scope=Scope.SESSION, logged=False, check=_check_add_part)
def add_part(tx: Tx, q: Queries, a: Args) -> Result:
    mid, sid, seq = a["message_id"], a["session_id"], a["seq"]
    if streaming_status(tx, q, mid, sid) != "streaming":
        return {"duplicate": True}
    if tx.execute(q["part_exists"], (mid, seq)):
        return {"duplicate": True}
    insert_part(tx, q, mid, sid, seq, a["part"], a["now"])
    return {"id": mid}


def _check_finish_message(a: Args) -> dict[str, Any]:
    return {
        "message_id": arg_id(a, "message_id"),
        "session_id": arg_id(a, "session_id"),
        **check_finish(a),
        "now": arg_time(a, "now"),
    }


@OPERATIONS.declare("finish_message", scope=Scope.SESSION, check=_check_finish_message)
def finish_message(tx: Tx, q: Queries, a: Args) -> Result:
    mid, sid = a["message_id"], a["session_id"]
    if streaming_status(tx, q, mid, sid) != "streaming":
        return {"duplicate": True}
    finish_streaming(tx, q, mid, sid, a)
    return {"id": mid}
