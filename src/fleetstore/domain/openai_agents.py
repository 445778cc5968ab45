"""Conversation items of the OpenAI Agents SDK, kept as fleetstore history.

The storage behind ``fleetstore.integrations.openai_agents`` and
``fleetstore.integrations.openai_agents.importer``; it imports neither the SDK
nor anything that needs it, so every process that may replay a spool journal
(``fleetstore recover`` included) registers these operations.

How items are stored: one fleetstore session per SDK ``session_id`` (its id
derived from the SDK's, ``session_key``; the SDK's id in the session metadata
under ``openai_agents``), one message per item, in order.  An item ``{"role":
R, "content": TEXT}`` (what ``Runner.run(agent, "text")`` adds) becomes a
message of role R with one ``Text`` part; any other item is kept exactly as its
JSON text in one ``Text`` part, with the message's role taken from the item
(``tool`` for tool outputs).  An item of at least ``blob_threshold`` bytes is a
blob file, written before the transaction like every other payload.

Operations (``agt_*``), each one transaction, logged so a retry applies once:

* ``agt_add_items``: a batch of items, all or none; it creates the session the
  first time.  Past the write budget it may be spooled: a read of that
  session in this process then still returns it (``pending`` below).
* ``agt_pop_item``: delete the last item if it is still the one the caller
  read (``VersionConflict`` otherwise: the caller reads again).  Never spooled.
* ``agt_clear_session``: delete every item, keeping the session.  May be spooled.
* ``agt_replace_items``: the SDK's compaction: delete the items the compaction
  read (and an expired prefix the caller names) and append its output, if the
  session still ends with exactly those items (``VersionConflict`` otherwise:
  an item appended meanwhile is never lost).  Never spooled.

Reading your own spooled writes: while an ``agt_add_items`` or
``agt_clear_session`` of this process waits in its spool, ``get_items`` returns
the stored items with the pending ones applied on top, in order (an operation
counts as pending until ``applied_ops`` holds its id, checked in the same read
transaction).  So an agent keeps running turns while an outside process holds
the lock past the budget, and none of its turns is lost or read twice.
"""

from __future__ import annotations

import builtins
import copy
import json
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from fleetstore import errors
from fleetstore.core.ids import derived_id, is_valid_id, new_id
from fleetstore.core.validate import (
    ROLES_MAX,
    arg_id,
    arg_time,
    check_bool,
    check_id,
    check_text,
    dump_json,
)
from fleetstore.domain.codec import encode_parts
from fleetstore.domain.history import LISTING_SYNC_WAIT, messages_from_rows
from fleetstore.domain.history_ops import (
    append_message,
    check_append,
    check_create,
    create_session,
)
from fleetstore.domain.operations import (
    Args,
    Declarations,
    Delivery,
    Operation,
    Queries,
    Result,
    Scope,
)
from fleetstore.domain.ports import StorePort
from fleetstore.models import Message, Text

if TYPE_CHECKING:
    from fleetstore.engine.base import Tx

OPERATIONS = Declarations()

#: The session metadata key that marks (and names) an SDK session.
META_KEY: Final = "openai_agents"
#: Roles of the items kept as plain text (the SDK's "easy input message").
TEXT_ROLES: Final = ("user", "assistant", "system", "developer")
#: Longest SDK session id accepted.
MAX_SESSION_ID: Final = 1024
#: Times ``pop_item`` reads again when another writer changed the end meanwhile.
POP_ATTEMPTS: Final = 100

Item = dict[str, Any]


def session_key(session_id: str) -> str:
    """The fleetstore session id of the SDK session *session_id*: derived, so
    every process maps one SDK session to the same fleetstore session."""
    return derived_id("openai-agents", check_session_id(session_id))


def check_session_id(session_id: object) -> str:
    if not isinstance(session_id, str) or not 0 < len(session_id) <= MAX_SESSION_ID:
        raise errors.InvalidInput(
            f"session_id must be a non-empty string of at most {MAX_SESSION_ID} characters, "
            f"not {session_id!r}"
        )
    return check_text(session_id, "session_id")


# -- items <-> messages ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EncodedItem:
    """An item ready for ``agt_add_items``: its message's role, metadata and
    text, and the item exactly as reading it back returns it."""

    role: str
    metadata: dict[str, Any]
    text: str
    item: Item


def encode_item(item: object, index: int = 0) -> EncodedItem:
    """Check *item* and choose how to store it.  Nothing is written."""
    if not isinstance(item, Mapping):
        raise errors.InvalidInput(
            f"item {index} must be a dict (a TResponseInputItem), not {type(item).__name__}"
        )
    data = dict(item)
    for key in data:
        if not isinstance(key, str):
            raise errors.InvalidInput(f"item {index} has a key that is not a string: {key!r}")
    role, content = data.get("role"), data.get("content")
    if set(data) == {"role", "content"} and role in TEXT_ROLES and isinstance(content, str):
        check_text(content, f"item {index} content")
        return EncodedItem(str(role), {META_KEY: {"codec": "text"}}, content, data)
    text = dump_json(data, f"item {index}")
    kind = data.get("type")
    kind = kind if isinstance(kind, str) and kind else "message"
    if isinstance(role, str) and 0 < len(role) <= ROLES_MAX and role.isprintable():
        message_role = role
    else:
        message_role = "tool" if kind.endswith("_output") else "assistant"
    meta = {META_KEY: {"codec": "json", "type": kind[:128]}}
    # What a read returns: the JSON parsed again (a deep copy, and tuples as lists).
    return EncodedItem(message_role, meta, text, json.loads(text))


def message_item(message: Message) -> Item:
    """The item a stored message holds.  A message written through another API
    (no ``openai_agents`` metadata) reads as ``{"role": ..., "content": text}``."""
    meta = message.metadata.get(META_KEY)
    if isinstance(meta, Mapping) and meta.get("codec") == "json":
        try:
            value = json.loads(message.text)
        except ValueError:
            raise errors.CorruptStore(
                f"message {message.id} of session {message.session_id}: its item is not JSON"
            ) from None
        if not isinstance(value, dict):
            raise errors.CorruptStore(
                f"message {message.id} of session {message.session_id}: its item is not an object"
            )
        return value
    return {"role": message.role, "content": message.text}


# -- this process's spooled writes, for reading them back ------------------------------------


@dataclass(frozen=True, slots=True)
class _Pending:
    op_id: str
    #: The items the operation adds, or None: it clears the session.
    items: tuple[Item, ...] | None


_pending_lock = threading.Lock()
_pending: weakref.WeakKeyDictionary[StorePort, dict[str, list[_Pending]]] = (
    weakref.WeakKeyDictionary()
)


def _after_fork_in_child() -> None:
    # The parent's spooled writes are the parent's (the child's spool starts empty),
    # and another parent thread may have held the lock at fork time.
    global _pending_lock
    _pending_lock = threading.Lock()
    _pending.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _remember(store: StorePort, sid: str, entry: _Pending) -> None:
    with _pending_lock:
        _pending.setdefault(store, {}).setdefault(sid, []).append(entry)


def _pending_of(store: StorePort, sid: str) -> list[_Pending]:
    with _pending_lock:
        return list(_pending.get(store, {}).get(sid, ()))


def _forget(store: StorePort, sid: str, applied: set[str]) -> None:
    """Drop entries that landed; all of them once the spool holds nothing of *sid*
    (an operation rejected on replay never lands: it is in ``rejected.jsonl``)."""
    gone = not store.spool_pending(sid)
    with _pending_lock:
        by_sid = _pending.get(store)
        if by_sid is None or sid not in by_sid:
            return
        left = [] if gone else [p for p in by_sid[sid] if p.op_id not in applied]
        if left:
            by_sid[sid] = left
        else:
            del by_sid[sid]


# -- the operations --------------------------------------------------------------------------


def _last_message(tx: Tx, q: Queries, sid: str) -> str | None:
    rows = tx.execute(q["agt_last_message"], (sid,))
    return str(rows[0][0]) if rows else None


@OPERATIONS.declare("agt_add_items", scope=Scope.SESSION, creates="session_id")
def _add_items(tx: Tx, q: Queries, a: Args) -> Result:
    sid = arg_id(a, "session_id")
    agents_sid = check_session_id(a.get("agents_session_id"))
    now = arg_time(a, "created_at")
    messages = a.get("messages")
    if not isinstance(messages, list) or not messages:
        raise errors.InvalidInput("messages must be a non-empty list")
    if not tx.execute(q["session_exists"], (sid,)):
        create = {"id": sid, "metadata": {META_KEY: {"session_id": agents_sid}}}
        create_session(tx, q, check_create({**create, "created_at": now, "now": a["now"]}))
    if "expect_last" in a:
        # An importer appends only after the items it found: never after someone else's.
        last, expected = _last_message(tx, q, sid), a["expect_last"]
        if last != expected:
            raise errors.VersionConflict(
                f"session {agents_sid!r} ends with message {last!r}, not {expected!r}"
            )
    added = 0
    for m in messages:
        if not isinstance(m, dict):
            raise errors.InvalidInput("each message must be an object")
        result = append_message(tx, q, check_append({**m, "session_id": sid, "now": a["now"]}))
        added += not result.get("duplicate")
    return {"session_id": sid, "added": added}


@OPERATIONS.declare("agt_pop_item", scope=Scope.SESSION)
def _pop_item(tx: Tx, q: Queries, a: Args) -> Result:
    sid = arg_id(a, "session_id")
    mid = arg_id(a, "message_id")
    last = _last_message(tx, q, sid)
    if last != mid:
        raise errors.VersionConflict(f"session {sid!r} ends with message {last!r}, not {mid!r}")
    tx.execute(q["agt_message_delete"], (mid,))
    tx.execute(q["session_touch"], (arg_time(a, "now"), sid))
    return {"id": mid}


@OPERATIONS.declare("agt_clear_session", scope=Scope.SESSION)
def _clear_session(tx: Tx, q: Queries, a: Args) -> Result:
    sid = arg_id(a, "session_id")
    if not tx.execute(q["session_exists"], (sid,)):
        return {"cleared": False}
    tx.execute(q["agt_messages_clear"], (sid,))
    tx.execute(q["session_touch"], (arg_time(a, "now"), sid))
    return {"cleared": True}


def _id_list(a: Args, name: str) -> list[str]:
    value = a.get(name, [])
    if not isinstance(value, list):
        raise errors.InvalidInput(f"{name} must be a list of message ids")
    return [check_id(v, f"{name}[{i}]") for i, v in enumerate(value)]


@OPERATIONS.declare("agt_replace_items", scope=Scope.SESSION, creates="session_id")
def _replace_items(tx: Tx, q: Queries, a: Args) -> Result:
    sid = arg_id(a, "session_id")
    agents_sid = check_session_id(a.get("agents_session_id"))
    expect, prune = _id_list(a, "expect"), _id_list(a, "prune")
    whole = check_bool(a.get("whole"), "whole")
    now = arg_time(a, "now")
    messages = a.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise errors.InvalidInput("messages must be a list of objects")
    stored = [str(r[0]) for r in tx.execute(q["agt_message_ids"], (sid,))]
    # The items the compaction read must still be the session's last ones (all of
    # it, if *whole*), and the pruned prefix its first: else someone wrote since.
    tail = stored[len(stored) - len(expect) :] if expect else []
    head = stored[: len(prune)]
    overlap = len(prune) + len(expect) > len(stored)
    if (
        tail != expect
        or head != prune
        or overlap
        or (whole and len(stored) != len(prune) + len(expect))
    ):
        raise errors.VersionConflict(
            f"session {sid!r} changed since its items were read for compaction: nothing replaced"
        )
    if not tx.execute(q["session_exists"], (sid,)):
        if not messages:
            return {"session_id": sid, "removed": 0, "added": 0}
        create = {"id": sid, "metadata": {META_KEY: {"session_id": agents_sid}}}
        create_session(tx, q, check_create({**create, "created_at": now, "now": now}))
    for mid in (*prune, *expect):
        tx.execute(q["agt_message_delete"], (mid,))
    for m in messages:
        append_message(tx, q, check_append({**m, "session_id": sid, "now": now}))
    tx.execute(q["session_touch"], (now, sid))
    return {"session_id": sid, "removed": len(prune) + len(expect), "added": len(messages)}


# -- the API ---------------------------------------------------------------------------------


class _Keep:
    """``expect_last`` not given: append whatever the session ends with."""


ANY_LAST: Final = _Keep()


def add_items(
    store: StorePort,
    session_id: str,
    items: Sequence[Mapping[str, Any]],
    *,
    ids: Sequence[str] | None = None,
    created_at: Sequence[float] | None = None,
    expect_last: str | _Keep | None = ANY_LAST,
    session_created_at: float | None = None,
    delivery: Delivery = Delivery.SPOOLABLE,
) -> dict[str, Any] | None:
    """Append *items* to the SDK session *session_id* in one transaction: all of
    them or none.  *ids* (default new ones) are the messages' ids, *created_at*
    their times; with *expect_last*, only if the session still ends with that
    message (None: is empty), else ``VersionConflict``; *session_created_at*: the
    session's creation time if this creates it.  Returns the operation's
    result, or None if it went to the spool (it lands later, in order, and
    ``get_items`` in this process returns it meanwhile)."""
    sid = session_key(session_id)
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
        raise errors.InvalidInput(f"items must be a list of dicts, not {type(items).__name__}")
    for name, given in (("ids", ids), ("created_at", created_at)):
        if given is not None and len(given) != len(items):
            raise errors.InvalidInput(f"{name} must have one entry per item")
    if not items:
        return {"session_id": sid, "added": 0}
    # Every item is checked before any blob file is written.
    encoded = [encode_item(item, i) for i, item in enumerate(items)]
    parts = [encode_parts(store, [Text(e.text)]) for e in encoded]
    now = time.time()
    messages = []
    for i, e in enumerate(encoded):
        mid = new_id() if ids is None else ids[i]
        if not is_valid_id(mid):
            raise errors.InvalidInput(f"ids[{i}] is not an id: {mid!r}")
        messages.append(
            {
                "id": mid,
                "role": e.role,
                "metadata": e.metadata,
                "parts": parts[i],
                "created_at": now if created_at is None else created_at[i],
            }
        )
    args: dict[str, Any] = {
        "session_id": sid,
        "agents_session_id": session_id,
        "messages": messages,
        "created_at": now if session_created_at is None else session_created_at,
    }
    if not isinstance(expect_last, _Keep):
        args["expect_last"] = expect_last
    op = Operation("agt_add_items", args, new_id(), True)
    result = store.submit(op, delivery)
    if result is None:
        _remember(store, sid, _Pending(op.op_id, tuple(e.item for e in encoded)))
    return result


def get_items(
    store: StorePort,
    session_id: str,
    limit: int | None = None,
    *,
    _also: Callable[[Tx], Any] | None = None,
) -> list[Item]:
    """The session's items in order; with *limit* > 0 the last *limit* of them
    (still oldest first), 0 none, negative all (as the SDK's ``SQLiteSession``).
    Includes this process's writes still in its spool.  An unknown session has none."""
    sid = session_key(session_id)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)):
        raise errors.InvalidInput(f"limit must be an integer or None, not {limit!r}")
    if limit == 0 and _also is None:
        return []
    last = limit if limit is not None and limit > 0 else None
    q = store.queries
    pending = _pending_of(store, sid)

    def run(tx: Tx) -> tuple[list[Message], list[_Pending]]:
        if last is None:
            params: dict[str, Any] = {"session_id": sid, "after": 0, "limit": -1}
            rows = tx.execute(q["message_list"], params)
        else:
            rows = tx.execute(q["message_list_last"], {"session_id": sid, "limit": last})
            rows.reverse()
        waiting = [p for p in pending if not tx.execute(q["op_applied"], (p.op_id,))]
        if _also is not None:
            _also(tx)
        return messages_from_rows(store, tx, rows), waiting

    if limit == 0:
        store.read(run, session_id=sid)
        return []
    messages, waiting = store.read(run, session_id=sid)
    items = [message_item(m) for m in messages]
    for p in waiting:
        if p.items is None:
            items = []
        else:
            items.extend(copy.deepcopy(list(p.items)))
    if pending:
        _forget(store, sid, {p.op_id for p in pending} - {p.op_id for p in waiting})
    return items if last is None else items[-last:]


def wait_for_spool(store: StorePort, timeout: float | None) -> None:
    """Wait (up to *timeout*; None: the write budget) until this process's spool is
    empty; ``SpoolPending`` if it is not by then."""
    if store.spool_pending() and not store.flush(timeout) and store.spool_pending():
        raise errors.SpoolPending(
            f"{store.spool_pending()} write(s) of this process still wait in its spool "
            f"(the store is locked); nothing was changed. Retry once store.flush() returns True."
        )


def pop_item(
    store: StorePort,
    session_id: str,
    *,
    read_wait: float | None = None,
    validate: Callable[[Item], None] | None = None,
) -> Item | None:
    """Remove the session's last item and return it (None if it has none).  A
    conditional write, so never spooled: it first waits up to *read_wait* for this
    process's spooled writes to land (``SpoolPending`` if they do not), and past
    the write budget raises ``StoreBusy``; either way nothing is removed.
    *validate(item)* runs before the removal: if it raises, nothing is removed (the
    SDK's ``EncryptedSession`` authenticates there)."""
    sid = session_key(session_id)
    wait_for_spool(store, read_wait)
    q = store.queries

    def last(tx: Tx) -> list[Message]:
        rows = tx.execute(q["message_list_last"], {"session_id": sid, "limit": 1})
        return messages_from_rows(store, tx, rows)

    for _ in range(POP_ATTEMPTS):
        found = store.read(last, session_id=sid)
        if not found:
            return None
        item = message_item(found[0])
        if validate is not None:
            validate(copy.deepcopy(item))
        args = {"session_id": sid, "message_id": found[0].id, "now": time.time()}
        try:
            store.submit(Operation("agt_pop_item", args, new_id(), True), Delivery.NOW)
        except errors.VersionConflict:
            continue  # another writer changed the end of the session: read it again
        return item
    raise errors.VersionConflict(
        f"session {session_id!r}: its last item changed {POP_ATTEMPTS} times while popping"
    )


def clear_items(store: StorePort, session_id: str) -> dict[str, Any] | None:
    """Delete every item of the session (the session itself stays, with no items).
    None if the write went to the spool (reads in this process already see it)."""
    sid = session_key(session_id)
    op = Operation("agt_clear_session", {"session_id": sid, "now": time.time()}, new_id(), True)
    result = store.submit(op)
    if result is None:
        _remember(store, sid, _Pending(op.op_id, None))
    return result


@dataclass(frozen=True, slots=True)
class StoredItem:
    """An item as stored: its message's id and seq, and the item (None if the
    message does not hold one that parses)."""

    id: str
    seq: int
    item: Item | None


def _stored_items(store: StorePort, tx: Tx, rows: builtins.list[Any]) -> builtins.list[StoredItem]:
    out = []
    for m in messages_from_rows(store, tx, rows):
        try:
            item: Item | None = message_item(m)
        except errors.CorruptStore:
            item = None
        out.append(StoredItem(m.id, int(m.seq or 0), item))
    return out


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The last items of a session as stored, for the SDK's compaction: *complete*
    if there are none before them; *pending* if this process's spool holds writes
    of the session (not among them: such a snapshot must not be replaced)."""

    items: tuple[StoredItem, ...]
    complete: bool
    pending: bool


def snapshot(store: StorePort, session_id: str, limit: int) -> Snapshot:
    """The last *limit* stored items of the session, oldest first, in one read."""
    sid = session_key(session_id)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise errors.InvalidInput(f"limit must be a positive integer, not {limit!r}")
    q = store.queries
    pending = _pending_of(store, sid)

    def run(tx: Tx) -> Snapshot:
        rows = tx.execute(q["message_list_last"], {"session_id": sid, "limit": limit})
        rows.reverse()
        items = _stored_items(store, tx, rows)
        first = tx.execute(q["message_list"], {"session_id": sid, "after": 0, "limit": 1})
        complete = not items or not first or str(first[0][0]) == items[0].id
        waiting = any(not tx.execute(q["op_applied"], (p.op_id,)) for p in pending)
        return Snapshot(tuple(items), complete, waiting or bool(store.spool_pending(sid)))

    return store.read(run, session_id=sid)


def items_before(
    store: StorePort, session_id: str, before: int, after: int = 0, limit: int = 100
) -> builtins.list[StoredItem]:
    """Stored items with *after* < seq < *before*, oldest first, at most *limit*."""
    sid = session_key(session_id)
    q = store.queries

    def run(tx: Tx) -> builtins.list[StoredItem]:
        params = {"session_id": sid, "after": after, "limit": limit}
        return [s for s in _stored_items(store, tx, tx.execute(q["message_list"], params))]

    return [s for s in store.read(run, session_id=sid) if s.seq < before]


def compaction_read(
    store: StorePort, session_id: str, limit: int | None
) -> tuple[builtins.list[Item], tuple[str, ...] | None]:
    """``get_items(limit)`` and, read in the same transaction, the ids of every
    stored message of the session: what a later ``replace_items(whole=True)`` may
    replace.  None instead of the ids if this process's spool holds writes of the
    session (they are among the items, not yet stored)."""
    sid = session_key(session_id)
    q = store.queries
    ids: builtins.list[tuple[str, ...]] = []

    def run(tx: Tx) -> Any:
        ids.append(tuple(str(r[0]) for r in tx.execute(q["agt_message_ids"], (sid,))))
        return tx

    items = get_items(store, session_id, limit, _also=run)
    basis = None if store.spool_pending(sid) or _pending_of(store, sid) else ids[-1]
    return items, basis


def replace_items(
    store: StorePort,
    session_id: str,
    items: Sequence[Mapping[str, Any]],
    *,
    expect: Sequence[str],
    whole: bool,
    prune: Sequence[str] = (),
) -> dict[str, Any]:
    """The compaction's replacement, one operation in one transaction, never
    spooled: remove the messages *expect* (the session's last; all of them if
    *whole*) and *prune* (its first), append *items* after what stays.
    ``VersionConflict`` (nothing changed) if the session holds other messages there
    now; ``StoreBusy`` past the write budget."""
    sid = session_key(session_id)
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
        raise errors.InvalidInput(f"items must be a list of dicts, not {type(items).__name__}")
    encoded = [encode_item(item, i) for i, item in enumerate(items)]
    parts = [encode_parts(store, [Text(e.text)]) for e in encoded]
    now = time.time()
    messages = [
        {
            "id": new_id(),
            "role": e.role,
            "metadata": e.metadata,
            "parts": parts[i],
            "created_at": now,
        }
        for i, e in enumerate(encoded)
    ]
    args = {
        "session_id": sid,
        "agents_session_id": session_id,
        "expect": list(expect),
        "prune": list(prune),
        "whole": whole,
        "messages": messages,
        "now": now,
    }
    result = store.submit(Operation("agt_replace_items", args, new_id(), True), Delivery.NOW)
    assert result is not None  # never spooled
    return result


def stored_message_ids(store: StorePort, session_id: str) -> builtins.list[str]:
    """The ids of the session's stored messages, in order (no spooled writes)."""
    sid = session_key(session_id)
    q = store.queries
    rows = store.read(lambda tx: tx.execute(q["agt_message_ids"], (sid,)), session_id=sid)
    return [str(r[0]) for r in rows]


# -- listing sessions ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentSession:
    """An SDK session as stored: its id, its fleetstore session's id, times and
    item count (writes still in a process's spool are not counted)."""

    session_id: str
    fleetstore_id: str
    created_at: float
    updated_at: float
    items: int


@dataclass(frozen=True, slots=True)
class SessionPage:
    """A page of ``list_sessions``; pass ``next_cursor`` for the next one (None: last page)."""

    sessions: tuple[AgentSession, ...]
    next_cursor: str | None


def _parse_cursor(cursor: str) -> tuple[float, str]:
    at, sep, sid = cursor.partition("/") if isinstance(cursor, str) else ("", "", "")
    try:
        when = float(at)
    except ValueError:
        when = math.nan
    if not sep or not math.isfinite(when) or not is_valid_id(sid):
        raise errors.InvalidInput(f"not a cursor from list_sessions: {cursor!r}")
    return when, sid


def _item_count(store: StorePort, sid: str) -> int:
    q = store.queries
    rows = store.read(lambda tx: tx.execute(q["agt_item_count"], (sid,)), session_id=sid)
    return int(rows[0][0])


def list_sessions(store: StorePort, *, limit: int = 100, cursor: str | None = None) -> SessionPage:
    """The SDK sessions in *store*, newest first, *limit* a page."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise errors.InvalidInput(f"limit must be a positive integer, not {limit!r}")
    before_at, before_id = _parse_cursor(cursor) if cursor is not None else (None, None)
    params = {"before_at": before_at, "before_id": before_id, "limit": limit + 1}
    q = store.queries
    store.sync_catalog(LISTING_SYNC_WAIT)
    rows = store.read(lambda tx: tx.execute(q["agt_session_list"], params))
    if store.spans_files:
        # A sharded store's catalog indexes sessions; their items are in the shards.
        rows = [(*r[:4], _item_count(store, str(r[0]))) for r in rows]
    found = tuple(
        AgentSession(str(r[1]), str(r[0]), float(r[2]), float(r[3]), int(r[4])) for r in rows
    )
    page = found[:limit]
    more = len(found) > limit
    next_cursor = f"{page[-1].created_at!r}/{page[-1].fleetstore_id}" if more else None
    return SessionPage(page, next_cursor)


__all__ = [
    "ANY_LAST",
    "META_KEY",
    "AgentSession",
    "EncodedItem",
    "SessionPage",
    "Snapshot",
    "StoredItem",
    "add_items",
    "check_session_id",
    "clear_items",
    "compaction_read",
    "encode_item",
    "get_items",
    "items_before",
    "list_sessions",
    "message_item",
    "pop_item",
    "replace_items",
    "session_key",
    "snapshot",
    "stored_message_ids",
    "wait_for_spool",
]
