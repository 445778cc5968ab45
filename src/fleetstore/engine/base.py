"""The engine interface every backend implements (engine/sqlite.py, engine/postgres.py).

Atomicity: everything done through one ``write()`` transaction commits or
rolls back as a whole; ``read(fn)`` sees one consistent snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from fleetstore import errors

T = TypeVar("T")


class Tx(Protocol):
    """One transaction of an engine, read or write."""

    @property
    def now(self) -> float:
        """The transaction's clock when it began: this host's ``time.time()`` on SQLite,
        the server's ``transaction_timestamp()`` on PostgreSQL (lease times use it)."""
        ...

    @property
    def uncertain(self) -> bool:
        """Set on a rerun after a COMMIT whose outcome is unknown (PostgreSQL, a lost
        connection): the work may already be committed, so it must be idempotent."""
        ...

    def execute(
        self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
    ) -> list[tuple[Any, ...]]:
        """Run one statement; every row it produces, read whole."""
        ...

    def executemany(
        self, sql: str, seq_of_params: Iterable[Sequence[Any] | dict[str, Any]]
    ) -> None:
        """Run one statement per parameter set."""
        ...

    def notify(self, channel: str) -> None:
        """Ring *channel* once this transaction commits, never before nor if it does
        not: waiters on it in every process wake (engine/notify.py).  A write's only."""
        ...


class Item(Protocol):
    """A write handed to ``Database.submit`` (group commit, engine/combine.py): applied
    in this process, or by the process that holds the gate, in its transaction.  The
    engine knows only bytes; what an item means is decided above (store/backend.py)."""

    def run(self, tx: Tx) -> object:
        """Apply it here, in *tx*; its result."""
        ...

    def payload(self) -> bytes | None:
        """What another process needs to apply it (its applier decodes it), or None
        if it must be applied in this process (it is not safe to apply again after an
        outcome nobody learned, such as a claim)."""
        ...

    def result(self, data: bytes) -> object:
        """Its result, from what the applier of another process returned."""
        ...


#: Applies, in the given transaction, the payload of another process's ``Item`` and
#: returns its result as bytes; raises a ``FleetstoreError`` if the item fails.
Applier = Callable[[Tx, bytes], bytes]


class Engine(Protocol):
    #: "sqlite" or "postgresql": the dialect of sql/ its queries are in.
    dialect: str
    #: The file, or the URL without its password: what messages name.
    path: str

    def write(self) -> AbstractContextManager[Tx]:
        """A write transaction taken within the write budget; its body runs once."""
        ...

    def run_write(self, fn: Callable[[Tx], T], *, single_statement: bool = False) -> T:
        """``fn(tx)`` in a write transaction, committed, within the write budget.  *fn*
        may run more than once (PostgreSQL starts over on a serialization failure or
        a lost connection), so it must do nothing but database work.
        *single_statement*: *fn* is one statement that re-checks its own conditions."""
        ...

    def read(self, fn: Callable[[Tx], T]) -> T:
        """``fn(tx)`` in a read transaction; never waits on writers."""
        ...

    @property
    def notifies(self) -> bool:
        """Whether a committed ``tx.notify`` of another process wakes ``notify_wait``."""
        ...

    def notify_token(self, channel: str) -> int:
        """Taken before looking: ``notify_wait`` with it misses no ring after it."""
        ...

    def notify_wait(self, channel: str, timeout: float, token: int | None = None) -> bool:
        """Wait up to *timeout* s for a ring of *channel* after *token* (False: none)."""
        ...

    def listen(self, channel: str, fn: Callable[[], None]) -> Callable[[], None]:
        """Call *fn* after each ring of *channel* heard; returns what stops it."""
        ...

    def checkpoint(self, *, truncate: bool = False) -> tuple[int, int]: ...

    @property
    def schema_version(self) -> int: ...

    def metrics(self) -> dict[str, Any]:
        """This process's figures (JSON-serialisable)."""
        ...

    def histograms(self) -> dict[str, Any]: ...

    def connection_report(self) -> list[dict[str, Any]]: ...

    def close(self) -> None:
        """Release every connection.  Idempotent."""
        ...


@dataclass(frozen=True, slots=True)
class Migration:
    """One versioned schema step: SQL text (several statements allowed) or a
    function given the write transaction.  Versions are positive and unique.
    (The one migration type: both engines, the store's own and callers' own.)"""

    version: int
    name: str
    sql: str | Callable[[Tx], None]


def ordered_migrations(migrations: Iterable[Migration]) -> list[Migration]:
    """The migrations in version order; ``ConfigError`` unless they are a list of
    ``Migration`` (SQL text or a function each) whose versions are positive
    integers, each used once.  (Both engines.)"""
    if isinstance(migrations, str | bytes | Migration) or not isinstance(migrations, Iterable):
        raise errors.ConfigError(f"migrations must be a list of Migration, not {migrations!r:.80}")
    given = list(migrations)
    for m in given:
        if not isinstance(m, Migration):
            raise errors.ConfigError(f"migrations must be Migration values, not {m!r:.80}")
        if not isinstance(m.name, str) or not (isinstance(m.sql, str) or callable(m.sql)):
            raise errors.ConfigError(
                f"migration {m.version!r}: name must be text and sql SQL text or a function"
            )
    if any(not isinstance(m.version, int) or isinstance(m.version, bool) for m in given):
        raise errors.ConfigError(
            f"migration versions must be positive integers: {[m.version for m in given]}"
        )
    steps = sorted(given, key=lambda m: m.version)
    versions = [m.version for m in steps]
    if any(not isinstance(v, int) or isinstance(v, bool) or v <= 0 for v in versions):
        raise errors.ConfigError(f"migration versions must be positive integers: {versions}")
    if len(set(versions)) != len(versions):
        raise errors.ConfigError(f"migration versions must be unique: {versions}")
    return steps


def check_not_newer(where: str, current: int, steps: Sequence[Migration]) -> None:
    """``MigrationError`` if the store is at a schema newer than this program knows."""
    if steps and current > steps[-1].version:
        raise errors.MigrationError(
            f"{where}: the store is at schema version {current}, newer than the "
            f"newest migration this program knows ({steps[-1].version}); upgrade it"
        )


def apply_steps(
    tx: Tx, where: str, steps: Sequence[Migration], current: int, record_sql: str
) -> list[int]:
    """Inside the migrating transaction: each step newer than *current*, in order (its
    SQL, or its function given *tx*), recorded with *record_sql* (parameters: version,
    name).  A failing step is a ``MigrationError`` naming it.  Returns the versions
    applied.  (Both engines.)"""
    applied = []
    for step in steps:
        if step.version <= current:
            continue
        try:
            if callable(step.sql):
                step.sql(tx)
            else:
                tx.execute(step.sql)
        except Exception as exc:
            raise errors.MigrationError(
                f"{where}: migration {step.version} ({step.name}) failed: {exc}"
            ) from exc
        tx.execute(record_sql, (step.version, step.name))
        applied.append(step.version)
    return applied


__all__ = [
    "Applier",
    "Engine",
    "Item",
    "Migration",
    "Tx",
    "apply_steps",
    "check_not_newer",
    "ordered_migrations",
]
