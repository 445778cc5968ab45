"""A consistent copy of a live SQLite file, and the checks of a copy (``fleetstore
backup`` and ``restore``).

``copy_database`` uses SQLite's online backup API (``sqlite3_backup``, apsw's
``Connection.backup``) in one step: every page is read inside one read transaction
of the source, so the copy is the database as of one commit, while writers go on
(in WAL mode a reader blocks no writer; the WAL cannot be reset meanwhile, so it
grows for as long as the copy takes).  Done in several steps, a copy is started over
whenever another process writes between two of them, which a busy fleet always does.
``VACUUM INTO`` reads in one transaction too, but rebuilds every table and index: on
a 166 MB store it took 0.61 s against 0.38 s, for a file 1 % smaller, left in rollback
journal mode; the page copy keeps the file as it was (page size, auto-vacuum, WAL).
"""

from __future__ import annotations

import os

import apsw

from fleetstore import errors
from fleetstore.engine import cipher
from fleetstore.engine.translate import translate


def copy_database(
    source: str, dest: str, *, busy_ms: int = 60_000, key: bytes | None = None
) -> int:
    """Copy the SQLite database *source* (a live store: its -wal and -shm are read as
    any reader reads them) to the new file *dest* (created 0600; ``FileExistsError``
    if it exists), as of one commit.  Returns the pages copied.  Nothing is written
    to *source*: the connection is ``query_only``.  *key*: the source is encrypted
    with it, and so is the copy (page by page, under the same key)."""
    src = _connect(source, apsw.SQLITE_OPEN_READWRITE, busy_ms, key)
    try:
        src.execute("PRAGMA query_only=ON")
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.close(fd)
        dst = _connect(dest, apsw.SQLITE_OPEN_READWRITE, busy_ms, key)
        try:
            with dst.backup("main", src, "main") as copy:
                while not copy.done:
                    copy.step(-1)  # every page in one step: one snapshot
                pages = int(copy.pagecount)
        except apsw.Error as exc:
            raise translate(exc, source, outcome="no copy was made") from exc
        finally:
            dst.close()
    finally:
        src.close()
    _fsync(dest)
    return pages


def check_database(path: str, key: bytes | None = None) -> list[str]:
    """``PRAGMA integrity_check`` and ``PRAGMA foreign_key_check`` of the file *path*
    (a copy of ours: opened read-write, so that SQLite removes the -wal and -shm it
    makes once the connection closes): the problems found, ``[]`` if none."""
    conn = _connect(path, apsw.SQLITE_OPEN_READWRITE, 0, key)
    try:
        conn.execute("PRAGMA query_only=ON")
        found = [str(r[0]) for r in conn.execute("PRAGMA integrity_check")]
        problems = [] if found == ["ok"] else found
        for table, rowid, parent, _fk in conn.execute("PRAGMA foreign_key_check"):
            problems.append(f"row {rowid} of {table} refers to a missing row of {parent}")
        return problems
    except apsw.Error as exc:
        return [f"SQLite cannot read it: {exc}"]
    finally:
        conn.close()


def query(path: str, sql: str, key: bytes | None = None) -> list[tuple[object, ...]]:
    """The rows of *sql* read from the file *path* (a copy of ours, as above)."""
    conn = _connect(path, apsw.SQLITE_OPEN_READWRITE, 0, key)
    try:
        conn.execute("PRAGMA query_only=ON")
        return [tuple(r) for r in conn.execute(sql)]
    except apsw.Error as exc:
        raise translate(exc, path) from exc
    finally:
        conn.close()


def _connect(path: str, flags: int, busy_ms: int, key: bytes | None) -> apsw.Connection:
    try:
        conn = cipher.connect(path, flags | apsw.SQLITE_OPEN_NOFOLLOW, key)
    except apsw.CantOpenError as exc:
        raise errors.NotFound(f"{path}: cannot open: {exc}") from exc
    except apsw.Error as exc:
        raise translate(exc, path) from exc
    conn.setbusytimeout(busy_ms)
    return conn


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["check_database", "copy_database", "query"]
