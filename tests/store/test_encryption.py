"""Stores encrypted at rest (issue 29): the database and its WAL under the keyring's key
(SQLite3 Multiple Ciphers, AEGIS-256), what is written beside it sealed, a wrong or
missing key a typed error that changes nothing, keys rotated, ``fleetstore rekey``
killed at each of its steps.  Real files, real processes, real ``kill -9``."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import apsw
import pytest

import fleetstore
from fleetstore import errors
from fleetstore.core import sealed
from fleetstore.core.keys import Key, Keyring, write_keyring
from fleetstore.engine import cipher

MARKER = "zebra-quartz-marker-4417"


def keyring_file(path: Path, *ids: str) -> tuple[Path, Keyring]:
    ring = Keyring(tuple(Key.generate(i) for i in ids), str(path))
    write_keyring(path, ring)
    return path, Keyring.load(path)


def snapshot(root: Path) -> dict[str, Any]:
    """Every file and directory under *root*: its bytes' hash, mode and mtime."""
    found: dict[str, Any] = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(here) / name
            st = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
            found[str(path.relative_to(root))] = (digest, st.st_mode, st.st_mtime_ns)
    return found


def key_id(path: Path) -> str:
    """The key id a sealed file names."""
    return sealed.read_header(io.BytesIO(path.read_bytes()[:512])).key_id


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}
    return {**env, **extra}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetstore", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env if env is not None else clean_env(),
        stdin=subprocess.DEVNULL,
    )


def fill(store: fleetstore.Store, n: int = 3) -> str:
    sid = store.sessions.create(title="t").id
    for i in range(n):
        store.messages.append(sid, "user", f"{MARKER} message {i}")
    store.state.put(sid, "k", {"v": MARKER})
    store.effects.enqueue(sid, "kind", {"p": MARKER})
    return sid


def url_of(tmp_path: Path, layout: str) -> str:
    return str(tmp_path / "s.db") if layout == "file" else f"sqlite+sharded://{tmp_path / 'sh'}"


# -- a wrong key, or none, destroys nothing ---------------------------------------------------


@pytest.mark.parametrize("layout", ["file", "sharded"])
def test_a_wrong_or_missing_key_is_a_typed_error_that_changes_no_file(
    tmp_path: Path, layout: str
) -> None:
    keys, _ = keyring_file(tmp_path / "keys", "k1")
    wrong, _ = keyring_file(tmp_path / "wrong", "k9")
    url = url_of(tmp_path, layout)
    with fleetstore.open(url, encryption_key_file=str(keys)) as store:
        fill(store)
    before = snapshot(tmp_path)
    with pytest.raises(errors.KeyMissing, match="encryption_key_file"):
        fleetstore.open(url)
    with pytest.raises(errors.WrongKey, match="k9"):
        fleetstore.open(url, encryption_key_file=str(wrong))
    assert snapshot(tmp_path) == before
    with fleetstore.open(url, encryption_key_file=str(keys)) as store:
        assert store.sessions.list()[0].title == "t"


def test_a_store_left_by_kill_9_keeps_its_wal_and_shm_untouched_by_a_wrong_key(
    tmp_path: Path,
) -> None:
    """A connection given a wrong key on a WAL file would recover its -shm (writing it)
    before its first read failed: the key is tried on a copy of page 1 instead."""
    keys, _ = keyring_file(tmp_path / "keys", "k1")
    wrong, _ = keyring_file(tmp_path / "wrong", "k9")
    path = tmp_path / "s.db"
    code = textwrap.dedent(
        f"""
        import os, fleetstore
        s = fleetstore.open({str(path)!r}, encryption_key_file={str(keys)!r},
                            checkpoint_bytes=1 << 30)
        sid = s.sessions.create().id
        for i in range(50):
            s.messages.append(sid, "user", "x" * 500)
        print("written", flush=True)
        os.kill(os.getpid(), 9)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL and "written" in done.stdout, done.stderr
    assert (tmp_path / "s.db-wal").stat().st_size > 0 and (tmp_path / "s.db-shm").exists()
    before = snapshot(tmp_path)
    for settings in ({}, {"encryption_key_file": str(wrong)}):
        with pytest.raises((errors.KeyMissing, errors.WrongKey)):
            fleetstore.open(path, **settings)
    assert snapshot(tmp_path) == before
    with fleetstore.open(path, encryption_key_file=str(keys)) as store:
        (session,) = store.sessions.list()
        assert len(store.messages.list(session.id)) == 50


def test_a_key_for_a_plain_store_is_a_typed_error_that_changes_no_file(tmp_path: Path) -> None:
    keys, _ = keyring_file(tmp_path / "keys", "k1")
    with fleetstore.open(tmp_path / "s.db") as store:
        fill(store)
    before = snapshot(tmp_path)
    with pytest.raises(errors.NotEncrypted, match="rekey"):
        fleetstore.open(tmp_path / "s.db", encryption_key_file=str(keys))
    assert snapshot(tmp_path) == before


def test_a_key_file_others_can_read_opens_nothing(tmp_path: Path) -> None:
    keys, _ = keyring_file(tmp_path / "keys", "k1")
    keys.chmod(0o644)
    with pytest.raises(errors.UnsafeKeyFile):
        fleetstore.open(tmp_path / "s.db", encryption_key_file=str(keys))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keys"]


# -- what is encrypted ------------------------------------------------------------------------


def test_the_database_and_its_wal_hold_no_plaintext_and_open_with_the_key_only(
    tmp_path: Path,
) -> None:
    keys, ring = keyring_file(tmp_path / "keys", "k1")
    path = tmp_path / "s.db"
    # No checkpoint: the rows stay in the WAL, which must be encrypted too.
    with fleetstore.open(path, encryption_key_file=str(keys), checkpoint_bytes=1 << 30) as store:
        fill(store, 20)
        wal = (tmp_path / "s.db-wal").read_bytes()
        assert len(wal) > 4096 and MARKER.encode() not in wal
        assert MARKER.encode() not in path.read_bytes()
        assert not path.read_bytes().startswith(b"SQLite format 3")
    # The plain driver sees no database; the key opens it.
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    with pytest.raises(apsw.NotADBError):
        conn.execute("SELECT count(*) FROM sessions").fetchall()
    conn.close()
    keyed = cipher.connect(str(path), apsw.SQLITE_OPEN_READONLY, ring.current.secret)
    assert keyed.execute("SELECT count(*) FROM messages").fetchall() == [(20,)]
    keyed.close()


def test_blobs_and_spool_journals_are_sealed_and_read_back(tmp_path: Path) -> None:
    keys, _ = keyring_file(tmp_path / "keys", "k1")
    path = tmp_path / "s.db"
    big = (MARKER + " ") * 2000
    with fleetstore.open(path, encryption_key_file=str(keys), blob_threshold=1024) as store:
        sid = store.sessions.create().id
        m = store.messages.append(sid, "tool", big)
        assert store.messages.get(m.id).text == big
        store.spool.append(store_op(store, sid))
        blob_files = [p for p in (tmp_path / "s.db.blobs").rglob("*") if p.is_file()]
        blobs = [p for p in blob_files if not p.name.startswith(".")]
        assert blobs and all(sealed.is_sealed(p.read_bytes()) for p in blobs)
        assert all(key_id(p) == "k1" for p in blobs)
        (journal,) = (tmp_path / "s.db.spool").glob("*.jsonl")
        data = journal.read_bytes()
        assert MARKER.encode() not in data and b" !" in data
        assert store.flush(30)
    with fleetstore.open(path, encryption_key_file=str(keys)) as store:
        texts = [x.text for x in store.messages.list(sid)]
        assert texts == [big, f"{MARKER} spooled"]


def store_op(store: fleetstore.Store, sid: str) -> Any:
    """An append_message operation as the API makes it (for the spool)."""
    from fleetstore.core.ids import new_id
    from fleetstore.domain.operations import Operation

    args = {
        "session_id": sid,
        "id": new_id(),
        "role": "user",
        "parts": [
            {
                "kind": "text",
                "meta": {},
                "enc": "str",
                "body": f"{MARKER} spooled",
                "size": len(MARKER) + 8,
            }
        ],
    }
    return Operation("append_message", args, new_id())


def test_an_old_key_kept_in_the_ring_still_reads_what_it_sealed(tmp_path: Path) -> None:
    keys, ring = keyring_file(tmp_path / "keys", "k1")
    path = tmp_path / "s.db"
    big1, big2 = "a" * 5000, "b" * 5000
    with fleetstore.open(path, encryption_key_file=str(keys), blob_threshold=1024) as store:
        sid = store.sessions.create().id
        store.messages.append(sid, "user", big1)
    write_keyring(keys, ring.rotated(Key.generate("k2")))
    with fleetstore.open(path, encryption_key_file=str(keys), blob_threshold=1024) as store:
        store.messages.append(sid, "user", big2)  # sealed under k2, the current key
        assert [m.text for m in store.messages.list(sid)] == [big1, big2]
    ids = sorted(
        key_id(p)
        for p in (tmp_path / "s.db.blobs").rglob("*")
        if p.is_file() and not p.name.startswith(".")
    )
    assert ids == ["k1", "k2"]


# -- fleetstore rekey -------------------------------------------------------------------------


def _key_of(path: Path, ring: Keyring) -> str | None:
    """Which single key of *ring* opens the database *path* (each tried alone)."""
    opens = [k.id for k in ring if _opens(path, k)]
    assert len(opens) <= 1, opens
    return opens[0] if opens else None


def _opens(path: Path, key: Key) -> bool:
    try:
        return cipher.key_of_file(str(path), Keyring((key,))) is not None
    except (errors.WrongKey, errors.NotEncrypted):
        return False


def test_rekey_rotates_the_database_and_reseals_blobs_and_journals(tmp_path: Path) -> None:
    keys, _ = keyring_file(tmp_path / "keys", "k1")
    path = tmp_path / "s.db"
    with fleetstore.open(path, encryption_key_file=str(keys), blob_threshold=1024) as store:
        sid = store.sessions.create().id
        store.messages.append(sid, "user", "c" * 5000)
    done = cli("--key-file", str(keys), "rekey", "--new-key", "k2", "--store", str(path), "--json")
    assert done.returncode == 0, done.stderr
    ring = Keyring.load(keys)
    assert [k.id for k in ring] == ["k2", "k1"]
    assert _key_of(path, ring) == "k2"
    blobs = [p for p in (tmp_path / "s.db.blobs").rglob("*") if p.is_file() and p.name[0] != "."]
    assert {key_id(p) for p in blobs} == {"k2"}
    # k1 encrypts nothing now: dropped, the store still opens.
    write_keyring(keys, ring.without("k1"))
    with fleetstore.open(path, encryption_key_file=str(keys)) as store:
        assert store.messages.list(sid)[0].text == "c" * 5000
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_rekey_leaves_a_torn_last_line_of_a_dead_journal_as_a_replay_would(
    tmp_path: Path,
) -> None:
    """A dead process's journal whose last append was cut short: rekey raised a raw
    binascii.Error after it had rekeyed the database, and every run after did too.
    The whole lines are resealed; the torn one is left, and ignored by the replay."""
    import os

    keys, _ = keyring_file(tmp_path / "keys", "k1")
    path = tmp_path / "s.db"
    spool = tmp_path / "s.db.spool"
    with fleetstore.open(path, encryption_key_file=str(keys)) as store:
        sid = store.sessions.create().id
        store.spool.append(store_op(store, sid))
        (live,) = spool.glob("*.jsonl")
        line = live.read_bytes()
        dead = spool / f"999999-{os.urandom(6).hex()}.jsonl"  # (no such process)
        dead.write_bytes(line + line[:60])  # a whole line, then a torn append
        store.flush(30)
    done = cli("--key-file", str(keys), "rekey", "--new-key", "k2", "--store", str(path))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    resealed = dead.read_bytes()
    assert resealed.endswith(b"\n" + line[:60]) and not resealed.startswith(line)
    write_keyring(keys, Keyring.load(keys).without("k1"))  # k2 alone reads the rest
    with fleetstore.open(path, encryption_key_file=str(keys)) as store:
        assert [m.text for m in store.messages.list(sid)] == [f"{MARKER} spooled"]
    assert not dead.exists()  # replayed (a duplicate of the live one's), the torn tail ignored


def test_rekey_encrypts_a_plain_store_and_decrypts_it_back(tmp_path: Path) -> None:
    keys, _ = keyring_file(tmp_path / "keys", "k1")
    path = tmp_path / "s.db"
    with fleetstore.open(path, blob_threshold=1024) as store:
        sid = fill(store)
        store.messages.append(sid, "user", MARKER * 200)
    done = cli("--key-file", str(keys), "rekey", "--store", str(path))
    assert done.returncode == 0, done.stderr
    assert not any(
        MARKER.encode() in p.read_bytes() for p in tmp_path.rglob("s.db*") if p.is_file()
    )
    with pytest.raises(errors.KeyMissing):
        fleetstore.open(path)
    done = cli("--key-file", str(keys), "rekey", "--decrypt", "--store", str(path))
    assert done.returncode == 0, done.stderr
    with fleetstore.open(path) as store:
        assert len(store.messages.list(sid)) == 4


def test_rekey_refuses_a_store_another_process_has_open(tmp_path: Path) -> None:
    keys, _ = keyring_file(tmp_path / "keys", "k1")
    path = tmp_path / "s.db"
    with fleetstore.open(path, encryption_key_file=str(keys)) as store:
        fill(store)
        store.sessions.list()  # its connections are open
        before = hashlib.sha256(path.read_bytes()).hexdigest()
        done = cli("--key-file", str(keys), "rekey", "--new-key", "k2", "--store", str(path))
        assert done.returncode == 1 and "in use by process" in done.stderr, done.stderr
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before


REKEY_POINTS = ["copied", "renamed"]


@pytest.mark.parametrize("point", REKEY_POINTS)
@pytest.mark.parametrize("layout", ["file", "sharded"])
def test_rekey_killed_at_a_step_leaves_a_store_that_opens_with_every_write(
    tmp_path: Path, point: str, layout: str
) -> None:
    keys, _ = keyring_file(tmp_path / "keys", "k1")
    url = url_of(tmp_path, layout)
    with fleetstore.open(url, encryption_key_file=str(keys)) as store:
        sid = fill(store, 40)
    env = clean_env(FLEETSTORE_TEST_CRASH=f"rekey-{point}")
    done = cli("--key-file", str(keys), "rekey", "--new-key", "k2", "--store", url, env=env)
    assert done.returncode == -signal.SIGKILL, done.stderr
    ring = Keyring.load(keys)
    assert [k.id for k in ring] == ["k2", "k1"]  # the new key is written before anything
    files = [tmp_path / "s.db"] if layout == "file" else list((tmp_path / "sh").rglob("*.db"))
    for f in files:
        assert _key_of(f, ring) in ("k1", "k2"), f  # never neither
    with fleetstore.open(url, encryption_key_file=str(keys)) as store:
        assert len(store.messages.list(sid)) == 40
    done = cli("--key-file", str(keys), "rekey", "--store", url, "--json")
    assert done.returncode == 0, done.stderr
    for f in files:
        assert _key_of(f, ring) == "k2"
    assert not list(tmp_path.rglob("*.rekey.tmp"))
    with fleetstore.open(url, encryption_key_file=str(keys)) as store:
        assert len(store.messages.list(sid)) == 40


@pytest.mark.slow
def test_rekey_killed_at_random_moments_never_leaves_a_file_neither_key_opens(
    tmp_path: Path,
) -> None:
    """A store of some megabytes, rekeyed and killed after a random delay, again and
    again: every time each file opens with exactly one of the two keys, every message
    written before is there, and a last run finishes the rotation."""
    import random

    keys, _ = keyring_file(tmp_path / "keys", "k1")
    path = tmp_path / "s.db"
    with fleetstore.open(path, encryption_key_file=str(keys)) as store:
        sid = store.sessions.create().id
        for i in range(1500):
            store.messages.append(sid, "user", f"{i} " + "y" * 20_000)
    write_keyring(keys, Keyring.load(keys).rotated(Key.generate("k2")))
    ring = Keyring.load(keys)
    rng = random.Random(29)
    seen = set()
    for _ in range(8):
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetstore", "--key-file", str(keys), "rekey", "--store", path],
            env=clean_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.05, 0.8))
        proc.kill()
        proc.wait()
        seen.add(_key_of(path, ring))
        assert _key_of(path, ring) in ("k1", "k2")
        if _key_of(path, ring) == "k2":  # done: start again from k1
            write_keyring(keys, Keyring((ring.get("k1"), ring.get("k2")), str(keys)))
            assert cli("--key-file", str(keys), "rekey", "--store", str(path)).returncode == 0
            write_keyring(keys, ring)
        with fleetstore.open(path, encryption_key_file=str(keys)) as store:
            count = store.read(lambda tx: tx.execute("SELECT count(*) FROM messages"))
            assert count == [(1500,)]
            assert store.messages.list(sid, last=1)[0].text.startswith("1499 ")
    assert "k1" in seen  # (some kills came before the rename)
    assert cli("--key-file", str(keys), "rekey", "--store", str(path)).returncode == 0
    assert _key_of(path, ring) == "k2"


# -- every tool, given the key, and said clearly without it ------------------------------------

TOOLS: dict[str, list[str]] = {
    "doctor": ["doctor", "--store", "{db}", "--json"],
    "maintain": ["maintain", "--store", "{db}", "--json"],
    "export": ["export", "--store", "{db}", "-o", "{tmp}/e.fsx"],
    "migrate": ["migrate", "{db}", "{tmp}/m.db", "--json"],
    "reshard": ["reshard", "{db}", "{tmp}/sh", "--json"],
    "stats": ["stats", "--store", "{db}", "--json"],
}


@pytest.mark.parametrize("tool", list(TOOLS))
def test_every_tool_works_on_an_encrypted_store_with_its_key_and_says_so_without(
    tmp_path: Path, tool: str
) -> None:
    keys, _ = keyring_file(tmp_path / "keys", "k1")
    db = tmp_path / "s.db"
    with fleetstore.open(db, encryption_key_file=str(keys)) as store:
        fill(store, 5)
    args = [a.format(db=db, tmp=tmp_path) for a in TOOLS[tool]]
    without = cli(*args)
    assert without.returncode != 0 or "key" in (without.stdout + without.stderr).lower(), without
    assert "Traceback" not in without.stderr
    done = cli("--key-file", str(keys), *args)
    assert done.returncode == 0, done.stderr
    made = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".db", ".fsx")]
    for p in made:  # what a tool wrote is under the key too
        assert MARKER.encode() not in p.read_bytes(), p
