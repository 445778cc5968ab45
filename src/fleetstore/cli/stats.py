"""``fleetstore stats``: where a store's bytes go (the figures are
fleetstore.admin.stats.store_stats)."""

from __future__ import annotations

from typing import Any

import click

from fleetstore.cli.util import emit_json, env, json_option
from fleetstore.cli.util import reading_store as _opened
from fleetstore.cli.util import size as _size
from fleetstore.cli.util import store_params as _store_params
from fleetstore.cli.util import when as _when


@click.command(
    name="stats",
    epilog="""\b
Exit codes:
  0  done
  1  the store failed
  2  bad usage, or no store at --store (nothing is created)""",
)
@click.option(
    "--top",
    type=click.IntRange(1, 100_000),
    default=10,
    show_default=True,
    help="How many of the largest sessions (and LangGraph threads) to show.",
    **env("stats", "top"),
)
@json_option("stats")
@_store_params()
def stats_command(top: int, as_json: bool, store: str | None) -> None:
    """Where a store's bytes go: counts, bytes per session (inline plus the stored size
    of its blobs; a blob shared by forks counts in each), the largest sessions, and
    the blobs' share of the store (database file plus blob files); what the framework
    adapters keep (LangGraph threads and their checkpoints, Agents SDK sessions, ADK
    apps, users and sessions) and the outbox's effects per state. --json adds the
    bytes of every session."""
    from fleetstore.admin.stats import known_name, store_stats

    with _opened("stats", store) as opened:
        figures = store_stats(opened, top)
    if as_json:
        emit_json(figures)
        return
    c, b = figures["counts"], figures["blobs"]
    click.echo(
        f"fleetstore stats: {figures['path']}: database {_size(figures['database_bytes'])} "
        f"({_size(figures['free_bytes'])} free), WAL {_size(figures['wal_bytes'])}"
        + (
            f" in {figures['database_files']} files (catalog and shards)"
            if figures["layout"] == "sharded"
            else ""
        )
    )
    click.echo(
        f"  {c['sessions']} sessions ({c['top_level_sessions']} top-level), {c['messages']} "
        f"messages, {c['parts']} parts, {c['chunks']} chunks, {c['state']} state values, "
        f"{c['applied_ops']} applied_ops"
    )
    click.echo(
        f"  blobs: {b['rows']} ({b['files']} files), {_size(b['stored_bytes'])} stored "
        f"({_size(b['original_bytes'])} original): {b['share'] * 100:.1f}% of the store's bytes"
    )
    for line in _framework_lines(figures):
        click.echo(line)
    if figures["largest"]:
        from fleetstore.core.render import table

        click.echo("  largest sessions:")
        rows = [
            (
                r["id"],
                _size(r["bytes"]),
                _size(r["inline_bytes"]),
                f"{r['blobs']} ({_size(r['blob_stored_bytes'])})",
                r["messages"],
                known_name(r["known_as"]) or r["title"] or "",
            )
            for r in figures["largest"]
        ]
        columns = ("ID", "BYTES", "INLINE", "BLOBS", "MESSAGES", "TITLE")
        click.echo(table(columns, rows, right={"BYTES", "INLINE", "MESSAGES"}, indent=4))


def _framework_lines(figures: dict[str, Any]) -> list[str]:
    """The frameworks' and the outbox's lines (indented), each only if the store holds
    any; the largest LangGraph threads as a table."""
    from fleetstore.core.render import table

    lines: list[str] = []
    fw = figures["frameworks"]
    lg, agents, adk = fw["langgraph"], fw["openai_agents"], fw["adk"]
    if lg["threads"]:
        lines.append(
            f"  LangGraph: {lg['threads']} thread(s), {lg['checkpoints']} checkpoint(s), "
            f"{lg['channel_values']} channel value(s), {lg['pending_writes']} pending "
            f"write(s), {_size(lg['payload_bytes'])} of payload"
        )
        rows = [
            (
                t["thread_id"],
                t["checkpoints"],
                _size(t["payload_bytes"]),
                _when(t["last_checkpoint_at"]),
            )
            for t in lg["largest"]
        ]
        columns = ("THREAD", "CHECKPOINTS", "BYTES", "LAST CHECKPOINT")
        lines.append(table(columns, rows, right={"CHECKPOINTS", "BYTES"}, indent=4))
    if agents["sessions"]:
        lines.append(
            f"  OpenAI Agents SDK: {agents['sessions']} session(s), {agents['items']} item(s)"
        )
    if adk["sessions"]:
        lines.append(
            f"  ADK: {adk['apps']} app(s), {adk['users']} user(s), {adk['sessions']} "
            f"session(s), {adk['events']} event(s)"
        )
    outbox = figures["outbox"]
    if outbox["total"]:
        states = ", ".join(f"{k} {v}" for k, v in outbox["by_state"].items())
        lines.append(f"  outbox: {outbox['total']} effect(s): {states}")
    return lines


__all__ = ["stats_command"]
