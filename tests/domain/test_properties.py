"""Property: any sequence of operations, applied with random duplicates and retries,
leaves the same database as applying each once (DESIGN.md promise 2, issue 3).

A program of operations is drawn with every id and time chosen up front ("now" and
"created_at" are in the arguments, so applying it is deterministic).  Store A applies
each operation once, recording which succeeded and which raised a typed error.
Store B applies the same program, but every operation that succeeded in A is applied
one to three times: the repeats come right after it (a retry after an ambiguous
failure) or later in the sequence (a spool replay).  A failed operation is not
repeated: a failed conditional write re-run later may legitimately succeed.  Then
the two databases, every table and column but the times of bookkeeping, are equal.

Ids are never reused after the fact (they are client-chosen UUIDs in real use): a
retried create comes right after the create it retries.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fleetstore
from fleetstore import File, Operation, Reasoning, Store, Text, ToolCall, ToolResult, errors
from fleetstore.core.validate import dump_json
from fleetstore.domain.codec import encode_part, encode_payload
from fleetstore.domain.registry import REGISTRY

BLOB_THRESHOLD = 200  # small, so that some payloads become blob files
EXPECTED_ERRORS = (
    errors.InvalidInput,
    errors.NotFound,
    errors.AlreadyExists,
    errors.VersionConflict,
)
#: Bookkeeping times that differ between two applications of the same program.
NOT_COMPARED = {
    ("applied_ops", "applied_at"),
    ("blobs", "created_at"),
    ("fleetstore_migrations", "applied_at"),
    ("search_queue", "at"),  # when the search index's work was queued
}
T0 = 1_700_000_000.0

# -- drawing a program -----------------------------------------------------------------------


@dataclass
class Step:
    """One operation with its arguments still holding Python values (parts, state
    values), encoded per store by ``materialise``."""

    name: str
    args: dict[str, Any]


@dataclass
class OpenStream:
    session_id: str
    part_seq: int = -1
    kind: str | None = None
    chunk_seq: dict[int, int] = field(default_factory=dict)


@dataclass
class Drawing:
    steps: list[Step] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    messages: dict[str, str] = field(default_factory=dict)  # message id -> its session
    streams: dict[str, OpenStream] = field(default_factory=dict)
    counter: int = 0

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"


#: 0 most of the time, 1 to 3 each about one time in 20 (hypothesis draws the ends of a
#: range more often than the middle, so rare choices are not at the ends).
rare = st.sampled_from([0] * 17 + [1, 2, 3])
small_text = st.text(alphabet="ab é\n", max_size=6)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | small_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(small_text, inner, max_size=3),
    max_leaves=6,
)


@st.composite
def payload_text(draw: st.DrawFn) -> str:
    """Mostly short; sometimes long enough to be a blob (and often the same one)."""
    if draw(st.integers(0, 5)) == 0:
        return draw(st.sampled_from("xyz")) * (BLOB_THRESHOLD + draw(st.integers(0, 2)))
    return draw(small_text)


@st.composite
def parts(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["text", "reasoning", "tool_call", "tool_result", "file"]))
    text = draw(payload_text())
    if kind == "text":
        return Text(text)
    if kind == "reasoning":
        return Reasoning(text)
    if kind == "tool_call":
        return ToolCall(draw(st.sampled_from(["bash", "read"])), {"arg": text}, "c1")
    if kind == "tool_result":
        output: str | bytes = text.encode() if draw(st.booleans()) else text
        return ToolResult("c1", output, draw(st.booleans()), "bash")
    return File(text.encode(), "text/plain", "f.txt")


usage_values = st.none() | st.fixed_dictionaries(
    {"input_tokens": st.integers(0, 9), "output_tokens": st.integers(0, 9)},
    optional={"cost": st.sampled_from([0.0, 0.5, 1.25])},
)


def session_id(draw: st.DrawFn, d: Drawing) -> str:
    """A session drawn so far, sometimes a deleted one or one that never existed."""
    pick = draw(rare)
    if pick == 1 and d.deleted:
        return draw(st.sampled_from(d.deleted))
    if pick == 2 or not d.sessions:
        return "ghost"
    # Mostly the last few, so that operations meet on the same rows.
    return draw(st.sampled_from(d.sessions if pick == 3 else d.sessions[-3:]))


def message_id(draw: st.DrawFn, d: Drawing) -> tuple[str, str]:
    """(message, its session): mostly right, sometimes a wrong session or no message."""
    if not d.messages or draw(rare) == 1:
        return "no-message", session_id(draw, d)
    mid = draw(st.sampled_from(sorted(d.messages)))
    sid = session_id(draw, d) if draw(rare) in (1, 2) else d.messages[mid]
    return mid, sid


def draw_step(draw: st.DrawFn, d: Drawing) -> None:
    kinds = [
        "create",
        "create",
        "update",
        "fork",
        "archive",
        "delete",
        "append",
        "append",
        "stream_open",
        "stream_open",
        "stream_delta",
        "stream_delta",
        "stream_delta",
        "stream_part",
        "stream_part",
        "stream_finish",
        "raw_chunks",
        "put_state",
        "put_state",
        "delete_state",
    ]
    kind = draw(st.sampled_from(kinds)) if d.sessions else "create"
    add = d.steps.append
    if kind == "create":
        sid = d.fresh("s")
        parent = None if not d.sessions or draw(st.integers(0, 2)) else session_id(draw, d)
        args = {
            "id": sid,
            "parent_id": parent,
            "project": draw(st.sampled_from([None, "/a", "/b"])),
            "title": draw(st.none() | small_text),
            "metadata": draw(st.dictionaries(small_text, json_value, max_size=2)),
        }
        add(Step("create_session", args))
        d.sessions.append(sid)
        retry = draw(st.sampled_from(["none", "none", "same", "clash"]))
        if retry == "same":  # the same create under a new op id: a retry
            add(Step("create_session", dict(args)))
        elif retry == "clash":  # another create with the same id: AlreadyExists
            add(Step("create_session", {**args, "title": "clash"}))
    elif kind == "update":
        args = {"id": session_id(draw, d)}
        if draw(st.booleans()):
            args["title"] = draw(small_text)
        if draw(st.booleans()):
            args["metadata"] = draw(st.dictionaries(small_text, json_value, max_size=2))
        if draw(st.integers(0, 2)) == 0:
            args["expected_version"] = draw(st.integers(1, 3))
        add(Step("update_session", args))
    elif kind == "fork":
        fid = d.fresh("f")
        add(
            Step(
                "fork_session",
                {
                    "id": fid,
                    "source_id": session_id(draw, d),
                    "at_seq": draw(st.none() | st.integers(0, 2)),
                    "title": draw(st.none() | small_text),
                },
            )
        )
        d.sessions.append(fid)
    elif kind == "archive":
        add(Step("archive_session", {"id": session_id(draw, d), "archived": draw(st.booleans())}))
    elif kind == "delete":
        sid = session_id(draw, d)
        add(Step("delete_session", {"id": sid}))
        if sid in d.sessions:
            d.sessions.remove(sid)
            d.deleted.append(sid)
    elif kind in ("append", "stream_open"):
        mid, sid = d.fresh("m"), session_id(draw, d)
        args = {
            "id": mid,
            "session_id": sid,
            "role": draw(st.sampled_from(["user", "assistant", "tool"])),
            "model": draw(st.sampled_from([None, "m-1"])),
            "metadata": draw(st.dictionaries(small_text, json_value, max_size=2)),
            "parts": draw(st.lists(parts(), max_size=3)) if kind == "append" else [],
            "usage": draw(usage_values) if kind == "append" else None,
        }
        if kind == "stream_open":
            args["status"] = "streaming"
            d.streams[mid] = OpenStream(sid)
        add(Step("append_message", args))
        d.messages[mid] = sid
        again = draw(st.sampled_from(["none", "none", "none", "same", "other"]))
        if again == "same":  # the same message id again: written once
            add(Step("append_message", {**args, "parts": []}))
        elif again == "other":  # the same message id in another session: AlreadyExists
            add(Step("append_message", {**args, "session_id": session_id(draw, d)}))
    elif kind == "stream_delta" and d.streams:
        mid = draw(st.sampled_from(sorted(d.streams)))
        s = d.streams[mid]
        chunks: list[dict[str, Any]] = []
        for _ in range(draw(st.integers(1, 3))):  # coalesced as Stream does
            part_kind = draw(st.sampled_from(["text", "text", "reasoning"]))
            delta = draw(small_text.filter(bool))
            if s.kind != part_kind:
                s.part_seq += 1
                s.kind = part_kind
            if chunks and chunks[-1]["part_seq"] == s.part_seq:
                chunks[-1]["text"] += delta
                continue
            seq = s.chunk_seq.get(s.part_seq, 0)
            s.chunk_seq[s.part_seq] = seq + 1
            chunks.append({"part_seq": s.part_seq, "kind": part_kind, "seq": seq, "text": delta})
        add(
            Step("append_chunks", {"message_id": mid, "session_id": s.session_id, "chunks": chunks})
        )
    elif kind == "stream_part" and d.streams:
        mid = draw(st.sampled_from(sorted(d.streams)))
        s = d.streams[mid]
        s.part_seq += 1
        s.kind = None
        add(
            Step(
                "add_part",
                {
                    "message_id": mid,
                    "session_id": s.session_id,
                    "seq": s.part_seq,
                    "part": draw(parts()),
                },
            )
        )
    elif kind == "stream_finish" and d.streams:
        mid = draw(st.sampled_from(sorted(d.streams)))
        s = d.streams.pop(mid)
        status = draw(st.sampled_from(["complete", "error"]))
        args = {
            "message_id": mid,
            "session_id": s.session_id,
            "status": status,
            "error": "boom" if status == "error" else None,
            "usage": draw(usage_values),
        }
        add(Step("finish_message", args))
    elif kind == "raw_chunks":  # chunk and part writes aimed anywhere, keys colliding
        mid, sid = message_id(draw, d)
        if draw(st.booleans()):
            chunk = {
                "part_seq": draw(st.integers(0, 2)),
                "seq": draw(st.integers(0, 2)),
                "kind": draw(st.sampled_from(["text", "reasoning"])),
                "text": draw(small_text),
            }
            add(Step("append_chunks", {"message_id": mid, "session_id": sid, "chunks": [chunk]}))
        else:
            args = {"message_id": mid, "session_id": sid, "seq": draw(st.integers(0, 3))}
            add(Step("add_part", {**args, "part": draw(parts())}))
    elif kind in ("put_state", "delete_state"):
        args = {
            "session_id": session_id(draw, d),
            "namespace": "ns" if draw(rare) == 1 else "default",
            "key": "k2" if draw(rare) == 1 else "k1",
            "expected_version": draw(st.none() | st.none() | st.integers(0, 3)),
        }
        if kind == "put_state":
            if draw(st.booleans()):
                args["value"] = draw(payload_text()).encode()
            else:
                args["value"] = draw(json_value | payload_text())
        add(Step(kind, args))


@st.composite
def programs(draw: st.DrawFn) -> list[Step]:
    d = Drawing()
    for _ in range(draw(st.integers(1, 40))):
        draw_step(draw, d)
    return d.steps


# -- applying it -----------------------------------------------------------------------------


def materialise(store: Store, steps: list[Step]) -> list[Operation]:
    """The program's operations for *store*: parts and state values encoded (large
    ones written as blob files into *store*), op ids and times fixed."""
    ops = []
    for i, step in enumerate(steps):
        args = dict(step.args)
        args["now"] = args["created_at"] = T0 + i
        if step.name == "append_message":
            args["parts"] = [encode_part(store, p) for p in args["parts"]]
        elif step.name == "add_part":
            args["part"] = encode_part(store, args["part"])
        elif step.name == "put_state":
            value = args["value"]
            if isinstance(value, bytes):
                args["value"] = encode_payload(store, value, "bytes")
            else:
                args["value"] = encode_payload(store, dump_json(value, "value"), "json")
        ops.append(Operation(step.name, args, f"op-{i}"))
    return ops


def outcome(store: Store, op: Operation) -> str:
    try:
        store.apply(op)
    except EXPECTED_ERRORS as exc:
        return type(exc).__name__
    return "ok"


def dump(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (but the bookkeeping times), in a stable order."""

    def run(tx: Any) -> dict[str, list[tuple[Any, ...]]]:
        out = {}
        for (table,) in tx.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        ):
            columns = [
                f'"{c[1]}"'
                for c in tx.execute(f'PRAGMA table_info("{table}")')
                if (table, c[1]) not in NOT_COMPARED
            ]
            listed = ", ".join(columns)
            out[table] = tx.execute(f'SELECT {listed} FROM "{table}" ORDER BY {listed}')
        return out

    return store.read(run)


def blob_names(store: Store) -> list[str]:
    return sorted(p.name for p in Path(str(store.path) + ".blobs").rglob("*") if p.is_file())


@contextmanager
def two_stores() -> Iterator[tuple[Store, Store]]:
    with tempfile.TemporaryDirectory() as tmp:
        a = fleetstore.open(Path(tmp) / "a.db", blob_threshold=BLOB_THRESHOLD, on_busy="raise")
        try:
            b = fleetstore.open(Path(tmp) / "b.db", blob_threshold=BLOB_THRESHOLD, on_busy="raise")
            try:
                yield a, b
            finally:
                b.close()
        finally:
            a.close()


def with_repeats(
    ops: list[Operation], succeeded: list[bool], draw: Callable[[Any], Any]
) -> list[tuple[int, bool]]:
    """(index into *ops*, is a repeat) in B's order: each op once where it was, and
    each one that succeeded in A 0-2 more times, right after it or later on."""
    placed: list[tuple[float, int, int, bool]] = [(float(i), 0, i, False) for i in range(len(ops))]
    tie = 1
    for i, ok in enumerate(succeeded):
        if not ok:
            continue
        for _ in range(draw(st.integers(0, 2))):
            # A retry comes at once; a replay, somewhere later on.
            at = i + 0.5 if draw(st.booleans()) else draw(st.integers(i, len(ops))) + 0.5
            placed.append((at, tie, i, True))
            tie += 1
    placed.sort()
    return [(i, repeat) for _, _, i, repeat in placed]


@pytest.mark.slow
@settings(
    max_examples=200,
    deadline=None,
    database=None,  # a failure prints its seed; no .hypothesis/ left in the tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(program=programs(), data=st.data())
def test_duplicates_and_retries_give_the_same_state_as_applying_each_once(
    program: list[Step], data: st.DataObject
) -> None:
    with two_stores() as (a, b):
        ops_a = materialise(a, program)
        ops_b = materialise(b, program)
        assert [op.to_json() for op in ops_a] == [op.to_json() for op in ops_b]
        outcomes_a = [outcome(a, op) for op in ops_a]

        order = with_repeats(ops_b, [o == "ok" for o in outcomes_a], data.draw)
        for i, repeat in order:
            op = ops_b[i]
            if not repeat:
                # The same state, so the same outcome as in A.
                assert outcome(b, op) == outcomes_a[i], (i, op)
                continue
            try:
                result = b.apply(op)
            except errors.NotFound:
                # Chunk and part writes are not logged: a replay after their message
                # was deleted finds nothing to add to (and adds nothing).
                assert not REGISTRY[op.name].logged, (i, op)
            else:
                if REGISTRY[op.name].logged:
                    assert result.get("duplicate") is True, (i, op, result)

        assert dump(b) == dump(a)
        assert blob_names(b) == blob_names(a)


# -- the same, for chosen sequences: a replay after the row it wrote has moved on ------------

S = {"id": "s1", "parent_id": None, "project": None, "title": "t", "metadata": {}}
PUT = {"session_id": "s1", "namespace": "default", "key": "k"}
MSG = {"message_id": "m1", "session_id": "s1"}
STREAMING = {
    "id": "m1",
    "session_id": "s1",
    "role": "assistant",
    "status": "streaming",
    "parts": [],
}
CHUNK = {"part_seq": 0, "seq": 0, "kind": "text", "text": "a"}

#: (name, program, index of the operation replayed at the end)
REPLAYS: list[tuple[str, list[Step], int]] = [
    (
        "delete_state after a new put",
        [
            Step("create_session", S),
            Step("put_state", {**PUT, "value": 1}),
            Step("delete_state", PUT),
            Step("put_state", {**PUT, "value": 2}),
        ],
        2,
    ),
    (
        "put_state after a later put",
        [
            Step("create_session", S),
            Step("put_state", {**PUT, "value": 1}),
            Step("put_state", {**PUT, "value": 2}),
        ],
        1,
    ),
    (
        "conditional put_state after a later put",
        [
            Step("create_session", S),
            Step("put_state", {**PUT, "value": 1, "expected_version": 0}),
            Step("delete_state", PUT),
        ],
        1,
    ),
    (
        "update_session after a later update",
        [
            Step("create_session", S),
            Step("update_session", {"id": "s1", "title": "a"}),
            Step("update_session", {"id": "s1", "title": "b"}),
        ],
        1,
    ),
    (
        "archive_session after a restore",
        [
            Step("create_session", S),
            Step("archive_session", {"id": "s1"}),
            Step("archive_session", {"id": "s1", "archived": False}),
        ],
        1,
    ),
    (
        "create_session after an update",
        [Step("create_session", S), Step("update_session", {"id": "s1", "title": "new"})],
        0,
    ),
    (
        "fork_session after the fork got a message",
        [
            Step("create_session", S),
            Step("fork_session", {"id": "f1", "source_id": "s1"}),
            Step("append_message", {"id": "m9", "session_id": "f1", "role": "user", "parts": []}),
        ],
        1,
    ),
    (
        "append_message after another message",
        [
            Step("create_session", S),
            Step("append_message", {"id": "m1", "session_id": "s1", "role": "user", "parts": []}),
            Step("append_message", {"id": "m2", "session_id": "s1", "role": "user", "parts": []}),
        ],
        1,
    ),
    (
        "append_chunks after the message finished",
        [
            Step("create_session", S),
            Step("append_message", STREAMING),
            Step("append_chunks", {**MSG, "chunks": [CHUNK]}),
            Step("finish_message", {**MSG, "status": "complete"}),
        ],
        2,
    ),
    (
        "add_part after more chunks",
        [
            Step("create_session", S),
            Step("append_message", STREAMING),
            Step("add_part", {**MSG, "seq": 1, "part": Text("whole")}),
            Step("append_chunks", {**MSG, "chunks": [{**CHUNK, "part_seq": 2}]}),
        ],
        2,
    ),
    (
        "finish_message after an error finish",
        [
            Step("create_session", S),
            Step("append_message", STREAMING),
            Step("finish_message", {**MSG, "status": "error", "error": "x"}),
        ],
        2,
    ),
]


@pytest.mark.parametrize(
    ("program", "replayed"), [r[1:] for r in REPLAYS], ids=[r[0] for r in REPLAYS]
)
def test_a_late_replay_changes_nothing(program: list[Step], replayed: int) -> None:
    with two_stores() as (a, b):
        ops_a, ops_b = materialise(a, program), materialise(b, program)
        assert [outcome(a, op) for op in ops_a] == ["ok"] * len(ops_a)
        for op in ops_b:
            b.apply(op)
        b.apply(ops_b[replayed])
        assert dump(b) == dump(a)
