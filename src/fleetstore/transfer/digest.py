"""Reading a store's sessions: their rows in the order an export writes them, and
the content digest (``session_digest``) that merge, migrate, reshard and maintain's
archive compare stores by."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetstore import errors
from fleetstore.domain.codec import stored_json
from fleetstore.domain.imports import value_key
from fleetstore.domain.operations import Queries
from fleetstore.engine.base import Tx

if TYPE_CHECKING:
    from fleetstore.store.facade import Store

_PAGE = 200  # messages read per read transaction


@dataclass(frozen=True, slots=True)
class SessionDigest:
    """A session's message count and a SHA-256 over its whole content (row,
    messages with parts and usage, state), independent of how payloads are
    stored (inline, blob or streamed chunks)."""

    messages: int
    sha256: str


@dataclass(slots=True)
class PartRow:
    seq: int
    kind: str
    meta: str
    enc: str
    body: Any
    blob_sha: str | None
    size: int
    chunks: list[tuple[int, str]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(t for _, t in self.chunks)

    def value_key(self) -> tuple[str, str, int]:
        return value_key(self.enc, self.body, self.blob_sha, self.size, self.text)


@dataclass(slots=True)
class MessageRow:
    row: tuple[Any, ...]  # message_list: id, session_id, seq, role, status, model, metadata,
    # error, created_at, completed_at
    parts: list[PartRow]
    usage: tuple[Any, ...] | None


StateRow = tuple[Any, ...]  # namespace, key, version, enc, value, blob_sha, size, updated_at


def _read_messages(tx: Tx, q: Queries, sid: str, after: int, limit: int) -> list[MessageRow]:
    rows = tx.execute(q["message_list"], {"session_id": sid, "after": after, "limit": limit})
    if not rows:
        return []
    ids = json.dumps([r[0] for r in rows])
    parts: dict[str, list[PartRow]] = {r[0]: [] for r in rows}
    index: dict[tuple[str, int], PartRow] = {}
    for mid, seq, kind, meta, enc, body, sha, size in tx.execute(q["transfer_parts"], (ids,)):
        part = PartRow(seq, kind, meta, enc, body, sha, size)
        parts[mid].append(part)
        index[(mid, seq)] = part
    for mid, part_seq, seq, text in tx.execute(q["transfer_chunks"], (ids,)):
        owner = index.get((mid, part_seq))
        if owner is not None:
            owner.chunks.append((seq, text))
    usage = {u[0]: tuple(u[1:]) for u in tx.execute(q["usage_of_messages"], (ids,))}
    return [MessageRow(tuple(r), parts[r[0]], usage.get(r[0])) for r in rows]


def session_messages(store: Store, sid: str) -> Iterator[MessageRow]:
    """A session's messages in order, a page per read transaction (a long read
    would pin the WAL; DESIGN.md, checkpoint starvation)."""
    q = store.queries
    after = 0
    while True:
        page = store.read(
            functools.partial(_read_messages, q=q, sid=sid, after=after, limit=_PAGE),
            session_id=sid,
        )
        yield from page
        if len(page) < _PAGE:
            return
        after = page[-1].row[2]


def state_rows(store: Store, sid: str) -> list[StateRow]:
    q = store.queries
    return [
        tuple(r)
        for r in store.read(
            lambda tx: tx.execute(q["transfer_state_of_session"], (sid,)), session_id=sid
        )
    ]


def session_row(store: Store, sid: str) -> tuple[Any, ...] | None:
    q = store.queries
    rows = store.read(lambda tx: tx.execute(q["session_get"], (sid,)), session_id=sid)
    return tuple(rows[0]) if rows else None


class Digest:
    """SHA-256 over a session's content in a canonical form (see SessionDigest)."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self.messages = 0

    def _add(self, item: list[Any]) -> None:
        line = json.dumps(item, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        self._sha.update(line.encode("utf-8") + b"\n")

    def session(self, r: tuple[Any, ...]) -> None:
        self._add(["session", *r[:8], stored_json(r[8], "session", r[0]), *r[9:]])

    def message(self, m: MessageRow) -> None:
        self.messages += 1
        r = m.row
        parts = [[p.seq, p.kind, stored_json(p.meta, "message", r[0]), *p.value_key()]
                 for p in m.parts]  # fmt: skip
        usage = list(m.usage) if m.usage is not None else None
        self._add(["message", *r[:6], stored_json(r[6], "message", r[0]), *r[7:], usage, parts])

    def state(self, s: StateRow) -> None:
        ns, key, version, enc, body, sha, size, updated = s
        self._add(["state", ns, key, version, *value_key(enc, body, sha, size), updated])

    def result(self) -> SessionDigest:
        return SessionDigest(self.messages, self._sha.hexdigest())


def session_digest(store: Store, session_id: str) -> SessionDigest | None:
    """The session's message count and content hash (None if there is no such session)."""
    row = session_row(store, session_id)
    if row is None:
        return None
    digest = Digest()
    digest.session(row)
    for m in session_messages(store, session_id):
        digest.message(m)
    for s in state_rows(store, session_id):
        digest.state(s)
    return digest.result()


def session_order(store: Store, session_ids: Sequence[str] | None) -> list[str]:
    """The sessions to export, parents before their subagents."""
    q = store.queries
    store.sync_catalog()
    rows = store.read(lambda tx: tx.execute(q["transfer_session_tree"]))
    children: dict[str | None, list[str]] = {}
    known = set()
    for sid, parent in rows:
        children.setdefault(parent, []).append(sid)
        known.add(sid)
    if session_ids is None:
        roots = list(children.get(None, []))
    else:
        roots = []
        for sid in session_ids:
            if sid not in known:
                raise errors.NotFound(f"no session {sid!r} to export")
            roots.append(sid)
    order: list[str] = []
    seen: set[str] = set()
    for root in roots:
        stack = [root]
        while stack:
            sid = stack.pop()
            if sid in seen:
                continue
            seen.add(sid)
            order.append(sid)
            stack.extend(reversed(children.get(sid, [])))
    return order


__all__ = [
    "SessionDigest",
    "session_digest",
    "session_order",
]
