"""Faults injected into every step of a write and of a checkpoint (tests/fix_faults.py's
VFS), with the caller's outcome held to the file's: a write that raised is not in the
file, one that returned is there exactly once, whether its process then closes the
database or is killed with SIGKILL (the WAL left as the fault made it).  Then what
runs after a COMMIT: none of it may turn a committed write into an error.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fleetstore import errors
from fleetstore.engine import checkpoints, gate
from fleetstore.engine.base import Tx
from fleetstore.engine.sqlite import Database
from tests.agents import fault_agent, script
from tests.fix_faults import Faults, importable_env

# name: (the rule, synchronous, setup, the error the caller must see).  A new step is
# one line.  Under NORMAL a write's frames reach the WAL at COMMIT, without a sync;
# under FULL the WAL is synced before COMMIT returns.
WRITE_STEPS: dict[str, tuple[dict[str, Any], str, str, type[Exception] | None]] = {
    "begin: page 1 read from the WAL (stale cache)": (
        {"method": "xRead", "file": "wal", "error": "ioerr"},
        "NORMAL",
        "stale",
        errors.StorageError,
    ),
    "commit: the first frame's header, disk full": (
        {"method": "xWrite", "file": "wal", "error": "full"},
        "NORMAL",
        "",
        errors.StorageFull,
    ),
    "commit: the first page, a short write": (
        {"method": "xWrite", "file": "wal", "nth": 2, "error": "short"},
        "NORMAL",
        "",
        errors.StorageFull,
    ),
    "commit: a middle page, I/O error": (
        {"method": "xWrite", "file": "wal", "nth": 4, "error": "ioerr"},
        "NORMAL",
        "",
        errors.StorageError,
    ),
    "commit: the commit frame's header": (
        {"method": "xWrite", "file": "wal", "match": "commit-header", "error": "full"},
        "NORMAL",
        "",
        errors.StorageFull,
    ),
    "commit: the commit frame's page, a short write": (
        {"method": "xWrite", "file": "wal", "match": "commit-page", "error": "short"},
        "FULL",
        "",
        errors.StorageFull,
    ),
    "commit: the WAL header of a restarted WAL": (
        {"method": "xWrite", "file": "wal", "match": "wal-header", "error": "full"},
        "NORMAL",
        "restart",
        errors.StorageFull,
    ),
    "commit: the restarted WAL header's sync": (
        {"method": "xSync", "file": "wal", "error": "ioerr"},
        "NORMAL",
        "restart",
        errors.CommitUncertain,
    ),
    "commit: the WAL sync (FULL)": (
        {"method": "xSync", "file": "wal", "error": "ioerr"},
        "FULL",
        "",
        errors.CommitUncertain,
    ),
}

CHECKPOINT_STEPS: dict[str, dict[str, Any]] = {
    "checkpoint: the database's size": {"method": "xFileSize", "file": "db", "error": "ioerr"},
    "checkpoint: the WAL sync before copying": {"method": "xSync", "file": "wal", "error": "ioerr"},
    "checkpoint: reading a frame": {"method": "xRead", "file": "wal", "nth": 2, "error": "ioerr"},
    "checkpoint: the first page copied, disk full": {"method": "xWrite", "file": "db"},
    "checkpoint: a later page, a short write": {
        "method": "xWrite",
        "file": "db",
        "nth": 3,
        "error": "short",
    },
    "checkpoint: the database grown or cut": {"method": "xTruncate", "file": "db"},
    "checkpoint: the database's sync": {"method": "xSync", "file": "db", "error": "ioerr"},
    "checkpoint: the WAL cut to zero": {"method": "xTruncate", "file": "wal", "error": "ioerr"},
}


def run_agent(path: Path, spec: dict[str, Any]) -> dict[str, Any]:
    env = importable_env()
    done = subprocess.run(
        [sys.executable, script("fault_agent.py"), str(path), json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    expected = -signal.SIGKILL if spec["end"] == "crash" else 0
    assert done.returncode == expected, done.stderr
    return dict(json.loads(done.stdout.splitlines()[-1]))


def keys_in(path: Path) -> tuple[list[str], str]:
    """The keys in the file and its integrity, read by a fresh process's view: this
    process never had it open."""
    db = Database.open(path, migrations=fault_agent.SCHEMA)
    try:
        keys = db.read(lambda tx: [r[0] for r in tx.execute("SELECT k FROM t ORDER BY k")])
        check = db.read(lambda tx: tx.execute("PRAGMA integrity_check")[0][0])
        return keys, str(check)
    finally:
        db.close()


@pytest.mark.parametrize("end", ["close", "crash"])
@pytest.mark.parametrize("step", list(WRITE_STEPS))
def test_a_write_that_raised_is_not_in_the_file_and_one_that_returned_is(
    tmp_path: Path, step: str, end: str
) -> None:
    rule, sync, setup, expected = WRITE_STEPS[step]
    path = tmp_path / "w.db"
    spec = {"sync": sync, "setup": setup, "op": "write", "rule": rule, "end": end}
    report = run_agent(path, spec)
    assert report["fired"] == 1, report  # the step was met
    keys, check = keys_in(path)
    assert check == "ok"
    assert {"a", "b"} <= set(keys) and len(keys) == len(set(keys))
    assert report["raised"] == (expected.__name__ if expected else None), report
    if expected is errors.CommitUncertain:
        # The one outcome SQLite cannot know: the frames may be whole in the WAL.  The
        # error says so; a store's write is applied again (see the store tests).
        assert "may or may not be in the file" in report["message"]
    elif expected is not None:
        assert "x" not in keys, (report, keys)  # raised: not written
        assert "nothing of the transaction was written" in report["message"]
    else:
        assert keys.count("x") == 1


@pytest.mark.parametrize("end", ["close", "crash"])
@pytest.mark.parametrize("step", list(CHECKPOINT_STEPS))
def test_a_checkpoint_that_fails_loses_no_committed_write(
    tmp_path: Path, step: str, end: str
) -> None:
    path = tmp_path / "c.db"
    spec = {"sync": "NORMAL", "setup": "", "op": "checkpoint", "rule": CHECKPOINT_STEPS[step]}
    report = run_agent(path, {**spec, "end": end})
    assert report["fired"] >= 1, report
    assert report["raised"] in ("StorageError", "StorageFull"), report
    assert "committed writes stay in the WAL" in report["message"]
    assert report["figures"]["checkpoint_errors"] == 1
    assert report["figures"]["last_error"]["what"] == "checkpoint"
    log, done = report["checkpoint_after"]  # the fault gone, the next one works
    assert done == log
    keys, check = keys_in(path)
    assert check == "ok" and keys == ["a", "b"]


# -- the background checkpoint --------------------------------------------------------------


def _wait(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def small_db(path: Path, **settings: Any) -> Database:
    return Database.open(path, migrations=fault_agent.SCHEMA, checkpoint_bytes=8192, **settings)


def insert(db: Database, key: str) -> None:
    with db.write() as tx:
        tx.execute("INSERT INTO t VALUES (?, randomblob(9000))", (key,))


def commit_until_checkpointed(db: Database) -> None:
    """Commit rows (keys ``more-N``) until a checkpoint runs: the checkpoint thread is
    alive and asked.  (One commit may not cross the line: the WAL's count of frames
    can start over at a checkpoint.)"""
    done, more = db.metrics()["checkpoints"], iter(range(10_000))

    def checkpointed() -> bool:
        if db.metrics()["checkpoints"] > done:
            return True
        insert(db, f"more-{next(more)}")
        return False

    _wait(checkpointed)


def test_a_background_checkpoint_on_a_full_disk_is_counted_and_the_writes_return(
    tmp_path: Path, faults: Faults
) -> None:
    db = small_db(tmp_path / "b.db")
    try:
        faults.fail("xWrite", "db", error="full", times=0)  # no page reaches the database
        for i in range(5):
            insert(db, f"k{i}")  # each crosses checkpoint_bytes: the thread is asked
        _wait(lambda: db.metrics()["checkpoint_errors"] >= 1)
        last = db.metrics()["last_error"]
        assert last["what"] == "checkpoint" and last["error"].startswith("StorageFull:")
        faults.clear()
        commit_until_checkpointed(db)  # checkpoints go on
        keys = db.read(lambda tx: [r[0] for r in tx.execute("SELECT k FROM t")])
        assert [k for k in keys if k.startswith("k")] == [f"k{i}" for i in range(5)]
    finally:
        db.close()


@pytest.mark.parametrize("failure", ["not a fleetstore error", "an untranslated driver error"])
def test_the_checkpoint_thread_survives_any_failure(
    tmp_path: Path, faults: Faults, failure: str
) -> None:
    """A checkpoint raising anything but a fleetstore error ended the thread with its
    flag still set: no checkpoint ever ran again, and the WAL grew without bound."""
    db = small_db(tmp_path / "t.db", truncate_bytes=1)
    try:
        if failure == "not a fleetstore error":

            def hook() -> None:
                raise RuntimeError("a bug in a hook")

            db.before_checkpoint(hook)
        else:
            faults.fail("xTruncate", "wal", error="ioerr")  # the TRUNCATE checkpoint
        insert(db, "k0")
        _wait(lambda: db.metrics()["checkpoint_errors"] + db.metrics()["post_commit_errors"] >= 1)
        db.before_checkpoint(lambda: None)
        faults.clear()
        commit_until_checkpointed(db)
    finally:
        db.close()


# -- what runs after COMMIT --------------------------------------------------------------------


class KeyItem:
    def __init__(self, key: str) -> None:
        self.key = key

    def run(self, tx: Tx) -> object:
        tx.execute("INSERT INTO t VALUES (?, randomblob(9000))", (self.key,))
        return self.key

    def payload(self) -> bytes | None:
        return None

    def result(self, data: bytes) -> object:
        return data.decode()


def _break(monkeypatch: pytest.MonkeyPatch, db: Database, step: str) -> None:
    """Make *step* of the work after a COMMIT fail once."""
    calls = {"n": 0}

    def once(real: Any) -> Any:
        def broken(*args: Any, **kw: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError(f"injected: {step}")
            return real(*args, **kw)

        return broken

    if step == "WAL size count":
        # The WAL hook (inside COMMIT) reads the step of its count: make that fail once.
        value = db._checkpoint_step

        def step_of(self: Database) -> int:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError(f"injected: {step}")
            return value

        monkeypatch.setattr(Database, "_checkpoint_step", property(step_of), raising=False)
    elif step == "gate release":
        real_flock = gate.fcntl.flock

        def flock(fd: int, op: int) -> None:
            if op == gate.fcntl.LOCK_UN and calls["n"] == 0:
                calls["n"] += 1
                raise OSError(37, "No locks available (injected)")
            real_flock(fd, op)

        monkeypatch.setattr(gate, "fcntl", _With(gate.fcntl, flock=flock))
    elif step == "gate wake-up":
        monkeypatch.setattr(db._combiner, "woken", once(db._combiner.woken))
        monkeypatch.setattr(db._combiner, "_wake", once(db._combiner._wake))
    elif step == "figures":
        monkeypatch.setattr(db._metrics, "record_write", once(db._metrics.record_write))
    elif step == "checkpoint thread start":
        _wait(lambda: not db._checkpoints._running)  # the warm-up's thread has ended
        thread = checkpoints.threading.Thread

        class NoThread(thread):  # type: ignore[misc,valid-type]
            def start(self) -> None:
                calls["n"] += 1
                if calls["n"] == 1:
                    raise RuntimeError("can't start new thread (injected)")
                super().start()

        monkeypatch.setattr(checkpoints, "threading", _With(checkpoints.threading, Thread=NoThread))
    else:
        raise AssertionError(step)


class _With:
    """A module with some attributes replaced."""

    def __init__(self, module: Any, **replaced: Any) -> None:
        self._module = module
        self.__dict__.update(replaced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


POST_COMMIT = [
    "WAL size count",
    "gate release",
    "gate wake-up",
    "figures",
    "checkpoint thread start",
]


@pytest.mark.parametrize("how", ["write", "submit"])
@pytest.mark.parametrize("step", POST_COMMIT)
def test_nothing_after_commit_turns_a_committed_write_into_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, how: str
) -> None:
    db = small_db(tmp_path / "p.db")
    try:
        insert(db, "warm")  # connections and the gate file exist
        _break(monkeypatch, db, step)
        if how == "write":
            insert(db, "x")  # returns: it committed
        else:
            assert db.submit(KeyItem("x")) == "x"
        monkeypatch.undo()
        keys = db.read(lambda tx: [r[0] for r in tx.execute("SELECT k FROM t")])
        assert keys.count("x") == 1
        figures = db.metrics()
        assert figures["post_commit_errors"] == 1, figures
        assert "injected" in figures["last_error"]["error"]
        # Nothing is left held or stuck: the next writes, from this process and from
        # another thread, go through, and checkpoints still run.
        other = threading.Thread(target=insert, args=(db, "y"))
        other.start()
        other.join(30)
        insert(db, "z")
        commit_until_checkpointed(db)
    finally:
        db.close()
    keys, check = keys_in(tmp_path / "p.db")
    assert check == "ok" and [k for k in keys if not k.startswith("more-")] == [
        "warm",
        "x",
        "y",
        "z",
    ]


def test_a_batch_whose_results_cannot_be_handed_back_still_lands_each_item_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: the holder commits another writer's item with its own, then fails
    to write that item's result into its slot.  The holder's write returns; the other
    is told to apply its item itself (RETRY), finds it there, and lands it once."""
    from fleetstore.engine.board import POSTED, Board, Taken
    from fleetstore.engine.combine import Request
    from tests.agents.combine_agent import SCHEMA, TAG, KeyItem, applier

    path = tmp_path / "g.db"
    holder = Database.open(path, migrations=SCHEMA)
    waiter = Database.open(path, migrations=SCHEMA)
    try:
        for db, warm in ((holder, "warm-h"), (waiter, "warm-w")):
            db.serve(TAG, applier)
            db.submit(KeyItem(warm, 1))  # each owns a slot
        board = holder._combiner.board()
        assert isinstance(board, Board)
        holder._gate.acquire(time.monotonic() + 30)
        outcome: dict[str, object] = {}
        other = threading.Thread(target=lambda: outcome.update(w=waiter.submit(KeyItem("w", 2))))
        other.start()
        _wait(lambda: any(board.states[i] == POSTED for i in range(len(board.states))))

        def broken(self: Board, t: Taken, results: object) -> bool:
            raise OSError(5, "Input/output error (injected)")

        monkeypatch.setattr(Board, "put_results", broken)
        own = Request(KeyItem("h", 1), time.monotonic() + 30)
        holder._combiner._serve([own], None, time.monotonic())  # holds the gate; releases it
        assert own.outcome() == {"key": "h", "inserted": True}
        monkeypatch.undo()
        other.join(30)
        assert outcome["w"] == {"key": "w", "inserted": False}  # found there: applied once
        assert holder.metrics()["post_commit_errors"] == 1
        assert holder.metrics()["served"] == 1
        rows = holder.read(lambda tx: tx.execute("SELECT k FROM t ORDER BY k"))
        assert [r[0] for r in rows] == ["h", "w", "warm-h", "warm-w"]
    finally:
        waiter.close()
        holder.close()


@pytest.mark.parametrize("cls", [errors.StorageError, errors.StorageFull, errors.CommitUncertain])
def test_storage_errors_cross_processes_as_themselves(cls: type[errors.StorageError]) -> None:
    """Group commit hands an item's error back as data (errors.to_wire / from_wire)."""
    sent = cls("/srv/app.db: No space left on device; nothing of the transaction was written")
    back = errors.from_wire(json.loads(json.dumps(errors.to_wire(sent))))
    assert type(back) is cls and str(back) == str(sent)
    assert isinstance(back, errors.DatabaseError)


@pytest.mark.parametrize("waiter_sync", ["NORMAL", "FULL"])
def test_a_holder_commits_a_waiters_item_as_durably_as_the_waiter_asked(
    tmp_path: Path, faults: Faults, monkeypatch: pytest.MonkeyPatch, waiter_sync: str
) -> None:
    """Issue 23, cause 5: 115-118 writes of a process opened with synchronous=FULL were
    committed by a NORMAL holder, without the WAL fsync FULL promises.  Each item carries
    its process's durability; the holder commits its batch at the highest it holds."""
    from fleetstore.engine.board import POSTED, Board
    from fleetstore.engine.combine import Request
    from tests.agents.combine_agent import SCHEMA, TAG, KeyItem, applier

    path = tmp_path / "g.db"
    holder = Database.open(path, migrations=SCHEMA, synchronous="NORMAL")
    waiter = Database.open(path, migrations=SCHEMA, synchronous=waiter_sync)
    try:
        for db, warm in ((holder, "warm-h"), (waiter, "warm-w")):
            db.serve(TAG, applier)
            db.submit(KeyItem(warm, 1))  # each owns a slot
        board = holder._combiner.board()
        assert isinstance(board, Board)
        holder._gate.acquire(time.monotonic() + 30)
        outcome: dict[str, object] = {}
        other = threading.Thread(target=lambda: outcome.update(w=waiter.submit(KeyItem("w", 2))))
        other.start()
        _wait(lambda: any(board.states[i] == POSTED for i in range(len(board.states))))
        faults.recording = True
        own = Request(KeyItem("h", 1), time.monotonic() + 30)
        holder._combiner._serve([own], None, time.monotonic())  # holds the gate; releases it
        own.outcome()
        faults.recording = False
        other.join(30)
        assert outcome["w"] == {"key": "w", "inserted": True}
        assert holder.metrics()["served"] == 1
        syncs = [c for c in faults.calls if c.method == "xSync" and c.file == "wal"]
        assert len(syncs) == (1 if waiter_sync == "FULL" else 0), faults.calls
        sync = (
            holder._writer.execute("PRAGMA synchronous").fetchall()[0][0] if holder._writer else 1
        )
        assert sync == 1  # the holder's own setting is back for its next write
    finally:
        waiter.close()
        holder.close()
