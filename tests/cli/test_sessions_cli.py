"""``fleetstore sessions list|show|rm`` and ``fleetstore stats``, through the installed
console script, against real stores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fleetstore


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("fleetstore")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "fleetstore"]
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=120, env=clean_env()
    )


@pytest.fixture
def filled(tmp_path: Path) -> dict[str, Any]:
    """Two projects; one session with a 200 KB blob, a subagent, usage and state;
    one archived; one last written 10 days ago."""
    path = tmp_path / "s.db"
    blob = os.urandom(200_000)
    with fleetstore.open(path) as store:
        big = store.sessions.create(title="big", project="/a")
        store.messages.append(big.id, role="user", parts=[fleetstore.Text("hello")])
        store.messages.append(
            big.id,
            role="tool",
            parts=[fleetstore.ToolResult("c1", blob)],
            usage=fleetstore.Usage(input_tokens=100, output_tokens=7),
        )
        store.state.put(big.id, "plan", {"step": 1})
        sub = store.sessions.create(title="sub", parent_id=big.id)
        store.messages.append(sub.id, role="user", parts=[fleetstore.Text("x" * 1000)])
        small = store.sessions.create(title="small", project="/b")
        store.messages.append(small.id, role="user", parts=[fleetstore.Text("hi")])
        archived = store.sessions.create(title="put away", project="/a")
        store.sessions.archive(archived.id)
        old = store.sessions.create(title="old", project="/a")
        with store.db.write() as tx:
            tx.execute(
                "UPDATE sessions SET updated_at = updated_at - 864000, "
                "created_at = created_at - 864000 WHERE id = ?",
                (old.id,),
            )
        stored = store.read(lambda tx: tx.execute("SELECT sum(stored_size) FROM blobs"))[0][0]
    return {
        "path": str(path),
        "big": big.id,
        "sub": sub.id,
        "small": small.id,
        "archived": archived.id,
        "old": old.id,
        "blob_stored": stored,
    }


def ids(out: str) -> list[str]:
    return [json.loads(line)["id"] for line in out.splitlines()]


@pytest.mark.slow
def test_sessions_list_filters(filled: dict[str, Any]) -> None:
    path = filled["path"]
    done = cli("sessions", "list", "--store", path, "--json")
    assert done.returncode == 0, done.stderr
    listed = ids(done.stdout)
    assert set(listed) == {filled[k] for k in ("big", "sub", "small", "old")}
    assert listed[-1] == filled["old"]  # most recently written first

    assert (
        ids(cli("sessions", "list", "--store", path, "--json", "--archived").stdout).count(
            filled["archived"]
        )
        == 1
    )
    assert set(
        ids(cli("sessions", "list", "--store", path, "--json", "--project", "/a").stdout)
    ) == {
        filled["big"],
        filled["old"],
    }
    assert filled["sub"] not in ids(
        cli("sessions", "list", "--store", path, "--json", "--roots").stdout
    )
    assert filled["old"] not in ids(
        cli("sessions", "list", "--store", path, "--json", "--since", "1d").stdout
    )
    assert len(ids(cli("sessions", "list", "--store", path, "--json", "--limit", "2").stdout)) == 2
    records = [
        json.loads(x)
        for x in cli("sessions", "list", "--store", path, "--json").stdout.splitlines()
    ]
    assert next(r for r in records if r["id"] == filled["big"])["messages"] == 2

    text = cli("sessions", "list", "--store", path)
    assert text.returncode == 0 and filled["big"] in text.stdout and "big" in text.stdout
    bad = cli("sessions", "list", "--store", path, "--since", "yesterday-ish")
    assert bad.returncode == 2


def test_sessions_show_reports_messages_usage_and_bytes(filled: dict[str, Any]) -> None:
    done = cli("sessions", "show", filled["big"], "--store", filled["path"], "--summary", "--json")
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["session"]["id"] == filled["big"]
    assert sum(m["count"] for m in facts["messages"]) == 2
    assert facts["usage"]["input_tokens"] == 100 and facts["usage"]["output_tokens"] == 7
    assert facts["children"] == [filled["sub"]]
    assert facts["state_values"] == 1
    assert facts["bytes"]["blobs"] == 1
    assert facts["bytes"]["blob_original"] == 200_000
    assert facts["bytes"]["blob_stored"] == filled["blob_stored"]
    # "hello" and the state's JSON are inline; the tool output is not.
    assert 5 <= facts["bytes"]["inline"] < 1000

    text = cli("sessions", "show", filled["big"], "--store", filled["path"], "--summary")
    assert text.returncode == 0 and "usage: 100 in, 7 out" in text.stdout


def test_sessions_show_of_no_such_session_exits_2(filled: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "t.md"
    for extra in ([], ["--summary"], ["--format", "markdown", "-o", str(out)]):
        done = cli("sessions", "show", "no-such-session", "--store", filled["path"], *extra)
        assert done.returncode == 2, extra
        assert "no-such-session" in done.stderr
    assert not out.exists() and not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


@pytest.mark.slow
def test_commands_on_a_missing_store_exit_2_and_create_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "absent.db"
    for args in (["sessions", "list"], ["sessions", "show", "x"], ["stats"]):
        done = cli(*args, "--store", str(missing))
        assert done.returncode == 2, args
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_sessions_rm_needs_yes_then_removes_the_tree(filled: dict[str, Any]) -> None:
    path = filled["path"]
    done = cli("sessions", "rm", filled["big"], "--store", path)
    assert done.returncode == 2
    assert "--yes" in done.stderr
    with fleetstore.open(path) as store:
        assert store.sessions.get(filled["big"]).id == filled["big"]

    done = cli("sessions", "rm", filled["big"], "nope", "--store", path, "--yes")
    assert done.returncode == 2  # one of them does not exist: nothing removed
    with fleetstore.open(path) as store:
        assert store.sessions.get(filled["big"]).id == filled["big"]

    done = cli("sessions", "rm", filled["big"], filled["small"], "--store", path, "--yes")
    assert done.returncode == 0, done.stderr
    assert "removed 2 session(s), 3 message(s), 1 state value(s)" in done.stdout
    with fleetstore.open(path) as store:
        for key in ("big", "sub", "small"):
            with pytest.raises(fleetstore.NotFound):
                store.sessions.get(filled[key])
        assert store.sessions.get(filled["old"]).id == filled["old"]
        assert store.read(lambda tx: tx.execute("SELECT count(*) FROM state"))[0][0] == 0


def test_stats_gives_bytes_per_session_the_largest_and_the_blob_share(
    filled: dict[str, Any],
) -> None:
    done = cli("stats", "--store", filled["path"], "--json", "--top", "2")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["counts"]["sessions"] == 5
    assert figures["counts"]["top_level_sessions"] == 4
    assert figures["counts"]["messages"] == 4
    assert figures["blobs"]["rows"] == 1 and figures["blobs"]["files"] == 1
    assert figures["blobs"]["stored_bytes"] == filled["blob_stored"]
    share = filled["blob_stored"] / (figures["database_bytes"] + filled["blob_stored"])
    assert figures["blobs"]["share"] == pytest.approx(share)
    per = {r["id"]: r for r in figures["sessions"]}
    assert per[filled["big"]]["bytes"] == per[filled["big"]]["inline_bytes"] + filled["blob_stored"]
    assert per[filled["sub"]]["inline_bytes"] == 1000
    assert [r["id"] for r in figures["largest"]] == [filled["big"], filled["sub"]]
    assert all(
        a["bytes"] >= b["bytes"]
        for a, b in zip(figures["sessions"], figures["sessions"][1:], strict=False)
    )

    text = cli("stats", "--store", filled["path"])
    assert text.returncode == 0 and "of the store's bytes" in text.stdout
