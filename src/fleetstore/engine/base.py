"""The engine interface every backend implements (SQLite now; PostgreSQL later).

Atomicity: everything done through one ``write()`` transaction commits or
rolls back as a whole; ``read(fn)`` sees one consistent snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Tx(Protocol):
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


class Engine(Protocol):
    def write(self) -> AbstractContextManager[Any]:
        """A write transaction taken within the write budget; its body runs once."""
        ...

    def read(self, fn: Callable[[Any], T]) -> T:
        """``fn(tx)`` in a read transaction; never waits on writers."""
        ...

    def metrics(self) -> dict[str, Any]:
        """This process's figures (JSON-serialisable)."""
        ...

    def close(self) -> None:
        """Release every connection.  Idempotent."""
        ...


__all__ = ["Engine", "Tx"]
