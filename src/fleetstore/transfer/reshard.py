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

SRC must be at rest: a copy made while a fleet writes to it misses what is written
after each table was copied (a message whose session came later stopped the copy with
"FOREIGN KEY constraint failed", and every later run stopped there again).  So a
reshard refuses to start while another process could write to SRC (``SourceInUse``,
naming each pid: a file of SRC open for writing, its writer gate or write lock held:
``files.processes.writers_of``), and looks again between batches (at most once a
second) and before it records the copy whole and verified.  A run that finds SRC in
use, or whose copy no longer fits SRC (an ``IntegrityError``, ``VerificationFailed``),
records DST as ``stale``; the next run throws it away and copies again.  A run that
carries on an interrupted one (``kill -9``) and finds that SRC changed since starts
over at once.  A DST whose copy was verified (``state`` = ``done``) is never thrown
away: the fleet may be writing to it.  tests/transfer/test_reshard.py::test_a_live_*

Moving one session tree out of a sharded store and back is fleetstore.transfer.archive.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from fleetstore import errors
from fleetstore.core.logs import logger
from fleetstore.core.targets import CATALOG, SHARDED_SCHEME, parse_target
from fleetstore.engine.sqlite import Database
from fleetstore.files.processes import writers_of
from fleetstore.store.sidecars import _DIRS as SIDECAR_DIRS
from fleetstore.store.sidecars import _FILES as SIDECAR_FILES
from fleetstore.transfer.archive import _fleetstore_file
from fleetstore.transfer.migrate import run as _migrate
from fleetstore.transfer.migrate.progress import STALE
from fleetstore.transfer.migrate.report import (
    DEFAULT_BATCH_ROWS,
    DestinationNotEmpty,
    MigrateReport,
    Progress,
    SourceInUse,
    VerificationFailed,
)
from fleetstore.transfer.migrate.schema import PROGRESS_TABLE

log = logger("fleetstore")

#: Seconds between two looks for writers of SRC while the copy runs (each reads
#: every process's descriptors in /proc: a few milliseconds).
GUARD_INTERVAL = 1.0


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


def _check_fresh(url: str, src_id: str, settings: dict[str, Any]) -> str | None:
    """DST must not exist, or be empty, or hold an interrupted reshard (migrate) of
    SRC; else ``DestinationNotEmpty``, before anything is opened or written.  The
    ``state`` of that interrupted reshard (None: DST is new or empty)."""
    kind, target = parse_target(url)
    assert isinstance(target, Path)
    if kind == "sharded":
        directory = target.expanduser().absolute()
        if not directory.exists():
            return None
        if not directory.is_dir():
            raise DestinationNotEmpty(f"DST {directory} is a file, not a directory")
        if not any(directory.iterdir()):
            return None
        catalog = directory / CATALOG
        if not catalog.is_file():
            raise DestinationNotEmpty(
                f"DST {directory} holds other files; reshard into a new or empty directory. "
                "Nothing was written."
            )
        return _check_store(catalog, src_id, any((directory / "shards").glob("*/*.db")), settings)
    path = target
    if not path.exists() or (path.is_file() and path.stat().st_size == 0):
        return None
    return _check_store(path, src_id, False, settings)


def _check_store(path: Path, src_id: str, shards: bool, settings: dict[str, Any]) -> str | None:
    if not _fleetstore_file(path):
        raise DestinationNotEmpty(
            f"DST {path} exists and is not a fleetstore database; nothing was written"
        )
    db = Database.open(path, **settings)  # no migrations: read only what is there
    try:

        def run(tx: Any) -> tuple[str | None, str | None, list[str]]:
            names = [
                str(r[0])
                for r in tx.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' "
                    "AND name NOT LIKE 'sqlite%' ORDER BY name"
                )
            ]
            items: dict[str, str] = {}
            if PROGRESS_TABLE in names:
                rows = tx.execute(
                    f"SELECT item, value FROM {PROGRESS_TABLE} WHERE item IN ('source', 'state')"
                )
                items = {str(k): str(v) for k, v in rows}
            holding = [
                n
                for n in names
                if n not in ("fleetstore_migrations", PROGRESS_TABLE)
                and tx.execute(f'SELECT 1 FROM "{n}" LIMIT 1')
            ]
            return items.get("source"), items.get("state"), holding

        source, state, holding = db.read(run)
    finally:
        db.close()
    if source == src_id:
        return state or "copying"  # an interrupted reshard of this SRC: carried on
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
    return None


def _files(url: str) -> tuple[dict[str, str], list[Path]]:
    """The files of the SQLite store *url*: as ``writers_of`` takes them (role ->
    path; a sharded store's whole directory), and the paths a fresh copy replaces."""
    kind, target = parse_target(url)
    assert isinstance(target, Path)
    # Resolved: /proc names the files a process has open by their real paths.
    path = target.expanduser().resolve()
    if kind == "sharded":
        base = path / CATALOG
        owned = [base, path / "shards"]
        watched = {"store": f"{path}/"}
    else:
        base = path
        owned = [base]
        watched = {"database": str(base), "wal": f"{base}-wal", "gate": f"{base}.gate"}
        watched["shm"] = f"{base}-shm"
        watched["spool"] = f"{base}.spool/"
    owned += [Path(f"{base}{suffix}") for suffix in (*SIDECAR_FILES, *SIDECAR_DIRS)]
    return watched, owned


class _Writers:
    """The guard of a reshard: ``SourceInUse`` when another process could write to
    SRC (migrate's *guard*; ``force`` False looks at most every GUARD_INTERVAL s)."""

    def __init__(self, src_url: str) -> None:
        self.url = src_url
        self.paths, _ = _files(src_url)
        #: What became of DST, for the message: changed once the copy has begun.
        self.outcome = "nothing was written"
        self._last = -GUARD_INTERVAL

    def __call__(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < GUARD_INTERVAL:
            return
        self._last = now
        found = writers_of(self.paths)
        if found:
            raise SourceInUse(
                f"SRC {self.url} is in use: "
                + "; ".join(f"pid {pid} ({cmd or '?'})" for pid, cmd in sorted(found.items()))
                + " could write to it, and a copy would miss what it writes. Stop every "
                f"process writing to SRC, then run reshard again ({self.outcome})",
                found,
            )


def _discard(url: str) -> None:
    """Remove the copy an earlier reshard of the same SRC left in *url* (DST), whose
    progress record the caller read: its database files, sidecars and shards."""
    watched, owned = _files(url)
    users = writers_of(watched)
    if users:
        raise SourceInUse(
            f"DST {url} holds a copy that must be made again, but "
            + "; ".join(f"pid {pid} ({cmd or '?'})" for pid, cmd in sorted(users.items()))
            + " has it open; stop it first",
            users,
        )
    for path in owned:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


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
    same call carries on.  ``DestinationNotEmpty`` if *dst* holds anything else;
    ``SourceInUse`` if another process could write to *src*."""
    src_kind, _ = parse_target(src)
    if src_kind == "postgresql":
        raise errors.InvalidInput(
            "reshard converts between the SQLite layouts; for PostgreSQL use fleetstore migrate"
        )
    url = destination(dst, src_kind)
    src_id = _migrate.identity(src)
    if _migrate.identity(url) == src_id:
        raise errors.InvalidInput(f"SRC and DST are the same store ({src_id}); nothing was done")
    state = _check_fresh(url, src_id, settings or {})
    guard = _Writers(os.fspath(src))
    guard(True)
    guard.outcome = "what this run copied is thrown away then, and copied again"
    restarted = None
    if state == STALE:
        restarted = "an earlier run found SRC in use, or its copy no longer fitting SRC"
        log.warning("reshard: DST %s: %s; copying again", url, restarted)
        _discard(url)
        state = None

    def copy() -> MigrateReport:
        return _migrate.migrate(
            src,
            url,
            batch_rows=batch_rows,
            progress=progress,
            verify=verify,
            settings=settings,
            guard=guard,
        )

    try:
        report = copy()
    except (errors.IntegrityError, VerificationFailed) as exc:
        if state in (None, "done"):
            raise  # nothing carried on (or a copy the fleet may be using now)
        # It carried on a run that was interrupted, and SRC changed since (nobody
        # writes to it now: the guard looked): what that run copied is stale.
        restarted = f"the copy an interrupted run left no longer fits SRC ({exc})"
        log.warning("reshard: DST %s: %s; copying again", url, restarted)
        guard(True)
        _discard(url)
        report = copy()
    report.restarted = restarted
    return report


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
