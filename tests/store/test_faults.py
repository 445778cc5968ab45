"""Faults injected into every step of a blob write and of a spool append
(tests/fix_faults.py's file seam), and into a store write's COMMIT (its VFS): the
caller's outcome is held to what is on disk.  Raised: a typed error
(``StorageFull``/``StorageError``) whose message says what was not written, and
nothing of the call is there (no row, no journal line, no temporary file).
Returned: written, exactly once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore import errors
from fleetstore.core.ids import new_id
from fleetstore.store import spool
from tests.fix_faults import Faults, FileFaults, importable_env
from tests.fix_procs import Proc, Spawn, start_lock

BIG = 200_000  # over blob_threshold: a blob file
BUDGET = 0.3

TMP = r"\.blobs/[0-9a-f]{2}/\.[0-9a-f]{64}\.\d+\.[0-9a-f]+\.tmp$"
BLOB = r"\.blobs/[0-9a-f]{2}/[0-9a-f]{64}$"
BLOB_DIR = r"\.blobs/[0-9a-f]{2}$"

# name: (call, path pattern, error, the error raised, synchronous).  Under NORMAL a
# blob file is not fsynced before its transaction (the checkpoint syncs it first), so
# the fsync steps are met under FULL.  A new step is one line.
BLOB_STEPS: dict[str, tuple[str, str, str, type[Exception], str]] = {
    "blob: the temporary file's creation": ("open", TMP, "full", errors.StorageFull, "NORMAL"),
    "blob: its bytes, disk full": ("write", TMP, "full", errors.StorageFull, "NORMAL"),
    "blob: its bytes, a short write": ("write", TMP, "short", errors.StorageFull, "NORMAL"),
    "blob: its bytes, I/O error": ("write", TMP, "eio", errors.StorageError, "NORMAL"),
    "blob: its fsync": ("fsync", TMP, "eio", errors.StorageError, "FULL"),
    "blob: the rename into place": ("replace", BLOB, "full", errors.StorageFull, "NORMAL"),
    "blob: the directory's fsync": ("fsync", BLOB_DIR, "eio", errors.StorageError, "FULL"),
}

JOURNAL = r"\.spool/\d+-[0-9a-f]{12}\.jsonl$"
# name: (call, path pattern, error, the error raised)
SPOOL_STEPS: dict[str, tuple[str, str, str, type[Exception]]] = {
    "journal: its creation": ("open", r"\.jsonl\.new$", "full", errors.StorageFull),
    "journal: the rename to its name": ("rename", JOURNAL, "full", errors.StorageFull),
    "journal: the directory's fsync": ("fsync", r"\.spool$", "eio", errors.StorageError),
    "journal: the line, disk full": ("write", JOURNAL, "full", errors.StorageFull),
    "journal: the line, a short write": ("write", JOURNAL, "short", errors.StorageFull),
    "journal: the line's fsync": ("fsync", JOURNAL, "eio", errors.StorageError),
}


def release(lock: Proc) -> None:
    os.kill(lock.pid, signal.SIGTERM)
    lock.wait_line("released", timeout=30)
    assert lock.finish(timeout=30) == 0


def new_store(tmp_path: Path, **settings: Any) -> tuple[str, str]:
    path = str(tmp_path / "f.db")
    with fleetstore.open(path, **settings) as store:
        sid = store.sessions.create(title="t").id
    return path, sid


def stored(path: str, sid: str) -> list[str]:
    """The ids of the session's messages, read by a fresh open (nothing of this test's
    stores still open)."""
    with fleetstore.open(path) as store:
        return [m.id for m in store.messages.list(sid)]


def temp_files(path: str) -> list[Path]:
    return [p for p in Path(path + ".blobs").rglob("*") if p.name.endswith(".tmp")]


def blob_files(path: str) -> list[Path]:
    return [p for p in Path(path + ".blobs").rglob("*") if re.fullmatch("[0-9a-f]{64}", p.name)]


def journal_ops(path: str) -> list[str]:
    return [
        op.args.get("id", "")
        for j in spool.journals(path + ".spool")
        for op in spool.read_journal(j).ops
    ]


@pytest.mark.parametrize("spooled", [False, True], ids=["applied", "spooled"])
@pytest.mark.parametrize("step", list(BLOB_STEPS))
def test_a_blob_write_that_fails_raises_a_storage_error_and_leaves_nothing(
    tmp_path: Path, file_faults: FileFaults, spawn: Spawn, step: str, spooled: bool
) -> None:
    call, pattern, error, expected, sync = BLOB_STEPS[step]
    path, sid = new_store(tmp_path, synchronous=sync)
    lock = start_lock(spawn, path, 60.0)[0] if spooled else None
    store = fleetstore.open(path, synchronous=sync, write_budget=BUDGET)
    mid = new_id()
    full = expected is errors.StorageFull
    try:
        # A full disk is waited out within the budget: it fails only if it stays full.
        rule = file_faults.fail(call, pattern, error=error, times=0 if full else 1)
        with pytest.raises(expected) as raised:
            store.messages.append(sid, "tool", os.urandom(BIG // 2).hex(), id=mid)
        assert rule.fired > 1 if full else rule.fired == 1
        message = str(raised.value)
        assert "could not be stored" in message
        assert "nothing that refers to it was written" in message
        assert temp_files(path) == []  # no temporary file left, whatever step failed
        if call == "fsync" and pattern == BLOB_DIR:
            assert "its file is in place" in message  # whole, referred to by nothing
            assert len(blob_files(path)) == 1
        else:
            assert "no file of it was left" in message and blob_files(path) == []
        assert mid not in journal_ops(path)
        file_faults.clear()
        again = store.messages.append(sid, "tool", os.urandom(8).hex() * (BIG // 16), id=mid)
        assert again.id == mid  # the same call, the fault gone: it returns
        if lock is not None:
            release(lock)
            lock = None
        assert store.flush(60)
    finally:
        if lock is not None:
            release(lock)
        store.close()
    assert stored(path, sid) == [mid]  # returned: written, exactly once


@pytest.mark.parametrize(
    "step",
    [name for name, (_c, _p, _e, raised, _s) in BLOB_STEPS.items() if raised is errors.StorageFull],
)
def test_a_blob_write_that_meets_a_full_disk_for_a_moment_waits_and_lands(
    tmp_path: Path, file_faults: FileFaults, step: str
) -> None:
    """A full disk that frees within the write budget costs latency, not the write
    (issue 23): the blob file is written again until it fits."""
    call, pattern, error, _raised, sync = BLOB_STEPS[step]
    path, sid = new_store(tmp_path, synchronous=sync)
    store = fleetstore.open(path, synchronous=sync, write_budget=5.0)
    try:
        rule = file_faults.fail(call, pattern, error=error, times=3)
        m = store.messages.append(sid, "tool", os.urandom(BIG // 2).hex())
        assert rule.fired == 3 and m.seq is not None
        assert temp_files(path) == [] and len(blob_files(path)) == 1
    finally:
        store.close()
    assert stored(path, sid) == [m.id]


@pytest.mark.parametrize("step", list(SPOOL_STEPS))
def test_a_spool_append_that_fails_raises_a_storage_error_and_keeps_nothing(
    tmp_path: Path, file_faults: FileFaults, spawn: Spawn, step: str
) -> None:
    call, pattern, error, expected = SPOOL_STEPS[step]
    path, sid = new_store(tmp_path)
    lock, _ = start_lock(spawn, path, 60.0)
    store = fleetstore.open(path, write_budget=BUDGET)
    failed, kept = new_id(), new_id()
    try:
        rule = file_faults.fail(call, pattern, error=error)
        with pytest.raises(expected) as raised:
            store.messages.append(sid, "user", "lost", id=failed)
        assert rule.fired == 1
        assert "nor spooled" in str(raised.value) and "nothing was written" in str(raised.value)
        assert failed not in journal_ops(path)
        assert len(store.spool) == 0
        file_faults.clear()
        assert store.messages.append(sid, "user", "kept", id=kept).seq is None  # spooled
        assert journal_ops(path) == [kept]
        release(lock)
        assert store.flush(60)
    finally:
        if lock.popen.poll() is None:
            release(lock)
        store.close()
    assert stored(path, sid) == [kept]
    assert spool.journals(path + ".spool") == []


def test_a_journal_whose_failed_line_cannot_be_cut_refuses_later_appends(
    tmp_path: Path, file_faults: FileFaults, spawn: Spawn
) -> None:
    """The failed line's bytes cannot be cut off (the ftruncate fails too): no line may
    follow them, or the next replay would stop at them as damage."""
    path, sid = new_store(tmp_path)
    lock, _ = start_lock(spawn, path, 60.0)
    store = fleetstore.open(path, write_budget=BUDGET)
    try:
        store.messages.append(sid, "user", "first")  # the journal exists
        file_faults.fail("write", JOURNAL, error="short")
        file_faults.fail("ftruncate", JOURNAL, error="eio")
        with pytest.raises(errors.StorageFull):
            store.messages.append(sid, "user", "torn")
        file_faults.clear()
        with pytest.raises(errors.StorageError, match="could not be undone"):
            store.messages.append(sid, "user", "refused")
        release(lock)
        assert store.flush(60)
    finally:
        if lock.popen.poll() is None:
            release(lock)
        store.close()
    with fleetstore.open(path) as store:
        assert [m.text for m in store.messages.list(sid)] == ["first"]


# -- a store write whose COMMIT cannot tell -------------------------------------------------

CRASHED = r"""
import json, os, sys
from tests.fix_faults import install
import fleetstore
faults = install()
store = fleetstore.open(sys.argv[1], synchronous="FULL")
s = store.sessions.create(id=sys.argv[2])
faults.fail("xSync", "wal", error="ioerr")  # the next COMMIT's WAL sync fails
m = store.messages.append(s.id, "user", "once")
print(json.dumps({"id": m.id, "seq": m.seq, "ambiguous": store.metrics()["ambiguous_commits"]}), flush=True)
os.kill(os.getpid(), 9)
"""


def test_a_store_write_whose_commit_sync_failed_is_applied_again_and_lands_once(
    tmp_path: Path,
) -> None:
    """SQLite's COMMIT failed syncing the WAL: the frames may be whole there, and a
    crash would bring them back.  The operation is idempotent, so the store applies it
    again: the append returns, and after a SIGKILL the message is there once."""
    path = str(tmp_path / "u.db")
    sid = new_id()
    env = importable_env()
    done = subprocess.run(
        [sys.executable, "-c", CRASHED, path, sid],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    report = json.loads(done.stdout)
    assert report["seq"] == 1 and report["ambiguous"] == 1
    with fleetstore.open(path) as store:
        assert [(m.id, m.seq, m.text) for m in store.messages.list(sid)] == [
            (report["id"], 1, "once")
        ]


def test_a_raw_write_whose_commit_sync_failed_says_it_may_be_there(
    tmp_path: Path, faults: Faults
) -> None:
    db = fleetstore.Database.open(
        tmp_path / "r.db",
        migrations=[fleetstore.Migration(1, "t", "CREATE TABLE t(v)")],
        synchronous="FULL",
    )
    try:
        faults.fail("xSync", "wal", error="ioerr")
        uncertain = pytest.raises(errors.CommitUncertain, match="may or may not be in the file")
        with uncertain, db.write() as tx:
            tx.execute("INSERT INTO t VALUES (1)")
        assert db.metrics()["write_errors"] == 1
        with db.write() as tx:  # the connection is fine afterwards
            tx.execute("INSERT INTO t VALUES (2)")
    finally:
        db.close()


@pytest.mark.timing
def test_a_store_write_whose_outcome_stays_unknown_past_the_budget_is_spooled_and_lands_once(
    tmp_path: Path, faults: Faults
) -> None:
    """Every COMMIT's WAL sync fails for longer than the budget: the append cannot learn
    within it whether it is in the file (CommitUncertain), so the store keeps it in its
    spool, whose replay finds it there or writes it: once."""
    path = tmp_path / "u.db"
    store = fleetstore.open(path, synchronous="FULL", write_budget=0.5)
    try:
        s = store.sessions.create()
        faults.fail("xSync", "wal", error="ioerr", times=0)
        started = time.monotonic()
        m = store.messages.append(s.id, "user", "unknown")
        assert m.seq is None and time.monotonic() - started < 0.5 + 1.0  # spooled in time
        assert store.spool_pending() == 1
        faults.clear()
        assert store.flush(30)
        assert [(x.id, x.text) for x in store.messages.list(s.id)] == [(m.id, "unknown")]
    finally:
        store.close()
