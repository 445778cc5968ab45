"""What ``fleetstore.open`` refuses before it creates or uses anything: an empty path
in a URL, and sidecars (blob directory, spool journals, gate) that someone other than
the store's owner planted or can write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fleetstore
from fleetstore import errors
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


def test_sidecars_of_our_own_are_fine(tmp_path: Path) -> None:
    path, sid = a_store(tmp_path)
    with fleetstore.open(path) as store:
        assert store.messages.list(sid)[0].parts[0].output == "x" * 5000
