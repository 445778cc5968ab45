"""The ``shards`` step of a sharded store: the removal of the shard files that hold
no session and that nothing names (``empty_shards``), run after the store is closed."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

from fleetstore import errors, sql
from fleetstore.admin.maintain.config import MIN_OPS_AGE
from fleetstore.admin.maintain.journals import read_journals
from fleetstore.admin.maintain.report import Progress, Step
from fleetstore.admin.maintain.writer import Batch
from fleetstore.core.keys import keyring_of
from fleetstore.core.logs import logger
from fleetstore.core.settings import Settings
from fleetstore.core.targets import CATALOG
from fleetstore.engine.base import Tx
from fleetstore.engine.gate import announce_moved
from fleetstore.engine.sqlite import Database
from fleetstore.files import foreign, inspect, processes
from fleetstore.store.sharded.shards import shard_files

log = logger("fleetstore")


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
    """(sessions, newest applied_ops time) of a shard file, read strictly read-only
    (``engine.foreign``: re-checked after an immutable read); None if it cannot be
    read without side effects."""

    def read(db: inspect.ReadOnlyDatabase) -> tuple[int, float]:
        sessions, newest = db.query(
            "SELECT (SELECT count(*) FROM sessions), "
            "(SELECT coalesce(max(applied_at), 0) FROM applied_ops)"
        )[0]
        return int(sessions), float(newest)

    try:
        return foreign.read_foreign(path, read)
    except inspect.InspectFailed as exc:
        return (0, 0.0) if exc.reason == "empty" else None
    except (OSError, errors.FleetstoreError):
        return None


def empty_shards(
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
    any process holding one of them open or locked (``processes.users_of``: an open
    SQLite WAL connection always holds a lock on the -shm, seen in /proc/locks for
    every user); read it again (still empty?); only then delete.  Otherwise it is put
    back, never over a file made meanwhile.  This process holds none of them: the
    store was closed before this step."""

    files = [_ShardFile(key, path) for key, path in shard_files(directory)]
    step.detail.update(files=len(files))
    found = read_journals(directory / f"{CATALOG}.spool", keyring_of(settings.encryption_key_file))
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
            users = processes.users_of([str(p) for f in chunk for p, _t in f.sides()])
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
                _remove_unused(todo, horizon, removed, kept)
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
    todo: list[_ShardFile], horizon: float, removed: list[str], kept: list[str]
) -> None:
    """Inside the catalog's write transaction: rename each file aside, look for users,
    read it again, then delete it or put it back (see ``empty_shards``)."""
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
    users = processes.users_of(trashed)
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
        announce_moved(sides[-1][1])  # (a process that opened it since: it looks, it is gone)
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


__all__ = ["empty_shards"]
