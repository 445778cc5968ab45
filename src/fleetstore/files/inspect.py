"""Read-only inspection of any SQLite file, for ``fleetstore doctor``: its header, its WAL
and shared-memory index, a read-only connection for pragmas and queries, and which
processes have it open or locked right now (``/proc``).  Knows nothing of sessions.

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
import functools
import os
import re
import struct
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from fleetstore import errors
from fleetstore.engine import cipher
from fleetstore.engine.proclocks import _command, parse_proc_locks, process_state

Row = tuple[Any, ...]

# Lock bytes of the unix VFS (os_unix.c, wal.c).  Main file: PENDING, RESERVED, then
# the SHARED range.  -shm file: WALINDEX_LOCK_OFFSET = 120 = WAL_WRITE_LOCK, then
# WAL_CKPT_LOCK, WAL_RECOVER_LOCK, WAL_READ_LOCK(i) = 123 + i for i in 0..4, and the
# "DMS" byte 128 that every connection using the -shm holds shared while open.
PENDING_BYTE = 0x40000000
RESERVED_BYTE = PENDING_BYTE + 1
SHARED_FIRST = PENDING_BYTE + 2
SHARED_LAST = SHARED_FIRST + 509
WAL_WRITE_LOCK = 120
WAL_CKPT_LOCK = 121
WAL_RECOVER_LOCK = 122
WAL_READ_LOCK_0 = 123
WAL_NREADER = 5
SHM_DMS_LOCK = 128
_READMARK_NOT_USED = 0xFFFFFFFF
# Versions with the WAL-reset corruption bug: 3.7.0 through 3.51.2, fixed in 3.51.3,
# with backports in 3.44.6 and 3.50.7 (https://sqlite.org/wal.html#the_wal_reset_bug).
_WAL_RESET_FIXED = (3, 51, 3)
_WAL_RESET_BACKPORTS = ((3, 44, 6), (3, 50, 7))
# A library file larger than this is not scanned for its SQLite version.
_MAX_LIBRARY_SCAN = 64 * 1024 * 1024
_SOURCE_ID = re.compile(rb"20\d\d-\d\d-\d\d \d\d:\d\d:\d\d [0-9a-f]{64}")
_VERSION_STRING = re.compile(rb"(?<![0-9.])3\.(\d{1,2})\.(\d{1,2})\x00")


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


# -- processes and locks (/proc) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lock:
    """One lock line of ``/proc/locks`` on a watched file, and what SQLite means by it."""

    pid: int
    file: str  # the role given to locks_on: database, shm, gate, ...
    kind: str  # POSIX, FLOCK, OFDLCK
    mode: str  # READ (shared) or WRITE (exclusive)
    start: int
    end: int | None  # None: to the end of the file
    #: What the bytes mean: wal-write, checkpoint, recover, wal-read-0..4, shm-open,
    #: pending, reserved, shared, exclusive, flock (or "bytes N-M" if none).
    names: tuple[str, ...]

    @property
    def key(self) -> tuple[int, str, str, str, int, int | None]:
        return (self.pid, self.file, self.kind, self.mode, self.start, self.end)


def _lock_names(role: str, kind: str, mode: str, start: int, end: int | None) -> tuple[str, ...]:
    # A role may be qualified ("shard:KEY:shm"): the file's kind is its last part.
    role = role.rsplit(":", 1)[-1]
    hi = end if end is not None else 2**63

    def covers(lo_b: int, hi_b: int) -> bool:
        return start <= hi_b and lo_b <= hi

    names: list[str] = []
    if kind == "FLOCK":
        return ("flock",)
    if role == "shm":
        if covers(WAL_WRITE_LOCK, WAL_WRITE_LOCK):
            names.append("wal-write")
        if covers(WAL_CKPT_LOCK, WAL_CKPT_LOCK):
            names.append("checkpoint")
        if covers(WAL_RECOVER_LOCK, WAL_RECOVER_LOCK):
            names.append("recover")
        names += [
            f"wal-read-{i}"
            for i in range(WAL_NREADER)
            if covers(WAL_READ_LOCK_0 + i, WAL_READ_LOCK_0 + i)
        ]
        if covers(SHM_DMS_LOCK, SHM_DMS_LOCK):
            names.append("shm-open")
    elif role == "database":
        if covers(PENDING_BYTE, PENDING_BYTE):
            names.append("pending")
        if covers(RESERVED_BYTE, RESERVED_BYTE):
            names.append("reserved")
        if covers(SHARED_FIRST, SHARED_LAST):
            names.append("exclusive" if mode == "WRITE" else "shared")
    if not names:
        names.append(f"bytes {start}-{'EOF' if end is None else end}")
    return tuple(names)


def locks_on(files: dict[str, tuple[int, int, int] | None]) -> list[Lock]:
    """The locks ``/proc/locks`` shows now on *files* (role -> identity); waiters
    queued behind a lock are left out.  Empty where /proc is not readable."""
    by_ident = {ident: role for role, ident in files.items() if ident is not None}
    try:
        with open("/proc/locks") as f:
            text = f.read()
    except OSError:
        return []
    found: list[Lock] = []
    for kind, mode, pid, ident, start_s, end_s in parse_proc_locks(text):
        role = by_ident.get(ident)
        if role is None:
            continue
        try:
            start = int(start_s)
            end = None if end_s == "EOF" else int(end_s)
        except ValueError:
            continue
        found.append(
            Lock(pid, role, kind, mode, start, end, _lock_names(role, kind, mode, start, end))
        )
    return found


def wal_readers(locks: Iterable[Lock]) -> dict[int, int]:
    """The processes in a read transaction on a WAL database, from one look at its
    locks (``locks_on``, roles ``shm`` or ``*:shm``, and ``database``): pid -> the
    lowest WAL read mark it holds (0: it reads the database file alone, so no
    checkpoint copies anything back while it lasts; any: the WAL cannot be reset, and
    grows).  A process holding SQLite's write lock is left out: a write transaction
    reads too.  Doctor (seen in both looks) and top (seen frame after frame) judge
    long readers from this one reading of the locks."""
    reading: dict[int, int] = {}
    writing: set[int] = set()
    for lk in locks:
        if lk.mode == "WRITE" and {"wal-write", "reserved", "pending", "exclusive"} & set(lk.names):
            writing.add(lk.pid)
        if lk.mode != "READ":
            continue
        for name in lk.names:
            if name.startswith("wal-read-"):
                slot = int(name.rsplit("-", 1)[1])
                reading[lk.pid] = min(slot, reading.get(lk.pid, slot))
    return {pid: slot for pid, slot in reading.items() if pid not in writing and pid > 0}


@dataclass(frozen=True, slots=True)
class OpenFile:
    """A file descriptor of another process on one of the watched files."""

    role: str
    fd: int
    deleted: bool  # the name now points to another file, or to none


def open_by_processes(paths: dict[str, str]) -> dict[int, list[OpenFile]]:
    """The processes (other than this one) with one of *paths* (role -> absolute path)
    open now, read from ``/proc/*/fd``; a path ending in "/" matches everything under
    it.  Processes of other users are seen only by root."""
    exact = {p: role for role, p in paths.items() if not p.endswith("/")}
    prefixes = [(p, role) for role, p in paths.items() if p.endswith("/")]
    me = os.getpid()
    found: dict[int, list[OpenFile]] = {}
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return found
    for pid in pids:
        if pid == me:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            deleted = target.endswith(" (deleted)")
            name = target[: -len(" (deleted)")] if deleted else target
            role = exact.get(name)
            if role is None:
                role = next((r for p, r in prefixes if name.startswith(p)), None)
            if role is None:
                continue
            if not deleted:
                # The path may have been replaced by another file since (mv over it).
                try:
                    held, now = os.stat(f"/proc/{pid}/fd/{fd}"), os.stat(name)
                    deleted = (held.st_dev, held.st_ino) != (now.st_dev, now.st_ino)
                except OSError:
                    deleted = True
            found.setdefault(pid, []).append(OpenFile(role, int(fd), deleted))
    return found


def users_of(paths: Sequence[str]) -> dict[str, set[int]]:
    """Who uses each of *paths* now (those that exist): the processes, this one
    included, with it open (``/proc/*/fd``: this user's processes, every process as
    root) or holding a lock on it (``/proc/locks``: every process of every user; an
    open SQLite WAL connection always holds a lock on its ``-shm``, a fleetstore
    writer's gate a flock).  A lock whose owner the kernel does not name counts as
    pid -1.  Paths nobody uses are left out."""
    facts = {p: FileFacts.of(p) for p in paths}
    found: dict[str, set[int]] = {}
    roles = {p: f.ident for p, f in facts.items() if f.exists}
    for lk in locks_on(roles):
        found.setdefault(lk.file, set()).add(lk.pid if lk.pid > 0 else -1)
    wanted = {p: p for p in roles}
    for pid, files in open_by_processes(wanted).items():
        for f in files:
            found.setdefault(f.role, set()).add(pid)
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target in roles:
                found.setdefault(target, set()).add(os.getpid())
    return found


def _open_for_writing(pid: int, fd: int) -> bool:
    """Is descriptor *fd* of process *pid* open for writing (``/proc/PID/fdinfo``)?
    Unreadable: assumed so (the process is there, and may write)."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8) & os.O_ACCMODE != os.O_RDONLY
    except (OSError, ValueError, IndexError):
        pass
    return True


def writers_of(paths: dict[str, str]) -> dict[int, str]:
    """The processes other than this one that could write to *paths* (role -> absolute
    path; one ending in "/" stands for everything under it) now: those with one of them
    open for writing (a fleetstore store opens its database read-write, a read-only
    reader such as doctor does not), and those holding a lock that only a writer takes
    on one of them (another user's process, whose descriptors are not readable).  Each
    with its command line."""
    found: dict[int, str] = {}
    for pid, files in open_by_processes(paths).items():
        if any(_open_for_writing(pid, f.fd) for f in files):
            found[pid] = _command(pid)
    idents = {
        role: FileFacts.of(path).ident
        for role, path in paths.items()
        if not path.endswith("/") and role in ("database", "gate", "shm")
    }
    me = os.getpid()
    for lk in locks_on(idents):
        writing = lk.file == "gate" or {"wal-write", "reserved", "pending", "exclusive"} & set(
            lk.names
        )
        if writing and lk.pid > 0 and lk.pid != me:
            found.setdefault(lk.pid, _command(lk.pid))
    return found


def command_line(pid: int) -> str:
    return _command(pid)


@dataclass(frozen=True, slots=True)
class SqliteLibrary:
    """A SQLite library mapped into a process, and the version found in its file."""

    path: str
    version: str | None  # None: SQLite found but its version string was not


def sqlite_libraries(pid: int) -> list[SqliteLibrary]:
    """The SQLite libraries process *pid* has loaded (``/proc/PID/maps``): shared
    libraries named like SQLite or apsw, else its executable when SQLite is linked into
    it.  Best effort: the version is read from the library file."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
    except OSError:
        return []
    paths: list[str] = []
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5].removesuffix(" (deleted)")
        base = os.path.basename(path).lower()
        named = "sqlite" in base or "apsw" in base or "/apsw/" in path
        if ".so" in base and named and path not in paths:
            paths.append(path)
    if not paths:
        with contextlib.suppress(OSError):
            paths.append(os.readlink(f"/proc/{pid}/exe"))
    found: list[SqliteLibrary] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        has_sqlite, version = _library_version(path, st.st_ino, st.st_mtime_ns)
        if has_sqlite:
            found.append(SqliteLibrary(path, version))
    return found


@functools.lru_cache(maxsize=64)
def _library_version(path: str, _ino: int, _mtime_ns: int) -> tuple[bool, str | None]:
    """(SQLite is in the file, its version or None).  The version is a lone
    "3.x.y" string that SQLite's ``sqlite3_version[]`` leaves in the binary; where there
    is not exactly one candidate the answer is None rather than a guess."""
    try:
        if os.path.getsize(path) > _MAX_LIBRARY_SCAN:
            return False, None
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return False, None
    if not _SOURCE_ID.search(data):
        return False, None
    candidates = {
        f"3.{int(m[1])}.{int(m[2])}" for m in _VERSION_STRING.finditer(data) if int(m[1]) >= 7
    }
    return True, candidates.pop() if len(candidates) == 1 else None


__all__ = [
    "process_state",
    "FileFacts",
    "Header",
    "InspectFailed",
    "Lock",
    "OpenFile",
    "ReadOnlyDatabase",
    "ShmIndex",
    "SqliteLibrary",
    "WalHeader",
    "check_not_open_here",
    "choose_open_mode",
    "command_line",
    "library_version",
    "locks_on",
    "open_by_processes",
    "open_readonly",
    "parse_version",
    "read_header",
    "read_shm_index",
    "read_wal_header",
    "sqlite_libraries",
    "users_of",
    "wal_reset_bug",
    "wal_readers",
]
