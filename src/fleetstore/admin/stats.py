"""What a store holds, read for ``fleetstore sessions`` and ``fleetstore stats``: one
session's facts, whether a session exists, the ids users know a session by (an Agents
SDK session id, ADK's app, user and session ids), the LangGraph threads, and where
the store's bytes go (every file of a sharded store added up)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import fleetstore
from fleetstore.admin.maintain.files import each_file, file_size
from fleetstore.domain.openai_agents import META_KEY as AGENTS_KEY
from fleetstore.engine.base import Tx
from fleetstore.models import EffectState

#: The session metadata key under which an ADK session keeps its names
#: (domain/adk.py writes it with the session).
ADK_KEY = "adk"


def message_counts(store: Any, session_ids: Sequence[str] | None = None) -> dict[str, int]:
    """Messages per session: of the whole store, or (a sharded store) of the files
    that hold *session_ids*, each file read once."""
    q = store.queries

    def run(tx: Tx) -> dict[str, int]:
        return {str(s): int(n) for s, n in tx.execute(q["mnt_stats_messages"])}

    if not store.spans_files:
        return dict(store.read(run))
    counts: dict[str, int] = {}
    if session_ids is None:
        each_file(store, lambda _key, db: counts.update(db.read(run)))
        return counts
    read: set[str | None] = set()
    for sid in session_ids:
        home = store.backend.home(sid)
        if home in read:
            continue
        read.add(home)
        counts.update(store.read(run, session_id=sid))
    return counts


def known_as(metadata: Mapping[str, Any] | str | None) -> dict[str, Any] | None:
    """The ids a framework's user knows this session by, from its metadata: an Agents
    SDK session's ``session_id``; an ADK session's ``app_name``, ``user_id`` and
    ``session_id``; None for a session of fleetstore's own API."""
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError:
            return None
    if not isinstance(metadata, Mapping):
        return None
    agents = metadata.get(AGENTS_KEY)
    if isinstance(agents, Mapping) and isinstance(agents.get("session_id"), str):
        return {"framework": "openai-agents", "session_id": agents["session_id"]}
    adk = metadata.get(ADK_KEY)
    if isinstance(adk, Mapping) and all(
        isinstance(adk.get(k), str) for k in ("app_name", "user_id", "session_id")
    ):
        return {
            "framework": "adk",
            "app_name": adk["app_name"],
            "user_id": adk["user_id"],
            "session_id": adk["session_id"],
        }
    return None


def known_name(known: Mapping[str, object] | None) -> str:
    """*known* (``known_as``) as one line: ``openai-agents:ID``, ``adk:APP/USER/ID``."""
    if not known:
        return ""
    if known["framework"] == "adk":
        return f"adk:{known['app_name']}/{known['user_id']}/{known['session_id']}"
    return f"{known['framework']}:{known['session_id']}"


def langgraph_threads(store: fleetstore.Store, limit: int = -1) -> list[dict[str, Any]]:
    """LangGraph threads (``FleetstoreSaver``), the latest checkpoint first: each
    thread's checkpoints, pending writes, payload bytes and last checkpoint time.  A
    thread is no fleetstore session: its rows are the ``ckpt_*`` tables (in a sharded
    store's catalog)."""
    q = store.queries
    rows = store.read(lambda tx: tx.execute(q["mnt_langgraph_threads"], {"limit": limit}))
    return [
        {
            "thread_id": str(t),
            "checkpoints": int(n),
            "pending_writes": int(w),
            "payload_bytes": int(b or 0),
            "last_checkpoint_at": float(last),
        }
        for t, n, last, w, b in rows
    ]


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
            "known_as": known_as(self.session.metadata),
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


def session_exists(store: fleetstore.Store, sid: str) -> bool:
    q = store.queries
    return bool(store.read(lambda tx: tx.execute(q["session_exists"], (sid,))))


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
    effects: dict[str, int]
    #: LangGraph checkpoints, channel values, pending writes, payload bytes.
    langgraph: list[int]
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
        effects = tx.execute(q["effect_counts"])
        langgraph = tx.execute(q["mnt_stats_langgraph"])[0]
        return per, counts, blobs, pages, effects, langgraph

    per, counts, blobs, (page_size, pages, free), effects, langgraph = db.read(run)
    for state, n in effects:
        figures.effects[str(state)] = figures.effects.get(str(state), 0) + int(n)
    for i, n in enumerate(langgraph):
        figures.langgraph[i] += int(n or 0)
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
    figures = _Figures(
        {name: {} for name in _PER_SESSION},
        [0] * 6,
        {},
        dict.fromkeys((str(s) for s in EffectState), 0),
        [0] * 4,
    )
    each_file(store, lambda key, db: _read_file(figures, db, q, sessions_here=key is None))
    parts, chunks, state, messages, blobs = (figures.per_session[n] for n in _PER_SESSION)
    rows = store.read(lambda tx: tx.execute(q["mnt_stats_sessions"]))
    counts = figures.counts
    blob_rows = len(figures.blobs)
    blob_stored = sum(v[0] for v in figures.blobs.values())
    blob_original = sum(v[1] for v in figures.blobs.values())
    per: list[dict[str, Any]] = []
    for sid, parent, title, project, status, updated, metadata in rows:
        inline = sum(int(d.get(sid, (0,))[0] or 0) for d in (parts, chunks, state))
        n_blobs, stored = blobs.get(sid, (0, 0))
        per.append(
            {
                "id": sid,
                "parent_id": parent,
                "title": title,
                "known_as": known_as(metadata),
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
    threads = langgraph_threads(store)
    db_bytes = figures.db_bytes
    total = db_bytes + int(blob_stored)
    return {
        "path": store.url if store.spans_files else str(store.path),
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
        "frameworks": _frameworks(per, figures.langgraph, threads, top),
        "outbox": {"by_state": figures.effects, "total": sum(figures.effects.values())},
        "largest": per[:top],
        "sessions": per,
        "langgraph_threads": sorted(threads, key=lambda t: (-t["payload_bytes"], t["thread_id"])),
    }


def _frameworks(
    sessions: list[dict[str, Any]], langgraph: list[int], threads: list[dict[str, Any]], top: int
) -> dict[str, Any]:
    """What the framework adapters keep: LangGraph threads (their checkpoint rows),
    Agents SDK sessions and ADK sessions (fleetstore sessions, told by their metadata)."""
    agents = [r for r in sessions if (r["known_as"] or {}).get("framework") == "openai-agents"]
    adk = [r for r in sessions if (r["known_as"] or {}).get("framework") == "adk"]
    checkpoints, channels, writes, payload = langgraph
    return {
        "langgraph": {
            "threads": len(threads),
            "checkpoints": checkpoints,
            "channel_values": channels,
            "pending_writes": writes,
            "payload_bytes": payload,
            "largest": sorted(threads, key=lambda t: (-t["payload_bytes"], t["thread_id"]))[:top],
        },
        "openai_agents": {
            "sessions": len(agents),
            "items": sum(r["messages"] for r in agents),
        },
        "adk": {
            "apps": len({r["known_as"]["app_name"] for r in adk}),
            "users": len({(r["known_as"]["app_name"], r["known_as"]["user_id"]) for r in adk}),
            "sessions": len(adk),
            "events": sum(r["messages"] for r in adk),
        },
    }


__all__ = [
    "SessionFacts",
    "known_as",
    "known_name",
    "langgraph_threads",
    "message_counts",
    "session_exists",
    "session_facts",
    "store_stats",
]
