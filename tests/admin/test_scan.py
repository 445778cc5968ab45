"""``fleetstore scan``, with real files and processes: it finds the secrets a store keeps
(session metadata, inline parts, blob files, streamed text cut across flushes, state,
effects, spool journals), another program's SQLite file (live, in WAL mode, with -wal and
-shm), a directory of JSONL transcripts and a sharded store; it says where, never what;
its exit codes; and it writes nothing, not a byte, an mtime or a side file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore.core.ids import new_id
from fleetstore.domain.operations import Operation
from fleetstore.models import ToolCall, ToolResult
from fleetstore.store.spool import encode_line
from tests.cli.test_read_only import clean_env, snapshot
from tests.secret_samples import Sample, samples

S = {s.kind: s for s in samples()}


def cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetstore", "scan", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
    )


def scan_json(path: Path | str, *extra: str) -> tuple[int, list[dict[str, Any]], dict[str, Any]]:
    done = cli(str(path), "--json", *extra)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines and "summary" in lines[-1], done.stdout + done.stderr
    return done.returncode, lines[:-1], lines[-1]["summary"]


def assert_never_shown(done: subprocess.CompletedProcess[str], *secrets: Sample) -> None:
    out = done.stdout + done.stderr
    for s in secrets:
        # No stretch of the secret past its first 4 characters appears anywhere.
        assert s.secret[4:20] not in out, s.kind


# -- a fleetstore store -------------------------------------------------------------------


def store_with_secrets(path: Path) -> dict[str, str]:
    """A store holding one secret in each place a store keeps content; the ids.  (With
    redaction off: on, none would be stored; a store made before redaction, or with it
    off, is what scan is for.)"""
    with fleetstore.open(
        path, blob_threshold=4096, stream_flush_interval=1000, redaction=False
    ) as store:
        sid = store.sessions.create(title="t", metadata={"note": S["aws-access-key-id"].text}).id
        user = store.messages.append(sid, "user", "run it with " + S["openai-key"].secret)
        tool = store.messages.append(
            sid,
            "assistant",
            [
                ToolCall("bash", {"cmd": "curl", "headers": {"Authorization": "Bearer 9abcdefghijklmnopqrst"}}, call_id="c1"),
                ToolResult("c1", "x" * 5000 + "\n" + S["private-key"].text + "\n" + "y" * 5000),
            ],
        )  # fmt: skip
        with store.messages.stream(sid) as stream:
            text = "the token is " + S["slack-token"].secret + " ok"
            # Flushed every 5 characters: the token lies across many chunk rows.
            for i in range(0, len(text), 5):
                stream.text(text[i : i + 5])
                stream.flush()
            streamed = stream.id
        store.state.put(sid, "env", {"GITHUB_TOKEN": S["github-token"].secret, "HOME": "/h"})
        store.effects.enqueue("th", "notify", {"url": S["slack-webhook"].secret})
    return {"session": sid, "user": user.id, "tool": tool.id, "streamed": streamed}


def spool_journal(path: Path, session_id: str) -> Path:
    spool = Path(str(path) + ".spool")
    spool.mkdir(mode=0o700, exist_ok=True)
    journal = spool / f"{os.getpid()}-{os.urandom(6).hex()}.jsonl"
    op = Operation(
        "put_state",
        {"session_id": session_id, "namespace": "default", "key": "k",
         "value": {"enc": "json", "json": {"dsn": S["url-password"].text}}},
        new_id(),
    )  # fmt: skip
    journal.write_bytes(encode_line(op))
    journal.chmod(0o600)
    return journal


def test_a_store_is_scanned_everywhere_it_keeps_content(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    ids = store_with_secrets(path)
    journal = spool_journal(path, ids["session"])
    before = snapshot(tmp_path)
    rc, findings, summary = scan_json(path)
    assert snapshot(tmp_path) == before
    assert rc == 1
    by_kind = {f["kind"]: f for f in findings}
    assert summary["by_kind"] == {
        "authorization-header": 1, "aws-access-key-id": 1, "github-token": 1,
        "openai-key": 1, "private-key": 1, "slack-token": 1, "slack-webhook": 1,
        "url-password": 1,
    }  # fmt: skip
    meta = by_kind["aws-access-key-id"]
    assert (meta["table"], meta["column"], meta["row"]) == (
        "sessions", "metadata", {"id": ids["session"]},
    )  # fmt: skip
    assert meta["json_path"] == "$.note"
    user = by_kind["openai-key"]
    assert user["table"] == "parts" and user["row"]["message_id"] == ids["user"]
    assert user["row"]["session_id"] == ids["session"]
    args = by_kind["authorization-header"]
    assert (
        args["row"]["message_id"] == ids["tool"] and args["json_path"] == "$.headers.Authorization"
    )
    # The tool output went to a blob file: the finding names the rows that refer to it.
    blob = by_kind["private-key"]
    assert blob["path"].startswith(str(path) + ".blobs/") and blob["offset"] == 5001 + S[
        "private-key"
    ].text.index(S["private-key"].secret)
    assert blob["referenced_by"] == [
        {
            "table": "parts",
            "row": {"message_id": ids["tool"], "seq": 1, "session_id": ids["session"]},
        }
    ]
    streamed = by_kind["slack-token"]
    assert (streamed["table"], streamed["row"]["message_id"]) == ("chunks", ids["streamed"])
    assert streamed["offset"] == len("the token is ") % 5
    state = by_kind["github-token"]
    assert state["table"] == "state" and state["json_path"] == "$.GITHUB_TOKEN"
    assert by_kind["slack-webhook"]["table"] == "effects"
    spooled = by_kind["url-password"]
    assert spooled["path"] == str(journal) and spooled["line"] == 1
    assert spooled["json_path"] == "$.args.value.json.dsn"
    assert summary["scanned"]["blobs"] == 1 and summary["scanned"]["journals"] == 1
    # The blob directory or the spool named alone.
    for side, kind in ((".blobs", "private-key"), (".spool", "url-password")):
        rc, alone, _ = scan_json(str(path) + side)
        assert rc == 1 and [f["kind"] for f in alone] == [kind], side
    assert snapshot(tmp_path) == before
    for f in findings:
        assert len(f["preview"]) <= 5 and f["preview"].endswith("…")
        assert f["fingerprint"].startswith("sha256:") and len(f["fingerprint"]) == 19


def test_the_text_report_says_where_and_never_what(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    ids = store_with_secrets(path)
    done = cli(str(path))
    assert done.returncode == 1, done.stderr
    assert_never_shown(done, *S.values())
    assert (
        f"parts(message_id={ids['user']}, seq=0, session_id={ids['session']}).body" in done.stdout
    )
    assert "7 secret(s) found" in done.stdout
    json_done = cli(str(path), "--json")
    assert_never_shown(json_done, *S.values())


def test_a_secret_streamed_across_flushes_is_found_at_every_cut(tmp_path: Path) -> None:
    """A streamed reply is stored as chunk rows, one per flush: scan reads a part's chunks
    as one text, so a token cut by a flush at any character is found once."""
    secret = S["github-token"].secret
    text = "prefix " + secret + " suffix"
    path = tmp_path / "s.db"
    with fleetstore.open(path, stream_flush_interval=1000, redaction=False) as store:
        sid = store.sessions.create().id
        for cut in range(1, len(text)):
            with store.messages.stream(sid) as stream:
                stream.text(text[:cut])
                stream.flush()
                stream.text(text[cut:])
    rc, findings, summary = scan_json(path)
    assert rc == 1
    assert summary["by_kind"] == {"github-token": len(text) - 1}
    assert {f["fingerprint"] for f in findings} == {findings[0]["fingerprint"]}


def test_a_clean_store_exits_0(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with fleetstore.open(path) as store:
        sid = store.sessions.create(title="clean").id
        store.messages.append(sid, "user", "nothing to hide: sha 3f9a1c2b7d4e5f60718293a4b5c6d7e8")
    rc, findings, summary = scan_json(path)
    assert (rc, findings, summary["findings"]) == (0, [], 0)
    assert summary["scanned"]["databases"] == 1 and summary["scanned"]["rows"] > 0


# -- another program's files ----------------------------------------------------------------

LIVE_FOREIGN = """
import sys, apsw
conn = apsw.Connection(sys.argv[1])
conn.execute("PRAGMA journal_mode=WAL")
conn.execute("PRAGMA wal_autocheckpoint=0")
conn.execute("CREATE TABLE session(id TEXT PRIMARY KEY, title TEXT)")
conn.execute("CREATE TABLE part(id TEXT PRIMARY KEY, message_id TEXT, session_id TEXT, data TEXT)")
conn.execute("CREATE TABLE kv(k TEXT, v BLOB, PRIMARY KEY (k)) WITHOUT ROWID")
conn.execute("CREATE TABLE odd(rowid TEXT, oid TEXT, _rowid_ TEXT, x TEXT)")
conn.execute("INSERT INTO session VALUES ('ses_1', 'deploy')")
for i in range(600):
    conn.execute("INSERT INTO part VALUES (?, 'msg_1', 'ses_1', ?)",
                 (f"prt_{i:04d}", '{"type": "text", "text": "step %d"}' % i))
conn.execute("INSERT INTO part VALUES ('prt_9999', 'msg_2', 'ses_1', ?)", (sys.argv[2],))
conn.execute("INSERT INTO kv VALUES ('blob', ?)", (b"\\x93\\xa3abc\\xd9\\x28" + sys.argv[3].encode() + b"\\x00\\xff",))
conn.execute("INSERT INTO odd VALUES ('a', 'b', 'c', ?)", (sys.argv[4],))
print("written", flush=True)
sys.stdin.readline()
"""


def test_a_live_foreign_file_in_wal_mode_is_scanned_without_a_byte_changed(tmp_path: Path) -> None:
    """opencode's shape, its writer still running (the -wal and -shm in use): every text
    and blob column of every table, a WITHOUT ROWID table, a table whose columns hide
    the rowid's names, binary values; nothing of the three files changes."""
    path = tmp_path / "opencode.db"
    part = json.dumps({"type": "tool", "state": {"output": S["anthropic-key"].text}})
    child = subprocess.Popen(
        [sys.executable, "-c", LIVE_FOREIGN, str(path), part, S["stripe-key"].secret,
         S["jwt"].text],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=clean_env(),
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "written"
        assert Path(str(path) + "-wal").stat().st_size > 0
        before = snapshot(tmp_path)
        rc, findings, summary = scan_json(path)
        assert snapshot(tmp_path) == before
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=10)
    assert rc == 1
    by_kind = {f["kind"]: f for f in findings}
    assert set(by_kind) == {"anthropic-key", "stripe-key", "jwt"}
    tool = by_kind["anthropic-key"]
    assert (tool["table"], tool["row"]) == (
        "part", {"id": "prt_9999", "message_id": "msg_2", "session_id": "ses_1"},
    )  # fmt: skip
    assert tool["json_path"] == "$.state.output"
    assert by_kind["stripe-key"]["row"] == {"k": "blob"}
    assert by_kind["jwt"]["table"] == "odd"
    assert summary["scanned"]["rows"] == 604


def jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_directory_of_transcripts_is_walked(tmp_path: Path) -> None:
    """Claude Code's and Codex's shape: JSONL files in nested directories.  Links are not
    followed, other text files are read line by line (a directory of logs full of keys
    was scanned "clean", exit 0), binary ones skipped, and each finding names its line
    and JSON path."""
    root = tmp_path / "projects"
    jsonl(
        root / "-work-repo" / "a.jsonl",
        [
            {"type": "user", "message": {"content": "hi"}},
            {"type": "tool_result", "content": [{"text": "env\n" + S["env-secret"].text}]},
        ],
    )
    jsonl(root / "2026" / "05" / "rollout.jsonl", [{"payload": {"output": S["gitlab-token"].text}}])
    (root / "notes.txt").write_text(S["npm-token"].text)  # not a transcript: read as text
    (root / "core.bin").write_bytes(b"\0\1" + S["npm-token"].text.encode())  # binary: skipped
    outside = tmp_path / "outside.jsonl"
    jsonl(outside, [{"x": S["sendgrid-key"].text}])
    (root / "link.jsonl").symlink_to(outside)
    (root / "broken.jsonl").write_text("not json " + S["huggingface-token"].text + "\n")
    before = snapshot(tmp_path)
    rc, findings, summary = scan_json(root)
    assert snapshot(tmp_path) == before
    assert rc == 1
    got = sorted((Path(f["path"]).name, f["line"], f.get("json_path"), f["kind"]) for f in findings)
    assert got == [
        ("a.jsonl", 2, "$.content[0].text", "env-secret"),
        ("broken.jsonl", 1, None, "huggingface-token"),
        ("notes.txt", 1, None, "npm-token"),
        ("rollout.jsonl", 1, "$.payload.output", "gitlab-token"),
    ]
    skipped = {Path(x["path"]).name: x["why"] for x in summary["skipped"]}
    assert set(skipped) == {"core.bin", "link.jsonl"}
    assert "link" in skipped["link.jsonl"]
    # Named on the command line, any file is read.
    rc, findings, _ = scan_json(root / "notes.txt")
    assert rc == 1 and [f["kind"] for f in findings] == ["npm-token"]


def test_a_fifo_in_a_directory_is_skipped_not_read(tmp_path: Path) -> None:
    """Opened, a FIFO with no writer blocks for ever: a walk must not open what is not a
    regular file.  (The generous timeout only catches the hang.)"""
    os.mkfifo(tmp_path / "pipe.jsonl")
    jsonl(tmp_path / "a.jsonl", [{"k": S["npm-token"].text}])
    done = cli(str(tmp_path), "--json", timeout=60)
    summary = json.loads(done.stdout.splitlines()[-1])["summary"]
    assert done.returncode == 1 and summary["by_kind"] == {"npm-token": 1}
    assert summary["skipped"] == [
        {"path": str(tmp_path / "pipe.jsonl"), "why": "not a regular file"}
    ]
    # Named on the command line, it is what was asked for, and unread: not known to be
    # clean (exit 3; it said "no secret found" and exited 0).
    done = cli(str(tmp_path / "pipe.jsonl"), "--json", timeout=60)
    summary = json.loads(done.stdout.splitlines()[-1])["summary"]
    assert done.returncode == 3 and summary["errors"], summary


def test_a_sharded_store_is_scanned_whole(tmp_path: Path) -> None:
    url = f"sqlite+sharded://{tmp_path / 'fleet'}"
    with fleetstore.open(url, blob_threshold=1024, redaction=False) as store:
        for _ in range(3):
            store.sessions.create(title="quiet")
        sid = store.sessions.create(title="leaky").id
        sub = store.sessions.create(parent_id=sid).id
        store.messages.append(sub, "tool", [ToolResult("c", "z" * 2000 + S["google-api-key"].text)])
        store.messages.append(sub, "user", S["twilio-api-key"].text)
    before = snapshot(tmp_path)
    rc, findings, summary = scan_json(url)
    assert snapshot(tmp_path) == before
    assert rc == 1
    assert summary["by_kind"] == {"google-api-key": 1, "twilio-api-key": 1}
    blob = next(f for f in findings if f["kind"] == "google-api-key")
    assert blob["referenced_by"][0]["row"]["session_id"] == sub
    inline = next(f for f in findings if f["kind"] == "twilio-api-key")
    assert "/shards/" in inline["path"] and inline["row"]["session_id"] == sub


# -- options and exit codes -----------------------------------------------------------------


def test_a_users_rules_are_used(tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(
        "allow = ['" + S["github-token"].secret + "']\n"
        "[[rule]]\nkind = 'acme-key'\nprefixes = ['acme_']\nbody = '[a-z0-9]{20}'\n"
    )
    data = tmp_path / "t.jsonl"
    jsonl(data, [{"a": "acme_" + "k" * 20, "b": S["github-token"].secret}])
    rc, findings, _ = scan_json(data, "--rules", str(rules))
    assert rc == 1 and [f["kind"] for f in findings] == ["acme-key"]
    done = cli(str(data), "--rules", str(tmp_path / "absent.toml"))
    assert done.returncode == 2 and "--rules" in done.stderr
    rules.write_text("[[rule]]\nkind = 'x'\nprefixes = ['x']\nbody = '.*'\n")
    assert cli(str(data), "--rules", str(rules)).returncode == 2


def test_bad_usage_exits_2_and_reads_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "absent.db"
    done = cli(str(missing))
    assert done.returncode == 2 and "no such file" in done.stderr
    assert not missing.exists()
    done = cli("postgresql://app@localhost:5432/agents")
    assert done.returncode == 2 and "PostgreSQL" in done.stderr
    assert cli().returncode == 2
    assert cli(str(tmp_path), "--bogus").returncode == 2


def test_a_file_that_cannot_be_read_exits_3_when_nothing_was_found(tmp_path: Path) -> None:
    """A damaged database: the scan says so, and does not claim the directory is clean."""
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"SQLite format 3\x00" + os.urandom(8000))
    (tmp_path / "ok.jsonl").write_text('{"a": 1}\n')
    before = snapshot(tmp_path)
    rc, findings, summary = scan_json(tmp_path)
    assert snapshot(tmp_path) == before
    assert (rc, findings) == (3, [])
    assert [Path(e["path"]).name for e in summary["errors"]] == ["bad.db"]
    # Something found besides: 1, the error still reported.
    (tmp_path / "leak.jsonl").write_text(json.dumps({"k": S["npm-token"].text}) + "\n")
    rc, findings, summary = scan_json(tmp_path)
    assert rc == 1 and len(summary["errors"]) == 1


def test_an_encrypted_file_is_read_with_its_key_and_not_called_clean_without(
    tmp_path: Path,
) -> None:
    """A sealed file (an encrypted store's export, blob or journal) is read given the
    keyring; without it, it is not read and the scan cannot say it is clean (exit 3)."""
    from fleetstore.core import sealed
    from fleetstore.core.keys import Key, Keyring, write_keyring

    keyring = Keyring((Key.generate("k1"),))
    keys = tmp_path / "keys"
    write_keyring(keys, keyring)
    files = tmp_path / "files"
    files.mkdir()
    box = files / "export.jsonl"
    box.write_bytes(sealed.seal(S["github-token"].text.encode(), keyring))
    rc, findings, summary = scan_json(files)
    assert (rc, findings) == (3, [])
    assert "without its key" in summary["errors"][0]["error"]
    done = subprocess.run(
        [sys.executable, "-m", "fleetstore", "--key-file", str(keys), "scan", str(files), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )
    found = [json.loads(line) for line in done.stdout.splitlines()][:-1]
    assert done.returncode == 1 and [f["kind"] for f in found] == ["github-token"]


@pytest.mark.parametrize("kind", ["private-key", "aws-session-token", "jwt"])
def test_a_long_secret_in_a_large_blob_is_found_across_read_pieces(
    tmp_path: Path, kind: str
) -> None:
    """Blob files are read 1 MiB at a time; a secret across a piece boundary is found."""
    path = tmp_path / "s.db"
    sample = S[kind]
    with fleetstore.open(path, redaction=False) as store:
        sid = store.sessions.create().id
        filler = "a " * ((1024 * 1024 - 30) // 2)
        store.messages.append(sid, "tool", [ToolResult("c", filler + sample.text + filler)])
    rc, findings, _ = scan_json(path)
    assert rc == 1 and [f["kind"] for f in findings] == [kind]
