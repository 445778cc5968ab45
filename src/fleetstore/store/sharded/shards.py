"""Many SQLite files as one store: a catalog database plus one database per shard.

This module knows files and keys, not what is in them: a shard is named by an
opaque key (``is_key``), lives at ``<dir>/shards/<last two characters>/<key>.db``, is
created and migrated on first use (``Database.open`` applies each migration
once across processes starting together) and kept open in a bounded cache.
Which rows go to which shard is decided by the router beside it (``fleetstore.store.sharded.router``).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fleetstore import errors
from fleetstore.core.files import private_dirs
from fleetstore.core.metrics import WriteMetrics
from fleetstore.core.targets import CATALOG, SHARDS
from fleetstore.engine.base import Applier
from fleetstore.engine.sqlite import Database, Migration

_SAFE_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
#: Endings no key has: ``..`` would make the key's directory (its last two
#: characters) ``shards/..``, the store's own directory (issue 23: a session id
#: ending in ``..`` put its file outside ``shards/``); the others end like SQLite's
#: files.
_NOT_KEY_ENDINGS = ("..", ".db", "-wal", "-shm")


def is_key(name: str) -> bool:
    """Is *name* a shard key?  Then ``shards/<its last two characters>/<name>.db`` is
    a plain file in a plain directory of ``shards/``: ASCII letters, digits, ``_``,
    ``-`` and ``.``, a letter or digit first (no ``.``, ``..`` or hidden file), up to
    100 characters, never ending in ``..``."""
    return bool(_SAFE_KEY.fullmatch(name)) and not name.endswith(_NOT_KEY_ENDINGS)


def shard_key(name: str) -> str:
    """The shard key for *name* (a root session id): the name itself when it is a key
    (so every key a store has used stays its file's name), else a hash of it (ids may
    hold any printable character).  tests/store/test_sharded_router.py"""
    if is_key(name):
        return name
    return "h" + hashlib.sha256(name.encode()).hexdigest()[:40]


def shard_path(root: Path, key: str) -> Path:
    """Where shard *key*'s file is in the sharded store at *root*; ``InvalidInput``
    for a name that is no key (one from a damaged catalog or an archive's name)."""
    if not is_key(key):
        raise errors.InvalidInput(f"not a shard key: {key!r}")
    return root / SHARDS / key[-2:] / f"{key}.db"


def shard_files(root: Path) -> list[tuple[str, Path]]:
    """(key, path) of every shard file of the sharded store at *root*, by key: each
    file at the path its key names (another file there is not a shard)."""
    found = []
    for path in (root / SHARDS).glob("*/*.db"):
        key = path.name[:-3]
        if is_key(key) and path.parent.name == key[-2:]:
            found.append((key, path))
    return sorted(found)


class ShardSet:
    """The catalog and the shard databases of a sharded store directory."""

    def __init__(
        self,
        root: Path,
        migrations: Sequence[Migration],
        settings: dict[str, Any],
        max_open: int = 64,
        serve: tuple[str, Applier] | None = None,
        before_checkpoint: Callable[[], None] | None = None,
    ) -> None:
        self.root = root
        self._before_checkpoint = before_checkpoint
        #: Group commit in every file (``Database.serve``): the tag and the applier.
        self._serve = serve
        self.migrations = list(migrations)
        self.settings = settings
        self.max_open = max(1, max_open)
        try:
            private_dirs(root)
        except OSError as exc:  # (a raw PermissionError; a file store's open says why)
            raise errors.DatabaseError(
                f"{root}: cannot make the store's directory: {exc}"
            ) from None
        self.catalog = Database.open(root / CATALOG, self.migrations, **settings)
        self._share(self.catalog)
        if serve is not None:
            self.catalog.serve(*serve)
        if before_checkpoint is not None:
            self.catalog.before_checkpoint(before_checkpoint)
        self._lock = threading.Lock()
        self._open: collections.OrderedDict[str, Database] = collections.OrderedDict()
        self._users: collections.Counter[str] = collections.Counter()
        self._opened_total = 0
        self._stale: dict[str, list[Database]] = {}
        self._closed = False

    def path_of(self, key: str) -> Path:
        return shard_path(self.root, key)

    def keys(self) -> list[str]:
        """The keys of the shard files on disk, sorted."""
        return [key for key, _ in shard_files(self.root)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def exists(self, key: str) -> bool:
        """Is there a file for shard *key*?  (Never, for a name that is no key: a
        catalog row written before such names were refused names no file of ours.)"""
        return is_key(key) and self.path_of(key).is_file()

    @contextlib.contextmanager
    def use(self, key: str, *, create: bool = True) -> Iterator[Database]:
        """The shard *key*'s database, opened (and created, if *create*) on first use.
        While a caller uses it, the cache does not close it."""
        db = self._acquire(key, create)
        try:
            yield db
        finally:
            self._release(key)

    def _acquire(self, key: str, create: bool) -> Database:
        if not is_key(key):
            # A catalog row of a version that let an id ending in ".." be a key: its
            # file is not in shards/, so there is none (doctor shows where it was).
            raise errors.NotFound(f"no shard {key!r} in {self.root}: not a shard key")
        path = self.path_of(key)
        with self._lock:
            if self._closed:
                raise errors.StoreClosed(f"{self.root}: the store was closed")
            db = self._open.get(key)
            if db is not None:
                self._open.move_to_end(key)
                self._users[key] += 1
                return db
        if not create and not path.is_file():
            raise errors.NotFound(f"no shard {key!r} in {self.root}")
        # Opened outside the lock: a first open may wait on another process migrating
        # the same new file, and other shards must not wait behind it.
        fresh = Database.open(path, self.migrations, **self.settings)
        self._share(fresh)
        if self._serve is not None:
            fresh.serve(*self._serve)
        if self._before_checkpoint is not None:
            fresh.before_checkpoint(self._before_checkpoint)
        evicted: list[Database] = []
        with self._lock:
            db = self._open.get(key)
            if db is None:
                db = self._open[key] = fresh
                self._opened_total += 1
            else:
                evicted.append(fresh)  # another thread opened it first
            self._open.move_to_end(key)
            self._users[key] += 1
            # Close the least recently used idle shards past the bound; shards in use
            # stay open (the bound is exceeded while more than max_open are busy).
            for other in list(self._open):
                if len(self._open) <= self.max_open:
                    break
                if self._users[other] == 0:
                    evicted.append(self._open.pop(other))
        for old in evicted:
            old.close()
        return db

    def _share(self, db: Database) -> None:
        db.shared_metrics = self.catalog.shared_metrics or db._metrics
        db._metrics = db.shared_metrics

    def _release(self, key: str) -> None:
        with self._lock:
            self._users[key] -= 1
            stale: list[Database] = []
            if self._users[key] <= 0:
                del self._users[key]
                stale = self._stale.pop(key, [])
        for db in stale:
            db.close()

    def drop(self, key: str) -> None:
        """Forget the open database of shard *key* (its file was moved): closed now,
        or when its last user is done; the next use opens whatever is at the path."""
        with self._lock:
            db = self._open.pop(key, None)
            if db is not None and self._users[key]:
                self._stale.setdefault(key, []).append(db)
                db = None
        if db is not None:
            db.close()

    def discard(self, key: str) -> None:
        """Close and remove shard *key*'s files: only for a shard this process just
        created and nothing refers to (a first write into it was refused)."""
        if not is_key(key):
            return  # names no file (a catalog row of an older version)
        with self._lock:
            if self._users[key]:
                return
            db = self._open.pop(key, None)
        if db is not None:
            db.close()
        path = self.path_of(key)
        for suffix in ("", "-wal", "-shm", ".gate"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(str(path) + suffix)

    def open_count(self) -> int:
        with self._lock:
            return len(self._open)

    def metrics(self) -> dict[str, Any]:
        """The write figures of the catalog and every shard this process used (one
        set: the files share their WriteMetrics)."""
        total: dict[str, Any] = dict(self.catalog.metrics())
        with self._lock:
            total["shards_open"] = len(self._open)
            total["shards_opened"] = self._opened_total
        return total

    def after_fork(self) -> None:
        # Each Database resets itself in a child on next use; the use counts of the
        # parent's threads do not apply here.
        with self._lock:
            self._users.clear()
            dbs = [self.catalog, *self._open.values()]
        fresh = WriteMetrics()
        for db in dbs:
            db.shared_metrics = db._metrics = fresh

    def close(self) -> None:
        with self._lock:
            self._closed = True
            dbs = list(self._open.values())
            self._open.clear()
        for db in dbs:
            db.close()
        self.catalog.close()
