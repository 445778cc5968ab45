"""Which processes have a SQLite file open or locked right now, and what their locks
mean to SQLite, read from ``/proc`` (``locks``, ``PID/fd``, ``PID/fdinfo``,
``PID/maps``): for ``fleetstore doctor`` and ``top``, and for the commands that must
not rewrite a file another process uses (``maintain``, ``rekey``, ``reshard``).  Reads
only; knows nothing of sessions."""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fleetstore.engine.proclocks import _command, parse_proc_locks, process_state
from fleetstore.files.inspect import FileFacts

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
# A library file larger than this is not scanned for its SQLite version.
_MAX_LIBRARY_SCAN = 64 * 1024 * 1024
_SOURCE_ID = re.compile(rb"20\d\d-\d\d-\d\d \d\d:\d\d:\d\d [0-9a-f]{64}")
_VERSION_STRING = re.compile(rb"(?<![0-9.])3\.(\d{1,2})\.(\d{1,2})\x00")


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
    "Lock",
    "OpenFile",
    "SqliteLibrary",
    "command_line",
    "locks_on",
    "open_by_processes",
    "process_state",
    "sqlite_libraries",
    "users_of",
    "wal_readers",
    "writers_of",
]
