"""The search indexer against real processes (issue 30): writers in other processes while
indexer threads run (theirs and ours), and an indexer killed with ``kill -9`` in the
middle of a batch, which leaves no entry lost and none indexed twice.

The invariant every test checks (``_indexed_once``): each message is found by its own
word exactly once, and the index holds exactly one section per message and title."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore import Store
from tests.fix_faults import importable_env
from tests.fix_stores import read_everywhere

pytestmark = pytest.mark.slow

# A writer: its own store (its indexer thread on, looking often), one session, messages
# each with a word of its own, until the stop file appears; "wrote N" as it goes.
WRITER = r"""
import os, sys, time, fleetstore
url, name, stop = sys.argv[1:4]
store = fleetstore.open(url, search_index=True, search_interval=0.05)
s = store.sessions.create(title="writer " + name)
n = 0
while not os.path.exists(stop) or n < 40:
    n += 1
    store.messages.append(s.id, "user", f"w{name}x{n} common words of a turn")
    if n % 10 == 0:
        print("wrote", n, flush=True)
    time.sleep(0.005)
print("done", n, s.id, flush=True)
store.close()
"""

# An indexer to kill: catch_up over a backlog, its SQLite connections through the
# fault VFS; once its first batch is committed, the 3rd WAL write from then on SIGKILLs
# it: inside the second batch's commit, its pages half written.
KILLED_SQLITE = r"""
import sys, fleetstore
from tests.fix_faults import install
faults = install()
store = fleetstore.open(sys.argv[1], search_index=False)
armed = []
def arm(done, total):
    if not armed:
        armed.append(faults.fail("xWrite", "wal", nth=3, error="kill"))
print("indexing", flush=True)
store.search.catch_up(progress=arm)
print("not killed", flush=True)
"""

# An indexer to kill on PostgreSQL: catch_up; the test holds a queue row's lock, so the
# batch's transaction waits there, its earlier sections written, until killed.
KILLED_PG = r"""
import sys, fleetstore
store = fleetstore.open(sys.argv[1], search_index=False)
print("indexing", flush=True)
store.search.catch_up()
print("not killed", flush=True)
"""


@pytest.fixture(params=["sqlite", "sharded", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path, data_dir: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "s.db")
    if request.param == "sharded":
        return f"sqlite+sharded://{tmp_path / 'sharded'}"
    return str(request.getfixturevalue("pg_url"))


_started: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _reap() -> Iterator[None]:
    """Every child a test started is killed and reaped (its pipes closed) at its end."""
    yield
    while _started:
        proc = _started.pop()
        proc.kill()
        proc.communicate()


def _child(code: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=importable_env(),
    )
    _started.append(proc)
    return proc


def _line(proc: subprocess.Popen[str], prefix: str) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            return line.strip()
    raise AssertionError(f"no {prefix!r} line: rc={proc.wait()} {proc.stderr.read()}")  # type: ignore[union-attr]


def _hits(store: Store, query: str) -> list[Any]:
    found: list[Any] = []
    cursor = None
    while True:
        page = store.search(query, limit=1000, cursor=cursor, include_archived=True)
        found += page
        if not page.more:
            return found
        cursor = page.next_cursor


def _indexed_once(store: Store, words: dict[str, str]) -> None:
    """Each word of *words* (word: its message's id) found once, in its message, and
    one section in the index per message and per title, no more."""
    for word, message_id in words.items():
        assert [h.message_id for h in _hits(store, word)] == [message_id], word
    docs = read_everywhere(store, "SELECT count(*) FROM search_docs")[0][0]
    titles = read_everywhere(store, "SELECT count(*) FROM sessions WHERE title IS NOT NULL")[0][0]
    assert docs == len(words) + titles


def _words(store: Store, session_ids: list[str]) -> dict[str, str]:
    found = {}
    for sid in session_ids:
        for m in store.messages.list(sid, limit=1000):
            found[str(m.parts[0].text).split()[0]] = m.id  # type: ignore[union-attr]
    return found


def test_writers_in_other_processes_while_indexers_run(url: str, tmp_path: Path) -> None:
    fleetstore.open(url, search_index=False).close()  # the schema, made once
    stop = tmp_path / "stop"
    writers = [_child(WRITER, url, name, str(stop)) for name in ("a", "b")]
    try:
        with fleetstore.open(url, search_index=False) as store:
            for w in writers:
                _line(w, "wrote")
            # the writers' indexer threads index while they write: sections appear
            # before any writer is told to stop (an order of events, not a time)
            deadline = time.monotonic() + 60  # generous: only a hung indexer reaches it
            while store.search.status().sections == 0:
                assert time.monotonic() < deadline, "no writer's indexer indexed anything"
                assert all(w.poll() is None for w in writers)
                time.sleep(0.05)
            assert not stop.exists() and all(w.poll() is None for w in writers)
            stop.touch()
            ids = [_line(w, "done").split()[2] for w in writers]
            for w in writers:
                assert w.wait(60) == 0, w.stderr.read()  # type: ignore[union-attr]
            store.search.catch_up()  # whatever their last batches left
            status = store.search.status()
            assert status.current and status.queued == 0
            words = _words(store, ids)
            assert len(words) >= 80
            _indexed_once(store, words)
    finally:
        stop.touch()


def _backlog(url: str, n: int = 300) -> dict[str, str]:
    with fleetstore.open(url, search_index=False) as store:
        s = store.sessions.create(title="backlog")
        for i in range(n):
            store.messages.append(s.id, "user", f"k{i}q " + "filler text of a turn " * 40)
        assert store.search.status().queued == n + 1
        return _words(store, [s.id])


def _after_the_kill(url: str, words: dict[str, str], proc: subprocess.Popen[str]) -> None:
    assert proc.wait(30) == -signal.SIGKILL, proc.stderr.read()  # type: ignore[union-attr]
    with fleetstore.open(url, search_index=False) as store:
        status = store.search.status()
        # killed mid-way: some batches committed, the rest still queued
        assert 0 < status.queued < len(words) + 1 and status.sections > 0, status
        store.search.catch_up()
        assert store.search.status().current
        _indexed_once(store, words)


def test_an_indexer_killed_in_a_batch_commit_loses_and_doubles_nothing_sqlite(
    tmp_path: Path,
) -> None:
    url = str(tmp_path / "s.db")
    words = _backlog(url)
    proc = _child(KILLED_SQLITE, url)
    _line(proc, "indexing")
    _after_the_kill(url, words, proc)


def test_an_indexer_killed_inside_a_batch_loses_and_doubles_nothing_postgresql(
    pg_url: str, data_dir: Path
) -> None:
    import psycopg

    words = _backlog(pg_url)
    with psycopg.connect(pg_url, autocommit=False) as conn:
        heads = [r[0] for r in conn.execute("SELECT doc FROM search_queue ORDER BY doc LIMIT 40")]
        # a row of the first batch, locked: the batch waits at it, its first 29
        # owners' sections written in its open transaction
        conn.execute("SELECT 1 FROM search_queue WHERE doc = %s FOR UPDATE", (heads[29],))
        proc = _child(KILLED_PG, pg_url)
        _line(proc, "indexing")
        with psycopg.connect(pg_url, autocommit=True) as look:
            deadline = time.monotonic() + 60  # generous: only a batch that never came
            while not look.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            ).fetchall():
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.02)
            waiting = look.execute("SELECT count(*) FROM search_docs").fetchone()
            assert waiting == (0,)  # nothing of the batch is visible before it commits
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        conn.rollback()
    _after_the_kill_pg(pg_url, words, proc)


def _after_the_kill_pg(url: str, words: dict[str, str], proc: subprocess.Popen[str]) -> None:
    assert proc.returncode == -signal.SIGKILL
    with fleetstore.open(url, search_index=False) as store:
        status = store.search.status()
        assert status.queued == len(words) + 1 and status.sections == 0, status
        store.search.catch_up()
        _indexed_once(store, words)


def test_the_indexer_thread_of_a_writing_process_catches_up(url: str) -> None:
    with fleetstore.open(url, search_interval=0.05) as store:
        s = store.sessions.create(title="threaded")
        ids = {f"t{i}z": store.messages.append(s.id, "user", f"t{i}z here").id for i in range(30)}
        deadline = time.monotonic() + 60  # generous: only an indexer that never runs
        while not store.search.status().current:
            assert time.monotonic() < deadline, store.search.status()
            time.sleep(0.05)
        _indexed_once(store, ids)


@pytest.mark.parametrize("share", [0, 0.001, 1.5, float("nan"), "x", True])
def test_a_search_share_that_is_not_a_fraction_is_refused_and_nothing_made(
    tmp_path: Path, share: object
) -> None:
    with pytest.raises(fleetstore.ConfigError, match="search_share"):
        fleetstore.open(tmp_path / "s.db", search_share=share)
    assert not list(tmp_path.iterdir())


def test_catch_up_takes_the_file_over_from_a_live_fleets_indexer_and_gives_it_back(
    url: str,
) -> None:
    """A fleet's indexer rests between batches holding the lease (a tenth of its time):
    a catch-up that waited for it waited as long as the fleet wrote.  ``take_over``
    (``fleetstore index``) indexes at once, every file, and leaves the lease free; without
    it the catch-up leaves a live holder's file alone (maintain's bounded step)."""
    import socket

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with fleetstore.open(url, search_index=False) as store:
            sessions = [store.sessions.create(title=f"s{i}").id for i in range(3)]
            for j, sid in enumerate(sessions):
                for i in range(40):
                    store.messages.append(sid, "user", f"w{j}n{i}q queued before")
            holder = f"{socket.gethostname()}:{sleeper.pid}"  # alive, on this host

            def hold(_key: Any, db: Any) -> None:
                db.run_write(
                    lambda tx: tx.execute(
                        "UPDATE search_state SET owner = ?, beat = ? WHERE id = 1",
                        (holder, time.time()),
                    )
                )

            store.backend.each(hold)
            owners = read_everywhere(store, "SELECT owner FROM search_state")
            assert owners and {o for (o,) in owners} == {holder}

            waited_until = time.monotonic() + 1.0
            assert store.search.catch_up(stop=lambda: time.monotonic() > waited_until) == 0

            deadline = time.monotonic() + 60  # a stop only if it waited for the holder
            written = store.search.catch_up(
                take_over=True, stop=lambda: time.monotonic() > deadline
            )
            assert written > 0
            _indexed_once(store, _words(store, sessions))
            # Given back where it was taken (a file with nothing to index is left alone).
            left = {o for (o,) in read_everywhere(store, "SELECT owner FROM search_state")}
            assert None in left and left <= {None, holder}, left
            with pytest.raises(fleetstore.InvalidInput):
                store.search.catch_up(take_over="yes")  # type: ignore[arg-type]
    finally:
        sleeper.kill()
        sleeper.wait()
