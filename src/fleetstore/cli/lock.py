"""``fleetstore lock``: hold a store's write lock as an outside process would (the work
is in fleetstore.admin.lock)."""

from __future__ import annotations

import sys

import click

from fleetstore.admin import lock as lockdriver


@click.command(
    epilog="""\b
Exit codes:
  0  the lock was taken, held and released (also when SIGTERM/SIGINT ended the hold)
  1  SQLite error (not a database, I/O error)
  2  bad usage, or PATH is not an existing file (lock never creates a database)
  3  the lock was not taken within --wait seconds (or a signal arrived while waiting)""",
)
@click.argument("path", type=click.Path(dir_okay=True, path_type=str))
@click.option(
    "--hold",
    type=click.FloatRange(min=0),
    required=True,
    envvar="FLEETSTORE_LOCK_HOLD",
    show_envvar=True,
    help="Seconds to hold the lock once taken ('inf': until SIGTERM/SIGINT).",
)
@click.option(
    "--exclusive",
    is_flag=True,
    default=False,
    envvar="FLEETSTORE_LOCK_EXCLUSIVE",
    show_envvar=True,
    help="BEGIN EXCLUSIVE instead of BEGIN IMMEDIATE (also keeps out readers of a "
    "non-WAL database).",
)
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    envvar="FLEETSTORE_LOCK_WAIT",
    show_envvar=True,
    help="Seconds to wait for the lock before giving up (exit 3).",
)
def lock(path: str, hold: float, exclusive: bool, wait: float) -> None:
    """Hold PATH's write lock as a process that does not use fleetstore would.

    Opens PATH with raw apsw (not through fleetstore's writer gate), runs BEGIN
    IMMEDIATE, prints `locked PATH pid=PID`, holds the lock for --hold seconds,
    rolls back and prints `released PATH after X.XXs`. SIGTERM and SIGINT release
    the lock early. Use it to test how any program copes with a busy database.

    PATH may be a sharded store (sqlite+sharded:///DIR or DIR): its catalog and
    then every shard file are locked. PATH may be a postgresql:// URL: every
    table of the database is then locked IN EXCLUSIVE MODE (ACCESS EXCLUSIVE with --exclusive) from a connection of
    its own: reads go on, every write waits.
    """
    sys.exit(lockdriver.hold_lock(path, hold, exclusive=exclusive, wait=wait))
