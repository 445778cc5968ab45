"""Moving one session tree out of a sharded store, and back.

``archive_tree(store, session_id, dest)`` moves the file of one session tree out of
a sharded store into *dest*, self-contained: ``<dest>/<key>.db`` (the shard, with
every row of the tree), ``<dest>/<key>.blobs/`` (a copy of every blob it refers to)
and ``<dest>/<key>.json`` (what it holds, with each session's content digest); the
catalog then no longer lists the tree.  ``restore_tree(store, archive)`` moves it
back and checks the digests.  Step by step (each step can be run again after a
crash: archiving or restoring again carries on):

1. the shard refuses writes from then on: a trigger per table and statement that
   aborts with "fleetstore: archived" (committed under the shard's writer gate);
2. the digests and the blob copies are made, and the WAL is checkpointed into the
   file and truncated, so the file alone holds every row;
3. under the writer gate and ``BEGIN IMMEDIATE``, the file (with its -wal and -shm,
   which other processes may have open) is renamed into *dest*;
4. the catalog drops the tree's index rows (a process that looks the tree up then
   finds no session: ``NotFound``).

A process that still has the shard open from before (its cache of open files) keeps
its descriptors of the moved file: its reads see the archive, and its writes fail
with "fleetstore: archived" instead of landing silently in a file that is no longer
in the store (tests/transfer/test_reshard.py::test_a_writer_that_had_the_tree_open_*).
Restoring drops the triggers and renames the file back (the same file, so such a
process can write again), then rebuilds the tree's index in the catalog.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetstore import errors
from fleetstore.core.crash import crash_point
from fleetstore.core.files import private_dirs
from fleetstore.domain.blobs import BlobStore, fsync_dir
from fleetstore.engine.gate import announce_moved
from fleetstore.engine.sqlite import Database
from fleetstore.store.facade import Store
from fleetstore.store.sharded.shards import shard_key
from fleetstore.transfer.digest import session_digest

#: What the triggers of an archived shard say (and what a writer that still had the
#: file open sees in its error).
ARCHIVED = "fleetstore: archived"
ARCHIVE_FORMAT = "fleetstore-tree-archive"
ARCHIVE_VERSION = 1
_TRIGGER = "fleetstore_archived_"
_SUFFIXES = ("", "-wal", "-shm")
_SQLITE_HEADER = b"SQLite format 3\x00"


class TreeBusy(errors.TransientError):
    """A write that changes the tree in its shard and in the catalog is under way:
    nothing was moved; try again."""


def _fleetstore_file(path: Path) -> bool:
    """A SQLite file in WAL mode (every fleetstore database is)?"""
    try:
        with open(path, "rb") as f:
            header = f.read(20)
    except OSError:
        return False
    return header[:16] == _SQLITE_HEADER and header[18:20] == b"\x02\x02"


# -- archiving a tree ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TreeArchive:
    """A session tree archived or restored."""

    #: The tree's shard key (its root session id, or a hash of it).
    key: str
    #: ``<dest>/<key>.db``.
    archive: str
    sessions: int
    messages: int
    blobs: int
    blob_bytes: int
    #: This call carried on after an interrupted one.
    resumed: bool = False
    #: A restore: sessions whose digest differs from the one archived (empty: equal).
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "archive": self.archive,
            "sessions": self.sessions,
            "messages": self.messages,
            "blobs": self.blobs,
            "blob_bytes": self.blob_bytes,
            "resumed": self.resumed,
            "problems": list(self.problems),
            "ok": self.ok,
        }


def _router(store: Store) -> Any:
    if store.router is None:
        raise errors.InvalidInput(
            f"{store.url}: not a sharded store: only a sharded store keeps a session tree in "
            "a file of its own (fleetstore reshard converts a store)"
        )
    return store.router


def _tables(db: Any) -> list[str]:
    return [
        str(r[0])
        for r in db.read(
            lambda tx: tx.execute(
                # Not the search index's FTS5 tables: SQLite allows no trigger on a
                # virtual table ("cannot create triggers on virtual tables" refused every
                # archive once the index existed); their writes land in shadow tables,
                # which are ordinary ones and get the trigger.
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite%' AND sql NOT LIKE 'CREATE VIRTUAL TABLE%' "
                "ORDER BY name"
            )
        )
    ]


def _block(db: Any, key: str) -> None:
    """From the commit on, every write to the file fails (whoever has it open)."""
    message = (
        f"{ARCHIVED}: the session tree of shard {key} was moved out of the store "
        "(fleetstore sessions restore-tree puts it back)"
    )
    tables = _tables(db)

    def run(tx: Any) -> None:
        for table in tables:
            for event in ("INSERT", "UPDATE", "DELETE"):
                tx.execute(
                    f'CREATE TRIGGER IF NOT EXISTS "{_TRIGGER}{table}_{event.lower()}" '
                    f"BEFORE {event} ON \"{table}\" BEGIN SELECT RAISE(ABORT, '{message}'); END"
                )

    db.run_write(run)


def _unblock(db: Any) -> None:
    def run(tx: Any) -> None:
        for (name,) in tx.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE ?",
            (_TRIGGER + "%",),
        ):
            tx.execute(f'DROP TRIGGER IF EXISTS "{name}"')

    db.run_write(run)


def _wal_bytes(path: Path) -> int:
    try:
        return os.stat(f"{path}-wal").st_size
    except FileNotFoundError:
        return 0


def _checkpoint_all(db: Any, path: Path, budget: float) -> None:
    """Every frame of the WAL into the file, and the WAL truncated: the file alone
    then holds every row (its -wal may be left behind).  A reader holding an old
    snapshot makes this wait, up to *budget* seconds."""
    started = time.monotonic()
    while True:
        db.checkpoint(truncate=True)
        if _wal_bytes(path) == 0:
            return
        waited = time.monotonic() - started
        if waited > budget:
            raise errors.StoreBusy(str(path), waited, 1, stage="a checkpoint of the whole WAL")
        time.sleep(0.01)


def _move(src: Path, dst: Path) -> None:
    """Rename the database *src* with its -wal and -shm to *dst* (copied if they are
    on different file systems: then without -wal and -shm, the WAL being empty)."""
    try:
        for suffix in _SUFFIXES:
            with contextlib.suppress(FileNotFoundError):
                os.rename(f"{src}{suffix}", f"{dst}{suffix}")
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
        # Created 0600, never readable by others for a moment (sessions carry secrets).
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            with open(src, "rb") as source, os.fdopen(fd, "wb", closefd=False) as out:
                shutil.copyfileobj(source, out, 1 << 20)
            os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        finally:
            os.close(fd)
        os.replace(tmp, dst)
        for suffix in _SUFFIXES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{src}{suffix}")
    fsync_dir(dst.parent)
    fsync_dir(src.parent)
    announce_moved(f"{src}.gate")  # its writers and readers look, and find it gone


def _copy_blobs(rows: Sequence[Any], src: BlobStore, dst: BlobStore) -> tuple[int, int]:
    """Each blob of *rows* (sha256, size) into *dst* (hard-linked where it can be),
    checked against its hash; (blobs, bytes stored)."""
    n = stored = 0
    for sha, size in rows:
        sha, size = str(sha), int(size)
        target = dst.path(sha)
        if not (target.exists() and dst.verify(sha)):
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
            private_dirs(target.parent)
            try:
                os.link(src.path(sha), target)
            except OSError:
                dst.put_stored(sha, src.read_stored(sha), size)
            if not dst.verify(sha):
                target.unlink()  # a damaged source file, linked: copy the bytes, checked
                dst.put_stored(sha, src.read_stored(sha), size)
        n += 1
        stored += target.stat().st_size
    return n, stored


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _digests(store: Store, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for sid in ids:
        digest = session_digest(store, sid)
        if digest is not None:
            out[sid] = {"messages": digest.messages, "sha256": digest.sha256}
    return out


def _forget(store: Store, ids: Sequence[str]) -> None:
    """This process's router looks these sessions up again."""
    router = _router(store)
    for sid in ids:
        router.home(sid, fresh=True)


def archive_tree(store: Store, session_id: str, dest: str | os.PathLike[str]) -> TreeArchive:
    """Move the file of *session_id*'s tree (its root, subagents and forks) out of
    the sharded *store* into the directory *dest* (created if needed), with a copy of
    every blob it refers to, and drop the tree from the catalog (see the module
    docstring).  ``InvalidInput``: not a sharded store, or a tree the catalog itself
    holds (ADK sessions); ``NotFound``: no such session; ``AlreadyExists``: *dest*
    holds an archive of this tree already; ``TreeBusy``: a write to the tree is
    under way.  Run again after a crash, it carries on."""
    router = _router(store)
    q = store.queries
    target_dir = Path(dest).expanduser().absolute()
    if target_dir.exists() and not target_dir.is_dir():
        raise errors.InvalidInput(f"{target_dir} is not a directory")
    store.sync_catalog()
    key = router.home(session_id, fresh=True)
    if key is None:
        if store.read(lambda tx: tx.execute(q["session_get"], (session_id,))):
            raise errors.InvalidInput(
                f"session {session_id!r} lives in the catalog (an ADK session, with its app "
                "and user state), not in a file of its own: it cannot be archived alone"
            )
        raise errors.NotFound(f"no session {session_id!r} in {store.url}")
    shards = router.shards
    path = shards.path_of(key)
    archive = target_dir / f"{key}.db"
    manifest = target_dir / f"{key}.json"
    resumed = not path.exists()
    if resumed:
        if not (archive.is_file() and manifest.is_file()):
            raise errors.NotFound(
                f"the shard {key} of session {session_id!r} is missing ({path}) and is not "
                f"in {target_dir} either"
            )
    else:
        if archive.exists() or any(Path(f"{archive}{s}").exists() for s in _SUFFIXES[1:]):
            raise errors.AlreadyExists(
                f"{archive} exists (an archive of this tree); restore it or remove it first. "
                "Nothing was moved."
            )
        if store.db.read(
            lambda tx: [r for r in tx.execute(q["shard_intents"]) if str(r[1]) == key]
        ):
            raise TreeBusy(
                f"a write to the tree of shard {key} is under way (in the catalog's "
                "shard_intents); nothing was moved: try again"
            )
        private_dirs(target_dir)
        _archive_file(store, key, path, archive, manifest)
    info = json.loads(manifest.read_text(encoding="utf-8"))
    ids = sorted(info["sessions"])
    # The file is gone from its place: the index of the shard becomes empty.
    shards.drop(key)
    router.reindex([key])
    _forget(store, ids)
    return TreeArchive(
        key=key,
        archive=str(archive),
        sessions=len(ids),
        messages=sum(int(d["messages"]) for d in info["sessions"].values()),
        blobs=int(info["blobs"]),
        blob_bytes=int(info["blob_bytes"]),
        resumed=resumed,
    )


def _archive_file(store: Store, key: str, path: Path, archive: Path, manifest: Path) -> None:
    router = _router(store)
    q = store.queries
    budget = store.settings.write_budget
    with router.shards.use(key, create=False) as db:
        _block(db, key)
        moved = False
        try:
            ids = [str(r[0]) for r in db.read(lambda tx: tx.execute(q["shard_session_rows"]))]
            blobs = db.read(lambda tx: tx.execute("SELECT sha256, size FROM blobs ORDER BY 1"))
            digests = _digests(store, ids)
            assert isinstance(store.blobs, BlobStore)
            copies = BlobStore(
                archive.with_name(f"{key}.blobs"),
                store.settings.max_payload_bytes,
                keyring=store.keyring,
            )
            n, stored = _copy_blobs(blobs, store.blobs, copies)
            _write_json(
                manifest,
                {
                    "format": ARCHIVE_FORMAT,
                    "version": ARCHIVE_VERSION,
                    "key": key,
                    "store": store.url,
                    "archived_at": datetime.datetime.now(datetime.UTC).isoformat(),
                    "sessions": digests,
                    "blobs": n,
                    "blob_bytes": stored,
                },
            )
            _checkpoint_all(db, path, budget)
            # Writers queue on the gate meanwhile, then find the triggers; a write
            # committed since the checkpoint would have to get past them, so the WAL
            # is still empty (checked, the file must hold every row).
            with db.write():
                if _wal_bytes(path):
                    raise errors.StoreBusy(str(path), 0.0, 1, stage="an empty WAL")
                _move(path, archive)
                moved = True
            crash_point("after-move")
        except BaseException:
            if not moved:
                with contextlib.suppress(errors.FleetstoreError, OSError):
                    _unblock(db)
                with contextlib.suppress(OSError):
                    manifest.unlink()
            raise


# -- restoring a tree ------------------------------------------------------------------------


def _archive_paths(archive: Path) -> tuple[str, Path, Path]:
    if archive.suffix != ".db":
        raise errors.InvalidInput(f"{archive}: an archived tree is a <key>.db file")
    key = archive.stem
    return key, archive.with_name(f"{key}.blobs"), archive.with_name(f"{key}.json")


def restore_tree(store: Store, archive: str | os.PathLike[str]) -> TreeArchive:
    """Move an archived tree (``<dir>/<key>.db``, as ``archive_tree`` left it) back
    into the sharded *store*: its blobs first (checked against their hashes), then
    its file, then its index in the catalog; the result's ``problems`` name the
    sessions whose content digest differs from the one recorded when archived.
    ``AlreadyExists`` if the store holds one of its sessions (or another file for
    its key) again.  Run again after a crash, it carries on."""
    router = _router(store)
    q = store.queries
    path_in = Path(archive).expanduser().absolute()
    key, blobs_dir, manifest = _archive_paths(path_in)
    path = router.shards.path_of(key)  # InvalidInput for a name that is no shard key
    indexed = store.db.read(lambda tx: tx.execute(q["shard_index_ids"], (key,)))
    resumed = not path_in.exists()
    if resumed:
        if not (path.exists() and manifest.exists() and not indexed):
            raise errors.NotFound(f"no archived tree at {path_in}")
    else:
        if not _fleetstore_file(path_in):
            raise errors.InvalidInput(f"{path_in} is not an archived tree (not a fleetstore file)")
        if indexed:
            raise errors.AlreadyExists(
                f"{store.url} lists sessions in shard {key} already; nothing was restored"
            )
        _restore_file(store, key, path_in, path, blobs_dir)
    router.shards.drop(key)  # a file this process had open before it was archived
    with router.shards.use(key, create=False) as db:
        rows = db.read(lambda tx: tx.execute(q["shard_session_rows"]))
        blob_rows = db.read(lambda tx: tx.execute("SELECT sha256 FROM blobs"))
    router.reindex([key])
    ids = [str(r[0]) for r in rows]
    _forget(store, ids)
    problems: list[str] = []
    info: dict[str, Any] = {}
    if manifest.exists():
        info = json.loads(manifest.read_text(encoding="utf-8"))
        now = _digests(store, ids)
        for sid, want in sorted(info.get("sessions", {}).items()):
            got = now.get(sid)
            if got != want:
                problems.append(
                    f"session {sid}: {want['messages']} messages, {want['sha256'][:12]} when "
                    f"archived; now {'missing' if got is None else got['messages']} "
                    f"{'' if got is None else got['sha256'][:12]}"
                )
    if not problems:
        shutil.rmtree(blobs_dir, ignore_errors=True)
        for leftover in (manifest, Path(f"{path_in}.gate")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
    messages = sum(int(d["messages"]) for d in info.get("sessions", {}).values())
    return TreeArchive(
        key=key,
        archive=str(path_in),
        sessions=len(ids),
        messages=messages,
        blobs=len(blob_rows),
        blob_bytes=int(info.get("blob_bytes", 0)),
        resumed=resumed,
        problems=tuple(problems),
    )


def _restore_file(store: Store, key: str, archive: Path, path: Path, blobs_dir: Path) -> None:
    q = store.queries
    # No migrations: the shard gets them on its next use.
    db = Database.open(archive, encryption_key_file=store.settings.encryption_key_file)
    try:
        rows = db.read(lambda tx: tx.execute(q["shard_session_rows"]))
        if not rows:
            raise errors.InvalidInput(f"{archive} holds no session")
        strays = sorted({str(r[2]) for r in rows if shard_key(str(r[2])) != key})
        if strays:
            raise errors.InvalidInput(
                f"{archive} is not the archived tree {key}: it holds the tree(s) of "
                f"{', '.join(strays[:3])}; nothing was restored"
            )
        ids = [str(r[0]) for r in rows]

        def present(tx: Any) -> list[str]:
            return [sid for sid in ids if tx.execute(q["session_get"], (sid,))]

        taken = store.db.read(present)
        if taken:
            raise errors.AlreadyExists(
                f"{store.url} holds session(s) of this tree again ({', '.join(taken[:3])}); "
                "nothing was restored"
            )
        if path.exists():
            _vacate(store, key, path)
        blobs = db.read(lambda tx: tx.execute("SELECT sha256, size FROM blobs ORDER BY 1"))
        assert isinstance(store.blobs, BlobStore)
        _copy_blobs(
            blobs,
            BlobStore(blobs_dir, store.settings.max_payload_bytes, keyring=store.keyring),
            store.blobs,
        )
        _unblock(db)
        _checkpoint_all(db, archive, store.settings.write_budget)
        private_dirs(path.parent)
        with db.write():
            _move(archive, path)
        crash_point("after-restore-move")
    finally:
        db.close()


def _vacate(store: Store, key: str, path: Path) -> None:
    """Remove a shard file that a process made again at the tree's path after it was
    archived (a write to the tree by a process that still knew its shard): it must
    hold no session.  Blocked first, so a write to it meanwhile fails loudly."""
    db = Database.open(path, encryption_key_file=store.settings.encryption_key_file)
    try:
        if db.read(lambda tx: tx.execute("SELECT 1 FROM sessions LIMIT 1")):
            raise errors.AlreadyExists(
                f"{path} holds sessions of another tree with the same key; nothing was restored"
            )
        _block(db, key)
        for suffix in _SUFFIXES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")
    finally:
        db.close()


__all__ = [
    "ARCHIVED",
    "TreeArchive",
    "TreeBusy",
    "archive_tree",
    "restore_tree",
]
