"""The ``ops`` step: ``applied_ops`` pruning, in every file of the store (a sharded
store: the catalog's and each shard's; its one spool beside the catalog bounds them all).

applied_ops pruning
-------------------
``applied_ops`` makes a retried or replayed operation a no-op; a row pruned too
early would let a replay apply twice.  Rows applied before the horizon
(``ops_older_than``, at least an hour) are pruned, but never one applied after the
creation of an operation still in a spool journal: an operation's id is a UUIDv7
whose time precedes any application of it, so the horizon is lowered to the
oldest such time (and pruning is skipped when a journal is damaged or holds an id
whose time cannot be read).
"""

from __future__ import annotations

from typing import Any

from fleetstore import sql
from fleetstore.admin.maintain.files import each_file, file_count
from fleetstore.admin.maintain.journals import read_journals
from fleetstore.admin.maintain.report import Progress, Step
from fleetstore.admin.maintain.writer import Batch, Writer
from fleetstore.engine.sqlite import Database


def _uuid7_bound(t: float) -> str:
    """A string that sorts after every UUIDv7 text of a time before *t* and before
    every one of *t* or later: the 48-bit millisecond prefix."""
    ms = max(int(t * 1000), 0)
    text = f"{ms:012x}"
    return f"{text[:8]}-{text[8:]}"


def prune_ops(
    store: Any, step: Step, horizon: float, dry_run: bool, progress: Progress | None
) -> None:
    """Prune every file's applied_ops (a sharded store: the catalog's and each
    shard's; its one spool beside the catalog bounds them all)."""
    found = read_journals(store.spool_dir, store.keyring)
    step.detail["journals"] = found.count
    if found.doubt:
        step.status = "skipped"
        step.summary = f"not pruned: {found.doubt}"
        return
    if found.oldest_op is not None and found.oldest_op < horizon:
        step.detail["lowered_to_journal"] = True
        horizon = found.oldest_op
    step.detail["horizon"] = horizon
    # Ids are UUIDv7 (time-ordered): an operation applied before the horizon was
    # created before it, so its id sorts below the horizon's prefix and the scan stops
    # there.  (A row whose id is not a UUIDv7 and sorts above it is kept.)
    bound = _uuid7_bound(horizon)
    files = file_count(store)
    seen = {"rows": 0, "old": 0, "pruned": 0, "files": 0, "visited": 0}

    def visit(_key: str | None, db: Database) -> None:
        q = sql.queries(db.dialect)
        total, oldest = db.read(lambda tx: tx.execute(q["mnt_ops_count"])[0])
        seen["rows"] += int(total)
        seen["visited"] += 1
        if total and oldest is not None and oldest < horizon:
            seen["files"] += 1
            if dry_run:
                seen["old"] += int(
                    db.read(lambda tx: tx.execute(q["mnt_ops_old_count"], (bound, horizon))[0][0])
                )
            else:
                seen["pruned"] += _prune_file(Writer(db), step, horizon, bound)
        if progress is not None and files > 1:
            progress("ops", seen["visited"], files)

    each_file(store, visit)
    total = seen["rows"]
    step.detail.update(rows=total)
    where = f" in {files} files" if store.spans_files else ""
    if not seen["files"]:
        step.status = "nothing"
        step.summary = f"{total} applied_ops row(s){where}, none older than the horizon"
        return
    if dry_run:
        step.status = "dry-run"
        step.summary = f"would prune {seen['old']} of {total} applied_ops row(s){where}"
        return
    step.detail["pruned"] = seen["pruned"]
    step.summary = f"pruned {seen['pruned']} of {total} applied_ops row(s){where}"


def _prune_file(writer: Writer, step: Step, horizon: float, bound: str) -> int:
    batch = Batch(500, 100_000)
    deleted, after = 0, ""
    while True:
        result = writer.apply(
            step,
            "mnt_prune_ops",
            {"applied_before": horizon, "after": after, "below": bound, "limit": batch.size},
        )
        deleted += int(result["deleted"])
        batch.update(result["scanned"], step.last_hold)
        if result["done"]:
            return deleted
        after = result["last"]


__all__ = ["prune_ops"]
