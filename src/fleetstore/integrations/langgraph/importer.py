"""``fleetstore import --from langgraph-sqlite FILE``: bring the checkpoints of a
LangGraph ``SqliteSaver`` file into a store, where ``FleetstoreSaver`` serves them.

The file (tables ``checkpoints`` and ``writes``, as ``langgraph-checkpoint-sqlite``
writes them) is read whole by ``fleetstore.integrations.langgraph.reader``,
read-only, in one read transaction; a file that changed during a read without locks
is refused (``FileChanged``), nothing imported.  Then, in order:

1. *check*, writing nothing: every checkpoint deserialises, its metadata is a JSON
   object, every channel value has a channel version, every write belongs to a
   checkpoint of the file, and nothing contradicts the store (a checkpoint of the
   same thread, namespace and id with other contents, or a task whose stored
   writes differ): any failure rejects the whole file;
2. *write*: per thread and namespace, checkpoints parents first, each followed by
   its writes (one transaction per checkpoint and per task; ``Store.apply``: past
   the write budget ``StoreBusy``, and importing again is safe);
3. *verify*: read back through ``FleetstoreSaver``: every checkpoint gives the
   ``get_tuple`` result ``SqliteSaver`` gives on the file (checkpoint, metadata,
   parent, pending writes in order).

A checkpoint is split as ``FleetstoreSaver.put`` splits it: its channel values
are deserialised and serialised again one by one with *serde* (default: LangGraph's
``JsonPlusSerializer``, the one both savers use unless told otherwise).
Importing is idempotent: checkpoints and writes present and equal are left alone.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetstore import errors
from fleetstore.core.extras import requires
from fleetstore.core.ids import new_id
from fleetstore.domain.codec import encode_payload
from fleetstore.domain.langgraph import Typed, canonical_json, thread_key, version_key
from fleetstore.domain.operations import Operation
from fleetstore.integrations.langgraph.adapter import FleetstoreSaver
from fleetstore.integrations.langgraph.reader import (
    LangGraphCheckpoint,
    LangGraphWrite,
    bad_file,
    read_langgraph_source,
)
from fleetstore.store.facade import Store

with requires("langgraph", "importing a LangGraph checkpoint file"):
    from langgraph.checkpoint.base import writes_sort_key
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

_EMPTY_VALUE: dict[str, Any] = {"type": "empty", "enc": "bytes", "body": ""}

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True)
class LangGraphImportSummary:
    source: str
    threads: int
    checkpoints: int
    writes: int
    #: Checkpoints stored by this import / present in the store already and equal.
    new_checkpoints: int
    unchanged_checkpoints: int
    #: Tasks whose writes were stored by this import / present already and equal.
    new_tasks: int
    unchanged_tasks: int


def _in_order(cps: list[LangGraphCheckpoint]) -> list[LangGraphCheckpoint]:
    """Per thread and namespace, by id, each parent before its children."""
    by_key = {(c.thread_id, c.checkpoint_ns, c.checkpoint_id): c for c in cps}
    out: list[LangGraphCheckpoint] = []
    placed: set[tuple[str, str, str]] = set()

    def place(c: LangGraphCheckpoint, chain: set[str]) -> None:
        key = (c.thread_id, c.checkpoint_ns, c.checkpoint_id)
        if key in placed:
            return
        if c.checkpoint_id in chain:
            raise errors.InvalidInput(f"{c.where} is its own ancestor")
        parent = by_key.get((c.thread_id, c.checkpoint_ns, c.parent_id or ""))
        if parent is not None:
            place(parent, chain | {c.checkpoint_id})
        placed.add(key)
        out.append(c)

    for key in sorted(by_key):
        place(by_key[key], set())
    return out


# -- checking, writing, verifying ------------------------------------------------------------


def _decode(c: LangGraphCheckpoint, serde: SerializerProtocol, path: str) -> dict[str, Any]:
    """*c*'s checkpoint, deserialised, and its writes deserialised to check them."""
    try:
        checkpoint = serde.loads_typed(c.raw)
        for w in c.writes:
            serde.loads_typed(w.value)
    except Exception as exc:  # the serde raises whatever its decoder does
        raise bad_file(path, f"{c.where} does not deserialise: {exc}") from None
    if not isinstance(checkpoint, dict) or checkpoint.get("id") != c.checkpoint_id:
        raise bad_file(path, f"{c.where} is not a checkpoint with that id")
    versions = checkpoint.get("channel_versions")
    values = checkpoint.get("channel_values") or {}
    if not isinstance(versions, dict) or not isinstance(values, dict):
        raise bad_file(path, f"{c.where} has no channel_versions / channel_values")
    unversioned = sorted(set(values) - set(versions))
    if unversioned:
        raise bad_file(path, f"{c.where}: channel(s) {unversioned} have a value but no version")
    try:
        for v in versions.values():
            version_key(v)
        canonical_json(c.metadata, f"the metadata of {c.where}")
    except errors.InvalidInput as exc:
        raise bad_file(path, str(exc)) from None
    return checkpoint


def _values(checkpoint: dict[str, Any], serde: SerializerProtocol) -> dict[str, Typed | None]:
    """Each versioned channel's value, serialised alone (None: a version, no value)."""
    values = checkpoint.get("channel_values") or {}
    return {
        ch: serde.dumps_typed(values[ch]) if ch in values else None
        for ch in checkpoint["channel_versions"]
    }


def _storage_keys(
    cps: list[LangGraphCheckpoint], checkpoints: list[dict[str, Any]], serde: SerializerProtocol
) -> list[dict[str, str]]:
    """Per checkpoint, the key each channel value is stored under.  The store keeps a
    value once per (thread, namespace, channel, version key), but LangGraph leaves
    some versions unchanged while the value changes (a barrier channel reset between
    runs); SqliteSaver, storing whole checkpoints, keeps both.  The newest checkpoint
    using a version gets the plain key (a graph resumed on the store references it);
    an older one with another value gets the version key plus a digest of its value.
    The checkpoint's own ``channel_versions`` stay as they were."""
    out: list[dict[str, str]] = [{} for _ in cps]
    owner: dict[tuple[str, str, str, str], Typed | None] = {}
    newest_first = sorted(range(len(cps)), key=lambda i: cps[i].checkpoint_id, reverse=True)
    for i in newest_first:
        c, checkpoint = cps[i], checkpoints[i]
        for ch, value in _values(checkpoint, serde).items():
            plain = version_key(checkpoint["channel_versions"][ch])
            key = (c.thread_id, c.checkpoint_ns, ch, plain)
            if owner.setdefault(key, value) == value:
                out[i][ch] = plain
            else:
                digest = hashlib.sha256(repr(value).encode("utf-8")).hexdigest()[:24]
                out[i][ch] = f"{plain}#{digest}"
    return out


def _put_args(
    store: Store,
    c: LangGraphCheckpoint,
    checkpoint: dict[str, Any],
    serde: SerializerProtocol,
    keys: dict[str, str],
) -> dict[str, Any]:
    """The ``ckpt_put`` arguments ``FleetstoreSaver.put`` would make of *c*."""
    body = dict(checkpoint)
    values: dict[str, Any] = body.pop("channel_values", None) or {}
    versions: dict[str, Any] = body["channel_versions"]
    run_id = c.metadata.get("run_id")
    return {
        "session_id": thread_key(c.thread_id),
        "thread_id": c.thread_id,
        "checkpoint_ns": c.checkpoint_ns,
        "checkpoint_id": c.checkpoint_id,
        "parent_id": c.parent_id,
        "body": _encode(store, serde.dumps_typed(body)),
        "metadata": canonical_json(c.metadata, f"the metadata of {c.where}"),
        "channel_keys": canonical_json(keys, "channel versions"),
        "run_id": None if run_id is None else str(run_id),
        "values": [
            {
                "channel": ch,
                "version": keys[ch],
                **(_encode(store, serde.dumps_typed(values[ch])) if ch in values else _EMPTY_VALUE),
            }
            for ch in versions
        ],
        "now": time.time(),
    }


def _encode(store: Store, value: Typed) -> dict[str, Any]:
    return {"type": value[0], **encode_payload(store, value[1], "bytes")}


def _config(c: LangGraphCheckpoint) -> dict[str, Any]:
    return {
        "configurable": {
            "thread_id": c.thread_id,
            "checkpoint_ns": c.checkpoint_ns,
            "checkpoint_id": c.checkpoint_id,
        }
    }


def _same_checkpoint(
    saver: FleetstoreSaver, c: LangGraphCheckpoint, checkpoint: dict[str, Any]
) -> bool | None:
    """None: not in the store; else whether it holds *c*, deserialised as
    *checkpoint* (without its writes)."""
    got = saver.get_tuple(_config(c))  # type: ignore[arg-type]
    if got is None:
        return None
    parent = got.parent_config["configurable"]["checkpoint_id"] if got.parent_config else None
    return bool(
        got.checkpoint == checkpoint and dict(got.metadata) == c.metadata and parent == c.parent_id
    )


def _stored_tasks(
    saver: FleetstoreSaver, c: LangGraphCheckpoint
) -> dict[str, list[tuple[str, Any]]]:
    got = saver.get_tuple(_config(c))  # type: ignore[arg-type]
    out: dict[str, list[tuple[str, Any]]] = {}
    for task, channel, value in got.pending_writes or [] if got else []:
        out.setdefault(task, []).append((channel, value))
    return out


def _task_writes(ws: list[LangGraphWrite], serde: SerializerProtocol) -> list[tuple[str, Any]]:
    ordered = sorted(ws, key=lambda w: w.idx)
    return [(w.channel, serde.loads_typed(w.value)) for w in ordered]


def _expected_writes(
    c: LangGraphCheckpoint, serde: SerializerProtocol
) -> list[tuple[str, str, Any]]:
    """The pending writes of *c* as ``SqliteSaver.get_tuple`` returns them."""
    ordered = sorted(c.writes, key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx))
    return [(w.task_id, w.channel, serde.loads_typed(w.value)) for w in ordered]


def import_langgraph_sqlite(
    store: Store,
    path: str | os.PathLike[str],
    *,
    serde: SerializerProtocol | None = None,
    progress: Progress | None = None,
) -> LangGraphImportSummary:
    """Import the LangGraph ``SqliteSaver`` file at *path* into *store* (see the
    module doc).  ``InvalidInput`` / ``NotFound`` / ``AlreadyExists``: nothing was
    written; ``StoreBusy``: stopped midway, importing again is safe;
    ``IntegrityError``: the verification found the store does not give what the
    file does."""
    path = os.fspath(path)
    if Path(path).resolve() == Path(store.path).resolve():
        raise errors.InvalidInput(f"{path} is the store itself")
    serde = serde or JsonPlusSerializer()
    step = progress or (lambda stage, done, total: None)
    cps = _in_order(read_langgraph_source(path))
    checkpoints = [_decode(c, serde, path) for c in cps]
    saver = FleetstoreSaver(store, serde=serde)
    try:
        existing: dict[tuple[str, str, str], dict[str, list[tuple[str, Any]]]] = {}
        for c, checkpoint in zip(cps, checkpoints, strict=True):
            same = _same_checkpoint(saver, c, checkpoint)
            if same is None:
                continue
            if not same:
                raise errors.AlreadyExists(f"{c.where} is in the store with other contents")
            stored = _stored_tasks(saver, c)
            for (task, _tpath), ws in c.tasks().items():
                if task in stored and stored[task] != _task_writes(ws, serde):
                    raise errors.AlreadyExists(
                        f"the writes of task {task!r} to {c.where} are in the store with "
                        "other contents"
                    )
            existing[(c.thread_id, c.checkpoint_ns, c.checkpoint_id)] = stored
        keys = _storage_keys(cps, checkpoints, serde)
        new_cps = new_tasks = unchanged_tasks = 0
        for i, c in enumerate(cps):
            step("import", i, len(cps))
            had = existing.get((c.thread_id, c.checkpoint_ns, c.checkpoint_id))
            if had is None:
                args = _put_args(store, c, checkpoints[i], serde, keys[i])
                store.apply(Operation("ckpt_put", args, new_id()))
                new_cps += 1
            for (task, tpath), ws in c.tasks().items():
                if had is not None and task in had:
                    unchanged_tasks += 1
                    continue
                args = {
                    "session_id": thread_key(c.thread_id),
                    "thread_id": c.thread_id,
                    "checkpoint_ns": c.checkpoint_ns,
                    "checkpoint_id": c.checkpoint_id,
                    "task_id": task,
                    "task_path": tpath,
                    "writes": [
                        {"idx": w.idx, "channel": w.channel, **_encode(store, w.value)} for w in ws
                    ],
                    "now": time.time(),
                }
                store.apply(Operation("ckpt_put_writes", args, new_id()))
                new_tasks += 1
        step("import", len(cps), len(cps))
        for c, checkpoint in zip(cps, checkpoints, strict=True):
            _verify(saver, c, checkpoint, serde)
    finally:
        saver.close()
    return LangGraphImportSummary(
        source=path,
        threads=len({c.thread_id for c in cps}),
        checkpoints=len(cps),
        writes=sum(len(c.writes) for c in cps),
        new_checkpoints=new_cps,
        unchanged_checkpoints=len(cps) - new_cps,
        new_tasks=new_tasks,
        unchanged_tasks=unchanged_tasks,
    )


def _verify(
    saver: FleetstoreSaver,
    c: LangGraphCheckpoint,
    checkpoint: dict[str, Any],
    serde: SerializerProtocol,
) -> None:
    """``IntegrityError`` unless ``FleetstoreSaver.get_tuple`` gives for *c* what
    ``SqliteSaver.get_tuple`` gives on the file."""
    if not _same_checkpoint(saver, c, checkpoint):
        raise errors.IntegrityError(f"import check: {c.where} differs in the store")
    got = saver.get_tuple(_config(c))  # type: ignore[arg-type]
    expected = _expected_writes(c, serde)
    writes = list(got.pending_writes or []) if got else []
    if writes != expected:
        # A task the store had before the import may carry writes the file lacks:
        # then the file's must still all be there, in order.
        it = iter(writes)
        if not all(any(w == e for w in it) for e in expected):
            raise errors.IntegrityError(f"import check: the pending writes of {c.where} differ")


def summary_line(summary: LangGraphImportSummary) -> str:
    """What ``fleetstore import --from langgraph-sqlite`` prints."""
    return (
        f"fleetstore import: {summary.threads} LangGraph threads, {summary.checkpoints} "
        f"checkpoints ({summary.new_checkpoints} new, {summary.unchanged_checkpoints} "
        f"unchanged), {summary.writes} pending writes ({summary.new_tasks} tasks new, "
        f"{summary.unchanged_tasks} unchanged); verified"
    )


def run_cli(file: str, store: str | None, *, as_json: bool = False) -> int:
    """The body of ``fleetstore import --from langgraph-sqlite FILE`` (see ``run_import``)."""
    from fleetstore.integrations import run_import

    return run_import(
        store, lambda opened: import_langgraph_sqlite(opened, file), summary_line, as_json=as_json
    )


__all__ = ["LangGraphImportSummary", "import_langgraph_sqlite", "run_cli", "summary_line"]
