"""Plain SQLite connections, as programs that do not use fleetstore open them: for
``fleetstore stress --compare``, which replays the write patterns other agent tools
ship (a busy timeout and nothing else between them and ``SQLITE_BUSY``).

apsw, like fleetstore's engine: never the stdlib ``sqlite3`` module in a process
that may hold fleetstore's connections (DESIGN.md, "Two SQLite libraries in one
process").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import apsw

from fleetstore import errors
from fleetstore.engine.translate import translate


class PlainConnection:
    """One connection with ``busy_timeout`` *busy_ms*, WAL and *synchronous*; no
    writer gate, no retries: a busy error reaches the caller as ``StoreBusy``."""

    def __init__(
        self,
        path: str,
        *,
        busy_ms: int,
        synchronous: str = "NORMAL",
        schema: str | None = None,
        readonly: bool = False,
    ) -> None:
        self.path = path
        flags = (
            apsw.SQLITE_OPEN_READONLY
            if readonly
            else (apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE)
        )
        try:
            self._conn = apsw.Connection(path, flags=flags)
            self._conn.set_busy_timeout(busy_ms)
            if not readonly:
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute(f"PRAGMA synchronous={synchronous}")
                if schema:
                    with self.transaction("IMMEDIATE") as tx:
                        if not tx.execute("SELECT 1 FROM sqlite_master WHERE type='table'"):
                            tx.execute(schema)
        except apsw.Error as exc:
            raise translate(exc, path) from exc

    @contextlib.contextmanager
    def transaction(self, mode: str = "DEFERRED") -> Iterator[PlainConnection]:
        """``BEGIN mode`` ... ``COMMIT``; rolls back if the body raises.  Driver errors
        become fleetstore errors (``StoreBusy`` for SQLITE_BUSY, whatever the stage)."""
        if mode not in ("DEFERRED", "IMMEDIATE", "EXCLUSIVE"):
            raise errors.InvalidInput(f"transaction mode {mode!r}")
        try:
            self._conn.execute(f"BEGIN {mode}")
        except apsw.Error as exc:
            raise translate(exc, self.path) from exc
        try:
            yield self
            self._conn.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(apsw.Error):
                if not self._conn.get_autocommit():
                    self._conn.execute("ROLLBACK")
            if isinstance(exc, apsw.Error):
                raise translate(exc, self.path) from exc
            raise

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one or more statements; every row as a tuple (read whole)."""
        try:
            return [tuple(r) for r in self._conn.execute(sql, params)]
        except apsw.Error as exc:
            raise translate(exc, self.path) from exc

    def integrity(self) -> list[str]:
        return [str(r[0]) for r in self.execute("PRAGMA integrity_check")]

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> PlainConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["PlainConnection"]
