"""Graph checkpoints: the storage behind ``fleetstore.integrations.langgraph``.

A *thread* holds checkpoints in namespaces (``""`` for the root graph, one per
subgraph); each checkpoint names its parent and carries metadata, the versions
of its channels, and the pending writes of the tasks run from it.  Values
arrive already serialised, as ``(type, bytes)`` pairs (LangGraph's serde), so
this module knows nothing of LangGraph and imports without it.

Storage (``sql/common/checkpoints.sql``, migration 0003): a channel value is stored
once per (thread, namespace, channel, version) and shared by every checkpoint
that did not change it; a checkpoint lists the version key of each of its
channels (``channel_keys``).  Bodies of at least ``blob_threshold`` bytes become
blob files, written before the transaction like every other payload.

Every write is an operation (``ckpt_*``), idempotent by content: a checkpoint
put again replaces itself, a channel version is written once, a task's write
under the same index is kept once (special writes, negative indexes, are
replaced).  Puts, writes, thread deletes, copies and prunes may be spooled past
the write budget; they land in order.  A read of a thread whose writes wait in
this process's spool first waits for them (up to the write budget), then
raises ``SpoolPending``: a reader never sees a thread older than this process
wrote it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetstore import errors
from fleetstore.core.ids import new_id
from fleetstore.core.validate import (
    MAX_METADATA,
    arg_str,
    check_int,
    check_size,
    check_str,
    check_text,
    check_time,
)
from fleetstore.domain.codec import decode_value, encode_payload, encoded_body
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
from fleetstore.engine.base import Tx

OPERATIONS = Declarations()

#: A serialised value: the serializer's type tag and its bytes.
Typed = tuple[str, bytes]

#: Strategies of ``prune``.
PRUNE_STRATEGIES = ("keep_latest", "delete")
#: The metadata key under which LangGraph counts, per delta channel, the steps
#: since its last snapshot; a channel counted there is rebuilt from ancestors.
DELTA_COUNTERS = "counters_since_delta_snapshot"
#: The type tag of a channel that has a version but no value.
EMPTY = "empty"

_LIST_PAGE = 64
_ID_MAX = 1024
_TEXT_MAX = 64 * 1024


@dataclass(frozen=True, slots=True)
class StoredWrite:
    """A pending write: the task that made it, its channel and its value."""

    task_id: str
    channel: str
    value: Typed


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint as stored: the body without channel values, the channel
    values it reads (channels with a version but no value are left out), its
    metadata and its pending writes (in ``(task_path, task_id, idx)`` order)."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    body: Typed
    metadata: dict[str, Any]
    values: dict[str, Typed]
    writes: list[StoredWrite]


@dataclass(frozen=True, slots=True)
class ChannelValue:
    """One channel value to store with a checkpoint: at *version* (a key, see
    ``version_key``), or ``value=None`` for a channel with a version but no value."""

    channel: str
    version: str
    value: Typed | None


def version_key(version: object) -> str:
    """The text a channel version is stored under (``str``, ``int`` or ``float``)."""
    if isinstance(version, str):
        return check_text(version, "a channel version")
    if isinstance(version, int | float) and not isinstance(version, bool):
        if isinstance(version, float) and not math.isfinite(version):
            raise errors.InvalidInput(f"a channel version must be finite, not {version!r}")
        return json.dumps(version)
    raise errors.InvalidInput(
        f"a channel version is a str, int or float, not {type(version).__name__}"
    )


def thread_key(thread_id: str) -> str:
    """The key this thread's operations carry for the spool (``Spool.touches``)."""
    return "ckpt:" + thread_id


def canonical_json(value: object, what: str) -> str:
    """JSON text with sorted keys: equal objects give equal text, which the list
    filter compares in SQL."""
    try:
        text = json.dumps(
            value, ensure_ascii=False, allow_nan=False, separators=(",", ":"), sort_keys=True
        )
    except (TypeError, ValueError) as exc:
        raise errors.InvalidInput(f"{what} is not JSON-serialisable: {exc}") from None
    return check_text(text, what)


class Checkpoints:
    """Checkpoints of graph threads in one store; thread-safe.  *read_wait*: the
    seconds a read waits for this process's spooled writes it would otherwise
    miss (None: the write budget)."""

    def __init__(self, store: StorePort, *, read_wait: float | None = None) -> None:
        if read_wait is not None and (
            not isinstance(read_wait, int | float)
            or isinstance(read_wait, bool)
            or not math.isfinite(read_wait)
            or read_wait < 0
        ):
            raise errors.ConfigError(
                f"read_wait must be a number of seconds >= 0, not {read_wait!r}"
            )
        self._store = store
        self._read_wait = read_wait

    # -- writing ---------------------------------------------------------------------------

    def put(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        *,
        parent_id: str | None,
        body: Typed,
        metadata: Mapping[str, Any],
        channel_versions: Mapping[str, object],
        values: Sequence[ChannelValue] = (),
    ) -> bool:
        """Store a checkpoint and the channel values that changed with it.  True if
        written now, False if it waits in this process's spool (it lands in order)."""
        check_str(thread_id, "thread_id", limit=_ID_MAX, empty=False)
        check_str(checkpoint_ns, "checkpoint_ns", limit=_TEXT_MAX)
        check_str(checkpoint_id, "checkpoint_id", limit=_ID_MAX, empty=False)
        if parent_id is not None:
            check_str(parent_id, "parent checkpoint_id", limit=_ID_MAX, empty=False)
        _check_typed(body, "the checkpoint")
        if not isinstance(metadata, Mapping):
            raise errors.InvalidInput(f"metadata must be a dict, not {type(metadata).__name__}")
        meta = canonical_json(dict(metadata), "checkpoint metadata")
        check_size(meta, "checkpoint metadata", MAX_METADATA)
        if not isinstance(channel_versions, Mapping):
            raise errors.InvalidInput("channel_versions must be a dict")
        keys = {
            check_str(k, "a channel name", limit=_TEXT_MAX, empty=False): version_key(v)
            for k, v in channel_versions.items()
        }
        for cv in values:
            check_str(cv.channel, "a channel name", limit=_TEXT_MAX, empty=False)
            check_str(cv.version, "a channel version", limit=_TEXT_MAX)
            if cv.value is not None:
                _check_typed(cv.value, f"channel {cv.channel!r}")
        run_id = metadata.get("run_id")
        store = self._store
        # Everything is checked: now the blob files (before any transaction).
        args = {
            "session_id": thread_key(thread_id),
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
            "parent_id": parent_id,
            "body": _encode(store, body),
            "metadata": meta,
            "channel_keys": canonical_json(keys, "channel versions"),
            "run_id": None if run_id is None else str(run_id),
            "values": [
                {
                    "channel": cv.channel,
                    "version": cv.version,
                    **(_encode(store, cv.value) if cv.value is not None else _EMPTY_VALUE),
                }
                for cv in values
            ],
            "now": time.time(),
        }
        return store.submit(Operation("ckpt_put", args, new_id(), True)) is not None

    def put_writes(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        task_id: str,
        writes: Sequence[tuple[int, str, Typed]],
        task_path: str = "",
    ) -> bool:
        """Store a task's pending writes, each ``(idx, channel, value)``.  A write at
        an index the task already wrote is ignored, unless the index is negative
        (a special write: error, interrupt...), which replaces it.  True if
        written now, False if spooled."""
        check_str(thread_id, "thread_id", limit=_ID_MAX, empty=False)
        check_str(checkpoint_ns, "checkpoint_ns", limit=_TEXT_MAX)
        check_str(checkpoint_id, "checkpoint_id", limit=_ID_MAX, empty=False)
        check_str(task_id, "task_id", limit=_ID_MAX)
        check_str(task_path, "task_path", limit=_TEXT_MAX)
        for idx, channel, value in writes:
            check_int(idx, "a write index", minimum=-(2**63))
            check_str(channel, "a channel name", limit=_TEXT_MAX, empty=False)
            _check_typed(value, f"the write to {channel!r}")
        if not writes:
            return True
        store = self._store
        args = {
            "session_id": thread_key(thread_id),
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
            "task_id": task_id,
            "task_path": task_path,
            "writes": [
                {"idx": idx, "channel": channel, **_encode(store, value)}
                for idx, channel, value in writes
            ],
        }
        return store.submit(Operation("ckpt_put_writes", args, new_id(), True)) is not None

    def delete_thread(self, thread_id: str) -> None:
        """Remove every checkpoint, channel value and write of the thread (none: no-op)."""
        check_str(thread_id, "thread_id", limit=_ID_MAX, empty=False)
        args = {"session_id": thread_key(thread_id), "thread_id": thread_id}
        self._store.submit(Operation("ckpt_delete_thread", args, new_id(), True))

    def delete_runs(self, run_ids: Sequence[str]) -> None:
        """Remove the checkpoints (with their writes) whose metadata names one of
        *run_ids*, in every thread.  Never spooled: it touches threads no one named,
        so it first waits for this process's spool (``SpoolPending`` if it does not
        drain within the write budget) and raises ``StoreBusy`` past the budget."""
        if isinstance(run_ids, str) or not isinstance(run_ids, Sequence):
            raise errors.InvalidInput("run_ids must be a list of run ids")
        ids = [str(r) for r in run_ids]
        for r in ids:
            check_str(r, "a run id", limit=_ID_MAX)
        if not ids:
            return
        self._drain()
        self._store.submit(
            Operation("ckpt_delete_runs", {"run_ids": ids}, new_id(), True), Delivery.NOW
        )

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, channel value and write of one thread to another
        (the complete parent chains).  Checkpoints the target already has are kept."""
        check_str(source_thread_id, "source thread_id", limit=_ID_MAX, empty=False)
        check_str(target_thread_id, "target thread_id", limit=_ID_MAX, empty=False)
        if source_thread_id == target_thread_id:
            raise errors.InvalidInput("copy_thread: the source and target thread are the same")
        args = {
            "session_id": thread_key(target_thread_id),
            "source": source_thread_id,
            "target": target_thread_id,
        }
        # The source is read when the copy applies: writes to it made earlier by
        # this process land first (the spool keeps order), so the copy sees them.
        self._store.submit(Operation("ckpt_copy_thread", args, new_id(), True))

    def prune(self, thread_ids: Sequence[str], strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep each namespace's newest checkpoint (and the
        ancestors its delta channels are rebuilt from); ``delete``: remove all."""
        if strategy not in PRUNE_STRATEGIES:
            raise errors.InvalidInput(
                f"unknown prune strategy {strategy!r}; known: {', '.join(PRUNE_STRATEGIES)}"
            )
        if isinstance(thread_ids, str) or not isinstance(thread_ids, Sequence):
            raise errors.InvalidInput("thread_ids must be a list of thread ids")
        for t in thread_ids:
            check_str(t, "thread_id", limit=_ID_MAX, empty=False)
        for t in thread_ids:
            args = {"session_id": thread_key(t), "thread_id": t, "strategy": strategy}
            self._store.submit(Operation("ckpt_prune", args, new_id(), True))

    # -- reading ---------------------------------------------------------------------------

    def get(
        self, thread_id: str, checkpoint_ns: str = "", checkpoint_id: str | None = None
    ) -> StoredCheckpoint | None:
        """The checkpoint *checkpoint_id* (None: the newest) of the thread's
        namespace, or None."""
        check_str(thread_id, "thread_id", limit=_ID_MAX, empty=False)
        check_str(checkpoint_ns, "checkpoint_ns", limit=_TEXT_MAX)
        if checkpoint_id is not None:
            check_str(checkpoint_id, "checkpoint_id", limit=_ID_MAX, empty=False)
        self._visible(thread_id)
        q = self._store.queries

        def read(tx: Tx) -> list[_Raw]:
            if checkpoint_id is None:
                rows = tx.execute(q["ckpt_latest"], (thread_id, checkpoint_ns))
            else:
                rows = tx.execute(q["ckpt_get"], (thread_id, checkpoint_ns, checkpoint_id))
            return [_read_one(tx, q, row) for row in rows]

        found = self._store.read(read)
        return self._decode(found[0]) if found else None

    def list(
        self,
        thread_id: str | None = None,
        *,
        checkpoint_ns: str | None = None,
        checkpoint_id: str | None = None,
        before: str | None = None,
        filter: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> Iterator[StoredCheckpoint]:
        """Checkpoints newest first (by id), of one thread (None: of all), of one
        namespace (None: all), only *checkpoint_id*, only those before *before*,
        whose metadata holds every key of *filter* with an equal value, at most
        *limit*.  Read a page at a time, each page one snapshot."""
        if thread_id is not None:
            check_str(thread_id, "thread_id", limit=_ID_MAX, empty=False)
        if checkpoint_ns is not None:
            check_str(checkpoint_ns, "checkpoint_ns", limit=_TEXT_MAX)
        for value, what in ((checkpoint_id, "checkpoint_id"), (before, "before")):
            if value is not None:
                check_str(value, what, limit=_ID_MAX, empty=False)
        if filter is not None and not isinstance(filter, Mapping):
            raise errors.InvalidInput(f"filter must be a dict, not {type(filter).__name__}")
        if limit is not None:
            check_int(limit, "limit", minimum=-(2**63))
        wanted = filter and canonical_json(dict(filter), "the metadata filter")
        return self._pages(thread_id, checkpoint_ns, checkpoint_id, before, wanted or None, limit)

    def _pages(
        self,
        thread_id: str | None,
        checkpoint_ns: str | None,
        checkpoint_id: str | None,
        before: str | None,
        wanted: str | None,
        limit: int | None,
    ) -> Iterator[StoredCheckpoint]:
        self._visible(thread_id)
        q = self._store.queries
        left = limit if limit is not None else -1
        after: tuple[str, str, str] | None = None
        while left != 0:
            page = _LIST_PAGE if left < 0 else min(left, _LIST_PAGE)
            params: dict[str, Any] = {
                "thread": thread_id,
                "ns": checkpoint_ns,
                "id": checkpoint_id,
                "before": before,
                "filter": wanted,
                "after_id": after and after[2],
                "after_thread": after and after[0],
                "after_ns": after and after[1],
                "limit": page,
            }
            query = q["ckpt_list_all" if thread_id is None else "ckpt_list_thread"]
            if thread_id is not None:
                del params["after_thread"]

            def read(tx: Tx, sql: str = query, p: dict[str, Any] = params) -> list[_Raw]:
                return [_read_one(tx, q, row) for row in tx.execute(sql, p)]

            raws = self._store.read(read)
            for raw in raws:
                yield self._decode(raw)
            if len(raws) < page:
                return
            last = raws[-1].row
            after = (last[0], last[1], last[2])
            if left > 0:
                left -= len(raws)

    def _visible(self, thread_id: str | None) -> None:
        """Wait for this process's spooled writes that a read of *thread_id* (None:
        of anything) would miss; ``SpoolPending`` if they stay past the budget."""
        try:
            self._store.check_visible(None if thread_id is None else thread_key(thread_id))
        except errors.SpoolPending:
            self._drain()

    def _drain(self) -> None:
        store = self._store
        wait = store.settings.write_budget if self._read_wait is None else self._read_wait
        if store.spool_pending() and not store.flush(wait):
            raise errors.SpoolPending(
                f"{store.spool_pending()} write(s) of this process still wait in its spool after "
                f"{wait:g}s: the store stays locked; this read would not see them"
            )

    def _decode(self, raw: _Raw) -> StoredCheckpoint:
        store = self._store
        thread, ns, cid, parent, btype, body, sha, size, meta, _keys = raw.row
        return StoredCheckpoint(
            thread_id=thread,
            checkpoint_ns=ns,
            checkpoint_id=cid,
            parent_id=parent,
            body=(btype, decode_value(store, "bytes", body, sha, size)),
            metadata=json.loads(meta),
            values={
                ch: (t, decode_value(store, "bytes", b, s, n))
                for ch, t, b, s, n in raw.values
                if t != EMPTY
            },
            writes=[
                StoredWrite(task, ch, (t, decode_value(store, "bytes", b, s, n)))
                for task, ch, t, b, s, n in raw.writes
            ],
        )


@dataclass(frozen=True, slots=True)
class _Raw:
    row: tuple[Any, ...]
    values: list[tuple[Any, ...]]
    writes: list[tuple[Any, ...]]


def _read_one(tx: Tx, q: Queries, row: tuple[Any, ...]) -> _Raw:
    thread, ns, cid = row[0], row[1], row[2]
    return _Raw(
        row,
        tx.execute(q["ckpt_values"], (thread, ns, row[9])),
        tx.execute(q["ckpt_writes_of"], (thread, ns, cid)),
    )


_EMPTY_VALUE: dict[str, Any] = {"type": EMPTY, "enc": "bytes", "body": ""}


def _encode(store: StorePort, value: Typed) -> dict[str, Any]:
    return {"type": value[0], **encode_payload(store, value[1], "bytes")}


# -- checks (shared by the API, before anything is written, and the operations) ---------------


def _check_typed(value: object, what: str) -> None:
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or not isinstance(value[0], str)
        or not isinstance(value[1], bytes | bytearray | memoryview)
    ):
        raise errors.InvalidInput(f"{what} must be a (type, bytes) pair from a serializer")
    check_str(value[0], f"the type of {what}", limit=256, empty=False)


def _json_object(a: Args, key: str) -> dict[str, Any]:
    text = a.get(key)
    if not isinstance(text, str):
        raise errors.InvalidInput(f"{key} must be JSON text")
    try:
        value = json.loads(text)
    except ValueError:
        raise errors.InvalidInput(f"{key} is not JSON") from None
    if not isinstance(value, dict):
        raise errors.InvalidInput(f"{key} must be a JSON object")
    return value


def _body(tx: Tx, q: Queries, item: object, what: str, now: float) -> dict[str, Any]:
    """The column values of an encoded body: type, body, blob_sha, size."""
    if not isinstance(item, dict) or item.get("enc") != "bytes":
        raise errors.InvalidInput(f"{what}: must be an encoded bytes value")
    kind = check_str(item.get("type"), f"the type of {what}", limit=256, empty=False)
    _enc, body, sha, size = encoded_body(tx, q, item, what, now)
    return {"type": kind, "body": body, "blob_sha": sha, "size": size}


def _delete_thread(tx: Tx, q: Queries, thread: str) -> None:
    for name in ("checkpoints", "channels", "writes"):
        tx.execute(q[f"ckpt_delete_thread_{name}"], (thread,))


# -- operations ------------------------------------------------------------------------------


@OPERATIONS.declare("ckpt_put", scope=Scope.CATALOG)
def _op_put(tx: Tx, q: Queries, a: Args) -> Result:
    thread = arg_str(a, "thread_id", False, _ID_MAX, empty=False)
    ns = arg_str(a, "checkpoint_ns", False, _TEXT_MAX)
    cid = arg_str(a, "checkpoint_id", False, _ID_MAX, empty=False)
    parent = a.get("parent_id")
    if parent is not None:
        arg_str(a, "parent_id", False, _ID_MAX, empty=False)
    now = check_time(a.get("now"), "now")
    _json_object(a, "metadata")
    check_size(a["metadata"], "metadata", MAX_METADATA)
    keys = _json_object(a, "channel_keys")
    if not all(isinstance(v, str) for v in keys.values()):
        raise errors.InvalidInput("channel_keys must map channels to version keys")
    run_id = a.get("run_id")
    if run_id is not None:
        arg_str(a, "run_id", False, _ID_MAX, empty=False)
    values = a.get("values")
    if not isinstance(values, list):
        raise errors.InvalidInput("values must be a list")
    where = {"thread": thread, "ns": ns}
    for item in values:
        if not isinstance(item, dict):
            raise errors.InvalidInput("a channel value must be an object")
        channel = arg_str(item, "channel", False, _TEXT_MAX, empty=False)
        version = arg_str(item, "version", False, _TEXT_MAX)
        value = _body(tx, q, item, f"channel {channel!r}", now)
        tx.execute(
            q["ckpt_channel_insert"], {**where, "channel": channel, "version": version, **value}
        )
    body = _body(tx, q, a.get("body"), f"checkpoint {cid!r}", now)
    tx.execute(
        q["ckpt_upsert"],
        {
            **where,
            "id": cid,
            "parent": parent,
            **body,
            "metadata": a["metadata"],
            "channel_keys": a["channel_keys"],
            "run_id": run_id,
            "now": now,
        },
    )
    return {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": cid}


@OPERATIONS.declare("ckpt_put_writes", scope=Scope.CATALOG)
def _op_put_writes(tx: Tx, q: Queries, a: Args) -> Result:
    thread = arg_str(a, "thread_id", False, _ID_MAX, empty=False)
    ns = arg_str(a, "checkpoint_ns", False, _TEXT_MAX)
    cid = arg_str(a, "checkpoint_id", False, _ID_MAX, empty=False)
    task = arg_str(a, "task_id", False, _ID_MAX)
    path = arg_str(a, "task_path", False, _TEXT_MAX)
    now = check_time(a.get("now"), "now")
    writes = a.get("writes")
    if not isinstance(writes, list):
        raise errors.InvalidInput("writes must be a list")
    for item in writes:
        if not isinstance(item, dict):
            raise errors.InvalidInput("a write must be an object")
        idx = check_int(item.get("idx"), "a write index", minimum=-(2**63))
        channel = arg_str(item, "channel", False, _TEXT_MAX, empty=False)
        value = _body(tx, q, item, f"the write to {channel!r}", now)
        tx.execute(
            q["ckpt_write_upsert" if idx < 0 else "ckpt_write_insert"],
            {
                "thread": thread,
                "ns": ns,
                "id": cid,
                "task": task,
                "idx": idx,
                "channel": channel,
                **value,
                "task_path": path,
            },
        )
    return {"writes": len(writes)}


@OPERATIONS.declare("ckpt_delete_thread", scope=Scope.CATALOG)
def _op_delete_thread(tx: Tx, q: Queries, a: Args) -> Result:
    _delete_thread(tx, q, arg_str(a, "thread_id", False, _ID_MAX, empty=False))
    return {}


@OPERATIONS.declare("ckpt_delete_runs", scope=Scope.CATALOG)
def _op_delete_runs(tx: Tx, q: Queries, a: Args) -> Result:
    run_ids = a.get("run_ids")
    if not isinstance(run_ids, list):
        raise errors.InvalidInput("run_ids must be a list")
    touched: set[tuple[str, str]] = set()
    deleted = 0
    for run in run_ids:
        check_str(run, "a run id", limit=_ID_MAX)
        for thread, ns, cid in tx.execute(q["ckpt_of_run"], (run,)):
            tx.execute(q["ckpt_delete_writes_of"], (thread, ns, cid))
            tx.execute(q["ckpt_delete_one"], (thread, ns, cid))
            touched.add((thread, ns))
            deleted += 1
    for thread, ns in sorted(touched):
        tx.execute(q["ckpt_unreferenced_channels"], (thread, ns))
    return {"deleted": deleted}


@OPERATIONS.declare("ckpt_copy_thread", scope=Scope.CATALOG)
def _op_copy_thread(tx: Tx, q: Queries, a: Args) -> Result:
    source = arg_str(a, "source", False, _ID_MAX, empty=False)
    target = arg_str(a, "target", False, _ID_MAX, empty=False)
    if source == target:
        raise errors.InvalidInput("copy_thread: the source and target thread are the same")
    for name in ("channels", "checkpoints", "writes"):
        tx.execute(q[f"ckpt_copy_{name}"], (source, target))
    return {}


@OPERATIONS.declare("ckpt_prune", scope=Scope.CATALOG)
def _op_prune(tx: Tx, q: Queries, a: Args) -> Result:
    thread = arg_str(a, "thread_id", False, _ID_MAX, empty=False)
    strategy = a.get("strategy")
    if strategy not in PRUNE_STRATEGIES:
        raise errors.InvalidInput(f"unknown prune strategy {strategy!r}")
    if strategy == "delete":
        _delete_thread(tx, q, thread)
        return {}
    # Decided inside the transaction: a checkpoint put meanwhile must not be
    # taken for an old one.
    spaces: dict[str, dict[str, tuple[str | None, str, str]]] = {}
    for ns, cid, parent, meta, keys in tx.execute(q["ckpt_outline"], (thread,)):
        spaces.setdefault(ns, {})[cid] = (parent, meta, keys)
    deleted = 0
    for ns, cps in spaces.items():
        keep = _kept(tx, q, thread, ns, cps)
        for cid in cps:
            if cid not in keep:
                tx.execute(q["ckpt_delete_writes_of"], (thread, ns, cid))
                tx.execute(q["ckpt_delete_one"], (thread, ns, cid))
                deleted += 1
        tx.execute(q["ckpt_unreferenced_channels"], (thread, ns))
    return {"deleted": deleted}


def _kept(
    tx: Tx, q: Queries, thread: str, ns: str, cps: Mapping[str, tuple[str | None, str, str]]
) -> set[str]:
    """The newest checkpoint of a namespace, and the ancestors its delta channels
    are rebuilt from: a delta channel stores no value at most steps, and its
    state is replayed from the writes of every ancestor back to the nearest one
    holding a value (LangGraph's ``get_delta_channel_history``).  Dropping those
    would silently empty the channel."""
    latest = max(cps)
    keep = {latest}
    parent, meta, keys = cps[latest]
    counters = json.loads(meta).get(DELTA_COUNTERS) or {}
    missing = set(counters) if isinstance(counters, dict) else set()
    missing -= _stored(tx, q, thread, ns, keys)
    while missing and parent is not None and parent in cps and parent not in keep:
        keep.add(parent)
        parent, _meta, keys = cps[parent]
        missing -= _stored(tx, q, thread, ns, keys)
    return keep


def _stored(tx: Tx, q: Queries, thread: str, ns: str, keys: str) -> set[str]:
    return {r[0] for r in tx.execute(q["ckpt_stored_channels"], (thread, ns, keys))}


__all__ = [
    "DELTA_COUNTERS",
    "ChannelValue",
    "Checkpoints",
    "PRUNE_STRATEGIES",
    "StoredCheckpoint",
    "StoredWrite",
    "Typed",
    "canonical_json",
    "thread_key",
    "version_key",
]
