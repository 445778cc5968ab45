"""Files that transfer commands make and read, with real processes: what export and
maintain's archive leave on disk (mode 0600 whatever the umask), import from a pipe,
merge of something that is not a store, and an import racing a writer."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import fleetstore
from fleetstore import ToolResult


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}
    env.update(extra)
    return env


def cli(
    *args: str, umask: int | None = None, input: bytes | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    def preexec() -> None:
        if umask is not None:
            os.umask(umask)

    return subprocess.run(
        [sys.executable, "-m", "fleetstore", *args],
        capture_output=True,
        input=input,
        timeout=timeout,
        env=clean_env(),
        preexec_fn=preexec,
    )


def small_store(path: Path, sessions: int = 3) -> list[str]:
    ids = []
    with fleetstore.open(path, blob_threshold=1024) as store:
        for i in range(sessions):
            s = store.sessions.create(title=f"secret {i}")
            store.messages.append(s.id, "tool", [ToolResult("c", "token=" + "x" * 4000)])
            ids.append(s.id)
    return ids


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_export_file_is_0600_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    db = tmp_path / "s.db"
    small_store(db)
    out = tmp_path / "out.zst"
    done = cli("export", "--store", str(db), "-o", str(out), umask=umask)
    assert done.returncode == 0, done.stderr
    assert mode(out) == 0o600
    # Replacing an existing, more open file leaves a 0600 file too.
    out.chmod(0o644)
    done = cli("export", "--store", str(db), "-o", str(out), umask=umask)
    assert done.returncode == 0, done.stderr
    assert mode(out) == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_maintain_archive_is_0600_under_umask_000(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    ids = small_store(db)
    with fleetstore.open(db) as store, store.db.write() as tx:
        tx.execute(
            "UPDATE sessions SET created_at = created_at - 90 * 86400, "
            "updated_at = updated_at - 90 * 86400 WHERE id IN (?, ?, ?)",
            ids,
        )
    archive = tmp_path / "archive.zst"
    done = cli("maintain", str(db), "--archive-older-than", "30d", str(archive), "--json", umask=0)
    assert done.returncode == 0, done.stderr
    assert archive.exists()
    assert mode(archive) == 0o600


# --- import from a pipe -------------------------------------------------------------------------


def test_import_reads_a_pipe(tmp_path: Path) -> None:
    """``fleetstore import <(cat file)``: a FILE that cannot seek (a FIFO) is read once
    into a private temporary file; it used to fail with "Illegal seek"."""
    src = tmp_path / "src.db"
    ids = small_store(src)
    exported = tmp_path / "e.zst"
    assert cli("export", "--store", str(src), "-o", str(exported)).returncode == 0
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    dest = tmp_path / "dest.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetstore", "import", str(fifo), "--store", str(dest)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
    )
    try:
        with open(fifo, "wb") as w:
            w.write(exported.read_bytes())
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    with fleetstore.open(dest) as store:
        assert sorted(s.id for s in store.sessions.list()) == sorted(ids)
        for sid in ids:
            assert store.messages.list(sid)[0].parts[0].output.startswith("token=")
    # The spooled copy is gone: nothing but the store's own files beside it.
    leftovers = [p.name for p in tmp_path.iterdir() if "import" in p.name]
    assert leftovers == [], leftovers


def test_merge_of_a_file_that_is_not_a_store_leaves_nothing(tmp_path: Path) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_bytes(b"just some text, not a database\n" * 10)
    dest = tmp_path / "dest.db"
    before = sorted(p.name for p in tmp_path.iterdir())
    done = cli("merge", str(junk), str(dest))
    assert done.returncode != 0
    assert b"not" in done.stderr and str(junk).encode() in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert junk.read_bytes() == b"just some text, not a database\n" * 10
