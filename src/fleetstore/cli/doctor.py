"""The ``fleetstore doctor`` command (the work is in fleetstore.admin.doctor)."""

from __future__ import annotations

import sys

import click

from fleetstore import errors
from fleetstore.cli.util import emit_json, env, json_option, settings_keyring, store_params


@click.command(
    name="doctor",
    epilog="""\b
Exit codes (a script that tests 0 / not 0 reads "healthy or not"):
  0  healthy: every check passed
  1  warnings: works now, but something is a risk or wastes space (see the findings)
  2  bad usage, or nothing to check: the database does not exist or is not a SQLite
     database (no report)
  3  problems (damage, a deleted file held open, a hot journal, world-writable files...)""",
)
@store_params(
    legacy_argument=True,
    help="The database: any SQLite file, a directory holding fleetstore.db, "
    "sqlite:///absolute/path, or a sharded store (sqlite+sharded:///DIR, or DIR). "
    "Default: $FLEETSTORE_URL, else DATA_DIR/fleetstore.db.",
)
@json_option("doctor")
@click.option(
    "--interval",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    **env("doctor", "interval"),
    help="Seconds between the two looks at the locks: a lock seen both times was held at "
    "least that long (0: look twice at once).",
)
@click.option(
    "--quick-check/--no-quick-check",
    default=True,
    show_default=True,
    **env("doctor", "quick-check"),
    help="Run PRAGMA quick_check (reads every page; on a rollback-journal database it holds "
    "a shared lock meanwhile, which delays writers' commits).",
)
@click.option(
    "--sizes/--no-sizes",
    default=True,
    show_default=True,
    **env("doctor", "sizes"),
    help="Measure every table and index with SQLite's dbstat (reads every page, as "
    "quick_check does).",
)
def doctor_command(
    store: str | None, as_json: bool, interval: float, quick_check: bool, sizes: bool
) -> None:
    """Check any SQLite database, fleetstore's or another program's, strictly read-only.

    --store is a database file, a directory holding fleetstore.db, or
    sqlite:///absolute/path; default $FLEETSTORE_URL, else DATA_DIR/fleetstore.db (PATH
    as an argument still works, deprecated). A sharded store (sqlite+sharded:///DIR, or
    DIR) is checked whole: its catalog, every shard file, the catalog's index against the
    files (missing, orphan and empty shards) and the catalog+shard writes left
    unfinished. Reports the journal mode, page size, sizes of the database/WAL/SHM
    files, the bytes of every table and index (the largest named: where the file
    grows), freelist share, auto_vacuum, the SQLite library version (flagging the
    WAL-reset bug), which processes hold the file open and which locks they hold
    (naming the WAL write lock's holder and readers that keep the WAL from being
    reset), quick_check, and for a fleetstore store its schema version, settings,
    outbox backlog and spool journals; for another program's file, what busy timeout
    its writers need. Each finding says how to fix it, worst first. Nothing is
    written: no byte of the files changes, no -wal/-shm is created, nothing is
    checkpointed. Processes of other users are visible only to root.
    """
    from fleetstore.admin.doctor import diagnose
    from fleetstore.admin.doctor.report import EXIT_USAGE, format_report

    try:
        report = diagnose(
            store,
            interval=interval,
            quick_check=quick_check,
            sizes=sizes,
            keyring=settings_keyring(),
        )
    except errors.ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    except errors.NotFound as exc:
        click.echo(f"fleetstore doctor: {exc} (nothing was created)", err=True)
        sys.exit(EXIT_USAGE)
    except (errors.FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore doctor: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    if as_json:
        emit_json(report.to_json())
    else:
        click.echo(format_report(report))
    sys.exit(report.exit_code)


__all__ = ["doctor_command"]
