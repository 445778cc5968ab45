"""``fleetstore import``: an export file brought into a store.

Importing reads the file more than once.  The first pass checks everything and
writes nothing: the file itself, record by record (``transfer/reader.py``), and that
no record contradicts what the store already holds.  Only then the blobs are written
(files, before any transaction) and the operations applied: on one file or a server
database all in one write transaction, so that a record another process contradicted
since the check (it created one of the file's sessions meanwhile) rolls them all back;
on a sharded store, which no transaction spans, one short transaction each.

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
from fleetstore.core.keys import Keyring
from fleetstore.domain import registry
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
    if store.spans_files and parsed.parent_id is not None and store.backend.home(sid) is None:
        return str(parsed.parent_id)
    return sid


def _check_against_store(store: Store, reader: Reader, batch: list[OpItem]) -> None:
    """Dry-run a batch of operations against the store: a conflict is found
    before anything is written.  A sharded store checks each operation in the file
    of its session's tree, the operations of one file in one read transaction."""
    if not store.spans_files:
        _check_in(store, reader, batch, None)
        return
    groups: dict[str | None, tuple[str, list[OpItem]]] = {}
    for item in batch:
        sid = _item_session(store, item)
        key = store.backend.home(sid)
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


class _Tally:
    def __init__(self) -> None:
        self.counts = {INSERTED: 0, UPDATED: 0, UNCHANGED: 0, NEWER: 0}
        self.kinds = {"import_session": 0, "import_message": 0, "import_state": 0}
        self.blobs = self.new_blobs = self.blob_bytes = 0
        self.last: list[Any] = [None, None]  # the last message's id and outcome

    def blob(self, store: Store, item: BlobItem, *, keep: bool = True) -> None:
        fresh = not store.blobs.exists(item.sha256)
        store.blobs.put_stored(item.sha256, item.data.read(), item.size, keep=keep)
        self.blobs += 1
        self.new_blobs += fresh
        self.blob_bytes += item.size

    def op(self, item: OpItem, action: str) -> None:
        name = item.op.name
        if name == "import_parts":
            if action == UPDATED and self.last[1] in (UNCHANGED, NEWER):
                self.counts[self.last[1]] -= 1
                self.counts[UPDATED] += 1
                self.last[1] = UPDATED
        else:
            self.kinds[name] += 1
            self.counts[action] += 1
            if name == "import_message":
                self.last = [item.parsed.id, action]


#: What every Reader of one import is given: payload, line and total limits, keyring.
_Limits = tuple[int, int, int, Keyring | None]


def _write_whole(
    store: Store,
    file: Path,
    check: Reader,
    limits: _Limits,
    tally: _Tally,
    progress: Progress | None,
) -> None:
    """One file or a server database: the blob files first, then every operation in
    one write transaction, so that the operations are written whole or not at all.  A
    record that contradicts the store now (another process wrote one of the file's
    objects since the check) rolls every one of them back: nothing partial."""
    blobs = Reader(file, *limits)
    try:
        for item in blobs.items():
            if isinstance(item, BlobItem):
                tally.blob(store, item, keep=False)  # a file's worth: not held in memory
            if progress is not None:
                progress("blobs", blobs.position, blobs.file_size)
    except errors.InvalidArchive as exc:
        raise errors.InvalidArchive(
            f"{exc} (the file changed while it was imported; nothing was imported)"
        ) from None
    if blobs.sha256 != check.sha256:
        raise errors.InvalidArchive(f"{file}: the file changed while it was imported")
    shas: list[str] = []

    def write(tx: Tx) -> _Tally:
        # PostgreSQL may run this again (a serialization failure): counted afresh.
        done = _Tally()
        shas.clear()
        ops = Reader(file, *limits)
        line = 0
        try:
            for item in ops.items():
                line = item.line
                if isinstance(item, OpItem):
                    done.op(item, run_import_op(tx, store.queries, item))
                    shas.extend(referenced_shas(item.op.args))
                if progress is not None:
                    progress("import", ops.position, ops.file_size)
        except errors.InvalidArchive as exc:
            raise errors.InvalidArchive(
                f"{exc} (the file changed while it was imported; nothing was imported)"
            ) from None
        except (errors.AlreadyExists, errors.NotFound, errors.InvalidInput) as exc:
            raise type(exc)(
                f"{file}: line {line}: {exc} (written since the check, by another process?); "
                "nothing was imported"
            ) from exc
        if ops.sha256 != check.sha256:
            raise errors.InvalidArchive(f"{file}: the file changed while it was imported")
        return done

    done = store.db.run_write(write)
    if isinstance(store.blobs, BlobStore):
        _keep_blobs(store.blobs, file, limits, set(shas))
    tally.counts, tally.kinds, tally.last = done.counts, done.kinds, done.last


def _keep_blobs(blobs: BlobStore, file: Path, limits: _Limits, shas: set[str]) -> None:
    """After the commit: the blob files the operations refer to made young while a
    collector runs, and any a collector took since they were written written again
    from the file (``BlobStore.settle`` does the same for one write)."""
    collecting = blobs.collector_running()
    missing = set()
    for sha in shas:
        try:
            if collecting:
                os.utime(blobs.path(sha))
            elif not blobs.path(sha).is_file():
                missing.add(sha)
        except FileNotFoundError:
            missing.add(sha)
    if not missing:
        return
    for item in Reader(file, *limits).items():
        if isinstance(item, BlobItem) and item.sha256 in missing:
            blobs.put_stored(item.sha256, item.data.read(), item.size)


def run_import_op(tx: Tx, queries: Any, item: OpItem) -> str:
    """Apply one import operation in *tx* (as ``Store.apply`` would); its outcome."""
    return str(registry.apply(tx, queries, item.op, tx.now)["action"])


def _write_op_by_op(
    store: Store,
    file: Path,
    check: Reader,
    limits: _Limits,
    tally: _Tally,
    progress: Progress | None,
) -> None:
    """A sharded store: each operation in its own transaction of its own file (one
    transaction cannot span the files).  A conflict written by another process since
    the check stops the import there: what was written before it stays."""
    write = Reader(file, *limits)
    line = 0
    try:
        for item in write.items():
            line = item.line
            if isinstance(item, BlobItem):
                tally.blob(store, item)
            else:
                tally.op(item, store.apply(item.op)["action"])
                if isinstance(store.blobs, BlobStore) and store.blobs.keeping:
                    # Its blob files are made young again, or written again if a
                    # collector with a short grace took them (BlobStore.settle).
                    store.blobs.settle(referenced_shas(item.op.args), written=True)
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


def import_file(
    store: Store,
    path: str | os.PathLike[str],
    *,
    progress: Progress | None = None,
    max_line: int = MAX_LINE,
    max_total: int = MAX_TOTAL,
    keyring: Keyring | None = None,
) -> ImportSummary:
    """Import an export file into *store*: checked whole first (``InvalidArchive``,
    or ``AlreadyExists`` for a conflict with the store, and nothing is written),
    then blobs and operations written (one file or PostgreSQL: in one transaction,
    rolled back whole on a conflict written meanwhile).  Importing a file twice
    changes nothing.  A sealed export (an encrypted store's) is read with *keyring*,
    else the store's own.  What it holds is stored as it was exported: redaction is
    of what the API writes (``fleetstore redact`` rewrites a store's content)."""
    file = Path(path)
    limit = store.settings.max_payload_bytes
    limits: _Limits = (limit, max_line, max_total, keyring or store.keyring)
    check = Reader(file, *limits)
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

    tally = _Tally()
    if not store.spans_files:
        _write_whole(store, file, check, limits, tally, progress)
    else:
        _write_op_by_op(store, file, check, limits, tally, progress)
    counts, kinds = tally.counts, tally.kinds
    return ImportSummary(
        path=str(file),
        sessions=kinds["import_session"],
        messages=kinds["import_message"],
        states=kinds["import_state"],
        blobs=tally.blobs,
        blob_bytes=tally.blob_bytes,
        new_blobs=tally.new_blobs,
        inserted=counts[INSERTED],
        updated=counts[UPDATED],
        unchanged=counts[UNCHANGED],
        newer=counts[NEWER],
    )


__all__ = [
    "ImportSummary",
    "import_file",
]
