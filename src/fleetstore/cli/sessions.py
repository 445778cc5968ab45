"""``fleetstore sessions list|show|rm`` and ``fleetstore stats``: what a store holds,
where its bytes go, and removing sessions in short transactions."""

from __future__ import annotations

import datetime
import json
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import click

import fleetstore
from fleetstore import errors
from fleetstore.admin.maintain.config import parse_age
from fleetstore.admin.maintain.files import each_file, file_size
from fleetstore.admin.maintain.report import Step
from fleetstore.admin.maintain.retention import delete_tree, message_counts
from fleetstore.admin.maintain.writer import Writer
from fleetstore.cli.util import ProgressBars, env, existing_store
from fleetstore.cli.util import size as _size
from fleetstore.cli.util import store_option as _store_option
from fleetstore.engine.base import Tx


@contextmanager
def _opened(command: str, store: str | None) -> Iterator[fleetstore.Store]:
    """The existing store (exit 2 if there is none: nothing is created)."""
    path = existing_store(command, store)
    try:
        opened = fleetstore.open(path)
    except (errors.FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore {command}: {exc}", err=True)
        sys.exit(1)
    try:
        yield opened
    except errors.FleetstoreError as exc:
        click.echo(f"fleetstore {command}: {exc}", err=True)
        sys.exit(1)
    finally:
        opened.close(timeout=0)


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M")


def _since(text: str | None) -> float | None:
    """An age (7d) back from now, or a date (2025-01-31, UTC) or ISO time."""
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
    epilog="""\b
Exit codes (every subcommand):
  0  done
  1  the store failed (or stayed locked past the write budget); rm: a session was
     written to while being removed (left partly removed)
  2  bad usage, no store at --store (nothing is created), no such session, or rm
     without --yes"""
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
    help="At most this many, most recently written first.",
    **env("sessions list", "limit"),
)
@click.option(
    "--json", "as_json", is_flag=True, help="JSON lines on stdout.", **env("sessions list", "json")
)
@_store_option
def sessions_list(
    project: str | None,
    since: str | None,
    roots: bool,
    archived: bool,
    limit: int,
    as_json: bool,
    store: str | None,
) -> None:
    """Sessions, most recently written first: id, last write, messages, parent, title."""
    params = {
        "project": project,
        "since": _since(since),
        "include_archived": archived,
        "roots": roots,
        "limit": limit,
    }
    with _opened("sessions list", store) as opened:
        q = opened.queries
        rows = opened.read(lambda tx: tx.execute(q["mnt_sessions_list"], params))
        if opened.router is not None:
            # The catalog lists every session; their messages are in their shards.
            counts = message_counts(opened, [str(r[0]) for r in rows])
            rows = [(*r[:7], counts.get(str(r[0]), 0)) for r in rows]
    for sid, parent, proj, title, status, created, updated, messages in rows:
        if as_json:
            record = {
                "id": sid,
                "parent_id": parent,
                "project": proj,
                "title": title,
                "status": status,
                "created_at": created,
                "updated_at": updated,
                "messages": messages,
            }
            click.echo(json.dumps(record, ensure_ascii=False))
        else:
            flags = (" (archived)" if status == "archived" else "") + (
                f" sub of {parent}" if parent else ""
            )
            click.echo(f"{sid}  {_when(updated)}  {messages:>6} msgs  {title or ''}{flags}")
    if not as_json:
        click.echo(f"-- {len(rows)} session(s)", err=True)


@dataclass(frozen=True, slots=True)
class SessionFacts:
    """One session as ``sessions show`` reports it."""

    session: fleetstore.Session
    messages: list[dict[str, Any]]
    usage: fleetstore.Usage
    children: list[str]
    state_values: int
    inline_bytes: int
    blob_count: int
    blob_stored_bytes: int
    blob_bytes: int

    def to_json(self) -> dict[str, Any]:
        import dataclasses

        return {
            "session": {
                **dataclasses.asdict(self.session),
                "status": str(self.session.status),
            },
            "messages": self.messages,
            "usage": dataclasses.asdict(self.usage),
            "children": self.children,
            "state_values": self.state_values,
            "bytes": {
                "inline": self.inline_bytes,
                "blobs": self.blob_count,
                "blob_stored": self.blob_stored_bytes,
                "blob_original": self.blob_bytes,
                "total": self.inline_bytes + self.blob_stored_bytes,
            },
        }


def session_facts(store: fleetstore.Store, session_id: str) -> SessionFacts:
    """Everything ``sessions show`` prints (``NotFound`` if there is no such session)."""
    session = store.sessions.get(session_id)
    usage = store.sessions.usage(session_id)
    q = store.queries

    def run(tx: Tx) -> tuple[Any, ...]:
        messages = tx.execute(q["mnt_session_messages"], (session_id,))
        children = [str(r[0]) for r in tx.execute(q["mnt_session_children"], (session_id,))]
        states, state_bytes = tx.execute(q["mnt_session_state_count"], (session_id,))[0]
        parts, chunks = tx.execute(q["mnt_session_inline_bytes"], {"id": session_id})[0]
        blobs = tx.execute(q["mnt_session_blob_bytes"], {"id": session_id})[0]
        return messages, children, states, state_bytes + parts + chunks, blobs

    messages, children, states, inline, blobs = store.read(run, session_id=session_id)
    return SessionFacts(
        session=session,
        messages=[
            {"role": r, "status": s, "count": n, "first": first, "last": last}
            for r, s, n, first, last in messages
        ],
        usage=usage,
        children=children,
        state_values=int(states),
        inline_bytes=int(inline),
        blob_count=int(blobs[0]),
        blob_stored_bytes=int(blobs[1]),
        blob_bytes=int(blobs[2]),
    )


@sessions.command(name="show", epilog=_EXIT)
@click.argument("session_id")
@click.option(
    "--json", "as_json", is_flag=True, help="JSON on stdout.", **env("sessions show", "json")
)
@_store_option
def sessions_show(session_id: str, as_json: bool, store: str | None) -> None:
    """One session: its row, messages per role and status, usage, subagents, state and
    bytes (inline, and blobs as stored and original)."""
    with _opened("sessions show", store) as opened:
        try:
            facts = session_facts(opened, session_id)
        except errors.NotFound as exc:
            click.echo(f"fleetstore sessions show: {exc}", err=True)
            sys.exit(2)
    if as_json:
        click.echo(json.dumps(facts.to_json(), ensure_ascii=False, indent=2))
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
@_store_option
def sessions_rm(session_ids: Sequence[str], yes: bool, store: str | None) -> None:
    """Remove sessions with their subagent sessions, messages, parts, usage and state,
    in short transactions (a long session is deleted a batch of messages at a time,
    so writers wait milliseconds). Blob files go at the next `fleetstore maintain`."""
    if not yes:
        click.echo(
            f"fleetstore sessions rm: this removes {len(session_ids)} session(s) with their "
            "subagents and history for good; add --yes",
            err=True,
        )
        sys.exit(2)
    with _opened("sessions rm", store) as opened:
        missing = [sid for sid in session_ids if not _exists(opened, sid)]
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
            click.echo(
                f"{sid}: removed {result.sessions} session(s), {result.messages} message(s), "
                f"{result.states} state value(s)"
            )
            bars("rm", i, len(session_ids))
        bars.close()
        click.echo(
            f"-- {step.transactions} transaction(s), longest lock hold "
            f"{step.max_hold * 1000:.1f} ms",
            err=True,
        )


def _exists(store: fleetstore.Store, sid: str) -> bool:
    q = store.queries
    return bool(store.read(lambda tx: tx.execute(q["session_exists"], (sid,))))


# -- stats ---------------------------------------------------------------------------------------


_PER_SESSION = (
    "mnt_stats_parts",
    "mnt_stats_chunks",
    "mnt_stats_state",
    "mnt_stats_messages",
    "mnt_stats_session_blobs",
)


@dataclass(slots=True)
class _Figures:
    """What ``store_stats`` reads from each database file, added up."""

    per_session: dict[str, dict[str, tuple[Any, ...]]]
    counts: list[int]
    #: sha256 -> (stored, original) bytes: a blob shared by files counts once.
    blobs: dict[str, tuple[int, int]]
    db_bytes: int = 0
    free_bytes: int = 0
    wal_bytes: int = 0
    files: int = 0


def _read_file(figures: _Figures, db: Any, q: dict[str, str], sessions_here: bool) -> None:
    def run(tx: Tx) -> tuple[Any, ...]:
        per = {name: tx.execute(q[name]) for name in _PER_SESSION}
        counts = tx.execute(q["mnt_stats_counts"])[0]
        blobs = tx.execute(q["mnt_stats_blob_rows"])
        pages = tx.execute(q["mnt_pages"])[0]
        return per, counts, blobs, pages

    per, counts, blobs, (page_size, pages, free) = db.read(run)
    for name, rows in per.items():
        target = figures.per_session[name]
        for r in rows:
            sid = str(r[0])
            old = target.get(sid)
            # A session's rows are in one file; adding keeps that true if not.
            target[sid] = (
                r[1:]
                if old is None
                else tuple((a or 0) + (b or 0) for a, b in zip(old, r[1:], strict=True))
            )
    for i, c in enumerate(counts):
        if i == 0 and not sessions_here:
            continue  # a shard's sessions rows are in the catalog's index too
        figures.counts[i] += int(c)
    for sha, stored, original in blobs:
        figures.blobs[str(sha)] = (int(stored), int(original))
    figures.db_bytes += int(page_size) * int(pages)
    figures.free_bytes += int(page_size) * int(free)
    figures.wal_bytes += file_size(str(db.path) + "-wal")
    figures.files += 1


def store_stats(store: fleetstore.Store, top: int) -> dict[str, Any]:
    """Counts, bytes per session (inline + the stored size of the blobs it refers to),
    the *top* largest sessions and the blobs' share of the store's bytes.  A sharded
    store: sessions from the catalog's index, everything else read from every file
    (the catalog, then each shard) and added up; a blob that several files refer to
    counts once in the store's figures, and in each session that refers to it."""
    q = store.queries
    store.sync_catalog()
    figures = _Figures({name: {} for name in _PER_SESSION}, [0] * 6, {})
    each_file(store, lambda key, db: _read_file(figures, db, q, sessions_here=key is None))
    parts, chunks, state, messages, blobs = (figures.per_session[n] for n in _PER_SESSION)
    rows = store.read(lambda tx: tx.execute(q["mnt_stats_sessions"]))
    counts = figures.counts
    blob_rows = len(figures.blobs)
    blob_stored = sum(v[0] for v in figures.blobs.values())
    blob_original = sum(v[1] for v in figures.blobs.values())
    per: list[dict[str, Any]] = []
    for sid, parent, title, project, status, updated in rows:
        inline = sum(int(d.get(sid, (0,))[0] or 0) for d in (parts, chunks, state))
        n_blobs, stored = blobs.get(sid, (0, 0))
        per.append(
            {
                "id": sid,
                "parent_id": parent,
                "title": title,
                "project": project,
                "status": status,
                "updated_at": updated,
                "messages": int(messages.get(sid, (0,))[0]),
                "inline_bytes": inline,
                "blobs": int(n_blobs),
                "blob_stored_bytes": int(stored or 0),
                "bytes": inline + int(stored or 0),
            }
        )
    per.sort(key=lambda r: (-r["bytes"], r["id"]))
    db_bytes = figures.db_bytes
    total = db_bytes + int(blob_stored)
    return {
        "path": str(store.path) if store.router is None else store.url,
        "layout": store.layout,
        "database_files": figures.files,
        "counts": dict(
            zip(
                ("sessions", "messages", "parts", "chunks", "state", "applied_ops"),
                (int(c) for c in counts),
                strict=True,
            )
        )
        | {"top_level_sessions": sum(1 for r in per if r["parent_id"] is None)},
        "database_bytes": db_bytes,
        "free_bytes": figures.free_bytes,
        "wal_bytes": figures.wal_bytes,
        "blobs": {
            "rows": int(blob_rows),
            "stored_bytes": int(blob_stored),
            "original_bytes": int(blob_original),
            "files": sum(1 for _ in store.blobs),
            "share": (int(blob_stored) / total) if total else 0.0,
        },
        "largest": per[:top],
        "sessions": per,
    }


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
    help="How many of the largest sessions to show.",
    **env("stats", "top"),
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="JSON on stdout, with the bytes of every session.",
    **env("stats", "json"),
)
@_store_option
def stats_command(top: int, as_json: bool, store: str | None) -> None:
    """Where a store's bytes go: counts, bytes per session (inline plus the stored size
    of its blobs; a blob shared by forks counts in each), the largest sessions, and
    the blobs' share of the store (database file plus blob files)."""
    with _opened("stats", store) as opened:
        figures = store_stats(opened, top)
    if as_json:
        click.echo(json.dumps(figures, ensure_ascii=False, indent=2))
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
    if figures["largest"]:
        click.echo("  largest sessions:")
        for r in figures["largest"]:
            click.echo(
                f"    {r['id']}  {_size(r['bytes']):>9}  ({_size(r['inline_bytes'])} inline, "
                f"{r['blobs']} blobs {_size(r['blob_stored_bytes'])})  {r['messages']} msgs  "
                f"{r['title'] or ''}"
            )


__all__ = ["SessionFacts", "session_facts", "sessions", "stats_command", "store_stats"]
