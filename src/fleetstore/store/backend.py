"""One backend per layout, composed into the ``Store`` facade rather than branched on
(diskcache's FanoutCache composes Cache the same way): the facade owns what every
layout shares (the spool, the background thread, streams, figures) and hands each
write, read and lifecycle step to its backend.

* ``store/single.py``: one SQLite file;
* ``store/sharded/``: a catalog plus one SQLite file per session tree;
* ``store/server.py``: a PostgreSQL database.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from fleetstore import errors, sql
from fleetstore.core.settings import Settings
from fleetstore.core.targets import CATALOG
from fleetstore.core.version import __version__
from fleetstore.domain import registry
from fleetstore.domain.blobs import BlobStore, DbBlobStore
from fleetstore.domain.operations import Operation, Result
from fleetstore.engine.base import Applier, Engine, Migration, Tx
from fleetstore.store.sharded.shards import shard_files

T = TypeVar("T")


def _ops_tag() -> str:
    """Which code may apply an operation for another process (group commit): this
    version, and the registry's names and logging (a process of another version, or
    with another set of operations, applies its own)."""
    shape = ",".join(f"{n}:{int(s.logged)}" for n, s in sorted(registry.REGISTRY.items()))
    digest = hashlib.sha256(shape.encode()).hexdigest()[:16]
    return f"fleetstore-ops/{__version__}/{digest}"


#: The group-commit tag of this code's operations.
OPS_TAG = _ops_tag()


class OpItem:
    """An operation as an engine item (``Database.submit``): applied here, or handed,
    as its JSON, to the process that holds the gate."""

    __slots__ = ("op", "queries")

    def __init__(self, op: Operation, queries: Mapping[str, str]) -> None:
        self.op = op
        self.queries = queries

    def run(self, tx: Tx) -> Result:
        return registry.apply(tx, self.queries, self.op, tx.now)

    def payload(self) -> bytes | None:
        if not registry.spec_of(self.op.name).retry_safe:
            return None
        return json.dumps(self.op.to_json(), separators=(",", ":")).encode("utf-8")

    def result(self, data: bytes) -> Result:
        value = json.loads(data)
        return value if isinstance(value, dict) else {}


def op_applier(queries: Mapping[str, str]) -> Applier:
    """Applies the operations other processes hand over (``OpItem.payload``)."""

    def apply(tx: Tx, payload: bytes) -> bytes:
        op = registry.decode(json.loads(payload))
        result = registry.apply(tx, queries, op, tx.now)
        return json.dumps(result, separators=(",", ":"), default=str).encode("utf-8")

    return apply


def blobs_durable(settings: Settings) -> bool:
    """Whether a blob file must be durable before the transaction that refers to it:
    under ``synchronous=NORMAL`` (or OFF) no commit is durable before a checkpoint, so
    the files are synced before each checkpoint instead (``BlobStore.sync``)."""
    return settings.synchronous.upper() in ("FULL", "EXTRA")


def wal_file_bytes(path: str | os.PathLike[str]) -> int:
    """The size of the database at *path*'s -wal file (0: there is none)."""
    try:
        return os.stat(os.fspath(path) + "-wal").st_size
    except OSError:
        return 0


@dataclass(frozen=True, slots=True)
class StoreFiles:
    """What a SQLite store keeps on disk, found without opening it (``store_files``):
    the tools that must not open a store (backup, rekey, lock) ask this rather
    than knowing where each layout puts its files."""

    layout: str  # "file" or "sharded"
    #: The store file, or a sharded store's catalog.
    main: Path
    #: (key, path) of each shard file on disk, by key (``shards.shard_files``).
    shards: tuple[tuple[str, Path], ...] = ()

    @property
    def root(self) -> Path:
        """The directory the store's files are in (a sharded store: the store)."""
        return self.main.parent

    @property
    def databases(self) -> list[Path]:
        """Every database file: the main one, then each shard by key."""
        return [self.main, *(path for _key, path in self.shards)]

    @property
    def blobs(self) -> Path:
        return Path(f"{self.main}.blobs")

    @property
    def spool(self) -> Path:
        return Path(f"{self.main}.spool")


def store_files(kind: str, target: Path) -> StoreFiles:
    """The files of the SQLite store *target* of *kind* ("sqlite" or "sharded", as
    ``core.targets.parse_target`` says), absolute.  ``NotFound`` if there is none:
    no file, or no catalog in the directory."""
    target = target.absolute()
    if kind == "sharded":
        if not (target / CATALOG).is_file():
            raise errors.NotFound(f"no sharded store at {target} (no {CATALOG})")
        return StoreFiles("sharded", target / CATALOG, tuple(shard_files(target)))
    if not target.is_file():
        raise errors.NotFound(f"no store at {target}")
    return StoreFiles("file", target)


def migrations(dialect: str = "sqlite") -> list[Migration]:
    """The store's schema steps for *dialect*, in order."""
    return list(sql.migrations(dialect))


class Backend(Protocol):
    """What the facade needs of a layout."""

    #: "file" (one SQLite file), "sharded" (a directory) or "server" (PostgreSQL).
    layout: str
    #: The database the store names (a sharded store: its catalog).
    db: Engine
    #: The store file (sharded: the catalog) or this host's base path for a server
    #: store: the spool, the published figures and the blob files live beside it.
    path: Path
    #: What messages name: the file, the directory URL, or the URL without password.
    url: str
    blobs: BlobStore | DbBlobStore

    def apply(self, op: Operation) -> Result:
        """Apply *op* now (``StoreBusy`` past the write budget)."""
        ...

    def read(self, fn: Callable[[Tx], T], session_id: str | None) -> T:
        """``fn(tx)`` in one read transaction of the file holding *session_id*."""
        ...

    def read_first(self, fn: Callable[[Tx], list[T]]) -> list[T]:
        """``fn(tx)`` on each file until one returns rows."""
        ...

    def sync_catalog(self, timeout: float | None) -> bool:
        """Bring the layout's index up to date with this process's writes."""
        ...

    def recover(self) -> int:
        """Finish the writes that processes which died left half-done; how many."""
        ...

    def search_files(
        self, *, session_id: str | None, root_id: str | None, project: str | None
    ) -> list[str | None]:
        """The files a search with these filters reads (None: ``db``)."""
        ...

    def with_file(self, key: str | None, fn: Callable[[Engine], T]) -> T:
        """``fn(db)`` with file *key*'s database."""
        ...

    # -- the files, for the tools that work file by file (admin, transfer) ----------------

    #: Whether the store is more than one database, so that no transaction spans it
    #: (a sharded store): the tools then work file by file.
    spans_files: bool

    def file_keys(self) -> list[str | None]:
        """The key of each database file: None (the store's own database: the file,
        the catalog or the server's), then a sharded store's shards on disk, by key."""
        ...

    def use(self, key: str | None, *, create: bool = False) -> AbstractContextManager[Engine]:
        """File *key*'s database while the ``with`` block lasts (*create*: a shard that
        is not there yet is made; else ``NotFound``)."""
        ...

    def each(self, fn: Callable[[str | None, Any], None]) -> None:
        """``fn(key, database)`` for every database file, in ``file_keys`` order, one open
        at a time (linear in shards)."""
        ...

    def home(self, session_id: str | None) -> str | None:
        """The key of the file holding *session_id*'s tree (None: the store's own)."""
        ...

    def metrics(self) -> dict[str, Any]:
        """The engine's figures for this process (every file of the layout)."""
        ...

    def wal_bytes(self) -> int:
        """The bytes of the layout's -wal files on disk now (0 on PostgreSQL)."""
        ...

    def after_fork(self) -> None:
        """In a forked child: drop the parent's per-process state."""
        ...

    def close(self, *, sync: bool) -> None:
        """Close every file or connection (*sync*: the store is not known to be locked,
        so a last index refresh may wait for it)."""
        ...


class OneDatabase:
    """A layout of one database: every write and read goes to it."""

    layout = "file"
    spans_files = False

    def __init__(self, db: Engine, queries: Mapping[str, str], path: Path) -> None:
        self.db = db
        self.queries = queries
        self.path = path
        self.url = db.path
        self.blobs: BlobStore | DbBlobStore

    def apply(self, op: Operation) -> Result:
        # On PostgreSQL the function may run again (serialization failure, lost
        # connection); operations are idempotent by op_id, so a rerun is safe.
        q = self.queries
        spec = registry.spec_of(op.name)
        return self.db.run_write(
            lambda tx: registry.apply(tx, q, op, tx.now), single_statement=spec.single_statement
        )

    def read(self, fn: Callable[[Tx], T], session_id: str | None) -> T:
        return self.db.read(fn)

    def read_first(self, fn: Callable[[Tx], list[T]]) -> list[T]:
        return self.db.read(fn)

    def sync_catalog(self, timeout: float | None) -> bool:
        return True

    def recover(self) -> int:
        return 0

    def search_files(
        self, *, session_id: str | None, root_id: str | None, project: str | None
    ) -> list[str | None]:
        return [None]

    def with_file(self, key: str | None, fn: Callable[[Engine], T]) -> T:
        return fn(self.db)

    def file_keys(self) -> list[str | None]:
        return [None]

    @contextlib.contextmanager
    def use(self, key: str | None, *, create: bool = False) -> Iterator[Engine]:
        yield self.db

    def each(self, fn: Callable[[str | None, Any], None]) -> None:
        fn(None, self.db)

    def home(self, session_id: str | None) -> str | None:
        return None

    def metrics(self) -> dict[str, Any]:
        return self.db.metrics()

    def wal_bytes(self) -> int:
        return wal_file_bytes(self.db.path) if self.db.dialect == "sqlite" else 0

    def after_fork(self) -> None:
        pass  # the engine's own at-fork hook resets its connections

    def close(self, *, sync: bool) -> None:
        self.db.close()


__all__ = [
    "OPS_TAG",
    "Backend",
    "OneDatabase",
    "OpItem",
    "StoreFiles",
    "blobs_durable",
    "migrations",
    "op_applier",
    "store_files",
    "wal_file_bytes",
]
