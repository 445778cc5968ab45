"""Files that transfer commands make and read, with real processes: what export and
maintain's archive leave on disk (mode 0600 whatever the umask), import from a pipe,
merge of something that is not a store, and an import racing a writer."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fleetstore
from fleetstore import ToolResult
from fleetstore.transfer.export import export_store
from fleetstore.transfer.importing import import_file
from tests.fix_stores import OpenStore


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


def test_a_database_moved_across_file_systems_is_0600_from_its_first_byte(
    tmp_path: Path,
) -> None:
    """maintain's archive moves a database it built to its place; across file systems
    (here /dev/shm, a tmpfs) that is a copy, which followed the umask until its chmod."""
    from fleetstore.transfer import archive as archive_module

    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a file system of its own")
    src = tmp_path / "built.db"
    src.write_bytes(b"x" * 100_000)
    dst = shm / f"fleetstore-test-{os.getpid()}.db"
    seen: list[int] = []
    real_fsync = os.fsync

    def watching(fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):  # the copy, written, not yet renamed
            seen.append(st.st_mode & 0o777)
        real_fsync(fd)

    old = os.umask(0)
    try:
        archive_module.os.fsync = watching  # type: ignore[assignment]
        archive_module._move(src, dst)
    finally:
        archive_module.os.fsync = real_fsync  # type: ignore[assignment]
        os.umask(old)
    try:
        assert seen == [0o600] and mode(dst) == 0o600
        assert dst.read_bytes() == b"x" * 100_000 and not src.exists()
    finally:
        dst.unlink()


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
    assert done.returncode == 1, done.stderr
    assert b"not" in done.stderr and str(junk).encode() in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert junk.read_bytes() == b"just some text, not a database\n" * 10


# --- an import racing a writer ------------------------------------------------------------------

RIVAL = r"""
import sys, fleetstore
from fleetstore.core.ids import new_id
from fleetstore.domain import registry
from fleetstore.domain.operations import Operation
# Without the gate: it holds SQLite's write lock as a program of another kind would,
# and the import, which takes the gate, waits for it.
store = fleetstore.open(sys.argv[1], gate=False, write_budget=60)
with store.db.write() as tx:
    print("locked", flush=True)
    sys.stdin.readline()
    op = Operation("create_session", {"id": sys.argv[2], "title": "theirs"}, new_id())
    registry.apply(tx, store.queries, op, tx.now)
print("created", flush=True)
store.close()
"""


@pytest.mark.slow
def test_an_import_that_meets_a_conflict_written_since_its_check_writes_nothing(
    tmp_path: Path,
) -> None:
    """Between the import's check and its writes another process creates one of the
    file's sessions with other contents: the import is rejected whole (it used to stop
    with exit 1 after writing every session before that one)."""
    from fleetstore.engine.proclocks import lock_holders

    src = tmp_path / "src.db"
    with fleetstore.open(src) as store:
        ids = [store.sessions.create(title=f"s{i}").id for i in range(3000)]
    exported = tmp_path / "e.zst"
    assert cli("export", "--store", str(src), "-o", str(exported)).returncode == 0
    dest = tmp_path / "dest.db"
    with fleetstore.open(dest):
        pass
    rival = subprocess.Popen(
        [sys.executable, "-c", RIVAL, str(dest), ids[-1]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    importer = None
    try:
        assert rival.stdin is not None and rival.stdout is not None
        assert rival.stdout.readline().strip() == "locked"
        importer = subprocess.Popen(
            [sys.executable, "-m", "fleetstore", "import", str(exported), "--store", str(dest)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(FLEETSTORE_WRITE_BUDGET="60"),
        )
        # The check is done once the importer holds the gate, waiting for SQLite's lock.
        deadline = time.monotonic() + 60
        while not any(h.pid == importer.pid and h.lock == "gate" for h in lock_holders(str(dest))):
            assert importer.poll() is None, importer.communicate()
            assert time.monotonic() < deadline, "the importer never reached its writes"
            time.sleep(0.02)
        rival.stdin.write("go\n")
        rival.stdin.flush()
        assert rival.stdout.readline().strip() == "created"
        _out, err = importer.communicate(timeout=120)
    finally:
        for p in (rival, importer):
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.communicate()
    assert importer.returncode == 1, err
    assert ids[-1] in err and "nothing was imported" in err, err
    with fleetstore.open(dest) as store:
        listed = store.sessions.list(limit=10_000)
    assert [(s.id, s.title) for s in listed] == [(ids[-1], "theirs")]


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_a_conflict_written_after_the_check_rolls_the_whole_import_back(
    open_store: OpenStore, tmp_path: Path, engine: str
) -> None:
    """The same on each engine whose import is one transaction: another store object
    (another connection) creates one of the file's sessions right after the check."""
    src = tmp_path / "src.db"
    ids = small_store(src, sessions=20)
    exported = tmp_path / "e.zst"
    with fleetstore.open(src) as store:
        export_store(store, exported)
    dest = open_store("dest.db", blob_threshold=1024)
    rival = open_store("dest.db")
    created: list[str] = []

    def progress(stage: str, done: int, total: int) -> None:
        if stage != "check" and not created:
            rival.sessions.create(id=ids[5], title="theirs")
            created.append(ids[5])

    with pytest.raises(fleetstore.AlreadyExists, match="nothing was imported"):
        import_file(dest, exported, progress=progress)
    assert created
    assert [(s.id, s.title) for s in dest.sessions.list()] == [(ids[5], "theirs")]
    assert dest.messages.list(ids[5]) == []
    # With the rival's session gone, the same file imports whole.
    dest.sessions.delete(ids[5])
    summary = import_file(dest, exported)
    assert summary.sessions == 20
    assert sorted(s.id for s in dest.sessions.list()) == sorted(ids)
    assert dest.messages.list(ids[0])[0].parts[0].output.startswith("token=")
