"""Deleting and forking large sessions in short transactions (issue 23: a fork or a
delete of a 100,000-message session held the write lock 4.7 s, and every other writer
of the store waited that long).

The contract, on every engine: a deleted session is gone from every read at once and
its rows are purged batch by batch; a fork is seen whole or not at all; a batch is a
transaction of its own, so other processes' writes commit between batches (shown by
the order of events: another writer, right after its own commit, finds the rows of a
session half purged or half copied, while the API never shows them); a process killed
mid-way leaves a consistent store, and the next open finishes the delete and gives up
the fork.  Real processes (tests/agents/jobs_agent.py), real ``kill -9``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore import Store, errors
from fleetstore.core.ids import new_id
from fleetstore.domain import session_jobs
from fleetstore.domain.operations import Delivery, Operation
from fleetstore.models import Text, ToolCall, ToolResult
from fleetstore.transfer.reshard import reshard
from tests.agents import script
from tests.fix_procs import Proc, Spawn, start_lock
from tests.fix_stores import read_everywhere

AGENT = script("jobs_agent.py")
WAIT = 120.0  # a safety net for waits on evidence


def rows_of(store: Store, sid: str) -> dict[str, int]:
    """What the files hold of session *sid*, whatever reads show."""
    out = {}
    for table, where in (
        ("sessions", "id = ?"),
        ("messages", "session_id = ?"),
        ("parts", "session_id = ?"),
        ("usage", "session_id = ?"),
        ("state", "session_id = ?"),
    ):
        out[table] = int(
            read_everywhere(store, f"SELECT count(*) FROM {table} WHERE {where}", (sid,))[0][0]
        )
    out["chunks"] = int(
        read_everywhere(
            store,
            "SELECT count(*) FROM chunks WHERE message_id IN "
            "(SELECT id FROM messages WHERE session_id = ?)",
            (sid,),
        )[0][0]
    )
    return out


def fill(store: Store, messages: int, *, sub: bool = True) -> tuple[str, str | None]:
    """A session of *messages* messages (text, tool calls with results and usage,
    streamed replies), state values, and a subagent session with a few of its own."""
    s = store.sessions.create(title="big")
    for i in range(messages):
        if i % 10 == 9:
            with store.messages.stream(s.id) as reply:
                for j in range(3):
                    reply.text(f"delta {j} ")
                    reply.flush()
        elif i % 2:
            parts = [Text(f"answer {i}"), ToolCall("bash", {"n": i}, call_id=f"c{i}")]
            parts.append(ToolResult(f"c{i}", f"out {i}"))
            store.messages.append(s.id, "assistant", parts, usage={"input_tokens": i})
        else:
            store.messages.append(s.id, "user", f"question {i}")
    for k in range(5):
        store.state.put(s.id, f"k{k}", {"v": k})
    child = None
    if sub:
        child = store.sessions.create(title="sub", parent_id=s.id).id
        for i in range(5):
            store.messages.append(child, "user", f"sub {i}")
        store.state.put(child, "k", 1)
    return s.id, child


def gone(store: Store, sid: str) -> bool:
    """Does every read take *sid* for a session that does not exist?"""
    q = store.queries
    for call in (
        lambda: store.sessions.get(sid),
        lambda: store.messages.list(sid),
        lambda: store.messages.list(sid, last=3),
        lambda: store.state.get(sid, "k0"),
        lambda: store.state.keys(sid),
        lambda: store.sessions.usage(sid),
    ):
        with pytest.raises(errors.NotFound):
            call()
    listed = {s.id for s in store.sessions.list(include_archived=True, limit=10_000)}
    exists = store.read(lambda tx: tx.execute(q["session_exists"], (sid,)), session_id=sid)
    return sid not in listed and not exists


def submit(store: Store, name: str, **args: Any) -> dict[str, Any]:
    result = store.submit(Operation(name, args, new_id()), Delivery.INDEPENDENT)
    assert result is not None
    return result


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_jobs, "PURGE_ROWS", 7)
    monkeypatch.setattr(session_jobs, "FORK_MESSAGES", 4)


# -- the contract, on every engine ------------------------------------------------------------


def test_a_deleted_session_is_gone_at_once_and_purged_batch_by_batch(store: Store) -> None:
    sid, child = fill(store, 40)
    assert child is not None
    message = store.messages.list(sid)[5].id
    before = rows_of(store, sid)
    assert before["messages"] == 40 and before["chunks"] > 0 and before["state"] == 5
    assert submit(store, "delete_session", id=sid)["purge"] is True
    batches = 0
    while True:
        # Every read takes it (and its subagent) for a session that is not there,
        # however much of it is purged so far.
        assert gone(store, sid) and gone(store, child)
        with pytest.raises(errors.NotFound):
            store.messages.get(message)
        result = submit(store, "purge_session", id=sid, limit=7)
        batches += 1
        assert result["rows"] <= 7 and batches < 1000
        if result["done"]:
            break
    assert batches > 5  # it took many short transactions
    for table, n in rows_of(store, sid).items():
        assert n == 0, table
    assert rows_of(store, child)["sessions"] == 0
    # The id is free again.
    again = store.sessions.create(title="again", id=sid)
    assert store.sessions.get(again.id).title == "again"


def test_the_api_delete_purges_before_it_returns(store: Store, small_batches: None) -> None:
    sid, child = fill(store, 30)
    keep, _ = fill(store, 3, sub=False)
    store.sessions.delete(sid)
    assert gone(store, sid)
    assert all(n == 0 for n in rows_of(store, sid).values())
    assert child is not None and rows_of(store, child)["sessions"] == 0
    assert len(store.messages.list(keep)) == 3
    with pytest.raises(errors.NotFound):
        store.sessions.delete(sid)


def test_a_fork_is_seen_whole_or_not_at_all(store: Store) -> None:
    sid, _ = fill(store, 30, sub=False)
    fork = new_id()
    first = store.submit(
        Operation(
            "fork_session",
            {
                "id": fork,
                "source_id": sid,
                "title": "f",
                "owner": session_jobs.job_owner(),
                "limit": 4,
                "created_at": 1.0,
            },
            new_id(),
        ),
        Delivery.NOW,
    )
    assert first is not None and first["done"] is False
    copied = store.messages.list(sid)
    with pytest.raises(errors.AlreadyExists):
        store.sessions.create(title="clash", id=fork)  # hidden, its id taken
    for _ in range(100):
        assert gone(store, fork)
        with pytest.raises(errors.NotFound):
            store.messages.append(fork, "user", "not into a fork being copied")
        assert 0 < rows_of(store, fork)["messages"] < 30
        if submit(store, "fork_copy", id=fork, limit=4)["done"]:
            break
    f = store.sessions.get(fork)
    assert (f.forked_from, f.fork_seq, f.title) == (sid, 30, "f")
    assert any(s.id == fork for s in store.sessions.list())
    mine = store.messages.list(fork)
    assert [(m.seq, m.role, m.parts, m.usage, m.status) for m in mine] == [
        (m.seq, m.role, m.parts, m.usage, m.status) for m in copied
    ]


def test_the_api_fork_copies_in_batches_and_its_retry_is_the_same_fork(
    store: Store, small_batches: None
) -> None:
    sid, _ = fill(store, 25, sub=False)
    at = store.messages.list(sid)[19]
    fork = store.sessions.fork(sid, at_message_id=at.id, id="0190d3c0-0000-7000-8000-00000000f001")
    assert fork.fork_seq == 20 and len(store.messages.list(fork.id)) == 20
    again = store.sessions.fork(sid, at_message_id=at.id, id=fork.id)
    assert again == fork


def test_a_fork_whose_source_is_deleted_midway_raises_not_found_and_leaves_nothing(
    store: Store, small_batches: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid, _ = fill(store, 30, sub=False)
    fork = "0190d3c0-0000-7000-8000-00000000f002"
    submit_batch = session_jobs._submit
    deleted = []

    def delete_after_the_first_batch(st: Any, name: str, args: dict[str, Any]) -> Any:
        if name == "fork_copy" and not deleted:
            deleted.append(st.sessions.delete(sid))  # another caller deletes the source
        return submit_batch(st, name, args)

    monkeypatch.setattr(session_jobs, "_submit", delete_after_the_first_batch)
    with pytest.raises(errors.NotFound, match="deleted while it was being forked"):
        store.sessions.fork(sid, id=fork)
    assert gone(store, fork) and gone(store, sid)
    assert all(n == 0 for n in rows_of(store, fork).values())
    assert all(n == 0 for n in rows_of(store, sid).values())


# -- other writers, kill -9 -------------------------------------------------------------------


@pytest.fixture(params=["file", "sharded"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return str(tmp_path / "jobs.db")
    return f"sqlite+sharded://{tmp_path / 'jobs'}"


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    try:
        yield started
    finally:
        for proc in started:
            proc.kill()


def agent(procs: list[Proc], *args: str) -> Proc:
    proc = Proc([sys.executable, AGENT, *args], " ".join(args[:1]))
    procs.append(proc)
    proc.wait_line("ready", timeout=WAIT)
    return proc


@pytest.mark.parametrize("job", ["delete", "fork"])
def test_other_writers_commit_between_the_batches(
    url: str, tmp_path: Path, procs: list[Proc], job: str
) -> None:
    """While a process deletes (forks) a session batch by batch, another process's
    writes commit between the batches: right after its own commit it finds the
    session's rows half purged (half copied): neither all nor none.  Through the API
    it never sees them half done: the session whole or not there, the fork not there
    or whole.  With the old single transaction it could only find all or none."""
    with fleetstore.open(url) as store:
        sid, _ = fill(store, 600, sub=False)
    fork = "0190d3c0-0000-7000-8000-00000000f003"
    stop = tmp_path / "stop"
    watcher = agent(procs, "watch", url, "--doomed", sid, "--fork", fork, "--stop", str(stop))
    watcher.wait_line("seen ", timeout=WAIT)
    if job == "delete":
        worker = agent(procs, "delete", url, sid, "--batch", "10")
    else:
        worker = agent(procs, "fork", url, sid, "--id", fork, "--batch", "3")
    worker.wait_line("done", timeout=WAIT)
    assert worker.finish(timeout=WAIT) == 0, worker.stderr_tail()
    while True:  # a round that saw the finished job: the watch covered all of it
        _, line = watcher.wait_line("seen ", timeout=WAIT)
        last = json.loads(line.split(" ", 1)[1])
        if (last["doomed_rows"], last["fork_api"]) == (
            (0, None) if job == "delete" else (600, 600)
        ):
            break
    stop.touch()
    assert watcher.finish(timeout=WAIT) == 0, watcher.stderr_tail()
    seen = [
        json.loads(line.split(" ", 1)[1]) for _, line in watcher.seen if line.startswith("seen ")
    ]
    rows, api = ("doomed_rows", "doomed_api") if job == "delete" else ("fork_rows", "fork_api")
    between = [s for s in seen if 0 < s[rows] < 600]
    assert between, (
        f"no write of the watcher committed between two batches: {seen[:3]} ... {seen[-3:]}"
    )
    assert {s[api] for s in seen} <= {None, 600}, "the API showed a half-done session"
    assert all(s[api] is None for s in between)


def test_killed_mid_purge_the_session_stays_gone_and_the_next_open_finishes(
    url: str, procs: list[Proc]
) -> None:
    with fleetstore.open(url) as store:
        sid, child = fill(store, 300)
    worker = agent(procs, "delete", url, sid, "--batch", "10", "--kill-after", "5")
    assert worker.finish(timeout=WAIT) == -signal.SIGKILL
    with fleetstore.open(url, write_budget=5) as store:
        # Consistent: gone for every read, half purged in the files...
        assert gone(store, sid) and child is not None and gone(store, child)

        # ...and this open finishes the purge in the background.
        # Done when the rows are gone and no job is left: a sharded store clears the
        # catalog's copy of the session row after the shard's rows (a check between
        # the two saw the catalog's job still set).
        def jobs() -> list[Any]:
            return store.read(
                lambda tx: tx.execute("SELECT count(*) FROM sessions WHERE job IS NOT NULL")
            )

        deadline = time.monotonic() + WAIT
        while any(rows_of(store, sid).values()) or jobs() != [(0,)]:
            assert time.monotonic() < deadline, (rows_of(store, sid), jobs())
            time.sleep(0.02)
        assert rows_of(store, child)["sessions"] == 0


def test_killed_mid_fork_the_fork_is_never_seen_and_the_next_open_gives_it_up(
    url: str, procs: list[Proc]
) -> None:
    with fleetstore.open(url) as store:
        sid, _ = fill(store, 200, sub=False)
        source = [(m.id, m.parts) for m in store.messages.list(sid)]
    fork = "0190d3c0-0000-7000-8000-00000000f004"
    worker = agent(procs, "fork", url, sid, "--id", fork, "--batch", "4", "--kill-after", "3")
    assert worker.finish(timeout=WAIT) == -signal.SIGKILL
    with fleetstore.open(url, write_budget=5) as store:
        assert gone(store, fork)
        deadline = time.monotonic() + WAIT
        while any(rows_of(store, fork).values()):
            assert time.monotonic() < deadline, rows_of(store, fork)
            time.sleep(0.02)
        assert [(m.id, m.parts) for m in store.messages.list(sid)] == source
        # The caller never got the fork; making it again works.
        again = store.sessions.fork(sid, id=fork)
        assert len(store.messages.list(again.id)) == 200


def test_a_spooled_delete_is_purged_once_it_is_replayed(
    tmp_path: Path, spawn: Spawn, small_batches: None
) -> None:
    """A delete that met a store locked past the budget waits in the spool like any
    write; once the lock frees, its replay hides the session and the store's job
    thread purges its rows (nobody calls for it)."""
    path = str(tmp_path / "spooled.db")
    with fleetstore.open(path) as store:
        sid, _ = fill(store, 30)
    with fleetstore.open(path, write_budget=0.3) as store:
        lock, _ = start_lock(spawn, store.url, 60.0)
        store.sessions.delete(sid)  # spooled: returns at once
        assert store.metrics()["spool_pending"] == 1
        os.kill(lock.pid, signal.SIGTERM)
        lock.wait_line("released", timeout=WAIT)
        assert lock.finish(timeout=WAIT) == 0
        assert store.flush(WAIT)
        assert gone(store, sid)
        deadline = time.monotonic() + WAIT
        while any(rows_of(store, sid).values()):
            assert time.monotonic() < deadline, rows_of(store, sid)
            time.sleep(0.02)


def test_a_reshard_of_a_store_killed_mid_purge_finishes_the_purge_first(
    tmp_path: Path, procs: list[Proc]
) -> None:
    """The reshard's own open would otherwise purge the source under its copy, and the
    copy then differ from the source at every verification."""
    src = str(tmp_path / "one.db")
    with fleetstore.open(src) as store:
        sid, _ = fill(store, 20, sub=False)
        keep, _ = fill(store, 5, sub=False)
        # Many more rows, quickly (the files' rows as appends make them): a purge long
        # enough to overlap the copy if it ran beside it.
        with store.db.write() as tx:
            for i in range(21, 20_021):
                tx.execute(
                    "INSERT INTO messages (id, session_id, seq, role, status, created_at) "
                    "VALUES (?, ?, ?, 'user', 'complete', 0)",
                    (f"bulk-{i}", sid, i),
                )
                tx.execute(
                    "INSERT INTO parts (message_id, seq, session_id, kind, enc, body, size) "
                    "VALUES (?, 0, ?, 'text', 'str', 'x', 1)",
                    (f"bulk-{i}", sid),
                )
    worker = agent(procs, "delete", src, sid, "--batch", "10", "--kill-after", "3")
    assert worker.finish(timeout=WAIT) == -signal.SIGKILL
    report = reshard(src, tmp_path / "dir")
    assert report.ok
    with fleetstore.open(f"sqlite+sharded://{tmp_path / 'dir'}") as dst:
        assert gone(dst, sid) and all(n == 0 for n in rows_of(dst, sid).values())
        assert len(dst.messages.list(keep)) == 5
