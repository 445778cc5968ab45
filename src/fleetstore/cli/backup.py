"""``fleetstore backup`` and ``fleetstore restore`` (the work is in
fleetstore.admin.backup)."""

from __future__ import annotations

import sys

import click

from fleetstore import errors
from fleetstore.cli.util import (
    ProgressBars,
    emit_json,
    env,
    existing_store,
    json_option,
    settings_keyring,
    store_params,
)
from fleetstore.cli.util import size as _size


@click.command(
    name="backup",
    epilog="""\b
Exit codes:
  0  DEST holds the backup, read back and verified
  1  the store failed, or the copy did not check out (the store's damage is named):
     nothing is left at DEST; or --store is not a fleetstore store
  2  bad usage: no store at --store (nothing is created), DEST exists, or a PostgreSQL
     store (back it up with pg_dump: docs/backup.md)""",
)
@click.argument("dest", type=click.Path(path_type=str))
@json_option("backup")
@store_params()
def backup_command(dest: str, as_json: bool, store: str | None) -> None:
    """Back up a SQLite store (a file or a sharded directory) into the new directory
    DEST while its fleet writes: every database file as of one commit (SQLite's online
    backup), with every blob file its rows name, each read back and checked
    (integrity_check, every blob's hash). DEST is itself a store (--store DEST reads
    it) with a manifest, backup.json; it appears only once whole. Blob garbage
    collection (fleetstore maintain) waits while it runs."""
    from fleetstore.admin.backup import backup

    source = existing_store("backup", store)
    bars = ProgressBars()
    try:
        copied = backup(source, dest, progress=bars, keyring=settings_keyring())
    except (errors.ConfigError, errors.AlreadyExists, errors.NotFound) as exc:
        bars.close()
        click.echo(f"fleetstore backup: {exc}", err=True)
        sys.exit(2)
    except (errors.FleetstoreError, OSError) as exc:
        bars.close()
        click.echo(f"fleetstore backup: {exc} (nothing was left at {dest})", err=True)
        sys.exit(1)
    bars.close()
    if as_json:
        emit_json(copied.to_json())
        return
    waited = (
        f"; waited {copied.waited_for_collection:.1f}s for a blob collection"
        if copied.waited_for_collection >= 0.1
        else ""
    )
    click.echo(
        f"fleetstore backup: {len(copied.files)} database file(s) "
        f"({_size(copied.database_bytes)}) and {copied.blobs} blob(s) "
        f"({_size(copied.blob_bytes)}) -> {copied.path}, verified, in {copied.seconds:.1f}s"
        f"{waited}"
    )


@click.command(
    name="restore",
    epilog="""\b
Exit codes:
  0  the store is restored and verified (with --verify-only: the backup checks out)
  1  the backup does not check out (what is wrong is named; nothing was restored), or
     copying failed (nothing is left at the target)
  2  bad usage: no backup at BACKUP, something of a store is already at --store (never
     written over), a target of the wrong kind or a PostgreSQL one""",
)
@click.argument("backup_dir", metavar="BACKUP", type=click.Path(path_type=str))
@click.option(
    "--verify-only",
    is_flag=True,
    help="Check the backup (its files' hashes, integrity_check, every blob) and restore nothing.",
    **env("restore", "verify-only"),
)
@json_option("restore")
@store_params(
    help="The store to create from the backup: a file path (or sqlite:///path), or "
    "sqlite+sharded:///DIR for a backup of a sharded store. Nothing may be there yet. "
    "Default: $FLEETSTORE_URL, else DATA_DIR/fleetstore.db."
)
def restore_command(backup_dir: str, verify_only: bool, as_json: bool, store: str | None) -> None:
    """Restore a store from a backup made by `fleetstore backup`: the backup is
    checked whole first (each database file against the manifest's hash, SQLite's
    integrity_check, every blob read back), copied beside the target under temporary
    names (mode 0600, directories 0700), renamed into place, blobs first, and the
    result checked again. It never writes over a store: move the old one away first."""
    from fleetstore.admin.backup import restore, verify_backup

    bars = ProgressBars()
    try:
        if verify_only:
            _manifest, copied = verify_backup(backup_dir, progress=bars, keyring=settings_keyring())
        else:
            copied = restore(backup_dir, store, progress=bars, keyring=settings_keyring())
    except (errors.ConfigError, errors.AlreadyExists, errors.NotFound) as exc:
        bars.close()
        click.echo(f"fleetstore restore: {exc}", err=True)
        sys.exit(2)
    except (errors.FleetstoreError, OSError) as exc:
        bars.close()
        click.echo(f"fleetstore restore: {exc}", err=True)
        sys.exit(1)
    bars.close()
    if as_json:
        emit_json(copied.to_json())
        return
    what = "checks out" if verify_only else f"restored to {copied.path}, verified"
    click.echo(
        f"fleetstore restore: {backup_dir}: {len(copied.files)} database file(s) "
        f"({_size(copied.database_bytes)}) and {copied.blobs} blob(s) {what}"
    )


__all__ = ["backup_command", "restore_command"]
