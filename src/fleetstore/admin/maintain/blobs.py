"""The ``blobs`` step: blob garbage collection, on every file of the store.

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

A writer that waited longer than the grace is not robbed either: after its commit or
spooling it touches each file it stored, or writes it again if it is gone
(``BlobStore.settle``), and step 3's second look at the mtime sees the touch.
tests/admin/test_blob_gc_grace.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fleetstore import sql
from fleetstore.admin.maintain.files import each_file, file_count, file_size
from fleetstore.admin.maintain.journals import read_journals
from fleetstore.admin.maintain.report import Progress, Step
from fleetstore.admin.maintain.writer import Batch, Writer
from fleetstore.core.files import private_dirs
from fleetstore.core.settings import Settings
from fleetstore.core.units import size as _size
from fleetstore.domain.blobs import COLLECTING, TOUCH_AFTER
from fleetstore.domain.maintenance import referenced
from fleetstore.engine.base import Tx
from fleetstore.engine.sqlite import Database

_SHA = re.compile(r"[0-9a-f]{64}")
_TRASH = re.compile(r"\.([0-9a-f]{64})\.gc-\d+")
_TMP = re.compile(r"\.([0-9a-f]{64})\.\d+\.[0-9a-f]+\.tmp")


def default_blob_grace(settings: Settings) -> float:
    """max(10 min, 3 x write_budget + TOUCH_AFTER): a writer stores a file, or makes a
    reused one younger than TOUCH_AFTER young again, at most a write budget before its
    reference commits or its operation is spooled."""
    return max(600.0, 3 * settings.write_budget + TOUCH_AFTER)


def collect_blobs(
    store: Any, step: Step, grace: float, dry_run: bool, progress: Progress | None
) -> None:
    """Blob garbage collection over every file of the store.  A sharded store's
    files share one blob directory, and each file has its own ``blobs`` rows for the
    payloads its rows refer to: a row is garbage when nothing in *its* file refers to
    it (deleted in that file's transaction, re-checked there), and a file only when
    no file has a row for it any more, every file read after ``started`` (the
    argument of the module docstring holds for each file's rows alike)."""
    with contextlib.ExitStack() as stack:
        if not dry_run:
            stack.enter_context(_collecting(store.blobs.directory))
        _collect(store, step, grace, dry_run, progress)


@contextlib.contextmanager
def _collecting(directory: Path) -> Iterator[None]:
    """A shared flock on the blob directory's COLLECTING file, taken before the
    collection notes its start: a writer that settles meanwhile touches its files
    (``BlobStore.settle``)."""
    private_dirs(directory)
    fd = os.open(directory / COLLECTING, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def _collect(
    store: Any, step: Step, grace: float, dry_run: bool, progress: Progress | None
) -> None:
    started = time.time()
    found = read_journals(store.spool_dir, store.keyring)
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
    if store.spans_files:
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
        size = file_size(str(path))
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
    if store.spans_files:
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


__all__ = ["collect_blobs", "default_blob_grace"]
