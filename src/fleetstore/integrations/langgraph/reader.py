"""Reading a LangGraph ``SqliteSaver`` checkpoint file into plain records, for
``fleetstore import --from langgraph-sqlite`` (``fleetstore.integrations.langgraph.importer``,
which deserialises and imports them).

Reads the schema ``langgraph-checkpoint-sqlite`` writes: tables ``checkpoints``
(a whole checkpoint, channel values included, serialised by the saver's serde;
metadata as JSON) and ``writes`` (pending writes, ``task_path`` optional: files
older than that column read it as ``""``).  Nothing is deserialised here: a
checkpoint and each write stay the ``(type, bytes)`` the saver stored.

The file is opened read-only (``fleetstore.files.foreign``) and read whole, in
one read transaction; a file that changed during a read without locks is refused
(``FileChanged``).  Every id is a string, every metadata a JSON object, and every
write belongs to a checkpoint of the file: else ``InvalidInput`` (``NotFound`` if
there is no file).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from fleetstore import errors
from fleetstore.domain.langgraph import Typed
from fleetstore.files import foreign, inspect

_TABLES = ("checkpoints", "writes")


@dataclass
class LangGraphWrite:
    """A pending write, as ``SqliteSaver`` stored it."""

    task_id: str
    task_path: str
    idx: int
    channel: str
    value: Typed


@dataclass
class LangGraphCheckpoint:
    """A checkpoint of the file and its pending writes, in the file's order."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    raw: Typed  # the whole checkpoint, as SqliteSaver stored it
    metadata: dict[str, Any]
    writes: list[LangGraphWrite] = field(default_factory=list)

    @property
    def where(self) -> str:
        return (
            f"checkpoint {self.checkpoint_id!r} of thread {self.thread_id!r} "
            f"(namespace {self.checkpoint_ns!r})"
        )

    def tasks(self) -> dict[tuple[str, str], list[LangGraphWrite]]:
        """The writes by (task id, task path)."""
        out: dict[tuple[str, str], list[LangGraphWrite]] = {}
        for w in self.writes:
            out.setdefault((w.task_id, w.task_path), []).append(w)
        return out


def bad_file(path: str, why: str) -> errors.InvalidInput:
    """The error for a file that is not what a ``SqliteSaver`` writes (the importer's
    too, for what does not deserialise)."""
    return errors.InvalidInput(f"{path}: not an importable LangGraph SqliteSaver file: {why}")


def _text(value: object, path: str, what: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value) or len(value) > 1024 * 64:
        raise bad_file(
            path, f"{what} is not a {'' if empty else 'non-empty '}string: {value!r:.80}"
        )
    return value


def _blob(value: object, path: str, what: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if not isinstance(value, bytes):
        raise bad_file(path, f"{what} is not a blob")
    return value


def read_langgraph_source(path: str) -> list[LangGraphCheckpoint]:
    """The checkpoints of the ``SqliteSaver`` file at *path* (see the module doc)."""
    try:
        return foreign.read_foreign(path, lambda db: _read_tables(db, path))
    except inspect.InspectFailed as exc:
        if exc.reason == "empty":
            raise bad_file(path, "the file is empty") from None
        if exc.reason == "wal-without-shm":
            raise errors.InvalidInput(str(exc)) from None
        raise bad_file(path, str(exc)) from None


def _read_tables(db: inspect.ReadOnlyDatabase, path: str) -> list[LangGraphCheckpoint]:
    tables = {r[0] for r in db.query("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    missing = [t for t in _TABLES if t not in tables]
    if missing:
        raise bad_file(path, f"no table {', '.join(missing)}")
    found: dict[tuple[str, str, str], LangGraphCheckpoint] = {}
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
            raise bad_file(path, f"the metadata of {where} is not JSON") from None
        if not isinstance(metadata, dict):
            raise bad_file(path, f"the metadata of {where} is not a JSON object")
        found[key] = LangGraphCheckpoint(
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
            raise bad_file(path, f"{where}: the checkpoint is not in the file")
        if not isinstance(idx, int):
            raise bad_file(path, f"{where}: idx is not an integer")
        owner.writes.append(
            LangGraphWrite(
                _text(task, path, f"the task_id of {where}", empty=True),
                _text(tpath, path, f"the task_path of {where}", empty=True),
                idx,
                _text(channel, path, f"the channel of {where}"),
                (_text(kind, path, f"the type of {where}"), _blob(value, path, where)),
            )
        )
    return list(found.values())


__all__ = [
    "LangGraphCheckpoint",
    "LangGraphWrite",
    "bad_file",
    "read_langgraph_source",
]
