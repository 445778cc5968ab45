"""``fleetstore recover``: replay the spool journals dead processes left beside a store
(the work is fleetstore.store.facade.recover_journals)."""

from __future__ import annotations

import sys

import click

import fleetstore
from fleetstore.cli.util import emit_json, json_option, store_params
from fleetstore.errors import ConfigError, FleetstoreError


@click.command(
    epilog="""\b
Exit codes:
  0  every journal of a dead process was replayed and deleted, or there was none
     (journals of live processes are theirs to replay and are left alone)
  1  an operation was rejected (kept in STORE.spool/rejected.jsonl), a journal is
     damaged (kept: a whole line fails its checksum, or an operation's blob file
     is missing), the replay stopped unfinished (the store stayed locked past the
     budget, or failed; the journal is kept), the store is not a fleetstore store
     (it is left unchanged), or the store could not be opened
  2  bad usage, or there is no store at --store (nothing is created)""",
)
@store_params(legacy_argument=True)
@click.option(
    "--write-budget",
    type=click.FloatRange(min=0),
    default=None,
    envvar="FLEETSTORE_WRITE_BUDGET",
    show_envvar=True,
    help="Seconds each replayed write may wait for the lock before the replay stops "
    "unfinished. Default: the store's (60).",
)
@json_option("recover")
def recover(store: str | None, write_budget: float | None, as_json: bool) -> None:
    """Replay the spool journals that dead processes left beside a store.

    --store is the store's file, a directory holding fleetstore.db, or
    sqlite:///absolute/path; default $FLEETSTORE_URL, else DATA_DIR/fleetstore.db.
    Each journal whose process is gone is replayed in order and deleted; a live
    process's journal is left alone (busy). A torn last line (no newline: a crash
    mid-append, never acknowledged) is ignored; any other bad line, and an
    operation whose blob file is missing or damaged, stops the replay there and
    keeps the journal for a person. Operations that can no longer apply are kept,
    with the reason, in STORE.spool/rejected.jsonl. Replaying twice changes nothing.
    """
    import logging

    from fleetstore.cli import logs
    from fleetstore.store.facade import recover_journals
    from fleetstore.store.spool import REJECTED, rejected_records

    # What the library logs about the replay is all in the report below (unless -v/-q).
    logs.default_level(logging.CRITICAL + 1)
    settings = {} if write_budget is None else {"write_budget": write_budget}
    try:
        store_path, results = recover_journals(store, **settings)
    except fleetstore.NotFound as exc:
        click.echo(f"fleetstore recover: {exc} (nothing was created)", err=True)
        sys.exit(2)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    except (FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore recover: {exc}", err=True)
        sys.exit(1)
    spool_dir = f"{store_path}.spool"
    rejected_file = f"{spool_dir}/{REJECTED}"
    in_file = rejected_records(spool_dir)
    failed = any(r.status in ("damaged", "unfinished") or r.rejected for r in results)
    if as_json:
        report = {
            "store": str(store_path),
            "journals": [r.to_json() for r in results],
            "replayed": sum(r.replayed for r in results),
            "rejected": sum(r.rejected for r in results),
            "rejected_file": rejected_file if in_file else None,
            "rejected_in_file": in_file,
            "ok": not failed,
        }
        emit_json(report)
    else:
        if not results:
            click.echo(f"fleetstore recover: {store_path}: nothing to recover")
        else:
            click.echo(f"fleetstore recover: {store_path}")
        for r in results:
            name = r.journal.rsplit("/", 1)[-1]
            what = {
                "replayed": f"replayed {r.replayed} operation(s), journal deleted",
                "busy": "busy",
                "damaged": f"damaged, kept; replayed {r.replayed} operation(s)",
                "unfinished": f"unfinished, kept; replayed {r.replayed} operation(s)",
            }.get(r.status, r.status)
            click.echo(f"  {name}: {what}" + (f"; {r.detail}" if r.detail else ""))
            for rej in r.rejections:
                session = f" (session {rej.session_id})" if rej.session_id else ""
                click.echo(f"    rejected {rej.op} op {rej.op_id}{session}: {rej.error}")
        if in_file:
            click.echo(f"{rejected_file} holds {in_file} rejected operation(s) in all")
    sys.exit(1 if failed else 0)
