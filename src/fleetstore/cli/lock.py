"""``fleetstore lock``: hold a store's write lock as an outside process would (the work
is in fleetstore.admin.lock)."""

from __future__ import annotations

import sys

import click

from fleetstore.cli.util import env, json_option, store_params


@click.command(
    epilog="""\b
Exit codes:
  0  the lock was taken, held and released (also when SIGTERM/SIGINT ended the hold)
  1  SQLite error (not a database, I/O error)
  2  bad usage, or the database is not an existing file (lock never creates one)
  3  the lock was not taken within --wait seconds (or a signal arrived while waiting)""",
)
@store_params(
    legacy_argument=True,
    help="The database: any SQLite file, a sharded store (sqlite+sharded:///DIR or DIR) or "
    "postgresql://... Default: $FLEETSTORE_URL, else DATA_DIR/fleetstore.db.",
)
@click.option(
    "--hold",
    type=click.FloatRange(min=0),
    required=True,
    **env("lock", "hold"),
    help="Seconds to hold the lock once taken ('inf': until SIGTERM/SIGINT).",
)
@click.option(
    "--exclusive",
    is_flag=True,
    default=False,
    **env("lock", "exclusive"),
    help="BEGIN EXCLUSIVE instead of BEGIN IMMEDIATE (also keeps out readers of a "
    "non-WAL database).",
)
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    **env("lock", "wait"),
    help="Seconds to wait for the lock before giving up (exit 3).",
)
@json_option("lock", each="event (locked, released)")
def lock(store: str | None, hold: float, exclusive: bool, wait: float, as_json: bool) -> None:
    """Hold a database's write lock as a process that does not use fleetstore would.

    Opens the database (--store) with raw apsw (not through fleetstore's writer gate), runs BEGIN
    IMMEDIATE, prints `locked PATH pid=PID`, holds the lock for --hold seconds,
    rolls back and prints `released PATH after X.XXs`. SIGTERM and SIGINT release
    the lock early. Use it to test how any program copes with a busy database.

    It may be a sharded store (sqlite+sharded:///DIR or DIR): its catalog and
    then every shard file are locked. It may be a postgresql:// URL: every
    table of the database is then locked IN EXCLUSIVE MODE (ACCESS EXCLUSIVE with --exclusive) from a connection of
    its own: reads go on, every write waits.
    """
    from fleetstore.admin import lock as lockdriver

    if store is None:
        from fleetstore.core.targets import parse_target

        store = str(parse_target(None)[1])
    sys.exit(lockdriver.hold_lock(store, hold, exclusive=exclusive, wait=wait, as_json=as_json))
