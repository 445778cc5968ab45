"""The limits of what one row holds inline (issue "Hostile-input and fault findings",
items 5, 6, 7 and 8), on every engine:

* item 5: metadata, part meta, titles... past their limit are refused on every write
  path (the API, the operation inside its transaction, which also runs for spool
  journals and import files, and the import parser), and what the store accepts
  it can export: the largest records allowed fit the export's line limit;
* item 6: a call refused for any argument leaves no blob file behind;
* the API refuses what the operation would refuse, before anything is spooled;
* item 7: the reported calls that raised untyped exceptions;
* item 8: ``kinds`` given as a bare string is refused, not iterated.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard

import fleetstore
from fleetstore import (
    Database,
    NewEffect,
    Operation,
    Store,
    Text,
    ToolCall,
    ToolResult,
    errors,
)
from fleetstore.core.ids import new_id
from fleetstore.core.validate import MAX_METADATA, MAX_PART_META, MAX_SHORT
from fleetstore.domain.imports import PARSERS
from fleetstore.transfer.digest import session_digest
from fleetstore.transfer.export import export_store
from fleetstore.transfer.format import MAX_LINE
from fleetstore.transfer.importing import import_file
from fleetstore.transfer.merge import merge
from tests.domain.hostile import Opaque, blob_files
from tests.fix_stores import OpenStore, read_everywhere

BIG = "b" * (100 * 1024)  # over blob_threshold


def text_of(size: int) -> dict[str, Any]:
    """Metadata whose JSON text is exactly *size* bytes."""
    overhead = len(json.dumps({"k": ""}, separators=(",", ":")))
    return {"k": "m" * (size - overhead)}


def blobs_now(store: Store) -> list[Any]:
    if store.dialect != "sqlite":
        return read_everywhere(store, "SELECT DISTINCT sha256 FROM blob_chunks ORDER BY 1")
    return blob_files(store)


# -- item 5: one set of limits, on every write path ---------------------------------------


def _import_session(sid: str, metadata: Any, title: Any = None) -> dict[str, Any]:
    return {
        "id": sid,
        "parent_id": None,
        "root_id": sid,
        "forked_from": None,
        "fork_seq": None,
        "project": None,
        "title": title,
        "status": "active",
        "metadata": metadata,
        "created_at": 1.0,
        "updated_at": 1.0,
        "archived_at": None,
        "version": 1,
    }


def _import_message(mid: str, sid: str, metadata: Any, parts: Any = ()) -> dict[str, Any]:
    return {
        "id": mid,
        "session_id": sid,
        "seq": 1,
        "role": "user",
        "status": "complete",
        "model": None,
        "metadata": metadata,
        "error": None,
        "created_at": 1.0,
        "completed_at": 1.0,
        "usage": None,
        "parts": list(parts),
    }


def test_metadata_past_the_limit_is_refused_on_every_write_path(open_store: OpenStore) -> None:
    store = open_store()
    at, over = text_of(MAX_METADATA), text_of(MAX_METADATA + 1)
    s = store.sessions.create(metadata=at)
    assert store.sessions.get(s.id).metadata == at
    store.messages.append(s.id, "user", "x", metadata=at)
    before = read_everywhere(store, "SELECT count(*) FROM sessions")
    calls: list[Callable[[], Any]] = [
        lambda: store.sessions.create(metadata=over),
        lambda: store.sessions.update(s.id, metadata=over),
        lambda: store.messages.append(s.id, "user", "x", metadata=over),
        lambda: store.messages.stream(s.id, metadata=over),
        # the operations, as a spool journal or an import replays them
        lambda: store.apply(
            Operation("create_session", {"id": new_id(), "metadata": over}, new_id())
        ),
        lambda: store.apply(Operation("update_session", {"id": s.id, "metadata": over}, new_id())),
        lambda: store.apply(
            Operation(
                "append_message",
                {"id": new_id(), "session_id": s.id, "role": "user", "metadata": over},
                new_id(),
            )
        ),
        lambda: store.apply(Operation("import_session", _import_session(new_id(), over), new_id())),
        lambda: PARSERS["import_message"](_import_message(new_id(), s.id, over)),
    ]
    for call in calls:
        with pytest.raises(errors.InvalidInput, match="metadata"):
            call()
    assert read_everywhere(store, "SELECT count(*) FROM sessions") == before


def test_part_meta_and_names_past_their_limits_are_refused(open_store: OpenStore) -> None:
    store = open_store()
    s = store.sessions.create()
    long = "n" * (MAX_SHORT + 1)
    for part in (
        ToolCall(long, {}),
        ToolCall("t", {}, call_id=long),
        ToolResult(long, "out"),
        ToolResult("c", "out", name=long),
        fleetstore.File(b"x", mime_type="m" * 257),
        fleetstore.File(b"x", name=long),
    ):
        with pytest.raises(errors.InvalidInput):
            store.messages.append(s.id, "tool", [part])
    # A part's meta as an operation carries it (a spool journal, an import file).
    meta = text_of(MAX_PART_META + 1)
    part = {"kind": "text", "meta": meta, "enc": "str", "body": "x"}
    args = {"id": new_id(), "session_id": s.id, "role": "user", "parts": [part]}
    with pytest.raises(errors.InvalidInput, match="meta"):
        store.apply(Operation("append_message", args, new_id()))
    with pytest.raises(errors.InvalidInput, match="meta"):
        PARSERS["import_message"](_import_message(new_id(), s.id, {}, [{**part, "seq": 0}]))
    assert store.messages.list(s.id) == []


def test_inline_payloads_past_the_limit_are_refused(open_store: OpenStore) -> None:
    """No inline body over MAX_INLINE in any row (blob_threshold is at most that)."""
    from fleetstore.core.validate import MAX_INLINE

    with pytest.raises(errors.ConfigError):
        fleetstore.Settings(blob_threshold=MAX_INLINE + 1)
    store = open_store()
    body = "x" * (MAX_INLINE + 1)
    args = {"id": new_id(), "thread_key": "t", "kind": "k", "payload": {"enc": "json", "body": "1"}}
    store.apply(Operation("enqueue_effect", args, new_id()))
    args = {**args, "id": new_id(), "payload": {"enc": "json", "body": json.dumps(body)}}
    with pytest.raises(errors.InvalidInput):
        store.apply(Operation("enqueue_effect", args, new_id()))


def _max_line(path: Path) -> int:
    with path.open("rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh) as z:
        data = z.read()
    return max(len(line) for line in data.split(b"\n"))


@pytest.mark.slow
def test_what_the_store_accepts_it_exports(open_store: OpenStore, tmp_path: Path) -> None:
    """Every inline value at its limit, in the form that grows most in an export line
    (control characters are escaped as six bytes): the store exports and imports it."""
    store = open_store("src.db")
    worst = "\x01"
    meta = {"k": worst * ((MAX_METADATA - 20) // 6)}
    s = store.sessions.create(worst * MAX_SHORT, project=worst * MAX_SHORT, metadata=meta)
    store.messages.append(
        s.id,
        "r" * 64,
        [ToolCall(worst * MAX_SHORT, {"a": 1}, call_id=worst * MAX_SHORT)],
        model="m" * 256,
        metadata=meta,
    )
    with store.messages.stream(s.id, metadata=meta) as reply:
        # the largest streamed chunk the export keeps as chunks (8 MiB)
        reply.text(worst * (8 * 1024 * 1024))
        reply.add(ToolResult(worst * MAX_SHORT, "out", name=worst * MAX_SHORT))
    failed = store.messages.stream(s.id, metadata=meta)
    failed.open()
    failed.finish(error=worst * (64 * 1024))
    store.state.put(s.id, "k" * 1024, {"v": 1}, namespace="n" * 256)
    file = tmp_path / "all.jsonl.zst"
    export_store(store, file)
    assert _max_line(file) < MAX_LINE - 8 * 1024 * 1024  # with room
    other = open_store("dst.db")
    import_file(other, file)
    assert session_digest(other, s.id) == session_digest(store, s.id)
    # merge carries it too (its own export, import and verification)
    merged = open_store("merged.db")
    report = merge([store], merged)
    assert report.ok, report.problems
    assert session_digest(merged, s.id) == session_digest(store, s.id)


def test_metadata_the_export_could_not_carry_is_refused(open_store: OpenStore) -> None:
    """Found by hand: 70 MiB of metadata was accepted, and export failed."""
    store = open_store()
    with pytest.raises(errors.InvalidInput):
        store.sessions.create(metadata={"k": "x" * (70 * 1024 * 1024)})


# -- item 6: nothing written before every argument is checked --------------------------------


def _big_effect(**kw: Any) -> NewEffect:
    return NewEffect("t", "k", BIG, **kw)


REFUSED_WITH_A_BLOB: list[tuple[str, Callable[[Store, str], Any]]] = [
    ("append, bad model", lambda st, s: st.messages.append(s, "user", [Text(BIG)], model=5)),
    (
        "append, bad usage",
        lambda st, s: st.messages.append(s, "user", [Text(BIG)], usage={"input_tokens": 2**63}),
    ),
    (
        "append, bad effect after the part",
        lambda st, s: st.messages.append(
            s, "user", [Text(BIG)], effects=[NewEffect("t", "k", delay=-1)]
        ),
    ),
    (
        "append, bad part after a big effect",
        lambda st, s: st.messages.append(s, "user", [Text(5)], effects=[_big_effect()]),  # type: ignore[arg-type]
    ),
    (
        "append, bad second effect",
        lambda st, s: st.messages.append(
            s,
            "user",
            "x",
            effects=[_big_effect(), NewEffect(5, "k")],  # type: ignore[arg-type]
        ),
    ),
    (
        "append, a long tool name",
        lambda st, s: st.messages.append(s, "user", [ToolCall("n" * 5000, BIG)]),
    ),
    ("create, bad title", lambda st, s: st.sessions.create(5, effects=[_big_effect()])),  # type: ignore[arg-type]
    (
        "create, long project",
        lambda st, s: st.sessions.create(project="p" * 5000, effects=[_big_effect()]),
    ),
    ("update, bad title", lambda st, s: st.sessions.update(s, title=5, effects=[_big_effect()])),  # type: ignore[arg-type]
    (
        "update, bad expected_version",
        lambda st, s: st.sessions.update(s, expected_version="1", effects=[_big_effect()]),  # type: ignore[arg-type]
    ),
    ("put, bad expected_version", lambda st, s: st.state.put(s, "k", BIG, expected_version=-1)),
    (
        "put, bad value after a big effect",
        lambda st, s: st.state.put(s, "k", Opaque(), effects=[_big_effect()]),
    ),
    (
        "delete, bad expected_version",
        lambda st, s: st.state.delete(s, "k", expected_version=-1, effects=[_big_effect()]),
    ),
    ("enqueue, bad delay", lambda st, s: st.effects.enqueue("t", "k", BIG, delay=math.nan)),
    ("enqueue, bad replay_safe", lambda st, s: st.effects.enqueue("t", "k", BIG, replay_safe=1)),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(
    "call", [c for _, c in REFUSED_WITH_A_BLOB], ids=[n for n, _ in REFUSED_WITH_A_BLOB]
)
def test_a_refused_call_writes_no_blob(open_store: OpenStore, call: Callable[..., Any]) -> None:
    store = open_store()
    s = store.sessions.create()
    before = blobs_now(store)
    with pytest.raises(errors.FleetstoreError):
        call(store, s.id)
    assert blobs_now(store) == before


def test_a_refused_stream_call_writes_no_blob(open_store: OpenStore) -> None:
    store = open_store()
    s = store.sessions.create()
    with store.messages.stream(s.id) as reply:
        before = blobs_now(store)
        for call in (
            lambda: reply.tool_call("t", BIG, call_id=5),  # type: ignore[arg-type]
            lambda: reply.tool_call("n" * 5000, BIG),
            lambda: reply.add(ToolResult("c", BIG, name="n" * 5000)),
            lambda: reply.add(ToolResult("c", BIG, is_error=5)),  # type: ignore[arg-type]
            lambda: reply.tool_call("t", {}).result(BIG, is_error=5),  # type: ignore[arg-type]
            lambda: reply.enqueue(_big_effect(delay=-1)),
        ):
            with pytest.raises(errors.InvalidInput):
                call()
        assert len(blobs_now(store)) == len(before)


# -- the API refuses what the operation would, before the spool -----------------------------


@pytest.fixture
def spooling(open_store: OpenStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    """A store whose every write goes to the spool (the lock looks held past the budget)."""
    store = open_store()
    s = store.sessions.create(id="s1")
    real = store.backend.apply

    def busy(op: Operation) -> Any:
        raise errors.StoreBusy(str(store.path), 0.0, 1)

    monkeypatch.setattr(store.backend, "apply", busy)
    yield store
    monkeypatch.setattr(store.backend, "apply", real)
    assert s.id == "s1"


SPOOLED_THEN_REJECTED: list[tuple[str, Callable[[Store], Any]]] = [
    ("create, long title", lambda st: st.sessions.create("t" * 5000)),
    ("create, long project", lambda st: st.sessions.create(project="p" * 5000)),
    ("create, NUL in the title", lambda st: st.sessions.create("a\x00b")),
    ("append, long model", lambda st: st.messages.append("s1", "user", "x", model="m" * 300)),
    ("append, model not a string", lambda st: st.messages.append("s1", "user", "x", model=5)),
    ("stream, model not a string", lambda st: st.messages.stream("s1", model=5).open()),
    (
        "append, usage past 2**63",
        lambda st: st.messages.append("s1", "u", "x", usage={"input_tokens": 2**63}),
    ),
    ("put, namespace", lambda st: st.state.put("s1", "k", 1, namespace="n" * 300)),
    (
        "enqueue, long idempotency key",
        lambda st: st.effects.enqueue("t", "k", idempotency_key="i" * 2000),
    ),
]


@pytest.mark.parametrize(
    "call", [c for _, c in SPOOLED_THEN_REJECTED], ids=[n for n, _ in SPOOLED_THEN_REJECTED]
)
def test_the_api_refuses_what_the_operation_would_before_spooling(
    spooling: Store, call: Callable[[Store], Any]
) -> None:
    with pytest.raises(errors.InvalidInput):
        call(spooling)
    assert len(spooling.spool) == 0


def test_a_stream_finished_with_a_bad_error_stays_open(open_store: OpenStore) -> None:
    store = open_store()
    s = store.sessions.create()
    reply = store.messages.stream(s.id)
    reply.open()
    reply.text("partial")
    for bad in (5, "e" * (64 * 1024 + 1), "a\ud800"):
        with pytest.raises(errors.InvalidInput):
            reply.finish(error=bad)  # type: ignore[arg-type]
    reply.finish(error="ok")
    (m,) = store.messages.list(s.id)
    assert (m.status, m.error, m.text) == ("error", "ok", "partial")


def test_an_exception_with_a_huge_or_broken_message_still_ends_the_stream(
    open_store: OpenStore,
) -> None:
    store = open_store()
    s = store.sessions.create()
    for message in ("e" * (200 * 1024), "bad \ud800 text", "nul \x00 in it"):
        with pytest.raises(RuntimeError), store.messages.stream(s.id) as reply:
            reply.text("partial")
            raise RuntimeError(message)
    assert [m.status for m in store.messages.list(s.id)] == ["error"] * 3


# -- item 7: the reported untyped exceptions ---------------------------------------------


def test_the_reported_calls_raise_typed_errors(open_store: OpenStore, tmp_path: Path) -> None:
    store = open_store()
    s = store.sessions.create()
    calls: list[Callable[[], Any]] = [
        lambda: store.sessions.list(limit=2**63),
        lambda: store.messages.list(s.id, after=2**64),
        lambda: store.messages.list(s.id, last=2**64),
        lambda: store.messages.append(s.id, "user", "x", usage={"input_tokens": 2**63}),
        lambda: store.messages.append(s.id, "user", 5),  # type: ignore[arg-type]
        lambda: store.messages.append(s.id, "user", None),  # type: ignore[arg-type]
        lambda: store.effects.list(after=5),  # type: ignore[arg-type]
        lambda: store.sessions.list(before=5),  # type: ignore[arg-type]
        lambda: store.state.keys(s.id, namespace=5),  # type: ignore[arg-type]
        lambda: store.state.get(s.id, None),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(errors.InvalidInput):
            call()
    with pytest.raises(errors.ConfigError):
        fleetstore.open("\x00a")
    with pytest.raises(errors.ConfigError):
        Database.open(5)  # type: ignore[arg-type]


# -- item 8: an iterable of strings is not a string --------------------------------------


def test_kinds_given_as_a_string_are_refused(open_store: OpenStore) -> None:
    store = open_store()
    for kind in ("k", "x", "kx"):
        store.effects.enqueue(f"t-{kind}", kind)
    for kinds in ("kx", "", b"kx"):
        with pytest.raises(errors.InvalidInput, match="kinds"):
            store.effects.claim("w", kinds=kinds, limit=10)  # type: ignore[arg-type]
        with pytest.raises(errors.InvalidInput, match="kinds"):
            store.effects.next_ready(kinds)  # type: ignore[arg-type]
        with pytest.raises(errors.InvalidInput, match="kinds"):
            store.effects.active(kinds)  # type: ignore[arg-type]
    assert store.effects.counts()["running"] == 0
    (claim,) = store.effects.claim("w", kinds=["kx"], limit=10)
    assert claim.effect.kind == "kx"
    # and as an operation carries them
    op = Operation("claim_effects", {"owner": "w", "kinds": "kx"}, new_id())
    with pytest.raises(errors.InvalidInput, match="kinds"):
        store.apply(op)
