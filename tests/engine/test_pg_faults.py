"""Faults on the PostgreSQL engine (issue 5, "Tests"): a writer's backend terminated
mid-transaction, a COMMIT whose connection dies right after it took effect, connections
cut by a TCP proxy under writing threads, the server restarted under a fleet of agent
processes, and the server down for longer than the write budget.

Every write is checked to be there exactly once: messages by their client-chosen ids and
``seq`` (a second application would take the next seq or fail on the id), state puts by
their version (a second application would bump it again), claims by their token.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fleetstore
from fleetstore.core.ids import new_id
from tests import pgserver
from tests.agents import script
from tests.domain.test_history_fleet import check_store, read_log, replied_since
from tests.fix_procs import Barrier, Proc
from tests.tcpproxy import TcpProxy

#: Per-host state of the PostgreSQL stores (spool journals) under tmp_path.
pytestmark = pytest.mark.usefixtures("data_dir")

HISTORY_AGENT = script("history_agent.py")
PG_AGENT = script("pg_agent.py")
WAIT = 60.0  # safety net for every wait on evidence


@pytest.fixture(scope="module")
def restartable() -> Iterator[pgserver.PgServer]:
    """A server of this module's own, to stop and restart: the suite's may be shared
    with tests running at the same time (pytest -n, FLEETSTORE_TEST_PG_URL)."""
    srv = pgserver.start_server()
    try:
        yield srv
    finally:
        pgserver.stop_server(srv)


def wait_for(what: str, check: Callable[[], Any], timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(0.02)


def written(acked: list[list[str]], n: int) -> bool:
    return sum(map(len, acked)) >= n


def count(store: fleetstore.Store, sql: str, params: tuple[Any, ...] = ()) -> int:
    return int(store.read(lambda tx: tx.execute(sql, params))[0][0])


# -- the proxy itself -------------------------------------------------------------------------


def test_proxy_cut_resets_live_connections_and_pause_holds_traffic(pg_url: str) -> None:
    with TcpProxy("127.0.0.1", int(pg_url.split(":")[2].split("/")[0])) as proxy:
        url = f"postgresql://postgres@127.0.0.1:{proxy.port}/{pg_url.rsplit('/', 1)[1]}"
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert proxy.cut() == 1
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 1")
        with psycopg.connect(url, autocommit=True) as conn:
            proxy.pause()
            got: list[Any] = []
            reader = threading.Thread(
                target=lambda: got.append(conn.execute("SELECT 2").fetchone())
            )
            reader.start()
            reader.join(0.3)
            assert reader.is_alive() and got == []  # held, not lost
            proxy.resume()
            reader.join(WAIT)
            assert got == [(2,)]
        assert proxy.cuts == 1 and proxy.accepted == 2


# -- one write meets a fault ------------------------------------------------------------------


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[fleetstore.Store]:
    # No search indexer: its batches commit through the same engine, and one that came
    # while a commit hook was armed was counted as the write's (3 COMMITs against 2).
    with fleetstore.open(pg_url, search_index=False) as s:
        yield s


def test_writer_backend_terminated_mid_transaction_commits_once(
    pg_store: fleetstore.Store, pg_url: str
) -> None:
    """An outside session locks applied_ops (every logged operation writes it), so the
    append waits inside its transaction; its backend is terminated there.  The engine
    starts the write over on a new connection (which waits for the lock again), and once
    the lock is released the append returns and its message is stored once."""
    store = pg_store
    sid = store.sessions.create(title="victim").id
    mid = new_id()
    done: list[Any] = []
    with psycopg.connect(pg_url) as outside, psycopg.connect(pg_url, autocommit=True) as admin:
        outside.execute("LOCK TABLE applied_ops IN ACCESS EXCLUSIVE MODE")
        me = outside.info.backend_pid

        def waiting() -> list[int]:
            rows = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND backend_type = 'client backend' AND wait_event_type = 'Lock' AND pid <> %s",
                (me,),
            ).fetchall()
            return [int(pid) for (pid,) in rows]

        writer = threading.Thread(
            target=lambda: done.append(store.messages.append(sid, "user", "hello", id=mid))
        )
        writer.start()
        (victim,) = wait_for("the append waits for the lock", waiting)
        assert admin.execute("SELECT pg_terminate_backend(%s)", (victim,)).fetchone() == (True,)
        # The write started over: a new backend waits for the same lock.
        (again,) = wait_for("the append waits again", lambda: [p for p in waiting() if p != victim])
        assert again != victim and writer.is_alive() and not done
        outside.rollback()
        writer.join(WAIT)
    assert not writer.is_alive()
    (msg,) = done
    assert (msg.id, msg.seq) == (mid, 1)
    assert count(store, "SELECT count(*) FROM messages WHERE session_id = ?", (sid,)) == 1
    assert count(store, "SELECT count(*) FROM applied_ops WHERE name = 'append_message'") == 1
    assert [m.id for m in store.messages.list(sid)] == [mid]
    assert store.messages.append(sid, "user", "next").seq == 2  # no gap, no duplicate


#: Armed for one COMMIT: the connection dies right after the commit took effect (the
#: sequence, outside any transaction, lets only the first COMMIT through to the kill).
KILL_AFTER_COMMIT = (
    "COMMIT; SELECT pg_terminate_backend(pg_backend_pid()) WHERE nextval('fault_once') = 1"
)


def armed_commit(store: fleetstore.Store, pg_url: str) -> Callable[[], int]:
    """Arm the engine's commit hook for one write; returns a function that disarms it
    and says how many COMMITs went through the hook."""
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("CREATE SEQUENCE fault_once")
    db: Any = store.db
    db._commit_sql = KILL_AFTER_COMMIT

    def disarm() -> int:
        del db._commit_sql  # back to the class's plain COMMIT
        with psycopg.connect(pg_url, autocommit=True) as admin:
            row = admin.execute("SELECT last_value, is_called FROM fault_once").fetchone()
            admin.execute("DROP SEQUENCE fault_once")
        assert row is not None
        return int(row[0]) if row[1] else 0

    return disarm


def test_ambiguous_commit_of_an_append_applies_once(
    pg_store: fleetstore.Store, pg_url: str
) -> None:
    store = pg_store
    sid = store.sessions.create(title="ambiguous").id
    state_before = store.state.put(sid, "k", {"n": 0}).version
    assert state_before is not None
    mid = new_id()
    disarm = armed_commit(store, pg_url)
    try:
        msg = store.messages.append(sid, "user", "once", id=mid)
    finally:
        commits = disarm()
    # The first COMMIT took effect and lost its connection; the write ran again.
    assert commits == 2
    assert (msg.id, msg.seq) == (mid, 1)
    assert count(store, "SELECT count(*) FROM messages WHERE session_id = ?", (sid,)) == 1
    assert [(m.id, m.seq) for m in store.messages.list(sid)] == [(mid, 1)]

    # A state put is not idempotent by a key of its own: applied twice it would bump
    # the version twice.
    disarm = armed_commit(store, pg_url)
    try:
        put = store.state.put(sid, "k", {"n": 1})
    finally:
        commits = disarm()
    assert commits == 2
    assert put.version == state_before + 1
    value = store.state.get(sid, "k")
    assert value is not None and (value.version, value.value) == (state_before + 1, {"n": 1})

    # An enqueue's caller gets the effect's id back: the second run finds the operation
    # in applied_ops with the result the first run stored.
    disarm = armed_commit(store, pg_url)
    try:
        eid = store.effects.enqueue("t-ambiguous", "fx", {"once": True})
    finally:
        commits = disarm()
    assert commits == 2
    assert store.effects.get(eid).payload == {"once": True}
    assert count(store, "SELECT count(*) FROM effects WHERE thread_key = 't-ambiguous'") == 1
    assert store.metrics()["ambiguous_commits"] >= 3


def test_ambiguous_commit_of_a_claim_returns_the_claimed_effects(
    pg_store: fleetstore.Store, pg_url: str
) -> None:
    """A claim whose COMMIT is lost after it took effect: the effects it claimed come
    back to the caller (not left running under a lease nobody holds), claimed once."""
    store = pg_store
    ids = [store.effects.enqueue(f"thread-{i}", "fx", {"i": i}) for i in range(3)]
    later = store.effects.enqueue("thread-0", "fx", {"i": 3})  # behind thread-0's head
    disarm = armed_commit(store, pg_url)
    try:
        claims = store.effects.claim("worker-1", limit=5, lease=60)
    finally:
        commits = disarm()
    assert commits == 2
    assert sorted(c.id for c in claims) == sorted(ids)
    for c in claims:
        assert (c.fence, c.effect.attempt, c.owner) == (1, 1, "worker-1"), c
        stored = store.effects.get(c.id)
        assert (stored.state, stored.fence, stored.attempt) == ("running", 1, 1), stored
    assert store.effects.get(later).state == "pending"
    assert store.effects.claim("worker-2", limit=5) == []  # nothing left to claim
    for c in claims:
        assert c.succeed({"ok": c.id}) is True
    (head,) = store.effects.claim("worker-2", limit=5)
    assert head.id == later
    assert head.succeed() is True
    assert store.effects.counts()["succeeded"] == 4


# -- connections cut under writing threads ----------------------------------------------------


def test_connections_cut_by_a_proxy_under_4_writing_threads(pg_url: str) -> None:
    """Four threads append messages in a loop through a TCP proxy that resets every
    connection again and again: every append returns (none raises), and each message is
    stored exactly once, in the order its thread appended them."""
    host_port, db = pg_url.rsplit("/", 1)
    port = int(host_port.rsplit(":", 1)[1])
    threads, cuts = 4, 10
    with TcpProxy("127.0.0.1", port) as proxy:
        url = f"postgresql://postgres@127.0.0.1:{proxy.port}/{db}"
        store = fleetstore.open(url)
        try:
            sessions = [store.sessions.create(title=f"writer {i}").id for i in range(threads)]
            acked: list[list[str]] = [[] for _ in range(threads)]
            failures: list[BaseException] = []
            stop = threading.Event()

            def write(i: int) -> None:
                try:
                    n = 0
                    while not stop.is_set():
                        n += 1
                        mid = new_id()
                        store.messages.append(sessions[i], "user", f"w{i} m{n}", id=mid)
                        acked[i].append(mid)
                except BaseException as exc:
                    failures.append(exc)

            writers = [threading.Thread(target=write, args=(i,)) for i in range(threads)]
            for t in writers:
                t.start()
            reset = 0
            for _ in range(cuts):
                before = sum(map(len, acked))
                wait_for("writes since the last cut", partial(written, acked, before + 8))
                reset += proxy.cut()
            wait_for("writes after the last cut", lambda: all(len(a) >= 20 for a in acked))
            stop.set()
            for t in writers:
                t.join(WAIT)
            assert failures == [], failures
            assert store.flush(timeout=WAIT)
            metrics = store.db.metrics()
        finally:
            store.close()
    assert reset >= cuts  # every cut found connections to reset
    assert metrics.get("connection_retries", 0) + metrics.get("ambiguous_commits", 0) >= 1, metrics
    with fleetstore.open(pg_url) as check:
        for sid, mids in zip(sessions, acked, strict=True):
            stored = check.messages.list(sid)
            assert [m.id for m in stored] == mids
            assert [m.seq for m in stored] == list(range(1, len(mids) + 1))
        total = count(check, "SELECT count(*) FROM messages")
    assert total == sum(map(len, acked))


# -- the server restarted under a fleet -------------------------------------------------------


def history_fleet(
    url: str, tmp: Path, n: int, procs: list[Proc], barrier: Barrier
) -> tuple[list[Path], Path]:
    stop = tmp / "stop"
    logs = [tmp / f"agent-{i}.log" for i in range(n)]
    for i in range(n):
        args = ["--agent", str(i), "--log", str(logs[i]), "--seed", "5", "--big-prob", "0.002"]
        args += ["--barrier", barrier.path, "--stop", str(stop), "--duration", "300"]
        procs.append(Proc([sys.executable, HISTORY_AGENT, url, *args], name=f"agent {i}"))
    for p in procs:
        p.wait_line("ready", timeout=WAIT)
    return logs, stop


@pytest.mark.fleet
@pytest.mark.timeout(240)
def test_server_restart_under_8_agents_loses_nothing(
    restartable: pgserver.PgServer, procs: list[Proc], barrier: Barrier, tmp_path: Path
) -> None:
    """8 agents (tests/agents/history_agent.py: sessions, streamed replies, tool outputs, state)
    write while the server is restarted (fast shutdown: every session is terminated).
    No agent fails or restarts, every agent finishes replies after the restart, and the
    store holds every acknowledged write exactly once and nothing half applied."""
    url = restartable.create_database()
    fleetstore.open(url).close()  # the schema exists before the fleet starts
    logs, stop = history_fleet(url, tmp_path, 8, procs, barrier)
    t0 = barrier.release()
    for log in logs:
        wait_for(f"{log.name}: a reply before the restart", partial(replied_since, log, t0))
    restarted = time.time()
    restartable.restart("fast")
    for log in logs:
        wait_for(
            f"{log.name}: a reply after the restart", partial(replied_since, log, restarted + 0.5)
        )
    stop.touch()
    for p in procs:
        assert p.finish(timeout=WAIT) == 0, (p.name, p.stderr_tail())
    parsed = [read_log(logs[i], i, killed=False) for i in range(len(logs))]
    tally = check_store(url, parsed)
    assert tally.messages > 0 and tally.sessions >= len(logs)
    print("restart fleet:", json.dumps(tally.counts()))


# -- the server down for longer than the write budget -----------------------------------------


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def acks(path: Path, since: float = 0.0) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(path) if r["ev"] == "ack" and r["t"] > since]


def acked_writes(path: Path, since: float, n: int) -> bool:
    return len(acks(path, since)) >= n


def spooled_since(path: Path, since: float) -> bool:
    """A write acknowledged after *since* while this process's spool held writes."""
    return any(r["spool"] > 0 for r in acks(path, since))


def check_pg_agents(url: str, logs: list[Path]) -> None:
    """Every write a pg_agent logged is stored exactly once: its messages in its session
    in log order with seqs 1..n, its state at the version of its last put."""
    with fleetstore.open(url) as store:
        total = 0
        for path in logs:
            records = read_jsonl(path)
            intents = [r for r in records if r["ev"] == "intent"]
            acked = [r for r in records if r["ev"] == "ack"]
            assert len(intents) == len(acked), f"{path.name}: an operation never returned"
            (sid,) = {r["sid"] for r in records}
            mids = [r["mid"] for r in intents if r["kind"] == "message"]
            stored = store.messages.list(sid)
            assert [m.id for m in stored] == mids, path.name
            assert [m.seq for m in stored] == list(range(1, len(mids) + 1)), path.name
            assert [m.parts[0].text for m in stored] == [  # type: ignore[union-attr]
                r["text"] for r in intents if r["kind"] == "message"
            ]
            puts = sum(r["kind"] == "state" for r in intents)
            value = store.state.get(sid, "progress")
            assert value is not None and value.version == puts, (path.name, value, puts)
            total += len(mids)
        assert count(store, "SELECT count(*) FROM messages") == total


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_server_down_past_the_budget_spools_and_lands_once(
    restartable: pgserver.PgServer,
    procs: list[Proc],
    barrier: Barrier,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """4 writing agents with a 2 s write budget; the server stops for longer than that.
    Their writes go to their spools (the calls return), and once the server is back the
    spools drain (``store.flush()``, as the agents stop): every write lands, exactly
    once, in order."""
    monkeypatch.setenv("FLEETSTORE_WRITE_BUDGET", "2")
    url = restartable.create_database()
    fleetstore.open(url).close()
    stop = tmp_path / "stop"
    logs = [tmp_path / f"pg-agent-{i}.log" for i in range(4)]
    for i, log in enumerate(logs):
        args = [url, "--agent", str(i), "--log", str(log), "--stop", str(stop)]
        procs.append(Proc([sys.executable, PG_AGENT, *args, "--barrier", barrier.path], f"pg {i}"))
    for p in procs:
        p.wait_line("ready", timeout=WAIT)
    barrier.release()
    for log in logs:
        wait_for(f"{log.name}: writes before the stop", partial(acked_writes, log, 0.0, 10))
    down = time.time()
    restartable.stop("fast")
    try:
        for log in logs:
            # Evidence that the budget ran out: writes acknowledged into the spool.
            wait_for(f"{log.name}: a write spooled", partial(spooled_since, log, down))
        assert time.time() - down > 2.0
    finally:
        restartable.start()
    # The calls kept returning meanwhile; the agents stop now and flush on the way out
    # (a spooled write lands in order behind the earlier ones: a spool fed faster than
    # the server applies it drains once its process stops writing).
    assert restartable.admin("SELECT 1") == [(1,)]
    stop.touch()
    reports = []
    for p in procs:
        assert p.finish(timeout=150) == 0, (p.name, p.stderr_tail())  # flush: up to 120 s
        (line,) = [line for _, line in p.seen if line.startswith("report ")]
        reports.append(json.loads(line.split(" ", 1)[1]))
    for rep in reports:
        assert rep["flushed"] is True and rep["spool_pending"] == 0, rep
        assert rep["spooled"] > 0 and rep["replayed"] == rep["spooled"], rep
        assert rep["rejected"] == 0, rep
    check_pg_agents(url, logs)
