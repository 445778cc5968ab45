"""What the domain needs of a store: the narrow, typed protocol every domain module
is written against (psycopg's ``abc.py`` style).  ``fleetstore.store.facade.Store``
implements it; the domain never imports the store, so the layers stay one-way.

Reads and writes go through these members only: an operation is submitted (applied
now, or spooled past the budget), a read function runs in one read transaction of
the right file, and blobs are written before the transaction that refers to them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from fleetstore.core.metrics import OutboxMetrics
from fleetstore.core.redact import WriteRedaction
from fleetstore.core.settings import Settings
from fleetstore.domain.blobs import BlobRef
from fleetstore.domain.operations import Delivery, Operation
from fleetstore.engine.base import (  # the read functions' transaction, for the layers above
    Engine,
    Tx,
)

T = TypeVar("T")


class Blobs(Protocol):
    """Content-addressed payloads (files beside a SQLite store, rows on PostgreSQL)."""

    def put(self, data: bytes) -> BlobRef:
        """Store *data* (compressed, durable before this returns); its reference."""
        ...

    def get(self, sha256: str, size: int | None = None) -> bytes:
        """The payload, verified against its hash (``BlobCorrupt`` if it is not)."""
        ...


class Flushable(Protocol):
    """A stream the store's background thread flushes when its pending text is due."""

    @property
    def id(self) -> str:
        """The id of the message being streamed."""
        ...

    def due(self) -> float | None: ...

    def flush(self) -> None: ...


class StorePort(Protocol):
    """The members of a store the domain uses, and nothing else."""

    @property
    def settings(self) -> Settings: ...

    @property
    def queries(self) -> Mapping[str, str]:
        """The named queries of the store's dialect."""
        ...

    @property
    def outbox_metrics(self) -> OutboxMetrics:
        """This process's outbox figures (the outbox and the worker record them)."""
        ...

    @property
    def blobs(self) -> Blobs: ...

    @property
    def redaction(self) -> WriteRedaction | None:
        """What content passes through before it is stored (None: redaction off)."""
        ...

    @property
    def notifies(self) -> bool:
        """Whether ``notify_wait`` really waits for another process's ring (a committed
        ``tx.notify``) rather than sleeping its timeout (no futex on this machine)."""
        ...

    @property
    def spans_files(self) -> bool:
        """Whether sessions and the catalog's index of them live in different files
        (the sharded layout): a listing then reads the index."""
        ...

    def submit(
        self, op: Operation, delivery: Delivery = Delivery.SPOOLABLE
    ) -> dict[str, Any] | None:
        """Apply *op* now; past the write budget spool it (None) or raise ``StoreBusy``,
        as *delivery* says."""
        ...

    def read(self, fn: Callable[[Tx], T], *, session_id: str | None = None) -> T:
        """``fn(tx)`` in one read transaction (of *session_id*'s file, if it has one)."""
        ...

    def read_first(self, fn: Callable[[Tx], list[T]]) -> list[T]:
        """``fn(tx)`` on each file until one returns rows (a lookup by an id that does
        not name its session)."""
        ...

    def check_visible(self, session_id: str | None) -> None:
        """``SpoolPending`` if a read of *session_id* would miss this process's
        spooled writes."""
        ...

    def spool_pending(self, session_id: str | None = None) -> int:
        """This process's writes waiting in its spool (that touch *session_id*)."""
        ...

    def flush(self, timeout: float | None = None) -> bool:
        """Write pending stream text and wait for the spool to drain."""
        ...

    def sync_catalog(self, timeout: float | None = None) -> bool:
        """Bring a sharded store's index up to date with this process's writes."""
        ...

    def notify_token(self, channel: str) -> int:
        """Taken before looking: ``notify_wait`` with it misses no ring after it."""
        ...

    def notify_wait(self, channel: str, timeout: float, token: int | None = None) -> bool:
        """Wait up to *timeout* seconds for a ring of *channel* after *token*."""
        ...

    def listen(self, channel: str, fn: Callable[[], None]) -> Callable[[], None]:
        """Call *fn* after each ring of *channel* heard; returns what stops it."""
        ...

    def finish_jobs(self) -> None:
        """Have the store's job thread finish the deletes and forks under way that
        nobody is finishing (domain/session_jobs.py); returns at once."""
        ...

    def search_files(
        self, *, session_id: str | None, root_id: str | None, project: str | None
    ) -> list[str | None]:
        """The files a search with these filters reads, by key (None: the store's one
        database, or a sharded store's catalog; else a shard)."""
        ...

    def with_file(self, key: str | None, fn: Callable[[Engine], T]) -> T:
        """``fn(db)`` with the database of file *key* (``search_files``), kept open
        meanwhile."""
        ...

    def streams_opened(self, stream: Flushable) -> None: ...

    def streams_closed(self, stream: Flushable) -> None: ...


__all__ = ["Blobs", "Engine", "Flushable", "StorePort", "Tx"]
