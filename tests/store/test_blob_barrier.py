"""Blob files are made durable at the right barrier (docs/design.md, "Blobs: durable at
the barrier"): under ``synchronous=NORMAL`` no commit is durable before a checkpoint,
so a blob file is not fsynced before the transaction that refers to it, but every
checkpoint first syncs the blob files (and does not run if it cannot); under FULL
each file is durable before its transaction, as before.  A ``kill -9`` loses nothing
either way: the file is in the page cache once ``put`` returns."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fleetstore
from fleetstore import errors
from fleetstore.domain.blobs import BlobStore
from fleetstore.engine.base import Migration
from fleetstore.engine.sqlite import Database


def test_under_normal_the_checkpoint_syncs_the_blobs_first(tmp_path: Path) -> None:
    store = fleetstore.open(tmp_path / "n.db", checkpoint_bytes=64 * 1024)
    try:
        assert isinstance(store.blobs, BlobStore) and store.blobs.durable is False
        order: list[str] = []
        real_sync = store.blobs.sync

        def sync() -> None:
            order.append("sync")
            real_sync()

        store.db.checkpoint()  # any checkpoint of the open (migrations) is done with
        base = store.db.metrics()["checkpoints"]
        store.db.before_checkpoint(sync)  # the same hook the store registered, observed
        s = store.sessions.create()
        store.messages.append(s.id, "tool", os.urandom(200_000).hex())  # a blob
        store.db.checkpoint()
        # Every checkpoint (the explicit one, and any the checkpoint thread ran) was
        # preceded by a sync of the blob files.
        assert len(order) >= store.db.metrics()["checkpoints"] - base >= 1
    finally:
        store.close()


def test_under_full_each_blob_is_durable_before_its_transaction(tmp_path: Path) -> None:
    with fleetstore.open(tmp_path / "f.db", synchronous="FULL") as store:
        assert isinstance(store.blobs, BlobStore) and store.blobs.durable is True
        assert store.db._before_checkpoint is None


def test_a_checkpoint_whose_blobs_cannot_be_synced_does_not_run(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    db = Database.open(path, migrations=[Migration(1, "t", "CREATE TABLE t(v BLOB)")])
    try:
        for _ in range(50):
            with db.write() as tx:
                tx.execute("INSERT INTO t(v) VALUES (randomblob(4000))")

        def failing() -> None:
            raise OSError(28, "No space left on device")

        db.before_checkpoint(failing)
        wal_before = os.path.getsize(f"{path}-wal")
        with pytest.raises(errors.DatabaseError, match="checkpoint put off"):
            db.checkpoint(truncate=True)
        # Nothing was copied into the database nor the WAL reset: the frames wait.
        assert os.path.getsize(f"{path}-wal") == wal_before > 0
        assert db.metrics()["checkpoint_errors"] == 1
        db.before_checkpoint(lambda: None)
        log, done = db.checkpoint(truncate=True)
        assert done == log
    finally:
        db.close()


KILLED = textwrap.dedent(
    """
    import os, sys
    import fleetstore
    store = fleetstore.open(sys.argv[1])
    s = store.sessions.create(id=sys.argv[2])
    m = store.messages.append(s.id, "tool", sys.argv[3] * 100_000)
    print("acked", m.id, flush=True)
    os.kill(os.getpid(), 9)
    """
)


def test_a_blob_acknowledged_under_normal_survives_kill_9(tmp_path: Path) -> None:
    path = str(tmp_path / "k.db")
    done = subprocess.run(
        [sys.executable, "-c", KILLED, path, "s1", "xyz"], capture_output=True, text=True
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    mid = done.stdout.split()[1]
    with fleetstore.open(path) as store:
        assert store.messages.get(mid).text == "xyz" * 100_000
