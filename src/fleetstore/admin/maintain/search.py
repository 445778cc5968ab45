"""The ``search`` step: the search index caught up (what the writes had queued when the
step began, and the backfill of what the store held before it had an index), then, on SQLite, its FTS5
segments merged in short transactions (each ``merge`` writes about as many pages as
keeps its hold near ``TARGET_HOLD``), every file of a sharded store in turn.

Merging is what keeps FTS5 fast and small as it is written to: each batch the indexer
writes is a segment of its own, and queries read every segment; a merge also drops
what deletes left behind (contentless tables keep a deleted row's words, hidden, until
its segment is merged), so a redacted or deleted text's words leave the file's pages.
PostgreSQL keeps its GIN indexes itself (autovacuum)."""

from __future__ import annotations

import time
from typing import Any

from fleetstore.admin.maintain.report import Progress, Step
from fleetstore.admin.maintain.writer import Batch, Writer
from fleetstore.domain.search_index import lease_owner
from fleetstore.engine.base import Engine, Tx

#: Pages the first merge transaction may write (then sized to TARGET_HOLD).
FIRST_MERGE_PAGES = 64


def search_step(store: Any, step: Step, dry_run: bool, progress: Progress | None) -> None:
    status = store.search.status()
    step.detail.update(
        queued=status.queued,
        backfill_done=status.backfill_done,
        backfill_total=status.backfill_total,
        sections_before=status.sections,
    )
    if dry_run:
        step.status = "dry-run"
        step.summary = (
            f"would index {status.queued} queued and "
            f"{status.backfill_total - status.backfill_done} backfill message(s), "
            "then merge the index's segments"
        )
        return
    began = time.monotonic()

    me = lease_owner()
    looks = [0]

    def caught_up() -> bool:
        # What was queued when the step began, and the backfill; and nothing while a
        # live process of the fleet indexes the file (its lease: its indexer rests
        # between batches, holding it, and a catch-up waiting for it waited for ever;
        # with 16 agents writing, one of everything chased their writes for minutes).
        now = store.search.status()
        looks[0] += 1  # (a first batch is tried: it takes over the lease of a dead process)
        if looks[0] > 1 and any(owner != me for owner in now.indexers):
            return True
        done = now.queued == 0 or now.lag < time.monotonic() - began
        return bool(done and now.backfill_done >= now.backfill_total)

    written = store.search.catch_up(
        progress=None if progress is None else lambda d, t: progress("search backfill", d, t),
        stop=caught_up,
    )
    merges = 0
    if store.dialect == "sqlite":
        for key in store.search_files(session_id=None, root_id=None, project=None):
            merges += store.with_file(key, lambda db: _merge(db, step))
    step.detail.update(written=written, merge_transactions=merges)
    step.status = "done" if written or merges else "nothing"
    step.summary = f"indexed {written} section(s); merged the index in {merges} transaction(s)"


def _merge(db: Engine, step: Step) -> int:
    """FTS5's ``merge`` on both tables until it has nothing left to do; the
    transactions it took."""
    writer = Writer(db)
    q = writer.queries
    batch = Batch(FIRST_MERGE_PAGES, 1 << 16)
    count = 0
    for table in ("fts5_merge_words", "fts5_merge_grams"):
        while True:

            def run(tx: Tx, pages: int = batch.size, table: str = table) -> int:
                before = int(tx.execute(q["fts5_changes"])[0][0])
                tx.execute(q[table], {"pages": pages})
                return int(tx.execute(q["fts5_changes"])[0][0]) - before

            changed = writer.run(step, run)
            count += 1
            # FTS5: fewer than 2 changes means the merge found nothing to do.
            if changed < 2:
                break
            batch.update(batch.size, step.last_hold)
    return count


__all__ = ["search_step"]
