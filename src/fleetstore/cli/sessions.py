"""``fleetstore sessions list|show|rm``: what a store holds, and removing sessions in
short transactions (the facts are read by fleetstore.admin.stats)."""

from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from fleetstore import errors
from fleetstore.cli.util import LazyGroup, ProgressBars, cut_note, emit_json, env, json_option
from fleetstore.cli.util import reading_store as _reading
from fleetstore.cli.util import size as _size
from fleetstore.cli.util import store_params as _store_params
from fleetstore.cli.util import using_store as _opened

if TYPE_CHECKING:
    from fleetstore.engine.base import Tx

#: Sessions read per transaction by ``sessions list`` (a short read each, so a long
#: listing never holds one snapshot).
PAGE = 1000


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M")


def _since(text: str | None) -> float | None:
    """An age (7d) back from now, or a date (2025-01-31, UTC) or ISO time."""
    from fleetstore.admin.maintain.config import parse_age

    if text is None:
        return None
    try:
        return time.time() - parse_age(text)
    except errors.InvalidInput:
        pass
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither an age (7d, 12h) nor a date (2025-01-31)", param_hint="--since"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


_EXIT = """\b
Exit codes:
  0  done
  1  the store failed (or stayed locked past the write budget)
  2  bad usage, no store at --store (nothing is created), or no such session"""


@click.group(
    cls=LazyGroup,
    lazy={
        "archive-tree": "fleetstore.cli.reshard:archive_tree_command",
        "restore-tree": "fleetstore.cli.reshard:restore_tree_command",
    },
    epilog="""\b
Exit codes (every subcommand):
  0  done
  1  the store failed (or stayed locked past the write budget); rm: a session was
     written to while being removed (left partly removed)
  2  bad usage, no store at --store (nothing is created), no such session, or rm
     without --yes""",
)
def sessions() -> None:
    """List, show and remove the sessions of a store."""


@sessions.command(name="list", epilog=_EXIT)
@click.option(
    "--project", default=None, help="Only this project.", **env("sessions list", "project")
)
@click.option(
    "--since",
    default=None,
    metavar="AGE|DATE",
    help="Only sessions written since: an age (7d, 12h) or a date (2025-01-31, UTC).",
    **env("sessions list", "since"),
)
@click.option(
    "--roots",
    is_flag=True,
    help="Only top-level sessions (no subagents).",
    **env("sessions list", "roots"),
)
@click.option(
    "--archived",
    is_flag=True,
    help="Include archived sessions.",
    **env("sessions list", "archived"),
)
@click.option(
    "--limit",
    type=click.IntRange(1, 1_000_000),
    default=50,
    show_default=True,
    help="At most this many, most recently written first (a cut list says so on stderr).",
    **env("sessions list", "limit"),
)
@click.option(
    "--all",
    "every",
    is_flag=True,
    help=f"Every session, however many (read {PAGE} at a time); --limit is ignored.",
    **env("sessions list", "all"),
)
@json_option("sessions list", each="session")
@_store_params()
def sessions_list(
    project: str | None,
    since: str | None,
    roots: bool,
    archived: bool,
    limit: int,
    every: bool,
    as_json: bool,
    store: str | None,
) -> None:
    """Sessions, most recently written first: id, last write, messages, title, parent.
    A list cut at --limit says so on stderr; --all lists every session."""
    from fleetstore.admin.maintain.retention import message_counts

    params: dict[str, object] = {
        "project": project,
        "since": _since(since),
        "include_archived": archived,
        "roots": roots,
        "after_updated": None,
        "after_id": None,
    }
    table: list[tuple[str, str, int, str]] = []
    shown, more = 0, False
    with _reading("sessions list", store) as opened:
        q = opened.queries
        while True:
            want = PAGE if every else min(PAGE, limit - shown)
            page = {**params, "limit": want + 1}

            def read(tx: Tx, page: dict[str, object] = page) -> list[tuple[Any, ...]]:
                return tx.execute(q["mnt_sessions_list"], page)

            rows = opened.read(read)
            more = len(rows) > want
            rows = rows[:want]
            if opened.router is not None:
                # The catalog lists every session; their messages are in their shards.
                counts = message_counts(opened, [str(r[0]) for r in rows])
                rows = [(*r[:7], counts.get(str(r[0]), 0)) for r in rows]
            for sid, parent, proj, title, status, created, updated, messages in rows:
                if as_json:
                    emit_json(
                        {
                            "id": sid,
                            "parent_id": parent,
                            "project": proj,
                            "title": title,
                            "status": status,
                            "created_at": created,
                            "updated_at": updated,
                            "messages": messages,
                        }
                    )
                else:
                    flags = (" (archived)" if status == "archived" else "") + (
                        f" sub of {parent}" if parent else ""
                    )
                    table.append((sid, _when(updated), messages, f"{title or ''}{flags}"))
            shown += len(rows)
            if not more or not rows or (not every and shown >= limit):
                break
            params["after_updated"], params["after_id"] = rows[-1][6], rows[-1][0]
    if table:
        from fleetstore.core.render import table as render

        columns = ("ID", "LAST WRITE", "MESSAGES", "TITLE")
        click.echo(render(columns, table, right={"MESSAGES"}, indent=0))
    click.echo(cut_note(shown, "session(s)", more), err=True)


@sessions.command(name="show", epilog=_EXIT)
@click.argument("session_id")
@json_option("sessions show")
@_store_params()
def sessions_show(session_id: str, as_json: bool, store: str | None) -> None:
    """One session: its row, messages per role and status, usage, subagents, state and
    bytes (inline, and blobs as stored and original)."""
    from fleetstore.admin.stats import session_facts

    with _reading("sessions show", store) as opened:
        try:
            facts = session_facts(opened, session_id)
        except errors.NotFound as exc:
            click.echo(f"fleetstore sessions show: {exc}", err=True)
            sys.exit(2)
    if as_json:
        emit_json(facts.to_json())
        return
    s = facts.session
    click.echo(f"{s.id}  {s.title or ''}")
    click.echo(f"  project {s.project or '-'}, status {s.status}, version {s.version}")
    click.echo(f"  created {_when(s.created_at)}, last written {_when(s.updated_at)}")
    if s.parent_id:
        click.echo(f"  subagent of {s.parent_id} (tree {s.root_id})")
    if s.forked_from:
        click.echo(f"  forked from {s.forked_from} at message {s.fork_seq}")
    total = sum(m["count"] for m in facts.messages)
    click.echo(f"  messages {total}")
    for m in facts.messages:
        click.echo(
            f"    {m['role']:<10} {m['status']:<9} {m['count']:>6}  "
            f"{_when(m['first'])} .. {_when(m['last'])}"
        )
    u = facts.usage
    click.echo(
        f"  usage: {u.input_tokens} in, {u.output_tokens} out, {u.cache_read_tokens} cache "
        f"read, {u.cache_write_tokens} cache write, {u.reasoning_tokens} reasoning, "
        f"cost {u.cost:g}"
    )
    click.echo(
        f"  bytes: {_size(facts.inline_bytes)} inline, {facts.blob_count} blobs "
        f"{_size(facts.blob_stored_bytes)} stored ({_size(facts.blob_bytes)} original)"
    )
    click.echo(f"  state values {facts.state_values}, subagents {len(facts.children)}")
    for child in facts.children:
        click.echo(f"    {child}")


@sessions.command(
    name="rm",
    epilog="""\b
Exit codes:
  0  every SESSION was removed (one already gone counts as removed)
  1  the store failed or stayed locked past the write budget (the sessions removed
     so far stay removed; rm again finishes)
  2  bad usage, no store at --store, no such SESSION (nothing removed), or no --yes""",
)
@click.argument("session_ids", nargs=-1, required=True, metavar="SESSION...")
@click.option(
    "--yes",
    is_flag=True,
    help="Confirm: remove each SESSION with its subagents, messages and state.",
    **env("sessions rm", "yes"),
)
@json_option("sessions rm", each="removed session")
@_store_params()
def sessions_rm(session_ids: Sequence[str], yes: bool, as_json: bool, store: str | None) -> None:
    """Remove sessions with their subagent sessions, messages, parts, usage and state,
    in short transactions (a long session is deleted a batch of messages at a time,
    so writers wait milliseconds). Blob files go at the next `fleetstore maintain`."""
    from fleetstore.admin.maintain.report import Step
    from fleetstore.admin.maintain.retention import delete_tree
    from fleetstore.admin.maintain.writer import Writer
    from fleetstore.admin.stats import session_exists

    if not yes:
        click.echo(
            f"fleetstore sessions rm: this removes {len(session_ids)} session(s) with their "
            "subagents and history for good; add --yes",
            err=True,
        )
        sys.exit(2)
    with _opened("sessions rm", store) as opened:
        missing = [sid for sid in session_ids if not session_exists(opened, sid)]
        if missing:
            click.echo(
                f"fleetstore sessions rm: no session {', '.join(missing)} (nothing removed)",
                err=True,
            )
            sys.exit(2)
        # A sharded store: each batch goes through the router (the tree's shard, then
        # the catalog's index).
        writer = Writer(opened.db, opened)
        step = Step("rm")
        bars = ProgressBars()
        for i, sid in enumerate(session_ids, 1):
            result = delete_tree(writer, step, sid)
            if as_json:
                emit_json(
                    {
                        "id": sid,
                        "sessions": result.sessions,
                        "messages": result.messages,
                        "states": result.states,
                    }
                )
            else:
                click.echo(
                    f"{sid}: removed {result.sessions} session(s), {result.messages} "
                    f"message(s), {result.states} state value(s)"
                )
            bars("rm", i, len(session_ids))
        bars.close()
        click.echo(
            f"-- {step.transactions} transaction(s), longest lock hold "
            f"{step.max_hold * 1000:.1f} ms",
            err=True,
        )


__all__ = ["sessions"]
