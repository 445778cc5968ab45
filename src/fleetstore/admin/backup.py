"""``fleetstore backup`` and ``fleetstore restore``: a store copied while its fleet
writes, consistent with its blobs, verified by reading it back.

A store is its database file(s) and the blob files beside them (``<db>.blobs/``):
copying the ``.db`` alone loses every payload of 64 KiB or more.  A backup is a
directory that is itself a store (``fleetstore.db`` with ``fleetstore.db.blobs/``, or
a sharded store's ``catalog.db``, ``shards/`` and ``catalog.db.blobs/``) plus
``backup.json``, its manifest; any reading command takes it as ``--store``.

How a backup stays consistent (docs/backup.md):

1. It takes the blob collection lock (``<blobs>/.collecting``) exclusively, waiting for
   a collection under way to end: no blob file is deleted until the backup is done
   (``fleetstore maintain`` waits at its blob step meanwhile).  A collection deletes
   a file only after deleting its row, and only if older than its grace; with none
   running, a row in the snapshot keeps its file until the lock is released.
2. Each database file is copied as of one commit (``files.backup.copy_database``).
   A sharded store's shards are copied first, then its catalog, then any shard the
   catalog's copy names that was made in between: every tree the catalog lists is in
   the backup.
3. Every blob a copy's rows name is copied, one file at a time, and read back:
   decompressed and hashed.
4. Every copy is checked (``integrity_check``, ``foreign_key_check``), hashed into
   the manifest, and only then is the directory, built under a temporary name beside
   DEST (mode 0700, files 0600), renamed to DEST.

``restore`` checks a backup the same way (and each file against the manifest's hash)
before it copies anything, copies it beside the target under temporary names, renames
them into place (the blobs first: a database never appears without its blobs), and
checks the result.  It never writes over a store.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetstore import errors
from fleetstore.core import sealed
from fleetstore.core.files import private_dirs
from fleetstore.core.keys import Keyring
from fleetstore.core.targets import CATALOG, DEFAULT_FILENAME, SHARDS, parse_target
from fleetstore.core.version import __version__
from fleetstore.domain.blobs import COLLECTING, BlobStore, check_sha, fsync_dir
from fleetstore.engine.cipher import key_of_file
from fleetstore.files import backup as copies
from fleetstore.store.backend import store_files
from fleetstore.store.sharded.shards import shard_files

MANIFEST = "backup.json"
FORMAT = "fleetstore-backup"
VERSION = 1
#: Read back whole: the largest blob a store accepts.
_MAX_BLOB = 256 * 1024 * 1024 + 1

Progress = Callable[[str, int, int], None]


@dataclass(slots=True)
class Copied:
    """What a backup or a restore holds, and how long it took."""

    path: str
    layout: str
    files: list[dict[str, Any]] = field(default_factory=list)
    blobs: int = 0
    blob_bytes: int = 0
    seconds: float = 0.0
    waited_for_collection: float = 0.0

    @property
    def database_bytes(self) -> int:
        return sum(int(f["bytes"]) for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "layout": self.layout,
            "files": self.files,
            "database_bytes": self.database_bytes,
            "blobs": self.blobs,
            "blob_bytes": self.blob_bytes,
            "seconds": round(self.seconds, 3),
            "waited_for_collection": round(self.waited_for_collection, 3),
        }


@dataclass(frozen=True, slots=True)
class _Layout:
    """A store to back up: its root directory, its kind, its one file's name (or
    the catalog's), and its blob directory."""

    root: Path
    kind: str  # "file" or "sharded"
    name: str

    @property
    def blobs(self) -> Path:
        return self.root / (self.name + ".blobs")

    def databases(self) -> list[tuple[str, str]]:
        """(path in the store, path in the backup) of each database file, the catalog
        last; in a backup a store's one file is ``fleetstore.db``."""
        if self.kind == "file":
            return [(self.name, DEFAULT_FILENAME)]
        shards = [str(p.relative_to(self.root)) for _k, p in shard_files(self.root)]
        return [(n, n) for n in shards] + [(CATALOG, CATALOG)]


def _source(store: str | None) -> _Layout:
    """The store to back up."""
    kind, target = parse_target(store)
    if isinstance(target, str):
        raise errors.ConfigError(
            "a PostgreSQL store is backed up with PostgreSQL's own tools: pg_dump "
            "(one consistent snapshot of the database, blobs included: they are rows of "
            "blob_chunks) or pg_basebackup with WAL archiving (docs/backup.md)"
        )
    found = store_files(kind, target)
    return _Layout(found.root, found.layout, found.main.name)


# -- the blob collection lock ----------------------------------------------------------------


@contextlib.contextmanager
def _no_collection(blob_dir: Path, said: Callable[[float], None]) -> Iterator[None]:
    """The collection lock held exclusively: no blob collection runs meanwhile (one
    running is waited for; *said* is told how long)."""
    private_dirs(blob_dir)
    fd = os.open(blob_dir / COLLECTING, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        started = time.monotonic()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fcntl.flock(fd, fcntl.LOCK_EX)  # a collection ends in bounded time
        said(time.monotonic() - started)
        yield
    finally:
        os.close(fd)


# -- backup ----------------------------------------------------------------------------------


def backup(
    store: str | None,
    dest: str | os.PathLike[str],
    *,
    progress: Progress | None = None,
    after_snapshot: Callable[[], None] | None = None,
    keyring: Keyring | None = None,
) -> Copied:
    """Back up the SQLite store *store* (a file or a sharded directory) into the new
    directory *dest*, verified, while its fleet writes.  ``AlreadyExists`` if *dest*
    exists, ``NotFound`` if there is no store, ``ConfigError`` for PostgreSQL;
    ``CorruptStore`` if the copy does not check out (the store's own damage: named).
    Nothing is left at *dest* unless the backup is whole.  *after_snapshot* is called
    once the databases are copied, before their blobs (tests).  An encrypted store is
    read with *keyring*, and its backup is encrypted: each database under its own key,
    every blob file sealed (one written before the store was encrypted: sealed now)."""
    layout = _source(store)
    target = Path(dest).absolute()
    if os.path.lexists(target):
        raise errors.AlreadyExists(f"{target} exists: a backup is never written over anything")
    private_dirs(target.parent)
    work = target.with_name(f".{target.name}.partial-{os.getpid()}-{os.urandom(4).hex()}")
    private_dirs(work)
    started = time.monotonic()
    copied = Copied(str(target), layout.kind)
    try:

        def waited(seconds: float) -> None:
            copied.waited_for_collection = seconds

        with _no_collection(layout.blobs, waited):
            names = _copy_databases(layout, work, progress, keyring)
            if after_snapshot is not None:
                after_snapshot()
            _copy_blobs(layout.blobs, work, names, copied, progress, keyring)
        _check(work, names, _blob_dir(work, names), copied, progress, keyring)
        _write_manifest(work, layout, copied)
        fsync_dir(work)
        if os.path.lexists(target):
            raise errors.AlreadyExists(f"{target} was made while the backup ran; nothing written")
        os.rename(work, target)
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    copied.seconds = time.monotonic() - started
    return copied


def _copy_databases(
    layout: _Layout, work: Path, progress: Progress | None, keyring: Keyring | None
) -> list[str]:
    """Each database file copied as of one commit; a sharded store's catalog after its
    shards, then the shards its copy names that appeared meanwhile.  Returns the paths
    in the backup of those copied."""
    pairs = layout.databases()
    done: list[str] = []
    for i, (name, as_name) in enumerate(pairs, 1):
        if _copy_one(layout.root / name, work / as_name, keyring, required=name == layout.name):
            done.append(as_name)
        if progress is not None:
            progress("databases", i, len(pairs))
    if layout.kind == "sharded":
        catalog = str(work / CATALOG)
        keys = {
            str(r[0]) for r in copies.query(catalog, _NAMED_SHARDS, key_of_file(catalog, keyring))
        }
        for key, path in shard_files(layout.root):
            name = str(path.relative_to(layout.root))
            if key in keys and name not in done and _copy_one(path, work / name, keyring):
                done.append(name)
    return done


_NAMED_SHARDS = "SELECT shard FROM shard_sessions UNION SELECT shard FROM shard_intents"


def _copy_one(src: Path, dest: Path, keyring: Keyring | None, *, required: bool = False) -> bool:
    """Copy the database *src* to *dest* (encrypted under its key, if it is); False if
    it is gone (a shard file removed meanwhile: its tree was deleted)."""
    private_dirs(dest.parent)
    try:
        key = key_of_file(str(src), keyring)
        if key is None and not src.exists():
            raise errors.NotFound(f"{src}: no such file")
        copies.copy_database(str(src), str(dest), key=key)
    except errors.NotFound:
        if required:
            raise
        with contextlib.suppress(FileNotFoundError):
            dest.unlink()
        return False
    return True


_BLOB_ROWS = "SELECT sha256, size FROM blobs"


def _blob_rows(root: Path, names: list[str], keyring: Keyring | None) -> dict[str, int]:
    """sha256 -> size of every blob row of the databases *names* under *root*."""
    rows: dict[str, int] = {}
    for name in names:
        path = str(root / name)
        for sha, size in copies.query(path, _BLOB_ROWS, key_of_file(path, keyring)):
            rows[check_sha(sha)] = size if isinstance(size, int) else -1
    return rows


def _copy_blobs(
    source: Path,
    work: Path,
    names: list[str],
    copied: Copied,
    progress: Progress | None,
    keyring: Keyring | None,
) -> None:
    """Every blob the copies' rows name, from *source* into the backup, fsynced (an
    encrypted store's: sealed, each one)."""
    rows = _blob_rows(work, names, keyring)
    into = _blob_dir(work, names)
    for i, sha in enumerate(sorted(rows), 1):
        src = source / sha[:2] / sha
        dst = into / sha[:2] / sha
        private_dirs(dst.parent)
        try:
            packed = src.read_bytes()
        except OSError as exc:
            raise errors.BlobCorrupt(
                f"blob {sha}, which the store's rows name, cannot be read from {src}: "
                f"{exc.strerror} (the store is damaged: `fleetstore doctor` says more); "
                "nothing was written"
            ) from exc
        if keyring is not None and not sealed.is_sealed(packed):
            packed = sealed.seal(packed, keyring)
        _write_file(dst, packed)
        copied.blob_bytes += len(packed)
        if progress is not None:
            progress("blobs", i, len(rows))
    copied.blobs = len(rows)
    for sub in into.iterdir() if into.is_dir() else ():
        fsync_dir(sub)


def _blob_dir(root: Path, names: list[str]) -> Path:
    """The blob directory of the store whose database files *names* are under *root*:
    beside its one file, or beside its catalog."""
    main = CATALOG if CATALOG in names else names[0]
    return root / (main + ".blobs")


def _write_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _check(
    root: Path,
    names: list[str],
    blob_dir: Path,
    copied: Copied,
    progress: Progress | None,
    keyring: Keyring | None,
) -> None:
    """Every database of the backup at *root* checked by SQLite, and every blob its
    rows name read back (present, decompressed to its size, its hash): ``CorruptStore``
    naming what is wrong.  Records each file's size and hash in *copied*."""
    problems: list[str] = []
    copied.files = []
    for i, name in enumerate(names, 1):
        path = str(root / name)
        found = copies.check_database(path, key_of_file(path, keyring))
        problems += [f"{name}: {p}" for p in found[:10]]
        copied.files.append(
            {"path": name, "bytes": (root / name).stat().st_size, "sha256": _sha256(root / name)}
        )
        if progress is not None:
            progress("verify", i, len(names) + 1)
    if not problems:
        rows = _blob_rows(root, names, keyring)
        store = BlobStore(blob_dir, _MAX_BLOB, durable=False, keyring=keyring)
        for sha, size in rows.items():
            try:
                store.get(sha, size)
            except errors.BlobCorrupt as exc:
                problems.append(str(exc))
        copied.blobs = len(rows)
    if progress is not None:
        progress("verify", len(names) + 1, len(names) + 1)
    if problems:
        more = f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
        shown = "; ".join(problems[:5]) + more
        raise errors.CorruptStore(f"{root}: does not check out: {shown}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_manifest(work: Path, layout: _Layout, copied: Copied) -> None:
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "fleetstore": __version__,
        "created_at": time.time(),
        "source": str(layout.root if layout.kind == "sharded" else layout.root / layout.name),
        "layout": layout.kind,
        "files": copied.files,
        "blobs": {"count": copied.blobs, "stored_bytes": copied.blob_bytes},
    }
    _write_file(work / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())


# -- reading a backup back, and restoring it -------------------------------------------------


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """A backup's manifest (``NotFound`` if *directory* holds none; ``CorruptStore`` if
    it is not one this fleetstore reads)."""
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise errors.NotFound(f"no backup at {directory} (no {MANIFEST})") from None
    except (OSError, ValueError) as exc:
        raise errors.CorruptStore(f"{path}: not a backup manifest: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise errors.CorruptStore(f"{path}: not a fleetstore backup manifest")
    if not isinstance(manifest.get("version"), int) or manifest["version"] > VERSION:
        raise errors.CorruptStore(
            f"{path}: backup format version {manifest.get('version')!r}, newer than this "
            f"fleetstore reads ({VERSION})"
        )
    files = manifest.get("files")
    if (
        manifest.get("layout") not in ("file", "sharded")
        or not isinstance(files, list)
        or not all(
            isinstance(f, dict) and _safe_name(f.get("path")) and isinstance(f.get("sha256"), str)
            for f in files
        )
    ):
        raise errors.CorruptStore(f"{path}: its file list is damaged")
    return manifest


def _safe_name(name: object) -> bool:
    """A file of a backup: a relative path inside it, of the names a store has."""
    if not isinstance(name, str) or name.startswith("/") or ".." in Path(name).parts:
        return False
    parts = Path(name).parts
    return parts in ((DEFAULT_FILENAME,), (CATALOG,)) or (
        len(parts) == 3 and parts[0] == SHARDS and name.endswith(".db")
    )


def verify_backup(
    directory: str | os.PathLike[str],
    progress: Progress | None = None,
    keyring: Keyring | None = None,
) -> tuple[dict[str, Any], Copied]:
    """Check the backup at *directory* without changing it: its manifest, each
    database file against the manifest's hash and by SQLite, each blob its rows name
    read back.  ``CorruptStore`` naming what is wrong."""
    root = Path(directory).absolute()
    manifest = read_manifest(root)
    names = [str(f["path"]) for f in manifest["files"]]
    problems = []
    for f in manifest["files"]:
        path = root / f["path"]
        if not path.is_file():
            problems.append(f"{f['path']} is missing")
        elif _sha256(path) != f["sha256"]:
            problems.append(f"{f['path']} differs from the backup made (its hash)")
    if problems:
        raise errors.CorruptStore(f"{root}: does not check out: {'; '.join(problems[:5])}")
    copied = Copied(str(root), str(manifest["layout"]))
    blob_dir = _blob_dir(root, names)
    _check(root, names, blob_dir, copied, progress, keyring)
    copied.blob_bytes = sum(
        (blob_dir / sha[:2] / sha).stat().st_size for sha in _blob_rows(root, names, keyring)
    )
    return manifest, copied


def restore(
    directory: str | os.PathLike[str],
    store: str | None,
    progress: Progress | None = None,
    keyring: Keyring | None = None,
) -> Copied:
    """Restore the backup at *directory* as the store *store* (a path, or a
    ``sqlite+sharded://`` URL for a sharded backup), which must not exist: the backup
    checked first, copied beside the target under temporary names, renamed into place
    (blobs first), and the result checked.  ``AlreadyExists`` if anything of a store
    is at the target; ``ConfigError`` for a target of the wrong kind."""
    started = time.monotonic()
    manifest, _checked = verify_backup(directory, progress, keyring)
    src = Path(directory).absolute()
    names = [str(f["path"]) for f in manifest["files"]]
    kind, target = parse_target(store)
    if isinstance(target, str):
        raise errors.ConfigError(
            "restore writes SQLite stores; restore into a file, then `fleetstore migrate` "
            "it to PostgreSQL (a PostgreSQL store is restored with pg_restore)"
        )
    if manifest["layout"] == "sharded":
        if kind != "sharded":
            raise errors.ConfigError(
                f"a backup of a sharded store restores to a directory: --store "
                f"sqlite+sharded:///DIR, not {target}"
            )
        root = target.absolute()
        if os.path.lexists(root):
            raise errors.AlreadyExists(f"{root} exists: restore never writes over a store")
        private_dirs(root.parent)
        work = root.with_name(f".{root.name}.restoring-{os.getpid()}-{os.urandom(4).hex()}")
        try:
            _copy_tree(src, work, [*names, _blob_dir(src, names).name], progress)
            os.rename(work, root)
            fsync_dir(root.parent)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        restored, blob_dir = (root, names), _blob_dir(root, names)
    else:
        if kind == "sharded":
            raise errors.ConfigError(
                f"a backup of a one-file store restores to a file, not to {target}"
            )
        db = target.absolute()
        taken = [p for p in _store_files(db) if os.path.lexists(p)]
        if taken:
            raise errors.AlreadyExists(
                f"{taken[0]} exists: restore never writes over a store (move its files "
                "away first, with no process using it)"
            )
        private_dirs(db.parent)
        tag = f"restoring-{os.getpid()}-{os.urandom(4).hex()}"
        blobs_tmp = db.with_name(f".{db.name}.blobs.{tag}")
        db_tmp = db.with_name(f".{db.name}.{tag}")
        try:
            _copy_tree(src / (DEFAULT_FILENAME + ".blobs"), blobs_tmp, None, progress)
            _copy_file(src / DEFAULT_FILENAME, db_tmp)
            os.rename(blobs_tmp, Path(str(db) + ".blobs"))
            os.link(db_tmp, db)  # never over a file made meanwhile (FileExistsError)
            db_tmp.unlink()
            fsync_dir(db.parent)
        except BaseException:
            shutil.rmtree(blobs_tmp, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                db_tmp.unlink()
            raise
        restored, blob_dir = (db.parent, [db.name]), Path(str(db) + ".blobs")
    copied = Copied(str(target), str(manifest["layout"]))
    _check(*restored, blob_dir, copied, progress, keyring)
    hashes = [f["sha256"] for f in manifest["files"]]
    if [f["sha256"] for f in copied.files] != hashes:
        raise errors.CorruptStore(f"{target}: the restored files differ from the backup's")
    copied.seconds = time.monotonic() - started
    return copied


def _store_files(db: Path) -> list[Path]:
    """What makes up a store at *db*, or is left of one."""
    return [Path(str(db) + side) for side in _SIDES]


_SIDES = ("", "-wal", "-shm", "-journal", ".blobs", ".gate", ".spool", ".procs")


def _copy_file(src: Path, dst: Path) -> None:
    """*src* to the new file *dst* (0600), fsynced, read in blocks."""
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with src.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_tree(src: Path, dst: Path, names: list[str] | None, progress: Progress | None) -> None:
    """The files under *src* (only those *names* lead to, if given) into the new
    directory *dst*: directories 0700, files 0600, each fsynced."""
    private_dirs(dst)
    wanted = None if names is None else [Path(n).parts for n in names]
    files = [
        p
        for p in sorted(src.rglob("*"))
        if p.is_file()
        and (wanted is None or any(p.relative_to(src).parts[: len(w)] == w for w in wanted))
    ]
    for i, path in enumerate(files, 1):
        out = dst / path.relative_to(src)
        private_dirs(out.parent)
        _copy_file(path, out)
        if progress is not None:
            progress("restore", i, len(files))
    for directory in sorted({(dst / p.relative_to(src)).parent for p in files} | {dst}):
        fsync_dir(directory)


__all__ = [
    "FORMAT",
    "MANIFEST",
    "VERSION",
    "Copied",
    "backup",
    "read_manifest",
    "restore",
    "verify_backup",
]
