"""Content-addressed payload files beside the database.

A payload over ``blob_threshold`` is compressed (zstd), written to a temporary
file, fsynced, renamed to ``<dir>/<sha[:2]>/<sha>`` and the directory fsynced,
all *before* the write transaction, which then stores only the hash: the time
a writer holds the lock does not grow with the payload (DESIGN.md promise 4;
a 4 MB payload written inside the transaction raised everyone else's p99 6-7x).
Paths come from the hash alone, so no input can name a file of its choosing.
Identical payloads share one file.  Reads verify the hash.

A store with a keyring (``encryption_key_file``) seals each file after compressing it
(``fleetstore.core.sealed``: AES-256-GCM, the key's id in its header); the compressed
bytes (``read_stored``, ``put_stored``: exports, migrations) are the same either way.
A file written before the store was encrypted, or sealed under an older key of the
ring, still reads.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard

from fleetstore import errors
from fleetstore.core import sealed
from fleetstore.core.files import private_dirs
from fleetstore.core.keys import Keyring
from fleetstore.engine.base import Engine

CODEC = "zstd"
_SHA = re.compile(r"[0-9a-f]{64}")
# Level 1: a 6 MB tool output costs 11-13 ms at level 1 vs 54-61 ms at level 3, for
# a file barely larger; on a 2-core machine that CPU, not the lock, raised other
# agents' small-write p99 (benchmarks/bench_history.py, "cpu-only" variant).
COMPRESSION_LEVEL = 1
#: A reused blob file older than this (seconds) has its mtime set to now; a younger
#: one is left as it is (importing a file twice changes nothing, not even mtimes).
#: Blob garbage collection's grace must exceed the write budget plus this.
TOUCH_AFTER = 60.0
#: The bytes of a stored blob are held for the write that refers to it at most this
#: long (seconds); a write still waiting past it is not protected from the collector.
KEEP_FOR = 3600.0
#: A collector holds a shared flock on this file of the blob directory while it runs.
COLLECTING = ".collecting"


@dataclass(frozen=True, slots=True)
class BlobRef:
    """A stored payload: its SHA-256 (of the uncompressed bytes) and sizes."""

    sha256: str
    size: int
    stored_size: int
    codec: str = CODEC


def check_sha(sha256: object) -> str:
    if not isinstance(sha256, str) or not _SHA.fullmatch(sha256):
        raise errors.InvalidInput(f"not a blob hash (64 lower-case hex digits): {sha256!r}")
    return sha256


class BlobStore:
    """The blob files of one store (``<database>.blobs/``)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int,
        *,
        durable: bool = True,
        wait_for_space: float = 0.0,
        keyring: Keyring | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        #: Files are sealed with its current key (None: written as compressed).
        self.keyring = keyring
        #: A full disk is waited out this long (the write budget: issue 23, a full disk
        #: that frees within it costs latency, not turns), then ``StorageFull``.
        self.wait_for_space = wait_for_space
        #: fsync each file and its directory before ``put`` returns (``synchronous`` FULL
        #: or EXTRA).  Else (NORMAL) they are made durable by ``sync()``, which the
        #: database runs before every checkpoint: under NORMAL no commit is durable
        #: before a checkpoint either (docs/design.md, "Blobs: durable at the barrier").
        self.durable = durable
        #: sha -> [stored bytes, writes not yet settled, last put (monotonic)].
        self._kept: dict[str, list[Any]] = {}
        self._kept_lock = threading.Lock()

    def path(self, sha256: str) -> Path:
        sha = check_sha(sha256)
        return self.directory / sha[:2] / sha

    def put(self, data: bytes, *, keep: bool = True) -> BlobRef:
        """Store *data* (durably at once, if ``durable``) and return its reference.  A payload
        already stored is not written again if its file verifies; a damaged file
        is replaced, so writing the same payload repairs it.  *keep*: hold the stored
        bytes until ``settle`` is told the write referring to them is done."""
        if len(data) > self.max_bytes:
            raise errors.PayloadTooLarge(
                f"payload of {len(data):,} bytes is over max_payload_bytes ({self.max_bytes:,})"
            )
        sha = hashlib.sha256(data).hexdigest()
        target = self.path(sha)
        # (A file sealed under a key the ring lacks is written again under its own.)
        with contextlib.suppress(OSError, errors.BlobCorrupt, errors.KeyMissing, errors.WrongKey):
            packed = self._load(target, sha)
            # Decompressing and hashing costs less than compressing again, and a
            # file trusted by its name alone was never repaired by a later import
            # or merge of the same content (tests/domain/test_history.py).
            if hashlib.sha256(_unpack(packed, len(data), "")).hexdigest() == sha:
                # Made young before the caller's transaction refers to it: blob garbage
                # collection deletes only files older than a grace beyond the write
                # budget plus TOUCH_AFTER, and puts back a file touched while it looked
                # (fleetstore/ops/maintain.py).  Gone meanwhile (collected): written anew.
                if time.time() - target.stat().st_mtime >= TOUCH_AFTER:
                    os.utime(target)
                if keep:
                    self._keep(sha, packed)
                return BlobRef(sha, len(data), len(packed))
        packed = zstandard.ZstdCompressor(
            level=COMPRESSION_LEVEL, write_content_size=True
        ).compress(data)
        existed = target.exists()  # damaged: replaced below
        try:
            self._write_waiting(target, packed)
        except OSError as exc:
            if existed:
                left = "the damaged file there may be left as it was"
            elif target.exists():
                left = "its file is in place but may not survive a power loss"
            else:
                left = "no file of it was left"
            raise errors.storage_error(
                exc,
                f"blob {sha} ({len(data):,} bytes) could not be stored in {self.directory} "
                f"({left}); nothing that refers to it was written",
            ) from exc
        if keep:
            self._keep(sha, packed)
        return BlobRef(sha, len(data), len(packed))

    def _write_waiting(self, target: Path, packed: bytes) -> None:
        """``_write``, tried again while the disk is full, for ``wait_for_space``."""
        deadline, pause = time.monotonic() + self.wait_for_space, 0.005
        while True:
            try:
                return self._write(target, packed)
            except OSError as exc:
                if exc.errno not in errors.FULL_ERRNOS or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.25)

    def _write(self, target: Path, packed: bytes) -> None:
        """*packed* at *target*: a temporary file, written whole (fsynced if durable),
        renamed into place.  On an ``OSError`` the temporary file is gone; *target* is
        either absent or whole (a rename done before a directory fsync failed)."""
        if not target.parent.is_dir():
            private_dirs(target.parent)
        tmp = target.parent / f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        if self.keyring is not None:
            packed = sealed.seal(packed, self.keyring)
        try:
            try:
                view = memoryview(packed)
                while view:
                    view = view[os.write(fd, view) :]
                if self.durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            # Two processes storing the same payload both rename: either file is right.
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        if self.durable:
            fsync_dir(target.parent)

    # -- a write's blob files, from before its transaction to after it -------------------
    # Garbage collection (admin/maintain/blobs.py) deletes a file no row or journal refers
    # to once it is older than its grace.  A write that waited longer than that between
    # storing its file and committing (or spooling) would be acknowledged with its file
    # gone.  So the stored bytes are kept until the write is done; then, while a
    # collector runs (it holds a shared flock on COLLECTING throughout), each file is
    # touched: a collector that read the rows before the commit sees the touch when it
    # looks at the mtime again after renaming the file aside.  A file gone is written
    # again.  No collector running: none that started before the commit is left, so a
    # file still there stays (and is not touched: importing twice changes nothing).

    def _keep(self, sha: str, packed: bytes) -> None:
        now = time.monotonic()
        with self._kept_lock:
            entry = self._kept.get(sha)
            if entry is None:
                self._kept[sha] = [packed, 1, now]
            else:
                entry[1] += 1
                entry[2] = now
            # Bytes stored for a write that never came (its call failed in between).
            stale = [k for k, e in self._kept.items() if now - e[2] > KEEP_FOR]
            for k in stale:
                del self._kept[k]

    def collector_running(self) -> bool:
        """Whether a blob collection holds the COLLECTING lock now."""
        try:
            fd = os.open(self.directory / COLLECTING, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False  # none ever ran, or one is about to: it reads our rows then
        except OSError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def after_fork(self) -> None:
        """In a forked child: the parent's writes are not the child's to settle."""
        self._kept = {}
        self._kept_lock = threading.Lock()

    @property
    def keeping(self) -> bool:
        """Whether bytes are held for writes not yet settled."""
        return bool(self._kept)

    def settle(self, shas: Iterable[str], *, written: bool) -> None:
        """The write that refers to *shas* is done: committed or spooled (*written*), or
        failed.  Each file this process stored for it is made young again, or written
        again if a collector took it (``BlobCorrupt`` if it cannot be)."""
        collecting: bool | None = None
        for sha in shas:
            with self._kept_lock:
                entry = self._kept.get(sha)
                if entry is None:
                    continue
                entry[1] -= 1
                if entry[1] <= 0:
                    del self._kept[sha]
                packed: bytes = entry[0]
            if not written:
                continue
            target = self.path(sha)
            if collecting is None:
                collecting = self.collector_running()
            try:
                if collecting:
                    os.utime(target)
                elif not target.is_file():
                    raise FileNotFoundError(target)
            except FileNotFoundError:
                try:
                    self._write(target, packed)
                except OSError as exc:
                    raise errors.BlobCorrupt(
                        f"blob {sha}: collected while its write waited, and not written "
                        f"again: {exc}"
                    ) from exc

    def sync(self) -> None:
        """Make every blob file written so far durable, whoever wrote it: one
        ``syncfs`` of the blob directory's file system (the database runs it before a
        checkpoint makes durable the rows that refer to them).  Nothing to do when
        each ``put`` is durable already."""
        if self.durable or not self.directory.is_dir():
            return
        syncfs(self.directory)

    def _load(self, target: Path, sha256: str) -> bytes:
        """The compressed bytes of the file at *target*, unsealed if it is sealed
        (``KeyMissing`` without the key it names, ``WrongKey``; ``BlobCorrupt`` if it
        is damaged)."""
        data = target.read_bytes()
        if not sealed.is_sealed(data):
            return data
        if self.keyring is None:
            raise errors.KeyMissing(
                f"blob {sha256}: {target} is encrypted and the store was opened without a "
                "key (encryption_key_file); nothing was read"
            )
        try:
            return sealed.unseal(data, self.keyring, str(target))
        except errors.SealedCorrupt as exc:
            raise errors.BlobCorrupt(f"blob {sha256}: {exc}") from exc

    def get(self, sha256: str, size: int | None = None) -> bytes:
        """The payload, verified against its hash (``BlobCorrupt`` if missing or damaged)."""
        target = self.path(sha256)
        try:
            packed = self._load(target, sha256)
        except OSError as exc:
            raise errors.BlobCorrupt(
                f"blob {sha256}: cannot read {target}: {exc.strerror}"
            ) from exc
        limit = self.max_bytes if size is None else size
        data = _unpack(packed, limit, f"blob {sha256}: {target} is damaged")
        if hashlib.sha256(data).hexdigest() != sha256:
            raise errors.BlobCorrupt(f"blob {sha256}: {target} does not match its hash")
        return data

    def read_stored(self, sha256: str) -> bytes:
        """The compressed bytes as stored, unsealed (for export; verified by the importer)."""
        try:
            return self._load(self.path(sha256), sha256)
        except OSError as exc:
            raise errors.BlobCorrupt(f"blob {sha256}: {exc.strerror}") from exc

    def put_stored(self, sha256: str, packed: bytes, size: int, *, keep: bool = False) -> BlobRef:
        """Store compressed bytes received from elsewhere, after checking that
        they decompress to *size* bytes with hash *sha256* (*keep*: as for ``put``)."""
        return self.put(_received(sha256, packed, size, self.max_bytes), keep=keep)

    def verify(self, sha256: str) -> bool:
        try:
            self.get(sha256)
        except errors.BlobCorrupt:
            return False
        return True

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).exists()

    def describe(self, sha256: str) -> str:
        """Where the blob lives, for messages."""
        return str(self.path(sha256))

    def __iter__(self) -> Iterator[str]:
        """The hashes of every blob file present."""
        if not self.directory.is_dir():
            return
        for sub in sorted(self.directory.iterdir()):
            if sub.is_dir() and len(sub.name) == 2:
                for f in sorted(sub.iterdir()):
                    if _SHA.fullmatch(f.name):
                        yield f.name


#: Blob bytes in the database are cut in chunks of this size: one row never holds a
#: 256 MB value, and a read streams row by row.
CHUNK_BYTES = 1024 * 1024


class DbBlobStore:
    """The blobs of a store on a database server (PostgreSQL): the compressed bytes in
    ``blob_chunks`` rows, so every host sees them.  Same interface, limits, codec
    and hashes as the files of a SQLite store; written in a transaction of their own
    before the one that refers to them, as the files are."""

    def __init__(
        self,
        db: Engine,
        queries: Mapping[str, str],
        max_bytes: int,
        keyring: Keyring | None = None,
    ) -> None:
        self._db = db
        self._queries = queries
        self.max_bytes = max_bytes
        #: The compressed bytes are sealed before they are cut in rows (None: as they are):
        #: the server, its backups and replicas hold ciphertext (docs/secrets.md).
        self.keyring = keyring

    def _q(self, name: str) -> str:
        return self._queries[name]

    def put(self, data: bytes) -> BlobRef:
        if len(data) > self.max_bytes:
            raise errors.PayloadTooLarge(
                f"payload of {len(data):,} bytes is over max_payload_bytes ({self.max_bytes:,})"
            )
        sha = hashlib.sha256(data).hexdigest()
        stored = self._stored_size(sha)
        if stored and self.verify(sha):
            # Read back and hashed, as a reused file is: writing the same payload
            # again repairs damaged chunks (tests/domain/test_history.py, damaged blobs).
            return BlobRef(sha, len(data), stored)
        packed = zstandard.ZstdCompressor(
            level=COMPRESSION_LEVEL, write_content_size=True
        ).compress(data)
        self._write(sha, packed, replace=bool(stored))
        return BlobRef(sha, len(data), len(packed))

    def _stored_size(self, sha: str) -> int:
        rows = self._db.read(lambda tx: tx.execute(self._q("blobdata_exists"), (sha,)))
        return int(rows[0][1]) if rows and rows[0][0] else 0

    def _write(self, sha: str, packed: bytes, replace: bool = False) -> None:
        if self.keyring is not None:
            packed = sealed.seal(packed, self.keyring)
        chunks = [
            (sha, i, packed[at : at + CHUNK_BYTES])
            for i, at in enumerate(range(0, max(len(packed), 1), CHUNK_BYTES))
        ]
        sql = self._q("blobdata_put_chunk")

        def write(tx: Any) -> None:
            if replace:  # damaged chunks out first
                tx.execute(self._q("blobdata_delete"), (sha,))
            for chunk in chunks:  # all chunks or none: one transaction
                tx.execute(sql, chunk)

        self._db.run_write(write)

    def read_stored(self, sha256: str) -> bytes:
        check_sha(sha256)
        rows = self._db.read(lambda tx: tx.execute(self._q("blobdata_get"), (sha256,)))
        if not rows:
            raise errors.BlobCorrupt(f"blob {sha256}: no data in blob_chunks")
        data = b"".join(bytes(r[0]) for r in rows)
        if not sealed.is_sealed(data):
            return data
        if self.keyring is None:
            raise errors.KeyMissing(
                f"blob {sha256} is encrypted and the store was opened without a key "
                "(encryption_key_file); nothing was read"
            )
        try:
            return sealed.unseal(data, self.keyring, f"blob {sha256}")
        except errors.SealedCorrupt as exc:
            raise errors.BlobCorrupt(str(exc)) from exc

    def get(self, sha256: str, size: int | None = None) -> bytes:
        packed = self.read_stored(sha256)
        limit = self.max_bytes if size is None else size
        data = _unpack(packed, limit, f"blob {sha256}: its chunks are damaged")
        if hashlib.sha256(data).hexdigest() != sha256:
            raise errors.BlobCorrupt(f"blob {sha256}: its chunks do not match its hash")
        return data

    def put_stored(self, sha256: str, packed: bytes, size: int, *, keep: bool = False) -> BlobRef:
        # (*keep* is for files: rows are written in their own committed transaction.)
        _received(sha256, packed, size, self.max_bytes)
        stored = self._stored_size(sha256)
        if not stored or not self.verify(sha256):
            self._write(sha256, packed, replace=bool(stored))
            stored = len(packed)
        return BlobRef(sha256, size, stored)

    def verify(self, sha256: str) -> bool:
        try:
            self.get(sha256)
        except errors.BlobCorrupt:
            return False
        return True

    def exists(self, sha256: str) -> bool:
        return self._stored_size(check_sha(sha256)) > 0

    def describe(self, sha256: str) -> str:
        return f"blob_chunks rows of {sha256}"

    def _page(self, after: str, limit: int) -> list[tuple[Any, ...]]:
        sql = self._q("blobdata_list_after")
        return self._db.read(lambda tx: tx.execute(sql, (after, limit)))

    def __iter__(self) -> Iterator[str]:
        """The hashes of every blob with data in the database."""
        after, page = "", 1000
        while True:
            rows = self._page(after, page)
            for (sha,) in rows:
                yield str(sha)
            if len(rows) < page:
                return
            after = str(rows[-1][0])


def referenced_shas(value: object) -> list[str]:
    """The blob hashes an operation's arguments refer to (``{"blob": {"sha256": ...}}``
    anywhere in them)."""
    found: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            blob = item.get("blob")
            if isinstance(blob, Mapping) and isinstance(blob.get("sha256"), str):
                found.append(blob["sha256"])
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return found


def _received(sha256: str, packed: bytes, size: int, max_bytes: int) -> bytes:
    """The payload of compressed bytes received from elsewhere (an import, a migrate),
    checked: within the size limit, valid zstd, *size* bytes with hash *sha256*."""
    check_sha(sha256)
    if size > max_bytes:
        raise errors.PayloadTooLarge(f"blob {sha256} of {size:,} bytes is over max_payload_bytes")
    data = _unpack(packed, size, f"blob {sha256}: not valid zstd data")
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
        raise errors.BlobCorrupt(f"blob {sha256}: bytes do not match the hash or size")
    return data


def _unpack(packed: bytes, limit: int, what: str) -> bytes:
    """The bytes of a zstd frame of at most *limit* bytes, else ``BlobCorrupt``.
    ``max_output_size`` bounds only frames that do not declare their size: a damaged
    or forged header declaring terabytes raised MemoryError, so it is refused before
    anything is allocated (tests/domain/test_history.py: test_a_damaged_blob_file_...)."""
    try:
        declared = zstandard.frame_content_size(packed)
        if declared > limit:
            raise errors.BlobCorrupt(
                f"{what}: its header declares {declared:,} bytes, over the {limit:,} expected"
            )
        return zstandard.ZstdDecompressor().decompress(packed, max_output_size=limit)
    except zstandard.ZstdError as exc:
        raise errors.BlobCorrupt(f"{what}: {exc}") from exc


def _load_syncfs() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_syncfs = _load_syncfs()


def syncfs(path: Path) -> None:
    """Write back every dirty page of the file system *path* is on (``syncfs(2)``;
    ``sync()`` where there is none)."""
    if _syncfs is None:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(path))
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """fsync a directory, so a file created or renamed in it survives a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = [
    "CODEC",
    "COLLECTING",
    "COMPRESSION_LEVEL",
    "BlobRef",
    "BlobStore",
    "DbBlobStore",
    "check_sha",
    "referenced_shas",
    "syncfs",
    "fsync_dir",
]
