"""``fleetstore import``: an export file brought into a store.

Importing reads the file twice.  The first pass checks everything and writes
nothing: the file itself, record by record (``transfer/reader.py``), and that no
record contradicts what the store already holds.  Only then the second pass writes
the blobs (files, before any transaction) and applies the operations through
``Store.apply``, one short transaction each.

The import operations carry whole rows (every column, the parts, the streamed
chunks, the usage), so a store round-trips exactly, and each is idempotent by
content: an object absent from the store is inserted; present and equal, nothing
happens; present at an earlier stage (a session at a lower version, a message
still streaming, state at a lower version) it is brought forward; present at a
later stage it is left alone (reported as ``newer``); anything else is a conflict
(``AlreadyExists``) naming the object.  Importing a file twice changes nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetstore import errors
from fleetstore.domain.blobs import BlobStore, referenced_shas
from fleetstore.domain.imports import (
    INSERTED,
    MISSING_PARENT,
    NEWER,
    UNCHANGED,
    UPDATED,
    run_import,
)
from fleetstore.engine.base import Tx
from fleetstore.transfer.format import MAX_LINE, MAX_TOTAL, Progress
from fleetstore.transfer.reader import BlobItem, OpItem, Reader

if TYPE_CHECKING:
    from fleetstore.store.facade import Store

_CHECK_BATCH = 256  # operations checked against the store per read transaction


@dataclass(frozen=True, slots=True)
class ImportSummary:
    path: str
    sessions: int
    messages: int
    states: int
    blobs: int
    blob_bytes: int
    #: Blob files that were not in the store yet.
    new_blobs: int
    #: Sessions, messages and state values: new / brought forward / already
    #: there and equal / already there at a later stage (left as they were).
    inserted: int
    updated: int
    unchanged: int
    newer: int


def _item_session(store: Store, item: OpItem) -> str:
    """The session whose file an operation of the file is checked in: its own, or,
    for a session the store does not hold yet, its parent's (a sharded store keeps
    a subagent in its parent's tree)."""
    parsed = item.parsed
    if item.op.name != "import_session":
        return str(parsed.session_id)
    sid = str(parsed.id)
    if store.router is not None and parsed.parent_id is not None and store.router.home(sid) is None:
        return str(parsed.parent_id)
    return sid


def _check_against_store(store: Store, reader: Reader, batch: list[OpItem]) -> None:
    """Dry-run a batch of operations against the store: a conflict is found
    before anything is written.  A sharded store checks each operation in the file
    of its session's tree, the operations of one file in one read transaction."""
    if store.router is None:
        _check_in(store, reader, batch, None)
        return
    groups: dict[str | None, tuple[str, list[OpItem]]] = {}
    for item in batch:
        sid = _item_session(store, item)
        key = store.router.home(sid)
        groups.setdefault(key, (sid, []))[1].append(item)
    # In the order of each file's first operation; within a file, in file order.
    for sid, items in groups.values():
        _check_in(store, reader, items, sid)


def _check_in(store: Store, reader: Reader, batch: list[OpItem], session_id: str | None) -> None:
    q = store.queries

    def run(tx: Tx) -> None:
        for item in batch:
            try:
                outcome = run_import(tx, q, item.op.name, item.parsed, False, 0.0)
            except errors.AlreadyExists as exc:
                raise errors.AlreadyExists(
                    f"{reader.path}: line {item.line}: {exc}; nothing was imported"
                ) from None
            except errors.InvalidInput as exc:
                raise reader.fail(item.line, str(exc)) from None
            if outcome == MISSING_PARENT and not item.parent_in_file:
                s = item.parsed
                raise reader.fail(
                    item.line,
                    f"session {s.id}: its parent {s.parent_id} is neither in the file nor in "
                    "the store (export the parent's tree, or import its export first)",
                )

    store.read(run, session_id=session_id)


def import_file(
    store: Store,
    path: str | os.PathLike[str],
    *,
    progress: Progress | None = None,
    max_line: int = MAX_LINE,
    max_total: int = MAX_TOTAL,
) -> ImportSummary:
    """Import an export file into *store*: checked whole first (``InvalidArchive``,
    or ``AlreadyExists`` for a conflict with the store, and nothing is written),
    then blobs and operations written.  Importing a file twice changes nothing."""
    file = Path(path)
    limit = store.settings.max_payload_bytes
    check = Reader(file, limit, max_line, max_total)
    batch: list[OpItem] = []
    try:
        for item in check.items():
            if isinstance(item, OpItem):
                batch.append(item)
                if len(batch) >= _CHECK_BATCH:
                    _check_against_store(store, check, batch)
                    batch.clear()
            if progress is not None:
                progress("check", check.position, check.file_size)
        _check_against_store(store, check, batch)
    except errors.InvalidArchive as exc:
        raise errors.InvalidArchive(f"{exc}; nothing was imported") from None

    counts = {INSERTED: 0, UPDATED: 0, UNCHANGED: 0, NEWER: 0}
    kinds = {"import_session": 0, "import_message": 0, "import_state": 0}
    blobs = new_blobs = blob_bytes = 0
    last: list[Any] = [None, None]  # the last message's id and outcome
    write = Reader(file, limit, max_line, max_total)
    line = 0
    try:
        for item in write.items():
            line = item.line
            if isinstance(item, BlobItem):
                fresh = not store.blobs.exists(item.sha256)
                store.blobs.put_stored(item.sha256, item.data.read(), item.size, keep=True)
                blobs += 1
                new_blobs += fresh
                blob_bytes += item.size
            else:
                action = store.apply(item.op)["action"]
                if isinstance(store.blobs, BlobStore) and store.blobs.keeping:
                    # Its blob files are made young again, or written again if a
                    # collector with a short grace took them (BlobStore.settle).
                    store.blobs.settle(referenced_shas(item.op.args), written=True)
                name = item.op.name
                if name == "import_parts":
                    if action == UPDATED and last[1] in (UNCHANGED, NEWER):
                        counts[last[1]] -= 1
                        counts[UPDATED] += 1
                        last[1] = UPDATED
                else:
                    kinds[name] += 1
                    counts[action] += 1
                    if name == "import_message":
                        last = [item.parsed.id, action]
            if progress is not None:
                progress("import", write.position, write.file_size)
    except errors.InvalidArchive as exc:
        raise errors.InvalidArchive(
            f"{exc} (the file changed while it was imported: records before it were imported)"
        ) from None
    except errors.StoreBusy:
        raise
    except (errors.AlreadyExists, errors.NotFound, errors.InvalidInput) as exc:
        raise type(exc)(
            f"{file}: line {line}: {exc}; the import stopped there (the records before it "
            "were imported; importing the file again is safe)"
        ) from exc
    if write.sha256 != check.sha256:
        raise errors.InvalidArchive(f"{file}: the file changed while it was imported")
    return ImportSummary(
        path=str(file),
        sessions=kinds["import_session"],
        messages=kinds["import_message"],
        states=kinds["import_state"],
        blobs=blobs,
        blob_bytes=blob_bytes,
        new_blobs=new_blobs,
        inserted=counts[INSERTED],
        updated=counts[UPDATED],
        unchanged=counts[UNCHANGED],
        newer=counts[NEWER],
    )


__all__ = [
    "ImportSummary",
    "import_file",
]
