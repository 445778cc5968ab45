"""Who holds a store's locks right now, read from ``/proc/locks``.

SQLite's WAL write lock is a POSIX lock on byte 120 of the ``-shm`` file
(WAL_WRITE_LOCK, the first of the shm lock bytes); in rollback-journal mode a
writer holds RESERVED, byte PENDING_BYTE+1 (0x40000001) of the database file.
The writer gate is a flock on ``<db>.gate``.  Linux only; elsewhere, or when
/proc is hidden, the answer is empty rather than wrong.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from fleetstore.errors import LockHolder

WAL_WRITE_LOCK_OFFSET = 120
RESERVED_BYTE = 0x40000000 + 1


def _file_id(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return os.major(st.st_dev), os.minor(st.st_dev), st.st_ino


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            parts = f.read().split(b"\0")
    except OSError:
        return ""
    return " ".join(p.decode(errors="replace") for p in parts if p)[:120]


def process_state(pid: int) -> str:
    """The state letter of process *pid* (``/proc/PID/stat`` field 3: R, S, D, T...);
    "" if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return ""
    # The command name (field 2) is in parentheses and may contain any character.
    rest = stat[stat.rfind(b")") + 2 :]
    return rest[:1].decode("ascii", "replace")


def parse_proc_locks(text: str) -> Iterable[tuple[str, str, int, tuple[int, int, int], str, str]]:
    """Yield (kind, mode, pid, (major, minor, inode), start, end) for each lock line."""
    for line in text.splitlines():
        fields = line.split()
        if "->" in fields:  # a waiter queued behind the lock on the line above
            continue
        if len(fields) < 8:
            continue
        kind, _advisory, mode, pid_s, dev, start, end = fields[1:8]
        try:
            major_s, minor_s, inode_s = dev.split(":")
            ident = (int(major_s, 16), int(minor_s, 16), int(inode_s))
            pid = int(pid_s)
        except ValueError:
            continue
        yield kind, mode, pid, ident, start, end


def lock_holders(db_path: str, gate_path: str | None = None) -> list[LockHolder]:
    """Processes holding the writer gate or SQLite's write lock on *db_path* now."""
    try:
        with open("/proc/locks") as f:
            text = f.read()
    except OSError:
        return []
    gate = _file_id(gate_path or db_path + ".gate")
    shm = _file_id(db_path + "-shm")
    db = _file_id(db_path)
    found: list[LockHolder] = []
    seen: set[tuple[int, str]] = set()
    for kind, mode, pid, ident, start, end in parse_proc_locks(text):
        if pid <= 0:
            continue
        lock = ""
        if ident == gate and kind == "FLOCK" and mode == "WRITE":
            lock = "gate"
        elif (
            ident == shm
            and kind == "POSIX"
            and mode == "WRITE"
            and _covers(start, end, WAL_WRITE_LOCK_OFFSET)
        ) or (ident == db and kind == "POSIX" and _covers(start, end, RESERVED_BYTE)):
            lock = "sqlite-write"
        if lock and (pid, lock) not in seen:
            seen.add((pid, lock))
            found.append(
                LockHolder(pid=pid, lock=lock, command=_command(pid), state=process_state(pid))
            )
    return found


def _covers(start: str, end: str, offset: int) -> bool:
    try:
        lo = int(start)
        hi = 2**63 if end == "EOF" else int(end)
    except ValueError:
        return False
    return lo <= offset <= hi


__all__ = ["lock_holders", "parse_proc_locks", "process_state"]
