"""``fleetstore search`` and ``fleetstore index`` (issue 30), as the installed command,
against real stores on each layout: exit codes, text and ``--json``, the note when the
index is behind, and hostile queries (a clear error, exit 2, nothing changed)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from tests.fix_stores import read_everywhere


@pytest.fixture(params=["sqlite", "sharded", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path, data_dir: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "s.db")
    if request.param == "sharded":
        return f"sqlite+sharded://{tmp_path / 'sharded'}"
    return str(request.getfixturevalue("pg_url"))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    # FLEETSTORE_DATA_DIR kept (where a PostgreSQL store's local files go), no other setting
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FLEETSTORE_") or k == "FLEETSTORE_DATA_DIR"
    }
    return subprocess.run(
        [sys.executable, "-m", "fleetstore", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def _fill(url: str) -> dict[str, Any]:
    with fleetstore.open(url, search_index=False) as store:
        s = store.sessions.create(title="deploy notes", project="api")
        store.messages.append(s.id, "user", "why ECONNREFUSED in parse_tool_output?")
        store.messages.append(s.id, "assistant", "ECONNREFUSED means nothing listens")
        return {"session": s.id}


def _snapshot(url: str) -> tuple[Any, ...]:
    with fleetstore.open(url, search_index=False) as store:
        return (
            store.search.status().queued,
            read_everywhere(store, "SELECT count(*) FROM search_docs")[0][0],
            read_everywhere(store, "SELECT count(*) FROM messages")[0][0],
        )


@contextlib.contextmanager
def _live_holder(url: str) -> Iterator[None]:
    """Every file's indexer lease held by a live process of this host, its beat renewed
    every 0.2 s while it still holds it (an indexer resting between batches)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    holder = f"{socket.gethostname()}:{sleeper.pid}"
    stop = threading.Event()
    with fleetstore.open(url, search_index=False) as store:

        def beat(take: bool) -> None:
            sql = "UPDATE search_state SET owner = ?, beat = ? WHERE id = 1" + (
                "" if take else " AND owner = ?"
            )
            args = (holder, time.time()) + (() if take else (holder,))
            store.backend.each(lambda _k, db: db.run_write(lambda tx: tx.execute(sql, args)))

        def renew() -> None:
            while not stop.wait(0.2):
                beat(False)

        beat(True)
        renewer = threading.Thread(target=renew)
        renewer.start()
        try:
            yield
        finally:
            stop.set()
            renewer.join()
            sleeper.kill()
            sleeper.wait()


def test_index_then_search_text_and_json(url: str) -> None:
    filled = _fill(url)
    status = cli("index", "--status", "--json", "--store", url)
    assert status.returncode == 0, status.stderr
    first = json.loads(status.stdout)
    assert (first["queued"], first["sections"], first["current"]) == (3, 0, False)
    assert _snapshot(url) == (3, 0, 2)  # --status wrote nothing

    behind = cli("search", "econnrefused", "--store", url)
    assert behind.returncode == 0 and behind.stdout == ""
    assert "behind" in behind.stderr and "fleetstore index" in behind.stderr

    # A live fleet's indexer holds the lease, resting (its beat kept fresh): index takes
    # each file over from it instead of waiting as long as the fleet writes.
    with _live_holder(url):
        done = cli("index", "--json", "--store", url)
    assert done.returncode == 0, done.stderr
    after = json.loads(done.stdout)
    assert (after["written"], after["queued"], after["current"]) == (3, 0, True)

    found = cli("search", "econnrefused", "--json", "--store", url)
    assert found.returncode == 0 and "behind" not in found.stderr
    hits = [json.loads(line) for line in found.stdout.splitlines()]
    assert [(h["seq"], h["role"], h["kind"]) for h in hits] == [
        (2, "assistant", "text"),
        (1, "user", "text"),
    ]
    for h in hits:
        assert h["session_id"] == filled["session"]
        assert [h["snippet"][a:b] for a, b in h["highlights"]] == ["ECONNREFUSED"]

    text = cli("search", "ool_out", "--substring", "--store", url)
    assert text.returncode == 0
    assert filled["session"] in text.stdout and "#1" in text.stdout
    assert "parse_tool_output" in text.stdout

    title = cli("search", "deploy", "--kind", "title", "--json", "--store", url)
    assert [json.loads(x)["kind"] for x in title.stdout.splitlines()] == ["title"]
    none = cli("search", "deploy", "--kind", "text", "--project", "api", "--store", url)
    assert none.returncode == 0 and none.stdout == ""
    cut = cli("search", "econnrefused", "--limit", "1", "--json", "--store", url)
    assert len(cut.stdout.splitlines()) == 1 and "--all" in cut.stderr
    every = cli("search", "econnrefused", "--limit", "1", "--all", "--json", "--store", url)
    assert len(every.stdout.splitlines()) == 2


@pytest.mark.parametrize(
    "args",
    [
        ["NOT econnrefused"],
        ["econnrefused AND"],
        ['"unclosed'],
        ["(econnrefused"],
        ["--- ..."],
        ["ab", "--substring"],
        ["econnrefused", "--since", "yesterdayish"],
        ["econnrefused", "--limit", "0"],
        ["econnrefused", "--kind", "nonsense"],
    ],
)
def test_a_hostile_query_exits_2_and_changes_nothing(tmp_path: Path, args: list[str]) -> None:
    url = str(tmp_path / "s.db")
    _fill(url)
    before = _snapshot(url)
    done = cli("search", *args, "--store", url)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stdout == "" and "Error" in done.stderr and "Traceback" not in done.stderr
    assert _snapshot(url) == before


def test_no_store_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    for args in (["search", "x"], ["index"], ["index", "--status"]):
        done = cli(*args, "--store", str(tmp_path / "nope.db"))
        assert done.returncode == 2 and "no store" in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []
