"""A store opened only to read it, writing nothing to any file: what the commands that
read (``stats``, ``sessions list``, ``export``, ...) open, and the check every command
that needs an existing store makes first.

``fleetstore.open`` creates and migrates: pointed at another program's SQLite file it
switched the file to WAL and added fleetstore's tables.  Here every read goes through
``fleetstore.files.foreign`` (strictly read-only: no gate file, no -wal or -shm
created, the -shm never written, no journal replayed, no figures published), and a
file without fleetstore's tables is refused with ``NotAStore`` before anything is
opened for writing.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

from fleetstore import errors, sql
from fleetstore.core.keys import Keyring, keyring_of
from fleetstore.core.settings import Settings
from fleetstore.core.targets import CATALOG, parse_target, sharded_url
from fleetstore.domain.blobs import BlobStore
from fleetstore.domain.operations import Operation, Result
from fleetstore.engine import cipher
from fleetstore.engine.base import Tx, check_not_newer
from fleetstore.engine.sqlite import Database
from fleetstore.files.foreign import FileChanged, ForeignFile
from fleetstore.files.inspect import (
    InspectFailed,
    ReadOnlyDatabase,
    check_not_open_here,
    open_readonly,
)
from fleetstore.store.backend import OneDatabase, migrations
from fleetstore.store.facade import Store
from fleetstore.store.sharded.router import Router
from fleetstore.store.sharded.shards import ShardSet

T = TypeVar("T")

#: The tables every fleetstore store has (doctor knows a store by the same three).
STORE_TABLES = frozenset({"sessions", "applied_ops", "fleetstore_migrations"})
#: An immutable read (no -wal or -shm to read through) that a checkpoint overlapped
#: is tried again this many times.
_ATTEMPTS = 5


def _refusal(path: str, why: str) -> errors.NotAStore:
    return errors.NotAStore(f"{path}: not a fleetstore store ({why}); nothing was written to it")


def check_store_file(
    path: str | os.PathLike[str],
    *,
    unless_open_here: bool = False,
    keyring: Keyring | None = None,
    plain_ok: bool = False,
) -> None:
    """Raise ``NotAStore`` unless *path* is a SQLite file holding fleetstore's tables,
    read strictly read-only (``NotFound`` if there is no such file).  A WAL file whose
    -shm is gone is judged by its main file (the tables are made by the first
    transaction a store ever commits, long checkpointed).  A file this process has
    open cannot be read here without dropping its SQLite locks: ``PermanentError``,
    or, with *unless_open_here* (the caller opened it as a store), no check.  An
    encrypted file is read with the key of *keyring* that opens it (``KeyMissing``
    without one, ``WrongKey``); a plain one with a keyring is ``NotEncrypted``, unless
    *plain_ok* (a rekey that encrypts it)."""
    path = os.fspath(path)
    if unless_open_here:
        real = os.path.realpath(path)
        try:
            check_not_open_here([real, real + "-wal", real + "-shm"])
        except errors.PermanentError:
            return
    key = cipher.key_of_file(path, keyring, strict=not plain_ok)
    try:
        foreign = ForeignFile(path, key)
    except InspectFailed as exc:
        raise _refusal(path, "empty file" if exc.reason == "empty" else "not a database") from None

    def tables(db: ReadOnlyDatabase) -> set[str]:
        return {str(r[0]) for r in db.query("SELECT name FROM sqlite_schema WHERE type='table'")}

    for attempt in range(_ATTEMPTS):
        try:
            if foreign.mode is None:
                with open_readonly(path, "immutable", key=key) as db:
                    found = tables(db)
            else:
                found = foreign.read(tables)
            break
        except FileChanged:
            if attempt == _ATTEMPTS - 1:
                raise
            foreign = ForeignFile(path, key)
        except InspectFailed as exc:
            if exc.reason in ("not-a-database", "corrupt"):
                raise _refusal(path, str(exc)) from None
            raise
    missing = STORE_TABLES - found
    if missing:
        what = "another program's SQLite file" if found else "a SQLite file without tables"
        raise _refusal(path, f"{what}: no {', '.join(sorted(missing))} table")


class _ReadTx:
    """A read transaction of a ``ReadOnlyFile`` (the engine's ``Tx``, reads only)."""

    def __init__(self, db: ReadOnlyDatabase) -> None:
        self._db = db
        self.now = time.time()
        self.uncertain = False

    def execute(
        self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
    ) -> list[tuple[Any, ...]]:
        return self._db.query(sql, cast(Sequence[Any], params))

    def executemany(
        self, sql: str, seq_of_params: Iterable[Sequence[Any] | dict[str, Any]]
    ) -> None:
        raise errors.ReadOnlyError(f"{self._db.path}: opened read-only")

    def notify(self, channel: str) -> None:
        raise errors.ReadOnlyError(f"{self._db.path}: opened read-only")


class ReadOnlyFile:
    """One SQLite file read strictly read-only, as the engine's ``Engine`` (reads only:
    every write raises ``ReadOnlyError``).  Each read opens its own connection."""

    dialect = "sqlite"

    def __init__(self, path: str, keyring: Keyring | None = None) -> None:
        self.path = os.path.abspath(path)
        self._keyring = keyring
        self._key: bytes | None = None
        self._keyed = keyring is None

    def read(self, fn: Callable[[Tx], T]) -> T:
        if not self._keyed:  # which key of the ring opens this file: once
            self._key, self._keyed = cipher.key_of_file(self.path, self._keyring), True
        for attempt in range(_ATTEMPTS):
            try:
                foreign = ForeignFile(self.path, self._key)
            except InspectFailed as exc:
                raise _refusal(self.path, str(exc)) from None
            try:
                return foreign.read(lambda db: fn(_ReadTx(db)))
            except FileChanged:
                if attempt == _ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def _refuse(self) -> errors.ReadOnlyError:
        return errors.ReadOnlyError(f"{self.path}: opened read-only (a command that only reads)")

    def write(self) -> Any:
        raise self._refuse()

    def run_write(self, fn: Callable[[Tx], T], *, single_statement: bool = False) -> T:
        raise self._refuse()

    notifies = False

    def notify_token(self, channel: str) -> int:
        return 0

    def notify_wait(self, channel: str, timeout: float, token: int | None = None) -> bool:
        time.sleep(timeout)
        return False

    def listen(self, channel: str, fn: Callable[[], None]) -> Callable[[], None]:
        return lambda: None

    def checkpoint(self, *, truncate: bool = False) -> tuple[int, int]:
        raise self._refuse()

    @property
    def schema_version(self) -> int:
        rows = self.read(
            lambda tx: tx.execute("SELECT coalesce(max(version), 0) FROM fleetstore_migrations")
        )
        return int(rows[0][0])

    def metrics(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "path": self.path}

    def histograms(self) -> dict[str, Any]:
        return {}

    def connection_report(self) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        pass


class _ReadOnlyBackend(OneDatabase):
    layout = "file"

    def __init__(self, path: Path, queries: Mapping[str, str], settings: Settings) -> None:
        keyring = keyring_of(settings.encryption_key_file)
        super().__init__(ReadOnlyFile(str(path), keyring), queries, path)
        self.blobs = BlobStore(
            str(path) + ".blobs",
            settings.max_payload_bytes,
            keyring=keyring_of(settings.encryption_key_file),
        )

    def apply(self, op: Operation) -> Result:
        raise errors.ReadOnlyError(f"{self.path}: opened read-only; {op.name} not written")


class _ReadOnlyShards(ShardSet):
    """A sharded store's files, each a ``ReadOnlyFile``; nothing is opened ahead."""

    def __init__(self, root: Path, keyring: Keyring | None) -> None:  # not ShardSet's
        self.root = root
        self._keyring = keyring
        self.catalog = cast(Database, ReadOnlyFile(str(root / CATALOG), keyring))

    @contextlib.contextmanager
    def use(self, key: str, *, create: bool = True) -> Iterator[Database]:
        path = self.path_of(key)
        if not path.is_file():
            raise errors.NotFound(f"no shard {key!r} in {self.root}")
        yield cast(Database, ReadOnlyFile(str(path), self._keyring))

    def drop(self, key: str) -> None:
        pass

    def discard(self, key: str) -> None:
        pass

    def open_count(self) -> int:
        return 0

    def metrics(self) -> dict[str, Any]:
        return {}

    def after_fork(self) -> None:
        pass

    def close(self) -> None:
        pass


def open_read_only(url_or_path: str | os.PathLike[str] | None, **settings: Any) -> Store:
    """The existing store at *url_or_path* (a file or a sharded directory), opened to
    read only.  ``NotFound`` if there is none, ``NotAStore`` if the file is not a
    fleetstore store, ``ConfigError`` for a PostgreSQL URL (reading one writes no
    file; use ``fleetstore.open``).  Writes raise ``ReadOnlyError``; spool journals of
    processes that died are not replayed (``fleetstore recover`` does that)."""
    config = Settings.load(**{**settings, "publish_interval": 0})
    kind, target = parse_target(url_or_path)
    if isinstance(target, str):
        raise errors.ConfigError("open_read_only reads SQLite stores (a file or a directory)")
    catalog = target / CATALOG if kind == "sharded" else target
    if not catalog.is_file():
        raise errors.NotFound(f"no store at {target} (nothing was created)")
    keyring = keyring_of(config.encryption_key_file)
    check_store_file(catalog, keyring=keyring)
    steps = migrations()
    version = ReadOnlyFile(str(catalog), keyring).schema_version
    check_not_newer(str(catalog), version, steps)
    if version < steps[-1].version:
        raise errors.MigrationError(
            f"{catalog}: the store is at schema version {version}, older than this "
            f"fleetstore's {steps[-1].version}; a command that only reads does not migrate "
            "it: open it once with a command that writes (or fleetstore.open)"
        )
    queries = sql.queries("sqlite")
    if kind == "sharded":
        router = Router(_ReadOnlyShards(target, keyring), queries, config)
        router.url = sharded_url(target)
        return Store(router, config)
    return Store(_ReadOnlyBackend(target, queries, config), config)


__all__ = ["STORE_TABLES", "ReadOnlyFile", "check_store_file", "open_read_only"]
