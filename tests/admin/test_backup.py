"""``fleetstore backup`` and ``fleetstore restore`` (issue 28: there was no backup, and a
copy of the ``.db`` alone loses every blob).  A fleet of writer processes keeps writing
while the backup runs; the restored store holds every write acknowledged before the
backup began, each exactly as written.  The race with blob garbage collection, the
files' modes, a destination that exists, a damaged backup, a sharded store.  Real
processes and files; the CLI in its own process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import apsw
import pytest

import fleetstore
from fleetstore import ToolResult
from fleetstore.admin import backup as backups
from fleetstore.core.validate import INT_MAX
from fleetstore.store.readonly import open_read_only
from tests.agents import script
from tests.agents.backup_agent import content_sha
from tests.fix_procs import Proc

AGENT = script("backup_agent.py")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetstore", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
    )


def contents(store: fleetstore.Store) -> dict[str, tuple[str, int | None, str]]:
    """Every message of every session: id -> (session, seq, the hash of what it holds);
    reading it reads and checks every blob."""
    found: dict[str, tuple[str, int | None, str]] = {}
    for s in store.sessions.list(include_archived=True, limit=INT_MAX):
        for m in store.messages.iterate(s.id):
            found[m.id] = (s.id, m.seq, content_sha(m))
    return found


def modes(root: Path) -> set[tuple[str, int]]:
    return {("dir" if p.is_dir() else "file", p.stat().st_mode & 0o777) for p in root.rglob("*")}


def small_store(path: Path, blobs: int = 3) -> dict[str, str]:
    ids = {}
    with fleetstore.open(path) as store:
        for i in range(blobs):
            s = store.sessions.create(title=f"s{i}")
            store.messages.append(s.id, "tool", [ToolResult("c", os.urandom(100_000), name="x")])
            ids[f"s{i}"] = s.id
    return ids


@pytest.mark.fleet
def test_a_backup_taken_while_a_fleet_writes_restores_every_acknowledged_write(
    tmp_path: Path,
) -> None:
    store = tmp_path / "fleet.db"
    fleetstore.open(store).close()
    stop = tmp_path / "stop"
    logs = [tmp_path / f"agent{i}.jsonl" for i in range(4)]
    agents = [
        Proc([sys.executable, AGENT, str(store), str(i), str(log), str(stop), "60"], f"a{i}")
        for i, log in enumerate(logs)
    ]
    maintain: subprocess.Popen[str] | None = None
    try:
        for agent in agents:
            agent.wait_line("ready", timeout=300)
        # maintain runs too: its blob step waits while the backup holds the collection lock.
        maintain = subprocess.Popen(
            [sys.executable, "-m", "fleetstore", "maintain", str(store), "--json"],
            env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        began = time.time()
        done = cli("backup", str(tmp_path / "bk"), "--store", str(store), "--json")
        ended = time.time()
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        # The fleet went on writing while the backup ran, and after it.
        writes = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
        assert any(began < w["at"] < ended for w in writes)
        while not any(json.loads(line)["at"] > ended for line in logs[0].read_text().splitlines()):
            assert agents[0].popen.poll() is None, agents[0].stderr_tail()
            time.sleep(0.05)
        stop.touch()
        for agent in agents:
            assert agent.finish(timeout=300) == 0, agent.stderr_tail()
        _, err = maintain.communicate(timeout=600)
        assert maintain.returncode == 0, err
    finally:
        stop.touch()
        for agent in agents:
            agent.kill()
        if maintain is not None and maintain.poll() is None:
            maintain.kill()

    backup = tmp_path / "bk"
    assert modes(backup) <= {("dir", 0o700), ("file", 0o600)}
    assert backup.stat().st_mode & 0o777 == 0o700
    restored = tmp_path / "restored" / "fleet.db"
    done = cli("restore", str(backup), "--store", str(restored), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["blobs"] == report["blobs"] > 10

    writes = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
    deleted = {w["sid"]: w["at"] for w in writes if w["ack"] == "delete"}
    acked = {w["mid"]: w for w in writes if w["ack"] == "message"}
    with fleetstore.open(restored) as opened:
        held = contents(opened)
    # Everything in the backup was written by the fleet, exactly as written (every
    # blob read back and hashed on the way).
    for mid, (sid, seq, sha) in held.items():
        assert mid in acked and (acked[mid]["sid"], acked[mid]["seq"], acked[mid]["sha"]) == (
            sid,
            seq,
            sha,
        )
    # Every write acknowledged before the backup began is in it, unless its session
    # was deleted before the backup began; a session deleted before then is not.
    before = [
        w for w in acked.values() if w["at"] < began and deleted.get(w["root"], ended) >= ended
    ]
    assert before and all(w["mid"] in held for w in before)
    gone = {sid for sid, at in deleted.items() if at < began}
    assert not any(acked[mid]["root"] in gone for mid in held)
    # And the live store, which the fleet kept writing, holds more.
    with open_read_only(store) as live:
        assert len(contents(live)) > len(held) or deleted


def test_blob_collection_waits_for_the_backup_and_its_blob_stays_in_it(tmp_path: Path) -> None:
    """A blob of a session deleted after the snapshot: without the collection lock,
    `fleetstore maintain` (grace 0) deleted its file before the backup copied it, and
    the backup failed (BlobCorrupt).  Now maintain's blob step waits for the backup,
    which holds the blob; then maintain deletes it from the store."""
    store = tmp_path / "s.db"
    ids = small_store(store)
    with fleetstore.open(store) as opened:
        sha = opened.read(lambda tx: tx.execute("SELECT blob_sha FROM parts"))[0][0]
        old = time.time() - 3600  # older than any grace: fair game for the collector
        for path in (tmp_path / "s.db.blobs").rglob("*"):
            if path.is_file():
                os.utime(path, (old, old))
    maintain: list[subprocess.Popen[str]] = []

    def meanwhile() -> None:
        removed = cli(
            "sessions", "rm", ids["s0"], ids["s1"], ids["s2"], "--yes", "--store", str(store)
        )
        assert removed.returncode == 0, removed.stderr
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetstore", "maintain", str(store), "--blob-grace", "0",
             "--json"],
            env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        maintain.append(proc)
        waiting_for_lock(proc)

    copied = backups.backup(str(store), tmp_path / "bk", after_snapshot=meanwhile)
    assert copied.blobs == 3
    out, err = maintain[0].communicate(timeout=300)
    assert maintain[0].returncode == 0, err
    steps = {s["name"]: s for s in json.loads(out)["steps"]}
    assert steps["blobs"]["detail"]["deleted_files"] == 3  # gone from the store now
    assert not list((tmp_path / "s.db.blobs").rglob(f"*/{sha}"))
    # ... and whole in the backup, which reads back as the store was.
    _manifest, checked = backups.verify_backup(tmp_path / "bk")
    assert checked.blobs == 3
    with open_read_only(tmp_path / "bk") as bk:
        assert {s.title for s in bk.sessions.list()} == {"s0", "s1", "s2"}
        assert len(contents(bk)) == 3


def waiting_for_lock(proc: subprocess.Popen[str], timeout: float = 300.0) -> None:
    """Until *proc* waits for a flock (a ``->`` line of /proc/locks names it), or ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if "->" in fields and "FLOCK" in fields and str(proc.pid) in fields:
                return
        time.sleep(0.02)


def test_a_backup_is_never_written_over_anything_and_leaves_nothing_on_failure(
    tmp_path: Path,
) -> None:
    store = tmp_path / "s.db"
    small_store(store)
    taken = tmp_path / "taken"
    taken.mkdir()
    done = cli("backup", str(taken), "--store", str(store))
    assert done.returncode == 2 and "exists" in done.stderr and list(taken.iterdir()) == []
    missing = cli("backup", str(tmp_path / "b"), "--store", str(tmp_path / "none.db"))
    assert missing.returncode == 2 and not (tmp_path / "none.db").exists()
    pg = cli("backup", str(tmp_path / "b"), "--store", "postgresql://u@localhost:1/db")
    assert pg.returncode == 2 and "pg_dump" in pg.stderr

    # A store whose blob file is gone: the backup says so, and leaves nothing behind.
    blob = next(
        p for p in (tmp_path / "s.db.blobs").rglob("*") if p.is_file() and len(p.name) == 64
    )
    blob.unlink()
    before = sorted(p.name for p in tmp_path.iterdir())
    done = cli("backup", str(tmp_path / "b"), "--store", str(store))
    assert done.returncode == 1 and blob.name in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_restore_checks_the_backup_first_and_never_writes_over_a_store(tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    small_store(store)
    assert cli("backup", str(tmp_path / "bk"), "--store", str(store)).returncode == 0
    assert cli("restore", str(tmp_path / "bk"), "--verify-only").returncode == 0

    done = cli("restore", str(tmp_path / "bk"), "--store", str(store))
    assert done.returncode == 2 and "never writes over a store" in done.stderr
    leftover = tmp_path / "left.db"
    Path(str(leftover) + ".blobs").mkdir()  # what is left of a store counts as one
    assert cli("restore", str(tmp_path / "bk"), "--store", str(leftover)).returncode == 2

    # Damage: a blob file's bytes, then the database file's.
    damaged = tmp_path / "damaged"
    shutil.copytree(tmp_path / "bk", damaged)
    blob = next(p for p in damaged.rglob("*") if p.is_file() and len(p.name) == 64)
    blob.write_bytes(b"\x28\xb5\x2f\xfd" + b"x" * 40)
    target = tmp_path / "out" / "r.db"
    done = cli("restore", str(damaged), "--store", str(target))
    assert done.returncode == 1 and blob.name in done.stderr, done.stderr
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
    shutil.rmtree(damaged)
    shutil.copytree(tmp_path / "bk", damaged)
    with (damaged / "fleetstore.db").open("r+b") as fh:
        fh.seek(5000)
        fh.write(b"\xde\xad" * 50)
    done = cli("restore", str(damaged), "--verify-only")
    assert done.returncode == 1 and "fleetstore.db differs" in done.stderr
    assert cli("restore", str(tmp_path / "nothing")).returncode == 2

    done = cli("restore", str(tmp_path / "bk"), "--store", str(target))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in target.parent.iterdir()) == ["r.db", "r.db.blobs"]
    assert modes(target.parent) <= {("dir", 0o700), ("file", 0o600)}
    with fleetstore.open(store) as a, fleetstore.open(target) as b:
        assert contents(a) == contents(b)


@pytest.mark.slow
def test_a_sharded_store_backs_up_and_restores_whole(tmp_path: Path) -> None:
    url = f"sqlite+sharded://{tmp_path / 'fleet'}"
    with fleetstore.open(url) as store:
        for i in range(4):
            s = store.sessions.create(title=f"tree {i}")
            sub = store.sessions.create(parent_id=s.id, title="sub")
            store.messages.append(sub.id, "tool", [ToolResult("c", os.urandom(90_000), name="x")])
        store.effects.enqueue("th", "notify", {"n": 1})
        expected = contents(store)
    assert cli("backup", str(tmp_path / "bk"), "--store", url).returncode == 0
    manifest = json.loads((tmp_path / "bk" / "backup.json").read_text())
    assert manifest["layout"] == "sharded" and manifest["files"][-1]["path"] == "catalog.db"
    assert len(manifest["files"]) == 5  # four trees' shards, then the catalog
    wrong = cli("restore", str(tmp_path / "bk"), "--store", str(tmp_path / "r.db"))
    assert wrong.returncode == 2 and "sqlite+sharded" in wrong.stderr
    target = f"sqlite+sharded://{tmp_path / 'restored'}"
    done = cli("restore", str(tmp_path / "bk"), "--store", target)
    assert done.returncode == 0, done.stderr
    with fleetstore.open(target) as store:
        assert contents(store) == expected
        assert store.effects.counts()["pending"] == 1
    doctor = cli("doctor", target, "--json", "--interval", "0")
    assert doctor.returncode == 0, doctor.stdout[-2000:]


def test_a_store_whose_rows_refer_to_missing_rows_is_not_backed_up(tmp_path: Path) -> None:
    """The copy is checked before it counts (``files.backup.check_database``:
    ``integrity_check`` and ``foreign_key_check``): a session whose parent is missing
    (written by hand, foreign keys off) is the store's own damage, named, and no
    backup is left."""
    store = tmp_path / "s.db"
    small_store(store, blobs=1)
    conn = apsw.Connection(str(store))
    try:
        conn.execute("PRAGMA foreign_keys=OFF")
        conn.execute(
            "INSERT INTO sessions(id, parent_id, root_id, created_at, updated_at) "
            "VALUES ('orphan', 'no-such-parent', 'orphan', 0, 0)"
        )
    finally:
        conn.close()
    done = cli("backup", str(tmp_path / "bk"), "--store", str(store))
    assert done.returncode == 1, done.stderr
    assert "refers to a missing row of sessions" in done.stderr, done.stderr
    assert not (tmp_path / "bk").exists()
