"""The search indexer: what the write path queued, and the backfill of what a store held
before it had an index, indexed in batches (docs/search.md, "Keeping the index").

A write that stores something searchable only queues it (``search_queue``, by triggers,
in its own transaction: migration 0011).  A batch reads the head of the queue (or the
next messages of the backfill) in a read transaction, reads their text (blob files
too) with no lock held, and writes their sections in one short write transaction that
first checks each one is still queued at the version it read: a message changed or
deleted meanwhile stays queued or is gone, and nothing stale is written.  So a batch is
idempotent, and a process killed anywhere leaves the queue as it was or a batch done
whole: no entry is ever lost (tests/domain/test_search_index.py).

One process of a file indexes at a time: the batch's transaction takes a lease
(``search_state.owner``, its host and pid) that it renews with each batch and gives
back when nothing is left; another process takes it over once its owner is gone (same
host) or made no batch for ``LEASE`` seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetstore import errors
from fleetstore.domain.codec import decode_part
from fleetstore.domain.ports import StorePort
from fleetstore.domain.search_text import (
    gram_fold,
    metadata_text,
    part_text,
    sections,
    tsvector,
)
from fleetstore.engine.base import Engine, Tx

log = logging.getLogger("fleetstore")

#: Seconds after its last batch that an indexer of another host (or of a pid this host
#: cannot check) is taken for gone.
LEASE = 30.0
#: The lock hold a batch aims at, and what its size starts at and may grow to.
TARGET_HOLD = 0.02
FIRST_CHARS = 64 * 1024
MOST_CHARS = 8 * 1024 * 1024
#: Owners (messages, sessions) one batch reads at most.
MOST_OWNERS = 500
#: A section's id is its owner's time in hundredths of a second << UNIT_BITS, plus a
#: counter: newest first is id order, and an owner's sections are found by their
#: hundredth (or the next one: a full one spills into it) without an index of their own
#: (one on message_id was a ninth of the text's size).  Few ids a second make the index
#: small, its postings being the gaps between ids: milliseconds << 16 (2**26 ids a
#: second) made the trigram index 1.8 times as large as 2**20 a second; this is 2**19.6.
UNITS = 100
UNIT_BITS = 13


def unit(at: float) -> int:
    """The time unit of a time *at* (seconds): as the triggers compute it."""
    return int(at * UNITS)


def id_range(at: float) -> tuple[int, int]:
    """The ids the sections of an owner of time *at* (seconds) may have: [lo, below)."""
    first = unit(at)
    return first << UNIT_BITS, (first + 2) << UNIT_BITS


class _LeaseLost(Exception):
    """Another process indexes this file now: the batch is not written."""


def lease_owner() -> str:
    """This process as the lease names it: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _owner_gone(owner: str | None, beat: float | None, now: float) -> bool:
    if owner is None:
        return True
    if beat is None or now - beat > LEASE:
        return True
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def tag(prefix: str, value: str) -> str:
    """A filter word: *prefix* and a hash of *value* (a word FTS5 keeps whole)."""
    return prefix + hashlib.blake2b(value.encode("utf-8"), digest_size=6).hexdigest()


def tags(session_id: str, root_id: str, project: str | None, kind: str, role: str | None) -> str:
    """The filter words of a section: its session, tree, project, kind and role."""
    found = [tag("s", session_id), tag("r", root_id), tag("k", kind)]
    if project is not None:
        found.append(tag("p", project))
    if role is not None:
        found.append(tag("o", role))
    return " ".join(found)


@dataclass(slots=True)
class Doc:
    """One section to index."""

    message_id: str | None
    session_id: str | None
    part: int | None
    kind: str
    start: int
    stop: int
    body: str
    tags: str
    #: PostgreSQL: the tsvector's text and the case-folded text (made before the write).
    words: str = ""
    folded: str = ""


@dataclass(slots=True)
class Owner:
    """A message or a session to (re)index: its queue key and version (None: an item of
    the backfill), and its sections (none: nothing searchable, or it is gone)."""

    doc: str
    ver: int | None
    #: Its time (a message's or a session's created_at): where its sections' ids are.
    at: float = 0.0
    docs: list[Doc] = field(default_factory=list)
    chars: int = 0


@dataclass(slots=True)
class Batch:
    """What one batch did."""

    owners: int = 0
    docs: int = 0
    chars: int = 0
    #: Seconds the write transaction held the lock.
    hold: float = 0.0
    #: Nothing is left to index (the queue is empty and the backfill done).
    idle: bool = False
    #: Another process holds the lease.
    busy: bool = False


def message_docs(
    row: Sequence[Any], parts: Sequence[Any], store: StorePort, most: int
) -> list[Doc]:
    """The sections of a message: ``row`` is a ``search_message_rows`` row, *parts* its
    ``parts_of_messages`` rows."""
    mid, sid, _seq, role, _status, error, _at, root_id, project = row[:9]
    found: list[Doc] = []

    def add(text: str | None, kind: str, part: int | None) -> None:
        if not text:
            return
        t = tags(sid, root_id, project, kind, role)
        for s in sections(text, most):
            found.append(Doc(mid, None, part, kind, s.start, s.stop, text[s.start : s.stop], t))

    for prow in parts:
        try:
            part = decode_part(store, prow)
        except errors.CorruptStore as exc:
            log.warning("search: part %s of message %s not indexed: %s", prow[1], mid, exc)
            continue
        add(part_text(part), str(prow[2]), int(prow[1]))
    add(error, "error", None)
    return found


def session_docs(row: Sequence[Any], most: int) -> list[Doc]:
    """The sections of a session's title and metadata (a ``search_session_rows`` row)."""
    sid, root_id, project, title, metadata = row[:5]
    found: list[Doc] = []
    texts = [("title", title), ("metadata", metadata_text(metadata))]
    for kind, text in texts:
        if not text:
            continue
        t = tags(sid, root_id, project, kind, None)
        for s in sections(text, most):
            found.append(Doc(None, sid, None, kind, s.start, s.stop, text[s.start : s.stop], t))
    return found


# -- a batch ----------------------------------------------------------------------------


def _read(store: StorePort, db: Engine, chars: int) -> tuple[list[Owner], dict[str, Any]]:
    """The owners a batch indexes (about *chars* characters of text), and the backfill
    cursors it moves to: the queue first, then the backfill."""
    q = store.queries
    most = store.settings.search_part_chars

    def run(tx: Tx) -> tuple[list[tuple[str, int | None]], Any, Any, Any, dict[str, Any]]:
        state = tx.execute(q["search_state_get"])[0]
        owners: list[tuple[str, int | None]] = [
            (str(d), int(v)) for d, v in tx.execute(q["search_queue_head"], {"limit": 100})
        ]
        moved: dict[str, Any] = {}
        if not owners and state[2] is not None:
            ids = tx.execute(q["search_backfill_sessions"], {"past": state[2], "limit": 200})
            owners = [("s" + str(r[0]), None) for r in ids]
            moved["sessions"] = str(ids[-1][0]) if len(ids) == 200 else None
        elif not owners and state[3] is not None:
            ids = tx.execute(q["search_backfill_messages"], {"past": state[3], "limit": 100})
            owners = [("m" + str(r[0]), None) for r in ids]
            moved["messages"] = str(ids[-1][0]) if len(ids) == 100 else None
        mids = json.dumps([d[1:] for d, _ in owners if d[0] == "m"])
        sids = json.dumps([d[1:] for d, _ in owners if d[0] == "s"])
        mrows = tx.execute(q["search_message_rows"], {"ids": mids})
        prows = tx.execute(q["parts_of_messages"], (mids,))
        srows = tx.execute(q["search_session_rows"], {"ids": sids})
        return owners, mrows, prows, srows, moved

    keys, mrows, prows, srows, moved = db.read(run)
    parts: dict[str, list[Any]] = {}
    for prow in prows:
        parts.setdefault(str(prow[0]), []).append(prow)
    messages = {str(r[0]): r for r in mrows}
    sessions = {str(r[0]): r for r in srows}
    owners: list[Owner] = []
    total = 0
    for doc, ver in keys:
        owner = Owner(doc, ver)
        key = doc[1:]
        if doc[0] == "m" and key in messages:
            row = messages[key]
            owner.at = float(row[6])
            if row[4] == "streaming":
                if ver is None:
                    continue  # the backfill leaves it: its end queues it
            else:
                owner.docs = message_docs(row, parts.get(key, ()), store, most)
        elif doc[0] == "s" and key in sessions:
            owner.at = float(sessions[key][5])
            owner.docs = session_docs(sessions[key], most)
        elif ver is None:
            continue  # the backfill's: gone since
        owner.chars = sum(len(d.body) for d in owner.docs)
        if db.dialect != "sqlite":
            for d in owner.docs:  # the work of tokenizing, done with no transaction open
                # PostgreSQL text holds no NUL, which a message body may (a body with one
                # stopped the indexer for good, its batch refused every time); a space
                # ends a trigram as the NUL did, and every hit is checked against its text.
                d.words, d.folded = tsvector(d.body), gram_fold(d.body).replace("\x00", " ")
        owners.append(owner)
        total += owner.chars
        if total >= chars and not moved:
            break  # the rest of the queue's head waits for the next batch
    return owners, moved


class _Full(Exception):
    """An owner's time unit and the next have no free section id left (over 2**13
    sections a hundredth of a second in one file): it is not indexed."""


def _allocate(tx: Tx, q: Any, at: float, used: dict[int, int]) -> int:
    """A free section id for an owner of time *at* (seconds): its unit's next one."""
    first = unit(at)
    for u in (first, first + 1):
        nxt = used.get(u)
        if nxt is None:
            lo = u << UNIT_BITS
            hi = lo + (1 << UNIT_BITS) - 1
            nxt = int(tx.execute(q["search_doc_next"], {"lo": lo, "hi": hi})[0][0])
        if nxt < (u + 1) << UNIT_BITS:
            used[u] = nxt + 1
            return nxt
        used[u] = nxt
    raise _Full


def _write(
    tx: Tx,
    store: StorePort,
    db: Engine,
    owners: list[Owner],
    moved: dict[str, Any],
    me: str,
    take: bool,
) -> Batch:
    q = store.queries
    now = time.time()
    state = tx.execute(q["search_state_get"])[0]
    seen = state[0] if take or _owner_gone(state[0], state[1], now) else me
    if not tx.execute(q["search_lease"], {"owner": me, "now": now, "seen": seen}):
        raise _LeaseLost
    queued = [o.doc for o in owners]
    current = {
        str(d): int(v)
        for d, v in tx.execute(q["search_queue_versions"], {"docs": json.dumps(queued)})
    }
    sqlite = db.dialect == "sqlite"
    used: dict[int, int] = {}
    batch = Batch()
    for o in owners:
        if o.ver is not None and current.get(o.doc) != o.ver:
            continue  # changed or deleted since it was read: indexed again later
        lo, below = id_range(o.at)
        who = {
            "lo": lo,
            "below": below,
            "message_id": o.doc[1:] if o.doc[0] == "m" else None,
            "session_id": o.doc[1:] if o.doc[0] == "s" else None,
        }
        if o.ver is None and (o.doc in current or tx.execute(q["search_indexed"], who)[0][0]):
            continue  # indexed (or queued) since: the backfill leaves it
        # Nothing to forget first: whatever queues an owner again (a part or a chunk
        # rewritten, a title changed, an import's later parts) takes its sections out
        # of the index as it does (the triggers of migration 0011; requeue()), and the
        # backfill takes only owners with none.
        try:
            ids = [_allocate(tx, q, o.at, used) for _ in o.docs]
        except _Full:
            log.error("search: %s not indexed: its time holds too many sections", o.doc)
            ids = []
        for doc_id, d in zip(ids, o.docs, strict=False):
            tx.execute(
                q["search_doc_insert"],
                {
                    "doc_id": doc_id,
                    "message_id": d.message_id,
                    "session_id": d.session_id,
                    "part": d.part,
                    "kind": d.kind,
                    "start": d.start,
                    "stop": d.stop,
                },
            )
            if sqlite:
                tx.execute(
                    q["fts5_words_insert"], {"doc_id": doc_id, "body": d.body, "tags": d.tags}
                )
                tx.execute(q["fts5_grams_insert"], {"doc_id": doc_id, "body": d.body})
            else:
                tx.execute(
                    q["tsv_text_insert"], {"doc_id": doc_id, "words": d.words, "folded": d.folded}
                )
            batch.docs += 1
        if o.ver is not None:
            tx.execute(q["search_queue_done"], {"doc": o.doc, "ver": o.ver})
        batch.owners += 1
        batch.chars += o.chars
    if "sessions" in moved:
        tx.execute(q["search_backfill_sessions_at"], {"cursor": moved["sessions"]})
    if "messages" in moved:
        tx.execute(q["search_backfill_messages_at"], {"cursor": moved["messages"]})
    after = tx.execute(q["search_state_get"])[0]
    if after[2] is None and after[3] is None and not after[4]:
        tx.execute(q["search_release"], {"owner": me})
        batch.idle = True
    return batch


def index_batch(
    store: StorePort, db: Engine, chars: int = FIRST_CHARS, *, take: bool = False
) -> Batch:
    """Index one batch of *db* (a store's file): about *chars* characters of text from
    the head of its queue, else from its backfill.  ``idle`` if nothing was left,
    ``busy`` if another process holds the lease (nothing written).  *take*: take the
    lease even from a live process (its next batch finds it lost, and waits)."""
    me = lease_owner()
    state = db.read(lambda tx: tx.execute(store.queries["search_state_get"])[0])
    if state[2] is None and state[3] is None and not state[4]:
        return Batch(idle=True)
    if not take and state[0] not in (None, me) and not _owner_gone(state[0], state[1], time.time()):
        return Batch(busy=True)
    owners, moved = _read(store, db, chars)
    if not owners and not moved:
        return Batch(idle=True)
    began = [0.0]

    def run(tx: Tx) -> Batch:
        began[0] = time.monotonic()
        return _write(tx, store, db, owners, moved, me, take)

    try:
        batch = db.run_write(run)
    except _LeaseLost:
        return Batch(busy=True)
    batch.hold = time.monotonic() - began[0]
    return batch


def requeue(tx: Tx, q: Any, message_id: str, created_at: float) -> None:
    """Inside a write: message *message_id* changed (an import added parts to it):
    what the index holds of it goes, and it is queued to be indexed again."""
    lo, below = id_range(created_at)
    tx.execute(
        q["search_forget"],
        {"lo": lo, "below": below, "message_id": message_id, "session_id": None},
    )
    tx.execute(q["search_enqueue"], {"doc": "m" + message_id, "at": time.time()})


def next_size(chars: int, batch: Batch) -> int:
    """The next batch's size, following the measured hold toward ``TARGET_HOLD``."""
    if batch.chars < chars // 2 or batch.hold <= 0:
        return chars
    wanted = int(chars * TARGET_HOLD / batch.hold)
    return max(4096, min(MOST_CHARS, wanted, chars * 2))


__all__ = [
    "LEASE",
    "Batch",
    "backfill_progress",
    "catch_up",
    "Doc",
    "Owner",
    "index_batch",
    "lease_owner",
    "message_docs",
    "next_size",
    "queue_lag",
    "requeue",
    "session_docs",
    "tag",
    "tags",
]


def catch_up(
    store: StorePort,
    db: Engine,
    *,
    progress: Callable[[int, int], None] | None = None,
    stop: Callable[[], bool] = lambda: False,
    wait: float = 0.2,
    take: bool = False,
) -> Batch:
    """Index *db* until nothing is left (or *stop*): the queue, then the backfill.  While
    another process holds the lease, wait for it (*wait* seconds between looks).
    *progress(done, total)*: the backfill's messages, after each batch.  The totals.

    *take*: take the lease from whoever holds it (a live fleet's indexer rests between
    batches holding it, and a catch-up waiting for it waited as long as the fleet
    wrote), index what was queued before the call and the backfill, then give the
    lease back: a fleet writing meanwhile is not chased, its indexers go on."""
    q = store.queries
    total = Batch()
    chars = FIRST_CHARS
    since = float(db.read(lambda tx: tx.execute(q["search_queue_lag"])[0][2])) if take else 0.0

    def done_before() -> bool:
        def run(tx: Tx) -> bool:
            count, oldest, _now = tx.execute(q["search_queue_lag"])[0]
            state = tx.execute(q["search_state_get"])[0]
            backfilled = state[2] is None and state[3] is None
            return backfilled and (not count or float(oldest) > since)

        return db.read(run)

    try:
        while not stop() and not (take and done_before()):
            batch = index_batch(store, db, chars, take=take)
            _add(total, batch)
            if progress is not None:
                progress(*backfill_progress(store, db))
            if batch.idle:
                total.idle = True
                break
            if batch.busy:
                time.sleep(wait)
                continue
            chars = next_size(chars, batch)
    finally:
        if take:
            me = lease_owner()
            # Not given back (the store locked past the budget, closing): it lapses when
            # this process is gone, or after LEASE seconds without a batch.
            with contextlib.suppress(errors.FleetstoreError):
                db.run_write(lambda tx: tx.execute(q["search_release"], {"owner": me}))
    return total


def _add(total: Batch, batch: Batch) -> None:
    total.owners += batch.owners
    total.docs += batch.docs
    total.chars += batch.chars
    total.hold += batch.hold


def queue_lag(store: StorePort, keys: Iterable[str | None] | None = None) -> tuple[int, float]:
    """(owners queued for the index, how long the oldest has waited) over the files
    *keys* (default: every file of the store): no count of sections or messages, cheap
    enough for a scrape and for an indexer's look."""
    q = store.queries

    def one(db: Engine) -> tuple[int, float]:
        def run(tx: Tx) -> tuple[int, float]:
            # the database's clock: a PostgreSQL read has no tx.now (the lag read 0)
            count, oldest, now = tx.execute(q["search_queue_lag"])[0]
            return int(count), 0.0 if oldest is None else max(0.0, float(now) - float(oldest))

        return db.read(run)

    if keys is None:
        keys = store.search_files(session_id=None, root_id=None, project=None)
    queued, worst = 0, 0.0
    for key in keys:
        count, age = store.with_file(key, one)
        queued += count
        worst = max(worst, age)
    return queued, worst


def backfill_progress(store: StorePort, db: Engine) -> tuple[int, int]:
    """(messages the backfill has passed, messages) of *db*: equal once it is done."""
    q = store.queries

    def run(tx: Tx) -> tuple[int, int]:
        after = tx.execute(q["search_state_get"])[0][3]
        done, total = tx.execute(
            q["search_backfill_progress"], {"past": "" if after is None else after}
        )[0]
        return (int(total), int(total)) if after is None else (int(done), int(total))

    return db.read(run)
