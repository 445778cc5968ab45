"""Redaction where content is written (issue 29): every write path of the API, sync and
async, on every engine, replaces a secret by its marker before anything is stored (the
row, the blob file, the spool journal); a streamed secret cut at any character by a
flush is still caught; the user's rules and allow-list; the counts; the screen that
lets the write path skip a text with one regex search never misses a secret."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore import Store, errors
from fleetstore.admin.scan import ScanFinding, scan
from fleetstore.core.redact import Redactor, default_redactor, write_redaction
from fleetstore.domain.history import MAX_ERROR_TEXT
from fleetstore.models import File, Reasoning, Text, ToolCall, ToolResult
from tests.fix_stores import OpenStore, read_everywhere
from tests.secret_samples import samples

SAMPLES = {s.kind: s for s in samples()}
R = default_redactor()
#: One token of a kind found by its prefix, one by its name, one multi-line.
GH = SAMPLES["github-token"]
KEYED = SAMPLES["env-secret"]
PEM = SAMPLES["private-key"]


def redacted(text: str) -> str:
    return R.redact(text).text


def findings(path: Path | str) -> list[ScanFinding]:
    """What fleetstore scan finds in the store's files: the database, its blob files and
    spool journals (an independent read of everything written)."""
    found: list[ScanFinding] = []
    scan(path, found.append)
    return found


# -- every write path -------------------------------------------------------------------------

Write = Callable[[Store, str, str], Callable[[Store], Any]]


def _append(store: Store, sid: str, text: str) -> Callable[[Store], Any]:
    m = store.messages.append(sid, "user", text)
    return lambda s: s.messages.get(m.id).text


def _parts(store: Store, sid: str, text: str) -> Callable[[Store], Any]:
    parts = [
        Text(text),
        Reasoning(text),
        ToolCall("bash", {"cmd": text, "env": {"DB_PASSWORD": "hunter2hunter2"}}),
        ToolResult("c1", text),
        ToolResult("c2", text.encode()),
        File(text.encode(), "text/plain", "out.txt"),
        ToolResult("c3", "x" * 70_000 + "\n" + text),  # a blob
    ]
    m = store.messages.append(sid, "tool", parts)

    def read(s: Store) -> Any:
        p = s.messages.get(m.id).parts
        return [
            p[0].text,
            p[1].text,
            p[2].arguments,
            p[3].output,
            p[4].output,
            p[5].data,
            p[6].output[-len(text) - 50 :],
        ]  # type: ignore[union-attr]

    return read


def _state(store: Store, sid: str, text: str) -> Callable[[Store], Any]:
    store.state.put(sid, "json", {"out": text, "env": {"GITHUB_TOKEN": GH.secret}})
    store.state.put(sid, "bytes", text.encode())
    store.state.put(sid, "big", {"out": "y" * 70_000 + text})
    return lambda s: (
        [s.state.get(sid, k).value for k in ("json", "bytes")]
        + [s.state.get(sid, "big").value["out"][-len(text) - 10 :]]
    )


def _effects(store: Store, sid: str, text: str) -> Callable[[Store], Any]:
    eid = store.effects.enqueue(sid, "notify", {"body": text})
    (claim,) = store.effects.claim("w", kinds=["notify"])
    claim.succeed({"answer": text})
    return lambda s: [s.effects.get(eid).payload, s.effects.get(eid).result]


def _stream(store: Store, sid: str, text: str) -> Callable[[Store], Any]:
    with store.messages.stream(sid) as reply:
        half = len(text) // 2
        reply.text(text[:half])
        reply.flush()
        reply.text(text[half:])
        reply.reasoning(text)
        reply.tool_call("bash", {"cmd": text}).result(text)
        reply.put_state("turn", {"said": text})
        reply.enqueue(fleetstore.NewEffect(sid, "notify", {"body": text}))
    return lambda s: [p for p in s.messages.get(reply.id).parts] + [s.state.get(sid, "turn").value]


def _sessions(store: Store, sid: str, text: str) -> Callable[[Store], Any]:
    """Titles and metadata: often made from the first message, or a command line."""
    meta = {"cmd": text, "env": {"GITHUB_TOKEN": GH.secret}}
    made = store.sessions.create(title=text, metadata=meta).id
    store.sessions.update(sid, title=text, metadata=meta)
    forked = store.sessions.fork(sid, title=text).id
    m = store.messages.append(sid, "user", "hello", metadata=meta)
    with store.messages.stream(sid, metadata=meta) as reply:
        reply.text("done")
    with pytest.raises(RuntimeError), store.messages.stream(sid) as failed:
        raise RuntimeError(text)  # the stream's error: the exception's message
    return lambda s: [
        [(x.title, x.metadata) for x in (s.sessions.get(i) for i in (made, sid, forked))],
        s.messages.get(m.id).metadata,
        s.messages.get(reply.id).metadata,
        s.messages.get(failed.id).error,
    ]


def _failures(store: Store, sid: str, text: str) -> Callable[[Store], Any]:
    """An effect's error and traceback: an exception's message prints what it was given."""
    retried = store.effects.enqueue(f"{sid}/a", "hook", {}, max_attempts=3)
    failed = store.effects.enqueue(f"{sid}/b", "hook", {})
    claims = {c.id: c for c in store.effects.claim("w", kinds=["hook"], limit=2)}
    claims[retried].retry(0.0, error=text, traceback=f"Traceback:\n  {text}")
    claims[failed].fail(text, traceback=f"Traceback:\n  {text}")
    return lambda s: [
        (e.last_error, [(x.error, x.traceback) for x in e.errors])
        for e in (s.effects.get(retried), s.effects.get(failed))
    ]


WRITES: dict[str, Write] = {
    "sessions": _sessions,
    "failures": _failures,
    "append": _append,
    "parts": _parts,
    "state": _state,
    "effects": _effects,
    "stream": _stream,
}


@pytest.mark.parametrize("write", list(WRITES))
def test_every_write_path_stores_the_marker_not_the_secret(
    open_store: OpenStore, engine: str, tmp_path: Path, write: str
) -> None:
    text = f"out: {GH.text}\n{KEYED.text}\n{PEM.text}\nend"
    store = open_store(blob_threshold=64 * 1024)
    sid = store.sessions.create().id
    read = WRITES[write](store, sid, text)
    shown = json.dumps(read(store), default=repr)
    for s in (GH, KEYED, PEM):
        assert s.secret[4:24] not in shown, (write, s.kind)
    assert "[REDACTED:github-token]" in shown and "[REDACTED:private-key]" in shown
    assert store.metrics()["redacted"]["github-token"] >= 1
    if engine == "sqlite":
        store.close()
        assert findings(tmp_path / "s.db") == []


def test_a_failing_handlers_secret_is_neither_kept_nor_logged(
    open_store: OpenStore, caplog: pytest.LogCaptureFixture
) -> None:
    """An exception's message prints what it was given (a URL with its token, a header):
    the worker keeps the error and the traceback redacted, and logs them redacted too,
    the traceback as text instead of the exception (a log file keeps a key as long as a
    database would)."""
    store = open_store()

    def call(e: Any) -> None:
        raise RuntimeError(f"401 from the API: {GH.text}")

    def deliberate(e: Any) -> None:
        raise fleetstore.FailEffect(f"refused: {KEYED.text}")

    retried = store.effects.enqueue("a", "call", max_attempts=2)
    refused = store.effects.enqueue("b", "deliberate")
    worker = fleetstore.Worker(
        store, {"call": call, "deliberate": deliberate}, until_idle=True, backoff=0.001
    )
    with caplog.at_level(logging.INFO, logger="fleetstore.worker"):
        worker.run()
    records = [r for r in caplog.records if hasattr(r, "effect_id")]
    assert len(records) == 3, [r.getMessage() for r in records]
    logged = caplog.text + "".join(json.dumps(r.failure) for r in records)  # type: ignore[attr-defined]
    kept = json.dumps(
        [[(x.error, x.traceback) for x in store.effects.get(e).errors] for e in (retried, refused)]
    )
    for shown in (logged, kept):
        assert GH.secret[4:24] not in shown and KEYED.secret not in shown
        assert "[REDACTED:github-token]" in shown and "[REDACTED:" in shown
    assert "Traceback (most recent call last)" in logged  # the traceback is still there
    assert kept.count("in call") == 2  # each attempt's traceback, from the handler's frame
    assert store.metrics()["redacted"]["github-token"] >= 2


def test_the_async_api_redacts_as_the_sync_one(tmp_path: Path) -> None:
    text = f"see {GH.text} and\n{KEYED.text}"

    async def main() -> list[Any]:
        store = await fleetstore.open_async(tmp_path / "s.db")
        sid = (await store.sessions.create()).id
        m = await store.messages.append(sid, "user", text)
        await store.state.put(sid, "k", {"v": text})
        eid = await store.effects.enqueue(sid, "k", {"v": text})
        async with store.messages.stream(sid) as reply:
            await reply.text(text[:7])
            await reply.flush()
            await reply.text(text[7:])
        out = [
            (await store.messages.get(m.id)).text,
            (await store.state.get(sid, "k")).value,
            (await store.effects.get(eid)).payload,
            (await store.messages.get(reply.id)).text,
        ]
        await store.close()
        return out

    got = asyncio.run(main())
    assert got == [redacted(text), {"v": redacted(text)}, {"v": redacted(text)}, redacted(text)]
    assert findings(tmp_path / "s.db") == []


# -- streams: a secret cut anywhere -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["github-token", "private-key", "env-secret", "url-password"])
def test_a_secret_cut_at_every_character_by_a_flush_is_caught(tmp_path: Path, kind: str) -> None:
    sample = SAMPLES[kind]
    text = "before é " + sample.text + " after"
    want = redacted(text)
    with fleetstore.open(tmp_path / "s.db", stream_flush_interval=600) as store:
        sid = store.sessions.create().id
        for cut in range(len(text) + 1):
            with store.messages.stream(sid) as reply:
                reply.text(text[:cut])
                reply.flush()  # the first piece is written now, the rest later
                reply.text(text[cut:])
            assert store.messages.get(reply.id).text == want, cut
    assert findings(tmp_path / "s.db") == []


def test_names_of_parts_are_redacted_and_append_returns_what_it_stored(tmp_path: Path) -> None:
    """A file or tool named after a token kept the token in the part's meta; and
    ``append`` returned the text it was given, not what it stored."""
    token = GH.secret
    with fleetstore.open(tmp_path / "s.db") as store:
        sid = store.sessions.create().id
        parts = [
            Text("out: " + GH.text),
            ToolCall(f"tool {token}", {"k": GH.text}, "c1"),
            ToolResult("c1", "fine", name=f"tool {token}"),
            File(b"data", "text/plain", f"key {token}.txt"),
        ]
        returned = store.messages.append(sid, "tool", parts)
        read = store.messages.get(returned.id)
        assert returned.parts == read.parts
        assert token not in repr(read.parts) and "[REDACTED:github-token]" in repr(read.parts)
        plain = store.messages.append(sid, "user", [Text("nothing here"), File(b"x", name="a")])
        assert plain.parts == (Text("nothing here"), File(b"x", name="a"))
    assert findings(tmp_path / "s.db") == []


@pytest.mark.parametrize("kind", ["github-token", "url-password"])
def test_a_secret_at_the_length_limit_of_a_streams_error_is_caught(
    tmp_path: Path, kind: str
) -> None:
    """The exception that ends a stream is kept as its error, cut to MAX_ERROR_TEXT: a
    secret across that limit was cut first, and the piece kept matched no rule."""
    line, secret = SAMPLES[kind].text, SAMPLES[kind].secret
    with fleetstore.open(tmp_path / "s.db") as store:
        sid = store.sessions.create().id
        for back in (5, len(secret) // 2, len(secret) - 3):  # of the secret kept
            at = len("RuntimeError: ") + 1 + line.index(secret) + back
            with pytest.raises(RuntimeError), store.messages.stream(sid) as reply:
                reply.text("hi")
                raise RuntimeError("x" * (MAX_ERROR_TEXT - at) + " " + line)
            error = store.messages.get(reply.id).error
            assert error is not None and len(error) <= MAX_ERROR_TEXT
            assert secret[: len(secret) // 3] not in error, (back, error[-60:])
    assert findings(tmp_path / "s.db") == []


def test_a_secret_cut_in_three_by_two_flushes_and_across_parts_is_caught(tmp_path: Path) -> None:
    rng = random.Random(29)
    with fleetstore.open(tmp_path / "s.db", stream_flush_interval=600) as store:
        sid = store.sessions.create().id
        for sample in samples():
            text = "x " + sample.text + " y"
            for _ in range(3):
                a, b = sorted(rng.sample(range(len(text) + 1), 2))
                with store.messages.stream(sid) as reply:
                    for piece in (text[:a], text[a:b], text[b:]):
                        reply.text(piece)
                        reply.flush()
                    reply.reasoning(text)  # another part: the text part ends here
                    reply.text(text[:b])
                (first, second, third) = store.messages.get(reply.id).parts
                assert first.text == redacted(text), (sample.kind, a, b)  # type: ignore[union-attr]
                assert second.text == redacted(text)  # type: ignore[union-attr]
                assert third.text == redacted(text[:b])  # type: ignore[union-attr]


def test_a_flush_that_failed_keeps_its_redacted_text_and_the_secret_stays_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "go " + GH.text + " on"
    with fleetstore.open(tmp_path / "s.db", stream_flush_interval=600) as store:
        sid = store.sessions.create().id
        real = store.submit
        failed: list[bool] = []

        def submit(op: Any, **kwargs: Any) -> Any:
            if op.name == "stream_write" and not failed:
                failed.append(True)
                raise errors.StoreBusy(str(store.path), 0.0, 1)
            return real(op, **kwargs)

        monkeypatch.setattr(store, "submit", submit)
        with store.messages.stream(sid) as reply:
            reply.text(text[:10])
            with pytest.raises(errors.StoreBusy):
                reply.flush()
            reply.text(text[10:])
        assert store.messages.get(reply.id).text == redacted(text)


# -- settings -----------------------------------------------------------------------------------


def test_redaction_off_stores_what_it_is_given(tmp_path: Path) -> None:
    with fleetstore.open(tmp_path / "s.db", redaction=False) as store:
        sid = store.sessions.create().id
        m = store.messages.append(sid, "user", GH.text)
        assert store.messages.get(m.id).text == GH.text
        assert store.metrics()["redacted"] == {}
    assert [f.kind for f in findings(tmp_path / "s.db")] == ["github-token"]


def test_a_users_rules_add_kinds_and_allow_strings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(
        "version = 1\n"
        f"allow = [{json.dumps(GH.secret)}]\n"
        "[[rule]]\n"
        'kind = "acme-token"\n'
        'prefixes = ["acme_live_"]\n'
        "body = '[A-Za-z0-9]{24}'\n"
    )
    acme = "acme_live_" + "Q7x" * 8
    monkeypatch.setenv("FLEETSTORE_REDACTION_RULES_FILE", str(rules))
    with fleetstore.open(tmp_path / "s.db") as store:
        sid = store.sessions.create().id
        m = store.messages.append(sid, "user", f"{acme} {GH.text} {KEYED.text}")
        assert store.messages.get(m.id).text == (
            f"[REDACTED:acme-token] {GH.text} {redacted(KEYED.text)}"
        )
        assert store.metrics()["redacted"] == {"acme-token": 1, "env-secret": 1}


def test_a_rules_file_that_cannot_be_used_is_refused_at_open(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[rule]]\nkind = "x"\nprefixes = ["x_"]\nbody = "[a-z]+"\n')  # unbounded
    with pytest.raises(errors.ConfigError, match="bound"):
        fleetstore.open(tmp_path / "s.db", redaction_rules_file=str(bad))
    # A setting refused before anything is made (it was NotFound, after the database).
    with pytest.raises(errors.ConfigError, match="no such rules file"):
        fleetstore.open(tmp_path / "t.db", redaction_rules_file=str(tmp_path / "none.toml"))
    assert not list(tmp_path.glob("[st].db*"))


# -- the screen ---------------------------------------------------------------------------------


def _forms(text: str, secret: str) -> list[tuple[str, Any]]:
    """A secret as the write path meets it: text, and JSON values (dumped)."""
    return [
        ("text", text),
        ("json", {"out": text}),
        ("json", [1, {"nested": {"deeper": text}}]),
        ("json", {"DB_PASSWORD": secret}),
        ("json", {"Authorization": "Bearer " + secret}),
        ("json", {"AccountKey": secret}),
        ("json", {"api_key": secret, "GITHUB_TOKEN": secret}),
    ]


def test_the_screen_finds_every_text_and_value_with_a_secret() -> None:
    """The write path searches one regex and stops there when it finds nothing: it must
    never say nothing where redaction would find something."""
    from fleetstore.core.validate import to_json

    redaction = write_redaction()
    checked = 0
    for sample in samples():
        for kind, value in _forms(sample.text, sample.secret):
            if kind == "text":
                hit = bool(R.find(value))
                text = value
            else:
                hit = bool(R.redact_value(value)[1])
                text = to_json(value)
            if hit:
                checked += 1
                assert redaction.screen(text) is not None, (sample.kind, value)
    assert checked > 3 * len(samples())


def test_the_screen_passes_ordinary_text_without_a_second_look() -> None:
    redaction = write_redaction()
    for text in ["question 7", "a.txt\nb.txt\n", '{"turn": 3, "messages": 12}', "Let me look."]:
        assert redaction.screen(text) is None
    assert isinstance(Redactor().screen.pattern, str)


# -- PostgreSQL: blob rows sealed, spool sealed -------------------------------------------------


def test_a_keyed_store_seals_its_blob_rows_on_every_engine(
    open_store: OpenStore, engine: str, tmp_path: Path
) -> None:
    from fleetstore.core.keys import Key, Keyring, write_keyring

    keys = tmp_path / "keys"
    write_keyring(keys, Keyring((Key.generate("k1"),)))
    store = open_store("k.db", encryption_key_file=str(keys), blob_threshold=1024)
    sid = store.sessions.create().id
    payload = "marker-in-a-blob " * 500
    m = store.messages.append(sid, "tool", payload)
    assert store.messages.get(m.id).text == payload
    if engine == "postgresql":
        rows = read_everywhere(store, "SELECT data FROM blob_chunks")
        data = b"".join(bytes(r[0]) for r in rows)
    else:
        base = tmp_path / ("k.db.blobs" if engine == "sqlite" else "k.db/catalog.db.blobs")
        data = b"".join(p.read_bytes() for p in base.rglob("*") if p.is_file() and p.name[0] != ".")
    assert data.startswith(b"fssealed") and b"marker-in-a-blob" not in data


# -- the frameworks' bodies ---------------------------------------------------------------------


def test_the_frameworks_bodies_are_redacted_where_they_are_written(tmp_path: Path) -> None:
    """LangGraph checkpoints and writes, Agents SDK items and ADK events go through the
    same entry as the API's payloads (their bodies are serialized bytes or JSON)."""
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.genai import types

    from fleetstore.integrations.adk import FleetstoreSessionService
    from fleetstore.integrations.langgraph import FleetstoreSaver
    from fleetstore.integrations.openai_agents import FleetstoreSession

    text = f"env:\n{GH.text}\n{KEYED.text}"
    with fleetstore.open(tmp_path / "s.db") as store:
        saver = FleetstoreSaver(store)
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        checkpoint: Any = {
            "v": 4,
            "id": "1",
            "ts": "2024-01-01T00:00:00+00:00",
            "channel_values": {"messages": text, "cfg": {"out": text, "n": 7}},
            "channel_versions": {"messages": 1, "cfg": 1},
            "versions_seen": {},
            "updated_channels": None,
        }
        saved = saver.put(config, checkpoint, {"step": 0}, {"messages": 1, "cfg": 1})
        saver.put_writes(saved, [("messages", text)], "task-1")
        got = saver.get_tuple(saved)
        assert got is not None
        # Serialized bodies (msgpack): each secret overwritten by a marker of its length,
        # so the body still decodes.
        values = got.checkpoint["channel_values"]
        written = [values["messages"], values["cfg"]["out"], got.pending_writes[0][2]]  # type: ignore[index]
        assert values["cfg"]["n"] == 7
        for body in written:
            assert len(body) == len(text) and body.startswith("env:\ntoken=[REDACTED:github-token]")
            assert GH.secret[4:24] not in body and KEYED.secret not in body, body

        async def agents_and_adk() -> tuple[Any, Any]:
            session = FleetstoreSession("conv", store)
            await session.add_items([{"role": "user", "content": text}])
            items = await session.get_items()
            svc = FleetstoreSessionService(store)
            s = await svc.create_session(app_name="app", user_id="u", session_id="a")
            ev = Event(
                author="user",
                content=types.Content(role="user", parts=[types.Part(text=text)]),
                actions=EventActions(state_delta={"out": text}),
            )
            await svc.append_event(s, ev)
            back = await svc.get_session(app_name="app", user_id="u", session_id="a")
            assert back is not None
            return items, back

        items, back = asyncio.run(agents_and_adk())
        assert items == [{"role": "user", "content": redacted(text)}]
        assert back.events[-1].content.parts[0].text == redacted(text)
        assert back.state["out"] == redacted(text)
    assert findings(tmp_path / "s.db") == []


# -- fleetstore redact: what a store already holds, exactly once --------------------------------


def _redact_ops(path: Path) -> tuple[int, int]:
    """(operations applied by fleetstore redact, distinct ids among them), read from the
    operation log by a connection of its own."""
    import apsw

    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        conn.set_busy_timeout(5000)
        ((n, distinct),) = conn.execute(
            "SELECT count(*), count(DISTINCT op_id) FROM applied_ops WHERE name LIKE 'mnt_redact%'"
        ).fetchall()
    finally:
        conn.close()
    return int(n), int(distinct)


def test_fleetstore_redact_killed_then_run_again_rewrites_each_row_exactly_once(
    tmp_path: Path,
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "s.db"
    secret = f"out {GH.text} x"
    n = 1200
    with fleetstore.open(path, redaction=False, stream_flush_interval=600) as store:
        sid = store.sessions.create().id
        plain = [store.messages.append(sid, "user", f"plain {i}").id for i in range(50)]
        for i in range(n):
            store.messages.append(sid, "user", f"{i} {secret}")
        store.state.put(sid, "env", {"GITHUB_TOKEN": GH.secret})
        store.effects.enqueue(sid, "notify", {"body": secret})
        with store.messages.stream(sid) as reply:
            reply.text(secret[:20])
            reply.flush()
            reply.text(secret[20:])
    rows = n + 3  # parts, the state value, the effect, the streamed part
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}
    argv = [sys.executable, "-m", "fleetstore", "redact", "--store", str(path), "--json"]
    with (tmp_path / "err").open("wb") as err:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 120
        while _redact_ops(path)[0] < 50 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "err").read_text()
    first, _ = _redact_ops(path)
    assert 50 <= first < rows  # killed in the middle

    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert sum(report["rewritten"].values()) == rows - first  # what the first run did is skipped
    assert report["changed_meanwhile"] == 0
    assert _redact_ops(path) == (rows, rows)  # every row once, never twice

    third = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0 and sum(json.loads(third.stdout)["rewritten"].values()) == 0
    assert _redact_ops(path) == (rows, rows)

    with fleetstore.open(path) as store:
        texts = [m.text for m in store.messages.list(sid, limit=10_000)]
        assert [m.text for m in map(store.messages.get, plain)] == [f"plain {i}" for i in range(50)]
        assert texts[50:52] == [redacted(f"0 {secret}"), redacted(f"1 {secret}")]
        assert texts[-1] == redacted(secret)
        assert store.state.get(sid, "env").value == {"GITHUB_TOKEN": "[REDACTED:github-token]"}
    assert findings(path) == []


def test_fleetstore_redact_on_a_sharded_store_leaves_no_copy_in_the_catalog(
    tmp_path: Path,
) -> None:
    """The catalog keeps a copy of each shard's session rows: the command closed
    without refreshing it, so titles and metadata stayed in catalog.db (listed,
    scanned, backed up) and a second run said it had nothing to do.  A copy left so
    by such a run is refreshed too."""
    import os
    import subprocess
    import sys

    root = tmp_path / "sh"
    url = f"sqlite+sharded://{root}"
    with fleetstore.open(url, redaction=False) as store:
        sid = store.sessions.create("deploy " + GH.text, metadata={"out": GH.text}).id
        other = store.sessions.create("plain").id
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}
    argv = [sys.executable, "-m", "fleetstore", "redact", "--store", url]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert GH.secret.encode() not in (root / "catalog.db").read_bytes()
    assert findings(root) == []
    with fleetstore.open(url) as store:
        titles = {s.id: s.title for s in store.sessions.list()}
        assert titles == {sid: "deploy " + GH.redacted, other: "plain"}, titles

        def stale(key: Any, db: Any) -> None:  # the catalog's copy, as a run before left it
            if key is None:
                title = "deploy " + GH.text
                db.run_write(
                    lambda tx: tx.execute(
                        "UPDATE sessions SET title = ? WHERE id = ?", (title, sid)
                    )
                )

        store.backend.each(stale)
    assert findings(root) != []
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert findings(root) == []
    assert GH.secret.encode() not in (root / "catalog.db").read_bytes()


def test_fleetstore_redact_rewrites_titles_metadata_and_errors_once(
    open_store: OpenStore, engine: str, tmp_path: Path
) -> None:
    """What the write path now redacts but a store may hold from before: session titles
    and metadata, message metadata, a stream's error, an effect's errors and tracebacks.
    Each row rewritten once, in the file that holds it; a second run finds nothing."""
    from fleetstore.admin.redact import redact_store

    text = f"401 from {GH.text}"
    meta = {"cmd": text, "env": {"GITHUB_TOKEN": GH.secret}}
    store = open_store(redaction=False)
    sid = store.sessions.create(title=text, metadata=meta).id
    clean = store.sessions.create(title="nothing to see").id
    mid = store.messages.append(sid, "user", "hi", metadata=meta).id
    with pytest.raises(RuntimeError), store.messages.stream(sid) as reply:
        reply.text("partial")
        raise RuntimeError(text)
    eid = store.effects.enqueue("t", "hook", {}, max_attempts=2)
    (claim,) = store.effects.claim("w", kinds=["hook"])
    claim.retry(0.0, error=text, traceback=f"Traceback:\n  {text}")

    def shown(s: Store) -> str:
        e = s.effects.get(eid)
        return json.dumps(
            [
                [(x.title, x.metadata) for x in map(s.sessions.get, (sid, clean))],
                [(x.title, x.metadata) for x in s.sessions.list(limit=10)],
                [(m.metadata, m.error) for m in map(s.messages.get, (mid, reply.id))],
                [e.last_error, [(x.error, x.traceback) for x in e.errors]],
            ],
            default=repr,
        )

    assert shown(store).count(GH.secret[4:24]) >= 8  # stored as given
    # Rows no write of fleetstore's makes (damaged by hand) are left alone, not a crash.
    junk_sid = store.sessions.create(title=text).id
    junk_eid = store.effects.enqueue("u", "hook", {"body": text})

    def damage(_key: Any, db: Any) -> None:
        db.run_write(
            lambda tx: (
                tx.execute("UPDATE sessions SET metadata = 'not json' WHERE id = ?", (junk_sid,)),
                tx.execute("UPDATE effects SET errors = 'not json' WHERE id = ?", (junk_eid,)),
            )
        )

    store.backend.each(damage)

    first = redact_store(store)
    assert dict(first.rewritten) == {"sessions": 1, "messages": 2, "effects": 1}, first.to_json()
    assert first.changed_meanwhile == 0

    def remove(_key: Any, db: Any) -> None:  # (reads of such rows are not this test's)
        db.run_write(
            lambda tx: (
                tx.execute("DELETE FROM sessions WHERE id = ?", (junk_sid,)),
                tx.execute("DELETE FROM effects WHERE id = ?", (junk_eid,)),
            )
        )

    store.backend.each(remove)
    after = shown(store)
    assert GH.secret[4:24] not in after and after.count("[REDACTED:github-token]") >= 8, after
    assert "nothing to see" in after and "partial" not in after
    second = redact_store(store)
    assert sum(second.rewritten.values()) == 0 and second.already == 0, second.to_json()
    if engine == "sqlite":
        store.close()
        assert findings(tmp_path / "s.db") == []


# -- an encrypted fleet with secrets: no file it leaves holds a marker --------------------------

MARKER = "zebra-quartz-marker-4417"

_WORKER = """
import os, signal, sys
import fleetstore
from fleetstore.models import Text, ToolCall, ToolResult
from tests.secret_samples import samples

path, wid, mode = sys.argv[1], sys.argv[2], sys.argv[3]
marker = {marker!r}
secrets = "\\n".join(s.text for s in samples())
store = fleetstore.open(path, blob_threshold=4096, write_budget=0.3, stream_flush_interval=600)
sid = store.sessions.create(title=f"{{marker}} {{wid}}").id
if mode == "spool":  # the writer gate is held: every write below goes to the spool
    for i in range(5):
        store.messages.append(sid, "user", f"{{marker}} spooled {{i}}\\n{{secrets}}")
    print("spooled", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # its journal is left for the next opening
for i in range(10):
    store.messages.append(sid, "user", f"{{marker}} {{wid}} {{i}}\\n{{secrets}}")
store.messages.append(sid, "tool", [
    ToolCall("bash", {{"cmd": marker, "env": {{"GITHUB_TOKEN": "{gh}"}}}}),
    ToolResult("c1", (marker + " ") * 600 + secrets),  # a blob
    ToolResult("c2", (marker + secrets).encode()),
])
store.state.put(sid, "k", {{"v": marker + " " + secrets}})
eid = store.effects.enqueue(sid, "notify", {{"p": marker + " " + secrets}})
for claim in store.effects.claim(wid, kinds=["notify"], limit=10):
    claim.succeed({{"r": marker + " " + secrets}})
with store.messages.stream(sid) as reply:
    for k in range(0, len(secrets), 7):  # a secret cut by every flush
        reply.text(secrets[k : k + 7])
        reply.flush()
    if mode == "die":
        os.kill(os.getpid(), signal.SIGKILL)  # a reply left streaming, its WAL behind
store.close()
print("done", flush=True)
"""


def _files_holding(root: Path, needles: list[bytes], skip: set[Path]) -> list[list[str]]:
    """[file, needle] for every regular file under *root* holding one of *needles*, read
    by a process of its own: a file this process closes drops the POSIX locks its open
    store holds on it (SQLite's), and that store then read a database it called
    malformed."""
    import subprocess
    import sys

    code = (
        "import json, sys, pathlib, zstandard\n"
        "def read(p):\n"
        "    data = p.read_bytes()\n"
        "    try:  # a blob or an export written compressed, not sealed\n"
        "        return data + zstandard.ZstdDecompressor().decompressobj().decompress(data)\n"
        "    except zstandard.ZstdError:\n"
        "        return data\n"
        "root, needles, skip = pathlib.Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3:]\n"
        "found = [[str(p.relative_to(root)), n] for p in sorted(root.rglob('*'))\n"
        "         if p.is_file() and str(p) not in skip for n in needles\n"
        "         if n.encode() in read(p)]\n"
        "print(json.dumps(found))\n"
    )
    argv = [sys.executable, "-c", code, str(root), json.dumps([n.decode() for n in needles])]
    done = subprocess.run([*argv, *map(str, skip)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


@pytest.mark.slow
def test_an_encrypted_fleet_with_secrets_leaves_no_marker_and_no_secret_in_any_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawn: Any
) -> None:
    import subprocess
    import sys

    from fleetstore.core.keys import Key, Keyring, write_keyring
    from tests.fix_procs import start_lock

    keys = tmp_path / "keys"
    write_keyring(keys, Keyring((Key.generate("k1"),)))
    ring = Keyring.load(keys)
    monkeypatch.setenv("FLEETSTORE_ENCRYPTION_KEY_FILE", str(keys))
    path = tmp_path / "s.db"
    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(marker=MARKER, gh=GH.secret))
    skip = {keys, script}
    needles = [MARKER.encode()] + [s.secret[4:24].encode() for s in samples()]

    from tests.fix_faults import importable_env

    def worker(wid: str, mode: str) -> subprocess.Popen[bytes]:
        # The script imports tests.secret_samples: the repository on its PYTHONPATH
        # (a script's own directory is its first path, not the working directory).
        argv = [sys.executable, str(script), str(path), wid, mode]
        return subprocess.Popen(
            argv, env=importable_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    # The test's own store keeps the WAL from being checkpointed away while it is searched.
    with fleetstore.open(path, checkpoint_bytes=1 << 30) as store:
        fleet = [worker(f"w{i}", "die" if i == 0 else "write") for i in range(4)]
        codes = [p.wait(120) for p in fleet]
        assert sorted(codes) == [-9, 0, 0, 0], codes

        lock, _ = start_lock(spawn, str(path), hold=3.0)
        spooler = worker("s", "spool")
        assert spooler.wait(60) == -9
        journals = list((tmp_path / "s.db.spool").glob("*.jsonl"))
        assert journals and all(j.stat().st_size > 0 for j in journals)
        assert (tmp_path / "s.db-wal").stat().st_size > 4096
        assert _files_holding(tmp_path, needles, skip) == []  # the WAL, blobs, the journal
        assert lock.finish(30) == 0

        after = worker("w9", "write")  # its opening replays the dead journal
        assert after.wait(120) == 0
        titles = {s.title for s in store.sessions.list(limit=100)}
        assert {f"{MARKER} w{i}" for i in (0, 1, 2, 3, 9)} | {f"{MARKER} s"} <= titles
        spooled = [s for s in store.sessions.list(limit=100) if s.title == f"{MARKER} s"]
        texts = [m.text for m in store.messages.list(spooled[0].id)]
        assert len(texts) == 5 and all("[REDACTED:" in t for t in texts)

        for cmd in (["export", "-o", str(tmp_path / "e.fsx")], ["backup", str(tmp_path / "bk")]):
            done = subprocess.run(
                [sys.executable, "-m", "fleetstore", *cmd, "--store", str(path)],
                capture_output=True,
                timeout=300,
            )
            assert done.returncode == 0, done.stderr
        found = _files_holding(tmp_path, needles, skip)
        assert found == []
        assert (tmp_path / "e.fsx").stat().st_size and list((tmp_path / "bk").glob("*.db"))
    # Read with the key, everything written is there and no secret is.
    scanned: list[ScanFinding] = []
    report = scan(path, scanned.append, keyring=ring)
    assert scanned == [] and not report.errors


def test_fleetstore_redact_rewrites_a_postgresql_store(pg_url: str) -> None:
    """Its bytea columns take the redacted bodies through fleetstore_bytes(), as every
    other write does (the statements were run on SQLite only)."""
    import os
    import subprocess
    import sys

    secret = f"out {GH.text} x"
    with fleetstore.open(pg_url, redaction=False) as store:
        sid = store.sessions.create().id
        mid = store.messages.append(sid, "user", secret).id
        store.state.put(sid, "env", {"GITHUB_TOKEN": GH.secret})
        eid = store.effects.enqueue(sid, "notify", {"body": secret})
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}
    argv = [sys.executable, "-m", "fleetstore", "redact", "--store", pg_url, "--json"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with fleetstore.open(pg_url, redaction=False) as store:
        kept = [
            str(store.messages.get(mid).parts),
            str(store.state.get(sid, "env").value),
            str(store.effects.get(eid).payload),
        ]
    assert all(GH.secret not in k and "[REDACTED:" in k for k in kept), kept
