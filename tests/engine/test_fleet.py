"""Fleet tests: many real OS processes writing one real file (issue 2, "Tests").

Every outside party (``fleetstore lock``, a gate holder, a killed writer) is a separate
process; this process only ever touches the store through ``fleetstore.Database`` (never
the stdlib ``sqlite3``: DESIGN.md, "Two SQLite libraries in one process").  Bounds on time
are generous on purpose (2 shared cores); the real figures belong to ``benchmarks/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest

from fleetstore import Database, Migration, ReadTx, StoreBusy
from fleetstore.errors import LockHolder
from tests.agents.fleet_agent import MARKER_AGENT, SCHEMA, logged_migrations
from tests.fix_procs import Barrier, Proc, Spawn, start_lock

FLEET = 16


def insert(tx: Any, agent: int, seq: int) -> None:
    tx.execute(
        "INSERT INTO rows(agent, seq, pid, t) VALUES (?, ?, ?, ?)",
        (agent, seq, os.getpid(), time.time()),
    )


def read_acks(paths: list[Path]) -> list[tuple[int, int, float]]:
    acks = []
    for p in paths:
        if not p.exists():
            continue
        for line in p.read_text().splitlines():
            agent, seq, at = line.split()
            acks.append((int(agent), int(seq), float(at)))
    return acks


def stored_rows(db: Database) -> Counter[tuple[int, int]]:
    rows = db.read(lambda tx: tx.execute("SELECT agent, seq FROM rows"))
    return Counter((int(a), int(s)) for a, s in rows)


def integrity(db: Database) -> list[tuple[object, ...]]:
    return db.read(lambda tx: tx.execute("PRAGMA integrity_check"))


def start_writer(spawn: Spawn, path: str, agent: int, ack: Path, *options: str) -> Proc:
    return spawn(
        "writer", path, "--agent", str(agent), "--ack", str(ack), *options, name=f"writer {agent}"
    )


def writer_report(proc: Proc, timeout: float) -> dict[str, Any]:
    rc = proc.finish(timeout=timeout)
    last = proc.last_line()
    assert last.startswith("{"), f"{proc.name} rc={rc} stdout={proc.seen} {proc.stderr_tail()}"
    report: dict[str, Any] = json.loads(last)
    assert rc == 0 and report["failed"] == 0, (
        f"{proc.name} rc={rc} report={report} stderr={proc.stderr_tail()}"
    )
    return report


@pytest.mark.fleet
@pytest.mark.timeout(180)
def test_outside_lock_mid_run_loses_nothing(
    spawn: Spawn, barrier: Barrier, store_path: str, tmp_path: Path
) -> None:
    stop = tmp_path / "stop"
    acks = [tmp_path / f"ack-{i}" for i in range(FLEET)]
    options = ("--think-ms", "10", "--barrier", barrier.path, "--stop", str(stop))
    agents = [start_writer(spawn, store_path, i, acks[i], *options) for i in range(FLEET)]
    for a in agents:
        a.wait_line("ready", timeout=60)
    t0 = barrier.release()

    time.sleep(max(0.0, t0 + 1.7 - time.time()))  # the lock process takes ~0.3 s to start
    hold = 6.5
    lock, locked_at = start_lock(spawn, store_path, hold)
    released_at, released = lock.wait_line("released", timeout=hold + 30)
    assert lock.finish(timeout=10) == 0, lock.stderr_tail()
    # Run on for ~10 s in all, and at least 1.5 s past the release.
    time.sleep(max(0.0, t0 + 10.0 - time.time(), released_at + 1.5 - time.time()))
    stop.touch()
    reports = [writer_report(a, timeout=90) for a in agents]

    acked = read_acks(acks)
    assert sum(r["acked"] for r in reports) == len(acked)
    keys = Counter((agent, seq) for agent, seq, _ in acked)
    assert max(keys.values()) == 1, "an agent acknowledged the same seq twice"

    # The lock really was held: writes before it, none while it was held, some after.
    before = [t for *_, t in acked if t < locked_at]
    during = [t for *_, t in acked if locked_at + 1.0 < t < locked_at + hold - 0.5]
    after = [t for *_, t in acked if t > released_at]
    assert before, f"no write acknowledged before the lock ({len(acked)} in all)"
    assert not during, f"{len(during)} writes acknowledged while the outside lock was held"
    assert after, f"no write acknowledged after the release ({released})"

    with Database.open(store_path) as db:
        rows = stored_rows(db)
        dup = {k: n for k, n in rows.items() if n > 1}
        assert not dup, f"rows committed more than once: {sorted(dup)[:10]}"
        lost = set(keys) - set(rows)
        assert not lost, f"{len(lost)} acknowledged rows missing: {sorted(lost)[:10]}"
        assert set(rows) == set(keys), "rows committed that no agent acknowledged"
        assert integrity(db) == [("ok",)]


@pytest.mark.timing
@pytest.mark.slow
def test_budget_exceeded_raises_store_busy_then_recovers(spawn: Spawn, store_path: str) -> None:
    db = Database.open(store_path, write_budget=2)
    try:
        hold = 5.0
        lock, locked_at = start_lock(spawn, store_path, hold)
        body_ran = False
        start = time.monotonic()
        with pytest.raises(StoreBusy) as caught, db.write() as tx:
            body_ran = True
            insert(tx, MARKER_AGENT, 1)
        waited = time.monotonic() - start
        busy = caught.value
        assert 1.8 <= waited <= 4.5, f"StoreBusy after {waited:.2f}s with a 2 s budget"
        assert time.time() < locked_at + hold, "the outside lock was gone before StoreBusy"
        assert not body_ran, "the block body ran although the lock was never obtained"
        assert 1.8 <= busy.waited <= 4.5, busy.waited
        assert busy.attempts >= 1
        assert busy.stage == "sqlite", busy.stage
        assert busy.path == db.path
        assert lock.pid in [h.pid for h in busy.holders], f"{busy.holders} / {busy}"
        assert all(isinstance(h, LockHolder) for h in busy.holders)

        lock.wait_line("released", timeout=hold + 30)
        assert lock.finish(timeout=10) == 0, lock.stderr_tail()
        with db.write() as tx:
            insert(tx, 0, 1)
        rows = stored_rows(db)
        assert rows == Counter({(0, 1): 1}), rows  # and nothing from the attempt that failed
        assert integrity(db) == [("ok",)]
    finally:
        db.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_concurrent_fresh_open_applies_each_migration_once(
    spawn: Spawn, barrier: Barrier, tmp_path: Path
) -> None:
    path = str(tmp_path / "fresh" / "nested" / "store.db")  # neither file nor dirs exist yet
    procs = [
        spawn("migrate", path, "--barrier", barrier.path, name=f"migrate {i}") for i in range(FLEET)
    ]
    for p in procs:
        p.wait_line("ready", timeout=60)
    time.sleep(0.2)  # let the last ones reach the barrier
    assert not os.path.exists(path)
    barrier.release()

    reports = []
    for p in procs:
        rc = p.finish(timeout=90)
        assert rc == 0, f"{p.name} rc={rc}: {p.stderr_tail()}"
        reports.append(json.loads(p.last_line()))
    assert [r["schema_version"] for r in reports] == [3] * FLEET
    began = [r["began"] for r in reports]
    assert max(began) - min(began) < 1.0, "the opens were not concurrent"

    assert os.stat(path).st_mode & 0o777 == 0o600
    with Database.open(path, migrations=logged_migrations(os.getpid())) as db:
        assert db.schema_version == 3
        log = db.read(lambda tx: tx.execute("SELECT version, pid FROM migration_log"))
        per_version = Counter(int(v) for v, _ in log)
        assert per_version == Counter({1: 1, 2: 1, 3: 1}), log
        assert {int(pid) for _, pid in log} <= {r["pid"] for r in reports}
        assert integrity(db) == [("ok",)]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_kill9_inside_write_transaction(spawn: Spawn, store_path: str, tmp_path: Path) -> None:
    victim = spawn("inside", store_path, "--markers", "50", name="victim")
    victim.wait_line("inside", timeout=30)

    acks = [tmp_path / f"ack-{i}" for i in range(4)]
    writers = [
        start_writer(spawn, store_path, i, acks[i], "--count", "10", "--think-ms", "5")
        for i in range(4)
    ]
    for w in writers:
        w.wait_line("started", timeout=60)
    time.sleep(1.5)  # opened, and queued behind the victim
    assert read_acks(acks) == [], "a write committed while the victim held the lock"
    assert all(w.popen.poll() is None for w in writers)

    killed_at = time.time()
    os.kill(victim.pid, signal.SIGKILL)
    assert victim.finish(timeout=10) == -signal.SIGKILL

    for w in writers:
        writer_report(w, timeout=60)
    acked = read_acks(acks)
    assert len(acked) == 40
    assert min(t for *_, t in acked) >= killed_at
    first_per_writer = [min(t for a, _, t in acked if a == i) for i in range(4)]
    assert max(first_per_writer) - killed_at < 15.0, "writers did not carry on after the kill"

    with Database.open(store_path) as db:
        rows = stored_rows(db)
        assert not [k for k in rows if k[0] == MARKER_AGENT], "uncommitted rows of the killed txn"
        assert rows == Counter((a, s) for a, s, _ in acked)
        assert integrity(db) == [("ok",)]


@pytest.mark.slow
def test_kill9_of_writer_whose_forked_child_lives_on_frees_the_gate(
    spawn: Spawn, store_path: str, tmp_path: Path
) -> None:
    """A writer forks inside its write (multiprocessing's "fork" from another thread does
    this), then dies by kill -9.  The child, which never touches the store, must not keep
    the writer's gate locked: flock belongs to the open file, which the child shares
    until it closes its inherited descriptor."""
    victim = spawn("inside", store_path, "--fork-child", "60", name="victim")
    _, line = victim.wait_line("inside", timeout=30)
    child = int(line.split("child=")[1])
    try:
        os.kill(victim.pid, signal.SIGKILL)
        assert victim.finish(timeout=10) == -signal.SIGKILL
        ack = tmp_path / "ack"
        writer = start_writer(spawn, store_path, 0, ack, "--count", "2", "--budget", "5")
        writer_report(writer, timeout=60)
        assert len(read_acks([ack])) == 2
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    with Database.open(store_path) as db:
        assert stored_rows(db) == Counter({(0, 1): 1, (0, 2): 1})
        assert integrity(db) == [("ok",)]


def test_outside_lock_released_writer_commits_promptly(spawn: Spawn, store_path: str) -> None:
    db = Database.open(store_path)
    try:
        hold = 2.0
        lock, locked_at = start_lock(spawn, store_path, hold)
        time.sleep(max(0.0, locked_at + 0.5 - time.time()))
        began = time.time()
        with db.write() as tx:
            insert(tx, 0, 1)
        committed = time.time()
        _, released = lock.wait_line("released", timeout=30)
        assert lock.finish(timeout=10) == 0, lock.stderr_tail()
        assert re.fullmatch(rf"released {re.escape(store_path)} after \d+\.\d\ds", released)

        # The lock was taken at or before locked_at, so it was released at about
        # locked_at + hold at the latest.
        assert began < locked_at + hold - 0.5, "the writer did not start while the lock was held"
        assert committed > locked_at + 1.0, "the writer committed under the outside lock"
        lag = committed - (locked_at + hold)
        assert lag <= 1.0, f"writer committed {lag:.3f}s after the outside lock was released"
        assert stored_rows(db) == Counter({(0, 1): 1})
    finally:
        db.close()


@pytest.mark.timing
@pytest.mark.slow
def test_gate_held_by_other_process_store_busy_names_pid_and_gate_released_after(
    spawn: Spawn, store_path: str
) -> None:
    db = Database.open(store_path, write_budget=1)
    try:
        with db.write() as tx:  # the gate file exists and this Database has used it
            insert(tx, 0, 1)
        holder = spawn("hold-gate", store_path, "--hold", "3.5", name="gate holder")
        _, line = holder.wait_line("held", timeout=30)
        assert line == f"held pid={holder.pid}"

        body_ran = False
        start = time.monotonic()
        with pytest.raises(StoreBusy) as caught, db.write() as tx:
            body_ran = True
            insert(tx, MARKER_AGENT, 1)
        waited = time.monotonic() - start
        busy = caught.value
        assert 0.8 <= waited <= 3.0, f"StoreBusy after {waited:.2f}s with a 1 s budget"
        assert not body_ran
        assert busy.stage == "gate", busy.stage
        assert (holder.pid, "gate") in [(h.pid, h.lock) for h in busy.holders], busy.holders

        holder.wait_line("released", timeout=30)
        assert holder.finish(timeout=10) == 0
        # A gate that the abandoned wait obtained later must have been dropped at once.
        probe = spawn("probe-gate", store_path, "--within", "1.0", name="probe")
        assert probe.finish(timeout=30) == 0, f"gate still held: {probe.seen} {probe.stderr_tail()}"

        start = time.monotonic()
        with db.write() as tx:
            insert(tx, 0, 2)
        assert time.monotonic() - start < 1.0, "write after the gate's release was not prompt"
        probe = spawn("probe-gate", store_path, "--within", "1.0", name="probe again")
        assert probe.finish(timeout=30) == 0, f"gate still held: {probe.seen} {probe.stderr_tail()}"
        assert json.loads(probe.last_line())["after"] < 0.5

        assert stored_rows(db) == Counter({(0, 1): 1, (0, 2): 1})
    finally:
        db.close()


#: os.fork() in a process with threads (pytest's, the engine's gate waiters) warns on
#: Python >= 3.12; these tests fork on purpose, the child leaving through os._exit.
forks = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")


def in_child(body: Callable[[], bool]) -> NoReturn:
    """Run *body* in a forked child and leave through ``os._exit`` only: 0 if it returned
    True, 4 if False, 5 if it raised (traceback on stderr)."""
    code = 3
    try:
        code = 0 if body() else 4
    except BaseException:
        traceback.print_exc()
        code = 5
    finally:
        os._exit(code)


def child_exit_code(pid: int, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child hung for {timeout}s")


def posix_locks(pid: int, db_path: str) -> int:
    """How many POSIX locks /proc/locks shows *pid* holding on the database or its -shm."""
    inodes = {os.stat(db_path + suffix).st_ino for suffix in ("", "-shm")}
    count = 0
    with open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()
            if fields[1] == "->":  # a blocked waiter
                continue
            if fields[1] == "POSIX" and int(fields[4]) == pid:
                count += int(fields[5].split(":")[2]) in inodes
    return count


@forks
def test_fork_child_never_reuses_parent_connections(store_path: str) -> None:
    db = Database.open(store_path, migrations=SCHEMA)
    try:
        with db.write() as tx:
            insert(tx, 1, 1)
        assert stored_rows(db) == Counter({(1, 1): 1})  # the parent has a read connection too

        def child() -> bool:
            with db.write() as tx:
                insert(tx, 2, 1)
            if stored_rows(db) != Counter({(1, 1): 1, (2, 1): 1}):
                return False
            # A connection opened by this process holds SQLite's POSIX locks (the
            # shared lock on the database, the WAL-index read lock) under this pid; an
            # inherited one holds them under the parent's pid only.
            return posix_locks(os.getpid(), store_path) > 0

        pid = os.fork()
        if pid == 0:
            in_child(child)
        assert child_exit_code(pid) == 0, (
            "the child failed (4: wrong rows or no SQLite lock of its own, 5: raised)"
        )

        for seq in (2, 3):
            with db.write() as tx:
                insert(tx, 1, seq)
        assert stored_rows(db) == Counter({(1, 1): 1, (2, 1): 1, (1, 2): 1, (1, 3): 1})
        assert integrity(db) == [("ok",)]
    finally:
        db.close()


@forks
def test_fork_waits_until_no_other_thread_is_inside_sqlite(store_path: str) -> None:
    """A connection another thread is using at the instant of a fork may be inside
    SQLite: the child can neither close it nor keep it (its in-process lock state
    makes the child's own connections take no real lock; writes of a child forked
    while a background thread waited inside db.write() were lost).  So a fork waits
    until no other thread is inside SQLite, and the child closes every connection."""
    db = Database.open(store_path, migrations=SCHEMA)
    with db.write() as tx:
        insert(tx, 1, 1)
    entered = threading.Event()
    finished: list[float] = []

    def long_read(tx: ReadTx) -> None:
        entered.set()
        # A statement that keeps this thread inside SQLite for a while.
        tx.execute(
            "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 3000000) "
            "SELECT count(*) FROM c"
        )
        finished.append(time.monotonic())

    reader = threading.Thread(target=lambda: db.read(long_read))
    reader.start()
    try:
        assert entered.wait(30)
        time.sleep(0.05)  # let the statement start
        pid = os.fork()
        if pid == 0:

            def child() -> bool:
                with db.write() as tx:
                    insert(tx, 2, 1)
                return stored_rows(db) == Counter({(1, 1): 1, (2, 1): 1})

            in_child(child)
        forked = time.monotonic()
        assert child_exit_code(pid) == 0, "the child could not write and read its row"
        reader.join(60)
        # Ordering, not speed: the fork returned only after the read left SQLite.
        assert finished and finished[0] <= forked
        assert stored_rows(db) == Counter({(1, 1): 1, (2, 1): 1})
        assert integrity(db) == [("ok",)]
    finally:
        reader.join(60)
        db.close()


@forks
def test_fork_child_writes_survive_parent_closing_its_database(store_path: str) -> None:
    """The child's connections must be its own down to SQLite's POSIX locks: when the
    parent closes its last connection, SQLite checkpoints and deletes the WAL unless some
    other process holds a lock on the file, and a child whose connections ride on the
    inherited lock state holds none, so its later acknowledged commits vanish."""
    db = Database.open(store_path, migrations=SCHEMA)
    with db.write() as tx:
        insert(tx, 1, 1)
    db.read(lambda tx: tx.execute("SELECT count(*) FROM rows"))
    to_parent_r, to_parent_w = os.pipe()
    to_child_r, to_child_w = os.pipe()

    def child() -> bool:
        os.close(to_parent_r)
        os.close(to_child_w)
        with db.write() as tx:
            insert(tx, 2, 1)
        os.write(to_parent_w, b"1")
        if os.read(to_child_r, 1) != b"x":  # the parent has closed its Database
            return False
        for seq in range(2, 7):
            with db.write() as tx:
                insert(tx, 2, seq)
        seen = stored_rows(db)
        db.close()
        return seen == Counter({(1, 1): 1, **{(2, n): 1 for n in range(1, 7)}})

    pid = os.fork()
    if pid == 0:
        in_child(child)
    try:
        os.close(to_parent_w)
        os.close(to_child_r)
        ready, _, _ = select.select([to_parent_r], [], [], 30)
        assert ready and os.read(to_parent_r, 1) == b"1", "the child did not write"
        db.close()
        os.write(to_child_w, b"x")
        assert child_exit_code(pid) == 0, "the child failed (4: wrong rows, 5: raised)"
    finally:
        for fd in (to_parent_r, to_child_w):
            os.close(fd)
        db.close()
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG) == (0, 0):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)

    with Database.open(store_path) as fresh:
        assert stored_rows(fresh) == Counter({(1, 1): 1, **{(2, n): 1 for n in range(1, 7)}})
        assert integrity(fresh) == [("ok",)]


@forks
def test_fork_inside_parent_write_child_queues_behind_parent(store_path: str) -> None:
    """Forked while the parent holds the gate and the SQLite lock: a child reusing the
    inherited gate descriptor (same open file, so flock succeeds) or connection (already
    inside a transaction) would not wait; a fork-safe child queues behind the parent.
    The budget only bounds the time a failure takes: the child waits ~0.5 s."""
    db = Database.open(store_path, migrations=SCHEMA, write_budget=10)
    try:

        def child() -> bool:
            with db.write() as tx:
                insert(tx, 2, 1)
            return stored_rows(db) == Counter({(1, 1): 1, (2, 1): 1})

        with db.write() as tx:
            insert(tx, 1, 1)
            pid = os.fork()
            if pid == 0:
                in_child(child)
            time.sleep(0.5)
            parent_commits = time.time()
        assert child_exit_code(pid) == 0, "the child failed (4: wrong rows, 5: raised)"

        rows = db.read(lambda tx: tx.execute("SELECT agent, t FROM rows ORDER BY agent"))
        assert [a for a, _ in rows] == [1, 2]
        assert rows[1][1] >= parent_commits, "the child wrote while the parent held the lock"
        with db.write() as tx:
            insert(tx, 1, 2)
        assert integrity(db) == [("ok",)]
    finally:
        db.close()


SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}

#: A migration that undoes a connection setting, as migration code does in the wild: the
#: engine must re-assert its settings afterwards (DESIGN.md, promise 6).
HOSTILE_SCHEMA = (*SCHEMA, Migration(2, "sloppy migration", "PRAGMA busy_timeout = 0"))


def check_report(db: Database, synchronous: str, roles: int = 2) -> None:
    report = db.connection_report()
    assert len({c["role"] for c in report}) >= roles, report
    for conn in report:
        sync = conn["synchronous"]
        sync = SYNC_NAMES.get(sync, sync) if isinstance(sync, int) else str(sync).upper()
        assert str(conn["journal_mode"]).lower() == "wal", conn
        # The writer's BEGIN is retried by fleetstore itself (1 ms steps, the gate
        # holder only): it keeps no busy timeout; every other connection has one.
        if conn["role"] == "writer":
            assert int(conn["busy_timeout"]) == 0, conn
        else:
            assert int(conn["busy_timeout"]) > 0, conn
        assert sync == synchronous, conn
        assert conn["foreign_keys"] in (1, True), conn


def exercise(db: Database) -> None:
    with db.write() as tx:
        insert(tx, 0, 1)
    db.read(lambda tx: tx.execute("SELECT count(*) FROM rows"))


@pytest.mark.parametrize("synchronous", [None, "FULL"])
def test_every_connection_is_configured(synchronous: str | None, tmp_path: Path) -> None:
    settings: dict[str, Any] = {} if synchronous is None else {"synchronous": synchronous}
    expected = synchronous or "NORMAL"
    path = str(tmp_path / "configured.db")

    with Database.open(path, migrations=HOSTILE_SCHEMA, **settings) as db:
        assert db.schema_version == 2
        check_report(db, expected, roles=1)  # as the migrations left them
        exercise(db)
        check_report(db, expected)
    with Database.open(path, migrations=HOSTILE_SCHEMA, **settings) as db:
        exercise(db)
        check_report(db, expected)
    with Database.open(path, **settings) as db:
        exercise(db)
        check_report(db, expected)
