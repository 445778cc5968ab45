"""What a store shows an operator beyond ``metrics()``: its operations as OpenTelemetry
spans and measurements once an SDK is installed (``traced``, called by
``Store.submit`` only then: core/telemetry.py), its name there (``namespace``), the
figures read from the store itself (``store_figures``), and the spool's log events
(``log_spooled``, ``log_replayed``, ``log_recovered``: docs/telemetry.md, "Logs")."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fleetstore import errors
from fleetstore.core import telemetry
from fleetstore.core.logs import logger
from fleetstore.core.telemetry import StoreFigures
from fleetstore.domain import registry
from fleetstore.domain.operations import Delivery, Operation, Scope
from fleetstore.domain.search_index import queue_lag

#: A ``fleetstore.store.facade.Store`` (whose module imports this one: naming the class
#: here would make an import cycle, which tests/test_layers.py forbids).
Store = Any

log = logger("fleetstore")


def namespace(store: Store) -> str:
    """OpenTelemetry's ``db.namespace`` of *store*: the database's name on a PostgreSQL
    server, else the store's path (a sharded store's directory)."""
    if store.dialect == "postgresql":
        return urlsplit(store.url).path.lstrip("/") or "postgres"
    return str(store.url).removeprefix("sqlite+sharded://").removeprefix("sqlite://")


def traced(store: Store, op: Operation, delivery: Delivery) -> dict[str, Any] | None:
    """``store.submit(op, ...)`` as a CLIENT span and a ``db.client.operation.duration``
    measurement; the session the operation writes (if it names one) on the span."""
    otel = telemetry.ACTIVE
    if otel is None:
        untraced: dict[str, Any] | None = store._dispatch(op, delivery)
        return untraced
    spec = registry.spec_of(op.name)
    session_id = None
    if spec.scope is not Scope.CATALOG:
        for name in spec.session_args:
            value = op.args.get(name)
            if isinstance(value, str):
                session_id = value
                break
    # One call that carries several operations: a worker's batch of settlements
    # (``effects._settle_batch``), the conventions' batch.
    items = op.args.get("items") if op.name == "settle_effects" else None
    result: dict[str, Any] | None = otel.operation(
        store.dialect,
        store.namespace,
        op.name,
        session_id,
        store._dispatch,
        op,
        delivery,
        batch=len(items) if items is not None else 0,
    )
    return result


def store_figures(store: Store) -> StoreFigures:
    """What the store holds now, read from it (not a process's figures): its effects
    per state, how long the oldest claimable effect (a thread's head whose time has
    come) has waited for a worker (0: none waits; the outbox's lag), the bytes of its
    -wal files (SQLite), and the search index's queue and lag."""
    counts = store.effects.counts()
    counts.pop("expired", None)
    ready = store.effects.next_ready()
    age = 0.0 if ready is None else max(0.0, time.time() - ready)
    try:
        queued, lag = queue_lag(store)
    except errors.DatabaseError:  # a store read as it is, from before its search index
        queued, lag = 0, 0.0
    return StoreFigures(counts, age, store.backend.wal_bytes(), queued, lag)


def log_spooled(store: Store, op: Operation, busy: BaseException) -> None:
    """*op* went to the spool: it ran out of its write budget (*busy*)."""
    pending, journal = len(store.spool), store.spool.path
    log.warning(
        "%s: %s spooled (%d waiting in %s): %s",
        store.path,
        op.name,
        pending,
        journal,
        busy,
        extra={
            "event": "spooled",
            "store": str(store.path),
            "operation": op.name,
            "op_id": op.op_id,
            "spool_pending": pending,
            "journal": str(journal),
            "error": f"{type(busy).__name__}: {busy}",
        },
    )


def watch(store: Store) -> None:
    """OpenTelemetry's observable instruments read *store*'s figures from now on (once
    an SDK is installed: ``telemetry.refresh`` looks for one now, then with every
    publish)."""
    telemetry.watch(
        store,
        {"db.system.name": store.dialect, "db.namespace": store.namespace},
        store.metrics,
        lambda: store_figures(store),
    )
    telemetry.refresh()


def log_replayed(store: Store, logged: int) -> int:
    """The spool is empty again: the spooled writes replayed since *logged* (the
    spool's replayed total when this was last logged) were applied.  Returns the
    total now."""
    total = store.spool.replayed_total
    replayed = total - logged
    log.info(
        "%s: the spool is empty again: %d spooled write(s) replayed",
        store.path,
        replayed,
        extra={"event": "replayed", "store": str(store.path), "replayed": replayed},
    )
    return int(total)


def log_recovered(store: Store, journal: Path, replayed: int, status: str) -> None:
    """*replayed* writes of a process that died were replayed from its *journal*."""
    log.info(
        "%s: %d write(s) of a process that died replayed from %s (%s)",
        store.path,
        replayed,
        journal.name,
        status,
        extra={
            "event": "recovered",
            "store": str(store.path),
            "replayed": replayed,
            "journal": str(journal),
            "status": status,
        },
    )


__all__ = [
    "log_recovered",
    "log_replayed",
    "log_spooled",
    "namespace",
    "store_figures",
    "traced",
    "watch",
]
