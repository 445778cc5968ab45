"""The ``fleetstore migrate`` command (the work is in fleetstore.transfer.migrate)."""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable
from typing import NoReturn

import click

from fleetstore import errors
from fleetstore.cli.util import ProgressBars, emit_json, env, json_option
from fleetstore.transfer.migrate.report import DEFAULT_BATCH_ROWS, MigrateReport

_EXIT = """\b
Exit codes:
  0  every table copied (or already copied by an earlier run) and verified equal;
     with --verify-only: the two stores are equal
  1  the stores differ (the table, its row counts and SHA-256s are named, or a
     session of a sharded store), a blob is missing or damaged, the schemas differ,
     another migrate writes to DST, or a store failed or stayed busy past the write
     budget (run it again: it carries on)
  2  bad usage: SRC does not exist (nothing is created), SRC and DST are the same
     store, DST holds data that is not an interrupted migrate of SRC, or is a directory
     holding other files (nothing is written), with --verify-only a SQLite DST that
     does not exist, a bad --batch-rows"""


def raise_open_file_limit() -> None:
    """Let this process open as many files as it may (the hard limit, at most 65536):
    a sharded store is a file per session tree, and copying one is faster with many
    of them open at once (fleetstore.transfer.migrate sizes its cache of open shards by it)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (OSError, ValueError):
        pass


@click.command(name="migrate", epilog=_EXIT)
@click.argument("src", metavar="SRC")
@click.argument("dst", metavar="DST")
@click.option(
    "--batch-rows",
    type=click.IntRange(1, 100_000),
    default=DEFAULT_BATCH_ROWS,
    show_default=True,
    metavar="N",
    help="Rows per batch: one read transaction on SRC and one write transaction on DST.",
    **env("migrate", "batch-rows"),
)
@click.option(
    "--verify-only",
    is_flag=True,
    help="Copy nothing: compare SRC and DST table by table (row counts and SHA-256 of "
    "the rows in key order) and check every blob of DST.",
    **env("migrate", "verify-only"),
)
@json_option("migrate")
def migrate_command(src: str, dst: str, batch_rows: int, verify_only: bool, as_json: bool) -> None:
    """Copy a whole store from SRC to DST, SQLite or PostgreSQL either way, and verify.

    SRC and DST are store paths or URLs: /path/store.db, a directory holding
    fleetstore.db, sqlite:///absolute/path, a sharded store (sqlite+sharded:///DIR, or
    the directory holding its catalog.db), postgresql://user@host:port/db. DST (a
    SQLite file or sharded directory is created if needed) must be empty. A sharded
    store is read file by file, and written with each row in the file its layout
    keeps it in (as fleetstore reshard does). Every table is copied in key
    order, parents first, in batches, each batch one transaction through the normal
    write path; blob payloads go before the rows that refer to them. Interrupted
    (even by kill -9), the same command carries on where it stopped. Then both
    stores are compared: per table the row count and a SHA-256 over every row, and
    every blob of DST is read back against its hash. Stop the fleet writing to SRC
    first: writes made meanwhile make the verification fail. When either store is
    sharded, rows are compared per table by a digest that does not depend on their
    order, and every session's content digest is compared too.
    """
    from fleetstore.transfer.migrate.run import migrate, verify_report

    run_copy(
        "migrate",
        migrate,
        verify_report,
        src,
        dst,
        batch_rows,
        verify_only,
        as_json,
    )


__all__ = ["migrate_command"]


def run_copy(
    command: str,
    copy: Callable[..., MigrateReport],
    verify: Callable[..., MigrateReport],
    src: str,
    dst: str,
    batch_rows: int,
    verify_only: bool,
    as_json: bool,
) -> NoReturn:
    """``fleetstore migrate`` and ``fleetstore reshard``: copy (or only verify) with
    progress bars, print the report, exit 0 (equal), 1 (differ, failed) or 2 (usage)."""
    from fleetstore.transfer.migrate.report import VerificationFailed, format_report

    raise_open_file_limit()
    bars = ProgressBars()
    try:
        if verify_only:
            report = verify(src, dst, batch_rows=batch_rows, progress=bars)
        else:
            report = copy(src, dst, batch_rows=batch_rows, progress=bars)
    except VerificationFailed as exc:
        bars.close()
        report = exc.report
    except (errors.InvalidInput, errors.NotFound, errors.ConfigError, errors.AlreadyExists) as exc:
        bars.close()
        click.echo(f"fleetstore {command}: {exc}", err=True)
        sys.exit(2)
    except (errors.FleetstoreError, OSError) as exc:
        bars.close()
        click.echo(f"fleetstore {command}: {exc}", err=True)
        sys.exit(1)
    bars.close()
    if as_json:
        emit_json(report.to_json())
    else:
        click.echo(format_report(report, command))
    if not report.ok:
        for problem in report.problems:
            click.echo(f"fleetstore {command}: MISMATCH: {problem}", err=True)
        sys.exit(1)
    sys.exit(0)
