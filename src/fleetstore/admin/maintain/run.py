"""A run of ``fleetstore maintain``: open the database (never creating one), tell a
fleetstore store from a foreign database, then run the steps in order and report.

On a fleetstore store: retention (``archive``, ``delete``), ``ops`` (applied_ops
pruning), ``blobs`` (garbage collection), ``search`` (the search index caught up and
its segments merged) and ``procs`` (the figures files of processes that are gone),
then the generic steps (``optimize``,
``vacuum``, ``checkpoint``).  A dry run writes nothing: no migration, no replay of
dead journals (the store is composed without ``open``), each step saying what it
would do.

On a database that is not a fleetstore store ("foreign") only the generic steps
run (checkpoint, optimize, incremental vacuum when the file has incremental
auto-vacuum), and only when asked to (``yes``), through one plain connection
(``files.outside.OutsideFile``): no writer gate or other file of ours is made beside
it (a ``.gate`` was, issue 28), its journal mode and settings are left as they are.
A foreign file that is not in WAL mode is refused (a fleetstore store always is).

A sharded store (``sqlite+sharded:///DIR``) gets every step on every file: the
catalog, then each shard through ``router.each`` (one open at a time, within the
store's bound on open files), a tree's deletion through the router, blob rows per
file and blob files only once no file refers to them, then the removal of empty
shard files (``shards.empty_shards``).  tests/admin/test_sharded_ops.py."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from fleetstore import errors, sql
from fleetstore.admin.maintain.applied_ops import prune_ops
from fleetstore.admin.maintain.blobs import collect_blobs, default_blob_grace
from fleetstore.admin.maintain.config import Config, NotConfirmed
from fleetstore.admin.maintain.files import gone_processes
from fleetstore.admin.maintain.generic import generic_steps, generic_steps_each
from fleetstore.admin.maintain.report import Progress, Report, Step, timed
from fleetstore.admin.maintain.retention import archive, delete_old
from fleetstore.admin.maintain.search import search_step
from fleetstore.admin.maintain.shards import empty_shards
from fleetstore.admin.maintain.writer import Writer
from fleetstore.core.keys import keyring_of
from fleetstore.core.settings import Settings
from fleetstore.core.targets import CATALOG, SHARDED_SCHEME, parse_target, resolve_target
from fleetstore.engine.sqlite import Database
from fleetstore.files.inspect import InspectFailed, read_header
from fleetstore.files.outside import OutsideFile
from fleetstore.store.backend import migrations
from fleetstore.store.facade import Store
from fleetstore.store.facade import open as open_store
from fleetstore.store.readonly import check_store_file
from fleetstore.store.sharded.router import Router
from fleetstore.store.sharded.shards import ShardSet
from fleetstore.store.single import FileBackend


def _check_file(path: str) -> bool:
    """Whether the SQLite file at *path* is in WAL mode (``CorruptStore`` if it is not
    a SQLite database, plain or encrypted; the header says so without opening it)."""
    try:
        header = read_header(path)
    except InspectFailed:
        header = None
    if header is None:
        raise errors.CorruptStore(f"{path}: not a SQLite database")
    return header.wal


def resolve(path: str | os.PathLike[str] | None) -> str:
    """The database file *path* names; ``NotFound`` if there is none (nothing is created)."""
    target = resolve_target(path)
    if not target.is_file():
        raise errors.NotFound(f"no database at {target}")
    return str(target)


def _is_store(path: str, settings: Settings) -> bool:
    """Is the SQLite file at *path* a fleetstore store?  Read strictly read-only: a
    store's file must pass ``Database.open``'s checks before it is opened for writing,
    and another program's gets nothing of ours beside it."""
    try:
        check_store_file(path, keyring=keyring_of(settings.encryption_key_file))
    except errors.NotAStore:
        return False
    return True


def maintain(config: Config, progress: Progress | None = None) -> Report:
    """Run every maintenance step on the database at ``config.path`` (a sharded store:
    on its catalog and every shard) and report."""
    config.validate()
    kind, target = parse_target(config.path)
    if kind == "sharded":
        assert isinstance(target, Path)
        return _maintain_sharded(config, target, progress)
    path = resolve(config.path)
    if not _check_file(path):
        raise errors.ConfigError(
            f"{path} is not in WAL mode; fleetstore maintain does not change a database's "
            "journal mode (a fleetstore store is always in WAL mode)"
        )
    settings = Settings.load(**config.settings)
    if not _is_store(path, settings):
        report = Report(path, "foreign", config.dry_run)
        if not (config.yes or config.dry_run):
            raise NotConfirmed(
                f"{path} is not a fleetstore store: only the generic steps (checkpoint, "
                "optimize, incremental vacuum) would run; confirm with --yes"
            )
        with OutsideFile(path, wait=settings.write_budget) as outside:
            generic_steps(outside, config, report, progress)
        return report
    db = Database.open(path, **dataclasses.asdict(settings))
    report = Report(path, "fleetstore", config.dry_run)
    if config.dry_run:
        # Neither migrations nor the replay of dead journals: a dry run writes nothing.
        store = Store(FileBackend(db, sql.queries("sqlite"), settings), settings)
        latest = max(m.version for m in migrations())
        version = db.schema_version
        if version < latest:
            report.steps.append(
                Step(
                    "migrate", "dry-run", f"the store would be migrated from {version} to {latest}"
                )
            )
    else:
        db.close()
        store = open_store(path, **config.settings)
    try:
        _store_steps(store, config, report, progress)
        assert isinstance(store.db, Database)  # maintain opens SQLite files only
        generic_steps(store.db, config, report, progress)
    finally:
        store.close(timeout=0)
    return report


def _maintain_sharded(config: Config, directory: Path, progress: Progress | None) -> Report:
    """``maintain`` on a sharded store: the store steps through the Store API (a
    tree's deletion goes through the router), the per-file steps on the catalog and
    then each shard, one open at a time (``router.each``: linear in shards, with a
    bounded number of files open), then the removal of empty shard files."""
    directory = directory.expanduser().absolute()
    catalog = directory / CATALOG
    if not catalog.is_file():
        raise errors.NotFound(f"no sharded store at {directory} (no {CATALOG})")
    if not _check_file(str(catalog)):
        raise errors.ConfigError(f"{catalog} is not in WAL mode: not a fleetstore catalog")
    url = f"{SHARDED_SCHEME}://{directory}"
    settings = Settings.load(**config.settings)
    report = Report(url, "fleetstore", config.dry_run)
    store: Store
    if config.dry_run:
        # No migrations (nor of a shard on first use here), no replay, no recovery of
        # intents: a dry run writes nothing.
        shards = ShardSet(directory, [], dataclasses.asdict(settings), settings.max_open_shards)
        try:
            store = Store(Router(shards, sql.queries("sqlite"), settings), settings)
        except BaseException:
            shards.close()
            raise
        latest = max(m.version for m in migrations())
        version = shards.catalog.schema_version
        if version < latest:
            report.steps.append(
                Step(
                    "migrate",
                    "dry-run",
                    f"the catalog would be migrated from {version} to {latest} (each shard "
                    "on its first use)",
                )
            )
    else:
        store = open_store(url, **config.settings)
    try:
        _store_steps(store, config, report, progress)
        generic_steps_each(store, config, report, progress)
    finally:
        store.close(timeout=0)
    # After the store is closed: this process must hold no shard file open (see
    # empty_shards).
    timed(
        report,
        Step("shards"),
        lambda s: empty_shards(directory, settings, s, config.dry_run, progress),
    )
    return report


def _store_steps(store: Any, config: Config, report: Report, progress: Progress | None) -> None:
    writer = Writer(store.db, store)
    now = time.time()
    if config.archive_older_than is not None and config.archive_to is not None:
        cutoff = now - config.archive_older_than
        target = config.archive_to
        timed(
            report,
            Step("archive"),
            lambda s: archive(store, writer, s, cutoff, target, config.dry_run, progress),
        )
        if report.steps[-1].status == "failed":
            return  # nothing deleted; no reason to go on with a store in doubt
    if config.delete_older_than is not None:
        cutoff = now - config.delete_older_than
        timed(
            report,
            Step("delete"),
            lambda s: delete_old(store, writer, s, cutoff, config.dry_run, progress),
        )
    if config.ops_older_than is not None:
        horizon = now - config.ops_older_than
        timed(report, Step("ops"), lambda s: prune_ops(store, s, horizon, config.dry_run, progress))
    else:
        report.steps.append(Step("ops", "skipped", "applied_ops pruning turned off"))
    grace = config.blob_grace
    if grace is None:
        grace = default_blob_grace(store.settings)
    timed(
        report,
        Step("blobs"),
        lambda s: collect_blobs(store, s, grace, config.dry_run, progress),
    )
    if config.dry_run and store.db.schema_version < max(m.version for m in migrations()):
        report.steps.append(Step("search", "dry-run", "the store would be migrated first"))
    else:
        timed(report, Step("search"), lambda s: search_step(store, s, config.dry_run, progress))
    timed(report, Step("procs"), lambda s: gone_processes(str(store.path), s, config.dry_run))


__all__ = ["maintain", "resolve"]
