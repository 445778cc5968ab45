"""Read-only inspection of any SQLite file, for ``fleetstore doctor``: its header, its WAL
and shared-memory index, and a read-only connection for pragmas and queries (which
processes have it open or locked: ``fleetstore.files.processes``).  Knows nothing of
sessions.

Strictly read-only, measured with SQLite 3.54.1 (tests/admin/test_doctor.py hashes the files):

* a WAL database with both ``-wal`` and ``-shm`` is opened ``mode=ro&readonly_shm=1``.  A
  plain ``mode=ro`` reader maps the ``-shm`` writable and, after a crash, rewrites it
  (recovery); with ``readonly_shm`` SQLite reads the index, or rebuilds it in private
  memory, and never writes it.  The database is opened O_RDONLY, so closing cannot
  checkpoint or delete the WAL;
* a read-only open of a WAL database *creates* a missing ``-wal`` and ``-shm`` and leaves
  them behind.  When one is missing and the ``-wal`` holds nothing, there is nothing in
  it to read: the file is opened ``immutable=1`` (no locks, no side files), and the
  file is compared before and after (``fleetstore.files.foreign``, which every reader
  of a foreign file goes through): an immutable read is wrong if a checkpoint writes
  the file meanwhile;
* a ``-wal`` with frames but no ``-shm`` cannot be read without creating the ``-shm``:
  its contents are not opened at all (``choose_open_mode``);
* a rollback-journal database is opened ``mode=ro``: a SHARED lock while reading, nothing
  created; a hot journal (a writer died mid-transaction) makes SQLite refuse the read.

Two SQLite libraries in one process, or any plain ``open()``/``close()`` of a database
file, silently drop the POSIX locks that process holds on it (DESIGN.md).  This module
reads headers with plain file reads only while no connection of its own is open, and
``check_not_open_here`` refuses to inspect a file the calling process already has open.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from fleetstore import errors
from fleetstore.engine import cipher

Row = tuple[Any, ...]

_READMARK_NOT_USED = 0xFFFFFFFF
# Versions with the WAL-reset corruption bug: 3.7.0 through 3.51.2, fixed in 3.51.3,
# with backports in 3.44.6 and 3.50.7 (https://sqlite.org/wal.html#the_wal_reset_bug).
_WAL_RESET_FIXED = (3, 51, 3)
_WAL_RESET_BACKPORTS = ((3, 44, 6), (3, 50, 7))


class InspectFailed(errors.DatabaseError):
    """SQLite could not read the file read-only; ``reason`` says why in one word:
    busy, hot-journal, not-a-database, corrupt, cannot-open or error."""

    def __init__(self, message: str, reason: str) -> None:
        self.reason = reason
        super().__init__(message)


# -- files -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileFacts:
    """``stat`` of one file, and its identity as ``/proc/locks`` names it."""

    path: str
    exists: bool
    size: int = 0
    mode: int = 0  # permission bits
    uid: int = -1
    mtime_ns: int = 0
    ident: tuple[int, int, int] | None = None  # (major, minor, inode)
    is_file: bool = False

    @classmethod
    def of(cls, path: str) -> FileFacts:
        try:
            st = os.stat(path)
        except OSError:
            return cls(path, False)
        return cls(
            path,
            True,
            st.st_size,
            st.st_mode & 0o7777,
            st.st_uid,
            st.st_mtime_ns,
            (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino),
            os.path.isfile(path),
        )

    def same_content_as(self, other: FileFacts) -> bool:
        """Same file, size and modification time (a cheap test for "changed meanwhile")."""
        return (self.exists, self.ident, self.size, self.mtime_ns) == (
            other.exists,
            other.ident,
            other.size,
            other.mtime_ns,
        )


@dataclass(frozen=True, slots=True)
class Header:
    """The 100-byte database header (sqlite.org/fileformat.html, 1.3).  Read from the
    main file only: in WAL mode a newer page 1 may still sit in the WAL, so the
    counts here are a fallback for the pragmas, not a replacement."""

    page_size: int
    wal: bool  # file format versions 2/2: the database is in WAL mode
    change_counter: int
    page_count: int
    freelist_pages: int
    auto_vacuum: str  # none, full or incremental
    text_encoding: str
    user_version: int
    application_id: int
    #: The SQLite library that last wrote this header, e.g. "3.40.1" (None if not known).
    writer_version: str | None
    #: Encrypted (SQLite3 Multiple Ciphers): only the page size and the journal mode
    #: are plain; every other field here is 0 or unknown.
    encrypted: bool = False


def read_header(path: str) -> Header | None:
    """The header of *path*; None for an empty (0-byte) file, which SQLite treats as a
    new empty database.  ``InspectFailed`` (not-a-database) if it is not SQLite."""
    with open(path, "rb") as f:
        data = f.read(cipher.HEADER_BYTES)
    if not data:
        return None
    if len(data) >= cipher.HEADER_BYTES and cipher.looks_encrypted(data):
        return Header(
            page_size=cipher.page_size(data),
            wal=data[18] == 2 and data[19] == 2,
            change_counter=0,
            page_count=0,
            freelist_pages=0,
            auto_vacuum="unknown",
            text_encoding="unknown",
            user_version=0,
            application_id=0,
            writer_version=None,
            encrypted=True,
        )
    if len(data) < cipher.HEADER_BYTES or not data.startswith(cipher.SQLITE_MAGIC):
        raise InspectFailed(f"{path}: not a SQLite database (no SQLite header)", "not-a-database")
    (raw_page,) = struct.unpack_from(">H", data, 16)
    page_size = 65536 if raw_page == 1 else raw_page
    write_v, read_v = data[18], data[19]
    change, pages, _trunk, free = struct.unpack_from(">IIII", data, 24)
    largest_root, encoding, user_version, incremental, app_id = struct.unpack_from(
        ">IIIII", data, 52
    )
    valid_for, version_number = struct.unpack_from(">II", data, 92)
    writer = None
    if version_number >= 3_000_000:
        writer = (
            f"{version_number // 1_000_000}.{version_number // 1000 % 1000}.{version_number % 1000}"
        )
    return Header(
        page_size=page_size,
        wal=write_v == 2 and read_v == 2,
        change_counter=change,
        page_count=pages if valid_for == change and pages else 0,
        freelist_pages=free,
        auto_vacuum="none" if not largest_root else ("incremental" if incremental else "full"),
        text_encoding={1: "UTF-8", 2: "UTF-16le", 3: "UTF-16be"}.get(encoding, "unknown"),
        user_version=user_version,
        application_id=app_id,
        writer_version=writer,
    )


@dataclass(frozen=True, slots=True)
class WalHeader:
    """The 32-byte WAL file header."""

    valid: bool  # the magic number is right
    page_size: int
    checkpoint_seq: int
    #: Frames the file has room for (frames of earlier cycles included: a WAL that was
    #: reset is rewritten from the start but not truncated).
    file_frames: int


def read_wal_header(path: str) -> WalHeader | None:
    try:
        with open(path, "rb") as f:
            data = f.read(32)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return None
    if len(data) < 32:
        return WalHeader(False, 0, 0, 0)
    magic, _version, page_size, seq = struct.unpack_from(">IIII", data, 0)
    valid = magic in (0x377F0682, 0x377F0683) and page_size >= 512
    frames = (size - 32) // (page_size + 24) if valid else 0
    return WalHeader(valid, page_size if valid else 0, seq, frames)


@dataclass(frozen=True, slots=True)
class ShmIndex:
    """The head of the WAL index (the ``-shm`` file; sqlite.org/walformat.html), in the
    machine's byte order.  A copy read without locks: a diagnosis, not a snapshot."""

    valid: bool  # initialised, and its two header copies agree
    max_frame: int  # mxFrame: frames of the WAL that hold committed data now
    db_pages: int
    backfilled: int  # nBackfill: frames already copied back into the database
    #: aReadMark[0..4]; None where the slot is unused.  A reader holding read lock i
    #: sees the WAL up to read_marks[i]; slot 0 readers ignore the WAL.
    read_marks: tuple[int | None, ...]


def read_shm_index(path: str) -> ShmIndex | None:
    try:
        with open(path, "rb") as f:
            data = f.read(136)
    except OSError:
        return None
    if len(data) < 136:
        return ShmIndex(False, 0, 0, 0, ())
    first, second = data[:48], data[48:96]
    is_init = data[12]
    max_frame, db_pages = struct.unpack_from("=II", data, 16)
    backfilled, *marks = struct.unpack_from("=IIIIII", data, 96)
    return ShmIndex(
        valid=bool(is_init) and first == second,
        max_frame=max_frame,
        db_pages=db_pages,
        backfilled=backfilled,
        read_marks=tuple(None if m == _READMARK_NOT_USED else m for m in marks),
    )


def check_not_open_here(paths: Sequence[str]) -> None:
    """Refuse (``PermanentError``) if this process has any of *paths* open: reading a
    header would mean opening and closing a second descriptor, which drops every POSIX
    lock this process's SQLite connections hold on that file."""
    wanted = set(paths)
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target in wanted:
                raise errors.PermanentError(
                    f"{target}: this process has the file open; inspect it from another "
                    "process (`fleetstore doctor`): a second descriptor's close would drop "
                    "this process's SQLite locks on it"
                )


# -- the read-only connection ----------------------------------------------------------------


def choose_open_mode(wal_mode: bool, wal: FileFacts, shm: FileFacts) -> tuple[str | None, str]:
    """How to open the database without writing or creating anything: ``"ro"``
    (locks, reads the WAL through its index), ``"immutable"`` (no locks, main file only)
    or None (it cannot be read without side effects); and why, in words."""
    if not wal_mode:
        return "ro", "rollback journal: read-only, SHARED lock while reading"
    if wal.exists and shm.exists:
        return "ro", "WAL mode: read-only, through the existing -shm, which is never written"
    if not wal.exists or wal.size == 0:
        return "immutable", (
            "WAL mode, no -wal content and no -wal or -shm to read through: the main file "
            "alone, without locks (a read-only open would create them)"
        )
    return None, (
        "the -wal holds data but there is no -shm: reading it would create the -shm "
        "(the next read-write open rebuilds it)"
    )


class ReadOnlyDatabase:
    """One read-only connection; ``query`` returns every row, read whole."""

    def __init__(self, conn: apsw.Connection, path: str, mode: str) -> None:
        self._conn = conn
        self.path = path
        self.mode = mode

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        try:
            return list(self._conn.execute(sql, params))
        except apsw.Error as exc:
            raise _failed(exc, self.path) from exc

    def pragma(self, name: str) -> Any:
        rows = self.query(f"PRAGMA {name}")
        return rows[0][0] if rows else None


def _failed(exc: apsw.Error, path: str) -> InspectFailed:
    code = getattr(exc, "extendedresult", 0) or 0
    if isinstance(exc, apsw.BusyError | apsw.LockedError):
        reason = "busy"
    elif code == apsw.SQLITE_READONLY_ROLLBACK:
        reason = "hot-journal"
    elif isinstance(exc, apsw.NotADBError):
        reason = "not-a-database"
    elif isinstance(exc, apsw.CorruptError):
        reason = "corrupt"
    elif isinstance(exc, apsw.CantOpenError):
        reason = "cannot-open"
    else:
        reason = "error"
    return InspectFailed(f"{path}: {exc}", reason)


@contextlib.contextmanager
def open_readonly(
    path: str, mode: str, *, busy_ms: int = 2000, key: bytes | None = None
) -> Iterator[ReadOnlyDatabase]:
    """A read-only connection to *path* (``mode`` from ``choose_open_mode``) inside one
    read transaction, closed on leaving, given *key* first (an encrypted store).
    ``InspectFailed`` if SQLite refuses."""
    query = "immutable=1" if mode == "immutable" else "mode=ro&readonly_shm=1"
    uri = f"file:{urllib.parse.quote(path, safe='/')}?{query}"
    try:
        conn = cipher.connect(uri, apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI, key)
    except apsw.Error as exc:
        raise _failed(exc, path) from exc
    try:
        conn.setbusytimeout(busy_ms)
        # query_only as well: no statement of ours can write, whatever the open mode.
        conn.execute("PRAGMA query_only=ON")
        try:
            conn.execute("BEGIN")
            # The read transaction (and its locks) starts with the first read.
            conn.execute("SELECT count(*) FROM sqlite_schema").fetchall()
        except apsw.Error as exc:
            raise _failed(exc, path) from exc
        try:
            yield ReadOnlyDatabase(conn, path, mode)
        finally:
            with contextlib.suppress(apsw.Error):
                conn.execute("ROLLBACK")
    finally:
        conn.close(True)


def library_version() -> str:
    """The version of the SQLite library fleetstore runs (bundled with apsw)."""
    return str(apsw.sqlite_lib_version())


def parse_version(text: str) -> tuple[int, int, int] | None:
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:\.\d+)?", text.strip())
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def wal_reset_bug(version: str) -> bool:
    """Does SQLite *version* have the WAL-reset corruption bug (3.7.0 to 3.51.2, bar the
    3.44.6 and 3.50.7 backports)?  False for a version that cannot be parsed."""
    v = parse_version(version)
    if v is None or v < (3, 7, 0) or v >= _WAL_RESET_FIXED:
        return False
    return not any(v[:2] == fix[:2] and v >= fix for fix in _WAL_RESET_BACKPORTS)


__all__ = [
    "FileFacts",
    "Header",
    "InspectFailed",
    "ReadOnlyDatabase",
    "ShmIndex",
    "WalHeader",
    "check_not_open_here",
    "choose_open_mode",
    "library_version",
    "open_readonly",
    "parse_version",
    "read_header",
    "read_shm_index",
    "read_wal_header",
    "wal_reset_bug",
]
