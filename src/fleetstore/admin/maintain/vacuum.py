"""The ``optimize`` step (``PRAGMA optimize``, one short transaction) and the
``vacuum`` step (``PRAGMA incremental_vacuum`` in batches sized to ``TARGET_HOLD``,
only on a file with incremental auto-vacuum: a full VACUUM would hold the lock
throughout).  Both are generic: they run on a foreign database too."""

from __future__ import annotations

from collections.abc import Callable

from fleetstore import sql
from fleetstore.admin.maintain.report import Progress, Step
from fleetstore.admin.maintain.writer import Batch, Writer
from fleetstore.core.units import size as _size
from fleetstore.engine.base import Tx
from fleetstore.engine.sqlite import Database
from fleetstore.files.outside import OutsideFile

#: Pages of the first incremental-vacuum transaction (then sized to TARGET_HOLD).
FIRST_VACUUM_PAGES = 256


def optimize(writer: Writer, step: Step, dry_run: bool) -> None:
    if dry_run:
        step.status = "dry-run"
        step.summary = "would run PRAGMA optimize (it analyses only tables whose statistics aged)"
        return
    # Since SQLite 3.46 optimize caps the rows ANALYZE reads per index: a short transaction.
    writer.run(step, lambda tx: tx.execute("PRAGMA optimize"))
    step.summary = "PRAGMA optimize"


def _pages(db: Database | OutsideFile) -> tuple[int, int, int]:
    q = sql.queries("sqlite")
    size, count, free = db.read(lambda tx: tx.execute(q["mnt_pages"])[0])
    return int(size), int(count), int(free)


def vacuum(writer: Writer, step: Step, dry_run: bool, progress: Progress | None) -> None:
    q = writer.queries
    db = writer.db
    assert isinstance(db, Database | OutsideFile)  # a SQLite file's pages
    mode = int(db.read(lambda tx: tx.execute(q["mnt_auto_vacuum"])[0][0]))
    page_size, count, free = _pages(db)
    step.detail.update(page_size=page_size, pages=count, free_pages=free, auto_vacuum=mode)
    if mode != 2:
        step.status = "skipped"
        step.summary = (
            f"the file has no incremental auto-vacuum ({free} free pages stay for reuse; "
            "only a full VACUUM, which holds the lock throughout, would return them)"
        )
        return
    if not free:
        step.status = "nothing"
        step.summary = "no free pages"
        return
    if dry_run:
        step.status = "dry-run"
        step.summary = f"would return {free} free pages ({_size(free * page_size)}) to the system"
        return
    batch = Batch(FIRST_VACUUM_PAGES, 1 << 20)
    left = free
    while left > 0:
        writer.run(step, _incremental_vacuum(batch.size))
        before = left
        left = _pages(db)[2]
        batch.update(before - left, step.last_hold)
        if progress is not None:
            progress("vacuum", free - left, free)
        if left >= before:  # nothing freed: another process is allocating; stop
            break
    step.detail["freed_pages"] = free - left
    step.summary = f"returned {free - left} pages ({_size((free - left) * page_size)})"


def _incremental_vacuum(pages: int) -> Callable[[Tx], object]:
    return lambda tx: tx.execute(f"PRAGMA incremental_vacuum({int(pages)})")


__all__ = ["FIRST_VACUUM_PAGES", "optimize", "vacuum"]
