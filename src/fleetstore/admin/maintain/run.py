"""``fleetstore maintain``: retention, applied_ops pruning, blob garbage collection,
``PRAGMA optimize``, incremental vacuum and a checkpoint, on a store that a fleet
keeps writing.

Every step writes in short transactions through the normal write path
(``db.write()``: the gate, the budget, the hygiene), never a raw connection, and
sizes its batches so that each transaction holds the lock about ``TARGET_HOLD``
seconds: a fleet waits a few milliseconds on maintenance, not the 0.25 s that
deleting a 20,000-message session in one transaction held the lock.  Each step
records the lock wait and hold of its transactions (from entering ``write()`` to
the end of the block, so a hold includes the commit).

On a database that is not a fleetstore store ("foreign") only the generic steps
run (checkpoint, optimize, incremental vacuum when the file has incremental
auto-vacuum), and only when asked to (``yes``).  A foreign file that is not in WAL
mode is refused: opening it through ``fleetstore.Database`` would switch it to WAL.

A sharded store (``sqlite+sharded:///DIR``) gets every step on every file: the
catalog, then each shard through ``router.each`` (one open at a time, within the
store's bound on open files), a tree's deletion through the router, blob rows per
file and blob files only once no file refers to them, then the removal of empty
shard files (``_empty_shards``).  tests/admin/test_sharded_ops.py.

Blob garbage collection and its race
------------------------------------
A writer stores a payload's file (``BlobStore.put``, which reuses an existing
verified file and then touches its mtime) *before* the transaction that inserts
the blob row and the reference; past the budget the operation goes to the spool
and is applied later, maybe much later.  A collector that deleted the file in
between would leave a dangling reference.  The collector therefore:

1. notes the time ``S``, then reads every spool journal and protects each blob an
   operation there refers to (a damaged journal stops the collection: what it
   holds after the damage is unknown);
2. deletes a row only in a transaction that re-checks that no row of any table
   with a foreign key to ``blobs`` refers to it (the tables are read from the
   schema, so a table added later is covered);
3. deletes a file (a collected row's, or one with no row at all: a crash
   leftover) only if its mtime is older than ``S - grace``, where ``grace``
   exceeds the write budget plus ``blobs.TOUCH_AFTER`` (default
   ``max(10 min, 3 x write_budget + TOUCH_AFTER)``), and then by renaming it
   aside first and looking at the mtime again: a writer that reused a file older
   than TOUCH_AFTER touched it before its transaction, so it is put back; one
   that comes after the rename finds no file and writes a new one.

A writer that stored or reused the file before ``S - grace + TOUCH_AFTER`` has,
by ``S``, either committed its reference (seen by step 2) or spooled its
operation (seen by step 1), since no write waits past its budget.  One that did
later left an mtime at or after ``S - grace`` (it touched a file older than
TOUCH_AFTER).  The assumptions: every writer's budget plus TOUCH_AFTER is below
the grace (``--blob-grace`` raises it), and the clock does not jump back by more
than the margin.  tests/admin/test_maintain.py: test_blob_gc_*.

applied_ops pruning
-------------------
``applied_ops`` makes a retried or replayed operation a no-op; a row pruned too
early would let a replay apply twice.  Rows applied before the horizon
(``ops_older_than``, at least an hour) are pruned, but never one applied after the
creation of an operation still in a spool journal: an operation's id is a UUIDv7
whose time precedes any application of it, so the horizon is lowered to the
oldest such time (and pruning is skipped when a journal is damaged or holds an id
whose time cannot be read).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fleetstore import errors, sql
from fleetstore.core.ids import new_id
from fleetstore.core.settings import Settings
from fleetstore.core.units import size as _size
from fleetstore.domain import registry
from fleetstore.domain.blobs import TOUCH_AFTER
from fleetstore.domain.operations import Operation
from fleetstore.engine.base import Engine, Tx
from fleetstore.engine.sqlite import Database, WriteTx

T = TypeVar("T")
log = logging.getLogger("fleetstore")

#: The lock hold each batched transaction aims at (seconds).
TARGET_HOLD = 0.02
#: The shortest applied_ops horizon accepted: far beyond any retry of an ambiguous write.
MIN_OPS_AGE = 3600.0
#: Default applied_ops horizon.
DEFAULT_OPS_AGE = 30 * 86400.0
#: Pages of the first incremental-vacuum transaction (then sized to TARGET_HOLD).
FIRST_VACUUM_PAGES = 256

#: ``progress(stage, done, total)``.
Progress = Callable[[str, int, int], None]
#: Maintenance operations that a sharded store routes to a session tree's shard.
_ROUTED = frozenset({"mnt_delete_tree"})

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)?\s*$", re.IGNORECASE)
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_SHA = re.compile(r"[0-9a-f]{64}")
_TRASH = re.compile(r"\.([0-9a-f]{64})\.gc-\d+")
_TMP = re.compile(r"\.([0-9a-f]{64})\.\d+\.[0-9a-f]+\.tmp")
_HEADER = b"SQLite format 3\x00"


def parse_age(text: str) -> float:
    """Seconds in an age such as ``30d``, ``12h``, ``90m``, ``45s`` or ``2w``
    (a bare number is seconds).  ``InvalidInput`` otherwise."""
    match = _AGE.match(text)
    if not match:
        raise errors.InvalidInput(
            f"not an age: {text!r} (write a number and a unit: 30d, 12h, 90m, 45s, 2w)"
        )
    seconds = float(match[1]) * _UNITS[(match[2] or "").lower()]
    if not math.isfinite(seconds):
        raise errors.InvalidInput(f"not an age: {text!r}")
    return seconds


def format_age(seconds: float) -> str:
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


# -- results -------------------------------------------------------------------------------------


@dataclass(slots=True)
class Step:
    """What one step did (or, in a dry run, would do), and what its writes cost."""

    name: str
    status: str = "done"  # done | nothing | skipped | dry-run | failed
    summary: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    transactions: int = 0
    max_wait: float = 0.0
    max_hold: float = 0.0
    total_hold: float = 0.0
    last_hold: float = 0.0
    seconds: float = 0.0

    def record(self, wait: float, hold: float) -> None:
        self.last_hold = hold
        self.transactions += 1
        self.max_wait = max(self.max_wait, wait)
        self.max_hold = max(self.max_hold, hold)
        self.total_hold += hold

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class Report:
    path: str
    kind: str  # "fleetstore" or "foreign"
    dry_run: bool
    steps: list[Step] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.status != "failed" for s in self.steps)

    @property
    def max_hold(self) -> float:
        return max((s.max_hold for s in self.steps), default=0.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "dry_run": self.dry_run,
            "ok": self.ok,
            "max_hold": self.max_hold,
            "steps": [s.to_json() for s in self.steps],
        }


@dataclass(frozen=True, slots=True)
class Config:
    """What ``maintain`` is asked to do.  Ages are in seconds."""

    path: str
    dry_run: bool = False
    yes: bool = False
    archive_older_than: float | None = None
    archive_to: str | None = None
    delete_older_than: float | None = None
    #: None: applied_ops are not pruned.
    ops_older_than: float | None = DEFAULT_OPS_AGE
    #: None: max(10 min, 3 x write_budget).
    blob_grace: float | None = None
    #: Settings for the store (``Settings`` fields), e.g. write_budget.
    settings: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if (self.archive_older_than is None) != (self.archive_to is None):
            raise errors.InvalidInput("an archive needs both an age and a file")
        for name in ("archive_older_than", "delete_older_than", "blob_grace"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise errors.InvalidInput(f"{name} must be a finite age >= 0, not {value!r}")
        if self.ops_older_than is not None and not self.ops_older_than >= MIN_OPS_AGE:
            raise errors.InvalidInput(
                f"ops_older_than must be at least {format_age(MIN_OPS_AGE)} (operations may "
                "be retried for as long as a write budget after they were applied)"
            )
        if self.delete_older_than is not None and not (self.yes or self.dry_run):
            raise errors.InvalidInput(
                "--delete-older-than deletes sessions without archiving them: "
                "add --yes (or see what it would do with --dry-run)"
            )
        if self.archive_to is not None and os.path.lexists(self.archive_to) and not self.dry_run:
            raise errors.InvalidInput(
                f"{self.archive_to} exists: an archive is never overwritten; choose a new name"
            )


class NotConfirmed(errors.PermanentError):
    """A foreign database is maintained only when confirmed (``--yes``)."""


# -- measured writes -----------------------------------------------------------------------------


class Writer:
    """Runs write transactions through ``db.write()``, timing each: the wait (entering
    ``write()`` to the start of the block) and the hold (the block and its commit).

    Given a sharded *store*, the operations that change a session tree
    (``mnt_delete_tree``) go through ``store.apply``: the router applies them in the
    tree's shard and then brings the catalog's index up to date (three short
    transactions: the intent, the shard, the index).  Their recorded hold is the
    whole of it, an upper bound of each transaction's, and their wait is not
    separated from it (recorded as 0)."""

    def __init__(self, db: Engine, store: Any = None) -> None:
        self.db = db
        self.store = store if getattr(store, "router", None) is not None else None
        self.queries = sql.queries(db.dialect)

    def run(self, step: Step, fn: Callable[[Any], T]) -> T:
        entered = time.monotonic()
        began = [entered]

        def timed(tx: Any) -> T:
            began[0] = time.monotonic()  # the last run's start, when PostgreSQL reruns it
            return fn(tx)

        result = self.db.run_write(timed)
        step.record(began[0] - entered, time.monotonic() - began[0])
        return result

    def apply(self, step: Step, name: str, args: dict[str, Any]) -> dict[str, Any]:
        if self.store is not None and name in _ROUTED:
            # A fresh op id: the router keys its catalog+shard intent by it.
            started = time.monotonic()
            result: dict[str, Any] = self.store.apply(Operation(name, args, new_id()))
            step.record(0.0, time.monotonic() - started)
            return result
        op = Operation(name, args, "maintenance")
        return self.run(step, lambda tx: registry.apply(tx, self.queries, op, tx.now))


class Batch:
    """A batch size that follows the measured hold toward ``TARGET_HOLD``."""

    def __init__(self, first: int, most: int) -> None:
        self.size = first
        self.most = most

    def update(self, done: int, hold: float) -> None:
        if done < self.size:
            return  # a short batch says nothing about the rate
        wanted = int(self.size * TARGET_HOLD / max(hold, 1e-4))
        self.size = max(1, min(self.most, wanted, self.size * 2))


# -- opening -------------------------------------------------------------------------------------


def _check_file(path: str) -> bool:
    """Whether the SQLite file at *path* is in WAL mode (``CorruptStore`` if it is not
    a SQLite database; the header says so without opening it)."""
    with open(path, "rb") as fh:
        header = fh.read(100)
    if len(header) < 100 or not header.startswith(_HEADER):
        raise errors.CorruptStore(f"{path}: not a SQLite database")
    # Bytes 18 and 19: the file format's write and read versions, 2 in WAL mode.
    return header[18] == 2 and header[19] == 2


def resolve(path: str | os.PathLike[str] | None) -> str:
    """The database file *path* names; ``NotFound`` if there is none (nothing is created)."""
    from fleetstore.core.targets import resolve_target

    target = resolve_target(path)
    if not target.is_file():
        raise errors.NotFound(f"no database at {target}")
    return str(target)


def _is_store(db: Database) -> bool:
    q = sql.queries("sqlite")
    has_migrations, has_sessions = db.read(lambda tx: tx.execute(q["mnt_is_store"])[0])
    return bool(has_migrations and has_sessions)


def maintain(config: Config, progress: Progress | None = None) -> Report:
    """Run every maintenance step on the database at ``config.path`` (a sharded store:
    on its catalog and every shard) and report."""
    from fleetstore.core.targets import parse_target
    from fleetstore.store.backend import migrations
    from fleetstore.store.facade import Store
    from fleetstore.store.facade import open as open_store
    from fleetstore.store.single import FileBackend

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
    db = Database.open(path, **dataclasses.asdict(settings))
    try:
        is_store = _is_store(db)
    except BaseException:
        db.close()
        raise
    report = Report(path, "fleetstore" if is_store else "foreign", config.dry_run)
    if not is_store:
        try:
            if not (config.yes or config.dry_run):
                raise NotConfirmed(
                    f"{path} is not a fleetstore store: only the generic steps (checkpoint, "
                    "optimize, incremental vacuum) would run; confirm with --yes"
                )
            _generic_steps(db, config, report, progress)
        finally:
            db.close()
        return report
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
        _generic_steps(store.db, config, report, progress)
    finally:
        store.close(timeout=0)
    return report


def _maintain_sharded(config: Config, directory: Path, progress: Progress | None) -> Report:
    """``maintain`` on a sharded store: the store steps through the Store API (a
    tree's deletion goes through the router), the per-file steps on the catalog and
    then each shard, one open at a time (``router.each``: linear in shards, with a
    bounded number of files open), then the removal of empty shard files."""
    from fleetstore.core.targets import CATALOG, SHARDED_SCHEME
    from fleetstore.engine.sharded import ShardSet
    from fleetstore.store.backend import migrations
    from fleetstore.store.facade import Store
    from fleetstore.store.facade import open as open_store
    from fleetstore.store.sharded import Router

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
        _generic_steps_each(store, config, report, progress)
    finally:
        store.close(timeout=0)
    # After the store is closed: this process must hold no shard file open (see
    # _empty_shards).
    _timed(
        report,
        Step("shards"),
        lambda s: _empty_shards(directory, settings, s, config.dry_run, progress),
    )
    return report


def each_file(store: Any, fn: Callable[[str | None, Database], None]) -> None:
    """``fn(key, database)`` for every database file of *store*: its one file (key
    None), or a sharded store's catalog (key None) and then each shard, one at a time
    through ``router.each`` (a bounded cache of open files: linear in shards)."""
    if store.router is not None:
        store.router.each(fn)
    else:
        fn(None, store.db)


def file_count(store: Any) -> int:
    return 1 + len(store.router.shards.keys()) if store.router is not None else 1


def _timed(report: Report, step: Step, fn: Callable[[Step], None]) -> None:
    started = time.monotonic()
    report.steps.append(step)
    try:
        fn(step)
    except errors.FleetstoreError as exc:
        step.status = "failed"
        step.summary = (
            step.summary + "; " if step.summary else ""
        ) + f"{type(exc).__name__}: {exc}"
    finally:
        step.seconds = time.monotonic() - started


# -- the generic steps ---------------------------------------------------------------------------


def _generic_steps(db: Database, config: Config, report: Report, progress: Progress | None) -> None:
    writer = Writer(db)
    _timed(report, Step("optimize"), lambda s: _optimize(writer, s, config.dry_run))
    _timed(report, Step("vacuum"), lambda s: _vacuum(writer, s, config.dry_run, progress))
    _timed(report, Step("checkpoint"), lambda s: _checkpoint(db, s, config.dry_run))


def _generic_steps_each(
    store: Any, config: Config, report: Report, progress: Progress | None
) -> None:
    """The generic steps on every file of a sharded store, one file at a time, each
    step's figures summed over the files."""
    steps = {name: Step(name) for name in ("optimize", "vacuum", "checkpoint")}
    started = time.monotonic()
    for step in steps.values():
        report.steps.append(step)
    total = file_count(store)
    done = [0]

    def visit(_key: str | None, db: Database) -> None:
        writer = Writer(db)
        runs: list[tuple[str, Callable[[Step], None]]] = [
            ("optimize", lambda s: _optimize(writer, s, config.dry_run)),
            ("vacuum", lambda s: _vacuum(writer, s, config.dry_run, None)),
            ("checkpoint", lambda s: _checkpoint(db, s, config.dry_run)),
        ]
        for name, run in runs:
            one = Step(name)
            try:
                run(one)
            except errors.FleetstoreError as exc:
                one.status = "failed"
                one.summary = f"{db.path}: {type(exc).__name__}: {exc}"
            _merge(steps[name], one)
        done[0] += 1
        if progress is not None:
            progress("files", done[0], total)

    try:
        each_file(store, visit)
    except errors.FleetstoreError as exc:
        for step in steps.values():
            step.status = "failed"
            step.summary = f"{type(exc).__name__}: {exc}"
    seconds = time.monotonic() - started
    for step in steps.values():
        step.seconds = seconds
        _sum_up(step, done[0])


def _merge(total: Step, one: Step) -> None:
    """Add one file's run of a step to the step's figures over every file."""
    total.transactions += one.transactions
    total.max_wait = max(total.max_wait, one.max_wait)
    total.max_hold = max(total.max_hold, one.max_hold)
    total.total_hold += one.total_hold
    total.last_hold = one.last_hold
    statuses = total.detail.setdefault("files_by_status", {})
    statuses[one.status] = statuses.get(one.status, 0) + 1
    for key in _SUMMED:
        value = one.detail.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            total.detail[key] = total.detail.get(key, 0) + value
    if one.name == "vacuum":
        page = int(one.detail.get("page_size", 0))
        for key in ("free", "freed"):
            pages = int(one.detail.get(f"{key}_pages", 0))
            total.detail[f"{key}_bytes"] = total.detail.get(f"{key}_bytes", 0) + pages * page
    if one.status == "failed":
        total.status = "failed"
        failures = total.detail.setdefault("failures", [])
        if len(failures) < 20:
            failures.append(one.summary)


#: Figures of a per-file step that add up over the files of a sharded store.
_SUMMED = (
    "pages",
    "free_pages",
    "freed_pages",
    "wal_frames",
    "checkpointed",
    "wal_bytes_before",
    "wal_bytes_after",
    "checkpoint_seconds",
)


def _sum_up(step: Step, files: int) -> None:
    """The summary of a step run on every file of a sharded store."""
    d = step.detail
    by = d.get("files_by_status", {})
    if step.status != "failed":
        if by.get("dry-run"):
            step.status = "dry-run"
        elif not by.get("done"):
            step.status = "nothing" if by.get("nothing") or not by else "skipped"
    if step.name == "optimize":
        text = ("would run" if step.status == "dry-run" else "ran") + " PRAGMA optimize"
    elif step.name == "vacuum":
        if step.status == "dry-run":
            text = (
                f"would return {d.get('free_pages', 0)} free pages "
                f"({_size(d.get('free_bytes', 0))})"
            )
        elif step.status == "nothing":
            text = "no free pages"
        else:
            freed = int(d.get("freed_pages", 0))
            text = f"returned {freed} pages ({_size(d.get('freed_bytes', 0))})"
        if by.get("skipped"):
            text += f"; {by['skipped']} file(s) without incremental auto-vacuum"
    else:
        wal = _size(d.get("wal_bytes_before", 0))
        if step.status == "dry-run":
            text = f"would checkpoint {wal} of WAL"
        else:
            text = f"checkpointed {wal} of WAL, {_size(d.get('wal_bytes_after', 0))} left"
    step.summary = f"{text} in {files} file(s)" + (
        f"; FAILED in {by['failed']}: {'; '.join(d.get('failures', [])[:3])}"
        if by.get("failed")
        else ""
    )


def _optimize(writer: Writer, step: Step, dry_run: bool) -> None:
    if dry_run:
        step.status = "dry-run"
        step.summary = "would run PRAGMA optimize (it analyses only tables whose statistics aged)"
        return
    # Since SQLite 3.46 optimize caps the rows ANALYZE reads per index: a short transaction.
    writer.run(step, lambda tx: tx.execute("PRAGMA optimize"))
    step.summary = "PRAGMA optimize"


def _pages(db: Database) -> tuple[int, int, int]:
    q = sql.queries("sqlite")
    size, count, free = db.read(lambda tx: tx.execute(q["mnt_pages"])[0])
    return int(size), int(count), int(free)


def _vacuum(writer: Writer, step: Step, dry_run: bool, progress: Progress | None) -> None:
    q = writer.queries
    db = writer.db
    assert isinstance(db, Database)  # a SQLite file's pages
    mode = int(db.read(lambda tx: tx.execute(q["mnt_auto_vacuum"])[0][0]))
    page_size, count, free = _pages(db)
    step.detail.update(page_size=page_size, pages=count, free_pages=free, auto_vacuum=mode)
    if mode != 2:
        step.status = "skipped"
        step.summary = (
            f"the file has no incremental auto-vacuum ({free} free pages stay for reuse; "
            "only a full VACUUM, which holds the lock throughout, would return them)"
        )
        return
    if not free:
        step.status = "nothing"
        step.summary = "no free pages"
        return
    if dry_run:
        step.status = "dry-run"
        step.summary = f"would return {free} free pages ({_size(free * page_size)}) to the system"
        return
    batch = Batch(FIRST_VACUUM_PAGES, 1 << 20)
    left = free
    while left > 0:
        writer.run(step, _incremental_vacuum(batch.size))
        before = left
        left = _pages(db)[2]
        batch.update(before - left, step.last_hold)
        if progress is not None:
            progress("vacuum", free - left, free)
        if left >= before:  # nothing freed: another process is allocating; stop
            break
    step.detail["freed_pages"] = free - left
    step.summary = f"returned {free - left} pages ({_size((free - left) * page_size)})"


def _incremental_vacuum(pages: int) -> Callable[[WriteTx], object]:
    return lambda tx: tx.execute(f"PRAGMA incremental_vacuum({int(pages)})")


def _checkpoint(db: Database, step: Step, dry_run: bool) -> None:
    wal = _file_size(db.path + "-wal")
    step.detail["wal_bytes_before"] = wal
    if dry_run:
        step.status = "dry-run"
        step.summary = f"would checkpoint a {_size(wal)} WAL (truncated if no reader blocks it)"
        return
    # Truncated whatever its size, but still only when every frame was copied,
    # i.e. no reader blocks it.
    started = time.monotonic()
    log, done = db.checkpoint(truncate=True)
    step.detail["checkpoint_seconds"] = time.monotonic() - started
    after = _file_size(db.path + "-wal")
    step.detail.update(wal_frames=log, checkpointed=done, wal_bytes_after=after)
    if log < 0:
        step.status = "skipped"
        step.summary = "another checkpoint was running"
    elif after == 0:
        step.summary = f"WAL of {_size(wal)} checkpointed and truncated"
    else:
        blocked = " (a reader holds frames back)" if done < log else ""
        step.summary = f"{done} of {log} frames checkpointed{blocked}; WAL {_size(after)}"


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


# -- the store steps -----------------------------------------------------------------------------


def _store_steps(store: Any, config: Config, report: Report, progress: Progress | None) -> None:
    writer = Writer(store.db, store)
    now = time.time()
    if config.archive_older_than is not None and config.archive_to is not None:
        cutoff = now - config.archive_older_than
        target = config.archive_to
        _timed(
            report,
            Step("archive"),
            lambda s: _archive(store, writer, s, cutoff, target, config.dry_run, progress),
        )
        if report.steps[-1].status == "failed":
            return  # nothing deleted; no reason to go on with a store in doubt
    if config.delete_older_than is not None:
        cutoff = now - config.delete_older_than
        _timed(
            report,
            Step("delete"),
            lambda s: _delete_old(store, writer, s, cutoff, config.dry_run, progress),
        )
    if config.ops_older_than is not None:
        horizon = now - config.ops_older_than
        _timed(
            report, Step("ops"), lambda s: _prune_ops(store, s, horizon, config.dry_run, progress)
        )
    else:
        report.steps.append(Step("ops", "skipped", "applied_ops pruning turned off"))
    grace = config.blob_grace
    if grace is None:
        grace = default_blob_grace(store.settings)
    _timed(
        report,
        Step("blobs"),
        lambda s: _collect_blobs(store, s, grace, config.dry_run, progress),
    )


def default_blob_grace(settings: Settings) -> float:
    """max(10 min, 3 x write_budget + TOUCH_AFTER): a writer stores a file, or makes a
    reused one younger than TOUCH_AFTER young again, at most a write budget before its
    reference commits or its operation is spooled."""
    return max(600.0, 3 * settings.write_budget + TOUCH_AFTER)


# -- retention -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tree:
    """A top-level session (no parent) with its subagent sessions."""

    id: str
    sessions: tuple[str, ...]
    newest: float


def session_trees(store: Any, older_than: float | None = None) -> list[Tree]:
    """Every top-level session's tree, with its newest write (sessions and state);
    with *older_than*, only the trees whose newest write is before it.

    A sharded store lists the trees from its catalog's index, whose ``updated_at``
    may lag the shards' (by about a second, longer after a writer was killed) and
    which holds no state of sharded sessions: so each tree the index shows as old
    enough is looked at again in its own file (``mnt_tree_freshness``), and the
    tree's newest write is the later of the two.  The deletion re-checks the tree's
    shard in every batch anyway."""
    q = store.queries

    def run(tx: Tx) -> tuple[list[tuple[Any, ...]], dict[str, float]]:
        rows = tx.execute(q["mnt_session_tree_rows"])
        state = {str(s): float(t) for s, t in tx.execute(q["mnt_state_newest"])}
        return rows, state

    rows, state = store.read(run)
    children: dict[str | None, list[str]] = {}
    fresh: dict[str, float] = {}
    for sid, parent, newest, _status in rows:
        children.setdefault(parent, []).append(sid)
        fresh[sid] = max(float(newest), state.get(sid, 0.0))
    trees = []
    for root in sorted(children.get(None, [])):
        members: list[str] = []
        stack = [root]
        while stack:
            sid = stack.pop()
            members.append(sid)
            stack.extend(children.get(sid, []))
        trees.append(Tree(root, tuple(members), max(fresh[m] for m in members)))
    if older_than is not None:
        trees = [t for t in trees if t.newest < older_than]
    if store.router is not None:
        trees = [_in_its_file(store, t) for t in trees]
        if older_than is not None:
            trees = [t for t in trees if t.newest < older_than]
    return trees


def _in_its_file(store: Any, tree: Tree) -> Tree:
    """*tree* with its newest write as its own file (a shard, or the catalog) has it."""
    q = store.queries

    def run(tx: Tx) -> tuple[Any, ...]:
        return tuple(tx.execute(q["mnt_tree_freshness"], {"id": tree.id})[0])

    _count, newest_session, newest_state = store.read(run, session_id=tree.id)
    newest = max(tree.newest, float(newest_session or 0.0), float(newest_state or 0.0))
    return Tree(tree.id, tree.sessions, newest)


@dataclass(slots=True)
class Deleted:
    messages: int = 0
    states: int = 0
    sessions: int = 0
    #: "deleted", "gone" (there was nothing), or "written" (written to since: stopped)
    outcome: str = "deleted"


def delete_tree(
    writer: Writer,
    step: Step,
    session_id: str,
    written_before: float | None = None,
    batch: Batch | None = None,
) -> Deleted:
    """Delete the session *session_id* with its subagents, messages and state, in
    transactions of about ``TARGET_HOLD`` each.  With *written_before*: stop (outcome
    "written") as soon as the tree shows a write at or after it; a tree stopped after
    its first batch is left partly deleted (the outcome says so)."""
    batch = batch or Batch(200, 50_000)
    total = Deleted()
    first = True
    while True:
        args: dict[str, Any] = {"id": session_id, "limit": batch.size}
        if written_before is not None:
            args["written_before"] = written_before
        result = writer.apply(step, "mnt_delete_tree", args)
        if result.get("skipped"):
            total.outcome = "written"
            return total
        if result.get("gone") and first:
            total.outcome = "gone"
            return total
        first = False
        total.messages += result["messages"]
        total.states += result["states"]
        total.sessions += result["sessions"]
        batch.update(result["messages"] + result["states"], step.last_hold)
        if result["done"] or result.get("gone"):
            return total


def _old_trees(store: Any, cutoff: float) -> list[Tree]:
    return session_trees(store, older_than=cutoff)


def message_counts(store: Any, session_ids: Sequence[str] | None = None) -> dict[str, int]:
    """Messages per session: of the whole store, or (a sharded store) of the files
    that hold *session_ids*, each file read once."""
    q = store.queries

    def run(tx: Tx) -> dict[str, int]:
        return {str(s): int(n) for s, n in tx.execute(q["mnt_stats_messages"])}

    if store.router is None:
        return dict(store.read(run))
    counts: dict[str, int] = {}
    if session_ids is None:
        each_file(store, lambda _key, db: counts.update(db.read(run)))
        return counts
    read: set[str | None] = set()
    for sid in session_ids:
        home = store.router.home(sid)
        if home in read:
            continue
        read.add(home)
        counts.update(store.read(run, session_id=sid))
    return counts


def _describe(store: Any, trees: Sequence[Tree]) -> tuple[int, int]:
    counts = message_counts(store, [t.id for t in trees] if store.router is not None else None)
    sessions = sum(len(t.sessions) for t in trees)
    messages = sum(counts.get(s, 0) for t in trees for s in t.sessions)
    return sessions, messages


def _archive(
    store: Any,
    writer: Writer,
    step: Step,
    cutoff: float,
    target: str,
    dry_run: bool,
    progress: Progress | None,
) -> None:
    from fleetstore.transfer import stream as transfer

    trees = _old_trees(store, cutoff)
    sessions, messages = _describe(store, trees)
    step.detail.update(trees=len(trees), sessions=sessions, messages=messages, file=target)
    if not trees:
        step.status = "nothing"
        step.summary = "no session tree older than the horizon"
        return
    what = f"{len(trees)} session tree(s) ({sessions} sessions, {messages} messages)"
    if dry_run:
        step.status = "dry-run"
        step.summary = f"would archive {what} to {target}, verify it, then delete them"
        return
    summary = transfer.export_store(store, target, [t.id for t in trees], progress=progress)
    step.detail["file_bytes"] = summary.file_bytes
    verify_archive(store, target, summary)
    step.detail["verified"] = True
    deleted, written, partial = _delete_trees(store, writer, step, trees, cutoff, summary, progress)
    step.summary = (
        f"archived {what} to {target} ({_size(summary.file_bytes)}), verified; deleted "
        f"{deleted} tree(s)"
    )
    _note_written(step, written, partial)


def _note_written(step: Step, written: list[str], partial: list[str]) -> None:
    step.detail.update(written_since=written, partly_deleted=partial)
    if written:
        step.summary += f"; {len(written)} tree(s) written to since, kept"
    if partial:
        step.status = "failed"
        step.summary += (
            f"; {len(partial)} tree(s) were written to while being deleted and are left "
            f"partly deleted: {', '.join(partial[:5])}"
        )


def verify_archive(store: Any, path: str, summary: Any) -> None:
    """Read the archive back whole, as ``fleetstore import`` would check it (every
    record, every blob's hash and size, the trailer's counts and checksum), and check
    it holds every exported session with its messages.  ``InvalidArchive`` if not."""
    from fleetstore.transfer import stream as transfer

    reader = transfer._Reader(
        Path(path), store.settings.max_payload_bytes, transfer.MAX_LINE, transfer.MAX_TOTAL
    )
    sessions: set[str] = set()
    messages: dict[str, int] = {}
    for item in reader.items():
        if isinstance(item, transfer._OpItem):
            if item.op.name == "import_session":
                sessions.add(item.parsed.id)
            elif item.op.name == "import_message":
                sid = item.parsed.session_id
                messages[sid] = messages.get(sid, 0) + 1
    for sid, digest in summary.digests.items():
        if sid not in sessions or messages.get(sid, 0) != digest.messages:
            raise errors.InvalidArchive(
                f"{path}: reading the archive back, session {sid} is missing or incomplete "
                f"({messages.get(sid, 0)} of {digest.messages} messages); nothing was deleted"
            )


def _delete_trees(
    store: Any,
    writer: Writer,
    step: Step,
    trees: Sequence[Tree],
    cutoff: float,
    summary: Any,
    progress: Progress | None,
) -> tuple[int, list[str], list[str]]:
    from fleetstore.transfer import stream as transfer

    batch = Batch(200, 50_000)
    deleted = 0
    written: list[str] = []
    partial: list[str] = []
    for i, tree in enumerate(trees):
        # Exactly what was archived, or it stays: compare the whole content.
        if summary is not None and any(
            transfer.session_digest(store, s) != summary.digests.get(s) for s in tree.sessions
        ):
            written.append(tree.id)
            continue
        result = delete_tree(writer, step, tree.id, cutoff, batch)
        if result.outcome == "written":
            (partial if result.messages or result.states else written).append(tree.id)
        else:
            deleted += 1
            step.detail["deleted_messages"] = step.detail.get("deleted_messages", 0) + (
                result.messages
            )
        if progress is not None:
            progress("delete", i + 1, len(trees))
    return deleted, written, partial


def _delete_old(
    store: Any,
    writer: Writer,
    step: Step,
    cutoff: float,
    dry_run: bool,
    progress: Progress | None,
) -> None:
    trees = _old_trees(store, cutoff)
    sessions, messages = _describe(store, trees)
    step.detail.update(trees=len(trees), sessions=sessions, messages=messages)
    if not trees:
        step.status = "nothing"
        step.summary = "no session tree older than the horizon"
        return
    what = f"{len(trees)} session tree(s) ({sessions} sessions, {messages} messages)"
    if dry_run:
        step.status = "dry-run"
        step.summary = f"would delete {what}"
        return
    deleted, written, partial = _delete_trees(store, writer, step, trees, cutoff, None, progress)
    step.summary = f"deleted {deleted} of {what}"
    _note_written(step, written, partial)


# -- spool journals ------------------------------------------------------------------------------


@dataclass(slots=True)
class Journals:
    """What the spool journals beside a store hold, for GC and pruning."""

    count: int = 0
    blobs: set[str] = field(default_factory=set)
    #: The creation time of the oldest operation found (None: none found).
    oldest_op: float | None = None
    #: Why the journals cannot be trusted to be read whole ("" if they can).
    doubt: str = ""


def _uuid7_time(op_id: str) -> float | None:
    try:
        value = uuid.UUID(op_id)
    except ValueError:
        return None
    if value.version != 7:
        return None
    return (value.int >> 80) / 1000.0


def _blob_shas(value: Any, found: set[str]) -> None:
    if isinstance(value, dict):
        ref = value.get("blob")
        if isinstance(ref, dict) and isinstance(ref.get("sha256"), str):
            found.add(ref["sha256"])
        for v in value.values():
            _blob_shas(v, found)
    elif isinstance(value, list):
        for v in value:
            _blob_shas(v, found)


def read_journals(spool_dir: Path) -> Journals:
    from fleetstore.store.spool import journals, read_journal

    result = Journals()
    for path in journals(spool_dir):
        try:
            read = read_journal(path)
        except FileNotFoundError:
            continue  # drained and deleted meanwhile: its operations were applied
        except OSError as exc:
            result.doubt = f"{path.name}: {exc}"
            continue
        result.count += 1
        if read.damaged:
            result.doubt = f"{path.name} is damaged ({read.reason}): what follows is unknown"
        for op in read.ops:
            _blob_shas(op.args, result.blobs)
            created = _uuid7_time(op.op_id)
            if created is None:
                result.doubt = result.doubt or f"{path.name}: operation id {op.op_id} has no time"
                continue
            result.oldest_op = (
                created if result.oldest_op is None else min(result.oldest_op, created)
            )
    return result


# -- applied_ops ---------------------------------------------------------------------------------


def _uuid7_bound(t: float) -> str:
    """A string that sorts after every UUIDv7 text of a time before *t* and before
    every one of *t* or later: the 48-bit millisecond prefix."""
    ms = max(int(t * 1000), 0)
    text = f"{ms:012x}"
    return f"{text[:8]}-{text[8:]}"


def _prune_ops(
    store: Any, step: Step, horizon: float, dry_run: bool, progress: Progress | None
) -> None:
    """Prune every file's applied_ops (a sharded store: the catalog's and each
    shard's; its one spool beside the catalog bounds them all)."""
    found = read_journals(store.spool_dir)
    step.detail["journals"] = found.count
    if found.doubt:
        step.status = "skipped"
        step.summary = f"not pruned: {found.doubt}"
        return
    if found.oldest_op is not None and found.oldest_op < horizon:
        step.detail["lowered_to_journal"] = True
        horizon = found.oldest_op
    step.detail["horizon"] = horizon
    # Ids are UUIDv7 (time-ordered): an operation applied before the horizon was
    # created before it, so its id sorts below the horizon's prefix and the scan stops
    # there.  (A row whose id is not a UUIDv7 and sorts above it is kept.)
    bound = _uuid7_bound(horizon)
    files = file_count(store)
    seen = {"rows": 0, "old": 0, "pruned": 0, "files": 0, "visited": 0}

    def visit(_key: str | None, db: Database) -> None:
        q = sql.queries(db.dialect)
        total, oldest = db.read(lambda tx: tx.execute(q["mnt_ops_count"])[0])
        seen["rows"] += int(total)
        seen["visited"] += 1
        if total and oldest is not None and oldest < horizon:
            seen["files"] += 1
            if dry_run:
                seen["old"] += int(
                    db.read(lambda tx: tx.execute(q["mnt_ops_old_count"], (bound, horizon))[0][0])
                )
            else:
                seen["pruned"] += _prune_file(Writer(db), step, horizon, bound)
        if progress is not None and files > 1:
            progress("ops", seen["visited"], files)

    each_file(store, visit)
    total = seen["rows"]
    step.detail.update(rows=total)
    where = f" in {files} files" if store.router is not None else ""
    if not seen["files"]:
        step.status = "nothing"
        step.summary = f"{total} applied_ops row(s){where}, none older than the horizon"
        return
    if dry_run:
        step.status = "dry-run"
        step.summary = f"would prune {seen['old']} of {total} applied_ops row(s){where}"
        return
    step.detail["pruned"] = seen["pruned"]
    step.summary = f"pruned {seen['pruned']} of {total} applied_ops row(s){where}"


def _prune_file(writer: Writer, step: Step, horizon: float, bound: str) -> int:
    batch = Batch(500, 100_000)
    deleted, after = 0, ""
    while True:
        result = writer.apply(
            step,
            "mnt_prune_ops",
            {"applied_before": horizon, "after": after, "below": bound, "limit": batch.size},
        )
        deleted += int(result["deleted"])
        batch.update(result["scanned"], step.last_hold)
        if result["done"]:
            return deleted
        after = result["last"]


# -- blobs ---------------------------------------------------------------------------------------


def _collect_blobs(
    store: Any, step: Step, grace: float, dry_run: bool, progress: Progress | None
) -> None:
    """Blob garbage collection over every file of the store.  A sharded store's
    files share one blob directory, and each file has its own ``blobs`` rows for the
    payloads its rows refer to: a row is garbage when nothing in *its* file refers to
    it (deleted in that file's transaction, re-checked there), and a file only when
    no file has a row for it any more, every file read after ``started`` (the
    argument of the module docstring holds for each file's rows alike)."""
    started = time.time()
    found = read_journals(store.spool_dir)
    step.detail.update(grace=grace, journals=found.count, protected=len(found.blobs))
    if found.doubt:
        step.status = "skipped"
        step.summary = f"not collected: {found.doubt}"
        return
    threshold = started - grace
    blobs = store.blobs
    on_disk = dict(_blob_files(blobs.directory))
    stale_tmp = [p for p in _tmp_files(blobs.directory) if _mtime(p) < threshold]
    files = file_count(store)
    sizes: dict[str, int] = {}
    #: Rows left in some file after its pass (a dry run: the rows it would leave).
    remaining: set[str] = set()
    deleted: set[str] = set()
    tally = {"garbage": 0, "old": 0, "rows": 0, "visited": 0, "old_bytes": 0}

    def visit(_key: str | None, db: Database) -> None:
        garbage, file_sizes = _unreferenced_rows(db, found.blobs)
        sizes.update(file_sizes)
        old = [sha for sha in garbage if _mtime(on_disk.get(sha)) < threshold]
        tally["garbage"] += len(garbage)
        tally["old"] += len(old)
        tally["old_bytes"] += sum(file_sizes[sha] for sha in old)
        if dry_run:
            remaining.update(set(file_sizes) - set(old))
            deleted.update(old)
        else:
            writer = Writer(db)
            batch = Batch(200, 5000)
            i = 0
            while i < len(old):
                chunk = old[i : i + batch.size]
                i += len(chunk)
                result = writer.apply(step, "mnt_delete_blobs", {"shas": chunk})
                batch.update(len(chunk), step.last_hold)
                tally["rows"] += len(result["deleted"])
                deleted.update(result["deleted"])
            # Read after this file's deletions (and after ``started``).
            remaining.update(_all_rows(db))
        tally["visited"] += 1
        if progress is not None:
            progress("blobs", tally["visited"], files + 1)

    each_file(store, visit)
    restored = _settle_trash(store, found.blobs | remaining, threshold, dry_run)
    # Files of collected rows, and files with no row at all (crash leftovers).
    candidates = sorted(((set(on_disk) | deleted) - remaining) - found.blobs)
    orphans = [sha for sha in candidates if sha not in deleted]
    step.detail.update(
        unreferenced_rows=tally["garbage"],
        young_unreferenced=tally["garbage"] - tally["old"],
        orphan_files=len(orphans),
        stale_tmp_files=len(stale_tmp),
        restored=restored,
    )
    if store.router is not None:
        step.detail["files"] = files
        # A row collected in one file whose blob another file still refers to.
        step.detail["shared_kept"] = len(deleted & remaining)
    young = tally["garbage"] - tally["old"]
    if dry_run:
        young_orphans = sum(1 for s in orphans if _mtime(on_disk[s]) >= threshold)
        step.status = "dry-run"
        step.summary = (
            f"would delete {tally['old']} unreferenced blob(s) ({_size(tally['old_bytes'])}), "
            f"{len(orphans) - young_orphans} file(s) with no row and {len(stale_tmp)} stale "
            f"temporary file(s); {young + young_orphans} younger than the grace are left"
        )
        return
    deleted_files = freed = 0
    for sha in candidates:
        path = on_disk.get(sha) or blobs.path(sha)
        size = _file_size(str(path))
        if _retire(path, sha, threshold):
            deleted_files += 1
            freed += size
    if progress is not None:
        progress("blobs", files + 1, files + 1)
    for tmp in stale_tmp:
        with contextlib.suppress(OSError):
            tmp.unlink()
    step.detail.update(deleted_rows=tally["rows"], deleted_files=deleted_files, freed_bytes=freed)
    step.summary = (
        f"deleted {tally['rows']} unreferenced blob row(s) and {deleted_files} file(s) "
        f"({_size(freed)}), {len(stale_tmp)} stale temporary file(s)"
    )
    if store.router is not None:
        step.summary += f" in {files} files"
        if step.detail["shared_kept"]:
            step.summary += (
                f"; {step.detail['shared_kept']} file(s) kept: another file refers to them"
            )
    if young:
        step.summary += f"; {young} younger than the grace left for later"


def _mtime(path: Path | None) -> float:
    """A file's mtime; a missing file counts as infinitely young (nothing to delete)."""
    if path is None:
        return math.inf
    try:
        return path.stat().st_mtime
    except OSError:
        return math.inf


def _retire(path: Path, sha: str, threshold: float) -> bool:
    """Delete a blob file if it stays older than *threshold* once renamed aside
    (see the module docstring); put it back if a writer touched it meanwhile."""
    if _mtime(path) >= threshold:
        return False
    trash = path.with_name(f".{sha}.gc-{os.getpid()}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return False
    try:
        touched = trash.stat().st_mtime >= threshold
    except OSError:
        return False
    if touched:
        # A writer reused it just before the rename: back where it was, unless the
        # writer, finding it gone, already wrote it anew (link never replaces).
        with contextlib.suppress(FileExistsError):
            os.link(trash, path)
        trash.unlink()
        return False
    trash.unlink()
    return True


def _settle_trash(store: Any, wanted_shas: set[str], threshold: float, dry_run: bool) -> int:
    """Files a collector killed mid-way renamed aside: put back those still wanted
    (a row in some file, or a journal, wants them, or they were touched), delete the
    rest.  Returns how many were put back."""
    restored = 0
    directory = store.blobs.directory
    if not directory.is_dir():
        return 0
    trash = [
        (m[1], sub / name)
        for sub in directory.iterdir()
        if sub.is_dir()
        for name in os.listdir(sub)
        if (m := _TRASH.fullmatch(name))
    ]
    if not trash or dry_run:
        return 0
    for sha, path in trash:
        wanted = sha in wanted_shas or _mtime(path) >= threshold
        if wanted:
            with contextlib.suppress(FileExistsError):
                os.link(path, store.blobs.path(sha))
            restored += 1
        with contextlib.suppress(OSError):
            path.unlink()
    return restored


def _all_rows(db: Database) -> set[str]:
    return {str(r[0]) for r in db.read(lambda tx: tx.execute("SELECT sha256 FROM blobs"))}


def _unreferenced_rows(db: Database, protected: set[str]) -> tuple[list[str], dict[str, int]]:
    """Blob rows of the file *db* no row of it refers to (and no journal), page by
    page in short reads; returns them and every row's stored size."""
    from fleetstore.domain.maintenance import referenced

    q = sql.queries(db.dialect)
    garbage: list[str] = []
    sizes: dict[str, int] = {}
    after = ""
    while True:

        def page(tx: Tx, after: str = after) -> tuple[list[tuple[Any, ...]], set[str]]:
            rows = tx.execute(q["mnt_blob_rows"], (after, 1000))
            return rows, referenced(tx, q, [str(r[0]) for r in rows])

        rows, used = db.read(page)
        for sha, stored in rows:
            sizes[sha] = int(stored)
            if sha not in used and sha not in protected:
                garbage.append(sha)
        if len(rows) < 1000:
            return garbage, sizes
        after = rows[-1][0]


def _blob_files(directory: Path) -> Iterator[tuple[str, Path]]:
    if not directory.is_dir():
        return
    for sub in directory.iterdir():
        if sub.is_dir() and len(sub.name) == 2:
            for name in os.listdir(sub):
                if _SHA.fullmatch(name):
                    yield name, sub / name


def _tmp_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return [
        sub / name
        for sub in directory.iterdir()
        if sub.is_dir()
        for name in os.listdir(sub)
        if _TMP.fullmatch(name)
    ]


# -- empty shard files ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _ShardFile:
    key: str
    path: Path

    def sides(self, base: Path | None = None) -> list[tuple[Path, Path]]:
        """(the file, where it goes aside) for the database, its -wal, -shm and gate."""
        trash = base or self.path.with_name(f".{self.path.name}.gc-{os.getpid()}")
        return [
            (Path(f"{self.path}{suffix}"), Path(f"{trash}{suffix}"))
            for suffix in ("", "-wal", "-shm", ".gate")
        ]


def _shard_contents(path: Path) -> tuple[int, float] | None:
    """(sessions, newest applied_ops time) of a shard file, read read-only; None if it
    cannot be read without side effects."""
    from fleetstore.engine import inspect

    try:
        header = inspect.read_header(str(path))
        if header is None:
            return 0, 0.0
        mode, _why = inspect.choose_open_mode(
            header.wal,
            inspect.FileFacts.of(f"{path}-wal"),
            inspect.FileFacts.of(f"{path}-shm"),
        )
        if mode is None:
            return None
        with inspect.open_readonly(str(path), mode) as conn:
            sessions, newest = conn.query(
                "SELECT (SELECT count(*) FROM sessions), "
                "(SELECT coalesce(max(applied_at), 0) FROM applied_ops)"
            )[0]
    except (OSError, errors.FleetstoreError):
        return None
    return int(sessions), float(newest)


def _empty_shards(
    directory: Path, settings: Settings, step: Step, dry_run: bool, progress: Progress | None
) -> None:
    """Remove the shard files that hold no session, that the catalog's index does not
    name and that no catalog+shard intent names, once nothing was applied in them for
    the applied_ops horizon (their exactly-once log goes with them: as for pruning,
    at least ``MIN_OPS_AGE``, lowered to the oldest operation in a spool journal).

    A concurrent first use of the shard is either a write that makes a session there,
    which the router starts by recording an intent in the catalog, or a process that
    still has the file open from before (its cache of open shards).  So each removal
    happens inside a catalog write transaction (no intent can be recorded meanwhile;
    the index and the intents are read again there), and goes: rename the file (with
    its -wal, -shm and gate) aside, so that no process can open it any more by its
    name (a later first use creates a fresh shard, as for a key never used); look for
    any process holding one of them open or locked (``inspect.users_of``: an open
    SQLite WAL connection always holds a lock on the -shm, seen in /proc/locks for
    every user); read it again (still empty?); only then delete.  Otherwise it is put
    back, never over a file made meanwhile.  This process holds none of them: the
    store was closed before this step."""
    from fleetstore.core.targets import CATALOG, SHARDS
    from fleetstore.engine import inspect
    from fleetstore.engine.sharded import shard_key

    files = [
        _ShardFile(p.name[:-3], p)
        for p in sorted((directory / SHARDS).glob("*/*.db"))
        if shard_key(p.name[:-3]) == p.name[:-3]
    ]
    step.detail.update(files=len(files))
    found = read_journals(directory / f"{CATALOG}.spool")
    if found.doubt:
        step.status = "skipped"
        step.summary = f"empty shard files left: {found.doubt}"
        return
    horizon = time.time() - MIN_OPS_AGE
    if found.oldest_op is not None:
        horizon = min(horizon, found.oldest_op)
    catalog = Database.open(directory / CATALOG, **dataclasses.asdict(settings))
    try:
        q = sql.queries("sqlite")
        indexed, intended = catalog.read(lambda tx: _named_shards(tx, q))
        unnamed = [f for f in files if f.key not in indexed and f.key not in intended]
        empty: list[_ShardFile] = []
        young = unreadable = 0
        for f in unnamed:
            contents = _shard_contents(f.path)
            if contents is None:
                unreadable += 1
            elif contents[0] == 0 and contents[1] < horizon:
                empty.append(f)
            elif contents[0] == 0:
                young += 1
        step.detail.update(
            unnamed=len(unnamed),
            empty=len(empty),
            empty_young=young,
            unreadable=unreadable,
            orphans=len(unnamed) - len(empty) - young - unreadable,
        )
        notes = []
        if young:
            notes.append(f"{young} empty but applied to within the horizon, left for later")
        if step.detail["orphans"]:
            notes.append(
                f"{step.detail['orphans']} hold sessions the catalog does not list (see "
                "`fleetstore doctor`)"
            )
        tail = "".join(f"; {n}" for n in notes)
        if not empty:
            step.status = "nothing"
            step.summary = f"no empty shard file to remove (of {len(files)}){tail}"
            return
        if dry_run:
            step.status = "dry-run"
            step.summary = f"would remove {len(empty)} empty shard file(s) (of {len(files)}){tail}"
            return
        removed: list[str] = []
        kept: list[str] = []
        batch = Batch(16, 256)
        i = 0
        while i < len(empty):
            chunk = empty[i : i + batch.size]
            i += len(chunk)
            # Files in use now are left without being touched; the look inside the
            # transaction is for a process that opens one meanwhile.
            users = inspect.users_of([str(p) for f in chunk for p, _t in f.sides()])
            busy = [f for f in chunk if any(str(p) in users for p, _t in f.sides())]
            kept.extend(f.key for f in busy)
            chunk = [f for f in chunk if f not in busy]
            if not chunk:
                continue
            entered = time.monotonic()
            with catalog.write() as tx:
                began = time.monotonic()
                intended = {str(r[1]) for r in tx.execute(q["shard_intents"])}
                todo = [
                    f
                    for f in chunk
                    if f.key not in intended and not tx.execute(q["shard_index_ids"], (f.key,))
                ]
                kept.extend(f.key for f in chunk if f not in todo)
                _remove_unused(todo, horizon, inspect, removed, kept)
            step.record(began - entered, time.monotonic() - began)
            batch.update(len(chunk), step.last_hold)
            if progress is not None:
                progress("shards", i, len(empty))
    finally:
        catalog.close()
    step.detail.update(removed=len(removed), kept_in_use=len(kept))
    step.summary = f"removed {len(removed)} empty shard file(s) (of {len(files)})" + (
        f"; {len(kept)} in use or written meanwhile, kept" if kept else ""
    )
    step.summary += tail


def _named_shards(tx: Tx, q: dict[str, str]) -> tuple[set[str], set[str]]:
    """The shard keys the catalog's index names, and those an intent names."""
    indexed = {str(r[0]) for r in tx.execute(q["shard_list"])}
    intended = {str(r[1]) for r in tx.execute(q["shard_intents"])}
    return indexed, intended


def _remove_unused(
    todo: list[_ShardFile], horizon: float, inspect: Any, removed: list[str], kept: list[str]
) -> None:
    """Inside the catalog's write transaction: rename each file aside, look for users,
    read it again, then delete it or put it back (see ``_empty_shards``)."""
    moved: list[_ShardFile] = []
    for f in todo:
        done = []
        try:
            for src, dst in f.sides():
                try:
                    os.rename(src, dst)
                except FileNotFoundError:
                    continue
                done.append((src, dst))
        except OSError:
            _put_back(done)
            kept.append(f.key)
            continue
        moved.append(f)
    trashed = [str(dst) for f in moved for _src, dst in f.sides() if dst.exists()]
    users = inspect.users_of(trashed)
    for f in moved:
        sides = f.sides()
        busy = any(str(dst) in users for _src, dst in sides)
        contents = None if busy else _shard_contents(sides[0][1])
        if busy or contents is None or contents[0] or contents[1] >= horizon:
            if not _put_back([(src, dst) for src, dst in sides if dst.exists()]):
                log.error(
                    "%s: a process made a new file at its name while an empty shard was "
                    "set aside and found in use; the old one is kept at %s",
                    f.path,
                    sides[0][1],
                )
            kept.append(f.key)
            continue
        for _src, dst in sides:
            with contextlib.suppress(FileNotFoundError):
                dst.unlink()
        removed.append(f.key)


def _put_back(moved: list[tuple[Path, Path]]) -> bool:
    """Rename files set aside back, never over a file made at the name meanwhile."""
    ok = True
    for src, dst in moved:
        try:
            os.link(dst, src)
        except FileExistsError:
            ok = False
            continue
        except FileNotFoundError:
            continue
        dst.unlink()
    return ok


# -- text ----------------------------------------------------------------------------------------


def format_report(report: Report) -> str:
    kind = "fleetstore store" if report.kind == "fleetstore" else "foreign database"
    lines = [f"fleetstore maintain: {report.path} ({kind}){' (dry run)' if report.dry_run else ''}"]
    for s in report.steps:
        cost = ""
        if s.transactions:
            cost = (
                f"  [{s.transactions} tx, max hold {s.max_hold * 1000:.1f} ms, "
                f"max wait {s.max_wait * 1000:.1f} ms]"
            )
        mark = "FAILED " if s.status == "failed" else ""
        lines.append(f"  {s.name:<10} {mark}{s.summary}{cost}")
    if not report.dry_run:
        lines.append(
            f"  longest lock hold of a maintenance transaction: {report.max_hold * 1000:.1f} ms"
        )
    return "\n".join(lines)


def report_json(report: Report) -> str:
    return json.dumps(report.to_json(), indent=2)


__all__ = [
    "DEFAULT_OPS_AGE",
    "MIN_OPS_AGE",
    "TARGET_HOLD",
    "Batch",
    "Config",
    "Deleted",
    "NotConfirmed",
    "Report",
    "Step",
    "Tree",
    "Writer",
    "delete_tree",
    "format_age",
    "format_report",
    "maintain",
    "parse_age",
    "read_journals",
    "report_json",
    "session_trees",
    "verify_archive",
]
