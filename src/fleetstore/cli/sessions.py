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
from fleetstore.cli.util import when as _when
from fleetstore.core.render import printable
from fleetstore.core.transcripts import DEFAULT_WIDTH, FORMATS

if TYPE_CHECKING:
    from fleetstore.engine.base import Tx

#: Sessions read per transaction by ``sessions list`` (a short read each, so a long
#: listing never holds one snapshot).
PAGE = 1000


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
    "--threads",
    is_flag=True,
    help="List the store's LangGraph threads (FleetstoreSaver) instead, the latest "
    "checkpoint first: thread id, last checkpoint, checkpoints, payload bytes.",
    **env("sessions list", "threads"),
)
@click.option(
    "--all",
    "every",
    is_flag=True,
    help=f"Every session (or thread), however many (sessions read {PAGE} at a time); "
    "--limit is ignored.",
    **env("sessions list", "all"),
)
@json_option("sessions list", each="session (with --threads: a LangGraph thread)")
@_store_params()
def sessions_list(
    project: str | None,
    since: str | None,
    roots: bool,
    archived: bool,
    limit: int,
    threads: bool,
    every: bool,
    as_json: bool,
    store: str | None,
) -> None:
    """Sessions, most recently written first: id, last write, messages, and the title,
    or the id its framework knows it by (openai-agents:SESSION_ID for an Agents SDK
    session, adk:APP/USER/SESSION_ID for an ADK one; JSON: known_as), and the parent.
    A list cut at --limit says so on stderr; --all lists every session."""
    from fleetstore.admin.stats import known_as, langgraph_threads, message_counts

    if threads:
        if project is not None or since is not None or roots or archived:
            raise click.UsageError(
                "--threads lists LangGraph threads; --project, --since, --roots and "
                "--archived filter sessions"
            )
        _list_threads(store, limit, every, as_json)
        return
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
            if opened.spans_files:
                # The catalog lists every session; their messages are in their shards.
                counts = message_counts(opened, [str(r[0]) for r in rows])
                rows = [(*r[:7], counts.get(str(r[0]), 0), r[8]) for r in rows]
            for sid, parent, proj, title, status, created, updated, messages, metadata in rows:
                known = known_as(metadata)
                if as_json:
                    emit_json(
                        {
                            "id": sid,
                            "parent_id": parent,
                            "project": proj,
                            "title": title,
                            "known_as": known,
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
                    table.append((sid, _when(updated), messages, _label(title, known) + flags))
            shown += len(rows)
            if not more or not rows or (not every and shown >= limit):
                break
            params["after_updated"], params["after_id"] = rows[-1][6], rows[-1][0]
        more_threads = not shown and bool(langgraph_threads(opened, 1))
    if table:
        from fleetstore.core.render import table as render

        columns = ("ID", "LAST WRITE", "MESSAGES", "TITLE")
        click.echo(render(columns, table, right={"MESSAGES"}, indent=0))
    extra = "the store holds LangGraph threads: --threads lists them" if more_threads else ""
    click.echo(cut_note(shown, "session(s)", more, extra), err=True)


def _label(title: str | None, known: dict[str, object] | None) -> str:
    """A session's name in a list: the id its framework knows it by (an ADK session's
    title is that id, said once), then its title."""
    from fleetstore.admin.stats import known_name

    same = known is not None and title == known.get("session_id")
    return " ".join(x for x in (known_name(known), "" if same else title or "") if x)


def _list_threads(store: str | None, limit: int, every: bool, as_json: bool) -> None:
    """``sessions list --threads``: the LangGraph threads, a row (or JSON line) each."""
    from fleetstore.admin.stats import langgraph_threads

    with _reading("sessions list", store) as opened:
        found = langgraph_threads(opened, -1 if every else limit + 1)
    more = not every and len(found) > limit
    found = found if every else found[:limit]
    if as_json:
        for t in found:
            emit_json(t)
    elif found:
        from fleetstore.core.render import table

        rows = [
            (
                t["thread_id"],
                _when(t["last_checkpoint_at"]),
                t["checkpoints"],
                _size(t["payload_bytes"]),
            )
            for t in found
        ]
        columns = ("THREAD", "LAST CHECKPOINT", "CHECKPOINTS", "BYTES")
        click.echo(table(columns, rows, right={"CHECKPOINTS", "BYTES"}, indent=0))
    click.echo(cut_note(len(found), "LangGraph thread(s)", more), err=True)


@sessions.command(name="show", epilog=_EXIT)
@click.argument("session_id")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default=None,
    help="text (the default: for a terminal), markdown (a document), or json (one "
    "object: the session, its usage, every message with every part, the subagents).",
    **env("sessions show", "format"),
)
@json_option(
    "sessions show",
    what="the transcript, as --format json (with --summary: the summary)",
)
@click.option(
    "--width",
    type=click.IntRange(min=0),
    default=None,
    metavar="CHARS",
    help=f"Characters of a tool call's arguments and of a tool's output shown, the rest "
    f"cut and counted (0: all). Default: {DEFAULT_WIDTH} in text and markdown, all in json.",
    **env("sessions show", "width"),
)
@click.option(
    "--tree",
    is_flag=True,
    help="With the subagents' transcripts (and theirs), each where it was spawned.",
    **env("sessions show", "tree"),
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=str),
    default=None,
    metavar="FILE",
    help="Write the transcript to FILE (mode 0600; a temporary file renamed into place, "
    "replacing FILE) instead of standard output.",
    **env("sessions show", "output"),
)
@click.option(
    "--summary",
    is_flag=True,
    help="Only the summary: messages per role and status, usage, subagents, state values "
    "and bytes; no conversation.",
    **env("sessions show", "summary"),
)
@_store_params()
def sessions_show(
    session_id: str,
    fmt: str | None,
    as_json: bool,
    width: int | None,
    tree: bool,
    output: str | None,
    summary: bool,
    store: str | None,
) -> None:
    """One session's conversation: roles, text, reasoning, tool calls with their
    arguments and outputs (cut to --width), files, usage, times, errors; with --tree
    its subagents'. Read a page of messages at a time (a blob when its message is
    reached), so a session of any length is shown in bounded memory. --summary: the
    session's figures only."""
    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"--json and --format {fmt} disagree")
    fmt = "json" if as_json else fmt or "text"
    if summary and (tree or output is not None or width is not None or fmt == "markdown"):
        raise click.UsageError("--summary prints the figures only (text or --json)")
    if not summary:
        from fleetstore.admin.transcript import write_transcript, write_transcript_file

        with _reading("sessions show", store) as opened:
            try:
                if output is None:
                    write_transcript(
                        opened, session_id, sys.stdout, fmt=fmt, width=width, tree=tree
                    )
                else:
                    written = write_transcript_file(
                        opened, session_id, output, fmt=fmt, width=width, tree=tree
                    )
                    click.echo(
                        f"fleetstore sessions show: {written.sessions} session(s), "
                        f"{written.messages} message(s) -> {output}",
                        err=True,
                    )
            except (errors.NotFound, errors.InvalidInput) as exc:
                click.echo(f"fleetstore sessions show: {exc}", err=True)
                sys.exit(2)
            except OSError as exc:
                click.echo(f"fleetstore sessions show: {exc}", err=True)
                sys.exit(1)
        return
    from fleetstore.admin.stats import known_as, known_name, session_facts

    with _reading("sessions show", store) as opened:
        try:
            facts = session_facts(opened, session_id)
        except (errors.NotFound, errors.InvalidInput) as exc:
            click.echo(f"fleetstore sessions show: {exc}", err=True)
            sys.exit(2)
    if fmt == "json":
        emit_json(facts.to_json())
        return
    s = facts.session
    click.echo(printable(f"{s.id}  {s.title or ''}"))
    if known_as(s.metadata):
        click.echo(printable(f"  known as {known_name(known_as(s.metadata))}"))
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
