"""``fleetstore redact`` (the work is in fleetstore.admin.redact)."""

from __future__ import annotations

import click

from fleetstore.cli.util import emit_json, env, json_option, store_params, using_store


@click.command(
    name="redact",
    epilog="""\b
Exit codes:
  0  the store holds no secret the rules know (in a dry run: nothing was changed)
  1  the store failed, or stayed locked past the write budget: what was rewritten
     stays rewritten; run it again to carry on
  2  bad usage, or no store at --store (nothing is created)""",
)
@click.option(
    "--dry-run",
    is_flag=True,
    default=False,
    **env("redact", "dry-run"),
    help="Say what would be rewritten, by table and kind; write nothing.",
)
@json_option(
    "redact", what="rows read and rewritten by table, secrets by kind, rows changed meanwhile"
)
@store_params()
def redact_command(dry_run: bool, as_json: bool, store: str | None) -> None:
    """Replace the secrets a store already holds by their markers, [REDACTED:kind].

    What was written before redaction, with it off, imported, or is found by rules
    added since (the built-in rules, plus redaction_rules_file): every part body
    (inline or a blob), the text of every streamed reply no longer being streamed (read
    as one text, so a secret cut by a flush is caught), every state value, every
    effect's payload, result and errors, session titles and metadata, and messages'
    metadata and errors. Each row that changes is rewritten by a logged
    operation applied exactly once, and only if the row still holds what was read;
    run it with the fleet writing, and again after a kill: it carries on. The blob
    files of replaced payloads are left for `fleetstore maintain` to delete; backups
    and exports made before keep what they hold (docs/secrets.md).
    """
    from fleetstore.admin.redact import redact_store

    with using_store("redact", store) as opened:
        report = redact_store(opened, dry_run=dry_run)
    if as_json:
        emit_json(report.to_json())
        return
    read = ", ".join(f"{n:,} {t}" for t, n in sorted(report.scanned.items())) or "nothing"
    done = ", ".join(f"{n:,} {t}" for t, n in sorted(report.rewritten.items()) if n) or "nothing"
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(report.by_kind.items()))
    verb = "would rewrite" if dry_run else "rewrote"
    click.echo(f"read {read}; {verb} {done}" + (f"; secrets: {kinds}" if kinds else ""))
    if report.left_blobs:
        click.echo(
            f"{len(report.left_blobs)} blob file(s) of replaced payloads are left for "
            "`fleetstore maintain` to delete (after its grace)"
        )
    if report.changed_meanwhile:
        click.echo(
            f"{report.changed_meanwhile} row(s) were written meanwhile and left: run it again"
        )


__all__ = ["redact_command"]
