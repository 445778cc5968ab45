"""The engine contract, River's ``riverdrivertest`` style: one set of tests, each run on
every engine through the ``engine`` fixture below:

* ``sqlite``     - a ``Database`` file;
* ``postgresql`` - a ``PgDatabase`` on the suite's own server (tests/fix_pg.py);
* ``shard``      - a shard file of a ``ShardSet``, the ``Database`` that
  ``shards.use(key, create=True)`` gives.

Where the engines legitimately differ, the difference is an attribute of the fixture
object (``engine.reruns_allowed``, ``engine.lock_before_body``, ``engine.busy_stage``...),
stated and explained once, not an ``if`` in each test.  Every outside party (a lock
holder, processes migrating at once, a notifier, a writer inside its transaction) is a
real process: ``fleetstore lock`` (``start_lock``) or tests/agents/contract_agent.py.
No mocks of a database.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetstore import Database, Migration, errors
from fleetstore.core.targets import CATALOG, SHARDS
from fleetstore.engine.postgres import PgDatabase
from tests.agents import script
from tests.agents.contract_agent import INSIDE_KEY, SCHEMA, open_engine
from tests.fix_procs import Barrier, Proc, Spawn, start_lock

AGENT = script("contract_agent.py")
INSERT = "INSERT INTO items(k, v) VALUES (?, ?)"
#: How long an outside lock is held in the test that waits it out.
HOLD = 1.5
#: How much earlier than its ``locked`` line arrived a lock may have been taken (the
#: line's trip through a pipe and a reader thread, on loaded cores).
SLACK = 0.5
#: The counters a rerun of a ``run_write`` function is counted in (core/metrics.py).
RETRY_COUNTERS = (
    "serialization_retries",
    "deadlock_retries",
    "connection_retries",
    "ambiguous_commits",
    "unique_retries",
)


@dataclass(frozen=True)
class Target:
    """A store an engine can be opened on: a file, a server database, or the shard
    *key* of the sharded store in the directory *location*."""

    kind: str
    location: str
    key: str | None = None

    def argv(self) -> list[str]:
        """The arguments tests/agents/contract_agent.py takes for this store."""
        return [self.kind, self.location, *(["--key", self.key] if self.key else [])]


class EngineUnderTest:
    """One engine of the contract: how to open it, how to lock it from outside, and
    what it promises where the engines differ."""

    #: ``run_write`` may call its function more than once.  PostgreSQL starts a
    #: transaction over on a serialization failure (40001), a deadlock, a lost
    #: connection, and a unique violation (which may be a concurrent insert of the same
    #: key: engine/postgres.py, _UNIQUE_RETRIES); every extra run is counted in one of
    #: RETRY_COUNTERS.  SQLite's writers are serial: the function runs once.
    reruns_allowed: bool
    #: ``write()`` has the write lock before its body runs.  SQLite: the gate and
    #: ``BEGIN IMMEDIATE`` are waited for first, so a body never starts under an
    #: outside lock and its wait shows in ``metrics()["lock_wait"]``.  PostgreSQL: each
    #: statement takes its own locks, so the body starts at once and its first write
    #: waits (the wait shows in ``lock_hold``; a lock_timeout ends it at the budget).
    lock_before_body: bool
    #: ``StoreBusy.stage`` when an outside lock outlasts the write budget.
    busy_stage: str

    def __init__(
        self, kind: str, tmp_path: Path, request: pytest.FixtureRequest, stack: contextlib.ExitStack
    ) -> None:
        self.kind = kind
        self._tmp = tmp_path
        self._request = request
        self._stack = stack
        self._fresh = itertools.count()
        if kind == "postgresql":
            self.reruns_allowed, self.lock_before_body = True, False
            self.busy_stage = "statement"
        else:
            self.reruns_allowed, self.lock_before_body = False, True
            self.busy_stage = "sqlite"
        #: The store the tests open (``open()``) and lock (``lock_path``).
        self.target = self.fresh_target()

    def __repr__(self) -> str:
        return f"<engine {self.kind}>"

    def fresh_target(self) -> Target:
        """A store no process has opened yet (for a shard: a new key of a new store)."""
        n = next(self._fresh)
        if self.kind == "sqlite":
            return Target("sqlite", str(self._tmp / f"contract{n}.db"))
        if self.kind == "shard":
            return Target("shard", str(self._tmp / f"sharded{n}"), f"key-{n:02}")
        server = self._request.getfixturevalue("pg_server")
        url: str = server.create_database("contract")
        self._stack.callback(server.drop_database, url.rsplit("/", 1)[1])
        return Target("postgresql", url)

    def open(
        self,
        target: Target | None = None,
        migrations: Sequence[Migration] = SCHEMA,
        **settings: Any,
    ) -> Any:
        """The engine on *target* (default: ``self.target``) with *migrations*, closed
        when the test ends.  A 10 s write budget unless told (a failure must not wait
        out the default 60 s)."""
        target = target or self.target
        settings.setdefault("write_budget", 10)
        return self._stack.enter_context(
            open_engine(target.kind, target.location, target.key, migrations, **settings)
        )

    def open_each_file(self, target: Target) -> list[Any]:
        """Every database *target* consists of, each opened as itself without
        migrations: what migrations are applied to (a shard: its catalog and the shard)."""
        if target.kind == "postgresql":
            return [self._stack.enter_context(PgDatabase.open(target.location))]
        paths = [target.location]
        if target.kind == "shard":
            assert target.key is not None
            paths = [str(Path(target.location) / CATALOG), self.path_of(target)]
        return [self._stack.enter_context(Database.open(p)) for p in paths]

    def path_of(self, target: Target) -> str:
        """What ``fleetstore lock`` is given to hold *target*'s write lock."""
        if target.kind == "shard":
            assert target.key is not None
            return str(Path(target.location) / SHARDS / target.key[-2:] / f"{target.key}.db")
        return target.location

    @property
    def lock_path(self) -> str:
        return self.path_of(self.target)

    def agent(self, procs: list[Proc], command: str, target: Target, *args: str) -> Proc:
        """tests/agents/contract_agent.py COMMAND on *target*, killed when the test ends."""
        proc = Proc([sys.executable, AGENT, command, *target.argv(), *args], f"{command} agent")
        procs.append(proc)
        return proc

    def check_runs(self, runs: int, committed: int) -> None:
        """A function that committed *committed* times ran *runs* times: as often on an
        engine that never reruns, at least as often on one that may."""
        if self.reruns_allowed:
            assert runs >= committed, (runs, committed)
        else:
            assert runs == committed, f"ran {runs} times for {committed} commits"


@pytest.fixture(params=["sqlite", "postgresql", "shard"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EngineUnderTest]:
    """The engine under test.  (Overrides tests/fix_stores.py's ``engine``, the store
    contract's parameter, in this module.)"""
    with contextlib.ExitStack() as stack:
        yield EngineUnderTest(str(request.param), tmp_path, request, stack)


# -- helpers -------------------------------------------------------------------------------


def items(db: Any) -> dict[str, int]:
    """The committed rows, as one read sees them."""
    return {k: v for k, v in db.read(lambda tx: tx.execute("SELECT k, v FROM items"))}


def insert(k: str, v: int) -> Callable[[Any], None]:
    """A ``run_write`` function inserting one row."""

    def fn(tx: Any) -> None:
        tx.execute(INSERT, (k, v))

    return fn


def retries(db: Any) -> int:
    metrics = db.metrics()
    return sum(int(metrics[name]) for name in RETRY_COUNTERS)


def no_open_transaction(db: Any) -> bool:
    return not any(c["in_transaction"] for c in db.connection_report())


def release(lock: Proc) -> None:
    """End a ``fleetstore lock`` early (SIGTERM lets go at once) and check its exit."""
    lock.popen.send_signal(signal.SIGTERM)
    lock.wait_line("released", timeout=30)
    assert lock.finish(timeout=30) == 0, lock.stderr_tail()


# -- the body runs once ---------------------------------------------------------------------


def test_a_write_body_runs_once_and_commits_once(engine: EngineUnderTest) -> None:
    db = engine.open()
    runs = 0
    with db.write() as tx:
        runs += 1
        tx.execute(INSERT, ("block", 1))
    assert runs == 1

    calls = 0

    def fn(tx: Any) -> str:
        nonlocal calls
        calls += 1
        tx.execute(INSERT, ("fn", 2))
        return "its result"

    assert db.run_write(fn) == "its result"
    assert calls == 1, "nothing conflicted: no engine has a reason to run it again"
    assert items(db) == {"block": 1, "fn": 2}


def test_a_concurrent_read_modify_write_is_applied_once_and_every_rerun_is_counted(
    engine: EngineUnderTest,
) -> None:
    """Two threads increment one counter with ``run_write``; the first reads it, then
    lets the second run before it writes.  PostgreSQL: the first's snapshot predates the
    second's commit, its UPDATE fails with 40001 and its function runs again on a new
    snapshot.  SQLite: the second waits for the first's gate, nothing conflicts."""
    db = engine.open(pool_size=4)
    db.run_write(insert("counter", 0))
    before = retries(db)
    runs: Counter[str] = Counter()
    let_b_run, b_done = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def increment(name: str, tx: Any) -> None:
        runs[name] += 1
        [(value,)] = tx.execute("SELECT v FROM items WHERE k = 'counter'")
        if name == "a" and runs["a"] == 1:
            let_b_run.set()
            b_done.wait(0.5)  # SQLite: b waits for our gate, this times out
        tx.execute("UPDATE items SET v = ? WHERE k = 'counter'", (value + 1,))
        tx.execute(INSERT, (name, value + 1))

    def run_b() -> None:
        try:
            assert let_b_run.wait(30)
            db.run_write(functools.partial(increment, "b"))
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)
        finally:
            b_done.set()

    other = threading.Thread(target=run_b)
    other.start()
    db.run_write(functools.partial(increment, "a"))
    other.join(30)
    assert not failures, failures

    rows = items(db)
    assert rows["counter"] == 2, "an update was lost"
    assert sorted(rows) == ["a", "b", "counter"]
    assert sorted([rows["a"], rows["b"]]) == [1, 2], "one increment must run on the other's result"
    assert runs["b"] == 1
    extra = runs["a"] + runs["b"] - 2
    assert extra == retries(db) - before, "a rerun not counted in the retry metrics"
    # The conflict is provoked on purpose: an engine that reruns must rerun here.
    assert extra == (1 if engine.reruns_allowed else 0), runs


@pytest.mark.timing
def test_an_outside_lock_within_the_budget_is_waited_out_and_each_body_runs_once(
    engine: EngineUnderTest, spawn: Spawn
) -> None:
    db = engine.open(write_budget=10)
    lock, locked_at = start_lock(spawn, engine.lock_path, HOLD)
    block: dict[str, Any] = {"runs": []}

    def write_block() -> None:
        try:
            with db.write() as tx:
                block["runs"].append(time.time())
                tx.execute(INSERT, ("block", 1))
            block["committed"] = time.time()
        except BaseException as exc:  # pragma: no cover - reported below
            block["error"] = exc

    other = threading.Thread(target=write_block)
    other.start()
    fn_runs: list[float] = []

    def fn(tx: Any) -> None:
        fn_runs.append(time.time())
        tx.execute(INSERT, ("fn", 2))

    db.run_write(fn)
    fn_committed = time.time()
    other.join(30)
    assert "error" not in block, block
    _, released = lock.wait_line("released", timeout=30)
    assert lock.finish(timeout=10) == 0, lock.stderr_tail()

    not_before = locked_at + HOLD - SLACK  # the release, at the earliest
    assert fn_committed >= not_before, f"committed {locked_at + HOLD - fn_committed:.2f}s early"
    assert block["committed"] >= not_before
    assert len(block["runs"]) == 1, "a write() body ran more than once"
    engine.check_runs(len(fn_runs), 1)
    if engine.lock_before_body:
        assert block["runs"][0] >= not_before, "the body ran before the lock was had"
    assert items(db) == {"block": 1, "fn": 2}
    waited_in = "lock_wait" if engine.lock_before_body else "lock_hold"
    assert db.metrics()[waited_in]["max"] >= HOLD - SLACK - 0.2, (released, db.metrics())
    assert no_open_transaction(db)


@pytest.mark.timing
def test_store_busy_past_the_budget_writes_nothing_and_the_engine_recovers(
    engine: EngineUnderTest, spawn: Spawn
) -> None:
    db = engine.open(write_budget=0.5)
    db.run_write(insert("before", 1))
    busy_before = db.metrics()["busy_timeouts"]
    lock, _ = start_lock(spawn, engine.lock_path, 60)

    body_runs = 0
    started = time.monotonic()
    with pytest.raises(errors.StoreBusy) as caught, db.write() as tx:
        body_runs += 1
        tx.execute(INSERT, ("busy block", 2))
    waited = time.monotonic() - started
    assert lock.popen.poll() is None, "the outside lock ended before StoreBusy"
    busy = caught.value
    assert 0.4 <= busy.waited <= 3.0, busy.waited
    assert 0.4 <= waited <= 3.0, waited
    assert busy.stage == engine.busy_stage, busy
    assert busy.path == db.path
    assert isinstance(busy, errors.TransientError)
    assert body_runs == (0 if engine.lock_before_body else 1)

    fn_runs = 0

    def fn(tx: Any) -> None:
        nonlocal fn_runs
        fn_runs += 1
        tx.execute(INSERT, ("busy fn", 3))

    with pytest.raises(errors.StoreBusy) as caught_fn:
        db.run_write(fn)
    assert 0.4 <= caught_fn.value.waited <= 3.0, caught_fn.value.waited
    assert fn_runs <= 1
    assert lock.popen.poll() is None
    assert db.metrics()["busy_timeouts"] - busy_before == 2, db.metrics()

    release(lock)
    assert items(db) == {"before": 1}, "a write past its budget left something behind"
    assert no_open_transaction(db)
    with db.write() as tx:
        tx.execute(INSERT, ("after", 4))
    db.run_write(insert("after fn", 5))
    assert items(db) == {"before": 1, "after": 4, "after fn": 5}


# -- errors roll back -----------------------------------------------------------------------


def test_an_error_in_the_body_rolls_back_and_the_next_write_succeeds(
    engine: EngineUnderTest,
) -> None:
    db = engine.open()
    db.run_write(insert("kept", 1))

    with pytest.raises(KeyError), db.write() as tx:
        tx.execute(INSERT, ("lost block", 2))
        raise KeyError("boom")

    calls = 0

    def failing(tx: Any) -> None:
        nonlocal calls
        calls += 1
        tx.execute(INSERT, ("lost fn", 3))
        raise ValueError("not a database failure")

    with pytest.raises(ValueError):
        db.run_write(failing)
    assert calls == 1, "an exception of the function's own is never a reason to rerun"

    with pytest.raises(errors.DatabaseError), db.write() as tx:
        tx.execute(INSERT, ("lost sql", 4))
        tx.execute("INSERT INTO no_such_table VALUES (1)")

    with pytest.raises(ZeroDivisionError):
        db.read(lambda tx: (tx.execute("SELECT count(*) FROM items"), 1 / 0))
    with pytest.raises(errors.DatabaseError):
        db.read(lambda tx: tx.execute("SELECT * FROM no_such_table"))

    assert items(db) == {"kept": 1}
    assert no_open_transaction(db), db.connection_report()
    # No wedged connection ("cannot start a transaction within a transaction"):
    with db.write() as tx:
        tx.execute(INSERT, ("next block", 5))
    db.run_write(insert("next fn", 6))
    assert items(db) == {"kept": 1, "next block": 5, "next fn": 6}


def test_a_duplicate_key_is_an_integrity_error_commits_nothing_and_reruns_are_counted(
    engine: EngineUnderTest,
) -> None:
    db = engine.open()
    db.run_write(insert("taken", 1))
    before = retries(db)

    with pytest.raises(errors.IntegrityError), db.write() as tx:
        tx.execute(INSERT, ("free", 2))
        tx.execute(INSERT, ("taken", 3))

    calls = 0

    def duplicate(tx: Any) -> None:
        nonlocal calls
        calls += 1
        tx.execute(INSERT, ("free", 4))
        tx.execute(INSERT, ("taken", 5))

    with pytest.raises(errors.IntegrityError):
        db.run_write(duplicate)
    engine.check_runs(calls, 1)
    assert calls - 1 == retries(db) - before, "a rerun not counted in the retry metrics"
    assert items(db) == {"taken": 1}
    db.run_write(insert("free", 6))
    assert items(db) == {"taken": 1, "free": 6}


# -- RETURNING is read whole ----------------------------------------------------------------


def test_returning_many_rows_returns_them_all_and_the_next_write_works(
    engine: EngineUnderTest,
) -> None:
    db = engine.open()
    n = 300
    values = ", ".join(["(?, ?)"] * n)
    params = [x for i in range(n) for x in (f"r{i:03}", i)]
    with db.write() as tx:
        inserted = tx.execute(f"INSERT INTO items(k, v) VALUES {values} RETURNING k, v", params)
        updated = tx.execute("UPDATE items SET v = v + 1000 RETURNING k, v")
    assert isinstance(inserted, list) and isinstance(updated, list)
    assert sorted(inserted) == [(f"r{i:03}", i) for i in range(n)]
    assert sorted(updated) == [(f"r{i:03}", i + 1000) for i in range(n)]

    deleted = db.run_write(
        lambda tx: tx.execute("DELETE FROM items WHERE v >= ? RETURNING k", (1000 + n // 2,))
    )
    assert sorted(deleted) == [(f"r{i:03}",) for i in range(n // 2, n)]
    assert no_open_transaction(db)
    with db.write() as tx:
        tx.execute(INSERT, ("next", -1))
    rows = items(db)
    assert len(rows) == n // 2 + 1 and rows["next"] == -1 and rows["r000"] == 1000


# -- migrations -----------------------------------------------------------------------------


@pytest.mark.slow
def test_eight_processes_opening_a_fresh_store_at_once_apply_each_migration_once(
    engine: EngineUnderTest, procs: list[Proc], barrier: Barrier, tmp_path: Path
) -> None:
    fresh = engine.fresh_target()
    runs = tmp_path / "function-step-runs"
    children = [
        engine.agent(procs, "migrate", fresh, "--barrier", barrier.path, "--runs", str(runs))
        for _ in range(8)
    ]
    for child in children:
        child.wait_line("ready", timeout=60)
    barrier.release()
    reports = []
    for child in children:
        rc = child.finish(timeout=90)
        assert rc == 0, f"{child.name} rc={rc}: {child.stderr_tail()}"
        reports.append(json.loads(child.last_line()))
    assert [r["schema_version"] for r in reports] == [2] * 8
    pids = {child.pid for child in children}

    files = engine.open_each_file(fresh)
    for db in files:
        log = db.read(lambda tx: tx.execute("SELECT version, pid FROM migration_log"))
        assert sorted(v for v, _ in log) == [1, 2], f"{db.path}: {log}"
        assert len({pid for _, pid in log}) == 1, "both steps come from one transaction"
        assert log[0][1] in pids
        recorded = db.read(
            lambda tx: tx.execute("SELECT version FROM fleetstore_migrations ORDER BY version")
        )
        assert recorded == [(1,), (2,)]
        assert db.schema_version == 2
    # The function step ran once per file (where reruns are allowed, rolled-back runs
    # may come on top).
    engine.check_runs(len(runs.read_text().splitlines()), len(files))


def test_schema_version_is_the_newest_migration_applied(engine: EngineUnderTest) -> None:
    fresh = engine.fresh_target()
    db = engine.open(fresh, migrations=SCHEMA[:1])
    assert db.schema_version == 1
    assert db.migrate(SCHEMA) == [2]
    assert db.schema_version == 2
    assert db.migrate(SCHEMA) == []
    with pytest.raises(errors.MigrationError, match="newer"):
        engine.open(fresh, migrations=SCHEMA[:1])
    assert db.schema_version == 2


# -- reads ----------------------------------------------------------------------------------


def test_reads_do_not_wait_for_an_outside_write_lock(engine: EngineUnderTest, spawn: Spawn) -> None:
    db = engine.open(write_budget=0.3)
    db.run_write(insert("committed", 1))
    lock, _ = start_lock(spawn, engine.lock_path, 60)
    assert items(db) == {"committed": 1}
    assert db.schema_version == 2
    assert lock.popen.poll() is None, "the lock ended before the reads returned"
    with pytest.raises(errors.StoreBusy):  # the lock was real: writes wait for it
        db.run_write(insert("blocked", 2))
    release(lock)
    assert items(db) == {"committed": 1}


def test_reads_neither_see_nor_wait_for_another_processes_open_write(
    engine: EngineUnderTest, procs: list[Proc]
) -> None:
    db = engine.open()
    db.run_write(insert("committed", 1))
    inside = engine.agent(procs, "inside", engine.target)
    inside.wait_line("inside", timeout=60)
    assert items(db) == {"committed": 1}, "a read saw an uncommitted row"
    assert inside.popen.poll() is None, "the writer ended before the read returned"
    # Killed inside its transaction: nothing of it is committed, the store writable.
    inside.kill()
    db.run_write(insert("after", 2))
    assert items(db) == {"committed": 1, "after": 2}
    assert INSIDE_KEY not in items(db)


# -- notifications --------------------------------------------------------------------------

CHANNEL = "fleetstore_contract"


@pytest.mark.timing
def test_notify_wait_without_a_notification_returns_false_after_about_the_timeout(
    engine: EngineUnderTest,
) -> None:
    db = engine.open()
    for timeout in (0.0, 0.4):
        started = time.monotonic()
        assert db.notify_wait(CHANNEL, timeout) is False
        elapsed = time.monotonic() - started
        assert timeout - 0.05 <= elapsed < timeout + 3.0, (timeout, elapsed)


def start_notifier(
    engine: EngineUnderTest, procs: list[Proc], barrier: Barrier, channel: str
) -> Proc:
    """A process with the engine open, that notifies *channel* once the barrier is
    released and then prints ``sent``."""
    sender = engine.agent(
        procs,
        "notify",
        engine.target,
        "--barrier",
        barrier.path,
        "--channel",
        channel,
    )
    sender.wait_line("ready", timeout=60)
    return sender


@pytest.mark.timing
def test_notify_wait_wakes_promptly_on_another_processes_notify(
    engine: EngineUnderTest, procs: list[Proc], barrier: Barrier
) -> None:
    """A committed ``tx.notify`` of another process wakes a waiter at once (SQLite: a
    futex word in the gate file; PostgreSQL: NOTIFY), and not before it was sent."""
    db = engine.open()
    assert db.notifies
    assert db.notify_wait(CHANNEL, 0.05) is False
    sender = start_notifier(engine, procs, barrier, CHANNEL)
    wait = 30.0
    result: dict[str, Any] = {}

    def waiter() -> None:
        started = time.monotonic()
        result["woke"] = db.notify_wait(CHANNEL, wait)
        result["at"] = time.monotonic()
        result["elapsed"] = result["at"] - started

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.2)
    released = time.monotonic()
    barrier.release()
    sender.wait_line("sent", timeout=30)
    thread.join(wait + 30)
    assert result["woke"] is True, result
    assert result["at"] > released, "woken before the notification was sent"
    # Woken by the ring, not by the timeout (a generous bound: the machine is shared).
    assert result["elapsed"] < wait / 2, result
    assert sender.finish(timeout=30) == 0, sender.stderr_tail()


def test_a_ring_between_the_token_and_the_wait_is_not_lost(
    engine: EngineUnderTest, procs: list[Proc], barrier: Barrier
) -> None:
    """The token protocol: a token taken before looking, a ring (a committed write of
    another process) after it, then the wait: it returns at once.  A wait without a
    token misses nothing since the same thread's last look either."""
    db = engine.open()
    token = db.notify_token(CHANNEL)
    assert db.notify_wait(CHANNEL, 0.05, token) is False  # nothing since the token
    sender = start_notifier(engine, procs, barrier, CHANNEL)
    barrier.release()
    sender.wait_line("sent", timeout=30)
    assert sender.finish(timeout=30) == 0, sender.stderr_tail()
    started = time.monotonic()
    assert db.notify_wait(CHANNEL, 30.0, token) is True
    assert time.monotonic() - started < 15.0
    # A wait without a token: rings since this thread's last look (its last wait, or
    # token): this one saw the ring already.
    assert db.notify_wait(CHANNEL, 0.2) is False
    assert db.notify_wait(CHANNEL, 30.0, token) is True  # the token still predates it


def test_notify_wait_hears_its_own_channel_only_and_loses_no_other(
    engine: EngineUnderTest, procs: list[Proc], barrier: Barrier
) -> None:
    # (On SQLite two channels may share a word of the gate file, and then wake each
    # other's waiters; these two do not.)
    from fleetstore.engine.notify import word_of

    assert word_of("contract_a") != word_of("contract_b")
    db = engine.open()
    assert db.notify_wait("contract_a", 0.05) is False
    assert db.notify_wait("contract_b", 0.05) is False
    sender = start_notifier(engine, procs, barrier, "contract_b")
    barrier.release()
    sender.wait_line("sent", timeout=30)
    assert sender.finish(timeout=30) == 0, sender.stderr_tail()
    assert db.notify_wait("contract_a", 0.5) is False, "woken by another channel's notify"
    # (No token: a ring since this thread's last wait on the channel, before the send.)
    assert db.notify_wait("contract_b", 30.0) is True, "contract_b's notify was lost"


def test_a_ring_wakes_nobody_before_its_commit_and_the_woken_see_what_it_rang_about(
    engine: EngineUnderTest, procs: list[Proc], barrier: Barrier
) -> None:
    """A process rings inside a transaction it keeps open: no waiter wakes; it commits:
    the waiter wakes, and its first read sees the committed row (a ring before COMMIT
    would let a woken worker look, find nothing, and sleep through the work)."""
    db = engine.open()
    token = db.notify_token(CHANNEL)
    sender = engine.agent(
        procs, "notify", engine.target, "--barrier", barrier.path, "--channel", CHANNEL, "--hold"
    )
    sender.wait_line("inside", timeout=60)
    assert db.notify_wait(CHANNEL, 0.5, token) is False, "woken before the COMMIT"
    result: dict[str, Any] = {}

    def waiter() -> None:
        result["woke"] = db.notify_wait(CHANNEL, 60.0, token)
        result["seen"] = items(db).get(CHANNEL)

    thread = threading.Thread(target=waiter)
    thread.start()
    barrier.release()
    sender.wait_line("sent", timeout=30)
    thread.join(90)
    assert result == {"woke": True, "seen": sender.pid}, result
    assert sender.finish(timeout=30) == 0, sender.stderr_tail()


def test_a_transaction_that_does_not_commit_rings_nothing(engine: EngineUnderTest) -> None:
    db = engine.open()
    token = db.notify_token(CHANNEL)
    with pytest.raises(RuntimeError), db.write() as tx:
        tx.execute(INSERT, ("rolled back", 1))
        tx.notify(CHANNEL)
        raise RuntimeError("rolled back")
    assert db.notify_wait(CHANNEL, 0.3, token) is False
    with db.write() as tx:
        tx.notify(CHANNEL)
    assert db.notify_wait(CHANNEL, 30.0, token) is True


def test_a_bad_channel_is_refused_and_a_read_cannot_notify(engine: EngineUnderTest) -> None:
    db = engine.open()
    for bad in ("", "Upper", "1digit", "has space", "x" * 64, None, 7):
        with pytest.raises(errors.InvalidInput):
            db.notify_wait(bad, 0.0)  # type: ignore[arg-type]
        with pytest.raises(errors.InvalidInput), db.write() as tx:
            tx.notify(bad)  # type: ignore[arg-type]
    with pytest.raises(errors.ReadOnlyError):
        db.read(lambda tx: tx.notify(CHANNEL))


# -- metrics --------------------------------------------------------------------------------


def test_metrics_count_this_processes_writes_and_failed_writes(engine: EngineUnderTest) -> None:
    db = engine.open()
    before = db.metrics()
    for i in range(3):
        with db.write() as tx:
            tx.execute(INSERT, (f"block {i}", i))
    for i in range(2):
        db.run_write(insert(f"fn {i}", i))
    with pytest.raises(KeyError), db.write():
        raise KeyError("rolled back")
    after = db.metrics()
    json.dumps(after)  # JSON-serialisable
    assert after["pid"] == os.getpid()
    assert after["path"] == db.path
    assert after["writes"] - before["writes"] == 5
    assert after["write_errors"] - before["write_errors"] == 1
    assert after["lock_wait"]["count"] - before["lock_wait"]["count"] == 5
    assert after["lock_hold"]["count"] - before["lock_hold"]["count"] == 5
    assert 0 < after["lock_hold"]["max"] < 10
    assert after["busy_timeouts"] == before["busy_timeouts"]
