"""Hostile input to the public API (issue "Hostile-input and fault findings", item 7 and
the property tests): for every public method, any argument of the wrong type or out of
range raises a ``FleetstoreError`` subclass and changes nothing: no row in any file of
the store, no blob file, no spool line.

The table ``METHODS`` lists, per method, a call that would succeed and, per parameter,
the kind of hostile values (tests/domain/hostile.py) to put in its place; adding a
method means adding a row.  Each (method, parameter) is tried with every listed value,
then with values hypothesis generates; the async mirrors (``AsyncStore``...) get the
listed values too.  Runs on one SQLite file and on the sharded layout.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fleetstore
from fleetstore import (
    AsyncClaim,
    AsyncStore,
    AsyncStream,
    AsyncToolCallHandle,
    Database,
    Delivery,
    Effect,
    Handler,
    Migration,
    Operation,
    Settings,
    Store,
    Text,
    ToolCall,
    Worker,
    errors,
)
from fleetstore.core.ids import new_id
from fleetstore.core.validate import MAX_SHORT, STATE_KEY_MAX, STATE_NAMESPACE_MAX
from tests.domain import hostile as h
from tests.domain.hostile import Kind, kind

MAX_DELAY = 366 * 86400.0
#: Not a channel name (engine/notify.py): lowercase letters, digits and _, at most 63.
CHANNELS = kind([None, 5, "", "Upper", "has space", "9x", "x" * 64, h.LONE, b"c", ["c"]])
MAX_LEASE = 86400.0


@dataclass
class World:
    """A store with one of everything, and the objects whose methods are tried."""

    tmp: Path
    store: Store
    session_id: str
    message_id: str
    effect: Effect
    stream: Any
    handle: Any
    db: Database
    scratch: Path
    astore: AsyncStore
    async_roots: dict[str, Any] = field(default_factory=dict)
    cleanup: list[Callable[[], Any]] = field(default_factory=list)

    def fresh_path(self) -> Path:
        return self.scratch / f"{new_id()}.db"


@pytest.fixture(scope="module", params=["sqlite", "sharded"])
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp(f"hostile-{request.param}")
    target: Any = tmp / "s.db" if request.param == "sqlite" else f"sqlite+sharded://{tmp / 'sh'}"
    # Small payload limit (hostile payloads just past it stay small); long flush interval
    # (an accepted delta would still be written at the stream's flush: the test sees it);
    # no search indexer thread (its batches would change the store between the two
    # snapshots of a call): the index is caught up below, once.
    store = fleetstore.open(
        target, max_payload_bytes=1024 * 1024, stream_flush_interval=0.2, search_index=False
    )
    s = store.sessions.create(title="t", project="/p", metadata={"a": 1})
    m = store.messages.append(s.id, "user", "hello", model="m")
    store.state.put(s.id, "k", {"v": 1})
    store.effects.enqueue("t-claimed", "k", {"n": 1})
    effect_id = store.effects.enqueue("t-pending", "k", {"n": 2})
    store.effects.claim("w", lease=MAX_LEASE, kinds=["k"])
    stream = store.messages.stream(s.id)
    stream.open()
    handle = fleetstore.ToolCallHandle(stream, ToolCall("t", {"a": 1}))
    store.search.catch_up()
    scratch = tmp / "scratch"
    scratch.mkdir()
    db = Database.open(tmp / "db.db", migrations=[Migration(1, "t", "CREATE TABLE t(v INTEGER)")])
    (tmp / "fresh").mkdir()
    astore = AsyncStore(store, threads=2)
    w = World(
        tmp, store, s.id, m.id, store.effects.get(effect_id), stream, handle, db, scratch, astore
    )
    w.async_roots = {"store": astore, "stream": AsyncStream(astore, stream)}
    w.async_roots["handle"] = AsyncToolCallHandle(w.async_roots["stream"], handle)
    yield w
    astore._executor.shutdown(wait=False)
    stream.finish()
    store.close()
    db.close()


def listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def state_of(w: World) -> Any:
    """What the calls must not change: the store, the Database, the scratch directory
    (a sharded store's catalog index first brought up to date: its background refresh
    would otherwise change it between two snapshots)."""
    w.store.sync_catalog()
    return (h.snapshot(w.store), h.tables(w.db), listing(w.scratch))


# -- the table --------------------------------------------------------------------------------


Valid = Callable[[World], dict[str, Any]]


@dataclass(frozen=True)
class Method:
    """``root.path(**valid(world))`` succeeds; each parameter of *params* replaced by a
    value of its kind must raise a ``FleetstoreError`` and change nothing."""

    path: str  # "sessions.create": attributes from the root to the method
    valid: Valid
    params: dict[str, Kind]
    root: str = "store"  # store, stream, handle, claim, db, module, class:<name>, ...
    mirrored: bool = True  # an async mirror exists (root store, stream, handle, claim)

    def __str__(self) -> str:
        return f"{self.root}.{self.path}"


def op(name: str = "create_session", **args: Any) -> Operation:
    return Operation(name, {"id": new_id(), "created_at": 1.0, **args}, new_id())


OPERATIONS = kind(
    [
        5,
        None,
        "create_session",
        {"op": "create_session", "id": "x", "args": {}},
        Operation(5, {}, "x"),  # type: ignore[arg-type]
        Operation("no_such_op", {}, new_id()),
        Operation("create_session", 5, new_id()),  # type: ignore[arg-type]
        Operation("create_session", {"id": "x"}, "bad/id"),
        Operation("create_session", {"id": 5}, new_id()),
        Operation("create_session", {"id": new_id(), "title": 5}, new_id()),
        Operation("create_session", {"id": new_id(), "now": "x"}, new_id()),
        Operation("create_session", {"id": new_id(), "metadata": {"a": math.nan}}, new_id()),
        Operation("create_session", {"id": new_id(), "effects": 5}, new_id()),
        Operation("enqueue_effect", {"id": new_id(), "now": math.nan}, new_id()),
        Operation("claim_effects", {"owner": "w", "kinds": "kx"}, new_id()),
        Operation("claim_effects", {"owner": "w", "kinds": 5}, new_id()),
    ]
)
SETTING_VALUES: dict[str, Kind] = {
    "write_budget": h.number(0.0, MAX_DELAY),
    "synchronous": kind([5, None, "", "OFF", "normal\x00", b"FULL", ["FULL"]]),
    "busy_timeout_ms": h.integer(1, 2**31 - 1),
    "checkpoint_bytes": h.integer(1),
    "truncate_bytes": h.integer(1),
    "gate": h.BOOL,
    "on_busy": kind([5, None, "", "wait", ["spool"], b"spool", {"spool": 1}]),
    "blob_threshold": h.integer(1, 64 * 1024 * 1024),
    "max_payload_bytes": h.integer(1),
    "stream_flush_interval": h.number(0.001, MAX_DELAY) | kind([0, 0.0]),
    "stream_flush_bytes": h.integer(1),
    "publish_interval": h.number(0.0, MAX_DELAY),
    "pool_size": h.integer(1, 10_000),
    "local_dir": kind([5, None, b"/tmp", ["x"], "\x00", "a\x00b", h.LONE]),
    "max_open_shards": h.integer(1, 1_000_000),
}
_NUMERIC = ["nan", "inf", "-1", "1e999", "x", "", "99999999999999999999999", "0x10", "1 2"]
ENV_CASES = [
    {f"FLEETSTORE_{name.upper()}": text}
    for name, texts in {
        "write_budget": _NUMERIC,
        "busy_timeout_ms": [*_NUMERIC, "1.5"],
        "blob_threshold": [*_NUMERIC, str(2**40)],
        "stream_flush_interval": [*_NUMERIC, "0"],
        "pool_size": _NUMERIC,
        "gate": ["maybe", "2", ""],
        "synchronous": ["OFF", "", "normal\x00"],
        "on_busy": ["wait", ""],
        "local_dir": ["a\x00b"],
    }.items()
    for text in texts
]
PATHS = kind(
    [
        5,
        b"/tmp/x.db",
        "\x00a",
        "a\x00b",
        "",
        "bogus://x",
        "sqlite://relative",
        h.Opaque(),
        ["a"],
        h.LONE,
        1.5,
    ]
)
# For Database.open a path is a path: "bogus://x" names a file in ./bogus:/ (left out).
DB_PATHS = kind(
    [
        5,
        b"/tmp/x.db",
        "\x00a",
        "a\x00b",
        "",
        ":memory:",
        "file:x.db",
        None,
        h.Opaque(),
        ["a"],
        h.LONE,
        1.5,
    ]
)
MIGRATIONS = kind(
    [
        5,
        "abc",
        [5],
        [None],
        Migration(1, "t", "SELECT 1"),
        [Migration("1", "t", "SELECT 1")],  # type: ignore[arg-type]
        [Migration(0, "t", "SELECT 1")],
        [Migration(1, 5, "SELECT 1")],  # type: ignore[arg-type]
        [Migration(1, "t", 5)],  # type: ignore[arg-type]
        [Migration(1, "t", "SELECT 1"), Migration(1, "u", "SELECT 2")],
    ]
)


def _handlers(_: World) -> dict[str, Any]:
    return {"k": lambda effect: None}


def _worker(w: World, **changes: Any) -> dict[str, Any]:
    return {"store": w.store, "handlers": {"k": lambda effect: None}, **changes}


EFFECT = kind(
    [5, None, "x", [h._effect()], {"thread_key": "t", "kind": "k"}]
    + [e[0] for e in h.EFFECTS.values if isinstance(e, list) and len(e) == 1]
)
NAME = h.short(MAX_SHORT, optional=False)
SEARCH_QUERIES = (
    h.NOT_STR
    | h.BAD_TEXT
    | kind(
        [
            None,
            "",
            "   ",
            "NOT a",
            "a OR NOT b",
            '"unclosed',
            "(a",
            "a)",
            "AND",
            "OR",
            "()",
            "x" * 5000,
        ]
    )
)
SEARCH_LISTS = kind([5, "text", b"text", [5], [None], [""], [], [h.LONE], [["text"]], h.Opaque()])


def _n_cursor(data: object) -> str:
    return "n." + base64.urlsafe_b64encode(json.dumps(data).encode()).decode()


# (A newest-first cursor whose part holds a list or an object: a raw TypeError before.)
SEARCH_CURSORS = kind(
    [
        *[5, "", "n.", "b.-1", "x.MQ==", "n.W10=", ["b.MQ=="], "b." + "A" * 2000],
        *[_n_cursor([1, "", [[1]]]), _n_cursor([1, "", [{"a": 1}]]), _n_cursor([1, "", 5])],
    ]
)

METHODS: list[Method] = [
    # -- Store
    Method("submit", lambda w: {"op": op()}, {"op": OPERATIONS}),
    Method(
        "submit",
        lambda w: {"op": op(), "delivery": Delivery.SPOOLABLE},
        {"delivery": h.BOOL | h.kind(["spoolable", "NOW"])},
    ),
    Method("apply", lambda w: {"op": op()}, {"op": OPERATIONS}),
    Method(
        "read",
        lambda w: {"fn": lambda tx: None, "session_id": None},
        {"fn": h.CALLABLE, "session_id": h.OPT_ID},
    ),
    Method("read_first", lambda w: {"fn": lambda tx: []}, {"fn": h.CALLABLE}),
    Method("sync_catalog", lambda w: {"timeout": 0.0}, {"timeout": h.OPT_TIMEOUT}),
    Method("flush", lambda w: {"timeout": 0.0}, {"timeout": h.OPT_TIMEOUT}),
    Method(
        "check_visible", lambda w: {"session_id": None}, {"session_id": h.OPT_ID}, mirrored=False
    ),
    Method(
        "spool_pending", lambda w: {"session_id": None}, {"session_id": h.OPT_ID}, mirrored=False
    ),
    Method(
        "notify_wait",
        lambda w: {"channel": "fleetstore_effects", "timeout": 0.0, "token": None},
        {"channel": CHANNELS, "timeout": h.TIMEOUT, "token": h.integer(0, optional=True)},
        mirrored=False,
    ),
    Method("notify_token", lambda w: {"channel": "c"}, {"channel": CHANNELS}, mirrored=False),
    Method(
        "listen",
        lambda w: {"channel": "c", "fn": lambda: None},
        {"channel": CHANNELS, "fn": h.CALLABLE},
        mirrored=False,
    ),
    Method("close", lambda w: {"timeout": 0.0}, {"timeout": h.OPT_TIMEOUT}, root="fresh_store"),
    # -- Search
    Method(
        "search",
        lambda w: {
            "query": "hello",
            "match": "words",
            "order": "newest",
            "project": None,
            "session_id": None,
            "root_id": None,
            "roles": None,
            "kinds": None,
            "since": None,
            "until": None,
            "include_archived": False,
            "limit": 5,
            "cursor": None,
        },
        {
            "query": SEARCH_QUERIES,
            "match": kind([None, 5, "", "word", "SUBSTRING", ["words"], b"words"]),
            "order": kind([None, 5, "", "oldest", "Best", ["best"]]),
            "project": h.short(),
            "session_id": h.OPT_ID,
            "root_id": h.OPT_ID,
            "roles": SEARCH_LISTS,
            "kinds": SEARCH_LISTS | kind([["text", "bogus"], ["Text"]]),
            "since": h.number(0.0, 2.0**40, optional=True),
            "until": h.number(0.0, 2.0**40, optional=True),
            "include_archived": h.BOOL,
            "limit": h.integer(1, 1000),
            "cursor": SEARCH_CURSORS,
        },
    ),
    Method(
        "search",
        lambda w: {"query": "hello", "match": "substring"},
        {"query": kind(["ab", "a OR bc", '"ab" AND xyz', "NOT abc"])},
    ),
    Method(
        "search.catch_up",
        lambda w: {"progress": None, "stop": lambda: True},
        {"progress": kind([5, "fn", h.Opaque()]), "stop": kind([5, "fn", h.Opaque()])},
    ),
    # -- Sessions
    Method(
        "sessions.create",
        lambda w: {
            "title": "t",
            "project": "/p",
            "parent_id": w.session_id,
            "metadata": {"a": 1},
            "id": None,
            "effects": (),
        },
        {
            "title": h.short(),
            "project": h.short(),
            "parent_id": h.OPT_ID,
            "metadata": h.metadata(),
            "id": h.OPT_ID,
            "effects": h.EFFECTS,
        },
    ),
    Method("sessions.get", lambda w: {"session_id": w.session_id}, {"session_id": h.ID}),
    Method(
        "sessions.list",
        lambda w: {
            "project": None,
            "parent_id": None,
            "root_id": None,
            "include_archived": False,
            "limit": 10,
            "before": None,
        },
        {
            "project": h.short(),
            "parent_id": h.OPT_ID,
            "root_id": h.OPT_ID,
            "include_archived": h.BOOL,
            "limit": h.integer(1),
            "before": h.OPT_ID,
        },
    ),
    Method("sessions.children", lambda w: {"session_id": w.session_id}, {"session_id": h.ID}),
    Method(
        "sessions.update",
        lambda w: {
            "session_id": w.session_id,
            "title": "t2",
            "metadata": {"b": 2},
            "expected_version": None,
            "effects": (),
        },
        {
            "session_id": h.ID,
            "title": h.short(),
            "metadata": h.metadata(),
            "expected_version": h.integer(1, optional=True),
            "effects": h.EFFECTS,
        },
    ),
    Method(
        "sessions.fork",
        lambda w: {"session_id": w.session_id, "at_message_id": None, "title": None, "id": None},
        {"session_id": h.ID, "at_message_id": h.OPT_ID, "title": h.short(), "id": h.OPT_ID},
    ),
    Method(
        "sessions.archive",
        lambda w: {"session_id": w.session_id, "archived": True},
        {"session_id": h.ID, "archived": h.BOOL},
    ),
    Method("sessions.delete", lambda w: {"session_id": w.session_id}, {"session_id": h.ID}),
    Method("sessions.usage", lambda w: {"session_id": w.session_id}, {"session_id": h.ID}),
    # -- Messages
    Method(
        "messages.append",
        lambda w: {
            "session_id": w.session_id,
            "role": "user",
            "parts": [Text("hi")],
            "model": "m",
            "usage": {"input_tokens": 1},
            "metadata": {"a": 1},
            "id": None,
            "effects": (),
        },
        {
            "session_id": h.ID,
            "role": h.nonempty(64, optional=False),
            "parts": h.PARTS,
            "model": h.short(256),
            "usage": h.USAGE,
            "metadata": h.metadata(),
            "id": h.OPT_ID,
            "effects": h.EFFECTS,
        },
    ),
    Method(
        "messages.stream",
        lambda w: {
            "session_id": w.session_id,
            "role": "assistant",
            "model": "m",
            "metadata": None,
            "id": None,
        },
        {
            "session_id": h.ID,
            "role": h.nonempty(64, optional=False),
            "model": h.short(256),
            "metadata": h.metadata(),
            "id": h.OPT_ID,
        },
    ),
    Method("messages.get", lambda w: {"message_id": w.message_id}, {"message_id": h.ID}),
    Method(
        "messages.list",
        lambda w: {"session_id": w.session_id, "after": 0, "limit": None, "last": None},
        {
            "session_id": h.ID,
            "after": h.integer(0),
            "limit": h.integer(0, optional=True),
            "last": h.integer(0, optional=True),
        },
    ),
    Method(
        "messages.iterate",
        lambda w: {"session_id": w.session_id, "after": 0, "page": 10},
        {"session_id": h.ID, "after": h.integer(0), "page": h.integer(1)},
    ),
    # -- Stream (an open one), ToolCallHandle
    Method("text", lambda w: {"delta": "x"}, {"delta": h.NOT_STR | h.BAD_TEXT}, root="stream"),
    Method("reasoning", lambda w: {"delta": "x"}, {"delta": h.NOT_STR | h.BAD_TEXT}, root="stream"),
    Method(
        "tool_call",
        lambda w: {"name": "t", "arguments": {"a": 1}, "call_id": None},
        {"name": NAME, "arguments": h.JSON_VALUE, "call_id": h.short()},
        root="stream",
    ),
    Method("add", lambda w: {"part": Text("x")}, {"part": h.PART}, root="stream"),
    Method("usage", lambda w: {"usage": None}, {"usage": h.USAGE}, root="stream"),
    Method("enqueue", lambda w: {"effect": h._effect()}, {"effect": EFFECT}, root="stream"),
    Method(
        "put_state",
        lambda w: {"key": "k", "value": {"v": 1}, "namespace": "default"},
        {
            "key": h.nonempty(STATE_KEY_MAX, optional=False),
            "value": h.PAYLOAD,
            "namespace": h.nonempty(STATE_NAMESPACE_MAX, optional=False),
        },
        root="stream",
    ),
    Method("finish", lambda w: {"error": None}, {"error": h.short(64 * 1024)}, root="fresh_stream"),
    Method(
        "result",
        lambda w: {"output": "out", "is_error": False},
        {
            "output": kind([None, 5, ["a"], h.Opaque(), h.LONE, memoryview(b"x")]),
            "is_error": h.BOOL,
        },
        root="handle",
    ),
    # -- State
    Method(
        "state.get",
        lambda w: {"session_id": w.session_id, "key": "k", "namespace": "default"},
        {
            "session_id": h.ID,
            "key": h.nonempty(STATE_KEY_MAX, optional=False),
            "namespace": h.nonempty(STATE_NAMESPACE_MAX, optional=False),
        },
    ),
    Method(
        "state.put",
        lambda w: {
            "session_id": w.session_id,
            "key": "k2",
            "value": {"v": 2},
            "namespace": "default",
            "expected_version": None,
            "effects": (),
        },
        {
            "session_id": h.ID,
            "key": h.nonempty(STATE_KEY_MAX, optional=False),
            "value": h.PAYLOAD,
            "namespace": h.nonempty(STATE_NAMESPACE_MAX, optional=False),
            "expected_version": h.integer(0, optional=True),
            "effects": h.EFFECTS,
        },
    ),
    Method(
        "state.delete",
        lambda w: {
            "session_id": w.session_id,
            "key": "k",
            "namespace": "default",
            "expected_version": None,
            "effects": (),
        },
        {
            "session_id": h.ID,
            "key": h.nonempty(STATE_KEY_MAX, optional=False),
            "namespace": h.nonempty(STATE_NAMESPACE_MAX, optional=False),
            "expected_version": h.integer(0, optional=True),
            "effects": h.EFFECTS,
        },
    ),
    Method(
        "state.keys",
        lambda w: {"session_id": w.session_id, "namespace": "default"},
        {"session_id": h.ID, "namespace": h.nonempty(STATE_NAMESPACE_MAX, optional=False)},
    ),
    # -- Effects
    Method(
        "effects.enqueue",
        lambda w: {
            "thread_key": "t-new",
            "kind": "k",
            "payload": {"a": 1},
            "idempotency_key": None,
            "delay": 0.0,
            "max_attempts": 5,
            "replay_safe": None,
        },
        {
            "thread_key": h.nonempty(1024, optional=False),
            "kind": h.nonempty(256, optional=False),
            "payload": h.PAYLOAD,
            "idempotency_key": h.nonempty(1024),
            "delay": h.number(0.0, MAX_DELAY),
            "max_attempts": h.integer(1, 10_000),
            "replay_safe": h.OPT_BOOL,
        },
    ),
    Method("effects.get", lambda w: {"effect_id": w.effect.id}, {"effect_id": h.ID}),
    Method(
        "effects.list",
        lambda w: {"thread_key": None, "state": None, "kind": None, "limit": 10, "after": None},
        {
            "thread_key": h.short(1024),
            "state": kind([5, "bogus", "", ["pending"], b"pending", h.Opaque()]),
            "kind": h.short(256),
            "limit": h.integer(1, 100_000),
            "after": kind([5, "x", new_id(), {"thread_key": "t", "seq": 1}, h.Opaque()]),
        },
    ),
    Method(
        "effects.wait_for_work",
        lambda w: {"timeout": 0.0, "token": None},
        {"timeout": h.TIMEOUT, "token": h.integer(0, optional=True)},
    ),
    Method("effects.next_ready", lambda w: {"kinds": None}, {"kinds": h.ITERABLE_OF_STR}),
    Method("effects.active", lambda w: {"kinds": None}, {"kinds": h.ITERABLE_OF_STR}),
    Method(
        "effects.claim",
        lambda w: {"owner": "w2", "limit": 1, "lease": 30.0, "kinds": ["k"], "timeouts": None},
        {
            "owner": h.nonempty(256, optional=False),
            "limit": h.integer(1, 1000),
            "lease": h.number(0.001, MAX_LEASE),
            "kinds": h.ITERABLE_OF_STR,
            "timeouts": kind(
                [
                    *(5, "k", [("k", 1.0)], {"k": 0}, {"k": -1}, {"k": math.nan}),
                    *({"k": math.inf}, {"k": "60"}, {"k": None}, {5: 1.0}, {"": 1.0}),
                    *({h.LONE: 1.0}, {"k": True}),
                ]
            ),
        },
    ),
    Method("effects.retry", lambda w: {"effect_id": w.effect.id}, {"effect_id": h.ID}),
    Method("effects.cancel", lambda w: {"effect_id": w.effect.id}, {"effect_id": h.ID}),
    Method(
        "effects.declare",
        lambda w: {"kinds": {"k2": True}},
        {
            "kinds": kind(
                [
                    5,
                    None,
                    "ab",
                    ["a"],
                    {5: True},
                    {"": True},
                    {"x" * 300: True},
                    {"a": 1},
                    {h.LONE: True},
                    {"a": None},
                ]
            )
        },
    ),
    # -- Claim (a running effect's)
    Method(
        "heartbeat",
        lambda w: {"lease": MAX_LEASE},
        {"lease": h.number(0.001, MAX_LEASE, optional=True)},
        root="fresh_claim",
    ),
    Method(
        "succeed",
        lambda w: {"result": {"ok": 1}},
        {"result": h.JSON_VALUE | kind([{"k": "x" * (1024 * 1024)}])},
        root="fresh_claim",
    ),
    Method(
        "retry",
        lambda w: {"delay": 0.0, "error": "e", "traceback": None, "max_attempts": None},
        {
            "delay": h.number(0.0, MAX_DELAY),
            "error": h.NOT_STR,
            "traceback": h.NOT_STR,
            "max_attempts": h.integer(1, 10_000, optional=True),
        },
        root="fresh_claim",
    ),
    Method(
        "fail",
        lambda w: {"error": "e", "interrupted": False, "traceback": None},
        {"error": h.NOT_STR | kind([None]), "interrupted": h.BOOL, "traceback": h.NOT_STR},
        root="fresh_claim",
    ),
    Method(
        "timed_out",
        lambda w: {"error": "e", "delay": 0.0, "max_attempts": None},
        {
            "error": h.NOT_STR | kind([None]),
            "delay": h.number(0.0, MAX_DELAY),
            "max_attempts": h.integer(1, 10_000, optional=True),
        },
        root="fresh_claim",
    ),
    # -- Worker
    Method(
        "Worker",
        lambda w: {
            "store": w.store,
            "handlers": {"k": lambda effect: None},
            "concurrency": 4,
            "lease": 30.0,
            "grace": 30.0,
            "poll_interval": 0.1,
            "sweep_interval": None,
            "prefetch": 0,
            "batch": 64,
            "settle_delay": 0.002,
            "backoff": 1.0,
            "max_backoff": 300.0,
            "max_attempts": None,
            "owner": None,
            "until_idle": False,
            "handler_timeout": 600.0,
        },
        {
            "store": kind([None, 5, "store", h.Opaque()]),
            "handlers": kind(
                [
                    None,
                    5,
                    [],
                    {},
                    "ab",
                    {5: print},
                    {"k": 5},
                    {"": print},
                    {"x" * 300: print},
                    {h.LONE: print},
                    [("k", print)],
                    {"k": Handler(print, max_attempts=0)},
                    {"k": Handler(print, max_attempts=True)},  # type: ignore[arg-type]
                    {"k": Handler(print, backoff=-1.0)},
                    {"k": Handler(print, max_backoff=math.nan)},
                    {"k": Handler(print, backoff="1")},  # type: ignore[arg-type]
                ]
            ),
            "concurrency": h.integer(1, 1000),
            "lease": h.number(0.001, MAX_LEASE),
            "grace": h.number(0.0, MAX_DELAY),
            "poll_interval": h.number(0.0, MAX_DELAY, optional=True),
            "sweep_interval": h.number(0.0, MAX_DELAY, optional=True),
            "prefetch": h.integer(0, 999),
            "batch": h.integer(1, 1000),
            "settle_delay": h.number(0.0, 1.0),
            "backoff": h.number(0.0, MAX_DELAY),
            "max_backoff": h.number(0.0, MAX_DELAY),
            "max_attempts": h.integer(1, 10_000, optional=True),
            "owner": h.nonempty(256),
            "until_idle": h.BOOL,
            "handler_timeout": kind(
                [0, -1.0, 0.0005, math.nan, -math.inf, "60", b"1", [1.0], True, MAX_DELAY * 2]
            ),
        },
        root="module",
        mirrored=False,
    ),
    Method("stop", lambda w: {"hard": False}, {"hard": h.BOOL}, root="worker", mirrored=False),
    # -- Database
    Method(
        "Database.open",
        lambda w: {"path": w.fresh_path(), "migrations": ()},
        {"path": DB_PATHS, "migrations": MIGRATIONS},
        root="module",
        mirrored=False,
    ),
    Method(
        "Database.open",
        lambda w: {"path": w.fresh_path(), **{k: getattr(Settings(), k) for k in SETTING_VALUES}},
        SETTING_VALUES,
        root="module",
        mirrored=False,
    ),
    Method(
        "read", lambda w: {"fn": lambda tx: None}, {"fn": h.CALLABLE}, root="db", mirrored=False
    ),
    Method(
        "run_write",
        lambda w: {"fn": lambda tx: None, "single_statement": False},
        {"fn": h.CALLABLE, "single_statement": h.BOOL},
        root="db",
        mirrored=False,
    ),
    Method(
        "migrate",
        lambda w: {"migrations": ()},
        {"migrations": MIGRATIONS},
        root="db",
        mirrored=False,
    ),
    Method(
        "checkpoint",
        lambda w: {"truncate": False, "wait": True},
        {"truncate": h.BOOL, "wait": h.BOOL},
        root="db",
        mirrored=False,
    ),
    Method(
        "submit",
        lambda w: {"item": _NoItem()},
        {"item": h.kind([None, 5, "item", h.Opaque(), lambda tx: None])},
        root="db",
        mirrored=False,
    ),
    Method(
        "serve",
        lambda w: {"tag": "t", "applier": lambda tx, b: b},
        {"tag": h.nonempty(256, optional=False), "applier": h.CALLABLE},
        root="db",
        mirrored=False,
    ),
    Method(
        "before_checkpoint",
        lambda w: {"fn": lambda: None},
        {"fn": h.CALLABLE},
        root="db",
        mirrored=False,
    ),
    Method(
        "notify_wait",
        lambda w: {"channel": "c", "timeout": 0.0, "token": None},
        {"channel": CHANNELS, "timeout": h.TIMEOUT, "token": h.integer(0, optional=True)},
        root="db",
        mirrored=False,
    ),
    Method(
        "notify_token", lambda w: {"channel": "c"}, {"channel": CHANNELS}, root="db", mirrored=False
    ),
    Method(
        "listen",
        lambda w: {"channel": "c", "fn": lambda: None},
        {"channel": CHANNELS, "fn": h.CALLABLE},
        root="db",
        mirrored=False,
    ),
    Method(
        "execute",
        lambda w: {"sql": "SELECT ?", "params": (1,)},
        {
            "sql": kind([5, None, b"SELECT 1", h.Opaque(), "SELECT 1\x00", h.LONE, ["SELECT 1"]]),
            "params": kind(
                [
                    5,
                    h.Opaque(),
                    [2**63],
                    [10**400],
                    [h.Opaque()],
                    [[1]],
                    {"a": h.Opaque()},
                    [h.LONE],
                ]
            ),
        },
        root="read_tx",
        mirrored=False,
    ),
    Method(
        "executemany",
        lambda w: {"sql": "INSERT INTO t(v) VALUES (?)", "seq_of_params": [(1,)]},
        {
            "sql": kind([5, None, b"SELECT 1", h.Opaque()]),
            "seq_of_params": kind([5, None, [5], [(2**63,)], [(h.Opaque(),)], h.Opaque()]),
        },
        root="write_tx",
        mirrored=False,
    ),
    # -- opening
    Method(
        "open",
        lambda w: {"url_or_path": w.fresh_path()},
        {"url_or_path": PATHS},
        root="module",
    ),
    Method(
        "open",
        lambda w: {
            "url_or_path": w.fresh_path(),
            **{k: getattr(Settings(), k) for k in SETTING_VALUES},
        },
        SETTING_VALUES,
        root="module",
    ),
    Method(
        "Settings.load",
        lambda w: {k: getattr(Settings(), k) for k in SETTING_VALUES},
        SETTING_VALUES,
        root="module",
        mirrored=False,
    ),
    Method(
        "Settings.load",
        lambda w: {"env": {}},
        {"env": kind([5, "FLEETSTORE_WRITE_BUDGET=1", ["a"], h.Opaque()])},
        root="module",
        mirrored=False,
    ),
    Method(
        "Settings.load",
        lambda w: {"env": {}},
        {"env": kind(ENV_CASES)},
        root="module",
        mirrored=False,
    ),
    Method(
        "AsyncStore",
        lambda w: {"store": w.store, "threads": 2},
        {"threads": h.integer(1, 1024)},
        root="module",
        mirrored=False,
    ),
]


def _target(w: World, m: Method, is_async: bool) -> Callable[..., Any]:
    """The function a row calls (async: the mirror's).  Objects made for the call
    (a fresh store, stream or claim) are made here, before the snapshot; what must
    be undone afterwards goes to ``w.cleanup``."""
    obj: Any
    if m.root == "module":
        obj = fleetstore
        if is_async:
            assert m.path == "open"
            return fleetstore.open_async
    elif m.root == "fresh_store":
        store = fleetstore.open(w.tmp / "fresh" / f"{new_id()}.db")
        w.cleanup.append(store.close)
        obj = AsyncStore(store) if is_async else store
    elif m.root == "fresh_stream":
        stream = w.store.messages.stream(w.session_id)
        stream.open()
        w.cleanup.append(stream.finish)
        obj = AsyncStream(w.astore, stream) if is_async else stream  # type: ignore[arg-type]
    elif m.root == "fresh_claim":
        thread = f"t-{new_id()}"
        w.store.effects.enqueue(thread, "k-fresh", {"n": 1})
        (claim,) = w.store.effects.claim("w", lease=MAX_LEASE, kinds=["k-fresh"])
        w.cleanup.append(claim.release)
        obj = AsyncClaim(w.astore, claim) if is_async else claim  # type: ignore[arg-type]
    elif m.root == "worker":
        obj = Worker(w.store, {"k": lambda effect: None})
    elif m.root in ("read_tx", "write_tx"):
        name = m.path

        def in_tx(**kw: Any) -> Any:
            def body(tx: Any) -> Any:
                return getattr(tx, name)(**kw)

            return w.db.read(body) if m.root == "read_tx" else w.db.run_write(body)

        return in_tx
    elif m.root == "db":
        obj = w.db
    elif is_async:
        obj = w.async_roots[m.root]
    else:
        obj = {"store": w.store, "stream": w.stream, "handle": w.handle}[m.root]
    for name in m.path.split("."):
        obj = getattr(obj, name)
    return obj  # type: ignore[no-any-return]


def _call(fn: Callable[..., Any], m: Method, kwargs: dict[str, Any], is_async: bool) -> Any:
    args: tuple[Any, ...] = ()
    if m.root == "module" and m.path == "open":
        kwargs = dict(kwargs)
        args = (kwargs.pop("url_or_path"),)
    if is_async:

        async def run() -> Any:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            return result

        return asyncio.run(run())
    return fn(*args, **kwargs)


def _close(w: World, result: Any) -> None:
    """Close what an unexpectedly accepted call opened."""
    if isinstance(result, Store | Database):
        result.close()
    elif isinstance(result, AsyncStore):
        if result.sync is w.store:
            result._executor.shutdown(wait=False)
        else:
            asyncio.run(result.close())


def check_refused(w: World, m: Method, param: str, value: Any, is_async: bool = False) -> None:
    kwargs = m.valid(w)
    kwargs[param] = value
    try:
        fn = _target(w, m, is_async)
        before = state_of(w)
        try:
            result = _call(fn, m, kwargs, is_async)
        except errors.FleetstoreError:
            pass
        except Exception as exc:  # the finding: an untyped error
            raise AssertionError(
                f"{m}({param}={value!r:.120}) raised {type(exc).__name__}: {exc!s:.300}"
            ) from exc
        else:
            _close(w, result)
            raise AssertionError(f"{m}({param}={value!r:.120}) was accepted: {result!r:.200}")
        after = state_of(w)
        assert after == before, f"{m}({param}={value!r:.120}) raised but changed the store"
    finally:
        while w.cleanup:
            with contextlib.suppress(errors.FleetstoreError):
                w.cleanup.pop()()


ROWS = [(m, p) for m in METHODS for p in m.params]


@pytest.mark.parametrize(("method", "param"), ROWS, ids=[f"{m}:{p}" for m, p in ROWS])
def test_a_hostile_argument_is_refused_and_changes_nothing(
    world: World, method: Method, param: str
) -> None:
    bad = method.params[param]
    failures = []
    for value in bad.values:
        try:
            check_refused(world, method, param, value)
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0])
    assert not failures, "\n".join(failures)

    @settings(
        max_examples=15,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(value=bad.strategy)
    def generated(value: Any) -> None:
        check_refused(world, method, param, value)

    generated()


MIRRORED = [(m, p) for m, p in ROWS if m.mirrored]


@pytest.mark.parametrize(("method", "param"), MIRRORED, ids=[f"{m}:{p}" for m, p in MIRRORED])
def test_the_async_mirror_refuses_it_too(world: World, method: Method, param: str) -> None:
    failures = []
    for value in method.params[param].values:
        try:
            check_refused(world, method, param, value, is_async=True)
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0])
    assert not failures, "\n".join(failures)


class _NoItem:
    """An item that writes nothing (the base arguments of the ``submit`` row)."""

    def run(self, tx: Any) -> object:
        return None

    def payload(self) -> bytes | None:
        return None

    def result(self, data: bytes) -> object:
        return None


def test_stream_usage_tokens_are_checked(world: World) -> None:
    for tokens in ({"input_tokens": 2**63}, {"bogus": 1}, {"cost": math.inf}, {"cost": 10**400}):
        with pytest.raises(errors.InvalidInput):
            world.stream.usage(**tokens)


def test_every_public_method_has_a_row() -> None:
    """A new public method of the API must get a row (or be listed here as taking
    no argument)."""
    no_arguments = {
        "Store": {"recover", "metrics", "histograms", "finish_jobs"},
        "Sessions": set(),
        "Messages": set(),
        "Stream": {"open", "due", "flush"},
        "ToolCallHandle": set(),
        "State": set(),
        "Effects": {"counts", "sweep", "kinds", "wake_token"},
        "Claim": {"cancel", "release"},
        "Worker": {"run", "run_async"},
        "Database": {"write", "metrics", "histograms", "connection_report", "close"},
    }
    roots = {
        "Store": ("store", ""),
        "Sessions": ("store", "sessions."),
        "Messages": ("store", "messages."),
        "Stream": ("stream", ""),
        "ToolCallHandle": ("handle", ""),
        "State": ("store", "state."),
        "Effects": ("store", "effects."),
        "Claim": ("fresh_claim", ""),
        "Worker": ("worker", ""),
        "Database": ("db", ""),
    }
    rows = {(m.root, m.path) for m in METHODS}
    missing = []
    for cls_name, (root, prefix) in roots.items():
        cls = getattr(fleetstore, cls_name)
        for name, member in vars(cls).items():
            if name.startswith("_") or not callable(member) or isinstance(member, property):
                continue
            # (Store.search_files and with_file are StorePort hooks for the domain.)
            hooks = ("streams_opened", "streams_closed", "search_files", "with_file")
            if name in no_arguments[cls_name] or name in hooks:
                continue
            if (root, prefix + name) not in rows and not (
                ("fresh_store", name) in rows or ("fresh_stream", name) in rows
            ):
                missing.append(f"{cls_name}.{name}")
    assert missing == []


# -- operations as a spool journal or an import file carries them ----------------------------

OP_KEYS = sorted(
    {"id", "session_id", "message_id", "parent_id", "source_id", "title", "metadata", "parts"}
    | {"chunks", "part", "seq", "usage", "status", "role", "model", "error", "kinds", "owner"}
    | {"limit", "lease", "fence", "outcome", "delay", "payload", "value", "namespace", "key"}
    | {"expected_version", "at_seq", "archived", "thread_key", "kind", "events", "messages"}
    | {"values", "thread_id", "checkpoint_ns", "checkpoint_id", "body", "now", "created_at"}
    | {"effects", "result", "app_name", "user_id", "adk_session_id", "revision", "event"}
    | {"timeouts", "items", "claim_op", "traceback", "max_attempts"}
)
OP_VALUES = st.sampled_from(
    [None, 5, -1, "x", "", [1], {"a": 1}, [{"a": 1}], math.nan, 2**64, True, "\x00", h.LONE]
)


def test_an_operation_with_hostile_arguments_raises_only_typed_errors(tmp_path: Path) -> None:
    """Spool journals and import files are input too: whatever the arguments, applying
    a registered operation raises nothing but a ``FleetstoreError``."""
    from fleetstore.domain.registry import REGISTRY

    store = fleetstore.open(tmp_path / "ops.db")
    s = store.sessions.create()
    try:

        @settings(max_examples=400, deadline=None, database=None)
        @given(
            name=st.sampled_from(sorted(REGISTRY)),
            args=st.dictionaries(st.sampled_from(OP_KEYS), OP_VALUES | st.just(s.id), max_size=10),
        )
        def apply(name: str, args: dict[str, Any]) -> None:
            try:
                store.apply(Operation(name, args, new_id()))
            except errors.FleetstoreError:
                pass

        apply()
    finally:
        store.close()
