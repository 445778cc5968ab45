"""The PostgreSQL engine's own promises (the contract suite runs on it as well):
migrations under many processes at once, placeholders, connection errors, the
database clock, LISTEN/NOTIFY, concurrent writers to one session, `fleetstore lock`."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

import fleetstore
from fleetstore import errors
from fleetstore.engine.postgres import to_psycopg
from fleetstore.sql import migrations
from tests.fix_procs import Spawn, start_lock
from tests.pgserver import PgServer

OPEN_AND_REPORT = """
import sys, fleetstore
store = fleetstore.open(sys.argv[1], local_dir=sys.argv[2])
print(store.db.schema_version, flush=True)
store.close()
"""


@pytest.mark.slow
def test_eight_processes_migrating_a_fresh_store_at_once_apply_each_migration_once(
    pg_url: str, tmp_path: Path
) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_AND_REPORT, pg_url, str(tmp_path / f"l{i}")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(8)
    ]
    newest = migrations("postgresql")[-1].version
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert out.strip() == str(newest)
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT version, name FROM fleetstore_migrations ORDER BY version")
        applied = rows.fetchall()
    assert applied == [(m.version, m.name) for m in migrations("postgresql")]


def test_placeholders_are_rewritten_for_psycopg_and_casts_and_percent_survive() -> None:
    assert to_psycopg("SELECT ? WHERE a = :name") == "SELECT %s WHERE a = %(name)s"
    assert to_psycopg("SELECT :x::text, y::bigint") == "SELECT %(x)s::text, y::bigint"
    assert to_psycopg("SELECT 'a%b' LIKE :p") == "SELECT 'a%%b' LIKE %(p)s"


def test_a_database_that_does_not_exist_is_a_clear_error_at_once(
    pg_server: PgServer, tmp_path: Path
) -> None:
    url = pg_server.url("no_such_database_here")
    started = time.monotonic()
    with pytest.raises(errors.DatabaseError, match="no_such_database_here"):
        fleetstore.open(url, local_dir=str(tmp_path / "l"))
    # (Not a timing assertion of speed: a wrong URL must not wait out the 60 s budget.)
    assert time.monotonic() - started < 30
    assert not (tmp_path / "l").exists()


def test_a_password_never_appears_in_what_the_store_names(pg_url: str, tmp_path: Path) -> None:
    with_password = pg_url.replace("postgres@", "postgres:s3cret@")
    with fleetstore.open(with_password, local_dir=str(tmp_path / "l")) as store:
        assert "s3cret" not in store.url and "s3cret" not in repr(store)
        assert "s3cret" not in str(store.metrics())


def test_times_come_from_the_database_clock(pg_url: str, tmp_path: Path) -> None:
    with fleetstore.open(pg_url, local_dir=str(tmp_path / "l")) as store:
        eid = store.effects.enqueue("t", "k")
        claim = store.effects.claim("me", lease=100)[0]
        assert claim.id == eid
        effect = store.effects.get(eid)
        assert effect.started_at is not None and effect.lease_expires_at is not None
        assert effect.lease_expires_at - effect.started_at == pytest.approx(100)
        with psycopg.connect(pg_url) as conn:
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        assert row[0] - 60 < effect.started_at <= row[0]


def test_an_idle_worker_is_woken_by_a_notify_from_another_process(
    pg_url: str, tmp_path: Path
) -> None:
    with fleetstore.open(pg_url, local_dir=str(tmp_path / "l")) as store:
        assert store.effects.wait_for_work(0.2) is False  # nothing enqueued: the wait ends
        woke: list[bool] = []
        waiter = threading.Thread(target=lambda: woke.append(store.effects.wait_for_work(60)))
        waiter.start()
        time.sleep(0.5)  # let it LISTEN first
        code = (
            "import sys, fleetstore\n"
            "with fleetstore.open(sys.argv[1], local_dir=sys.argv[2]) as s:\n"
            "    s.effects.enqueue('t', 'k')\n"
        )
        subprocess.run(
            [sys.executable, "-c", code, pg_url, str(tmp_path / "other")], check=True, timeout=60
        )
        waiter.join(60)
        assert woke == [True]


def test_concurrent_appends_to_one_session_all_land_in_one_order(
    pg_url: str, tmp_path: Path
) -> None:
    with fleetstore.open(pg_url, local_dir=str(tmp_path / "l"), pool_size=8) as store:
        session = store.sessions.create(title="hot")
        failures: list[BaseException] = []

        def append(n: int) -> None:
            try:
                for i in range(25):
                    store.messages.append(session.id, "user", f"{n}-{i}")
            except BaseException as exc:  # pragma: no cover - reported below
                failures.append(exc)

        threads = [threading.Thread(target=append, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures
        messages = store.messages.list(session.id)
        texts = [m.text for m in messages]
        assert sorted(texts) == sorted(f"{n}-{i}" for n in range(8) for i in range(25))
        assert [m.seq for m in messages] == list(range(1, 201))
        # Serializable transactions on one session conflict; the engine started them over.
        assert store.metrics()["write_errors"] >= store.metrics()["serialization_retries"]


@pytest.mark.slow
def test_fleetstore_lock_holds_every_write_of_a_postgresql_store(
    pg_url: str, tmp_path: Path, spawn: Spawn
) -> None:
    store = fleetstore.open(pg_url, local_dir=str(tmp_path / "l"), write_budget=0.5)
    try:
        session = store.sessions.create(title="t")
        lock, _ = start_lock(spawn, pg_url, 3.0)
        # Reads go on while the lock is held; a write past its budget is spooled.
        assert store.sessions.get(session.id).title == "t"
        store.messages.append(session.id, "user", "waits")
        assert len(store.spool) == 1
        assert lock.finish(timeout=30) == 0
        assert store.flush(timeout=30)
        assert [m.text for m in store.messages.list(session.id)] == ["waits"]
    finally:
        store.close()


@pytest.mark.slow
def test_an_idle_worker_starts_an_effect_enqueued_elsewhere_without_waiting_for_its_poll(
    pg_url: str, tmp_path: Path
) -> None:
    """The worker polls every 300 s here: only the NOTIFY of the effects trigger can make
    it start an effect enqueued by another process within the 60 s this test waits."""
    from fleetstore import Worker

    ran = threading.Event()
    with fleetstore.open(pg_url, local_dir=str(tmp_path / "w")) as store:
        worker = Worker(store, {"k": lambda effect: ran.set()}, poll_interval=300)
        runner = threading.Thread(target=worker.run, daemon=True)
        runner.start()
        try:
            time.sleep(1.0)  # let it find nothing and wait
            code = (
                "import sys, fleetstore\n"
                "with fleetstore.open(sys.argv[1], local_dir=sys.argv[2]) as s:\n"
                "    print(s.effects.enqueue('t', 'k'))\n"
            )
            done = subprocess.run(
                [sys.executable, "-c", code, pg_url, str(tmp_path / "other")],
                check=True,
                timeout=60,
                capture_output=True,
                text=True,
            )
            assert ran.wait(60), "the worker slept through the notification"
            eid = done.stdout.strip()
            deadline = time.monotonic() + 30
            while store.effects.get(eid).state != "succeeded":
                assert time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            worker.stop()
            runner.join(30)
        assert not runner.is_alive()


def test_a_forked_child_opens_its_own_connections_and_the_parent_keeps_its_own(
    pg_url: str, tmp_path: Path
) -> None:
    """The child must neither use nor close the parent's pooled connections (closing
    one would end the parent's session on the shared socket)."""
    import os

    with fleetstore.open(pg_url, local_dir=str(tmp_path / "l")) as store:
        session = store.sessions.create(title="fork")
        store.messages.append(session.id, "user", "parent before")
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                store.messages.append(session.id, "user", "child")
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        store.messages.append(session.id, "user", "parent after")
        texts = [m.text for m in store.messages.list(session.id)]
        assert texts == ["parent before", "child", "parent after"]
        assert store.metrics()["connection_retries"] == 0  # the parent's connection survived
