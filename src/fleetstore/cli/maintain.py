"""The ``fleetstore maintain`` command (the work is in the package fleetstore.admin.maintain)."""

from __future__ import annotations

import sys
from typing import Any

import click

from fleetstore import errors
from fleetstore.cli.util import ProgressBars, emit_json, env, json_option, store_params


class Age(click.ParamType):  # type: ignore[type-arg]
    """An age: 30d, 12h, 90m, 45s, 2w (a bare number is seconds)."""

    name = "age"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from fleetstore.admin.maintain.config import parse_age

        if isinstance(value, float):
            return value
        try:
            return parse_age(str(value))
        except errors.InvalidInput as exc:
            self.fail(str(exc), param, ctx)


class OptionalAge(Age):
    """An age, or ``off``."""

    name = "age|off"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or (isinstance(value, str) and value.strip().lower() == "off"):
            return None
        return super().convert(value, param, ctx)


_EXIT = """\b
Exit codes:
  0  every step done (or nothing to do), or the dry run printed what would happen
  1  a step failed: the store failed or stayed locked past the write budget, the
     archive could not be written or read back (nothing was deleted), a session
     tree written to while it was being deleted was left partly deleted; or the
     file is not a SQLite database, or not in WAL mode (it is left alone)
  2  bad usage: no database or sharded store at --store (nothing is created), a bad
     age, an archive FILE that exists, --delete-older-than without --yes, a
     database that is not a fleetstore store without --yes"""


@click.command(name="maintain", epilog=_EXIT)
@store_params(
    legacy_argument=True,
    help="The store (or any SQLite database in WAL mode, with --yes): its file, a "
    "directory holding fleetstore.db, sqlite:///absolute/path, or a sharded store "
    "(sqlite+sharded:///DIR, or DIR). Default: $FLEETSTORE_URL, else DATA_DIR/fleetstore.db.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print what each step would do; change nothing.",
    **env("maintain", "dry-run"),
)
@click.option(
    "--yes",
    is_flag=True,
    help="Confirm --delete-older-than, and maintenance of a database that is not a "
    "fleetstore store (only the generic steps run on it).",
    **env("maintain", "yes"),
)
@click.option(
    "--archive-older-than",
    "archive",
    nargs=2,
    type=(Age(), click.Path(dir_okay=False, path_type=str)),
    default=None,
    metavar="AGE FILE",
    help="Export the session trees not written for AGE (e.g. 30d) to FILE (never "
    "overwritten), read FILE back whole, then delete them.",
    **env("maintain", "archive-older-than"),
)
@click.option(
    "--delete-older-than",
    type=Age(),
    default=None,
    metavar="AGE",
    help="Delete the session trees not written for AGE, without archiving (needs --yes).",
    **env("maintain", "delete-older-than"),
)
@click.option(
    "--ops-older-than",
    type=OptionalAge(),
    default="30d",
    show_default=True,
    metavar="AGE|off",
    help="Prune applied_ops rows (the exactly-once log) older than AGE, at least 1h; "
    "never one a spool journal could still replay.",
    **env("maintain", "ops-older-than"),
)
@click.option(
    "--blob-grace",
    type=Age(),
    default=None,
    metavar="AGE",
    help="Blob files younger than this are never collected. Default: max(10m, 3 x the "
    "write budget + 1m); must exceed every writer's write budget plus a minute.",
    **env("maintain", "blob-grace"),
)
@json_option("maintain")
def maintain_command(
    store: str | None,
    dry_run: bool,
    yes: bool,
    archive: tuple[float, str] | None,
    delete_older_than: float | None,
    ops_older_than: float | None,
    blob_grace: float | None,
    as_json: bool,
) -> None:
    """Maintain a store while its fleet keeps writing.

    Steps, in order: retention (--archive-older-than, --delete-older-than; top-level
    sessions with their subagents, deleted in batches), pruning of old applied_ops
    rows, blob garbage collection (rows and files nothing refers to, older than
    --blob-grace), the figures files (<db>.procs/) of processes that are gone,
    PRAGMA optimize, incremental vacuum in small batches, and a
    checkpoint (passive; the WAL is truncated only when no reader blocks it). Every
    step writes in short transactions through the normal write path; the report
    gives each step's transactions and longest lock hold. --store is the store's
    file, a directory holding fleetstore.db, or sqlite:///absolute/path (PATH as an
    argument still works, deprecated). On a database that is not a fleetstore store
    (another program's) only the generic steps run, with --yes, through one plain
    connection: no file of fleetstore's is made beside it.

    A sharded store (sqlite+sharded:///DIR, or DIR): every step on every file, the
    catalog then each shard, one open at a time; a blob file goes only when no file
    refers to it; then the shard files that hold no session and that nothing names are
    removed, once nothing was applied in them for an hour and no process has them open.
    """
    from fleetstore.admin.maintain.config import Config, NotConfirmed
    from fleetstore.admin.maintain.report import format_report
    from fleetstore.admin.maintain.run import maintain

    config = Config(
        path=store,
        dry_run=dry_run,
        yes=yes,
        archive_older_than=archive[0] if archive else None,
        archive_to=archive[1] if archive else None,
        delete_older_than=delete_older_than,
        ops_older_than=ops_older_than,
        blob_grace=blob_grace,
    )
    bars = ProgressBars()
    try:
        report = maintain(config, progress=bars)
    except (errors.InvalidInput, errors.NotFound, NotConfirmed) as exc:
        bars.close()
        click.echo(f"fleetstore maintain: {exc}", err=True)
        sys.exit(2)
    except (errors.FleetstoreError, OSError) as exc:
        bars.close()
        click.echo(f"fleetstore maintain: {exc}", err=True)
        sys.exit(1)
    bars.close()
    if as_json:
        emit_json(report.to_json())
    else:
        click.echo(format_report(report))
    sys.exit(0 if report.ok else 1)


__all__ = ["Age", "OptionalAge", "maintain_command"]
