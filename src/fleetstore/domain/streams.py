"""The operation a streamed reply is written with: ``stream_write``.

A stream (``domain/history.py``, ``Stream``) buffers what it is given and writes it
in as few transactions as it can: the message row with its first flush, the text
and whole parts (a tool call and its result) of one flush window together, and the
end of the reply (its last text, its usage, its status) with the state values and
effects the caller attached to it.  Each flush is one ``stream_write``: one
operation, one transaction, logged in ``applied_ops`` so that a replay (the spool, a
caller's retry) changes nothing.  Before, a reply cost a transaction per call
(open, each flush, each part, the finish): 6-7 commits for a turn with one tool call.
"""

from __future__ import annotations

from typing import Any

from fleetstore import errors
from fleetstore.core.validate import (
    STATE_KEY_MAX,
    STATE_NAMESPACE_MAX,
    arg_id,
    arg_int,
    arg_str,
    arg_time,
    check_object,
)
from fleetstore.domain.codec import check_encoded
from fleetstore.domain.history_ops import (
    check_chunks,
    check_finish,
    check_open,
    check_part,
    create_streaming,
    finish_streaming,
    insert_chunks,
    insert_part,
    streaming_status,
)
from fleetstore.domain.operations import Args, Declarations, Queries, Result, Scope
from fleetstore.domain.state import write_state
from fleetstore.engine.base import Tx

OPERATIONS = Declarations()

#: Most whole parts, chunks or state values one write carries (a flush is small).
MAX_ITEMS = 10_000


def _items(a: Args, key: str) -> list[dict[str, Any]]:
    value = a.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise errors.InvalidInput(f"{key} must be a list of at most {MAX_ITEMS} objects")
    return [check_object(item, f"an item of {key}") for item in value]


def _check(a: Args) -> dict[str, Any]:
    mid = arg_id(a, "message_id")
    args: dict[str, Any] = {
        "message_id": mid,
        "session_id": arg_id(a, "session_id"),
        "now": arg_time(a, "now"),
    }
    if a.get("open") is not None:
        args["open"] = check_open({**check_object(a["open"], "open"), "now": args["now"]})
    chunks = _items(a, "chunks")
    if chunks:
        args["chunks"] = check_chunks(chunks)
    parts = []
    for item in _items(a, "parts"):
        seq = arg_int(item, "seq", optional=False)
        parts.append({"seq": seq, "part": check_part(item.get("part"), f"part {seq} of {mid}")})
    if parts:
        args["parts"] = parts
    states = []
    for item in _items(a, "state"):
        ns = arg_str(item, "namespace", optional=False, limit=STATE_NAMESPACE_MAX, empty=False)
        key = arg_str(item, "key", optional=False, limit=STATE_KEY_MAX, empty=False)
        value = check_encoded(item.get("value"), f"state {ns}/{key}", ("json", "bytes"))
        states.append({"namespace": ns, "key": key, "value": value})
    if states:
        args["state"] = states
    if a.get("finish") is not None:
        args["finish"] = check_finish(check_object(a["finish"], "finish"))
    return args


@OPERATIONS.declare("stream_write", scope=Scope.SESSION, session_args=("session_id",), check=_check)
def stream_write(tx: Tx, q: Queries, a: Args) -> Result:
    """Write what a stream buffered, in one transaction: ``open`` (the message's
    role, model, metadata and ``created_at``: the message is created unless it
    exists), then ``chunks`` (streamed text), ``parts`` (``{"seq", "part"}``),
    ``state`` (``{"namespace", "key", "value"}``, put as ``put_state`` would) and
    ``finish`` (``{"status", "error", "usage"}``).  Once the message is no longer
    ``streaming`` the write is a replay and changes nothing."""
    mid, sid, now = a["message_id"], a["session_id"], a["now"]
    seq: int | None = None
    made = False
    opened = a.get("open")
    if opened is not None:
        seq, made = create_streaming(tx, q, mid, sid, opened)
    # Made in this transaction: streaming, no part yet, its session there; else look.
    if not made and streaming_status(tx, q, mid, sid) != "streaming":
        return {"id": mid, "seq": seq, "duplicate": True}
    chunks = a.get("chunks")
    if chunks:
        insert_chunks(tx, q, mid, sid, chunks)
    for item in a.get("parts") or ():
        part_seq = item["seq"]
        if made or not tx.execute(q["part_exists"], (mid, part_seq)):
            insert_part(tx, q, mid, sid, part_seq, item["part"], now)
    for item in a.get("state") or ():
        write_state(tx, q, {**item, "session_id": sid, "now": now}, check_session=not made)
    finish = a.get("finish")
    if finish is not None:
        model = opened["model"] if made and opened is not None else None
        finish_streaming(tx, q, mid, sid, {**finish, "now": now}, model=model, known=made)
    elif made:
        tx.execute(q["session_touch"], (now, sid))
    return {"id": mid, "seq": seq}


__all__ = ["OPERATIONS", "stream_write"]
