"""``fleetstore search QUERY`` and ``fleetstore index``: full-text search of a store's
history, and its index (the work is ``store.search``: fleetstore.domain.search)."""

from __future__ import annotations

import sys
from typing import Any

import click

from fleetstore.cli.util import ProgressBars, cut_note, emit_json, env, json_option
from fleetstore.cli.util import reading_store as _reading
from fleetstore.cli.util import store_params as _store_params
from fleetstore.cli.util import using_store as _opened
from fleetstore.cli.util import when as _when
from fleetstore.core.render import printable

_KINDS = ("text", "reasoning", "tool_call", "tool_result", "file", "error", "title", "metadata")
#: Hits read per page with --all.
_PAGE = 200


def _time(text: str | None, option: str) -> float | None:
    from fleetstore.cli.sessions import _since

    try:
        return _since(text)
    except click.BadParameter as exc:
        raise click.BadParameter(str(exc.message), param_hint=option) from None


@click.command(
    epilog="""\b
Query syntax (docs/search.md): words (AND is implied), "a phrase", prefix*,
a OR b, a NOT b, ( ... ); a bare term is the words in it (parse_tool_output is
the phrase "parse tool output"). --substring: each term is text found anywhere,
even inside a word (at least 3 characters), case aside.
\b
Exit codes:
  0  done (hits or none)
  1  the store failed
  2  bad usage (a query that finds nothing by itself, such as NOT a), or no store
     at --store (nothing is created)"""
)
@click.argument("query", nargs=-1, required=True)
@click.option(
    "--substring",
    is_flag=True,
    help="Find each term as text, even inside words (paths, error codes, names).",
    **env("search", "substring"),
)
@click.option(
    "--best",
    is_flag=True,
    help="Best first (rank) instead of newest first.",
    **env("search", "best"),
)
@click.option("--project", default=None, help="Only this project.", **env("search", "project"))
@click.option(
    "--session", "session_id", default=None, help="Only this session.", **env("search", "session")
)
@click.option(
    "--root",
    "root_id",
    default=None,
    help="Only this tree of sessions (the root, its subagents and forks).",
    **env("search", "root"),
)
@click.option(
    "--role",
    "roles",
    multiple=True,
    help="Only messages of this role (repeatable).",
    **env("search", "role"),
)
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    type=click.Choice(_KINDS),
    help="Only this kind of text (repeatable).",
    **env("search", "kind"),
)
@click.option(
    "--since",
    default=None,
    metavar="AGE|DATE",
    help="Only messages written since: an age (7d, 12h) or a date (2025-01-31, UTC).",
    **env("search", "since"),
)
@click.option(
    "--until",
    default=None,
    metavar="AGE|DATE",
    help="Only messages written before: an age (7d) or a date.",
    **env("search", "until"),
)
@click.option(
    "--archived", is_flag=True, help="Include archived sessions.", **env("search", "archived")
)
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=20,
    show_default=True,
    help="At most this many hits (a cut list says so on stderr).",
    **env("search", "limit"),
)
@click.option(
    "--all",
    "every",
    is_flag=True,
    help="Every hit, however many (--limit is ignored).",
    **env("search", "all"),
)
@json_option("search", each="hit")
@_store_params()
def search_command(
    query: tuple[str, ...],
    substring: bool,
    best: bool,
    project: str | None,
    session_id: str | None,
    root_id: str | None,
    roles: tuple[str, ...],
    kinds: tuple[str, ...],
    since: str | None,
    until: str | None,
    archived: bool,
    limit: int,
    every: bool,
    as_json: bool,
    store: str | None,
) -> None:
    """Search every session of a store: newest first, each hit a part of a message (or a
    session's title or metadata) with its session, its message's seq, its kind and role,
    and a snippet of the text with the matches marked. What the index has not taken yet
    is not found: a note on stderr says how far behind it is (fleetstore index)."""
    from fleetstore import errors

    args: dict[str, Any] = {
        "match": "substring" if substring else "words",
        "order": "best" if best else "newest",
        "project": project,
        "session_id": session_id,
        "root_id": root_id,
        "roles": list(roles) or None,
        "kinds": list(kinds) or None,
        "since": _time(since, "--since"),
        "until": _time(until, "--until"),
        "include_archived": archived,
    }
    text = " ".join(query)
    with _reading("search", store) as opened:
        shown, more, cursor = 0, False, None
        out = _Printer(as_json)
        while True:
            want = _PAGE if every else min(_PAGE, limit - shown)
            try:
                page = opened.search(text, **args, limit=want, cursor=cursor)
            except errors.InvalidInput as exc:
                raise click.UsageError(str(exc)) from None
            for hit in page:
                out.hit(hit)
            shown += len(page)
            more, cursor = page.more, page.next_cursor
            if not more or (not every and shown >= limit):
                break
        status = opened.search.status()
    behind = ""
    if not status.current:
        behind = (
            f"the index is behind: {status.queued} queued ({status.lag:.1f} s), backfill "
            f"{status.backfill_done}/{status.backfill_total}: fleetstore index"
        )
    click.echo(cut_note(shown, "hits", more, behind), err=True)


class _Printer:
    def __init__(self, as_json: bool) -> None:
        from fleetstore.core.render import console

        self.as_json = as_json
        self.console = None if as_json else console(sys.stdout)

    def hit(self, hit: Any) -> None:
        if self.as_json:
            emit_json(
                {
                    "session_id": hit.session_id,
                    "message_id": hit.message_id,
                    "seq": hit.seq,
                    "part": hit.part,
                    "kind": hit.kind,
                    "role": hit.role,
                    "snippet": hit.snippet,
                    "highlights": [list(h) for h in hit.highlights],
                    "rank": hit.rank,
                    "created_at": hit.created_at,
                }
            )
            return
        from rich.text import Text

        assert self.console is not None
        where = f"#{hit.seq}" if hit.seq is not None else "session"
        head = f"{hit.session_id}  {where}  {hit.kind}"
        if hit.role:
            head += f" ({hit.role})"
        self.console.print(Text(f"{head}  {_when(hit.created_at)}", style="bold"), soft_wrap=True)
        snippet = Text("    " + printable(hit.snippet))
        for start, end in hit.highlights:
            snippet.stylize("bold red", start + 4, end + 4)
        self.console.print(snippet, soft_wrap=True)


@click.command(
    epilog="""\b
Exit codes:
  0  done: the index holds everything written (with --status: it was read)
  1  the store failed (or stayed locked past the write budget)
  2  bad usage, or no store at --store (nothing is created)"""
)
@click.option(
    "--status",
    "only_status",
    is_flag=True,
    help="Only say how far the index is behind (reads the store, writes nothing).",
    **env("index", "status"),
)
@json_option("index", what="the index's status, and with catching up the sections written")
@_store_params()
def index_command(only_status: bool, as_json: bool, store: str | None) -> None:
    """The search index of a store: catch it up now (what the writes queued before it
    began, and the backfill of what the store held before it had an index, batch by
    batch while the fleet writes; resumable: stopped, the next run or any writing
    process goes on), then say how far behind it is. Writing processes keep it up
    themselves (search_index), each with a tenth of its time; this takes the indexing
    over from them while it runs, at full speed, and gives it back: for a store nobody
    writes to, a backfill to finish, or an index to bring up to date before a search."""
    written = 0
    opener = _reading if only_status else _opened
    with opener("index", store) as opened:
        if not only_status:
            bars = ProgressBars()
            try:
                written = opened.search.catch_up(
                    progress=lambda done, total: bars("backfill (messages)", done, total),
                    take_over=True,
                )
            finally:
                bars.close()
        status = opened.search.status()
    data = {
        "queued": status.queued,
        "lag": round(status.lag, 3),
        "sections": status.sections,
        "backfill_done": status.backfill_done,
        "backfill_total": status.backfill_total,
        "backfilling": status.backfilling,
        "indexers": list(status.indexers),
        "current": status.current,
    }
    if not only_status:
        data["written"] = written
    if as_json:
        emit_json(data)
        return
    if not only_status:
        click.echo(f"indexed {written:,} sections")
    click.echo(
        f"{status.sections:,} sections; {status.queued:,} queued"
        + (f" (the oldest {status.lag:.1f} s ago)" if status.queued else "")
        + f"; backfill {status.backfill_done:,}/{status.backfill_total:,} messages"
        + (f"; indexing now: {', '.join(status.indexers)}" if status.indexers else "")
    )


__all__ = ["index_command", "search_command"]
