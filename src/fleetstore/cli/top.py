"""``fleetstore top``: a live view of a store (the work is in fleetstore.admin.top)."""

from __future__ import annotations

import sys

import click

from fleetstore.cli.util import env as _env
from fleetstore.cli.util import existing_store as _existing_store
from fleetstore.cli.util import json_option, store_params
from fleetstore.errors import FleetstoreError


@click.command(
    epilog="""\b
Keys (on a terminal): q quits; so does Ctrl-C.
Exit codes:
  0  quit, or --count frames shown
  1  the store could not be opened
  2  bad usage, or there is no store at --store (nothing is created)""",
)
@store_params(legacy_argument=True)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    help="Seconds between frames.",
    **_env("top", "interval"),
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="Show this many frames, then exit (each with rates over the last interval).",
    **_env("top", "count"),
)
@json_option("top", each="frame")
def top(store: str | None, interval: float, count: int | None, as_json: bool) -> None:
    """A live view of a store: the processes using it, writes/s, lock-wait p99,
    retries and spooled writes per process, the database and WAL sizes, the
    outbox by state, who holds the write lock, and any process whose read
    transaction keeps the WAL from being reset (how long, how much it grew).

    Processes publish their figures beside the store about once a second
    (`publish_interval`); rates and p99 are over the last interval. --store: the
    store (default: $FLEETSTORE_URL, else the default store); a sharded store
    (sqlite+sharded:///DIR, or DIR) adds its shard files on disk, the shards the
    processes have open and the largest shard WAL.
    """
    from fleetstore.admin import top as top_view
    from fleetstore.store.readonly import open_read_only

    db = _existing_store("top", store, server=False)
    try:
        opened = open_read_only(db)
    except (FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore top: {exc}", err=True)
        sys.exit(1)
    try:
        top_view.run(db, opened.effects.counts, interval, count, sys.stdout, as_json)
    except KeyboardInterrupt:
        pass
    finally:
        opened.close()
