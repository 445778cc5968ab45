"""The destination's progress record (the ``fleetstore_migrate`` table): the claim
that names SRC as DST's source (``DestinationNotEmpty`` for a DST holding anything
else), and each batch committed together with the record that it was, so a run
killed at any point carries on after the last committed batch."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

from fleetstore.engine.base import Tx
from fleetstore.transfer.migrate.report import ConcurrentMigrate, DestinationNotEmpty
from fleetstore.transfer.migrate.schema import Table, _quote
from fleetstore.transfer.migrate.side import _Side, _template

#: The ``state`` of a DST whose copy no longer fits its SRC (reshard's guard): it is
#: thrown away and copied again, never carried on.
STALE = "stale"


def _now_text() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _claim(dst: _Side, tables: Sequence[Table], src_id: str) -> tuple[bool, dict[str, str]]:
    """Record SRC as DST's source (refusing a DST that holds other data), or find
    the record of an earlier run from the same SRC.  (resumed, progress items)."""
    store = dst.store
    q = store.queries
    probes = [(t.name, _template(q, "mig_any_row", table=_quote(t.name))) for t in tables]
    shards = dst.shard_count()

    def run(tx: Any) -> tuple[bool, dict[str, str]]:
        tx.execute(q["mig_progress_create"])
        items = {str(k): str(v) for k, v in tx.execute(q["mig_progress_get"])}
        source = items.get("source")
        if source is None:
            holding = [name for name, sql in probes if tx.execute(sql)]
            if shards:
                holding.append(f"{shards} shard file(s)")
            if holding:
                raise DestinationNotEmpty(
                    f"DST {store.url} already holds data (tables {', '.join(holding)}) that did "
                    "not come from an interrupted migrate of this SRC; migrate into a new, "
                    "empty store. Nothing was written."
                )
            items = {"source": src_id, "started": _now_text(), "state": "copying"}
            for item, value in items.items():
                tx.execute(q["mig_progress_put"], (item, value))
            return False, items
        if source != src_id:
            raise DestinationNotEmpty(
                f"DST {store.url} holds a migrate from another store ({source}), not from "
                f"{src_id}; nothing was written"
            )
        return True, items

    result: tuple[bool, dict[str, str]] = store.db.run_write(run)
    return result


def _set_item(dst: Any, item: str, value: str) -> None:
    q = dst.queries
    dst.db.run_write(lambda tx: tx.execute(q["mig_progress_put"], (item, value)))


def _write_step(
    dst: Any,
    item: str,
    expected: str | None,
    new: str,
    body: Callable[[Tx], None],
) -> None:
    """*body* and the progress item moved from *expected* to *new*, in one write
    transaction: a batch is committed together with the record that it was."""
    q = dst.queries

    def run(tx: Any) -> None:
        rows = tx.execute(q["mig_progress_item"], (item,))
        current = str(rows[0][0]) if rows else None
        if current == new and tx.uncertain:
            return  # an earlier run of this body committed; its COMMIT's reply was lost
        if current != expected:
            raise ConcurrentMigrate(
                f"DST {dst.url}: the progress of {item} moved under this migrate "
                f"(expected {expected}, found {current}): another migrate is writing to it"
            )
        body(tx)
        tx.execute(q["mig_progress_put"], (item, new))

    dst.db.run_write(run)
