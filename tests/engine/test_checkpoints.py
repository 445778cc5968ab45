"""Checkpoints run in a thread of their own while writers go on: they must still let
the WAL start over, or it grows without bound under a writer that never pauses (it
did: 226 MiB after 3,000 turns of one agent, checkpoint_bytes 4 MiB)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from fleetstore import Database, Migration

#: 6,000 writes of 8 KiB: about 3 WAL frames (4 KiB pages, 24-byte headers) each.
FRAMES_WRITTEN = 6000 * 3 * (4096 + 24)
T = Migration(1, "t", "CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL);")


def _write_without_pause(db: Database, writes: int, body: bytes) -> None:
    for _ in range(writes):
        with db.write() as tx:
            tx.execute("INSERT INTO t (body) VALUES (?)", (body,))


@pytest.mark.timing  # the checkpoint thread keeping up with the writer is a race of speeds
def test_a_writer_that_never_pauses_keeps_the_wal_bounded(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    line = 256 * 1024
    with Database.open(path, migrations=[T], checkpoint_bytes=line) as db:
        # 6,000 writes of 8 KiB (about 3 pages each): 70+ MiB of frames through the WAL.
        _write_without_pause(db, 6000, os.urandom(8192))
        db.checkpoint(wait=True)
        metrics = db.metrics()
        wal = os.stat(str(path) + "-wal").st_size  # the file's size: its high-water mark
    assert metrics["checkpoints"] >= 20
    # The WAL starts over again and again (once in 6,000 writes before), so its file
    # is bounded by what the writer adds while a checkpoint copies, not by all it wrote.
    assert metrics["wal_restarts"] >= 5, metrics
    assert wal < FRAMES_WRITTEN * 2 / 3, f"WAL {wal} bytes: it grew with the writes"


@pytest.mark.timing
def test_two_writer_threads_and_the_checkpoint_thread_keep_the_wal_bounded(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c2.db"
    line = 256 * 1024
    with Database.open(path, migrations=[T], checkpoint_bytes=line) as db:
        body = os.urandom(8192)
        threads = [
            threading.Thread(target=_write_without_pause, args=(db, 3000, body)) for _ in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        db.checkpoint(wait=True)
        with db.write() as tx:
            (count,) = tx.execute("SELECT count(*) FROM t")[0]
        wal = os.stat(str(path) + "-wal").st_size
        restarts = db.metrics()["wal_restarts"]
    assert count == 6000
    assert restarts >= 5
    assert wal < FRAMES_WRITTEN * 2 / 3, f"WAL {wal} bytes: it grew with the writes"
