"""``fleetstore import --from langgraph-sqlite FILE``: bring the checkpoints of a
LangGraph ``SqliteSaver`` file into a store, where ``FleetstoreSaver`` serves them.

Reads the schema ``langgraph-checkpoint-sqlite`` writes: tables ``checkpoints``
(a whole checkpoint, channel values included, serialised by the saver's serde;
metadata as JSON) and ``writes`` (pending writes, ``task_path`` optional: files
older than that column read it as ``""``).

The file is opened read-only (``fleetstore.engine.foreign``) and read whole, in
one read transaction; a file that changed during a read without locks is refused
(``FileChanged``), nothing imported.  Then, in order:

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
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import writes_sort_key
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from fleetstore import errors
from fleetstore.core.ids import new_id
from fleetstore.domain.codec import encode_payload
from fleetstore.domain.frameworks.langgraph import Typed, canonical_json, thread_key, version_key
from fleetstore.domain.operations import Operation
from fleetstore.engine import foreign, inspect
from fleetstore.integrations.langgraph import FleetstoreSaver
from fleetstore.store.facade import Store

_TABLES = ("checkpoints", "writes")
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


@dataclass
class _Write:
    task_id: str
    task_path: str
    idx: int
    channel: str
    value: Typed


@dataclass
class _Checkpoint:
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    raw: Typed  # the whole checkpoint, as SqliteSaver stored it
    metadata: dict[str, Any]
    checkpoint: dict[str, Any] = field(default_factory=dict)  # deserialised
    writes: list[_Write] = field(default_factory=list)

    @property
    def where(self) -> str:
        return (
            f"checkpoint {self.checkpoint_id!r} of thread {self.thread_id!r} "
            f"(namespace {self.checkpoint_ns!r})"
        )

    def tasks(self) -> dict[tuple[str, str], list[_Write]]:
        out: dict[tuple[str, str], list[_Write]] = {}
        for w in self.writes:
            out.setdefault((w.task_id, w.task_path), []).append(w)
        return out

    def expected_writes(self, serde: SerializerProtocol) -> list[tuple[str, str, Any]]:
        """The pending writes as ``SqliteSaver.get_tuple`` returns them."""
        ordered = sorted(self.writes, key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx))
        return [(w.task_id, w.channel, serde.loads_typed(w.value)) for w in ordered]


# -- reading the file ------------------------------------------------------------------------


def _bad(path: str, why: str) -> errors.InvalidInput:
    return errors.InvalidInput(f"{path}: not an importable LangGraph SqliteSaver file: {why}")


def _text(value: object, path: str, what: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value) or len(value) > 1024 * 64:
        raise _bad(path, f"{what} is not a {'' if empty else 'non-empty '}string: {value!r:.80}")
    return value


def _blob(value: object, path: str, what: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if not isinstance(value, bytes):
        raise _bad(path, f"{what} is not a blob")
    return value


def _read_source(path: str) -> list[_Checkpoint]:
    try:
        return foreign.read_foreign(path, lambda db: _read_tables(db, path))
    except inspect.InspectFailed as exc:
        if exc.reason == "empty":
            raise _bad(path, "the file is empty") from None
        if exc.reason == "wal-without-shm":
            raise errors.InvalidInput(str(exc)) from None
        raise _bad(path, str(exc)) from None


def _read_tables(db: inspect.ReadOnlyDatabase, path: str) -> list[_Checkpoint]:
    tables = {r[0] for r in db.query("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    missing = [t for t in _TABLES if t not in tables]
    if missing:
        raise _bad(path, f"no table {', '.join(missing)}")
    found: dict[tuple[str, str, str], _Checkpoint] = {}
    for thread, ns, cid, parent, kind, body, meta in db.query(
        "SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, "
        "checkpoint, metadata FROM checkpoints"
    ):
        where = f"checkpoint {cid!r} of thread {thread!r}"
        key = (
            _text(thread, path, f"the thread_id of {where}"),
            _text(ns, path, f"the checkpoint_ns of {where}", empty=True),
            _text(cid, path, f"the checkpoint_id of {where}"),
        )
        if parent is not None:
            _text(parent, path, f"the parent of {where}")
        try:
            metadata = json.loads(meta) if meta is not None else {}
        except ValueError:
            raise _bad(path, f"the metadata of {where} is not JSON") from None
        if not isinstance(metadata, dict):
            raise _bad(path, f"the metadata of {where} is not a JSON object")
        found[key] = _Checkpoint(
            *key,
            parent_id=parent,
            raw=(_text(kind, path, f"the type of {where}"), _blob(body, path, where)),
            metadata=metadata,
        )
    columns = {r[1] for r in db.query("PRAGMA table_info(writes)")}
    task_path = "task_path" if "task_path" in columns else "''"
    for thread, ns, cid, task, tpath, idx, channel, kind, value in db.query(
        f"SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, {task_path}, idx, channel, "
        "type, value FROM writes"
    ):
        where = f"a write of task {task!r} to checkpoint {cid!r} of thread {thread!r}"
        owner = found.get((thread, ns, cid))
        if owner is None:
            raise _bad(path, f"{where}: the checkpoint is not in the file")
        if not isinstance(idx, int):
            raise _bad(path, f"{where}: idx is not an integer")
        owner.writes.append(
            _Write(
                _text(task, path, f"the task_id of {where}", empty=True),
                _text(tpath, path, f"the task_path of {where}", empty=True),
                idx,
                _text(channel, path, f"the channel of {where}"),
                (_text(kind, path, f"the type of {where}"), _blob(value, path, where)),
            )
        )
    return list(found.values())


def _in_order(cps: list[_Checkpoint]) -> list[_Checkpoint]:
    """Per thread and namespace, by id, each parent before its children."""
    by_key = {(c.thread_id, c.checkpoint_ns, c.checkpoint_id): c for c in cps}
    out: list[_Checkpoint] = []
    placed: set[tuple[str, str, str]] = set()

    def place(c: _Checkpoint, chain: set[str]) -> None:
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


def _decode(c: _Checkpoint, serde: SerializerProtocol, path: str) -> None:
    try:
        checkpoint = serde.loads_typed(c.raw)
        for w in c.writes:
            serde.loads_typed(w.value)
    except Exception as exc:  # the serde raises whatever its decoder does
        raise _bad(path, f"{c.where} does not deserialise: {exc}") from None
    if not isinstance(checkpoint, dict) or checkpoint.get("id") != c.checkpoint_id:
        raise _bad(path, f"{c.where} is not a checkpoint with that id")
    versions = checkpoint.get("channel_versions")
    values = checkpoint.get("channel_values") or {}
    if not isinstance(versions, dict) or not isinstance(values, dict):
        raise _bad(path, f"{c.where} has no channel_versions / channel_values")
    unversioned = sorted(set(values) - set(versions))
    if unversioned:
        raise _bad(path, f"{c.where}: channel(s) {unversioned} have a value but no version")
    try:
        for v in versions.values():
            version_key(v)
        canonical_json(c.metadata, f"the metadata of {c.where}")
    except errors.InvalidInput as exc:
        raise _bad(path, str(exc)) from None
    c.checkpoint = checkpoint


def _values(c: _Checkpoint, serde: SerializerProtocol) -> dict[str, Typed | None]:
    """Each versioned channel's value, serialised alone (None: a version, no value)."""
    values = c.checkpoint.get("channel_values") or {}
    return {
        ch: serde.dumps_typed(values[ch]) if ch in values else None
        for ch in c.checkpoint["channel_versions"]
    }


def _storage_keys(cps: list[_Checkpoint], serde: SerializerProtocol) -> list[dict[str, str]]:
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
        c = cps[i]
        for ch, value in _values(c, serde).items():
            plain = version_key(c.checkpoint["channel_versions"][ch])
            key = (c.thread_id, c.checkpoint_ns, ch, plain)
            if owner.setdefault(key, value) == value:
                out[i][ch] = plain
            else:
                digest = hashlib.sha256(repr(value).encode("utf-8")).hexdigest()[:24]
                out[i][ch] = f"{plain}#{digest}"
    return out


def _put_args(
    store: Store, c: _Checkpoint, serde: SerializerProtocol, keys: dict[str, str]
) -> dict[str, Any]:
    """The ``ckpt_put`` arguments ``FleetstoreSaver.put`` would make of *c*."""
    body = dict(c.checkpoint)
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


def _config(c: _Checkpoint) -> dict[str, Any]:
    return {
        "configurable": {
            "thread_id": c.thread_id,
            "checkpoint_ns": c.checkpoint_ns,
            "checkpoint_id": c.checkpoint_id,
        }
    }


def _same_checkpoint(saver: FleetstoreSaver, c: _Checkpoint) -> bool | None:
    """None: not in the store; else whether it holds *c* (without its writes)."""
    got = saver.get_tuple(_config(c))  # type: ignore[arg-type]
    if got is None:
        return None
    parent = got.parent_config["configurable"]["checkpoint_id"] if got.parent_config else None
    return bool(
        got.checkpoint == c.checkpoint
        and dict(got.metadata) == c.metadata
        and parent == c.parent_id
    )


def _stored_tasks(saver: FleetstoreSaver, c: _Checkpoint) -> dict[str, list[tuple[str, Any]]]:
    got = saver.get_tuple(_config(c))  # type: ignore[arg-type]
    out: dict[str, list[tuple[str, Any]]] = {}
    for task, channel, value in got.pending_writes or [] if got else []:
        out.setdefault(task, []).append((channel, value))
    return out


def _task_writes(ws: list[_Write], serde: SerializerProtocol) -> list[tuple[str, Any]]:
    ordered = sorted(ws, key=lambda w: w.idx)
    return [(w.channel, serde.loads_typed(w.value)) for w in ordered]


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
    cps = _in_order(_read_source(path))
    for c in cps:
        _decode(c, serde, path)
    saver = FleetstoreSaver(store, serde=serde)
    try:
        existing: dict[tuple[str, str, str], dict[str, list[tuple[str, Any]]]] = {}
        for c in cps:
            same = _same_checkpoint(saver, c)
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
        keys = _storage_keys(cps, serde)
        new_cps = new_tasks = unchanged_tasks = 0
        for i, c in enumerate(cps):
            step("import", i, len(cps))
            had = existing.get((c.thread_id, c.checkpoint_ns, c.checkpoint_id))
            if had is None:
                store.apply(Operation("ckpt_put", _put_args(store, c, serde, keys[i]), new_id()))
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
        for c in cps:
            _verify(saver, c, serde)
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


def _verify(saver: FleetstoreSaver, c: _Checkpoint, serde: SerializerProtocol) -> None:
    """``IntegrityError`` unless ``FleetstoreSaver.get_tuple`` gives for *c* what
    ``SqliteSaver.get_tuple`` gives on the file."""
    if not _same_checkpoint(saver, c):
        raise errors.IntegrityError(f"import check: {c.where} differs in the store")
    got = saver.get_tuple(_config(c))  # type: ignore[arg-type]
    expected = c.expected_writes(serde)
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


def run_cli(file: str, store: str | None) -> int:
    """The body of ``fleetstore import --from langgraph-sqlite FILE`` (see ``run_import``)."""
    from fleetstore.integrations import run_import

    return run_import(store, lambda opened: import_langgraph_sqlite(opened, file), summary_line)


__all__ = ["LangGraphImportSummary", "import_langgraph_sqlite", "run_cli", "summary_line"]
