"""A store's database files (its one file, or a sharded store's catalog and shards),
the size of a file, and the ``procs`` step: the figures files of processes that are gone."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from fleetstore.admin.maintain.report import Step
from fleetstore.engine.sqlite import Database
from fleetstore.store.procstats import procs_dir, remove_gone


def each_file(store: Any, fn: Callable[[str | None, Database], None]) -> None:
    """``fn(key, database)`` for every database file of *store*: its one file (key
    None), or a sharded store's catalog (key None) and then each shard, one at a time
    through the backend's ``each`` (a bounded cache of open files: linear in shards)."""
    store.backend.each(fn)


def file_count(store: Any) -> int:
    return len(store.backend.file_keys())


def file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def gone_processes(db_path: str, step: Step, dry_run: bool) -> None:
    """The ``procs`` step: remove ``<db>.procs/<pid>.json`` of every process that is
    gone (its PID and start time no longer name a running process), which doctor
    would otherwise keep showing; live processes' files are kept (``live`` counts the
    other processes')."""
    # This process's own file is not counted: whether its publisher wrote it yet is a
    # race (tests/admin/test_doctor.py saw 2 live processes for 1).
    gone, live = remove_gone(db_path, dry_run=dry_run, besides=os.getpid())
    step.detail.update(gone=len(gone), live=live)
    where = procs_dir(db_path)
    if not gone:
        step.status = "nothing"
        step.summary = f"no figures of a process that is gone in {where} ({live} live)"
    elif dry_run:
        step.status = "dry-run"
        step.summary = f"would remove the figures of {len(gone)} process(es) that are gone"
    else:
        step.summary = (
            f"removed the figures of {len(gone)} process(es) that are gone from {where} "
            f"({live} live kept)"
        )


__all__ = ["each_file", "file_count", "file_size", "gone_processes"]
