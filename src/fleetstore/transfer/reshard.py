"""Changing a store's layout.

``reshard(SRC, DST)`` copies a store into the other SQLite layout: a single file
(``store.db``) into a sharded directory (``sqlite+sharded:///DIR``: a catalog and a
file per session tree), or back; ``sqlite+sharded://`` or ``sqlite://`` on DST
chooses the layout explicitly (sharded to sharded too).  It is ``fleetstore migrate``
(fleetstore.transfer.migrate: batches through the write path, resumable after kill -9, every
table counted and hashed on both sides, every blob read back against its hash),
which knows the sharded layout, plus what a change of layout needs: DST must not
exist, or be empty (or hold an interrupted reshard of the same SRC, which this run
continues), and the verification also compares every session's content digest read
through the Store API on both sides, and checks that a sharded DST's catalog index
names exactly the sessions each shard holds.

Moving one session tree out of a sharded store and back is fleetstore.transfer.archive.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fleetstore import errors
from fleetstore.core.targets import CATALOG, SHARDED_SCHEME, parse_target
from fleetstore.engine.sqlite import Database
from fleetstore.transfer.archive import _fleetstore_file
from fleetstore.transfer.migrate import run as _migrate
from fleetstore.transfer.migrate.report import (
    DEFAULT_BATCH_ROWS,
    DestinationNotEmpty,
    MigrateReport,
    Progress,
)
from fleetstore.transfer.migrate.schema import PROGRESS_TABLE


def destination(dst: str | os.PathLike[str], src_kind: str) -> str:
    """DST as a store URL: as given if it is one, else a path taken in the other
    layout than SRC's (a single file's SRC: a sharded directory, and back)."""
    text = os.fspath(dst)
    if "://" in text:
        kind, _ = parse_target(text)
        if kind == "postgresql":
            raise errors.InvalidInput(
                "reshard writes a SQLite layout; to copy into PostgreSQL use fleetstore migrate"
            )
        return text
    if not text:
        raise errors.ConfigError("an empty store path")
    path = Path(text).expanduser().absolute()
    if src_kind == "sqlite":
        return f"{SHARDED_SCHEME}://{path}"
    return f"sqlite://{path}"


def _check_fresh(url: str, src_id: str) -> None:
    """DST must not exist, or be empty, or hold an interrupted reshard (migrate) of
    SRC; else ``DestinationNotEmpty``, before anything is opened or written."""
    kind, target = parse_target(url)
    assert isinstance(target, Path)
    if kind == "sharded":
        directory = target.expanduser().absolute()
        if not directory.exists():
            return
        if not directory.is_dir():
            raise DestinationNotEmpty(f"DST {directory} is a file, not a directory")
        if not any(directory.iterdir()):
            return
        catalog = directory / CATALOG
        if not catalog.is_file():
            raise DestinationNotEmpty(
                f"DST {directory} holds other files; reshard into a new or empty directory. "
                "Nothing was written."
            )
        _check_store(catalog, src_id, any((directory / "shards").glob("*/*.db")))
        return
    path = target
    if not path.exists() or (path.is_file() and path.stat().st_size == 0):
        return
    _check_store(path, src_id, False)


def _check_store(path: Path, src_id: str, shards: bool) -> None:
    if not _fleetstore_file(path):
        raise DestinationNotEmpty(
            f"DST {path} exists and is not a fleetstore database; nothing was written"
        )
    db = Database.open(path)  # no migrations: read only what is there
    try:

        def run(tx: Any) -> tuple[str | None, list[str]]:
            names = [
                str(r[0])
                for r in tx.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' "
                    "AND name NOT LIKE 'sqlite%' ORDER BY name"
                )
            ]
            source = None
            if PROGRESS_TABLE in names:
                rows = tx.execute(f"SELECT value FROM {PROGRESS_TABLE} WHERE item = 'source'")
                source = str(rows[0][0]) if rows else None
            holding = [
                n
                for n in names
                if n not in ("fleetstore_migrations", PROGRESS_TABLE)
                and tx.execute(f'SELECT 1 FROM "{n}" LIMIT 1')
            ]
            return source, holding

        source, holding = db.read(run)
    finally:
        db.close()
    if source == src_id:
        return  # an interrupted reshard of this SRC: carried on
    if source is not None:
        raise DestinationNotEmpty(
            f"DST {path} holds a copy of another store ({source}); nothing was written"
        )
    if holding or shards:
        what = ", ".join(holding) if holding else "shard files"
        raise DestinationNotEmpty(
            f"DST {path} already holds data ({what}); reshard into a new, empty store. "
            "Nothing was written."
        )


def reshard(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    progress: Progress | None = None,
    verify: bool = True,
    settings: dict[str, Any] | None = None,
) -> MigrateReport:
    """Copy the SQLite store *src* into *dst* in the other layout (see the module
    docstring), then verify: ``VerificationFailed`` on any difference.  Killed, the
    same call carries on.  ``DestinationNotEmpty`` if *dst* holds anything else."""
    src_kind, _ = parse_target(src)
    if src_kind == "postgresql":
        raise errors.InvalidInput(
            "reshard converts between the SQLite layouts; for PostgreSQL use fleetstore migrate"
        )
    url = destination(dst, src_kind)
    src_id = _migrate.identity(src)
    if _migrate.identity(url) == src_id:
        raise errors.InvalidInput(f"SRC and DST are the same store ({src_id}); nothing was done")
    _check_fresh(url, src_id)
    return _migrate.migrate(
        src, url, batch_rows=batch_rows, progress=progress, verify=verify, settings=settings
    )


def verify_report(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    progress: Progress | None = None,
    settings: dict[str, Any] | None = None,
) -> MigrateReport:
    """Compare *src* with *dst* (taken in the other layout unless a URL says) as
    ``reshard`` verifies its copy; nothing is written."""
    src_kind, _ = parse_target(src)
    url = destination(dst, src_kind)
    return _migrate.verify_report(
        src, url, batch_rows=batch_rows, progress=progress, settings=settings
    )


__all__ = ["destination", "reshard", "verify_report"]
