"""``store.search``: full-text search of every session's history (docs/search.md).

A search asks each file of the store (one, or a sharded store's catalog and shards)
for the sections its index says match, in the order asked, and checks each one against
the text as it is now (read from its message's parts, chunks and blobs, or its
session's row): a section whose text no longer matches (changed since it was indexed)
is not a hit, nor is one of a session being deleted or forked, and what is shown, the
snippet and its highlights, is what matched.  Hits are per part: a part cut into
several sections is one hit, with the first section (in the order asked) that matches.
The files' hits are merged in one order: newest first by the time of their message
(or session), or best first by rank.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetstore import errors
from fleetstore.core.validate import (
    ROLES_MAX,
    check_bool,
    check_int,
    check_opt_id,
    check_opt_number,
    check_opt_str,
    check_str,
)
from fleetstore.domain.codec import decode_part
from fleetstore.domain.ports import StorePort
from fleetstore.domain.search_index import (
    UNIT_BITS,
    UNITS,
    Batch,
    backfill_progress,
    catch_up,
    tag,
    unit,
)
from fleetstore.domain.search_query import (
    MODES,
    Matcher,
    Node,
    fts5_grams,
    fts5_words,
    parse,
    pg_substring,
    pg_tsquery,
)
from fleetstore.domain.search_text import KINDS, metadata_text, part_text, snippet
from fleetstore.engine.base import Engine, Tx
from fleetstore.models import Page, SearchHit, SearchStatus

ORDERS = ("newest", "best")
DEFAULT_LIMIT = 20
MAX_LIMIT = 1000
#: Candidate sections one round reads at first (it doubles, up to _MOST_ROUND).
_FIRST_ROUND = 32
_MOST_ROUND = 1024
#: Best first in substring mode reads this many candidates at most (they are ranked by
#: how often the substring occurs, which only reading each one tells).
SUBSTRING_BEST_MOST = 2000
_NO_ID = 1 << 62  # above every section id
_MAX_TIME = 1 << 40  # seconds: later than any section's


@dataclass(frozen=True, slots=True)
class Query:
    """A search's arguments, checked."""

    node: Node
    mode: str
    order: str
    matcher: Matcher
    project: str | None
    session_id: str | None
    root_id: str | None
    roles: frozenset[str] | None
    kinds: frozenset[str] | None
    since: float | None
    until: float | None
    include_archived: bool
    limit: int
    cursor: tuple[Any, ...] | None

    @property
    def filtered(self) -> bool:
        """Whether a filter the index's tags can apply is given."""
        return any(
            v is not None
            for v in (self.project, self.session_id, self.root_id, self.roles, self.kinds)
        )


def _strings(value: object, what: str, limit: int) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise errors.InvalidInput(f"{what} must be a list of strings, not {value!r:.80}")
    found = frozenset(check_str(v, what, limit=limit, empty=False) for v in value)
    if not found:
        raise errors.InvalidInput(f"{what} must not be empty (None: any)")
    return found


def _cursor(value: object, order: str) -> tuple[Any, ...] | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 1024:
        raise errors.InvalidInput(f"cursor must be a page's next_cursor, not {value!r:.80}")
    try:
        head, _, body = value.partition(".")
        data = json.loads(base64.urlsafe_b64decode(body.encode("ascii")))
    except (ValueError, UnicodeError, binascii.Error):
        data = None
    if head == "n" and order == "newest" and isinstance(data, list) and len(data) == 3:
        at, key, part = data
        if (
            isinstance(at, int)
            and isinstance(key, str)
            and isinstance(part, list)
            and all(p is None or isinstance(p, str | int | float) for p in part)
        ):
            return ("n", at, key, tuple(part))
    if head == "b" and order == "best" and isinstance(data, int) and data >= 0:
        return ("b", data)
    raise errors.InvalidInput(
        f"cursor {value!r:.80} is not a next_cursor of a search in {order} order"
    )


def _encode(head: str, data: object) -> str:
    body = base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode())
    return f"{head}.{body.decode('ascii')}"


def check(
    query: object,
    *,
    match: object = "words",
    order: object = "newest",
    project: object = None,
    session_id: object = None,
    root_id: object = None,
    roles: object = None,
    kinds: object = None,
    since: object = None,
    until: object = None,
    include_archived: object = False,
    limit: object = DEFAULT_LIMIT,
    cursor: object = None,
) -> Query:
    """The arguments of a search, checked (``InvalidInput`` naming the first bad one)."""
    if order not in ORDERS:
        raise errors.InvalidInput(f"order must be one of {', '.join(ORDERS)}, not {order!r:.40}")
    if match not in MODES:
        raise errors.InvalidInput(f"match must be one of {', '.join(MODES)}, not {match!r:.40}")
    mode = str(match)
    node = parse(query, mode)
    kind_set = _strings(kinds, "kinds", 32)
    if kind_set is not None and not kind_set <= set(KINDS):
        raise errors.InvalidInput(
            f"kinds: unknown {', '.join(sorted(kind_set - set(KINDS)))}; known: {', '.join(KINDS)}"
        )
    lo = check_opt_number(since, "since", minimum=0.0, maximum=_MAX_TIME)
    hi = check_opt_number(until, "until", minimum=0.0, maximum=_MAX_TIME)
    return Query(
        node=node,
        mode=mode,
        order=str(order),
        matcher=Matcher(node, mode),
        project=check_opt_str(project, "project"),
        session_id=check_opt_id(session_id, "session_id"),
        root_id=check_opt_id(root_id, "root_id"),
        roles=_strings(roles, "roles", ROLES_MAX),
        kinds=kind_set,
        since=lo,
        until=hi,
        include_archived=check_bool(include_archived, "include_archived"),
        limit=check_int(limit, "limit", minimum=1, maximum=MAX_LIMIT),
        cursor=_cursor(cursor, str(order)),
    )


# -- one file ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Found:
    """A hit and where it sorts: section id, file key, part key."""

    key: tuple[Any, ...]
    hit: SearchHit
    part: tuple[Any, ...]


def _range(q: Query) -> tuple[int, int]:
    """Section ids from *lo* to below *below*: since and until, to the time unit."""
    lo = 0 if q.since is None else unit(q.since) << UNIT_BITS
    below = _NO_ID if q.until is None else math.ceil(q.until * UNITS) << UNIT_BITS
    return lo, below


def _tags(q: Query) -> str | None:
    found = []
    if q.session_id is not None:
        found.append(tag("s", q.session_id))
    if q.root_id is not None:
        found.append(tag("r", q.root_id))
    if q.project is not None:
        found.append(tag("p", q.project))
    for prefix, values in (("k", q.kinds), ("o", q.roles)):
        if values is not None:
            found.append("(" + " OR ".join(tag(prefix, v) for v in sorted(values)) + ")")
    return "{tags} : (" + " AND ".join(found) + ")" if found else None


def _filters(q: Query, queries: Mapping[str, str]) -> tuple[str, str, dict[str, Any]]:
    """The joins, the conditions (each after `` AND``) and the parameters that apply
    *q*'s filters to candidate sections in SQL (checked again on each hit)."""
    params: dict[str, Any] = {}
    conditions = []
    for name, value in (
        ("session", q.session_id),
        ("root", q.root_id),
        ("project", q.project),
        ("kinds", q.kinds),
        ("roles", q.roles),
    ):
        if value is None:
            continue
        conditions.append(queries[f"search_where_{name}"])
        key = {"session": "session_id", "root": "root_id"}.get(name, name)
        params[key] = json.dumps(sorted(value)) if isinstance(value, frozenset) else value
    joined = any(v is not None for v in (q.session_id, q.root_id, q.project, q.roles))
    joins = queries["search_join_sessions"] if joined else ""
    return joins, "".join(f" AND {c}" for c in conditions), params


def _statement(db: Engine, store: StorePort, q: Query) -> tuple[str, dict[str, Any]]:
    """The candidate query of *q* on *db* and its parameters (but the id range, limit
    and skip, which each round sets)."""
    queries = store.queries
    if db.dialect == "sqlite" and q.mode == "words":
        # The filters are words of the index too (tags): FTS5 intersects them.
        match = "{body} : (" + fts5_words(q.node) + ")"
        tags = _tags(q)
        if tags is not None:
            match += " AND " + tags
        name = "fts5_words_best" if q.order == "best" else "fts5_words_newest"
        return queries[name], {"match": match}
    joins, where, params = _filters(q, queries)
    if db.dialect == "sqlite":
        grams = fts5_grams(q.node)
        assert grams is not None  # parse() refuses a query with nothing positive
        text = queries["fts5_grams_newest"].format(joins=joins, filters=where)
        return text, {**params, "match": grams}
    if q.mode == "words":
        params["match"] = pg_tsquery(q.node)
        name = "tsv_words_best" if q.order == "best" else "tsv_words_newest"
        return queries[name].format(joins=joins, filters=where), params
    condition = pg_substring(q.node, "t.folded", params)
    text = queries["tsv_grams_newest"].format(joins=joins, filters=where, condition=condition)
    return text, params


def _visible(q: Query, session: Sequence[Any], role: str | None, kind: str, at: float) -> bool:
    """Whether a hit of *session* (id, root_id, project, job, status) passes the filters."""
    sid, root, project, job, status = session
    if job is not None or (not q.include_archived and status != "active"):
        return False
    if q.session_id is not None and sid != q.session_id:
        return False
    if q.root_id is not None and root != q.root_id:
        return False
    if q.project is not None and project != q.project:
        return False
    if q.roles is not None and role not in q.roles:
        return False
    if q.kinds is not None and kind not in q.kinds:
        return False
    if q.since is not None and at < q.since:
        return False
    return q.until is None or at < q.until


class _Texts:
    """The texts of candidate sections' owners, read once per search round."""

    def __init__(self, store: StorePort, tx: Tx, rows: Sequence[Sequence[Any]]) -> None:
        queries = store.queries
        self.store = store
        mids = json.dumps(sorted({str(r[1]) for r in rows if r[1] is not None}))
        sids = json.dumps(sorted({str(r[2]) for r in rows if r[2] is not None}))
        self.messages = {
            str(r[0]): r for r in tx.execute(queries["search_message_rows"], {"ids": mids})
        }
        self.parts: dict[tuple[str, int], Sequence[Any]] = {
            (str(p[0]), int(p[1])): p for p in tx.execute(queries["parts_of_messages"], (mids,))
        }
        self.sessions = {
            str(r[0]): r for r in tx.execute(queries["search_session_rows"], {"ids": sids})
        }
        self._cache: dict[tuple[Any, ...], str | None] = {}

    def text(self, row: Sequence[Any]) -> str | None:
        _id, mid, sid, part, kind = row[:5]
        key = (mid, sid, part, kind)
        if key in self._cache:
            return self._cache[key]
        text: str | None = None
        if mid is not None and mid in self.messages:
            if part is None:
                text = self.messages[mid][5]
            elif (mid, part) in self.parts:
                try:
                    text = part_text(decode_part(self.store, self.parts[(mid, part)]))
                except errors.CorruptStore:
                    text = None
        elif sid is not None and sid in self.sessions:
            s = self.sessions[sid]
            text = s[3] if kind == "title" else metadata_text(s[4])
        self._cache[key] = text
        return text


def _hits(
    q: Query, fkey: str, texts: _Texts, rows: Sequence[Sequence[Any]], seen: set[tuple[Any, ...]]
) -> list[_Found]:
    found = []
    for row in rows:
        doc_id, mid, sid, part, kind, start, stop, rank = row
        pkey = ("m", mid, part, kind) if mid is not None else ("s", sid, None, kind)
        if pkey in seen:
            continue
        if mid is not None:
            m = texts.messages.get(mid)
            if m is None:
                continue
            session = (m[1], m[7], m[8], m[9], m[10])
            role, at, seq, owner = m[3], float(m[6]), int(m[2]), str(m[1])
        else:
            s = texts.sessions.get(sid)
            if s is None:
                continue
            session = (s[0], s[1], s[2], s[6], s[7])
            role, at, seq, owner = None, float(s[5]), None, str(s[0])
        if not _visible(q, session, role, kind, at):
            continue
        text = texts.text(row)
        if text is None:
            continue
        section = text[start:stop]
        spans = q.matcher.match(section)
        if spans is None:
            continue  # changed since it was indexed
        seen.add(pkey)
        shown, marks = snippet(section, spans)
        score = float(rank) if q.mode == "words" else float(len(spans))
        hit = SearchHit(owner, mid, seq, part, kind, role, shown, marks, score, at)
        found.append(_Found((int(doc_id), fkey), hit, pkey))
    return found


def _file_hits(store: StorePort, db: Engine, fkey: str, q: Query, want: int) -> list[_Found]:
    """Up to *want* hits of file *db*, in the order asked, after the cursor."""
    sql, params = _statement(db, store, q)
    lo, below = _range(q)
    seen: set[tuple[Any, ...]] = set()
    if q.cursor is not None and q.cursor[0] == "n":
        _, at, ckey, cpart = q.cursor
        # (id, file key) descending: a file after the cursor's in that order may hold
        # the cursor's id too; the cursor's own file continues below it, past its part.
        below = min(below, at + 1 if fkey < ckey else at)
        if fkey == ckey:
            seen.add(tuple(cpart))
    found: list[_Found] = []
    size, skip = _FIRST_ROUND, 0
    substring_best = q.mode == "substring" and q.order == "best"
    if substring_best:
        want, size = SUBSTRING_BEST_MOST, _MOST_ROUND
    read = 0
    while len(found) < want and below > lo:

        def run(tx: Tx, below: int = below, size: int = size, skip: int = skip) -> Any:
            rows = tx.execute(
                sql, {**params, "lo": lo, "below": below, "limit": size, "skip": skip}
            )
            return rows, _Texts(store, tx, rows)

        rows, texts = db.read(run)
        found.extend(_hits(q, fkey, texts, rows, seen))
        read += len(rows)
        if len(rows) < size or (substring_best and read >= SUBSTRING_BEST_MOST):
            break
        if q.order == "best" and not substring_best:
            skip += len(rows)
        else:
            below = int(rows[-1][0])
        size = min(size * 2, _MOST_ROUND)
    if substring_best:
        found.sort(key=lambda f: (-f.hit.rank, -f.key[0]))
    return found


# -- the store --------------------------------------------------------------------------


def _file_key(key: str | None) -> str:
    return "" if key is None else key


def search(store: StorePort, q: Query) -> Page[SearchHit, str]:
    """The page of hits of *q* (checked by ``check``) in every file it may be in."""
    keys = store.search_files(session_id=q.session_id, root_id=q.root_id, project=q.project)
    offset = q.cursor[1] if q.cursor is not None and q.cursor[0] == "b" else 0
    want = offset + q.limit + 1 if q.order == "best" else q.limit + 1
    per_file: list[list[_Found]] = []
    for key in keys:

        def in_file(db: Engine, key: str | None = key) -> list[_Found]:
            return _file_hits(store, db, _file_key(key), q, want)

        per_file.append(store.with_file(key, in_file))
    if q.order == "newest":
        merged = list(heapq.merge(*per_file, key=lambda f: f.key, reverse=True))
        window = merged[: q.limit + 1]
        page = [f.hit for f in window[: q.limit]]
        more = len(window) > q.limit
        last = window[q.limit - 1] if more else None
        cursor = _encode("n", [last.key[0], last.key[1], list(last.part)]) if last else None
        return Page(page, more=more, next_cursor=cursor)
    everything = sorted(
        (f for found in per_file for f in found), key=lambda f: (-f.hit.rank, -f.key[0], f.key[1])
    )
    page = [f.hit for f in everything[offset : offset + q.limit]]
    more = len(everything) > offset + q.limit
    return Page(page, more=more, next_cursor=_encode("b", offset + q.limit) if more else None)


def status(store: StorePort) -> SearchStatus:
    """How far the index of every file of the store is behind."""
    queries = store.queries
    rows: list[Sequence[Any]] = []

    def one(db: Engine) -> Sequence[Any]:
        def run(tx: Tx) -> Sequence[Any]:
            row = tx.execute(queries["search_status"])[0]
            after = row[6]
            done, total = tx.execute(
                queries["search_backfill_progress"], {"past": "" if after is None else after}
            )[0]
            if after is None:
                done = total
            # row[7]: the database's clock, the one the triggers stamp the queue by (a
            # PostgreSQL read transaction has no tx.now: the lag read 0)
            return (*row[:7], int(done), int(total), float(row[7]))

        return db.read(run)

    for key in store.search_files(session_id=None, root_id=None, project=None):
        rows.append(store.with_file(key, one))
    queued = sum(int(r[0]) for r in rows)
    oldest = [float(r[1]) for r in rows if r[1] is not None]
    now = max((float(r[9]) for r in rows), default=0.0)
    return SearchStatus(
        queued=queued,
        lag=max(0.0, now - min(oldest)) if oldest else 0.0,
        sections=sum(int(r[2]) for r in rows),
        backfill_done=sum(int(r[7]) for r in rows),
        backfill_total=sum(int(r[8]) for r in rows),
        backfilling=sum(1 for r in rows if r[5] is not None or r[6] is not None),
        indexers=tuple(sorted({str(r[3]) for r in rows if r[3] is not None})),
    )


def _never() -> bool:
    return False


class Search:
    """``store.search``: call it to search; ``status()`` says how far the index is
    behind, ``catch_up()`` indexes what waits, now, in this thread."""

    def __init__(self, store: StorePort) -> None:
        self._store = store

    def __call__(
        self,
        query: str,
        *,
        match: str = "words",
        order: str = "newest",
        project: str | None = None,
        session_id: str | None = None,
        root_id: str | None = None,
        roles: Iterable[str] | None = None,
        kinds: Iterable[str] | None = None,
        since: float | None = None,
        until: float | None = None,
        include_archived: bool = False,
        limit: int = DEFAULT_LIMIT,
        cursor: str | None = None,
    ) -> Page[SearchHit, str]:
        """The hits of *query* (docs/search.md has its syntax), newest first (``order=
        "newest"``) or best first (``"best"``), at most *limit* in a ``Page``; its
        ``next_cursor`` (``cursor=``) gives the next page.  *match*: ``"words"``
        (words, phrases, prefixes) or ``"substring"`` (text anywhere, even inside a
        word, case aside).  Filters: *project*, *session_id*, *root_id* (a tree),
        *roles* and *kinds* (any of them), *since* and *until* (the message's time,
        seconds since the epoch: since <= t < until), *include_archived* (archived
        sessions are left out by default, as ``sessions.list`` leaves them).  What the
        index has not taken yet (``status()``) is not found."""
        q = check(
            query,
            match=match,
            order=order,
            project=project,
            session_id=session_id,
            root_id=root_id,
            roles=roles,
            kinds=kinds,
            since=since,
            until=until,
            include_archived=include_archived,
            limit=limit,
            cursor=cursor,
        )
        return search(self._store, q)

    def status(self) -> SearchStatus:
        """How far the index of every file of the store is behind."""
        return status(self._store)

    def catch_up(
        self,
        *,
        progress: Callable[[int, int], None] | None = None,
        stop: Callable[[], bool] | None = None,
        take_over: bool = False,
    ) -> int:
        """Index everything queued and the backfill of every file now, in this thread,
        waiting for a process that indexes a file meanwhile; the sections written.
        *progress(done, total)*: the backfill's messages, summed over the files, after
        each batch; *stop()* True stops it between two batches.

        *take_over*: do not wait for the fleet.  Each file's indexing is taken from the
        process doing it (a live process's indexer rests between batches, taking a
        tenth of its time: ``search_share``), what was queued before the call and the
        backfill are indexed at full speed, and the file is given back: writes made
        meanwhile are left to the fleet's indexers (``fleetstore index``)."""
        for name, fn in (("progress", progress), ("stop", stop)):
            if fn is not None and not callable(fn):
                raise errors.InvalidInput(f"{name} must be a function, not {fn!r:.80}")
        check_bool(take_over, "take_over")
        if stop is None:
            stop = _never
        keys = self._store.search_files(session_id=None, root_id=None, project=None)
        seen: dict[str | None, tuple[int, int]] = {}
        for key in keys:
            seen[key] = self._store.with_file(key, lambda db: backfill_progress(self._store, db))

        def report(key: str | None, done: int, total: int) -> None:
            seen[key] = (done, total)
            if progress is not None:
                progress(sum(d for d, _ in seen.values()), sum(t for _, t in seen.values()))

        written = 0
        for key in keys:
            if stop():
                break

            def one(db: Engine, key: str | None = key) -> Batch:
                return catch_up(
                    self._store,
                    db,
                    progress=lambda d, t: report(key, d, t),
                    stop=stop,
                    take=take_over,
                )

            written += self._store.with_file(key, one).docs
        return written


__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "ORDERS",
    "Query",
    "Search",
    "check",
    "search",
    "status",
]
