"""What ``fleetstore.open`` refuses before it creates or uses anything: an empty path
in a URL, sidecars (blob directory, spool journals, gate) that someone other than the
store's owner planted or can write, a database file that is not its user's alone or
not a database at all; and the directories it makes, 0700 whatever the umask."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import fleetstore
from fleetstore import Database, errors
from fleetstore.core.targets import CATALOG
from fleetstore.store.facade import recover_journals


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite:////", "sqlite+sharded:///"])
def test_an_empty_path_in_a_url_is_refused(url: str) -> None:
    before = set(os.listdir("/"))
    with pytest.raises(errors.ConfigError, match="empty store path"):
        fleetstore.open(url)
    assert set(os.listdir("/")) == before
    assert not os.path.exists("/fleetstore.db")


# --- sidecars someone else planted --------------------------------------------------------------

OTHER_UID = 54321


def a_store(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "s.db"
    with fleetstore.open(path, blob_threshold=1024) as store:
        sid = store.sessions.create(title="mine").id
        store.messages.append(sid, "tool", [fleetstore.ToolResult("c", "x" * 5000)])
    return path, sid


def planted_journal(path: Path, sid: str) -> Path:
    """A spool journal of a "dead process" that deletes the session, as another user
    who can write the directory could leave it."""
    from fleetstore.core.ids import new_id
    from fleetstore.domain.operations import Operation
    from fleetstore.store.spool import encode_line

    spool = Path(str(path) + ".spool")
    spool.mkdir(mode=0o700, exist_ok=True)
    journal = spool / f"999999-{os.urandom(6).hex()}.jsonl"
    journal.write_bytes(encode_line(Operation("delete_session", {"id": sid}, new_id())))
    return journal


def still_there(path: Path, sid: str) -> bool:
    from fleetstore.store.readonly import open_read_only

    with open_read_only(path) as store:  # replays nothing
        return store.sessions.get(sid).title == "mine"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_journal_of_another_user_is_not_replayed(tmp_path: Path) -> None:
    path, sid = a_store(tmp_path)
    journal = planted_journal(path, sid)
    os.chown(journal, OTHER_UID, OTHER_UID)
    with pytest.raises(errors.UnsafeSidecar, match=f"{journal}: owned by uid {OTHER_UID}"):
        fleetstore.open(path)
    assert journal.exists() and still_there(path, sid)
    with pytest.raises(errors.UnsafeSidecar):
        recover_journals(path)  # fleetstore recover
    assert still_there(path, sid)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_spool_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    path, sid = a_store(tmp_path)
    planted_journal(path, sid)
    spool = Path(str(path) + ".spool")
    for p in [spool, *spool.iterdir()]:
        os.chown(p, OTHER_UID, OTHER_UID)
    with pytest.raises(errors.UnsafeSidecar, match="owned by uid"):
        fleetstore.open(path)
    assert still_there(path, sid)


def test_a_journal_others_can_write_is_refused(tmp_path: Path) -> None:
    path, sid = a_store(tmp_path)
    journal = planted_journal(path, sid)
    journal.chmod(0o666)
    with pytest.raises(errors.UnsafeSidecar, match="writable by others"):
        fleetstore.open(path)
    assert still_there(path, sid)


def test_a_blobs_symlink_is_refused(tmp_path: Path) -> None:
    path, _ = a_store(tmp_path)
    theirs = tmp_path / "theirs"
    blobs = Path(str(path) + ".blobs")
    blobs.rename(theirs)
    blobs.symlink_to(theirs)
    with pytest.raises(errors.UnsafeSidecar, match="symbolic link") as caught:
        fleetstore.open(path)
    assert str(blobs) in str(caught.value)


@pytest.mark.parametrize("suffix", [".gate", "-shm"])
def test_a_gate_or_shm_others_can_write_is_refused(tmp_path: Path, suffix: str) -> None:
    path, _ = a_store(tmp_path)
    side = Path(str(path) + suffix)
    side.touch()
    side.chmod(0o666)
    with pytest.raises(errors.UnsafeSidecar, match=f"{side}: writable by others"):
        fleetstore.open(path)


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_sqlites_files_beside_it_others_can_read_are_refused(tmp_path: Path, suffix: str) -> None:
    """They hold the database's pages: readable by others, they leak what the 0600
    database file keeps (one left from before a `chmod 600` of the database)."""
    path, _ = a_store(tmp_path)
    side = Path(str(path) + suffix)
    side.touch()
    side.chmod(0o644)
    with pytest.raises(errors.UnsafeSidecar, match=f"{side}: readable by others"):
        fleetstore.open(path)
    assert side.stat().st_size == 0


def test_sidecars_of_our_own_are_fine(tmp_path: Path) -> None:
    path, sid = a_store(tmp_path)
    with fleetstore.open(path) as store:
        assert store.messages.list(sid)[0].parts[0].output == "x" * 5000


# --- the database file itself (issue 23, cause 9) ------------------------------------------------


def _listing(directory: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every entry under *directory*: its mode, owner and bytes (b"" for a directory)."""
    out = {}
    for p in sorted(directory.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(directory))] = (
            st.st_mode,
            st.st_uid,
            p.read_bytes() if p.is_file() else b"",
        )
    return out


def _opens(layout: str, directory: Path) -> None:
    """Open the store whose database file is *directory*/team.db (or whose catalog is)."""
    if layout == "file":
        fleetstore.open(directory / "team.db").close()
    elif layout == "sharded":
        fleetstore.open(f"sqlite+sharded://{directory}").close()
    else:
        Database.open(directory / "team.db").close()


@pytest.mark.parametrize("layout", ["file", "sharded", "engine"])
@pytest.mark.parametrize("mode", [0o666, 0o644, 0o640, 0o620], ids=oct)
def test_a_database_file_others_can_read_or_write_is_refused_and_left_as_it_was(
    tmp_path: Path, layout: str, mode: int
) -> None:
    """Another user pre-created a 0666 team.db in a shared directory and read what
    the victim wrote into it; a 0644 copy of a store is readable by everyone."""
    shared = tmp_path / "shared"
    shared.mkdir()
    name = CATALOG if layout == "sharded" else "team.db"
    for content in (b"", _a_database(tmp_path)):
        planted = shared / name
        planted.write_bytes(content)
        planted.chmod(mode)
        before = _listing(shared)
        with pytest.raises(errors.UnsafeFile, match=f"{planted}: .*by (its group|others)"):
            _opens(layout, shared)
        assert _listing(shared) == before  # nothing made beside it, nothing changed
        planted.chmod(0o600)  # the owner's answer: its own, 0600
        _opens(layout, shared)
        for p in list(shared.iterdir()):
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def _a_database(tmp_path: Path) -> bytes:
    source = tmp_path / "source.db"
    if not source.exists():
        with fleetstore.open(source) as store:
            store.sessions.create("theirs")
    return source.read_bytes()


@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink"])
def test_a_database_path_that_is_not_a_regular_file_is_refused_unopened(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "team.db"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path, 0o600)  # opened, it would hang a reader
    else:
        (tmp_path / "real.db").touch(mode=0o600)
        path.symlink_to(tmp_path / "real.db")
    before = _listing(tmp_path)
    with pytest.raises(errors.UnsafeFile, match=r"not a regular file|symbolic link"):
        # (fleetstore.open takes a directory for DIR/fleetstore.db)
        (Database.open if kind == "directory" else fleetstore.open)(path)
    assert _listing(tmp_path) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_root_refuses_another_users_file_in_a_directory_that_user_does_not_own(
    tmp_path: Path,
) -> None:
    """Root may maintain a user's store (the file and its directory that user's), not
    write into a file another user planted where root's store is expected."""
    planted = tmp_path / "team.db"
    planted.touch(mode=0o600)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(errors.UnsafeFile, match=f"owned by uid {OTHER_UID}"):
        fleetstore.open(planted)
    assert planted.stat().st_size == 0 and not Path(f"{planted}.gate").exists()
    theirs = tmp_path / "home"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    os.rename(planted, theirs / "team.db")
    with fleetstore.open(theirs / "team.db") as store:
        store.sessions.create("maintained by root")


VICTIM_UID = 54322


@pytest.mark.skipif(os.geteuid() != 0, reason="setuid to two other users needs root")
@pytest.mark.parametrize("mode", [0o600, 0o666], ids=oct)
def test_a_user_refuses_a_database_file_another_user_planted(mode: int) -> None:
    """A real second user: a child process of uid VICTIM_UID opens a team.db that uid
    OTHER_UID made in a world-writable sticky directory (as /tmp is)."""
    shared = Path(tempfile.mkdtemp(prefix="fleetstore-shared-", dir="/tmp"))
    try:
        shared.chmod(0o1777)
        planted = shared / "team.db"
        planted.touch(mode=mode)
        planted.chmod(mode)
        os.chown(planted, OTHER_UID, OTHER_UID)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the victim
            os.close(read)
            try:
                os.setgroups([])
                os.setresgid(VICTIM_UID, VICTIM_UID, VICTIM_UID)
                os.setresuid(VICTIM_UID, VICTIM_UID, VICTIM_UID)
                try:
                    Database.open(planted).close()
                    said = "opened"
                except errors.FleetstoreError as exc:
                    said = f"{type(exc).__name__}: {exc}"
                os.write(write, said.encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as fh:
            said = fh.read().decode()
        assert os.waitpid(pid, 0)[1] == 0
        assert said.startswith(f"UnsafeFile: {planted}: owned by uid {OTHER_UID}"), said
        assert planted.stat().st_size == 0 and sorted(os.listdir(shared)) == ["team.db"]
    finally:
        shutil.rmtree(shared)


# --- a file that is not a database (the soak: .gate and a 0644 -journal left) -----------------


@pytest.mark.parametrize(
    "content",
    [b"my notes\n" * 40, b'{"a": 1}\n', b"x", b"\0" * 50, b"SQLite format", b"\0" * 8192],
)
@pytest.mark.parametrize("layout", ["file", "sharded"])
def test_opening_a_file_that_is_not_a_database_makes_nothing_beside_it(
    tmp_path: Path, content: bytes, layout: str
) -> None:
    name = CATALOG if layout == "sharded" else "notes.db"
    path = tmp_path / name
    path.write_bytes(content)
    path.chmod(0o644)  # a user's file as any editor leaves it
    before = _listing(tmp_path)
    target = f"sqlite+sharded://{tmp_path}" if layout == "sharded" else path
    with pytest.raises(errors.CorruptStore, match=f"{path}: file is not a database"):
        fleetstore.open(target)
    assert _listing(tmp_path) == before  # no .gate, no -journal, the bytes as they were


def test_an_empty_or_absent_file_is_a_new_store(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch(mode=0o600)
    for path in (empty, tmp_path / "absent.db"):
        with fleetstore.open(path) as store:
            store.sessions.create("new")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


# --- directories fleetstore makes: 0700 whatever the umask (issue 23, cause 10) ---------------

_MAKES_DIRECTORIES = r"""
import os, sys
from pathlib import Path
import fleetstore
from fleetstore.core.ids import new_id
from fleetstore.domain.operations import Operation
from fleetstore.transfer.archive import archive_tree

os.umask(int(sys.argv[2], 8))
base = Path(sys.argv[1])
with fleetstore.open(base / "a" / "b" / "one.db", blob_threshold=64) as store:
    sid = store.sessions.create("s").id
    store.messages.append(sid, "tool", [fleetstore.ToolResult("c", "x" * 500)])  # a blob
    store.spool.append(Operation("create_session", {"id": "spooled"}, new_id()))
    store.flush()
    assert store.sessions.get("spooled").id == "spooled"
with fleetstore.open(f"sqlite+sharded://{base / 'c' / 'd' / 'st'}", blob_threshold=64) as store:
    sid = store.sessions.create("t").id
    store.messages.append(sid, "tool", [fleetstore.ToolResult("c", "y" * 500)])
    other = store.sessions.create("u").id
    archive_tree(store, other, base / "e" / "f" / "archive")
print("ok")
"""


@pytest.mark.parametrize("umask", [0o000, 0o022], ids=oct)
def test_every_directory_fleetstore_makes_is_0700_whatever_the_umask(
    tmp_path: Path, umask: int
) -> None:
    """os.makedirs(mode=0o700) gave 0700 to the last directory only: its parents, and
    a sharded store's shards/ and shards/xx/, were 0777 under umask 000."""
    base = tmp_path / "base"
    done = subprocess.run(
        [sys.executable, "-c", _MAKES_DIRECTORIES, str(base), f"{umask:o}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
    made = [base, *(p for p in base.rglob("*") if p.is_dir())]
    names = {str(p.relative_to(base)) for p in made}
    for expected in ("a", "a/b/one.db.blobs", "a/b/one.db.spool", "a/b/one.db.procs"):
        assert expected in names
    assert {"c/d/st/shards", "e/f/archive"} <= names
    assert any(n.startswith("c/d/st/shards/") for n in names)
    modes = {str(p.relative_to(base)): oct(stat.S_IMODE(p.stat().st_mode)) for p in made}
    assert set(modes.values()) == {"0o700"}, modes


def test_a_shard_file_or_a_file_stores_directory_is_not_opened_as_the_other_layout(
    tmp_path: Path,
) -> None:
    """A shard file opened as a store took writes its sharded store never showed; a
    sharded URL on a directory holding a file store made an empty sharded store beside
    it, and the writes went there."""
    url = f"sqlite+sharded://{tmp_path / 'fleet'}"
    with fleetstore.open(url) as store:
        sid = store.sessions.create("root").id
    (shard,) = (tmp_path / "fleet" / "shards").glob("*/*.db")
    before = sorted(p.name for p in shard.parent.iterdir())
    with pytest.raises(errors.ConfigError, match="a shard of the sharded store"):
        fleetstore.open(shard)
    assert sorted(p.name for p in shard.parent.iterdir()) == before
    with fleetstore.open(url) as store:
        assert [s.id for s in store.sessions.list()] == [sid]
    plain = tmp_path / "plain"
    plain.mkdir()
    fleetstore.open(plain).close()  # plain/fleetstore.db
    with pytest.raises(errors.ConfigError, match="holds a single-file store"):
        fleetstore.open(f"sqlite+sharded://{plain}")
    assert not (plain / CATALOG).exists()
