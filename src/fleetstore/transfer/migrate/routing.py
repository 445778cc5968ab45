"""Where rows go in a sharded destination: a session tree's rows to the shard of
its root (``shard_key(root_id)``), unless a catalog table refers to one of its
sessions (an ADK session: the catalog); ``_Copier._route`` sorts each batch by it."""

from __future__ import annotations

from typing import Any

from fleetstore.domain.registry import TREE_FILE_OPS
from fleetstore.store.sharded.shards import shard_key
from fleetstore.transfer.migrate.schema import _SESSIONS, Table, _quote
from fleetstore.transfer.migrate.side import _Side

#: The sharded layout: the tables whose rows live in their session tree's shard, with
#: the column that names the session (``chunks`` through its message).
_BY_SESSION = {
    "sessions": "id",
    "messages": "session_id",
    "parts": "session_id",
    "usage": "session_id",
    "state": "session_id",
    "applied_ops": "session_id",
}
_BY_MESSAGE = {"chunks": "message_id"}
#: applied_ops rows of these operations live where the router applies them: in the
#: session's shard; any other operation's in the catalog (an effect's op names the
#: effect in its ``session_id`` column).
_TREE_OPS = TREE_FILE_OPS


class _Homes:
    """Which file of a sharded DST each session's rows go to: the shard of its tree's
    root, or the catalog (None) for a tree a catalog table refers to."""

    def __init__(self) -> None:
        #: session id -> root_id
        self.roots: dict[str, str] = {}
        #: roots of the trees kept in the catalog
        self.in_catalog: set[str] = set()

    def of(self, session_id: Any) -> str | None:
        root = self.roots.get(session_id) if isinstance(session_id, str) else None
        if root is None or root in self.in_catalog:
            return None
        return shard_key(root)


def _homes(src: _Side, tables: dict[str, Table]) -> _Homes:
    """Read from SRC every session's tree, and the trees that must stay in the
    catalog: those whose sessions a catalog table refers to (ADK's ``adk_sessions``),
    and, from a sharded SRC, those its catalog holds."""
    homes = _Homes()
    sessions = tables[_SESSIONS]
    pinned: set[str] = set()
    refs = [
        (t, c)
        for t in tables.values()
        if t.name not in _BY_SESSION and t.name not in _BY_MESSAGE
        for c, p in t.references
        if p == _SESSIONS
    ]
    for part in src.parts():
        source = src.source(part, sessions)
        sql = f"SELECT id, root_id FROM {source}"
        lookups = [
            f"SELECT DISTINCT {_quote(c)} FROM {src.source(part, t)} WHERE {_quote(c)} IS NOT NULL"
            for t, c in refs
        ]

        def run(
            tx: Any, sql: str = sql, lookups: list[str] = lookups
        ) -> tuple[list[tuple[Any, ...]], list[Any]]:
            return tx.execute(sql), [r[0] for s in lookups for r in tx.execute(s)]

        with src.use(part) as db:
            rows, referred = db.read(run)
        for sid, root in rows:
            homes.roots[str(sid)] = str(root)
            if src.sharded and part is None:
                homes.in_catalog.add(str(root))
        pinned.update(str(s) for s in referred)
    homes.in_catalog.update(homes.roots[s] for s in pinned if s in homes.roots)
    return homes
