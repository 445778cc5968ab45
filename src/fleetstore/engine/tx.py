"""The transactions of the SQLite engine (engine/sqlite.py): every statement's rows
read whole, a cursor per transaction, driver errors translated."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import apsw

from fleetstore import errors
from fleetstore.engine.notify import check_channel
from fleetstore.engine.translate import bad_params, translate

Row = tuple[Any, ...]
Params = Sequence[Any] | dict[str, Any]


class _Tx:
    __slots__ = ("_conn", "_cursor_", "_notes", "_open", "_path", "now", "uncertain")

    def __init__(self, conn: apsw.Connection, path: str, now: float) -> None:
        self._conn = conn
        self._path = path
        self._open = True
        #: One cursor for the transaction's statements (a cursor per statement cost
        #: about a tenth of a lone agent's turn); replaced after any error.
        self._cursor_: apsw.Cursor | None = None
        #: This host's clock when the transaction began (the engines agree on the name;
        #: PostgreSQL gives the database's clock).
        self.now = now
        #: Never set here: a SQLite COMMIT whose outcome is unknown (its WAL sync
        #: failed) raises CommitUncertain instead (see Database.submit).
        self.uncertain = False
        #: The channels this transaction rings once it has committed (engine/notify.py).
        self._notes: set[str] | None = None

    def notify(self, channel: str) -> None:
        """Ring *channel* once this transaction has committed (never if it does not):
        whoever waits on it, in any process, wakes (engine/notify.py)."""
        if not self._open:
            raise errors.StoreClosed(
                "this transaction has ended; use a new db.write() or db.read()"
            )
        notes = self._notes
        if notes is None:
            self._notes = {check_channel(channel)}
        elif channel not in notes:
            notes.add(check_channel(channel))

    def execute(self, sql: str, params: Params = ()) -> list[Row]:
        """Run *sql* and return every row it produces, read to the end.

        Reading whole is what keeps a write statement from staying active: an
        ``UPDATE … RETURNING`` read in part makes COMMIT fail with "SQL
        statements in progress" and leaves the lock held
        (tests/engine/test_engine.py::test_returning_read_in_part_wedges_raw_apsw_but_not_the_api).
        SQL that is not text, or holds a NUL, is refused by the driver (``InvalidInput``).
        """
        cursor = self._cursor_ or self._cursor()
        try:
            return cursor.execute(sql, params).fetchall()
        except apsw.Error as exc:
            self._drop_cursor()
            raise translate(exc, self._path, self._conn) from exc
        except (TypeError, ValueError, OverflowError) as exc:
            self._drop_cursor()
            raise bad_params(exc, self._path) from exc
        except BaseException:
            self._drop_cursor()
            raise

    def executemany(self, sql: str, seq_of_params: Iterable[Params]) -> None:
        """Run *sql* once per parameter set (rows produced are read and dropped)."""
        cursor = self._cursor_ or self._cursor()
        try:
            for _ in cursor.executemany(sql, seq_of_params):
                pass
        except apsw.Error as exc:
            self._drop_cursor()
            raise translate(exc, self._path, self._conn) from exc
        except (TypeError, ValueError, OverflowError) as exc:
            self._drop_cursor()
            raise bad_params(exc, self._path) from exc
        except BaseException:
            self._drop_cursor()
            raise

    def _cursor(self) -> apsw.Cursor:
        if not self._open:
            raise errors.StoreClosed(
                "this transaction has ended; use a new db.write() or db.read()"
            )
        cursor = self._cursor_ = self._conn.cursor()
        return cursor

    def _drop_cursor(self) -> None:
        """Close the cursor (resetting any statement it left active): after an error,
        and when the transaction ends."""
        cursor, self._cursor_ = self._cursor_, None
        if cursor is not None:
            try:
                cursor.close(True)
            except apsw.Error:
                pass


class WriteTx(_Tx):
    """The transaction of one ``with db.write() as tx:`` block."""

    __slots__ = ()


class ReadTx(_Tx):
    """A read transaction: one consistent snapshot; writes raise ``ReadOnlyError``."""

    __slots__ = ()

    def notify(self, channel: str) -> None:
        """A read commits nothing, so it rings nothing: ``ReadOnlyError``."""
        raise errors.ReadOnlyError(f"{self._path}: a read transaction cannot notify")


__all__ = ["Params", "ReadTx", "Row", "WriteTx"]
