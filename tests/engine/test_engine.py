"""The SQLite engine's rules, one test per rule; outside processes are real processes."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import apsw
import pytest

import fleetstore
from fleetstore import Database, Migration, errors
from fleetstore.core.metrics import Histogram
from fleetstore.core.settings import Settings
from fleetstore.engine import gate as gate_module
from fleetstore.engine.gate import GateTimeout, WriterGate
from fleetstore.engine.proclocks import lock_holders, parse_proc_locks

T_MIGRATION = Migration(1, "t", "CREATE TABLE t(id INTEGER PRIMARY KEY, v)")


@pytest.fixture
def db(tmp_path: Path) -> Database:
    database = Database.open(tmp_path / "e.db", migrations=[T_MIGRATION])
    yield database  # type: ignore[misc]
    database.close()


def count(db: Database) -> int:
    return int(db.read(lambda tx: tx.execute("SELECT count(*) FROM t"))[0][0])


def outside(code: str) -> subprocess.Popen[str]:
    """A real separate process (never a second SQLite library in this one) that
    prints 'ready' once it holds what *code* takes, then waits for stdin to close."""
    script = textwrap.dedent(code) + "\nprint('ready', flush=True)\nsys.stdin.read()\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys, os, fcntl, apsw\n" + script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def finish(proc: subprocess.Popen[str]) -> None:
    if proc.stdin:
        proc.stdin.close()
    proc.wait(timeout=30)
    if proc.stdout:
        proc.stdout.close()


# -- hygiene -------------------------------------------------------------------------------


def test_returning_read_in_part_wedges_raw_apsw_but_not_the_api(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    with Database.open(path, migrations=[T_MIGRATION]) as db:
        with db.write() as tx:
            tx.executemany("INSERT INTO t(v) VALUES (?)", [(i,) for i in range(5)])

        # Raw apsw: an UPDATE ... RETURNING read in part stays active, COMMIT fails,
        # and the connection stays inside its transaction holding the write lock.
        raw = apsw.Connection(str(path))
        raw.execute("BEGIN IMMEDIATE")
        rows = raw.cursor().execute("UPDATE t SET v = v + 1 RETURNING id")
        next(rows)
        with pytest.raises(apsw.BusyError, match="SQL statements in progress"):
            raw.execute("COMMIT")
        assert raw.in_transaction
        with pytest.raises(apsw.SQLError, match="within a transaction"):
            raw.execute("BEGIN IMMEDIATE")
        raw.close(True)

        # The API reads every row, so the same statement commits and the next write runs.
        with db.write() as tx:
            returned = tx.execute("UPDATE t SET v = v + 1 RETURNING id")
        assert len(returned) == 5
        with db.write() as tx:
            tx.execute("INSERT INTO t(v) VALUES (99)")
        assert count(db) == 6
        assert db.read(lambda tx: tx.execute("SELECT sum(v) FROM t"))[0][0] == 10 + 5 + 99


def test_error_in_body_rolls_back_reraises_and_body_runs_once(db: Database) -> None:
    runs = 0
    with pytest.raises(KeyError), db.write() as tx:
        runs += 1
        tx.execute("INSERT INTO t(v) VALUES (1)")
        raise KeyError("boom")
    assert runs == 1
    assert count(db) == 0
    with db.write() as tx:
        tx.execute("INSERT INTO t(v) VALUES (2)")
    assert count(db) == 1
    assert db.metrics()["write_errors"] == 1


def test_driver_errors_are_typed_keep_their_cause_and_change_nothing(db: Database) -> None:
    with db.write() as tx:
        tx.execute("INSERT INTO t(id, v) VALUES (1, 'a')")
    with pytest.raises(errors.IntegrityError) as caught, db.write() as tx:
        tx.execute("INSERT INTO t(v) VALUES ('b')")
        tx.execute("INSERT INTO t(id, v) VALUES (1, 'c')")
    assert isinstance(caught.value.__cause__, apsw.ConstraintError)
    with pytest.raises(errors.DatabaseError), db.write() as tx:
        tx.execute("INSERT INTO nowhere VALUES (1)")
    with pytest.raises(errors.ReadOnlyError):
        db.read(lambda tx: tx.execute("DELETE FROM t"))
    assert db.read(lambda tx: tx.execute("SELECT id, v FROM t")) == [(1, "a")]
    assert isinstance(errors.IntegrityError("x"), errors.PermanentError)


def test_failed_rollback_discards_the_connection(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    with db.write() as tx:
        tx.execute("INSERT INTO t(v) VALUES (1)")
    first_writer = db._writer
    # A real statement that SQLite rejects stands in for a ROLLBACK that fails.
    monkeypatch.setattr(db, "_rollback_sql", "ROLLBACK TO no_such_savepoint")
    with pytest.raises(RuntimeError), db.write() as tx:
        tx.execute("INSERT INTO t(v) VALUES (2)")
        raise RuntimeError("body failed")
    assert db._writer is None, "a connection whose rollback failed must be thrown away"
    assert db.metrics()["discarded_connections"] == 1
    monkeypatch.undo()
    with db.write() as tx:
        tx.execute("INSERT INTO t(v) VALUES (3)")
    assert db._writer is not first_writer
    assert db.read(lambda tx: tx.execute("SELECT v FROM t ORDER BY v")) == [(1,), (3,)]


def test_writer_left_inside_a_transaction_is_healed_before_the_next_write(db: Database) -> None:
    with db.write() as tx:
        tx.execute("INSERT INTO t(v) VALUES (1)")
    assert db._writer is not None
    # Something outside the API (a bug, a C extension) leaves the writer mid-transaction
    # with an uncommitted row; the next write must neither fail nor commit that row.
    db._writer.execute("BEGIN")
    db._writer.execute("INSERT INTO t(v) VALUES ('stray')")
    with db.write() as tx:
        tx.execute("INSERT INTO t(v) VALUES (2)")
    assert db.read(lambda tx: tx.execute("SELECT v FROM t ORDER BY id")) == [(1,), (2,)]


def test_nested_write_in_one_thread_fails_at_once(db: Database) -> None:
    started = time.monotonic()
    with pytest.raises(errors.DatabaseError, match=r"inside a db\.write"), db.write() as tx:
        tx.execute("INSERT INTO t(v) VALUES (1)")
        with db.write():
            pass
    assert time.monotonic() - started < 5
    assert count(db) == 0
    with db.write() as tx:
        tx.execute("INSERT INTO t(v) VALUES (1)")
    assert count(db) == 1


def test_transaction_object_is_dead_after_its_block(db: Database) -> None:
    with db.write() as tx:
        pass
    with pytest.raises(errors.StoreClosed):
        tx.execute("SELECT 1")
    db.close()
    with pytest.raises(errors.StoreClosed), db.write():
        pass
    with pytest.raises(errors.StoreClosed):
        db.read(lambda tx: None)


def test_threads_of_one_process_share_the_gate(tmp_path: Path) -> None:
    for gate in (True, False):
        with Database.open(tmp_path / f"th{gate}.db", migrations=[T_MIGRATION], gate=gate) as db:

            def work(db: Database = db) -> None:
                for i in range(100):
                    with db.write() as tx:
                        tx.execute("INSERT INTO t(v) VALUES (?)", (i,))

            threads = [threading.Thread(target=work) for _ in range(6)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            assert count(db) == 600


# -- files, settings, pragmas ---------------------------------------------------------------


def test_store_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        with Database.open(tmp_path / "sub" / "p.db", migrations=[T_MIGRATION]) as db:
            with db.write() as tx:
                tx.execute("INSERT INTO t(v) VALUES (1)")
            for name in ("p.db", "p.db-wal", "p.db-shm", "p.db.gate"):
                mode = stat.S_IMODE(os.stat(tmp_path / "sub" / name).st_mode)
                assert mode == 0o600, f"{name} is {oct(mode)}"
    finally:
        os.umask(old)


def test_settings_come_from_kwargs_then_env_then_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert Settings().write_budget == 60.0 and Settings().synchronous == "NORMAL"
    monkeypatch.setenv("FLEETSTORE_WRITE_BUDGET", "2.5")
    monkeypatch.setenv("FLEETSTORE_SYNCHRONOUS", "full")
    with Database.open(tmp_path / "s.db") as db:
        assert db.settings.write_budget == 2.5
        assert db.settings.synchronous == "FULL"
    with Database.open(tmp_path / "s.db", write_budget=7, synchronous="NORMAL") as db:
        assert db.settings.write_budget == 7
        assert db.connection_report()[0]["synchronous"] == "NORMAL"


@pytest.mark.parametrize(
    ("kwargs", "env", "match"),
    [
        ({"write_budget": -1}, {}, "write_budget"),
        ({"write_budget": "soon"}, {}, "write_budget"),
        ({"synchronous": "OFF"}, {}, "synchronous"),
        ({"busy_timeout_ms": 0}, {}, "busy_timeout_ms"),
        ({"no_such_setting": 1}, {}, "unknown setting"),
        ({}, {"FLEETSTORE_WRITE_BUDGET": "sixty"}, "FLEETSTORE_WRITE_BUDGET"),
        ({}, {"FLEETSTORE_GATE": "maybe"}, "FLEETSTORE_GATE"),
    ],
)
def test_bad_settings_raise_config_error_and_create_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kwargs: dict[str, object],
    env: dict[str, str],
    match: str,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(errors.ConfigError, match=match):
        Database.open(tmp_path / "bad.db", **kwargs)
    assert not (tmp_path / "bad.db").exists()


def test_bad_paths_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError):
        Database.open(":memory:")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a sqlite database, just some text" * 100)
    before = junk.read_bytes()
    with pytest.raises(errors.CorruptStore):
        Database.open(junk)
    assert junk.read_bytes() == before
    with pytest.raises(errors.UnsafeFile, match="not a regular file \\(a directory\\)"):
        Database.open(tmp_path)


def test_existing_rollback_journal_file_is_switched_to_wal(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    proc = outside(f"""
        c = apsw.Connection({str(path)!r}); c.execute("CREATE TABLE old(x)")
        c.close()
    """)
    finish(proc)
    path.chmod(0o600)  # the umask made it 0644: fleetstore uses no file others can read
    with Database.open(path) as db:
        assert {r["journal_mode"] for r in db.connection_report()} == {"wal"}


@pytest.mark.timing
def test_wal_switch_waits_under_the_gate_and_never_fails_silently(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    # An outside reader holds a SHARED lock on a rollback-journal file: the
    # switch to WAL cannot happen until it lets go.
    proc = outside(f"""
        c = apsw.Connection({str(path)!r}); c.execute("CREATE TABLE old(x)")
        c.execute("BEGIN"); c.execute("SELECT * FROM old").fetchall()
    """)
    path.chmod(0o600)
    try:
        started = time.monotonic()
        with pytest.raises(fleetstore.StoreBusy) as caught:
            Database.open(path, write_budget=0.5)
        assert caught.value.stage == "journal mode switch"
        assert 0.4 <= time.monotonic() - started < 5
    finally:
        finish(proc)
    with Database.open(path, write_budget=5) as db:
        assert db.connection_report()[0]["journal_mode"] == "wal"


def test_migrations_reassert_connection_settings(tmp_path: Path) -> None:
    hostile = Migration(
        1,
        "turns things off",
        "PRAGMA foreign_keys=OFF; PRAGMA busy_timeout=12345; CREATE TABLE t(v)",
    )
    with Database.open(tmp_path / "m.db", migrations=[hostile], synchronous="FULL") as db:
        (writer,) = [r for r in db.connection_report() if r["role"] == "writer"]
        assert writer["foreign_keys"] is True
        # The writer's own: none (fleetstore retries its BEGIN itself, gate held).
        assert writer["busy_timeout"] == 0
        assert writer["synchronous"] == "FULL"
        assert writer["wal_autocheckpoint"] == 0


def test_failed_migration_leaves_the_previous_version(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    with Database.open(path, migrations=[T_MIGRATION]) as db:
        assert db.schema_version == 1
    steps = [
        T_MIGRATION,
        Migration(2, "u", "CREATE TABLE u(x)"),
        Migration(3, "broken", "CREATE TABLE t(v)"),
    ]
    with pytest.raises(errors.MigrationError, match="migration 3"):
        Database.open(path, migrations=steps)
    with Database.open(path) as db:
        assert db.schema_version == 1
        names = db.read(lambda tx: tx.execute("SELECT name FROM sqlite_master WHERE name='u'"))
        assert names == []
        with pytest.raises(errors.ConfigError):
            db.migrate([Migration(4, "a", "SELECT 1"), Migration(4, "b", "SELECT 1")])
        assert db.migrate([*steps[:2], Migration(3, "fixed", lambda tx: None)]) == [2, 3]
        assert db.migrate(steps) == []
        assert db.schema_version == 3
        with pytest.raises(errors.MigrationError, match="newer"):
            db.migrate([Migration(1, "t", "SELECT 1")])


# -- the gate and the budget --------------------------------------------------------------


def test_no_process_holds_the_gate_after_its_waiter_gave_up(tmp_path: Path) -> None:
    gate_path = str(tmp_path / "g.gate")
    holder = outside(f"""
        fd = os.open({gate_path!r}, os.O_RDWR | os.O_CREAT, 0o600); fcntl.flock(fd, fcntl.LOCK_EX)
    """)
    gate = WriterGate(gate_path)
    try:
        started = time.monotonic()
        with pytest.raises(GateTimeout):
            gate.acquire(started + 0.3)
        assert time.monotonic() - started < 2
        assert [h.pid for h in lock_holders(str(tmp_path / "g"), gate_path)] == [holder.pid]
    finally:
        finish(holder)
    # Nothing of the waiter that gave up may hold the gate now: another process
    # can take it, and this process's next writer too.
    deadline = time.monotonic() + 5
    while True:
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import os, fcntl; fd = os.open({gate_path!r}, os.O_RDWR); "
                "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
            ],
            capture_output=True,
        )
        if probe.returncode == 0:
            break
        assert time.monotonic() < deadline, "the gate stayed held after its waiter gave up"
        time.sleep(0.05)
    assert gate.acquire(time.monotonic() + 2) in (False, True)
    gate.release()
    gate.close()


def test_reads_never_take_the_gate(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    with Database.open(path, migrations=[T_MIGRATION], write_budget=0.2) as db:
        with db.write() as tx:
            tx.execute("INSERT INTO t(v) VALUES (1)")
        holder = outside(f"""
            fd = os.open({str(path) + ".gate"!r}, os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX)
        """)
        try:
            assert count(db) == 1
            with pytest.raises(fleetstore.StoreBusy) as caught, db.write():
                pass
            assert caught.value.stage == "gate"
            assert [h.pid for h in caught.value.holders] == [holder.pid]
            assert isinstance(caught.value, errors.TransientError)
        finally:
            finish(holder)


def test_store_busy_names_an_outside_sqlite_writer(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    with Database.open(path, migrations=[T_MIGRATION], write_budget=0.3) as db:
        holder = outside(f"""
            c = apsw.Connection({str(path)!r}); c.execute("BEGIN IMMEDIATE")
        """)
        try:
            with pytest.raises(fleetstore.StoreBusy) as caught, db.write() as tx:
                tx.execute("INSERT INTO t(v) VALUES (1)")
        finally:
            finish(holder)
        busy = caught.value
        assert busy.stage == "sqlite"
        assert busy.attempts > 10, "the gate holder retries BEGIN IMMEDIATE about every ms"
        assert [(h.pid, h.lock) for h in busy.holders] == [(holder.pid, "sqlite-write")]
        assert str(holder.pid) in str(busy)
        assert db.metrics()["busy_timeouts"] == 1
        with db.write() as tx:
            tx.execute("INSERT INTO t(v) VALUES (2)")
        assert db.read(lambda tx: tx.execute("SELECT v FROM t")) == [(2,)]
        assert not db._writer.in_transaction  # type: ignore[union-attr]


# -- checkpoints and metrics ---------------------------------------------------------------


def test_checkpoints_run_after_commit_and_truncate_a_large_wal(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    with Database.open(
        path, migrations=[T_MIGRATION], checkpoint_bytes=64 * 1024, truncate_bytes=256 * 1024
    ) as db:
        writer = next(r for r in db.connection_report() if r["role"] == "writer")
        assert writer["wal_autocheckpoint"] == 0
        # A reader that stays open pins the WAL: no truncation while it reads.
        blocker = apsw.Connection(str(path))
        blocker.execute("BEGIN")
        blocker.execute("SELECT count(*) FROM t").fetchall()
        for _ in range(120):
            with db.write() as tx:
                tx.execute("INSERT INTO t(v) VALUES (?)", (os.urandom(4000),))
        wal_bytes = os.path.getsize(str(path) + "-wal")
        assert wal_bytes > 256 * 1024
        # One checkpoint per checkpoint_bytes of growth, not one per commit; run by the
        # database's checkpoint thread, so shortly after the commit that asked for it.
        deadline = time.monotonic() + 10
        while db.metrics()["checkpoints"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert 1 <= db.metrics()["checkpoints"] <= wal_bytes // (64 * 1024) + 2 < 120
        blocker.execute("COMMIT")
        blocker.close()
        for _ in range(80):
            with db.write() as tx:
                tx.execute("INSERT INTO t(v) VALUES (?)", (os.urandom(4000),))
        db.checkpoint()
        assert os.path.getsize(str(path) + "-wal") < 256 * 1024
        assert count(db) == 200


def test_metrics_count_what_happened(db: Database) -> None:
    for i in range(10):
        with db.write() as tx:
            tx.execute("INSERT INTO t(v) VALUES (?)", (i,))
    m = db.metrics()
    assert m["pid"] == os.getpid()
    assert m["writes"] >= 10
    assert m["lock_wait"]["count"] == m["writes"]
    assert 0 < m["lock_hold"]["p50"] <= m["lock_hold"]["p99"] <= m["lock_hold"]["max"]


def test_histogram_quantiles_are_within_ten_percent() -> None:
    h = Histogram()
    for ms in range(1, 1001):
        h.add(ms / 1000)
    snap = h.snapshot()
    assert snap["count"] == 1000
    assert snap["max"] == 1.0
    assert 0.5 <= snap["p50"] <= 0.5 * 1.1 + 1e-9
    assert 0.99 <= snap["p99"] <= 1.0
    assert Histogram().snapshot()["p99"] == 0.0


def test_parse_proc_locks_skips_waiters_and_reads_hex_devices() -> None:
    text = (
        "1: POSIX  ADVISORY  WRITE 2120 fe:00:2148741 120 120\n"
        "1: -> POSIX  ADVISORY  WRITE 2121 fe:00:2148741 120 120\n"
        "3: FLOCK  ADVISORY  WRITE 77 08:1a:99 0 EOF\n"
        "4: OFDLCK ADVISORY  READ  -1 08:1a:99 0 EOF\n"
    )
    parsed = list(parse_proc_locks(text))
    assert parsed[0] == ("POSIX", "WRITE", 2120, (254, 0, 2148741), "120", "120")
    assert parsed[1] == ("FLOCK", "WRITE", 77, (8, 26, 99), "0", "EOF")
    assert len(parsed) == 3


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_child_forked_inside_a_write_block_cannot_commit_the_parents_transaction(
    db: Database,
) -> None:
    parent = os.getpid()

    def write_and_fork() -> int:
        with db.write() as tx:
            tx.execute("INSERT INTO t(v) VALUES ('parent')")
            pid = os.fork()
        return pid

    try:
        pid = write_and_fork()
    except errors.StoreClosed:
        if os.getpid() != parent:
            os._exit(0)  # the child: a clear error, and its copy of the gate let go
        raise
    except BaseException:
        if os.getpid() != parent:
            os._exit(4)
        raise
    if pid == 0:
        os._exit(3)  # the child committed the parent's transaction
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with db.write() as tx:
        tx.execute("INSERT INTO t(v) VALUES ('after')")
    assert db.read(lambda tx: tx.execute("SELECT v FROM t ORDER BY id")) == [
        ("parent",),
        ("after",),
    ]


@pytest.mark.skipif(
    gate_module._syscall is None, reason="no futex on this platform: waiters poll instead"
)
@pytest.mark.parametrize("slot", [-1, 3], ids=["no slot", "a board slot"])
def test_gate_release_rings_the_doorbell_of_a_sleeping_waiter(tmp_path: Path, slot: int) -> None:
    """A release rings only when a sleeper says it sleeps (its byte, or the byte of
    processes without a board slot): the sleeper here must be woken."""
    gate_path = str(tmp_path / "d.gate")
    sleeper, ringer = WriterGate(gate_path), WriterGate(gate_path)
    sleeper.sleeper = slot
    assert sleeper._bell is not None
    rung = sleeper._bell.value
    woke: list[float] = []

    def wait() -> None:
        started = time.monotonic()
        sleeper._sleep(rung, 10.0)  # far longer than the test may take
        woke.append(time.monotonic() - started)

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.2)
    assert ringer.acquire(time.monotonic() + 1) is False
    ringer.release()  # a release rings the bell through the other mapping
    thread.join(timeout=5)
    assert woke and woke[0] < 5, "the waiter slept through the release"
    assert sleeper._bell.value != rung
    sleeper.close()
    ringer.close()
