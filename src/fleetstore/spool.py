"""The spool: a durable per-process journal of operations that could not be
written within the budget (DESIGN.md promise 1).

Each process appends to its own file ``<database>.spool/<pid>-<token>.jsonl``,
one operation per line (``<crc32> <json>``), fsynced before the call returns,
and holds an exclusive flock on it while alive.  A journal whose flock can be
taken therefore belongs to a process that died: ``fleetstore recover`` (and
every ``fleetstore.open``) replays such journals in order and deletes them.
Operations are idempotent, so replaying one that was already applied (a crash
between applying and forgetting it) changes nothing.

A torn last line (a crash during the append, i.e. before the call returned)
is ignored; any other damaged line stops the replay and keeps the file.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import os
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fleetstore import errors
from fleetstore.operations import Operation

_SUFFIX = ".jsonl"
MAX_LINE = 512 * 1024 * 1024


def encode_line(op: Operation) -> bytes:
    text = json.dumps(op.to_json(), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return b"%08x %s\n" % (zlib.crc32(text), text)


def decode_line(line: bytes) -> Operation:
    """One journal line → its operation (``InvalidInput`` if damaged)."""
    if len(line) < 10 or line[8:9] != b" " or not line.endswith(b"\n"):
        raise errors.InvalidInput("damaged journal line")
    body = line[9:-1]
    try:
        crc = int(line[:8], 16)
    except ValueError:
        raise errors.InvalidInput("damaged journal line (checksum)") from None
    if zlib.crc32(body) != crc:
        raise errors.InvalidInput("journal line does not match its checksum")
    try:
        data = json.loads(body)
    except ValueError:
        raise errors.InvalidInput("journal line is not JSON") from None
    return Operation.from_json(data)


@dataclass(frozen=True, slots=True)
class JournalRead:
    ops: list[Operation]
    #: Bytes after the last good line: 0, or a torn last append, or damage.
    trailing: int
    #: A bad line was followed by more lines: damage, not a torn append.
    damaged: bool


def read_journal(path: Path) -> JournalRead:
    ops: list[Operation] = []
    data = path.read_bytes()
    pos = 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        if end < 0:
            return JournalRead(ops, len(data) - pos, False)
        try:
            ops.append(decode_line(data[pos : end + 1]))
        except errors.InvalidInput:
            return JournalRead(ops, len(data) - pos, end + 1 < len(data))
        pos = end + 1
    return JournalRead(ops, 0, False)


_live: weakref.WeakSet[Spool] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for spool in list(_live):
        spool._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Spool:
    """This process's journal for one store, and the operations in it not yet applied."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._pending: collections.deque[Operation] = collections.deque()
        self._fd = -1
        self._path: Path | None = None
        self.spooled_total = 0
        self.replayed_total = 0
        _live.add(self)

    def __len__(self) -> int:
        return len(self._pending)

    def session_ids(self) -> set[str]:
        with self._lock:
            return {sid for op in self._pending if (sid := op.session_id) is not None}

    def append(self, op: Operation) -> None:
        """Write *op* to the journal, fsynced, and queue it for replay."""
        line = encode_line(op)
        with self._lock:
            if self._fd < 0:
                self._open_journal()
            os.write(self._fd, line)
            os.fsync(self._fd)
            self._pending.append(op)
            self.spooled_total += 1

    def _open_journal(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.directory / f"{os.getpid()}-{os.urandom(6).hex()}{_SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        _fsync_dir(self.directory)
        self._fd, self._path = fd, path

    def head(self) -> Operation | None:
        with self._lock:
            return self._pending[0] if self._pending else None

    def done(self, op: Operation) -> None:
        """*op* (the head) is applied; an emptied journal is deleted."""
        with self._lock:
            if self._pending and self._pending[0] is op:
                self._pending.popleft()
                self.replayed_total += 1
            if not self._pending and self._fd >= 0 and self._path is not None:
                # Unlink before close: no moment where another process could take
                # the flock of a journal whose operations are all applied and replay it.
                with contextlib.suppress(OSError):
                    self._path.unlink()
                os.close(self._fd)
                self._fd, self._path = -1, None

    def close(self) -> None:
        """Stop writing; a journal still holding operations stays for ``recover``."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        _live.discard(self)

    def _after_fork(self) -> None:
        # The child shares the parent's open file (and its flock): it must never
        # write to it, and must not keep it open, or a dead parent's journal
        # would look alive to `recover` for as long as the child runs.
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd, self._path = -1, None
        self._lock = threading.Lock()
        self._pending = collections.deque()


def journals(directory: str | os.PathLike[str]) -> Iterator[Path]:
    """The journal files in *directory*, oldest first."""
    folder = Path(directory)
    if not folder.is_dir():
        return iter(())
    files = [p for p in folder.iterdir() if p.name.endswith(_SUFFIX)]
    files.sort(key=lambda p: (p.stat().st_mtime_ns, p.name))
    return iter(files)


@dataclass(frozen=True, slots=True)
class Recovered:
    journal: str
    replayed: int
    #: "replayed" (and deleted), "busy" (its process is alive), "damaged" (kept),
    #: "unfinished" (the store stayed locked past the budget; kept, run again)
    status: str
    detail: str = ""
    rejected: int = 0


REJECTED = "rejected.jsonl"


def reject(directory: Path, op: Operation, exc: BaseException) -> None:
    """Keep an operation that can never apply (its session was deleted, a
    version moved on...) in ``rejected.jsonl`` with the reason: never dropped."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    record = {
        "at": time.time(),
        "pid": os.getpid(),
        "error": f"{type(exc).__name__}: {exc}",
        "record": op.to_json(),
    }
    line = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
    fd = os.open(directory / REJECTED, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def recover_journal(path: Path, apply: Callable[[Operation], object]) -> Recovered:
    """Replay the journal at *path* if its process is gone, then delete it.
    An operation that fails for good goes to ``rejected.jsonl``; a store still
    locked past the budget stops the replay and keeps the file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return Recovered(str(path), 0, "replayed", "already gone")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return Recovered(str(path), 0, "busy", "its process is alive and replays it itself")
        if not path.exists():  # replayed and deleted by someone else meanwhile
            return Recovered(str(path), 0, "replayed", "already gone")
        read = read_journal(path)
        done = rejected = 0
        for op in read.ops:
            try:
                apply(op)
            except errors.TransientError as exc:
                return Recovered(
                    str(path),
                    done,
                    "unfinished",
                    f"stopped at operation {done + 1}: {exc}",
                    rejected,
                )
            except errors.PermanentError as exc:
                reject(path.parent, op, exc)
                rejected += 1
            done += 1
        if read.damaged:
            return Recovered(
                str(path),
                done,
                "damaged",
                f"line {done + 1} is damaged and more lines follow; the file is kept",
                rejected,
            )
        path.unlink()
        _fsync_dir(path.parent)
        detail = f"ignored a torn last line of {read.trailing} bytes" if read.trailing else ""
        return Recovered(str(path), done, "replayed", detail, rejected)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = [
    "JournalRead",
    "Recovered",
    "Spool",
    "decode_line",
    "encode_line",
    "journals",
    "reject",
    "read_journal",
    "recover_journal",
]
