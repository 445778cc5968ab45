"""Messages, parts and usage: the domain rules of a session's history (its sessions:
``fleetstore.domain.sessions``).

Payloads are encoded here, before any transaction: a body of at least
``blob_threshold`` bytes becomes a blob file (written and fsynced now) and the
operation carries only its hash.  Streams coalesce deltas and append them as
chunks; a part is never rewritten whole.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fleetstore import errors
from fleetstore.core.ids import new_id
from fleetstore.core.logs import logger
from fleetstore.core.redact import LOOKAROUND, CountedStream
from fleetstore.core.validate import (
    MAX_ERROR_TEXT,
    MAX_METADATA,
    MAX_MODEL,
    MAX_SHORT,
    MAX_TEXT,
    ROLES_MAX,
    check_id,
    check_int,
    check_mapping,
    check_number,
    check_opt_str,
    check_str,
    dump_json,
)
from fleetstore.domain.codec import (
    Prepared,
    damaged_row,
    decode_part,
    encode_part,
    encode_state,
    prepare_parts,
    redact_text,
    redact_value,
    stored_parts,
    write_parts,
)
from fleetstore.domain.operations import Operation
from fleetstore.domain.outbox import effects_args, prepare_effects
from fleetstore.domain.ports import StorePort
from fleetstore.models import (
    USAGE_FIELDS,
    Message,
    MessageStatus,
    NewEffect,
    Part,
    Session,
    SessionStatus,
    Text,
    ToolCall,
    ToolResult,
    Usage,
)

if TYPE_CHECKING:
    from fleetstore.engine.base import Tx

log = logger("fleetstore")

#: Seconds a listing waits for this process's recent writes to reach a sharded
#: store's catalog index (its background refresh); past it, it lists what is there.
LISTING_SYNC_WAIT = 0.5
#: How many sessions ``Messages`` remembers this process wrote to.
_KNOWN_SESSIONS = 4096
#: Messages ``Messages.iterate`` reads per read transaction.
ITERATE_PAGE = 100


def usage_args(usage: Usage | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The operation JSON of *usage*, checked (the operation checks it again)."""
    if usage is None:
        return None
    if isinstance(usage, Usage):
        data = {f: getattr(usage, f) for f in USAGE_FIELDS}
    elif isinstance(usage, Mapping):
        data = {k: v for k, v in usage.items() if v is not None}  # None counts as 0
    else:
        raise errors.InvalidInput(f"usage must be a Usage or a dict, not {type(usage).__name__}")
    unknown = set(data) - set(USAGE_FIELDS)
    if unknown:
        raise errors.InvalidInput(
            f"usage has unknown fields: {', '.join(sorted(map(str, unknown)))}"
        )
    for name, value in data.items():
        if name == "cost":
            check_number(value, "usage cost", minimum=0.0)
        else:
            check_int(value, f"usage {name}")
    return data


def effects_arg(store: StorePort, effects: Sequence[NewEffect]) -> list[dict[str, Any]] | None:
    """The ``effects`` argument of an operation: the effects that commit with it."""
    return effects_args(store, effects)


def title_arg(store: StorePort, value: object) -> str | None:
    """A title checked and redacted (often made from the first message), still within
    its limit (a marker may be longer than the secret it replaces)."""
    title = redact_text(store, check_opt_str(value, "title"))
    return title if title is None else title[:MAX_SHORT]


def metadata_arg(store: StorePort, value: Mapping[str, Any] | None) -> dict[str, Any]:
    """Metadata checked and redacted (its values are content too: a title's source, a
    command line, a URL with its token)."""
    if value is None:
        return {}
    data = check_mapping(value, "metadata")
    if not data:
        return data
    kept: dict[str, Any] = redact_value(store, data, dump_json(data, "metadata", MAX_METADATA))
    if kept is not data:  # markers can be longer than what they replace
        dump_json(kept, "metadata (redacted)", MAX_METADATA)
    return kept


# -- reading rows ----------------------------------------------------------------------------


def session_from_row(row: Sequence[Any]) -> Session:
    try:
        return Session(
            id=row[0],
            root_id=row[1],
            parent_id=row[2],
            forked_from=row[3],
            fork_seq=row[4],
            project=row[5],
            title=row[6],
            status=SessionStatus(row[7]),
            metadata=json.loads(row[8]),
            created_at=row[9],
            updated_at=row[10],
            archived_at=row[11],
            version=row[12],
        )
    except (ValueError, TypeError) as exc:
        raise damaged_row("session", row[0], exc) from exc


def messages_from_rows(store: StorePort, tx: Tx, rows: Sequence[Sequence[Any]]) -> list[Message]:
    return build_messages(store, *message_contents(store, tx, rows))


#: A page of messages as read: their rows, each one's part rows and usage.
Contents = tuple[Sequence[Sequence[Any]], dict[str, list[Sequence[Any]]], dict[str, Usage]]


def message_contents(store: StorePort, tx: Tx, rows: Sequence[Sequence[Any]]) -> Contents:
    """The part rows and usage of the messages *rows*, read in *tx*; no blob is read
    (``build_messages`` reads them)."""
    if not rows:
        return rows, {}, {}
    q = store.queries
    ids = json.dumps([r[0] for r in rows])
    parts: dict[str, list[Sequence[Any]]] = {r[0]: [] for r in rows}
    for prow in tx.execute(q["parts_of_messages"], (ids,)):
        parts[prow[0]].append(prow)
    usage = {
        u[0]: Usage(u[1], u[2], u[3], u[4], u[5], u[6])
        for u in tx.execute(q["usage_of_messages"], (ids,))
    }
    return rows, parts, usage


def build_messages(
    store: StorePort,
    rows: Sequence[Sequence[Any]],
    parts: dict[str, list[Sequence[Any]]],
    usage: dict[str, Usage],
) -> list[Message]:
    """The messages of *rows*, their parts decoded (a blob part's file read now)."""
    return [build_message(store, r, parts, usage) for r in rows]


def build_message(
    store: StorePort,
    r: Sequence[Any],
    parts: dict[str, list[Sequence[Any]]],
    usage: dict[str, Usage],
) -> Message:
    try:
        return Message(
            id=r[0],
            session_id=r[1],
            seq=r[2],
            role=r[3],
            parts=tuple(decode_part(store, prow) for prow in parts.get(r[0], ())),
            status=MessageStatus(r[4]),
            model=r[5],
            usage=usage.get(r[0]),
            metadata=json.loads(r[6]),
            error=r[7],
            created_at=r[8],
            completed_at=r[9],
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise damaged_row("message", r[0], exc) from exc


# -- the public API --------------------------------------------------------------------------


def error_text(text: str) -> str:
    """*text* (an exception's message) as a message's error: at most MAX_ERROR_TEXT
    characters, NUL and lone surrogates replaced."""
    text = text[: MAX_ERROR_TEXT + 1].replace("\x00", "\ufffd")
    text = text.encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= MAX_ERROR_TEXT else text[: MAX_ERROR_TEXT - 1] + "…"


class Messages:
    """``store.messages``: append, stream, get and list messages."""

    def __init__(self, store: StorePort) -> None:
        self._store = store
        #: Sessions this process wrote to lately: a stream into one of them does not
        #: read first whether it exists (a read a turn, measured).  Another process may
        #: delete one meanwhile: the stream's first write then raises NotFound.
        self._known: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._known_lock = threading.Lock()

    def _seen(self, session_id: str) -> None:
        with self._known_lock:
            known = self._known
            known[session_id] = None
            known.move_to_end(session_id)
            if len(known) > _KNOWN_SESSIONS:
                known.popitem(last=False)

    def append(
        self,
        session_id: str,
        role: str,
        parts: Sequence[Part] | str = (),
        *,
        model: str | None = None,
        usage: Usage | Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        id: str | None = None,
        effects: Sequence[NewEffect] = (),
    ) -> Message:
        """Append a whole message.  *parts* may be a string (one ``Text`` part).
        Appending the same *id* again returns the stored message and writes nothing.
        *effects* are enqueued in the same transaction (the transactional outbox)."""
        mid = new_id() if id is None else check_id(id, "id")
        check_id(session_id, "session_id")
        check_str(role, "role", limit=ROLES_MAX, empty=False)
        if model is not None:
            check_str(model, "model", limit=MAX_MODEL)
        meta = {} if metadata is None else metadata_arg(self._store, metadata)
        usage_dict = None if usage is None else usage_args(usage)
        if parts.__class__ is str:
            part_list: tuple[Part, ...] = (Text(parts),)
        elif parts.__class__ in (list, tuple) or (
            isinstance(parts, Sequence) and not isinstance(parts, str | bytes | bytearray)
        ):
            part_list = tuple(parts)
        else:
            raise errors.InvalidInput(
                f"parts must be a list of parts or a string, not {type(parts).__name__}"
            )
        prepared = prepare_parts(self._store, part_list)
        for p in prepared:  # (a loop without a call: the usual append makes none here)
            if p.__class__ is Prepared and p.redacted:
                part_list = stored_parts(self._store, part_list, prepared)
                break
        prepared_effects = prepare_effects(self._store, effects) if effects else None
        # Last: they write the blob files, and everything has been checked.
        effect_list = prepared_effects.write() if prepared_effects is not None else None
        encoded = write_parts(self._store, prepared)
        now = time.time()
        args: dict[str, Any] = {
            "id": mid,
            "session_id": session_id,
            "role": role,
            "model": model,
            "metadata": meta,
            "parts": encoded,
            "usage": usage_dict,
            "created_at": now,
        }
        if effect_list:
            args["effects"] = effect_list
        result = self._store.submit(Operation("append_message", args, new_id(), True))
        if result is not None:
            self._seen(session_id)
        if result is None or result.get("duplicate"):
            if result is not None:
                return self.get(mid)
            seq = None
        else:
            seq = result["seq"]
        return Message(
            id=mid,
            session_id=session_id,
            seq=seq,
            role=role,
            parts=part_list,
            model=model,
            usage=Usage(**usage_args(usage) or {}) if usage is not None else None,
            metadata=args["metadata"],
            created_at=now,
            completed_at=now,
        )

    def stream(
        self,
        session_id: str,
        role: str = "assistant",
        *,
        model: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        id: str | None = None,
    ) -> Stream:
        """A message written as it is produced::

            with store.messages.stream(s.id, model="m-1") as reply:
                reply.text("partial ")      # coalesced, flushed every stream_flush_interval
                call = reply.tool_call("bash", {"cmd": "ls"})
                call.result(output)         # large outputs become blobs
                reply.usage(input_tokens=10, output_tokens=3)

        The message is ``streaming`` while the block runs, ``complete`` after it,
        ``error`` if it raised (the exception propagates)."""
        return Stream(self._store, session_id, role, model, metadata, id, known=self)

    def get(self, message_id: str) -> Message:
        """One message with its parts (``NotFound`` if there is none)."""
        check_id(message_id, "message_id")
        q = self._store.queries

        def run(tx: Tx) -> list[Message]:
            return messages_from_rows(self._store, tx, tx.execute(q["message_get"], (message_id,)))

        found = self._store.read_first(run)
        if not found:
            self._store.check_visible(None)
            raise errors.NotFound(f"no message {message_id!r}")
        self._store.check_visible(found[0].session_id)
        return found[0]

    def list(
        self,
        session_id: str,
        *,
        after: int = 0,
        limit: int | None = None,
        last: int | None = None,
    ) -> list[Message]:
        """The session's messages in order: those after seq *after* (up to *limit*),
        or with *last*, the last *last* of them (still oldest first)."""
        check_id(session_id, "session_id")
        check_int(after, "after")
        for name, value in (("limit", limit), ("last", last)):
            if value is not None:
                check_int(value, name)
        self._store.check_visible(session_id)
        q = self._store.queries

        def run(tx: Tx) -> list[Message]:
            if not tx.execute(q["session_get"], (session_id,)):
                raise errors.NotFound(f"no session {session_id!r}")
            if last is not None:
                rows = tx.execute(q["message_list_last"], {"session_id": session_id, "limit": last})
                rows.reverse()
            else:
                params = {
                    "session_id": session_id,
                    "after": after,
                    "limit": -1 if limit is None else limit,
                }
                rows = tx.execute(q["message_list"], params)
            return messages_from_rows(self._store, tx, rows)

        return self._store.read(run, session_id=session_id)

    def iterate(
        self, session_id: str, *, after: int = 0, page: int = ITERATE_PAGE
    ) -> Iterator[Message]:
        """The session's messages after seq *after*, in order, read *page* at a time,
        each page in a read transaction of its own: a session of any length is read in
        memory bounded by a page of rows and one message's payloads, since a blob
        part's file is read when its message is reached, not with its page.  Messages
        committed while it runs are included if they come after the page being read.
        ``NotFound`` if there is no such session (at the first page)."""
        # Checked here, not at the first next(): a bad argument raises at the call
        # (test_hostile_api), as every other method's does.
        check_id(session_id, "session_id")
        check_int(after, "after")
        check_int(page, "page", minimum=1)
        self._store.check_visible(session_id)
        return self._pages(session_id, after, page)

    def _pages(self, session_id: str, after: int, page: int) -> Iterator[Message]:
        q = self._store.queries
        first = True
        while True:

            def run(tx: Tx, after: int = after, first: bool = first) -> Contents:
                if first and not tx.execute(q["session_get"], (session_id,)):
                    raise errors.NotFound(f"no session {session_id!r}")
                params = {"session_id": session_id, "after": after, "limit": page}
                return message_contents(self._store, tx, tx.execute(q["message_list"], params))

            rows, parts, usage = self._store.read(run, session_id=session_id)
            first = False
            for r in rows:
                yield build_message(self._store, r, parts, usage)
            if len(rows) < page:
                return
            after = int(rows[-1][2])


class ToolCallHandle:
    """Returned by ``reply.tool_call``: ``result()`` records what the tool returned."""

    def __init__(self, stream: Stream, call: ToolCall) -> None:
        self._stream = stream
        self.call = call

    @property
    def call_id(self) -> str:
        return self.call.call_id

    def result(self, output: str | bytes, *, is_error: bool = False) -> None:
        self._stream.add(ToolResult(self.call.call_id, output, is_error, self.call.name))


class Stream:
    """A message being written: see ``Messages.stream``.  Thread-safe.

    What is on disk when each call returns (docs/design.md, "Streaming"):
    entering the block and ``text``/``reasoning``/``tool_call``/``result`` write
    nothing to the database (a payload over ``blob_threshold`` is a blob file, written
    before the call returns); everything buffered is written, in one transaction, when
    ``stream_flush_bytes`` are pending, when the oldest buffered item is
    ``stream_flush_interval`` old (the store's background thread), on ``flush()``, and
    when the block ends: then with the reply's usage, its status, and the state values
    (``put_state``) and effects (``enqueue``) attached to it, and the block returns
    after that commit."""

    def __init__(
        self,
        store: StorePort,
        session_id: str,
        role: str,
        model: str | None,
        metadata: Mapping[str, Any] | None,
        id: str | None,
        known: Messages | None = None,
    ) -> None:
        self._store = store
        self._messages = known
        self.session_id = check_id(session_id, "session_id")
        self.id = new_id() if id is None else check_id(id, "id")
        check_str(role, "role", limit=ROLES_MAX, empty=False)
        self.role = role
        self.model = check_opt_str(model, "model", MAX_MODEL)
        self._metadata = metadata_arg(store, metadata)
        self._lock = threading.Lock()  # guards the buffer below
        self._flush_lock = threading.Lock()  # one write at a time keeps chunk order
        self._pending: list[dict[str, Any]] = []  # chunks
        self._parts: list[dict[str, Any]] = []  # whole parts: {"seq", "part"}
        self._pending_bytes = 0
        self._pending_since = 0.0
        self._sealed = 0  # leading pending chunks that a failed write may have stored
        self._part_seq = -1
        self._part_kind: str | None = None
        self._chunk_seq: dict[int, int] = {}
        self._usage: dict[str, Any] | None = None
        self._effects: list[dict[str, Any]] = []
        self._state: list[dict[str, Any]] = []
        self._created: dict[str, Any] | None = None  # the message row, until written
        #: Redaction of the streamed text (None: off), each text part through a stream
        #: redactor once a rule's prefix shows in it (a secret cut by a flush is still
        #: whole to it): part_seq -> (its redactor, its kind); before that, the part's
        #: last characters written (what a rule looks behind at).
        self._redaction = store.redaction
        self._scrub: dict[int, tuple[CountedStream, str]] = {}
        self._tail: dict[int, str] = {}
        self._registered = False
        self._open = False
        self._finished = False
        self.flushes = 0

    def __enter__(self) -> Stream:
        self.open()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.finish()
        else:
            # Redacted whole, then cut: a secret cut at the limit matches no rule.
            text = redact_text(self._store, f"{type(exc).__name__}: {exc}")
            self.finish(error=error_text(text))

    def open(self) -> None:
        """Start the reply.  Nothing is written yet: the message row goes with the
        first write (a reply produced within one flush window is one transaction).
        An unknown session is ``NotFound`` here, from a read, not at the end."""
        known = self._messages is not None and self.session_id in self._messages._known
        if not known and not self._store.spool_pending(self.session_id):
            q = self._store.queries
            found = self._store.read(
                lambda tx: tx.execute(q["session_exists"], (self.session_id,)),
                session_id=self.session_id,
            )
            if not found:
                raise errors.NotFound(f"no session {self.session_id!r}")
            if self._messages is not None:
                self._messages._seen(self.session_id)
        self._created = {
            "role": self.role,
            "model": self.model,
            "metadata": self._metadata,
            "created_at": time.time(),
        }
        self._open = True

    def text(self, delta: str) -> None:
        """Append text to the reply (coalesced with neighbouring deltas)."""
        self._delta("text", delta)

    def reasoning(self, delta: str) -> None:
        """Append reasoning text (kept in its own part)."""
        self._delta("reasoning", delta)

    def _delta(self, kind: str, delta: str) -> None:
        if not isinstance(delta, str):
            raise errors.InvalidInput(f"a {kind} delta must be a str, not {type(delta).__name__}")
        if not delta:
            return
        # Here, not at a flush that would keep failing.
        check_str(delta, f"a {kind} delta", limit=MAX_TEXT)
        with self._lock:
            # Under the lock finish() ends the stream with: a delta let in as it took
            # the buffer for its last write was dropped without a word.
            self._check_open()
            if self._part_kind != kind:
                self._part_seq += 1
                self._part_kind = kind
            part_seq = self._part_seq
            last = self._pending[-1] if len(self._pending) > self._sealed else None
            if (
                last is not None
                and last["part_seq"] == part_seq
                and len(last["text"]) + len(delta) <= MAX_TEXT  # a chunk's limit
            ):
                last["text"] += delta
            else:
                seq = self._chunk_seq.get(part_seq, 0)
                self._chunk_seq[part_seq] = seq + 1
                self._pending.append(
                    {"part_seq": part_seq, "kind": kind, "seq": seq, "text": delta}
                )
            self._pending_bytes += len(delta)
            full = self._pending_bytes >= self._store.settings.stream_flush_bytes
            first = self._buffered_first()
        if first:
            self._store.streams_opened(self)
        if full:
            self._flush_kept()

    def _flush_kept(self) -> None:
        """A flush because the buffer is full: if it fails (the store busy past the
        budget with ``on_busy="raise"``), what it held stays buffered for the next
        write and the call that added to it returns.  Raised, it was taken for the
        delta's refusal, and a retried delta was stored twice."""
        try:
            self.flush()
        except errors.FleetstoreError as exc:
            log.debug("stream %s: its flush is left for the next write: %s", self.id, exc)

    def _buffered_first(self) -> bool:
        """Under _lock, after buffering: start the flush clock if this is the first
        buffered item, and say whether the background thread must learn of it."""
        if self._pending_since == 0.0:
            self._pending_since = time.monotonic()
        if self._registered:
            return False
        self._registered = True
        return True

    def due(self) -> float | None:
        """When the buffer must be written (monotonic time), if anything is buffered."""
        with self._lock:
            if not (self._pending or self._parts):
                return None
            return self._pending_since + self._store.settings.stream_flush_interval

    def flush(self) -> None:
        """Write everything buffered now, in one transaction (the message row too, if
        it was not written yet: after ``flush()`` the reply is visible, ``streaming``)."""
        with self._flush_lock:
            self._write(None)

    def _take(
        self,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any] | None, int]:
        with self._lock:
            chunks, self._pending, self._pending_bytes = self._pending, [], 0
            parts, self._parts = self._parts, []
            sealed, self._sealed = self._sealed, 0
            self._pending_since = 0.0
            return chunks, parts, self._created, sealed

    def _redact(self, chunks: list[dict[str, Any]], done: int, final: bool) -> list[dict[str, Any]]:
        """Under _flush_lock: *chunks* with their text redacted (the first *done* were,
        by a write that failed), and the text held back for a part that ended."""
        redaction = self._redaction
        assert redaction is not None
        fed = False
        for chunk in chunks[done:]:
            seq, text = chunk["part_seq"], chunk["text"]
            scrub = self._scrub.get(seq) if self._scrub else None
            if scrub is None:
                if (
                    redaction.screen(text) is None
                    and redaction.cut(text, len(text) - redaction.reach) is None
                ):
                    self._tail[seq] = (self._tail.get(seq, "") + text)[-LOOKAROUND:]
                    continue
                scrub = (redaction.stream(self._tail.pop(seq, "")), chunk["kind"])
                self._scrub[seq] = scrub
            chunk["text"] = scrub[0].feed(text)
            fed = True
        if fed:
            chunks = [c for c in chunks if c["text"]]
        if self._scrub:
            with self._lock:
                current = self._part_seq if self._part_kind is not None else -1
                ended = [s for s in self._scrub if final or s != current]
                for seq in ended:
                    stream, kind = self._scrub.pop(seq)
                    rest = stream.finish()
                    if rest:
                        n = self._chunk_seq.get(seq, 0)
                        self._chunk_seq[seq] = n + 1
                        chunks.append({"part_seq": seq, "kind": kind, "seq": n, "text": rest})
        return chunks

    def _write(self, finish: dict[str, Any] | None) -> None:
        """Under _flush_lock: one ``stream_write`` of what is buffered (and *finish*)."""
        chunks, parts, created, done = self._take()
        if self._redaction is not None and (chunks or self._scrub):
            chunks = self._redact(chunks, done, finish is not None)
        if not (chunks or parts or finish or created is not None):
            return
        args: dict[str, Any] = {"message_id": self.id, "session_id": self.session_id}
        if created is not None:
            args["open"] = created
        if chunks:
            args["chunks"] = chunks
        if parts:
            args["parts"] = parts
        if finish is not None:
            args["finish"] = finish
            if finish["status"] == "complete":
                if self._state:
                    args["state"] = self._state
                if self._effects:
                    args["effects"] = self._effects
        args["now"] = time.time()
        try:
            self._store.submit(Operation("stream_write", args, new_id(), True))
        except BaseException:
            # Keep them for the next write rather than lose them.  Their keys are
            # fixed and, if the failed write did commit, a rewrite inserts nothing:
            # so they are sealed, never grown by later deltas.
            # (tests/domain/test_history.py: test_a_failed_flush_keeps_its_text)
            with self._lock:
                if not (self._pending or self._parts):
                    self._pending_since = time.monotonic()
                self._pending[:0] = chunks
                self._parts[:0] = parts
                self._sealed = len(chunks)  # (redacted already: see _redact)
                self._pending_bytes += sum(len(c["text"]) for c in chunks)
            raise
        with self._lock:
            self._created = None
        if chunks or parts:
            self.flushes += 1

    def tool_call(
        self, name: str, arguments: Any = None, *, call_id: str | None = None
    ) -> ToolCallHandle:
        """Record a tool call part; ``.result(output)`` on the handle records its output."""
        call = ToolCall(name, arguments, new_id() if call_id is None else call_id)
        self.add(call)
        return ToolCallHandle(self, call)

    def add(self, part: Part) -> None:
        """Add a whole part (a tool call or result, a file...) after what was streamed.
        It is written with the next flush (a blob, before this returns)."""
        self._check_open()
        encoded = encode_part(self._store, part)  # a blob is written here, outside the lock
        with self._lock:
            self._check_open()  # (finish() may have taken the buffer meanwhile)
            self._part_seq += 1
            self._part_kind = None
            self._parts.append({"seq": self._part_seq, "part": encoded})
            self._pending_bytes += _encoded_size(encoded)
            full = self._pending_bytes >= self._store.settings.stream_flush_bytes
            first = self._buffered_first()
        if first:
            self._store.streams_opened(self)
        if full:
            self._flush_kept()

    def usage(self, /, usage: Usage | None = None, **tokens: Any) -> None:
        """The model call's usage, recorded when the message completes."""
        # (`self, /`: with **tokens, a ParamSpec can take the parameters after self
        # only if self cannot be named; AsyncStream.usage is typed from this.)
        self._usage = usage_args(usage if usage is not None else tokens)

    def enqueue(self, effect: NewEffect) -> None:
        """Enqueue *effect* in the transaction that completes the message (not if
        the message ends in ``error``): e.g. generate a title once the reply is whole."""
        self._check_open()
        self._effects.extend(effects_arg(self._store, [effect]) or ())

    def put_state(self, key: str, value: Any, *, namespace: str = "default") -> None:
        """Put a state value of this session in the transaction that completes the
        message (not if it ends in ``error``): a turn's checkpoint, committed with the
        reply it belongs to.  The value is checked and encoded now (a blob over
        ``blob_threshold`` is written now); its new version is the next one."""
        self._check_open()
        self._state.append(encode_state(self._store, self.session_id, key, value, namespace))

    def finish(self, error: str | None = None) -> None:
        """Write what is buffered and mark the message ``complete`` (or ``error``), in
        one transaction.  Idempotent."""
        if error is not None:
            # An exception's message prints what it was given: kept redacted.
            error = redact_text(self._store, check_str(error, "error", limit=MAX_ERROR_TEXT))
            error = error[:MAX_ERROR_TEXT]
        with self._lock:
            if self._finished or not self._open:
                return
            self._finished = True
        finish = {
            "status": "error" if error is not None else "complete",
            "error": error,
            "usage": self._usage,
        }
        try:
            with self._flush_lock:
                self._write(finish)
        except BaseException as exc:
            # Never mark it complete without its last text: try the end alone, as
            # an error, so the message does not stay streaming when it can be helped.
            ended = error is None and self._end_as_error(
                error_text(
                    redact_text(self._store, f"{type(exc).__name__}: {exc}")
                    + " (its last text was lost)"
                )
            )
            if not ended:
                # Nothing was written (the store busy past the budget with
                # on_busy="raise"): finish() can be called again, the text still
                # buffered.  Marked finished, a retry returned at once, nothing
                # written, and the message stayed streaming.
                with self._lock:
                    self._finished = False
                raise
            self._store.streams_closed(self)
            raise
        self._store.streams_closed(self)

    def _end_as_error(self, error: str) -> bool:
        """End the message as an error without what is buffered: True if written; else
        (the write that failed said why) the buffer is as it was."""
        error = redact_text(self._store, error)[:MAX_ERROR_TEXT]
        with self._lock:
            kept = self._pending, self._parts, self._pending_bytes, self._sealed
            self._pending, self._parts, self._pending_bytes = [], [], 0
        try:
            with self._flush_lock:
                self._write({"status": "error", "error": error, "usage": self._usage})
        except errors.FleetstoreError:
            with self._lock:
                self._pending[:0], self._parts[:0] = kept[0], kept[1]
                self._pending_bytes += kept[2]
                self._sealed = kept[3]
            return False
        return True

    def _check_open(self) -> None:
        if not self._open or self._finished:
            raise errors.InvalidInput("this stream is not open (use it inside its `with` block)")


def _encoded_size(encoded: Mapping[str, Any]) -> int:
    body = encoded.get("body")
    return len(body) if isinstance(body, str) else 0


__all__ = ["Messages", "Stream", "ToolCallHandle", "metadata_arg", "title_arg"]
