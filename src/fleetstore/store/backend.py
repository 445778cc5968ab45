"""One backend per layout, composed into the ``Store`` facade rather than branched on
(diskcache's FanoutCache composes Cache the same way): the facade owns what every
layout shares (the spool, the background thread, streams, figures) and hands each
write, read and lifecycle step to its backend.

* ``store/single.py``: one SQLite file;
* ``store/sharded.py``: a catalog plus one SQLite file per session tree;
* ``store/server.py``: a PostgreSQL database.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from fleetstore import sql
from fleetstore.domain import registry
from fleetstore.domain.blobs import BlobStore, DbBlobStore
from fleetstore.domain.operations import Operation, Result
from fleetstore.engine.base import Engine, Migration, Tx

T = TypeVar("T")


def migrations(dialect: str = "sqlite") -> list[Migration]:
    """The store's schema steps for *dialect*, in order."""
    return list(sql.migrations(dialect))


class Backend(Protocol):
    """What the facade needs of a layout."""

    #: "file" (one SQLite file), "sharded" (a directory) or "server" (PostgreSQL).
    layout: str
    #: The database the store names (a sharded store: its catalog).
    db: Engine
    #: The store file (sharded: the catalog) or this host's base path for a server
    #: store: the spool, the published figures and the blob files live beside it.
    path: Path
    #: What messages name: the file, the directory URL, or the URL without password.
    url: str
    blobs: BlobStore | DbBlobStore

    def apply(self, op: Operation) -> Result:
        """Apply *op* now (``StoreBusy`` past the write budget)."""
        ...

    def read(self, fn: Callable[[Tx], T], session_id: str | None) -> T:
        """``fn(tx)`` in one read transaction of the file holding *session_id*."""
        ...

    def read_first(self, fn: Callable[[Tx], list[T]]) -> list[T]:
        """``fn(tx)`` on each file until one returns rows."""
        ...

    def sync_catalog(self, timeout: float | None) -> bool:
        """Bring the layout's index up to date with this process's writes."""
        ...

    def recover(self) -> int:
        """Finish the writes that processes which died left half-done; how many."""
        ...

    def metrics(self) -> dict[str, Any]:
        """The engine's figures for this process (every file of the layout)."""
        ...

    def after_fork(self) -> None:
        """In a forked child: drop the parent's per-process state."""
        ...

    def close(self, *, sync: bool) -> None:
        """Close every file or connection (*sync*: the store is not known to be locked,
        so a last index refresh may wait for it)."""
        ...


class OneDatabase:
    """A layout of one database: every write and read goes to it."""

    layout = "file"

    def __init__(self, db: Engine, queries: Mapping[str, str], path: Path) -> None:
        self.db = db
        self.queries = queries
        self.path = path
        self.url = db.path
        self.blobs: BlobStore | DbBlobStore

    def apply(self, op: Operation) -> Result:
        # On PostgreSQL the function may run again (serialization failure, lost
        # connection); operations are idempotent by op_id, so a rerun is safe.
        q = self.queries
        spec = registry.spec_of(op.name)
        return self.db.run_write(
            lambda tx: registry.apply(tx, q, op, tx.now), single_statement=spec.single_statement
        )

    def read(self, fn: Callable[[Tx], T], session_id: str | None) -> T:
        return self.db.read(fn)

    def read_first(self, fn: Callable[[Tx], list[T]]) -> list[T]:
        return self.db.read(fn)

    def sync_catalog(self, timeout: float | None) -> bool:
        return True

    def recover(self) -> int:
        return 0

    def metrics(self) -> dict[str, Any]:
        return self.db.metrics()

    def after_fork(self) -> None:
        pass  # the engine's own at-fork hook resets its connections

    def close(self, *, sync: bool) -> None:
        self.db.close()


__all__ = ["Backend", "OneDatabase", "migrations"]
