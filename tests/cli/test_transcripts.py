"""``fleetstore sessions show``: a session's conversation as text, Markdown or JSON, cut
to a width, with its subagents where they were spawned, written to a file whole or not
at all; a session of 100,000 messages in bounded memory (issue 28: ``sessions show``
printed counts only).  Real stores, the CLI in its own process."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore import File, ToolResult
from fleetstore.admin.transcript import DEFAULT_WIDTH
from fleetstore.core.ids import new_id
from tests.fix_stores import OpenStore

BIG = "".join(f"line {i}: all good\n" for i in range(150_000))  # 2.7 MB: a blob


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}


def show(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetstore", "sessions", "show", *args, "--store", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def conversation(tmp_path: Path) -> dict[str, Any]:
    """A session with a user message, a streamed reply (reasoning, text, a tool call
    whose output is a 2.7 MB blob, usage), a binary tool output and a file, a reply
    that ended in an error; a subagent spawned after the first reply, with a subagent
    of its own, and a last message after them."""
    path = tmp_path / "s.db"
    with fleetstore.open(path) as store:
        s = store.sessions.create(title="fix the flaky test", project="/src/app")
        store.messages.append(s.id, "user", "why does test_x flake?")
        with store.messages.stream(s.id, model="m-1") as reply:
            reply.reasoning("It may be a race.")
            reply.text("Let me run it.")
            call = reply.tool_call("bash", {"cmd": "pytest -x", "n": 3}, call_id="call-1")
            call.result(BIG)
            reply.usage(input_tokens=1200, output_tokens=310, cost=0.5)
        store.messages.append(
            s.id,
            "tool",
            [
                ToolResult("call-2", b"\xff\x00binary", name="dump"),
                File(b"PNG", "image/png", "a.png"),
            ],
        )
        with pytest.raises(RuntimeError), store.messages.stream(s.id) as reply:
            reply.text("half a reply")
            raise RuntimeError("model timed out")
        sub = store.sessions.create(title="investigate", parent_id=s.id)
        store.messages.append(sub.id, "user", "look at conftest.py")
        subsub = store.sessions.create(title="grep", parent_id=sub.id)
        store.messages.append(subsub.id, "assistant", "3 matches")
        store.messages.append(sub.id, "assistant", "found the race")
        store.messages.append(s.id, "assistant", "Fixed it.")
    return {"path": path, "id": s.id, "sub": sub.id, "subsub": subsub.id}


def test_text_shows_roles_text_tools_usage_and_errors_cut_to_a_width(
    conversation: dict[str, Any],
) -> None:
    done = show(conversation["path"], conversation["id"])
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"session {conversation['id']}  fix the flaky test" in out
    assert "usage: 1,200 in, 310 out, cost 0.5" in out  # the session's total
    for shown in (
        "#1 user",
        "why does test_x flake?",
        "#2 assistant",
        "model m-1",
        "[reasoning]",
        "It may be a race.",
        "Let me run it.",
        "→ tool call bash (call-1)",
        '{"cmd": "pytest -x", "n": 3}',
        "← tool result bash (call-1)",
        f"[{len(BIG):,} characters, cut to {DEFAULT_WIDTH}]",
        "[8 bytes of binary output]",
        "[file a.png (image/png), 3 bytes]",
        "ended in error: RuntimeError: model timed out",
        "half a reply",
        "Fixed it.",
    ):
        assert shown in out, shown
    assert "line 20: all good" in out and "line 149999" not in out  # cut
    assert "investigate" not in out  # subagents only with --tree
    assert len(out) < 10_000

    whole = show(conversation["path"], conversation["id"], "--width", "0")
    assert "line 149999: all good" in whole.stdout


def test_markdown_file_and_json_hold_the_whole_conversation(
    conversation: dict[str, Any], tmp_path: Path
) -> None:
    md = tmp_path / "out" / "t.md"
    md.parent.mkdir()
    done = show(conversation["path"], conversation["id"], "--format", "markdown", "-o", str(md))
    assert done.returncode == 0, done.stderr
    assert "1 session(s), 5 message(s)" in done.stderr and done.stdout == ""
    assert md.stat().st_mode & 0o777 == 0o600  # sessions carry secrets
    assert [p.name for p in md.parent.iterdir()] == ["t.md"]  # no temporary file left
    text = md.read_text()
    assert text.startswith(f"\n# Session `{conversation['id']}`: fix the flaky test")
    assert "## #2 assistant" in text and "> It may be a race." in text
    assert '```json\n{"cmd": "pytest -x", "n": 3}\n```' in text
    assert "**Tool result** `bash` (`call-1`)" in text and "cut to 500" in text

    done = show(conversation["path"], conversation["id"], "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["transcript_version"] == 1 and data["session"]["id"] == conversation["id"]
    assert data["usage"]["input_tokens"] == 1200 and data["subagents"] == []
    messages = data["messages"]
    assert [m["seq"] for m in messages] == [1, 2, 3, 4, 5]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "assistant"]
    reply = messages[1]
    assert [p["kind"] for p in reply["parts"]] == ["reasoning", "text", "tool_call", "tool_result"]
    assert reply["parts"][2]["arguments"] == {"cmd": "pytest -x", "n": 3}
    assert reply["parts"][3]["output"] == BIG and "cut" not in reply["parts"][3]  # whole
    assert reply["usage"]["output_tokens"] == 310 and reply["model"] == "m-1"
    binary, image = messages[2]["parts"]
    assert binary["output"] == {"base64": "/wBiaW5hcnk="}
    assert image == {
        "kind": "file",
        "name": "a.png",
        "mime_type": "image/png",
        "bytes": 3,
        "data": {"base64": "UE5H"},
    }
    assert messages[3]["status"] == "error" and "model timed out" in messages[3]["error"]

    cut = json.loads(
        show(conversation["path"], conversation["id"], "--json", "--width", "10").stdout
    )
    result = cut["messages"][1]["parts"][3]
    assert result["output"] == BIG[:10] and result["cut"] == len(BIG)


def test_tree_places_each_subagent_where_it_was_spawned(conversation: dict[str, Any]) -> None:
    done = show(conversation["path"], conversation["id"], "--tree")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    order = [
        out.index("ended in error"),  # the parent's 4th message
        out.index(f"┌ subagent {conversation['sub']}"),
        out.index("│ #1 user"),
        out.index(f"│ ┌ subagent {conversation['subsub']}"),
        out.index("│ │ #1 assistant"),
        out.index("found the race"),
        out.index(f"└ end of subagent {conversation['sub']}"),
        out.index("Fixed it."),  # the parent's 5th, after the subagent
    ]
    assert order == sorted(order), out

    tree_json = show(conversation["path"], conversation["id"], "--tree", "--json").stdout
    # One object on one line, as every --json object (docs/cli.md "JSON output"), a
    # tree's and a message's newlines included.
    assert len(tree_json.splitlines()) == 1
    data = json.loads(tree_json)
    [sub] = data["subagents"]
    assert sub["session"]["id"] == conversation["sub"] and sub["after_seq"] == 4
    assert [m["parts"][0]["text"] for m in sub["messages"]] == [
        "look at conftest.py",
        "found the race",
    ]
    [subsub] = sub["subagents"]
    assert subsub["session"]["id"] == conversation["subsub"] and subsub["after_seq"] == 1
    assert subsub["subagents"] == [] and len(subsub["messages"]) == 1

    md = show(conversation["path"], conversation["id"], "--tree", "--format", "markdown").stdout
    assert "\n### Subagent `" in md and "\n##### Subagent `" in md and "\n###### #1" in md


def test_bad_options_are_usage_errors(conversation: dict[str, Any]) -> None:
    sid = conversation["id"]
    for args in (
        ["--json", "--format", "markdown"],
        ["--summary", "--tree"],
        ["--width", "-1"],
        ["--format", "html"],
    ):
        done = show(conversation["path"], sid, *args)
        assert done.returncode == 2, (args, done.stderr)


def _fill(store: fleetstore.Store, sid: str, count: int, text: str) -> None:
    """*count* messages of *text* in one transaction: rows as append_message writes them
    (a test of reading; 100,000 appends would take minutes)."""
    now = time.time()
    with store.db.write() as tx:
        for seq in range(1, count + 1):
            mid = new_id()
            tx.execute(
                "INSERT INTO messages (id, session_id, seq, role, status, metadata, created_at, "
                "completed_at) VALUES (?, ?, ?, ?, 'complete', '{}', ?, ?)",
                (mid, sid, seq, "user" if seq % 2 else "assistant", now, now),
            )
            tx.execute(
                "INSERT INTO parts (message_id, seq, session_id, kind, meta, enc, body, size) "
                "VALUES (?, 0, ?, 'text', '{}', 'str', ?, ?)",
                (mid, sid, f"{seq} {text}", len(text)),
            )


#: Runs ARGV[1:] as ``python -m fleetstore`` or as a script, then prints on stderr the
#: peak resident memory of this process's own address space (``VmHWM``): ``ru_maxrss``
#: would count the pages of the test process it was forked from.
_MEASURED = """
import atexit, runpy, sys
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            print("VmHWM", line.split()[1], file=sys.stderr)
atexit.register(peak)
if sys.argv[1] == "-m":
    sys.argv = ["fleetstore", *sys.argv[3:]]
    runpy.run_module("fleetstore", run_name="__main__")
else:
    exec(sys.argv[1], {"argv": sys.argv[2:]})
"""


def peak_kib(*args: str) -> tuple[int, subprocess.CompletedProcess[str]]:
    done = subprocess.run(
        [sys.executable, "-c", _MEASURED, *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
    )
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("VmHWM "), done.stderr
    return int(last.split()[1]), done


@pytest.mark.slow
def test_a_session_of_100000_messages_is_shown_in_bounded_memory(tmp_path: Path) -> None:
    """100,000 messages of 1 KB (100 MB of text) and a 2.7 MB tool output: the JSON
    transcript streamed to a file holds them all, in order, while the process showing
    it stays far below one that reads the session whole (each measured in a process of
    its own)."""
    path = tmp_path / "long.db"
    with fleetstore.open(path) as store:
        sid = store.sessions.create(title="long").id
        _fill(store, sid, 100_000, "x" * 1000)
        store.messages.append(sid, "tool", [ToolResult("c", BIG, name="bash")])
    out = tmp_path / "long.json"
    streamed, done = peak_kib(
        "-m", "fleetstore", "sessions", "show", sid, "--json", "-o", str(out), "--store", str(path)
    )
    assert done.returncode == 0, done.stderr
    assert "1 session(s), 100001 message(s)" in done.stderr
    read_whole = (
        "import fleetstore; s = fleetstore.open(argv[0]); print(len(s.messages.list(argv[1])))"
    )
    loaded, whole = peak_kib(read_whole, str(path), sid)
    assert whole.stdout.strip() == "100001", whole.stderr

    data = json.loads(out.read_text())
    assert len(data["messages"]) == 100_001
    assert [m["seq"] for m in data["messages"][:3]] == [1, 2, 3]
    assert data["messages"][99_999]["parts"][0]["text"].startswith("100000 x")
    assert data["messages"][-1]["parts"][0]["output"] == BIG
    print(f"peak RSS: shown {streamed / 1024:.0f} MiB, read whole {loaded / 1024:.0f} MiB")
    # Read whole, the session holds 100 MB of text and 100,000 messages at once.
    assert loaded > 200 * 1024
    assert streamed < 100 * 1024 and streamed * 3 < loaded


def test_iterate_reads_every_message_a_page_at_a_time_on_every_engine(
    open_store: OpenStore,
) -> None:
    """``store.messages.iterate``, what the transcript reads through: the same messages
    as ``list``, in order, across pages, blobs included; a message appended while it
    runs comes at the end; ``NotFound`` for no session; the async iterator too."""
    store = open_store("it.db")
    s = store.sessions.create()
    for i in range(7):
        parts = [ToolResult(f"c{i}", BIG, name="bash")] if i == 3 else f"m{i}"
        store.messages.append(s.id, "user", parts)
    found = store.messages.iterate(s.id, page=3)
    first = [next(found) for _ in range(4)]
    store.messages.append(s.id, "user", "late")
    rest = list(found)
    assert [m.seq for m in first + rest] == list(range(1, 9))
    assert first + rest == store.messages.list(s.id)
    assert first[3].parts[0].output == BIG  # type: ignore[union-attr]
    assert [m.seq for m in store.messages.iterate(s.id, after=6, page=1)] == [7, 8]
    with pytest.raises(fleetstore.errors.NotFound):
        next(store.messages.iterate(new_id()))
    with pytest.raises(fleetstore.errors.InvalidInput):
        next(store.messages.iterate(s.id, page=0))

    async def collect() -> list[int | None]:
        async with await fleetstore.open_async(store.url) as aio:
            return [m.seq async for m in aio.messages.iterate(s.id, page=2)]

    assert asyncio.run(collect()) == list(range(1, 9))


def test_a_message_damaged_by_hand_is_a_clear_error_in_show_and_export(tmp_path: Path) -> None:
    """Metadata another program left that is not JSON: ``sessions show`` and ``export``
    exit 1 naming the message, with no traceback, and the export writes no file."""
    import apsw

    path = tmp_path / "s.db"
    with fleetstore.open(path) as store:
        sid = store.sessions.create("damaged").id
        store.messages.append(sid, "user", "hi", id="m-damaged")
    conn = apsw.Connection(str(path))
    conn.execute("UPDATE messages SET metadata = '{' WHERE id = 'm-damaged'")
    conn.close()
    out = tmp_path / "out.jsonl"
    export = [sys.executable, "-m", "fleetstore", "export", "--store", str(path), "-o", str(out)]
    for done in (
        show(path, sid),
        subprocess.run(export, capture_output=True, text=True, timeout=300, env=clean_env()),
    ):
        assert done.returncode == 1, done
        assert "stored message 'm-damaged' does not decode" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert not out.exists()


def test_control_characters_of_the_data_never_reach_the_terminal(tmp_path: Path) -> None:
    """A title, a text, an effect's error holding ESC sequences (clear the screen, set
    the window title): printed as they were by the text outputs, shown as their
    pictures now; JSON escapes them anyway."""
    path = tmp_path / "s.db"
    clear, title = "\x1b[2J\x1b[H", "\x1b]0;pwned\x07"
    with fleetstore.open(path) as store:
        sid = store.sessions.create(f"deploy {clear}done").id
        store.messages.append(sid, "tool", f"output {title} zebra\x9b31m and\x7f")
        store.search.catch_up()
        eid = store.effects.enqueue("t", "k", {"n": 1}, max_attempts=1)
        (claim,) = store.effects.claim("w", kinds=["k"])
        claim.fail(f"failed {clear}", traceback=f"Traceback:\n  {title}")

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "fleetstore", *args, "--store", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            env=clean_env(),
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout

    for args in (
        ["sessions", "list"],
        ["sessions", "show", sid],
        ["sessions", "show", sid, "--summary"],
        ["effects", "list"],
        ["effects", "show", eid],
        ["search", "zebra"],
    ):
        out = cli(*args)
        assert not any(c in out for c in "\x1b\x07\x9b\x7f"), (args, out)
    assert "␛[2J" in cli("sessions", "list") and "␛]0;pwned␇" in cli("sessions", "show", sid)
