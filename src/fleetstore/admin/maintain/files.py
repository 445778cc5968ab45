"""A store's database files (its one file, or a sharded store's catalog and shards),
and the size of a file."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from fleetstore.engine.sqlite import Database


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


def file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


__all__ = ["each_file", "file_count", "file_size"]
