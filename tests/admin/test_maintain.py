"""``fleetstore maintain``: retention (archive then import restores exactly), dry runs that
change nothing, blob garbage collection and its race with writers, applied_ops pruning
that respects spool journals, foreign databases, and maintenance while 16 agent
processes write.  Real processes, real files; the database is never mocked.

Outside processes that open a database with raw apsw are separate children (DESIGN.md,
"Two SQLite libraries in one process").
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore.admin.maintain.blobs import _retire
from fleetstore.admin.maintain.config import Config
from fleetstore.admin.maintain.report import Step, format_report
from fleetstore.admin.maintain.retention import delete_tree
from fleetstore.admin.maintain.run import maintain
from fleetstore.admin.maintain.writer import Writer
from fleetstore.core.ids import new_id
from fleetstore.domain import registry
from fleetstore.domain.blobs import BlobStore
from fleetstore.domain.operations import Operation
from fleetstore.store.spool import encode_line
from fleetstore.transfer.digest import session_digest
from tests.agents import script

DAY = 86400.0
AGENT = script("maintain_agent.py")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``fleetstore ARGS`` through the installed console script."""
    script = Path(sys.executable).with_name("fleetstore")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "fleetstore"]
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=timeout, env=clean_env()
    )


def backdate(store: fleetstore.Store, session_ids: list[str], days: float) -> None:
    """Make sessions (and their state) look last written *days* ago."""
    ago = days * DAY
    with store.db.write() as tx:
        for sid in session_ids:
            tx.execute(
                "UPDATE sessions SET created_at = created_at - ?, updated_at = updated_at - ? "
                "WHERE id = ?",
                (ago, ago, sid),
            )
            tx.execute(
                "UPDATE state SET updated_at = updated_at - ? WHERE session_id = ?", (ago, sid)
            )


def make_tree(store: fleetstore.Store, rng: random.Random, big: bool = True) -> list[str]:
    """A session with a subagent, whole and streamed messages, a blob, usage and state."""
    s = store.sessions.create(title=f"t{rng.random():.6f}", project="/src/app", metadata={"k": 1})
    store.messages.append(s.id, role="user", parts=[fleetstore.Text("why does it flake?")])
    with store.messages.stream(s.id, role="assistant", model="m-1") as reply:
        reply.reasoning("thinking ")
        reply.text("Let me run it. ")
        call = reply.tool_call("bash", {"cmd": "pytest -x"})
        if big:
            call.result(rng.randbytes(150_000))
        else:
            call.result("ok")
        reply.usage(input_tokens=1200, output_tokens=310)
    sub = store.sessions.create(title="subagent", parent_id=s.id)
    store.messages.append(sub.id, role="user", parts=[fleetstore.Text("sub task")])
    store.state.put(s.id, "plan", {"step": rng.randint(1, 9)})
    store.state.put(sub.id, "blob", rng.randbytes(80_000))
    return [s.id, sub.id]


def age_ops(store: fleetstore.Store, seconds: float, where: str = "1") -> None:
    """Make applied_ops rows look applied *seconds* earlier, with the ids (UUIDv7, whose
    first 48 bits are the creation time in ms) that operations made then would have."""
    with store.db.write() as tx:
        tx.execute(
            "UPDATE applied_ops SET applied_at = applied_at - :s, op_id = "
            "printf('%08x-%04x', CAST((applied_at - :s) * 1000 AS INTEGER) >> 16, "
            "CAST((applied_at - :s) * 1000 AS INTEGER) & 65535) || substr(op_id, 14) "
            f"WHERE {where}",
            {"s": seconds},
        )


def contents(store: fleetstore.Store, sid: str) -> Any:
    """A session's whole content as plain values (row, messages with parts, state)."""
    session = store.sessions.get(sid)
    messages = [
        (m.id, m.seq, m.role, str(m.status), m.model, m.parts, m.usage)
        for m in store.messages.list(sid, limit=10_000)
    ]
    state = [store.state.get(sid, k) for k in store.state.keys(sid)]
    return session, messages, state, session_digest(store, sid)


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def blob_files(store_path: Path) -> set[str]:
    root = Path(str(store_path) + ".blobs")
    return {p.name for p in root.rglob("*") if p.is_file()} if root.exists() else set()


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "fleet.db"


# --- retention ----------------------------------------------------------------------------------


def test_archive_then_import_restores_the_sessions_exactly(
    store_path: Path, tmp_path: Path
) -> None:
    rng = random.Random(1)
    with fleetstore.open(store_path) as store:
        old = [make_tree(store, rng) for _ in range(4)]
        new = [make_tree(store, rng, big=False) for _ in range(2)]
        backdate(store, [sid for tree in old for sid in tree], 40)
        before = {sid: contents(store, sid) for tree in old + new for sid in tree}
    archive = tmp_path / "old.jsonl.zst"

    done = cli("maintain", str(store_path), "--archive-older-than", "30d", str(archive), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    step = next(s for s in report["steps"] if s["name"] == "archive")
    assert step["detail"]["trees"] == 4 and step["detail"]["sessions"] == 8
    assert step["detail"]["verified"] is True
    with fleetstore.open(store_path) as store:
        for tree in old:
            for sid in tree:
                with pytest.raises(fleetstore.NotFound):
                    store.sessions.get(sid)
        for tree in new:
            for sid in tree:
                assert contents(store, sid) == before[sid]

    done = cli("import", str(archive), "--store", str(store_path))
    assert done.returncode == 0, done.stderr
    with fleetstore.open(store_path) as store:
        for sid, content in before.items():
            assert contents(store, sid) == content, sid
            for m in store.messages.list(sid, limit=10_000):
                for part in m.parts:
                    if isinstance(part, fleetstore.ToolResult) and isinstance(part.output, bytes):
                        assert len(part.output) == 150_000  # the blob came back, and verifies


def test_an_existing_archive_file_is_never_overwritten(store_path: Path, tmp_path: Path) -> None:
    with fleetstore.open(store_path) as store:
        tree = make_tree(store, random.Random(2), big=False)
        backdate(store, tree, 40)
    archive = tmp_path / "kept.zst"
    archive.write_bytes(b"an earlier archive")
    done = cli("maintain", str(store_path), "--archive-older-than", "30d", str(archive))
    assert done.returncode == 2
    assert "never overwritten" in done.stderr
    assert archive.read_bytes() == b"an earlier archive"
    with fleetstore.open(store_path) as store:
        assert store.sessions.get(tree[0]).id == tree[0]


def test_delete_older_than_needs_yes_and_deletes_only_old_trees(store_path: Path) -> None:
    rng = random.Random(3)
    with fleetstore.open(store_path) as store:
        old = make_tree(store, rng)
        young = make_tree(store, rng)
        backdate(store, old, 10)
    digest = file_digest(store_path)
    done = cli("maintain", str(store_path), "--delete-older-than", "7d")
    assert done.returncode == 2
    assert "--yes" in done.stderr
    assert file_digest(store_path) == digest

    done = cli("maintain", str(store_path), "--delete-older-than", "7d", "--yes")
    assert done.returncode == 0, done.stderr
    with fleetstore.open(store_path) as store:
        for sid in old:
            with pytest.raises(fleetstore.NotFound):
                store.sessions.get(sid)
        assert [s.id for s in store.sessions.list(include_archived=True)] == sorted(
            young, reverse=True
        )


def test_a_tree_written_to_after_selection_is_not_deleted(store_path: Path) -> None:
    """The delete re-checks, in its transaction, that the tree is still old."""
    rng = random.Random(4)
    with fleetstore.open(store_path) as store:
        tree = make_tree(store, rng)
        backdate(store, tree, 10)
        step = Step("delete")
        writer = Writer(store.db)
        cutoff = time.time() - 7 * DAY
        store.messages.append(tree[1], role="user", parts=[fleetstore.Text("back again")])
        result = delete_tree(writer, step, tree[0], written_before=cutoff)
        assert result.outcome == "written"
        assert (result.messages, result.sessions) == (0, 0)
        assert len(store.messages.list(tree[0])) == 2


def test_a_long_session_is_deleted_in_short_transactions(store_path: Path) -> None:
    with fleetstore.open(store_path) as store:
        s = store.sessions.create(title="long")
        q = store.queries
        with store.db.write() as tx:
            for i in range(5000):
                op = Operation(
                    "append_message",
                    {
                        "id": new_id(),
                        "session_id": s.id,
                        "role": "user",
                        "parts": [{"kind": "text", "enc": "str", "body": f"message {i} " * 8}],
                    },
                    new_id(),
                )
                registry.apply(tx, q, op, time.time())
        step = Step("rm")
        result = delete_tree(Writer(store.db), step, s.id)
        assert (result.messages, result.sessions, result.outcome) == (5000, 1, "deleted")
        assert step.transactions > 1  # batched, not one transaction
        with pytest.raises(fleetstore.NotFound):
            store.sessions.get(s.id)
        assert store.read(lambda tx: tx.execute("SELECT count(*) FROM parts"))[0][0] == 0


# --- dry run ------------------------------------------------------------------------------------


def test_dry_run_changes_nothing(store_path: Path, tmp_path: Path) -> None:
    rng = random.Random(5)
    with fleetstore.open(store_path) as store:
        trees = [make_tree(store, rng) for _ in range(3)]
        backdate(store, [sid for t in trees for sid in t], 40)
        store.sessions.delete(trees[0][0])  # garbage blobs
        orphan = store.blobs.put(rng.randbytes(70_000))  # a file with no row
        old = time.time() - 3600
        os.utime(store.blobs.path(orphan.sha256), (old, old))
        age_ops(store, 60 * DAY)
    archive = tmp_path / "would.zst"
    digest, files = file_digest(store_path), blob_files(store_path)
    done = cli(
        "maintain",
        str(store_path),
        "--dry-run",
        "--archive-older-than",
        "30d",
        str(archive),
        "--delete-older-than",
        "1d",
        "--ops-older-than",
        "1h",
        "--blob-grace",
        "60",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["dry_run"] is True
    statuses = {s["name"]: s["status"] for s in report["steps"]}
    assert statuses["archive"] == "dry-run" and statuses["delete"] == "dry-run"
    assert statuses["ops"] == "dry-run" and statuses["blobs"] == "dry-run"
    assert all(s["transactions"] == 0 for s in report["steps"])
    assert file_digest(store_path) == digest
    assert blob_files(store_path) == files
    assert not archive.exists()


# --- blob garbage collection --------------------------------------------------------------------


def age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_blob_gc_deletes_garbage_and_keeps_referenced_young_and_spooled_blobs(
    store_path: Path,
) -> None:
    rng = random.Random(6)
    with fleetstore.open(store_path) as store:
        kept_tree = make_tree(store, rng)
        gone_tree = make_tree(store, rng)
        referenced = {
            r[0]
            for r in store.read(
                lambda tx: tx.execute(
                    "SELECT blob_sha FROM parts WHERE blob_sha IS NOT NULL AND session_id IN (?, ?)"
                    " UNION SELECT blob_sha FROM state WHERE blob_sha IS NOT NULL AND "
                    "session_id IN (?, ?)",
                    (*kept_tree, *kept_tree),
                )
            )
        }
        garbage = {
            r[0]
            for r in store.read(
                lambda tx: tx.execute(
                    "SELECT blob_sha FROM parts WHERE blob_sha IS NOT NULL AND session_id IN (?, ?)"
                    " UNION SELECT blob_sha FROM state WHERE blob_sha IS NOT NULL AND "
                    "session_id IN (?, ?)",
                    (*gone_tree, *gone_tree),
                )
            )
        }
        assert referenced and garbage and not referenced & garbage
        store.sessions.delete(gone_tree[0])
        orphan = store.blobs.put(rng.randbytes(90_000)).sha256  # crash leftover: no row
        young = store.blobs.put(rng.randbytes(90_000)).sha256  # a writer about to commit
        spooled = store.blobs.put(rng.randbytes(90_000)).sha256  # in a live process's journal
        tmp = store.blobs.path(orphan).with_name(f".{orphan}.999999.0123abcd.tmp")
        tmp.write_bytes(b"half")
        for sha in [*referenced, *garbage, orphan, spooled]:
            age(store.blobs.path(sha), 2 * 3600)
        age(tmp, 2 * 3600)
        spool_dir = Path(str(store_path) + ".spool")
    spool_dir.mkdir(mode=0o700)
    journal = spool_dir / f"{os.getpid()}-{os.urandom(6).hex()}.jsonl"
    op = Operation(
        "put_state",
        {
            "session_id": kept_tree[0],
            "namespace": "default",
            "key": "later",
            "value": {
                "enc": "bytes",
                "blob": {"sha256": spooled, "size": 90_000, "stored_size": 90_000},
            },
        },
        new_id(),
    )
    fd = os.open(journal, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, encode_line(op))
        fcntl.flock(fd, fcntl.LOCK_EX)  # a live process's journal: recover leaves it alone
        done = cli("maintain", str(store_path), "--blob-grace", "1h", "--json")
        assert done.returncode == 0, done.stderr
        step = next(s for s in json.loads(done.stdout)["steps"] if s["name"] == "blobs")
    finally:
        os.close(fd)
    files = blob_files(store_path)
    assert referenced <= files
    assert not garbage & files
    assert orphan not in files
    assert young in files
    assert spooled in files
    assert not tmp.exists()
    assert step["detail"]["deleted_rows"] == len(garbage)
    with fleetstore.open(store_path, on_busy="raise") as store:
        rows = {r[0] for r in store.read(lambda tx: tx.execute("SELECT sha256 FROM blobs"))}
        assert referenced <= rows and not garbage & rows
        for sid in kept_tree:
            for m in store.messages.list(sid):
                assert m.parts  # every part, blobs included, reads and verifies
        assert store.state.get(kept_tree[1], "blob") is not None


def test_put_touches_a_reused_blob_file(tmp_path: Path) -> None:
    """The writer half of the GC race: reusing a file makes it young again."""
    blobs = BlobStore(tmp_path / "b.blobs", 1 << 30)
    data = os.urandom(100_000)
    ref = blobs.put(data)
    mtime = blobs.path(ref.sha256).stat().st_mtime_ns
    assert blobs.put(data) == ref
    assert blobs.path(ref.sha256).stat().st_mtime_ns == mtime  # young: left alone
    age(blobs.path(ref.sha256), 3 * 3600)
    before = time.time()
    assert blobs.put(data) == ref
    assert blobs.path(ref.sha256).stat().st_mtime >= before - 1


def test_a_file_touched_while_the_collector_looks_is_put_back(tmp_path: Path) -> None:
    """The collector half: a file renamed aside that turns out young goes back; one
    left aside by a collector killed mid-way is put back if still wanted."""
    blobs = BlobStore(tmp_path / "b.blobs", 1 << 30)
    ref = blobs.put(os.urandom(100_000))
    path = blobs.path(ref.sha256)
    threshold = time.time() - 60
    assert not _retire(path, ref.sha256, threshold)  # young: not even renamed
    assert path.exists()
    age(path, 3600)
    assert _retire(path, ref.sha256, threshold)
    assert not path.exists()


def test_collector_killed_mid_way_leaves_nothing_wanted_deleted(store_path: Path) -> None:
    with fleetstore.open(store_path) as store:
        tree = make_tree(store, random.Random(7))
        sha = store.read(
            lambda tx: tx.execute("SELECT blob_sha FROM parts WHERE blob_sha IS NOT NULL")
        )[0][0]
        path = store.blobs.path(sha)
        trash = path.with_name(f".{sha}.gc-12345")
        os.rename(path, trash)  # as a collector killed between rename and unlink leaves it
        age(trash, 3600)
    done = cli("maintain", str(store_path), "--json")
    assert done.returncode == 0, done.stderr
    assert path.exists() and not trash.exists()
    with fleetstore.open(store_path) as store:
        assert all(m.parts for m in store.messages.list(tree[0]))


@pytest.mark.slow
def test_blob_gc_racing_a_writer_that_reuses_the_same_payload(store_path: Path) -> None:
    """A writer keeps storing one payload (reusing its file), referring to it, then
    deleting the reference, with pauses that let the file age past the grace; a
    collector with a 1 s grace runs over and over.  Every reference a writer made
    must read back (its blob file verifies)."""
    writer = subprocess.Popen(
        [sys.executable, "-c", RACE_WRITER, str(store_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
        runs = collected = 0
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:
            report = maintain(
                Config(str(store_path), blob_grace=1.0, settings={"write_budget": 0.25})
            )
            assert report.ok, format_report(report)
            step = next(s for s in report.steps if s.name == "blobs")
            collected += step.detail.get("deleted_files", 0)
            runs += 1
        out, err = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.communicate()
    assert writer.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["bad_reads"] == [], result
    assert result["references"] > 10
    assert collected > 0, "the collector never found the payload old enough: no race exercised"
    print(f"\nblob GC race: {runs} collections, {collected} files collected, {result}")


RACE_WRITER = r"""
import json, os, random, sys, time
import fleetstore
import fleetstore.domain.blobs
fleetstore.domain.blobs.TOUCH_AFTER = 0.0  # every reuse touches: the 1 s grace of the test holds
store = fleetstore.open(sys.argv[1], write_budget=0.25, on_busy="raise")
rng = random.Random(8)
payload = rng.randbytes(100_000)
print("ready", flush=True)
references = 0
bad = []
end = time.monotonic() + 11
while time.monotonic() < end:
    s = store.sessions.create(title="race")
    store.messages.append(s.id, role="tool", parts=[fleetstore.ToolResult("c", payload)])
    references += 1
    try:
        parts = store.messages.list(s.id)[0].parts
        if parts[0].output != payload:
            bad.append("different bytes")
    except fleetstore.FleetstoreError as exc:
        bad.append(f"{type(exc).__name__}: {exc}")
    store.sessions.delete(s.id)
    time.sleep(rng.choice([0.0, 0.0, 0.3, 1.2, 1.6]))
store.close()
print(json.dumps({"references": references, "bad_reads": bad}))
"""


# --- applied_ops --------------------------------------------------------------------------------


def test_applied_ops_are_pruned_but_never_past_a_journal_operation(store_path: Path) -> None:
    with fleetstore.open(store_path) as store:
        make_tree(store, random.Random(9), big=False)
        total = store.read(lambda tx: tx.execute("SELECT count(*) FROM applied_ops"))[0][0]
        age_ops(store, 3 * DAY)
        with store.db.write() as tx:
            # Operations made 3 days ago too, but applied 2 days ago (after the creation
            # of the journal's operation): they must stay.
            tx.execute(
                "INSERT INTO applied_ops (op_id, name, session_id, applied_at) "
                "SELECT op_id || 'x', name, session_id, applied_at + ? FROM applied_ops",
                (DAY,),
            )
    spool_dir = Path(str(store_path) + ".spool")
    spool_dir.mkdir(mode=0o700)
    journal = spool_dir / f"{os.getpid()}-{os.urandom(6).hex()}.jsonl"
    # An operation created 2.5 days ago, still waiting in a live process's journal.
    ms = int((time.time() - 2.5 * DAY) * 1000)
    old_id = f"{ms >> 16:08x}-{ms & 0xFFFF:04x}-7000-8000-000000000000"
    op = Operation("delete_state", {"session_id": "x", "namespace": "n", "key": "k"}, old_id)
    fd = os.open(journal, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, encode_line(op))
        fcntl.flock(fd, fcntl.LOCK_EX)
        done = cli("maintain", str(store_path), "--ops-older-than", "1d", "--json")
        assert done.returncode == 0, done.stderr
    finally:
        os.close(fd)
    step = next(s for s in json.loads(done.stdout)["steps"] if s["name"] == "ops")
    assert step["detail"]["lowered_to_journal"] is True
    with fleetstore.open(store_path) as store:
        left = store.read(lambda tx: tx.execute("SELECT count(*) FROM applied_ops"))[0][0]
    # The 3-day-old rows go; those applied 2 days ago (after the journal's op) stay.
    assert step["detail"]["pruned"] == total
    assert left == total

    done = cli("maintain", str(store_path), "--ops-older-than", "1d", "--json")  # journal gone
    assert done.returncode == 0, done.stderr
    with fleetstore.open(store_path) as store:
        assert store.read(lambda tx: tx.execute("SELECT count(*) FROM applied_ops"))[0][0] == 0


def test_ops_older_than_below_an_hour_is_refused(store_path: Path) -> None:
    fleetstore.open(store_path).close()
    done = cli("maintain", str(store_path), "--ops-older-than", "10m")
    assert done.returncode == 2
    assert "at least 1h" in done.stderr


# --- foreign databases --------------------------------------------------------------------------

FOREIGN = r"""
import sys, apsw
conn = apsw.Connection(sys.argv[1])
if sys.argv[2] == "make":
    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    conn.execute("PRAGMA journal_mode=" + sys.argv[3])
    conn.execute("CREATE TABLE t(x)")
    with conn:
        for i in range(3000):
            conn.execute("INSERT INTO t VALUES (?)", (b"x" * 1000,))
    conn.execute("DELETE FROM t WHERE rowid > 500")
else:
    print(" ".join(r[0] for r in conn.execute("SELECT name FROM sqlite_master ORDER BY name")))
    print(conn.execute("PRAGMA freelist_count").fetchall()[0][0])
    print(conn.execute("PRAGMA journal_mode").fetchall()[0][0])
conn.close()
"""


def foreign(path: Path, *args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", FOREIGN, str(path), *args],
        capture_output=True,
        text=True,
        check=True,
        env=clean_env(),
    )
    return done.stdout.split("\n")


def test_a_foreign_database_gets_only_the_generic_steps_and_only_with_yes(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    foreign(path, "make", "WAL")
    names, free, mode = foreign(path, "look")[:3]
    assert int(free) > 100 and mode == "wal"
    digest = file_digest(path)
    done = cli("maintain", str(path))
    assert done.returncode == 2
    assert "not a fleetstore store" in done.stderr and "--yes" in done.stderr
    assert file_digest(path) == digest

    done = cli("maintain", str(path), "--yes", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["kind"] == "foreign"
    assert [s["name"] for s in report["steps"]] == ["optimize", "vacuum", "checkpoint"]
    after_names, after_free, after_mode = foreign(path, "look")[:3]
    assert after_names == names  # no fleetstore table added
    assert int(after_free) == 0 and after_mode == "wal"


def test_a_store_others_can_read_is_refused_and_left_alone(tmp_path: Path) -> None:
    """Another program's file keeps its mode (above); a store is held to what
    fleetstore.open requires (issue 23), in a dry run too, before anything is made."""
    path = tmp_path / "copied.db"
    with fleetstore.open(path) as store:
        store.sessions.create("s")
    for side in tmp_path.glob("copied.db?*"):
        shutil.rmtree(side) if side.is_dir() else side.unlink()
    path.chmod(0o644)  # as `cp` leaves a copy
    digest = file_digest(path)
    for extra in ("--yes", "--dry-run"):
        done = cli("maintain", str(path), extra)
        assert done.returncode == 1 and "chmod 600" in done.stderr, done.stderr
        assert file_digest(path) == digest and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_foreign_database_not_in_wal_mode_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "legacy.db"
    foreign(path, "make", "DELETE")
    digest = file_digest(path)
    done = cli("maintain", str(path), "--yes")
    assert done.returncode == 1
    assert "not in WAL mode" in done.stderr
    assert file_digest(path) == digest
    assert foreign(path, "look")[2] == "delete"


def test_no_database_at_path_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    done = cli("maintain", str(tmp_path / "absent.db"))
    assert done.returncode == 2
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_a_database_exits_1(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_text("not a database " * 20)
    done = cli("maintain", str(junk), "--yes")
    assert done.returncode == 1
    assert "not a SQLite database" in done.stderr


# --- under load ---------------------------------------------------------------------------------


@pytest.fixture
def agents() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


def prefill(store: fleetstore.Store, rng: random.Random) -> dict[str, int]:
    """Deletable history (old sessions, one of 20,000 messages), garbage blobs and old
    applied_ops, written in a few big transactions."""
    q = store.queries
    old: list[str] = []
    ops = 0

    def message(sid: str, i: int) -> Operation:
        return Operation(
            "append_message",
            {
                "id": new_id(),
                "session_id": sid,
                "role": "user" if i % 2 else "assistant",
                "parts": [{"kind": "text", "enc": "str", "body": f"turn {i} " + "w" * 300}],
            },
            new_id(),
        )

    sizes = [20_000] + [100] * 150
    for n in sizes:
        sid = new_id()
        with store.db.write() as tx:
            registry.apply(
                tx,
                q,
                Operation("create_session", {"id": sid, "title": "old"}, new_id()),
                time.time(),
            )
            for i in range(n):
                registry.apply(tx, q, message(sid, i), time.time())
                ops += 1
        old.append(sid)
    backdate(store, old, 60)
    age_ops(store, 60 * DAY)
    garbage = 0
    for _ in range(150):
        ref = store.blobs.put(rng.randbytes(70_000))
        age(store.blobs.path(ref.sha256), 2 * 3600)
        garbage += 1
        if garbage % 2:  # half with a row no one refers to, half bare files
            with store.db.write() as tx:
                tx.execute(
                    "INSERT INTO blobs (sha256, size, stored_size, codec, created_at) "
                    "VALUES (?, ?, ?, 'zstd', 0)",
                    (ref.sha256, ref.size, ref.stored_size),
                )
    return {"sessions": len(old), "messages": sum(sizes), "garbage_blobs": garbage, "ops": ops}


@pytest.mark.timing
@pytest.mark.fleet
def test_maintain_while_16_agents_write_fails_no_write_and_holds_the_lock_briefly(
    store_path: Path, tmp_path: Path, agents: list[subprocess.Popen[str]]
) -> None:
    with fleetstore.open(store_path) as store:
        filled = prefill(store, random.Random(10))
    stop = tmp_path / "stop"
    for n in range(16):
        agents.append(
            subprocess.Popen(
                [sys.executable, AGENT, str(store_path), "--stop", str(stop), "--seed", str(n)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=clean_env(),
            )
        )
    for p in agents:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
    time.sleep(1.0)  # the fleet is writing
    done = cli(
        "maintain",
        str(store_path),
        "--delete-older-than",
        "30d",
        "--yes",
        "--ops-older-than",
        "30d",
        "--blob-grace",
        "1h",
        "--json",
        timeout=600,
    )
    time.sleep(0.5)
    stop.touch()
    results = []
    for p in agents:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    steps = {s["name"]: s for s in report["steps"]}
    failures = sum(r["failures"] for r in results)
    assert failures == 0, [r["errors"] for r in results if r["errors"]]
    assert steps["delete"]["detail"]["trees"] == filled["sessions"]
    assert steps["delete"]["detail"].get("deleted_messages") == filled["messages"]
    assert steps["blobs"]["detail"]["deleted_files"] == filled["garbage_blobs"]
    assert steps["ops"]["detail"]["pruned"] >= filled["ops"]
    assert steps["vacuum"]["detail"]["freed_pages"] > 0
    # The figure that matters to the fleet: no maintenance transaction held the lock long.
    assert report["max_hold"] < 0.5, report["max_hold"]
    writes = sum(r["writes"] for r in results)
    max_write = max(r["max_write"] for r in results)
    lines = [
        f"\nmaintain under 16 agents: {writes} agent writes, 0 failed, longest agent write "
        f"{max_write * 1000:.1f} ms"
    ]
    for s in report["steps"]:
        lines.append(
            f"  {s['name']:<10} {s['transactions']:>5} tx  max hold {s['max_hold'] * 1000:6.1f} ms"
            f"  max wait {s['max_wait'] * 1000:6.1f} ms  {s['seconds']:.2f} s"
        )
    print("\n".join(lines))
    with fleetstore.open(store_path) as store:
        assert store.read(lambda tx: tx.execute("PRAGMA integrity_check"))[0][0] == "ok"
