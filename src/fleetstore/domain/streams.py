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
from fleetstore.core.validate import arg_id, arg_int, arg_time, check_object
from fleetstore.domain.history_ops import (
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


@OPERATIONS.declare("stream_write", scope=Scope.SESSION, session_args=("session_id",))
def stream_write(tx: Tx, q: Queries, a: Args) -> Result:
    """Write what a stream buffered, in one transaction: ``open`` (the message's
    role, model, metadata and ``created_at``: the message is created unless it
    exists), then ``chunks`` (streamed text), ``parts`` (``{"seq", "part"}``),
    ``state`` (``{"namespace", "key", "value"}``, put as ``put_state`` would) and
    ``finish`` (``{"status", "error", "usage"}``).  Once the message is no longer
    ``streaming`` the write is a replay and changes nothing."""
    mid = arg_id(a, "message_id")
    sid = arg_id(a, "session_id")
    now = arg_time(a, "now")
    chunks, parts, states = _items(a, "chunks"), _items(a, "parts"), _items(a, "state")
    finish = a.get("finish")
    if finish is not None:
        check_object(finish, "finish")
    seq: int | None = None
    made = False
    opened = a.get("open")
    if opened is not None:
        opened = check_object(opened, "open")
        seq, made = create_streaming(tx, q, mid, sid, {**opened, "now": now})
    # Made in this transaction: streaming, no part yet, its session there; else look.
    if not made and streaming_status(tx, q, mid, sid) != "streaming":
        return {"id": mid, "seq": seq, "duplicate": True}
    if chunks:
        insert_chunks(tx, q, mid, sid, chunks)
    for item in parts:
        part_seq = arg_int(item, "seq", optional=False)
        if made or not tx.execute(q["part_exists"], (mid, part_seq)):
            insert_part(tx, q, mid, sid, part_seq, item.get("part"), now)
    for item in states:
        write_state(tx, q, {**item, "session_id": sid, "now": now}, check_session=not made)
    if finish is not None:
        model = opened.get("model") if made and opened is not None else None
        finish_streaming(tx, q, mid, sid, {**finish, "now": now}, model=model, known=made)
    elif made:
        tx.execute(q["session_touch"], (now, sid))
    return {"id": mid, "seq": seq}


__all__ = ["OPERATIONS", "stream_write"]
