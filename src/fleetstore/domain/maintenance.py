"""The operations maintenance needs: batched deletes of session trees, of blob rows
no row refers to, and of old ``applied_ops`` rows; and the rewrites of ``fleetstore
redact`` (``mnt_redact``, ``mnt_redact_effect``).

Each operation does a bounded amount of work in one transaction (at most
``limit`` rows), so deleting a 20,000-message session, or pruning millions of
applied operations, never holds the write lock for long: the caller
(``fleetstore.admin.maintain``) calls it again until it reports ``done``.  A
single transaction deleting a 20,000-message session held the lock 0.25 s.

The deletes are not logged in ``applied_ops``: each is idempotent by nature
(deleting what is no longer there deletes nothing), and logging maintenance
would grow the very table it prunes.  A redaction is logged (its id made from what it
rewrites, so a run again after a crash finds it applied), and applies only if the
content is still what it was read as (``expect``, ``stored_digest``): a row written
meanwhile is left for the next run.  None is ever spooled (maintenance calls
``Store.apply``): past the budget it raises ``StoreBusy`` and maintenance stops.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fleetstore import errors
from fleetstore.core.ids import is_valid_id
from fleetstore.core.validate import MAX_ERROR_TEXT, arg_int, arg_meta, arg_str, arg_when
from fleetstore.domain.blobs import check_sha
from fleetstore.domain.codec import check_encoded, columns
from fleetstore.domain.operations import Args, Declarations, Queries, Result, Scope
from fleetstore.domain.outbox_ops import MAX_ERROR
from fleetstore.engine.base import Tx

OPERATIONS = Declarations()

#: Most rows one maintenance operation may touch.
MAX_LIMIT = 100_000


@OPERATIONS.declare("mnt_delete_tree", scope=Scope.TREE, session_args=("id",), logged=False)
def _delete_tree(tx: Tx, q: Queries, a: Args) -> Result:
    """Delete up to ``limit`` rows of the session tree under ``id`` (the session and
    its subagents): messages first (their parts, chunks and usage cascade), then
    state values, then, once both are gone, the sessions.  With ``written_before``,
    nothing is deleted (``skipped``) if any session or state value of the tree was
    written at or after it: retention re-checks, in every batch, that the tree it
    archived has not been written to since."""
    sid = a.get("id")
    if not is_valid_id(sid):
        raise errors.InvalidInput(f"id must be a session id, not {sid!r}")
    limit = arg_int(a, "limit", False, 1, MAX_LIMIT)
    before = arg_when(a, "written_before", optional=True)
    count, newest_session, newest_state = tx.execute(q["mnt_tree_freshness"], {"id": sid})[0]
    if not count:
        return {"id": sid, "messages": 0, "states": 0, "sessions": 0, "done": True, "gone": True}
    if before is not None:
        newest = max(newest_session or 0.0, newest_state or 0.0)
        if newest >= before:
            return {"id": sid, "skipped": True, "newest": newest, "done": False}
    params = {"id": sid, "limit": limit}
    messages = len(tx.execute(q["mnt_tree_delete_messages"], params))
    states = sessions = 0
    if messages < limit:
        states = len(tx.execute(q["mnt_tree_delete_state"], {"id": sid, "limit": limit - messages}))
        if messages + states < limit:
            tx.execute(q["mnt_tree_delete_sessions"], {"id": sid})
            sessions = count
    return {
        "id": sid,
        "messages": messages,
        "states": states,
        "sessions": sessions,
        "done": bool(sessions),
    }


def blob_referrers(tx: Tx, q: Queries) -> list[tuple[str, str]]:
    """Every (table, column) whose foreign key names ``blobs``: parts, state, effects,
    graph checkpoints, and any table a later migration adds, found in the schema so
    that a new kind of reference can never be collected as garbage."""
    return [(str(t), str(c)) for t, c in tx.execute(q["mnt_blob_referrers"])]


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def referenced(tx: Tx, q: Queries, shas: list[str]) -> set[str]:
    """Which of *shas* some row refers to (one indexed or scanning query per referrer)."""
    import json

    found: set[str] = set()
    if not shas:
        return found
    doc = json.dumps(shas)
    for table, column in blob_referrers(tx, q):
        col = _ident(column)
        rows = tx.execute(
            f"SELECT DISTINCT {col} FROM {_ident(table)} WHERE {col} IN ({q['mnt_json_ids']})",
            (doc,),
        )
        found.update(str(r[0]) for r in rows)
    return found


@OPERATIONS.declare("mnt_delete_blobs", scope=Scope.CATALOG, logged=False)
def _delete_blobs(tx: Tx, q: Queries, a: Args) -> Result:
    """Delete the rows of the blobs in ``shas`` that no row refers to, re-checked
    inside this transaction; returns the hashes deleted (their files may go after
    the commit, see fleetstore.admin.maintain) and those kept."""
    shas = a.get("shas")
    if not isinstance(shas, list) or len(shas) > MAX_LIMIT:
        raise errors.InvalidInput(f"shas must be a list of at most {MAX_LIMIT} blob hashes")
    wanted = sorted({check_sha(s) for s in shas})
    keep = referenced(tx, q, wanted)
    deleted = []
    for sha in wanted:
        if sha in keep:
            continue
        if tx.execute(q["mnt_blob_delete"], (sha,)):
            deleted.append(sha)
    return {"deleted": deleted, "kept": sorted(keep)}


@OPERATIONS.declare("mnt_prune_ops", scope=Scope.CATALOG, logged=False)
def _prune_ops(tx: Tx, q: Queries, a: Args) -> Result:
    """Delete the ``applied_ops`` rows applied before ``applied_before`` among the next
    ``limit`` rows in key order after ``after`` and below ``below`` (operation ids are
    time-ordered, so ``below`` bounds the scan); returns the last key looked at."""
    horizon = arg_when(a, "applied_before")
    after, below = a.get("after", ""), a.get("below")
    if not isinstance(after, str) or not isinstance(below, str):
        raise errors.InvalidInput("after and below must be strings (operation id bounds)")
    rows = tx.execute(q["mnt_ops_page"], (after, below, arg_int(a, "limit", False, 1, MAX_LIMIT)))
    deleted = 0
    for op_id, applied_at in rows:
        if applied_at < horizon:
            deleted += len(tx.execute(q["mnt_ops_delete"], (op_id, horizon)))
    last: Any = rows[-1][0] if rows else None
    return {
        "deleted": deleted,
        "scanned": len(rows),
        "last": last,
        "done": len(rows) < arg_int(a, "limit", False, 1, MAX_LIMIT),
    }


def stored_digest(*fields: object) -> str:
    """A digest of a row's stored content (its encoding, inline body or blob hash, and
    for an effect its result): what a redaction expects to find."""
    digest = hashlib.sha256()
    for value in fields:
        if value is None:
            data = b"\x00none"
        elif isinstance(value, str):
            data = b"s" + value.encode("utf-8", "surrogatepass")
        else:
            data = b"b" + bytes(value)  # type: ignore[call-overload]
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def _payload(tx: Tx, q: Queries, value: object, what: str, now: float) -> dict[str, Any]:
    enc, body, sha, size = columns(tx, q, check_encoded(value, what), now)
    return {"enc": enc, "body": body, "blob_sha": sha, "size": size}


@OPERATIONS.declare("mnt_redact", scope=Scope.SESSION, session_args=("session_id",))
def _redact(tx: Tx, q: Queries, a: Args) -> Result:
    """Replace a part's body (``what`` "part"), a streamed part's chunks ("chunks": put
    back as one) or a state value ("state") with its redacted form, if the row still
    holds what was read (``expect``); ``{"changed": True}`` otherwise."""
    what, now = a.get("what"), a["now"]
    sid = a.get("session_id")
    if not is_valid_id(sid):
        raise errors.InvalidInput(f"session_id must be a session id, not {sid!r}")
    expect = a.get("expect")
    if what == "part" or what == "chunks":
        keys = {"message_id": a.get("message_id"), "seq": arg_int(a, "seq", False, 0)}
        if not is_valid_id(keys["message_id"]):
            raise errors.InvalidInput("message_id must be a message id")
        if what == "part":
            rows = tx.execute(q["red_part"], keys)
            if not rows or stored_digest(*rows[0]) != expect:
                return {"changed": True}
            tx.execute(q["red_part_set"], {**keys, **_payload(tx, q, a.get("value"), what, now)})
            return {"redacted": what}
        params = {"message_id": keys["message_id"], "part_seq": keys["seq"]}
        text = a.get("text")
        if not isinstance(text, str):
            raise errors.InvalidInput("text must be a string")
        rows = tx.execute(q["red_chunks"], params)
        if not rows or stored_digest("".join(str(r[1]) for r in rows)) != expect:
            return {"changed": True}
        tx.execute(q["red_chunks_clear"], params)
        tx.execute(q["red_chunk_put"], {**params, "text": text})
        return {"redacted": what}
    if what == "state":
        keys = {"session_id": sid, "namespace": a.get("namespace"), "key": a.get("key")}
        if not isinstance(keys["namespace"], str) or not isinstance(keys["key"], str):
            raise errors.InvalidInput("namespace and key must be strings")
        rows = tx.execute(q["red_state"], keys)
        if not rows or stored_digest(*rows[0]) != expect:
            return {"changed": True}
        tx.execute(q["red_state_set"], {**keys, **_payload(tx, q, a.get("value"), what, now)})
        return {"redacted": what}
    if what == "session":
        # A session's own row, in the file that holds it (a sharded catalog's copy is
        # refreshed from there).
        title = arg_str(a, "title")
        metadata = arg_meta(a)
        rows = tx.execute(q["red_session"], {"id": sid})
        if not rows or stored_digest(*rows[0]) != expect:
            return {"changed": True}
        tx.execute(q["red_session_set"], {"id": sid, "title": title, "metadata": metadata})
        return {"redacted": what}
    if what == "message":
        mid = a.get("message_id")
        if not is_valid_id(mid):
            raise errors.InvalidInput("message_id must be a message id")
        metadata = arg_meta(a)
        error = arg_str(a, "error", limit=MAX_ERROR_TEXT)
        rows = tx.execute(q["red_message"], {"id": mid})
        if not rows or stored_digest(*rows[0]) != expect:
            return {"changed": True}
        tx.execute(q["red_message_set"], {"id": mid, "metadata": metadata, "error": error})
        return {"redacted": what}
    raise errors.InvalidInput(
        f"what must be part, chunks, state, session or message, not {what!r:.40}"
    )


@OPERATIONS.declare("mnt_redact_effect", scope=Scope.CATALOG, session_args=())
def _redact_effect(tx: Tx, q: Queries, a: Args) -> Result:
    """Replace an effect's payload, result and errors (the last one, and each attempt's
    with its traceback) with their redacted forms, if it still holds what was read
    (``expect``); ``{"changed": True}`` otherwise."""
    eid = a.get("id")
    if not is_valid_id(eid):
        raise errors.InvalidInput(f"id must be an effect id, not {eid!r}")
    result = a.get("result")
    if result is not None and not isinstance(result, str):
        raise errors.InvalidInput("result must be JSON text or None")
    last_error = arg_str(a, "last_error", limit=MAX_ERROR)
    kept = a.get("errors")
    try:
        if not isinstance(json.loads(kept), list):  # type: ignore[arg-type]
            raise ValueError
    except (TypeError, ValueError):
        raise errors.InvalidInput("errors must be the JSON text of a list") from None
    rows = tx.execute(q["red_effect"], {"id": eid})
    if not rows or stored_digest(*rows[0]) != a.get("expect"):
        return {"changed": True}
    payload = _payload(tx, q, a.get("value"), "effect payload", a["now"])
    tx.execute(
        q["red_effect_set"],
        {"id": eid, **payload, "result": result, "last_error": last_error, "errors": kept},
    )
    return {"redacted": "effect"}


__all__ = ["MAX_LIMIT", "blob_referrers", "referenced", "stored_digest"]
