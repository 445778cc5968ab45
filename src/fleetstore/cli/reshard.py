"""``fleetstore reshard`` and ``fleetstore sessions archive-tree|restore-tree`` (the
work is in fleetstore.transfer.reshard and fleetstore.transfer.archive)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

import fleetstore
from fleetstore import errors
from fleetstore.cli.migrate import raise_open_file_limit, run_copy
from fleetstore.cli.util import emit_json, env, existing_store, json_option
from fleetstore.cli.util import store_params as _store_params
from fleetstore.transfer.migrate.report import DEFAULT_BATCH_ROWS

if TYPE_CHECKING:
    from fleetstore.transfer.archive import TreeArchive

_EXIT = """\b
Exit codes:
  0  every table copied (or already copied by an earlier run) and verified equal, every
     session's content digest equal; with --verify-only: the two stores are equal
  1  the stores differ (the table or session is named), a blob is missing or damaged,
     a store failed or stayed busy past the write budget (run it again: it carries on);
     another process could write to SRC (each pid is named; stop them and run it
     again: a copy this run began is then thrown away and made again)
  2  bad usage: SRC does not exist (nothing is created), SRC or DST is PostgreSQL (use
     fleetstore migrate), SRC and DST are the same store, DST exists and is neither
     empty nor an interrupted reshard of SRC (nothing is written), a bad --batch-rows"""


@click.command(name="reshard", epilog=_EXIT)
@click.argument("src", metavar="SRC")
@click.argument("dst", metavar="DST")
@click.option(
    "--batch-rows",
    type=click.IntRange(1, 100_000),
    default=DEFAULT_BATCH_ROWS,
    show_default=True,
    metavar="N",
    help="Rows per write transaction on DST (and per read transaction on SRC).",
    **env("reshard", "batch-rows"),
)
@click.option(
    "--verify-only",
    is_flag=True,
    help="Copy nothing: compare SRC and DST as a reshard verifies its copy.",
    **env("reshard", "verify-only"),
)
@json_option("reshard")
def reshard_command(src: str, dst: str, batch_rows: int, verify_only: bool, as_json: bool) -> None:
    """Copy a SQLite store into the other layout, single file <-> sharded, and verify.

    SRC is a store file (or a directory holding fleetstore.db), or a sharded store
    (its directory, or sqlite+sharded:///DIR). DST, a path, is taken in the other
    layout: a sharded store's directory for a single-file SRC, a file for a sharded
    SRC; sqlite+sharded:///DIR or sqlite:///FILE chooses the layout (sharded to
    sharded too). DST must not exist, or be empty. Every row goes where the sharded
    layout keeps it (a session tree with its messages, parts, state and operation
    log in the file of its root; effects, checkpoints and ADK sessions in the
    catalog), in batches through the write path; blob payloads are copied and
    checked against their hashes. Interrupted (even by kill -9), the same command
    carries on. Then per table the row count and a digest of every row, every blob
    of DST, every session's content digest (read through the store API on both
    sides) and the catalog's index of each shard are checked. Stop the fleet writing
    to SRC first: a reshard refuses to start while another process could write to
    SRC, and stops if one comes; a copy that no longer fits SRC (written since an
    interrupted run) is thrown away and made again, never carried on.
    """
    from fleetstore.transfer import reshard as _reshard

    run_copy(
        "reshard",
        _reshard.reshard,
        _reshard.verify_report,
        src,
        dst,
        batch_rows,
        verify_only,
        as_json,
    )


@contextmanager
def _sharded(command: str, store: str | None) -> Iterator[fleetstore.Store]:
    url = existing_store(command, store, server=False)
    try:
        opened = fleetstore.open(url)
    except (errors.FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore {command}: {exc}", err=True)
        sys.exit(1)
    try:
        if opened.layout != "sharded":
            click.echo(
                f"fleetstore {command}: {opened.url} is not a sharded store (a single file "
                "keeps every tree in it; fleetstore reshard converts a store)",
                err=True,
            )
            sys.exit(2)
        yield opened
    except (errors.InvalidInput, errors.NotFound, errors.AlreadyExists) as exc:
        click.echo(f"fleetstore {command}: {exc}", err=True)
        sys.exit(2)
    except (errors.FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore {command}: {exc}", err=True)
        sys.exit(1)
    finally:
        opened.close(timeout=0)


def _print(command: str, done: TreeArchive, as_json: bool, verb: str) -> None:
    if as_json:
        emit_json(done.to_json())
    else:
        click.echo(
            f"fleetstore {command}: tree {done.key} ({done.sessions} sessions, "
            f"{done.messages} messages, {done.blobs} blobs) {verb}"
            + (" [resumed]" if done.resumed else "")
        )
    for problem in done.problems:
        click.echo(f"fleetstore {command}: MISMATCH: {problem}", err=True)


_ARCHIVE_EXIT = """\b
Exit codes:
  0  the tree's file and a copy of its blobs are in DIR; the store no longer lists it
  1  the store failed, stayed busy past the write budget, a write to the tree was under
     way, or a blob of the tree is missing or damaged (nothing was moved; run it again)
  2  bad usage: no sharded store at --store (nothing is created), no such session, a
     session the catalog keeps (ADK), DIR is a file or already holds this tree"""


@click.command(name="archive-tree", epilog=_ARCHIVE_EXIT)
@click.argument("session_id", metavar="SESSION")
@click.option(
    "--to",
    "dest",
    required=True,
    metavar="DIR",
    help="The archive directory (created if needed): DIR/KEY.db, DIR/KEY.blobs/, DIR/KEY.json.",
    **env("sessions archive-tree", "to"),
)
@json_option("sessions archive-tree")
@_store_params()
def archive_tree_command(session_id: str, dest: str, as_json: bool, store: str | None) -> None:
    """Move a session tree's file out of a sharded store, into DIR.

    The tree of SESSION (its root, subagents and forks: one shard file) leaves the
    store with a copy of every blob it refers to, so DIR/KEY.db, DIR/KEY.blobs/ and
    DIR/KEY.json (its sessions with their content digests) are self-contained; the
    catalog stops listing it. The file refuses writes first: a process that still
    has it open gets an error naming it archived, never a write into the moved file.
    Interrupted, the same command carries on. fleetstore sessions restore-tree puts
    it back.
    """
    from fleetstore.transfer import archive as _archive

    command = "sessions archive-tree"
    with _sharded(command, store) as opened:
        done = _archive.archive_tree(opened, session_id, dest)
        _print(command, done, as_json, f"moved to {done.archive}")


_RESTORE_EXIT = """\b
Exit codes:
  0  the tree is back in the store, every session's content digest as when archived
  1  the store failed or stayed busy, a blob of the archive is missing or damaged, or a
     session's digest differs from the archived one (named; the archive's leftovers kept)
  2  bad usage: no sharded store at --store, no archived tree at ARCHIVE, or the store
     holds one of its sessions (or its shard) again: nothing was restored"""


@click.command(name="restore-tree", epilog=_RESTORE_EXIT)
@click.argument("archive", metavar="ARCHIVE")
@json_option("sessions restore-tree")
@_store_params()
def restore_tree_command(archive: str, as_json: bool, store: str | None) -> None:
    """Move an archived session tree (ARCHIVE: DIR/KEY.db) back into a sharded store.

    Its blobs go back first (checked against their hashes), then its file, then the
    catalog lists its sessions again; each session's content digest is compared
    with the one recorded when it was archived. Interrupted, the same command
    carries on.
    """
    from fleetstore.transfer import archive as _archive

    command = "sessions restore-tree"
    with _sharded(command, store) as opened:
        done = _archive.restore_tree(opened, archive)
        _print(command, done, as_json, "restored")
        if not done.ok:
            sys.exit(1)


__all__ = [
    "archive_tree_command",
    "raise_open_file_limit",
    "reshard_command",
    "restore_tree_command",
]
