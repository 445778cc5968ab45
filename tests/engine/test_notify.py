"""Notifications on SQLite (engine/notify.py): the gate file's futex words, one listener
thread per channel and process.  What every engine promises (a ring wakes another
process's waiter, never before its COMMIT, the token protocol, a rollback rings nothing)
is in tests/engine/test_contract.py; group commit's rings in test_group_commit.py."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from fleetstore import Database, Migration, errors
from fleetstore.engine.gate import NOTIFY_AT, NOTIFY_WORDS
from fleetstore.engine.notify import word_of
from tests.fix_procs import Proc

SCHEMA = [Migration(1, "t", "CREATE TABLE t(v)")]
CHANNEL = "test_channel"

LISTENER = """
import sys, time
from fleetstore import Database, Migration
db = Database.open(sys.argv[1], migrations=[Migration(1, "t", "CREATE TABLE t(v)")])
token = db.notify_token("test_channel")
print("listening", flush=True)
print("woke", db.notify_wait("test_channel", float(sys.argv[2]), token), flush=True)
db.close()
"""


def _cpu(pid: int) -> float:
    """Seconds of CPU (user + system) process *pid* has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_notification_words_are_in_the_gate_files_header_page() -> None:
    assert 0 <= word_of(CHANNEL) < NOTIFY_WORDS
    assert NOTIFY_AT % 64 == 0 and NOTIFY_AT + 4 * NOTIFY_WORDS <= 2048  # before the sleepers


@pytest.mark.timing
def test_a_process_waiting_for_a_ring_uses_no_cpu_and_wakes_on_one(
    tmp_path: Path, procs: list[Proc]
) -> None:
    """An idle listener sleeps in the kernel: over 3 s of waiting its process used
    next to no CPU (the bound is generous: one spin or a poll loop of a few ms would
    use far more than it allows over 3 s, a shared machine's noise does not)."""
    path = tmp_path / "n.db"
    Database.open(path, migrations=SCHEMA).close()
    listener = Proc([sys.executable, "-c", LISTENER, str(path), "60"], "listener")
    procs.append(listener)
    listener.wait_line("listening", timeout=60)
    before = _cpu(listener.pid)
    time.sleep(3.0)
    used = _cpu(listener.pid) - before
    assert used < 0.05, f"an idle listener used {used:.3f} s of CPU in 3 s"
    db = Database.open(path, migrations=SCHEMA)
    try:
        with db.write() as tx:
            tx.execute("INSERT INTO t VALUES (1)")
            tx.notify(CHANNEL)
    finally:
        db.close()
    listener.wait_line("woke", timeout=60)
    assert "woke True" in [text for _, text in listener.seen], listener.seen
    assert listener.finish(60) == 0, listener.stderr_tail()


def test_threads_of_a_process_share_one_listener_and_subscribers_hear_rings(
    tmp_path: Path,
) -> None:
    db = Database.open(tmp_path / "n.db", migrations=SCHEMA)
    heard: list[int] = []
    stop = db.listen(CHANNEL, lambda: heard.append(1))
    tokens = [db.notify_token(CHANNEL) for _ in range(4)]
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda t=t: results.append(db.notify_wait(CHANNEL, 60, t)))
        for t in tokens
    ]
    for t in threads:
        t.start()
    with db.write() as tx:
        tx.notify(CHANNEL)
    for t in threads:
        t.join(90)
    assert results == [True] * 4
    listeners = [t for t in threading.enumerate() if t.name == f"fleetstore-listen-{CHANNEL}"]
    assert len(listeners) == 1
    deadline = time.monotonic() + 30
    while not heard and time.monotonic() < deadline:
        time.sleep(0.01)
    assert heard == [1]
    stop()
    token = db.notify_token(CHANNEL)
    with db.write() as tx:
        tx.notify(CHANNEL)
    assert db.notify_wait(CHANNEL, 60, token) is True
    assert heard == [1], "a subscriber that stopped was called"
    db.close()


def test_close_wakes_the_waiters_and_ends_the_listener(tmp_path: Path) -> None:
    """A close while threads wait: they return False soon, the listener thread ends,
    and the gate file's mapping closes (a view left would refuse to)."""
    db = Database.open(tmp_path / "n.db", migrations=SCHEMA)
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(db.notify_wait(CHANNEL, 120)))
    waiter.start()
    time.sleep(0.2)
    db.close()
    waiter.join(30)
    assert results == [False]
    assert not [t for t in threading.enumerate() if t.name.startswith("fleetstore-listen")]
    assert db._gate.mapping is None  # type: ignore[attr-defined]
    with pytest.raises(errors.StoreClosed):
        db.notify_token(CHANNEL)


def test_a_forked_child_listens_and_rings_on_its_own(tmp_path: Path) -> None:
    db = Database.open(tmp_path / "n.db", migrations=SCHEMA)
    token = db.notify_token(CHANNEL)  # the parent listens: its thread is not the child's
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            child_token = db.notify_token(CHANNEL)
            with db.write() as tx:
                tx.notify(CHANNEL)
            code = 0 if db.notify_wait(CHANNEL, 30, child_token) else 2
            db.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert db.notify_wait(CHANNEL, 30, token) is True  # the child's ring, heard here
    db.close()


def test_without_a_mapped_gate_file_nothing_rings_and_a_wait_sleeps_its_timeout(
    tmp_path: Path,
) -> None:
    db = Database.open(tmp_path / "n.db", migrations=SCHEMA, gate=False)
    try:
        assert db.notifies is False
        token = db.notify_token(CHANNEL)
        with db.write() as tx:
            tx.notify(CHANNEL)  # accepted, heard by nobody
        started = time.monotonic()
        assert db.notify_wait(CHANNEL, 0.3, token) is False
        assert time.monotonic() - started >= 0.25
    finally:
        db.close()
