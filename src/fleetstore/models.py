"""The values fleetstore stores and returns: frozen, slotted dataclasses.

A message is a list of *parts*; each part type has a ``kind`` (its name in the
store and in operations).  Times are seconds since the epoch (float).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Generic, TypeVar

from fleetstore.core.ids import new_id


class SessionStatus(enum.StrEnum):
    #: In use: listed by default.
    active = "active"
    #: Kept but put away: listed only when asked for.
    archived = "archived"


class MessageStatus(enum.StrEnum):
    #: Being written by a stream: what has been flushed is readable.
    streaming = "streaming"
    #: Written whole (an append, or a stream that ended normally).
    complete = "complete"
    #: Its stream ended with an exception; what was flushed is kept.
    error = "error"


@dataclass(frozen=True, slots=True)
class Text:
    """Text the model (or the user) wrote."""

    text: str
    kind: ClassVar[str] = "text"


@dataclass(frozen=True, slots=True)
class Reasoning:
    """The model's reasoning, kept apart from its answer."""

    text: str
    kind: ClassVar[str] = "reasoning"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool the model asked to run, with JSON arguments."""

    name: str
    arguments: Any = None
    call_id: str = field(default_factory=new_id)
    kind: ClassVar[str] = "tool_call"


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool returned (text or bytes; may be many megabytes)."""

    call_id: str
    output: str | bytes
    is_error: bool = False
    name: str = ""
    kind: ClassVar[str] = "tool_result"


@dataclass(frozen=True, slots=True)
class File:
    """A file attached to a message."""

    data: bytes
    mime_type: str = "application/octet-stream"
    name: str = ""
    kind: ClassVar[str] = "file"


Part = Text | Reasoning | ToolCall | ToolResult | File
PART_TYPES: Mapping[str, type[Part]] = {
    t.kind: t for t in (Text, Reasoning, ToolCall, ToolResult, File)
}


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens and cost of one model call, recorded with its message."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float = 0.0


#: Usage's fields in order (token counts, then ``cost``): the shape of usage in operations.
USAGE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Usage))
#: Every part kind, and those a stream appends to in chunks.
PART_KINDS: tuple[str, ...] = tuple(PART_TYPES)
STREAMED_KINDS: tuple[str, ...] = (Text.kind, Reasoning.kind)


@dataclass(frozen=True, slots=True)
class Session:
    """A conversation.  Sessions form trees: a subagent's session has the
    spawning session as ``parent_id``; ``root_id`` is the top of the tree
    (a session's own id when it has no parent).  A fork records where it came
    from in ``forked_from`` and ``fork_seq``."""

    id: str
    root_id: str
    parent_id: str | None = None
    forked_from: str | None = None
    fork_seq: int | None = None
    project: str | None = None
    title: str | None = None
    status: SessionStatus = SessionStatus.active
    metadata: Mapping[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0
    archived_at: float | None = None
    version: int = 1


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a session, with its parts in order.  ``seq`` numbers
    the messages of a session from 1 in the order they were stored; it is
    ``None`` for a message still waiting in this process's spool."""

    id: str
    session_id: str
    seq: int | None
    role: str
    parts: tuple[Part, ...] = ()
    status: MessageStatus = MessageStatus.complete
    model: str | None = None
    usage: Usage | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    created_at: float = 0.0
    completed_at: float | None = None

    @property
    def text(self) -> str:
        """The message's ``Text`` parts joined."""
        return "".join(p.text for p in self.parts if isinstance(p, Text))


@dataclass(frozen=True, slots=True)
class StateValue:
    """A versioned value under (session, namespace, key).  ``version`` starts
    at 1 and grows by one on every put; it is ``None`` for a put still waiting
    in this process's spool."""

    session_id: str
    key: str
    value: Any
    version: int | None
    namespace: str = "default"
    updated_at: float = 0.0


class EffectState(enum.StrEnum):
    """Where an effect is in its life (docs/outbox.md has the diagram)."""

    #: Waiting to run: when it is its thread's head and ``available_at`` has come.
    pending = "pending"
    #: Claimed by a worker, under a lease.
    running = "running"
    #: Done; its handler's result is kept.  Final.
    succeeded = "succeeded"
    #: Will not run again: failed for good, out of attempts, or lost while
    #: running when its kind is not replay-safe (``dead_reason`` says which).
    dead = "dead"
    #: Cancelled before it succeeded.  Final.
    cancelled = "cancelled"


#: States an effect never leaves by itself (an operator's retry re-queues dead and cancelled).
FINAL_EFFECT_STATES: tuple[EffectState, ...] = (
    EffectState.succeeded,
    EffectState.dead,
    EffectState.cancelled,
)


@dataclass(frozen=True, slots=True)
class NewEffect:
    """An effect to enqueue together with a history write (the transactional
    outbox): ``store.messages.append(..., effects=[NewEffect(...)])``.
    Same arguments as ``store.effects.enqueue``."""

    thread_key: str
    kind: str
    payload: Any = None
    idempotency_key: str | None = None
    delay: float = 0.0
    max_attempts: int = 5
    replay_safe: bool | None = None
    id: str = field(default_factory=new_id)


@dataclass(frozen=True, slots=True)
class EffectError:
    """One failed attempt, as kept in ``Effect.errors``: its error (the exception's
    type and message), when, the worker that ran it, and the handler's traceback
    when it raised one (its last 8 KiB: the innermost frames and the exception;
    ``None`` for an attempt that raised nothing, e.g. a timeout or a lost lease)."""

    attempt: int
    error: str
    at: float
    owner: str | None = None
    traceback: str | None = None


@dataclass(frozen=True, slots=True)
class Effect:
    """A side effect in the outbox.  Per ``thread_key`` effects run one at a
    time in ``seq`` order.  ``attempt`` counts the claims so far (1 while the
    first attempt runs); ``fence`` is the fencing token of the latest claim."""

    id: str
    thread_key: str
    seq: int | None
    kind: str
    payload: Any
    state: EffectState
    attempt: int = 0
    max_attempts: int = 5
    replay_safe: bool | None = None
    available_at: float = 0.0
    fence: int = 0
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    idempotency_key: str | None = None
    result: Any = None
    last_error: str | None = None
    #: Why a dead effect is dead: ``failed``, ``interrupted``, ``attempts_exhausted``,
    #: ``not_replay_safe``.
    dead_reason: str | None = None
    errors: tuple[EffectError, ...] = ()
    created_at: float = 0.0
    updated_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One hit of ``store.search``: a part of a message (or a message's error, or a
    session's title or metadata) whose text matches, with a snippet of it.

    ``snippet`` is a window of the text around the first match (control characters as
    spaces, ``…`` where it was cut) and ``highlights`` the (start, end) offsets of the
    matches in it.  ``rank``: higher is better; for words, the engine's relevance
    (SQLite's bm25, PostgreSQL's ts_rank: comparable within one search, not across
    engines), for a substring the number of times it occurs in the section."""

    session_id: str
    #: None for a session's title or metadata.
    message_id: str | None
    #: The message's seq in its session (None for a session's title or metadata).
    seq: int | None
    #: The part's index in its message (None for an error, a title, metadata).
    part: int | None
    #: text, reasoning, tool_call, tool_result, file, error, title or metadata.
    kind: str
    role: str | None
    snippet: str
    highlights: tuple[tuple[int, int], ...]
    rank: float
    #: The message's (or the session's) creation time.
    created_at: float


@dataclass(frozen=True, slots=True)
class SearchStatus:
    """How far a store's search index is behind (``store.search_status()``)."""

    #: Messages and sessions queued, waiting for the indexer.
    queued: int
    #: Seconds since the oldest of them was queued (0.0: none).
    lag: float
    #: Sections indexed.
    sections: int
    #: The backfill of what the store held before it had an index: messages passed, of all.
    backfill_done: int
    backfill_total: int
    #: Files (a sharded store's catalog and shards) whose backfill is not done.
    backfilling: int
    #: The processes indexing now (``host:pid``), one per file at most.
    indexers: tuple[str, ...]

    @property
    def current(self) -> bool:
        """Nothing waits: every message and session written is in the index."""
        return self.queued == 0 and self.backfilling == 0


T = TypeVar("T")
C = TypeVar("C")


class Page(list[T], Generic[T, C]):
    """One page of a listing (``store.sessions.list``, ``store.effects.list``): a
    ``list`` of at most ``limit`` items that also says whether it was cut there.

    ``more`` is True when there are more items after the last one (it was cut at
    ``limit``: a program reported 100 effects of 481 before it said so, issue 28);
    ``next_cursor`` is then what the same call takes to list them (``before=`` of
    ``sessions.list``: the last session's id; ``after=`` of ``effects.list``: the last
    effect), and None when ``more`` is False.  It is a list, so code that used the
    plain list these calls returned keeps working.
    """

    more: bool
    next_cursor: C | None

    def __init__(
        self, items: Iterable[T] = (), *, more: bool = False, next_cursor: C | None = None
    ) -> None:
        super().__init__(items)
        self.more = more
        self.next_cursor = next_cursor if more else None

    def __repr__(self) -> str:
        return f"Page({list.__repr__(self)}, more={self.more!r})"


__all__ = [
    "FINAL_EFFECT_STATES",
    "PART_KINDS",
    "PART_TYPES",
    "STREAMED_KINDS",
    "USAGE_FIELDS",
    "Effect",
    "EffectError",
    "EffectState",
    "File",
    "Message",
    "MessageStatus",
    "NewEffect",
    "Page",
    "Part",
    "Reasoning",
    "SearchHit",
    "SearchStatus",
    "Session",
    "SessionStatus",
    "StateValue",
    "Text",
    "ToolCall",
    "ToolResult",
    "Usage",
]
