"""The measured writes every step makes.

Every step writes in short transactions through the normal write path
(``db.write()``: the gate, the budget, the hygiene), never a raw connection, and
sizes its batches (``Batch``) so that each transaction holds the lock about
``TARGET_HOLD`` seconds: a fleet waits a few milliseconds on maintenance, not the
0.25 s that deleting a 20,000-message session in one transaction held the lock.
Each step records the lock wait and hold of its transactions (``Writer``: from
entering ``write()`` to the end of the block, so a hold includes the commit)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from fleetstore import sql
from fleetstore.admin.maintain.report import Step
from fleetstore.core.ids import new_id
from fleetstore.domain import registry
from fleetstore.domain.operations import Operation
from fleetstore.engine.base import Engine, Tx
from fleetstore.files.outside import OutsideFile

T = TypeVar("T")

#: The lock hold each batched transaction aims at (seconds).
TARGET_HOLD = 0.02
#: Maintenance operations that a sharded store routes to a session tree's shard.
_ROUTED = frozenset({"mnt_delete_tree"})


class Writer:
    """Runs write transactions through ``db.write()``, timing each: the wait (entering
    ``write()`` to the start of the block) and the hold (the block and its commit).

    Given a sharded *store*, the operations that change a session tree
    (``mnt_delete_tree``) go through ``store.apply``: the router applies them in the
    tree's shard and then brings the catalog's index up to date (three short
    transactions: the intent, the shard, the index).  Their recorded hold is the
    whole of it, an upper bound of each transaction's, and their wait is not
    separated from it (recorded as 0)."""

    def __init__(self, db: Engine | OutsideFile, store: Any = None) -> None:
        self.db = db
        self.store = store if getattr(store, "router", None) is not None else None
        self.queries = sql.queries(db.dialect)

    def run(self, step: Step, fn: Callable[[Tx], T]) -> T:
        entered = time.monotonic()
        began = [entered]

        def timed(tx: Any) -> T:
            began[0] = time.monotonic()  # the last run's start, when PostgreSQL reruns it
            return fn(tx)

        result = self.db.run_write(timed)
        step.record(began[0] - entered, time.monotonic() - began[0])
        return result

    def apply(self, step: Step, name: str, args: dict[str, Any]) -> dict[str, Any]:
        if self.store is not None and name in _ROUTED:
            # A fresh op id: the router keys its catalog+shard intent by it.
            started = time.monotonic()
            result: dict[str, Any] = self.store.apply(Operation(name, args, new_id()))
            step.record(0.0, time.monotonic() - started)
            return result
        op = Operation(name, args, "maintenance")
        return self.run(step, lambda tx: registry.apply(tx, self.queries, op, tx.now))


class Batch:
    """A batch size that follows the measured hold toward ``TARGET_HOLD``."""

    def __init__(self, first: int, most: int) -> None:
        self.size = first
        self.most = most

    def update(self, done: int, hold: float) -> None:
        if done < self.size:
            return  # a short batch says nothing about the rate
        wanted = int(self.size * TARGET_HOLD / max(hold, 1e-4))
        self.size = max(1, min(self.most, wanted, self.size * 2))


__all__ = ["TARGET_HOLD", "Batch", "Writer"]
