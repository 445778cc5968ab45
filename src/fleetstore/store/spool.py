"""The spool: a durable per-process journal of operations that could not be
written within the budget (DESIGN.md promise 1).

Each process appends to its own file ``<database>.spool/<pid>-<token>.jsonl``,
one operation per line (``<crc32> <json>``), fsynced before the call returns,
and holds an exclusive flock on it while alive.  A journal whose flock can be
taken therefore belongs to a process that died (or a store that was closed
before its spool drained): ``fleetstore recover`` (and every
``fleetstore.open``) replays such journals in order and deletes them.
Operations are idempotent, so replaying one that was already applied (a crash
between applying and forgetting it) changes nothing.

A torn last line (no newline: a crash during the append, i.e. before the call
returned) is ignored; any line with its newline that fails its checksum or is
not an operation this version knows is damage: the replay stops there and keeps
the file.  So does an operation whose blob file is missing or damaged.  An
operation that can never apply goes, with the reason, to ``rejected.jsonl`` in
the same folder.

A store with a keyring writes each line's JSON sealed (``!`` and the base64 of a
``fleetstore.core.sealed`` file: AES-256-GCM under a key of its own, the key's id in
its header), checksummed as a plain line is; ``rejected.jsonl`` too.  Each line is a
sealed file of its own, so lines appended by many processes to one file never share a
nonce.  The spool is the slow path (past the write budget): sealing costs there only.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import fcntl
import json
import os
import re
import threading
import time
import weakref
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleetstore import errors
from fleetstore.core import sealed
from fleetstore.core.files import private_dirs
from fleetstore.core.keys import Keyring
from fleetstore.domain import registry
from fleetstore.domain.blobs import fsync_dir
from fleetstore.domain.operations import Operation

_SUFFIX = ".jsonl"
#: A journal's name; anything else in the folder (rejected.jsonl, a journal being
#: created) is never replayed nor deleted as a journal.
_JOURNAL_NAME = re.compile(r"(\d+)-[0-9a-f]{12}\.jsonl")
#: A journal is created under this suffix, locked, then renamed (see _open_journal).
_NEW_SUFFIX = ".jsonl.new"
REJECTED = "rejected.jsonl"


#: A sealed line's JSON begins with this (a plain line's with "{").
_SEALED = b"!"


def encode_line(op: Operation, keyring: Keyring | None = None) -> bytes:
    text = json.dumps(op.to_json(), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if keyring is not None:
        text = seal_text(text, keyring)
    return b"%08x %s\n" % (zlib.crc32(text), text)


def seal_text(text: bytes, keyring: Keyring) -> bytes:
    """A line's JSON sealed: ``!`` and the base64 of its sealed file."""
    return _SEALED + base64.b64encode(sealed.seal(text, keyring))


def unseal_text(text: bytes, keyring: Keyring | None, where: str) -> bytes:
    """A line's JSON, unsealed if it is sealed (``KeyMissing`` without the key)."""
    if not text.startswith(_SEALED):
        return text
    if keyring is None:
        raise errors.KeyMissing(
            f"{where}: the journal is encrypted and no key was given (encryption_key_file)"
        )
    try:
        data = base64.b64decode(text[1:], validate=True)
    except ValueError:
        raise errors.InvalidInput("damaged sealed journal line") from None
    return sealed.unseal(data, keyring, where)


def checked_body(line: bytes) -> bytes:
    """The JSON of a whole journal line whose checksum matches (``InvalidInput`` if not)."""
    if len(line) < 10 or line[8:9] != b" " or not line.endswith(b"\n"):
        raise errors.InvalidInput("damaged journal line")
    body = line[9:-1]
    try:
        crc = int(line[:8], 16)
    except ValueError:
        raise errors.InvalidInput("damaged journal line (checksum)") from None
    if zlib.crc32(body) != crc:
        raise errors.InvalidInput("journal line does not match its checksum")
    return body


def _operation(body: bytes, keyring: Keyring | None = None, where: str = "journal") -> Operation:
    try:
        body = unseal_text(body, keyring, where)
    except errors.SealedCorrupt as exc:
        raise errors.InvalidInput(str(exc)) from None
    try:
        data = json.loads(body)
    except ValueError:
        raise errors.InvalidInput("journal line is not JSON") from None
    return registry.envelope(data)


def decode_line(line: bytes, keyring: Keyring | None = None) -> Operation:
    """One journal line → its operation (``InvalidInput`` if damaged)."""
    return _operation(checked_body(line), keyring)


@dataclass(frozen=True, slots=True)
class JournalRead:
    ops: list[Operation]
    #: Bytes after the last good line: 0, or a torn last append, or damage.
    trailing: int
    #: The replay must stop at the first bad line: it ends with its newline (so it
    #: was written whole, and acknowledged) yet fails its checksum or is not an
    #: operation this version can apply.  Only a last line without its newline is
    #: a torn append, never acknowledged, and ignored.
    damaged: bool
    #: Why the first bad line is bad.
    reason: str = ""


def read_journal(path: Path, keyring: Keyring | None = None) -> JournalRead:
    """The operations of a journal.  A sealed line without its key raises
    ``KeyMissing`` (``WrongKey``): never read as damage, which would stop a replay
    for good."""
    ops: list[Operation] = []
    data = path.read_bytes()
    pos = 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        if end < 0:
            return JournalRead(ops, len(data) - pos, False, "torn last line")
        try:
            body = checked_body(data[pos : end + 1])
        except errors.InvalidInput as exc:
            # Its newline was written, so the whole append was, and it was fsynced
            # and acknowledged: damage, even as the last line, never a torn append.
            return JournalRead(ops, len(data) - pos, True, str(exc))
        try:
            ops.append(_operation(body, keyring, str(path)))
        except errors.InvalidInput as exc:
            # Written whole and acknowledged, so never dropped as a torn append.
            return JournalRead(ops, len(data) - pos, True, str(exc))
        pos = end + 1
    return JournalRead(ops, 0, False)


def journal_pid(path: Path) -> int | None:
    """The pid in a journal's name (the process that wrote it)."""
    match = _JOURNAL_NAME.fullmatch(path.name)
    return int(match[1]) if match else None


_live: weakref.WeakSet[Spool] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for spool in list(_live):
        spool._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Spool:
    """This process's journal for one store, and the operations in it not yet
    applied, oldest first.  Thread-safe; the store's background thread drains it
    (``head`` / ``done``) while other threads ``append``."""

    def __init__(self, directory: str | os.PathLike[str], keyring: Keyring | None = None) -> None:
        self.directory = Path(directory)
        #: Lines are sealed with its current key (None: plain).
        self.keyring = keyring
        _live.add(self)
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._pending: collections.deque[Operation] = collections.deque()
        self._sessions: collections.Counter[str] = collections.Counter()
        self._fd = -1
        self._path: Path | None = None
        self._size = 0
        self._broken: str | None = None
        self._closed = False
        self._pid = os.getpid()
        self.spooled_total = 0
        self.replayed_total = 0

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def path(self) -> Path | None:
        """The journal file now in use (None while nothing is spooled)."""
        return self._path

    def session_ids(self) -> set[str]:
        with self._lock:
            return set(self._sessions)

    def touches(self, session_id: str) -> bool:
        """Does an operation waiting here write to *session_id*?"""
        with self._lock:
            return self._sessions[session_id] > 0

    def append(self, op: Operation) -> None:
        """Write *op* to the journal, fsynced, and queue it for replay.  On an
        ``OSError`` (disk full...) nothing of *op* stays in the journal."""
        line = encode_line(op, self.keyring)
        if self._pid != os.getpid():  # forked without the at-fork hook running
            self._after_fork()
        with self._lock:
            if self._closed:
                raise errors.StoreClosed(f"{self.directory}: the spool was closed")
            if self._broken is not None:
                raise OSError(self._broken)
            if self._fd < 0:
                self._open_journal()
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(self._fd, view) :]
                os.fsync(self._fd)
            except OSError:
                # A partial line with appends after it would read as damage and stop
                # every later replay: cut it off (tests/store/test_spool.py::test_failed_append_*).
                try:
                    os.ftruncate(self._fd, self._size)
                    os.fsync(self._fd)
                except OSError as again:
                    self._broken = f"{self._path}: a failed append could not be undone: {again}"
                raise
            self._size += len(line)
            self._pending.append(op)
            if (sid := op.session_id) is not None:
                self._sessions[sid] += 1
            self.spooled_total += 1

    def _open_journal(self) -> None:
        private_dirs(self.directory)
        name = f"{os.getpid()}-{os.urandom(6).hex()}"
        new = self.directory / (name + _NEW_SUFFIX)
        path = self.directory / (name + _SUFFIX)
        fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            # Locked before it is given a journal's name: `recover` must never find a
            # live process's journal unlocked, or it would replay and delete it and
            # the appends that follow would go to a deleted file.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(new, path)
            fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            for made in (new, path):  # renamed or not: no empty journal left unlocked
                with contextlib.suppress(OSError):
                    made.unlink()
            raise
        self._fd, self._path, self._size = fd, path, 0

    def head(self) -> Operation | None:
        with self._lock:
            return self._pending[0] if self._pending else None

    def done(self, op: Operation) -> None:
        """*op* (the head) is applied or rejected; an emptied journal is deleted."""
        with self._lock:
            if self._pending and self._pending[0] is op:
                self._pending.popleft()
                if (sid := op.session_id) is not None:
                    self._sessions[sid] -= 1
                    if self._sessions[sid] <= 0:
                        del self._sessions[sid]
                self.replayed_total += 1
            if not self._pending and self._fd >= 0 and self._path is not None:
                # Unlink before close: no moment where another process could take
                # the flock of a journal whose operations are all applied and replay
                # it.  (Were the unlink lost in a crash, the replay changes nothing.)
                with contextlib.suppress(OSError):
                    self._path.unlink()
                os.close(self._fd)
                self._fd, self._path, self._size, self._broken = -1, None, 0, None

    def close(self) -> None:
        """Stop writing; a journal still holding operations stays for ``recover``
        (closing it releases its flock, so ``recover`` may take it at once)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            self._closed = True
        _live.discard(self)

    def _after_fork(self) -> None:
        # The child shares the parent's open file (and its flock): it must never
        # write to it, and must not keep it open, or a dead parent's journal would
        # look alive to `recover` for as long as the child runs.  The parent's
        # pending operations are the parent's to apply.  (No self._lock here: a
        # parent thread may have held it at fork time.)
        # tests/store/test_spool.py::test_forked_child_neither_writes_nor_keeps_the_parents_journal
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        closed = self._closed
        self._reset()
        self._closed = closed


def journals(directory: str | os.PathLike[str]) -> list[Path]:
    """The journal files in *directory*, oldest first."""
    folder = Path(directory)
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found: list[tuple[int, str, Path]] = []
    for name in names:
        if _JOURNAL_NAME.fullmatch(name):
            path = folder / name
            try:
                found.append((path.stat().st_mtime_ns, name, path))
            except FileNotFoundError:  # drained and deleted meanwhile
                continue
    return [path for _, _, path in sorted(found)]


def remove_stale_new_files(directory: str | os.PathLike[str], older_than: float = 60.0) -> None:
    """Delete journals left half-created (``.jsonl.new``, always empty) by a
    process killed between creating and naming one."""
    folder = Path(directory)
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for path in folder.iterdir():
            if not path.name.endswith(_NEW_SUFFIX):
                continue
            with contextlib.suppress(OSError):
                if time.time() - path.stat().st_mtime < older_than:
                    continue
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    path.unlink()
                finally:
                    os.close(fd)


@dataclass(frozen=True, slots=True)
class Rejection:
    """An operation that could not apply, kept in ``rejected.jsonl``."""

    op: str
    op_id: str
    session_id: str | None
    error: str

    def to_json(self) -> dict[str, object]:
        return {
            "op": self.op,
            "op_id": self.op_id,
            "session_id": self.session_id,
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class Recovered:
    journal: str
    replayed: int
    #: "replayed" (and deleted), "busy" (its process is alive), "damaged" (kept),
    #: "unfinished" (the store stayed locked past the budget, or failed; kept, run again)
    status: str
    detail: str = ""
    #: How many of the replayed operations were rejected (see ``rejections``).
    rejected: int = 0
    rejections: tuple[Rejection, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "journal": self.journal,
            "status": self.status,
            "replayed": self.replayed,
            "rejected": [r.to_json() for r in self.rejections],
            "detail": self.detail,
        }


def is_rejectable(exc: BaseException) -> bool:
    """Will *op* fail this way whenever it is applied?  Then it goes to
    ``rejected.jsonl``.  Transient failures (the lock) and failures of the store
    itself (closed, I/O error, a damaged file, disk full) are not the
    operation's fault: the operation stays in the journal for a later replay."""
    if isinstance(exc, errors.IntegrityError | errors.BlobCorrupt):
        return True
    if isinstance(exc, errors.FleetstoreError):
        return isinstance(
            exc,
            errors.InvalidInput
            | errors.NotFound
            | errors.AlreadyExists
            | errors.VersionConflict
            | errors.LeaseLost,
        )
    # Not a fleetstore error: a bug met by this operation's arguments, which
    # would meet it again on every replay and block the journal behind it.
    return isinstance(exc, Exception)


def reject(
    directory: Path,
    op: Operation,
    exc: BaseException,
    journal: str | None = None,
    keyring: Keyring | None = None,
) -> Rejection:
    """Keep an operation that can never apply (its session was deleted, a
    version moved on...) in ``rejected.jsonl`` with the reason: never dropped."""
    rejection = Rejection(op.name, op.op_id, op.session_id, f"{type(exc).__name__}: {exc}")
    private_dirs(directory)
    record = {
        "at": time.time(),
        "pid": os.getpid(),
        "journal": journal,
        "error": rejection.error,
        "record": op.to_json(),
    }
    text = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    line = (text if keyring is None else seal_text(text, keyring)) + b"\n"
    fd = os.open(directory / REJECTED, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    return rejection


def rejected_records(directory: str | os.PathLike[str]) -> int:
    """How many operations ``rejected.jsonl`` holds (0 if there is none)."""
    try:
        with open(Path(directory) / REJECTED, "rb") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


def recover_journal(
    path: Path,
    apply: Callable[[Operation], object],
    check: Callable[[Operation], None] | None = None,
    stop: Callable[[], bool] | None = None,
    keyring: Keyring | None = None,
) -> Recovered:
    """Replay the journal at *path* if its process is gone, then delete it.
    An operation that fails for good goes to ``rejected.jsonl``; a store still
    locked past the budget (or failing) stops the replay and keeps the file.
    *check* runs before each operation is applied: one it refuses with
    ``BlobCorrupt`` (a blob file it refers to is missing or damaged) stops the
    replay there, as damage, and keeps the file: applied, it would leave rows
    that no read or export gets past.  *stop* (the store is closing) is asked
    before each operation: once it says so, the replay stops there, "unfinished",
    and an operation that failed meanwhile is kept, never rejected (issue 23,
    cause 7: a close met mid-replay was written to rejected.jsonl as a bug)."""
    name = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return Recovered(name, 0, "replayed", "already replayed by another process")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = journal_pid(path)
            who = f"its process (pid {pid})" if pid is not None else "its process"
            return Recovered(name, 0, "busy", f"{who} is alive and replays it itself")
        # Our descriptor may be of a file its owner deleted (drained) just before
        # we took the lock: then there is nothing to do.
        if os.fstat(fd).st_nlink == 0 or not path.exists():
            return Recovered(name, 0, "replayed", "already replayed by another process")
        read = read_journal(path, keyring)
        done = 0
        rejections: list[Rejection] = []
        for op in read.ops:
            if stop is not None and stop():
                return Recovered(
                    name,
                    done,
                    "unfinished",
                    f"stopped before operation {done + 1} of {len(read.ops)}: the store is "
                    "closing; the file is kept for the next open or `fleetstore recover`",
                    len(rejections),
                    tuple(rejections),
                )
            if check is not None:
                try:
                    check(op)
                except errors.BlobCorrupt as exc:
                    return Recovered(
                        name,
                        done,
                        "damaged",
                        f"operation {done + 1} of {len(read.ops)} ({op.name}, op {op.op_id}) "
                        f"cannot be replayed: {exc}; the {done} operation(s) before it were "
                        "replayed; the file is kept (put the blob file back, then recover again)",
                        len(rejections),
                        tuple(rejections),
                    )
            try:
                apply(op)
            except Exception as exc:
                if not is_rejectable(exc) or (stop is not None and stop()):
                    return Recovered(
                        name,
                        done,
                        "unfinished",
                        f"stopped at operation {done + 1} of {len(read.ops)} "
                        f"({type(exc).__name__}: {exc}); the file is kept",
                        len(rejections),
                        tuple(rejections),
                    )
                rejections.append(reject(path.parent, op, exc, path.name, keyring))
            done += 1
        if read.damaged:
            return Recovered(
                name,
                done,
                "damaged",
                f"line {len(read.ops) + 1} cannot be replayed ({read.reason}); the "
                f"{len(read.ops)} operation(s) before it were replayed; the file is kept",
                len(rejections),
                tuple(rejections),
            )
        path.unlink()
        fsync_dir(path.parent)
        detail = f"ignored a torn last line of {read.trailing} bytes" if read.trailing else ""
        return Recovered(name, done, "replayed", detail, len(rejections), tuple(rejections))
    finally:
        os.close(fd)


__all__ = [
    "REJECTED",
    "checked_body",
    "JournalRead",
    "Recovered",
    "Rejection",
    "Spool",
    "decode_line",
    "encode_line",
    "is_rejectable",
    "journal_pid",
    "journals",
    "read_journal",
    "seal_text",
    "unseal_text",
    "recover_journal",
    "reject",
    "rejected_records",
    "remove_stale_new_files",
]
