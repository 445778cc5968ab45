"""Blob garbage collection with a short grace never robs a write waiting for the lock,
with real processes: a writer stores its payload's blob file, then waits behind an
outside lock (``fleetstore lock``) while ``fleetstore maintain --blob-grace 1s`` runs
and finds the file old and unreferenced.  The write is acknowledged once the lock is
released, and must read back whole (it used to raise ``BlobCorrupt``: the collector had
deleted its file)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fleetstore
from tests.fix_procs import Spawn, start_lock

WRITER = r"""
import sys, fleetstore
from fleetstore import ToolResult
store = fleetstore.open(sys.argv[1], write_budget=30, on_busy="raise", blob_threshold=1024)
sid = store.sessions.create(title="waits").id
print("session", sid, flush=True)
sys.stdin.readline()
payload = "result " + "r" * 20000
print("appending", flush=True)
message = store.messages.append(sid, "tool", [ToolResult("c1", payload)])
print("acked", message.id, message.seq, flush=True)
store.close()
"""


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}
    env.update(extra)
    return env


def blob_files(path: Path) -> set[str]:
    blobs = Path(str(path) + ".blobs")
    return {p.name for p in blobs.glob("*/*") if len(p.name) == 64}


@pytest.mark.slow
def test_a_short_grace_does_not_delete_the_blob_of_a_write_waiting_for_the_lock(
    tmp_path: Path, spawn: Spawn
) -> None:
    path = tmp_path / "s.db"
    with fleetstore.open(path):
        pass
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        assert writer.stdin is not None and writer.stdout is not None
        sid = writer.stdout.readline().split()[1]
        lock, _ = start_lock(spawn, str(path), hold=6)
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "appending"
        deadline = time.monotonic() + 10
        while not blob_files(path):  # stored before the transaction, which now waits
            assert time.monotonic() < deadline, "the writer never stored its blob file"
            time.sleep(0.01)
        time.sleep(1.5)  # the file is now older than the grace, and no row refers to it
        done = subprocess.run(
            [sys.executable, "-m", "fleetstore", "maintain", str(path), "--blob-grace", "1s"],
            capture_output=True,
            text=True,
            timeout=120,
            env=clean_env(FLEETSTORE_WRITE_BUDGET="0.5"),
        )
        assert "blobs" in done.stdout, done.stdout + done.stderr
        assert lock.finish(timeout=30) == 0
        acked = writer.stdout.readline().split()
        assert acked[:1] == ["acked"], (acked, writer.stderr.read() if writer.stderr else "")
        assert writer.wait(timeout=30) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.communicate()
    with fleetstore.open(path) as store:
        [message] = store.messages.list(sid)
        assert message.id == acked[1]
        assert message.parts[0].output == "result " + "r" * 20000
    # And a second collection (the reference is committed now) keeps it too.
    again = subprocess.run(
        [sys.executable, "-m", "fleetstore", "maintain", str(path), "--blob-grace", "1s"],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )
    assert again.returncode == 0, again.stdout + again.stderr
    with fleetstore.open(path) as store:
        assert store.messages.list(sid)[0].parts[0].output.startswith("result ")


def test_a_settled_write_touches_its_files_only_while_a_collector_runs(tmp_path: Path) -> None:
    """The collector's half is a shared flock on the blob directory's COLLECTING file:
    while it is held, a write that is done touches its files (the collector's second
    look at the mtime sees it); otherwise it leaves them as they are, and writes again
    only a file that is gone."""
    import fcntl

    from fleetstore.domain.blobs import COLLECTING, BlobStore

    blobs = BlobStore(tmp_path / "b.blobs", 1 << 30)
    ref = blobs.put(os.urandom(50_000))
    path = blobs.path(ref.sha256)
    old = time.time() - 3600
    os.utime(path, (old, old))
    blobs.settle([ref.sha256], written=True)
    assert path.stat().st_mtime == old  # no collector: left alone
    blobs.put(blobs.get(ref.sha256))
    os.utime(path, (old, old))
    fd = os.open(blobs.directory / COLLECTING, os.O_RDONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        blobs.settle([ref.sha256], written=True)
        assert path.stat().st_mtime > old + 3000  # touched
        data = blobs.get(ref.sha256)
        blobs.put(data)
        path.unlink()  # collected meanwhile
        blobs.settle([ref.sha256], written=True)
        assert blobs.get(ref.sha256) == data  # written again
    finally:
        os.close(fd)
    assert not blobs.keeping
