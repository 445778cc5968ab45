"""Adapters that let agent frameworks keep their state in a fleetstore store.

Each lives in its own module and imports its framework, which is an optional
dependency (``pip install 'fleetstore[langgraph]'``): importing this package
imports none of them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from fleetstore import errors
from fleetstore.store.aio import AsyncStore
from fleetstore.store.facade import Store
from fleetstore.store.facade import open as open_store


def adopt_store(
    store: Store | AsyncStore | str | os.PathLike[str] | None, settings: dict[str, Any], what: str
) -> tuple[Store, bool]:
    """The ``Store`` an adapter works on, and whether the adapter owns it (opened it
    from a path or URL, so closes it).  An open store (sync or async) is used as it
    is: *settings* would be ignored, so they are refused."""
    if isinstance(store, Store | AsyncStore):
        if settings:
            raise errors.ConfigError(
                f"settings apply when the {what} opens the store; this one is open already"
            )
        return (store.sync if isinstance(store, AsyncStore) else store), False
    return open_store(store, **settings), True


T = TypeVar("T")


def run_import(
    store: str | None,
    do_import: Callable[[Store], T],
    describe: Callable[[T], str],
    stopped: str = "the import stopped midway",
    *,
    as_json: bool = False,
) -> int:
    """The body of ``fleetstore import --from <framework> FILE``: opens *store*,
    runs *do_import* on it, prints ``describe(summary)`` (*as_json*: the summary, a
    dataclass, as one JSON object) on stdout or the reason on stderr, and returns
    the exit code (0 imported and verified; 1 rejected with
    nothing written, stopped midway, or not verified).  ``ConfigError`` (a bad
    ``--store``) is raised for the command to report as bad usage."""
    try:
        with open_store(store) as opened:
            summary = do_import(opened)
    except errors.ConfigError:
        raise
    except errors.StoreBusy as exc:
        print(
            f"fleetstore import: {exc}; {stopped} (what was imported stays; "
            "importing the file again is safe)",
            file=sys.stderr,
        )
        return 1
    except (errors.FleetstoreError, OSError) as exc:
        print(f"fleetstore import: {exc}", file=sys.stderr)
        return 1
    if as_json:
        import dataclasses
        import json

        print(json.dumps(dataclasses.asdict(summary), default=str))  # type: ignore[call-overload]
    else:
        print(describe(summary))
    return 0


def check_threads(threads: object) -> int:
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise errors.ConfigError(f"threads must be an integer >= 1, not {threads!r}")
    return threads


__all__ = ["adopt_store", "check_threads", "run_import"]
