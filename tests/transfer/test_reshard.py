"""``fleetstore reshard`` (fleetstore.transfer.reshard, fleetstore.transfer.migrate on the sharded layout),
export/import on a sharded store, and archiving a session tree's file.

Real stores under tmp_path, real processes for the commands, a real kill -9 mid-copy,
real writers in other processes while a tree's file is moved.  The test process reads
SQLite files only through fleetstore (apsw).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import fleetstore
from fleetstore.cli.reshard import archive_tree_command, reshard_command, restore_tree_command
from fleetstore.core.crash import CRASH_ENV
from fleetstore.domain.blobs import BlobStore
from fleetstore.errors import AlreadyExists, IntegrityError, InvalidInput, NotFound
from fleetstore.store.facade import Store
from fleetstore.store.sharded.shards import shard_key
from fleetstore.transfer import archive as tree_archive
from fleetstore.transfer import migrate, reshard
from fleetstore.transfer.digest import SessionDigest, session_digest
from fleetstore.transfer.export import export_store
from fleetstore.transfer.importing import import_file
from fleetstore.transfer.migrate import schema
from tests.transfer.test_migrate import BLOB_THRESHOLD, api_view, dump, fill

pytestmark = pytest.mark.usefixtures("data_dir")

SRC_DIR = str(Path(__file__).resolve().parents[2] / "src")


def opened(url: str | Path, **settings: Any) -> Store:
    return fleetstore.open(url, blob_threshold=BLOB_THRESHOLD, **settings)


def sharded(path: Path) -> str:
    return f"sqlite+sharded://{path}"


def per_file(url: str) -> dict[tuple[str | None, str], list[tuple[Any, ...]]]:
    """Every row of every table of each file of a sharded store (the catalog's index
    copies and shard_sessions included), by (shard key or None, table), sorted."""
    out: dict[tuple[str | None, str], list[tuple[Any, ...]]] = {}
    with opened(url) as store:
        tables = [*schema._read_schema(store), "shard_sessions", "shard_intents"]

        def each(key: str | None, db: Any) -> None:
            for name in tables:
                rows = db.read(lambda tx, name=name: tx.execute(f"SELECT * FROM {name}"))
                if rows:
                    out[(key, name)] = sorted((tuple(r) for r in rows), key=repr)

        assert store.router is not None
        store.router.each(each)
    return out


def digests(store: Store) -> dict[str, SessionDigest | None]:
    store.sync_catalog()
    ids = [s.id for s in store.sessions.list(include_archived=True, limit=1000)]
    return {sid: session_digest(store, sid) for sid in ids}


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``fleetstore reshard ARGS`` in a subprocess (the command on its own, so the test
    does not depend on where it is registered)."""
    code = "from fleetstore.cli.reshard import reshard_command; reshard_command()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
    )


# -- reshard ---------------------------------------------------------------------------------


def test_a_file_resharded_and_back_is_identical_and_each_tree_has_its_file(
    tmp_path: Path,
) -> None:
    src, back = tmp_path / "one.db", tmp_path / "back.db"
    with opened(src) as s:
        ids = fill(s, blobs=3)
        before, view, want = dump(s), api_view(s, ids), digests(s)
        adk = [r[0] for r in s.db.read(lambda tx: tx.execute("SELECT fs_id FROM adk_sessions"))]
    seen: list[tuple[str, int, int]] = []
    report = reshard.reshard(
        src, tmp_path / "dir", batch_rows=7, progress=lambda *a: seen.append(a)
    )
    assert report.ok and report.src_layout == "file" and report.dst_layout == "sharded"
    assert report.sessions_verified == len(want) == 6
    assert report.blobs_copied == report.blobs_verified == len(before["blobs"])
    assert any(stage == "verify sessions" for stage, _, _ in seen)
    files = per_file(sharded(tmp_path / "dir"))
    # Each tree in the shard of its root, with everything of its sessions; the ADK
    # session (with its app and user state), effects and checkpoints in the catalog.
    trees = {r[2] for (key, t), rows in files.items() if t == "sessions" and key for r in rows}
    assert {k for k, _ in files if k} == {shard_key(root) for root in trees}
    assert shard_key(ids["root"]) in {k for k, _ in files}
    for (key, table), rows in files.items():
        if key is not None and table in ("sessions", "messages", "parts", "state"):
            column = {"sessions": 2, "messages": 1, "parts": 2, "state": 0}[table]
            owners = {r[column] for r in rows}
            if table == "sessions":
                assert {shard_key(o) for o in owners} == {key}
            else:
                assert owners <= {r[0] for r in files[(key, "sessions")]}
    catalog_tables = {t for k, t in files if k is None}
    assert {"effects", "ckpt_checkpoints", "adk_sessions", "adk_user_state"} <= catalog_tables
    assert not {t for k, t in files if k is not None} & {"effects", "ckpt_writes", "adk_sessions"}
    with opened(sharded(tmp_path / "dir")) as d:
        assert d.router is not None and d.router.home(adk[0]) is None  # the catalog's
        assert api_view(d, ids) == view and digests(d) == want
    done = cli(str(tmp_path / "dir"), str(back), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["ok"] and out["src_layout"] == "sharded" and out["dst_layout"] == "file"
    with opened(back) as b:
        assert dump(b) == before  # row for row, in key order: the ordered SHA-256 too
        assert api_view(b, ids) == view
    assert migrate.verify(str(src), str(back)) == []


def test_a_sharded_store_through_a_file_and_postgresql_comes_back_file_for_file(
    tmp_path: Path, pg_url: str
) -> None:
    native = sharded(tmp_path / "native")
    with opened(native) as s:
        fill(s, blobs=2)
        s.messages.append(s.sessions.create(title="third tree").id, "user", "x" * 3000)
    files = per_file(native)
    assert len({k for k, _ in files if k}) == 3
    reshard.reshard(native, tmp_path / "one.db", batch_rows=11)
    reshard.reshard(tmp_path / "one.db", tmp_path / "again", batch_rows=11)
    # Every row in the file the router had put it in, blob reference rows and the
    # catalog's index included.
    assert per_file(sharded(tmp_path / "again")) == files
    report = migrate.migrate(native, pg_url, batch_rows=13)
    assert report.ok and report.sessions_verified == 7 and report.dst_layout == "server"
    migrate.migrate(pg_url, sharded(tmp_path / "from-pg"), batch_rows=13)
    assert per_file(sharded(tmp_path / "from-pg")) == files


def test_a_destination_that_is_not_empty_is_refused_and_left_alone(tmp_path: Path) -> None:
    src = tmp_path / "one.db"
    with opened(src) as s:
        s.messages.append(s.sessions.create().id, "user", "hi")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    with opened(sharded(tmp_path / "store")) as other:
        other.sessions.create(title="already here")
    runner = CliRunner()
    for dst in (str(taken), str(tmp_path / "store")):
        files = sorted((p, p.stat().st_mtime_ns) for p in Path(dst).rglob("*") if p.is_file())
        done = runner.invoke(reshard_command, [str(src), dst])
        assert done.exit_code == 2, done.output
        assert "Nothing was written" in done.stderr
        assert (
            sorted((p, p.stat().st_mtime_ns) for p in Path(dst).rglob("*") if p.is_file()) == files
        )
    with pytest.raises(migrate.DestinationNotEmpty):
        reshard.reshard(src, taken)
    # Same store, no SRC, PostgreSQL: bad usage, nothing created.
    for args, says in (
        ([str(src), f"sqlite://{src}"], "same store"),
        ([str(tmp_path / "absent.db"), str(tmp_path / "out")], "no store at"),
        ([str(src), "postgresql://u@localhost:1/db"], "fleetstore migrate"),
        ([str(src), str(tmp_path / "out"), "--batch-rows", "0"], "batch-rows"),
    ):
        done = runner.invoke(reshard_command, args)
        assert done.exit_code == 2 and says in done.output, done.output
    assert not (tmp_path / "out").exists()
    # An empty directory is fine, and so is the interrupted copy of the same SRC.
    (tmp_path / "empty").mkdir()
    assert reshard.reshard(src, tmp_path / "empty").ok
    again = reshard.reshard(src, tmp_path / "empty")
    assert again.ok and again.resumed and sum(t.copied for t in again.tables) == 0


@pytest.mark.slow
def test_killed_mid_copy_the_reshard_carries_on_and_ends_equal(tmp_path: Path) -> None:
    src, dst = tmp_path / "one.db", tmp_path / "dir"
    with opened(src) as s:
        ids = fill(s, messages=600)
        for i in range(8):
            s.messages.append(s.sessions.create(title=f"t{i}").id, "user", f"m{i}")
        view = api_view(s, ids)
    code = "from fleetstore.cli.reshard import reshard_command; reshard_command()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(src), str(dst), "--batch-rows", "5"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
    )
    killed: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            items = progress_items(dst / "catalog.db")
            state = items.get("table:messages")
            if state and state["rows"] > 0 and not state["done"]:
                os.kill(proc.pid, signal.SIGKILL)
                killed = state
                break
            time.sleep(0.005)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert killed, f"the copy ended before it could be killed: {err.decode()}"
    assert proc.returncode == -signal.SIGKILL
    done = cli(str(src), str(dst), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    copied = {t["name"]: t["copied"] for t in report["tables"]}
    assert report["resumed"] and report["ok"]
    assert copied["sessions"] == 0 and 0 < copied["messages"] < 630
    with opened(sharded(dst)) as d:
        assert api_view(d, ids) == view
        assert len(d.router.shards.keys()) == 10  # type: ignore[union-attr]


LIVE_WRITER = """
import os, sys, time, fleetstore
path, stop, go = sys.argv[1], sys.argv[2], sys.argv[3:]
print("started", flush=True)
while go and not os.path.exists(go[0]):
    time.sleep(0.001)
with fleetstore.open(path) as s:
    print("ready", flush=True)
    i = 0
    while not os.path.exists(stop):
        sid = s.sessions.create(title=f"live {i}").id
        s.messages.append(sid, "user", f"written while the reshard ran {i}")
        i += 1
        time.sleep(0.02)
"""


def live_writer(src: Path, stop: Path, go: Path | None = None) -> subprocess.Popen[str]:
    """A process that writes to *src* (a new session and a message every 20 ms) until
    the file *stop* exists; returned once it has the store open, or with *go*, once
    it has started: it opens the store when the file *go* exists."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LIVE_WRITER, str(src), str(stop), *([str(go)] if go else [])],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    if go is None:
        assert proc.stdout.readline().strip() == "ready"
    return proc


def stopped(proc: subprocess.Popen[str], stop: Path) -> None:
    stop.touch()
    assert proc.wait(timeout=60) == 0
    assert proc.stdout is not None
    proc.stdout.close()


def reshard_mid_messages(src: Path, dst: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """``fleetstore reshard SRC DST --batch-rows 5`` started, returned once it is part
    way through the messages table (its progress record says so)."""
    code = "from fleetstore.cli.reshard import reshard_command; reshard_command()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(src), str(dst), "--batch-rows", "5"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        state = progress_items(dst / "catalog.db").get("table:messages")
        if state and state["rows"] > 0 and not state["done"]:
            return proc, state
        time.sleep(0.005)
    proc.kill()
    _, err = proc.communicate()
    raise AssertionError(f"the copy ended before it reached the messages: {err.decode()}")


def test_a_live_source_is_refused_naming_its_writer_and_dst_is_left_alone(
    tmp_path: Path,
) -> None:
    """The soak's failure: a reshard against a source a fleet writes to stopped with
    "FOREIGN KEY constraint failed" (a message whose session came after the sessions
    table was copied), and every run after stopped there again."""
    src, dst, stop = tmp_path / "one.db", tmp_path / "dir", tmp_path / "stop"
    with opened(src) as s:
        fill(s, messages=40)
    writer = live_writer(src, stop)
    try:
        refused = cli(str(src), str(dst))
        with pytest.raises(migrate.SourceInUse) as raised:
            reshard.reshard(src, dst)
    finally:
        stopped(writer, stop)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "is in use" in refused.stderr and f"pid {writer.pid} " in refused.stderr
    assert "nothing was written" in refused.stderr
    assert writer.pid in raised.value.writers
    assert not dst.exists()
    done = cli(str(src), str(dst), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and not report["resumed"] and report["restarted"] is None
    with opened(src) as s, opened(sharded(dst)) as d:
        assert digests(d) == digests(s)


def test_a_writer_that_starts_mid_copy_stops_it_and_the_next_run_starts_over(
    tmp_path: Path,
) -> None:
    src, dst, stop, go = (tmp_path / n for n in ("one.db", "dir", "stop", "go"))
    with opened(src) as s:
        fill(s, messages=3000)
    writer = live_writer(src, stop, go)  # started, not yet using SRC
    try:
        proc, _ = reshard_mid_messages(src, dst)
        # Stopped mid-copy until the writer has SRC open: on a loaded machine the copy
        # could otherwise pass its last look for writers before the writer came (and a
        # writer that comes after the copy was verified is not the copy's to see).
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            go.touch()
            assert writer.stdout is not None
            assert writer.stdout.readline().strip() == "ready"
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        _, err = proc.communicate(timeout=120)
    finally:
        stopped(writer, stop)
    assert proc.returncode == 1, err.decode()
    assert f"pid {writer.pid} " in err.decode() and "copied again" in err.decode()
    assert progress_items(dst / "catalog.db")["state"] == "stale"
    done = cli(str(src), str(dst), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["restarted"] and not report["resumed"]
    with opened(src) as s, opened(sharded(dst)) as d:
        assert digests(d) == digests(s)
        assert len(digests(s)) > 8  # the writer's sessions are in the copy


def test_killed_mid_copy_then_written_to_the_reshard_starts_over_and_ends_equal(
    tmp_path: Path,
) -> None:
    """A reshard killed mid-copy, then SRC written (new sessions with messages, a
    message in an old session, a session deleted): carrying on would copy messages
    whose sessions the copied sessions table lacks.  It used to stop at "FOREIGN KEY
    constraint failed" on every run; now it sees the copy no longer fits and starts over."""
    src, dst = tmp_path / "one.db", tmp_path / "dir"
    with opened(src) as s:
        ids = fill(s, messages=600)
    proc, _ = reshard_mid_messages(src, dst)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    with opened(src) as s:
        for i in range(5):
            s.messages.append(s.sessions.create(title=f"later {i}").id, "user", f"later {i}")
        s.messages.append(ids["root"], "user", "one more in an old session")
        s.sessions.delete(ids["early"])
    done = cli(str(src), str(dst), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and "no longer fits" in report["restarted"]
    with opened(src) as s, opened(sharded(dst)) as d:
        assert digests(d) == digests(s)
    again = cli(str(src), str(dst), "--json")  # done: verified again, nothing copied
    assert again.returncode == 0 and json.loads(again.stdout)["restarted"] is None


def progress_items(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        db = fleetstore.Database.open(path)
        try:
            rows = db.read(lambda tx: tx.execute("SELECT item, value FROM fleetstore_migrate"))
        finally:
            db.close()
    except Exception:
        return {}
    return {str(k): json.loads(v) if str(k).startswith("table:") else v for k, v in rows}


def test_verification_names_a_changed_session_and_a_wrong_index(tmp_path: Path) -> None:
    src, dst = tmp_path / "one.db", tmp_path / "dir"
    with opened(src) as s:
        ids = fill(s, messages=3)
    reshard.reshard(src, dst)
    with opened(sharded(dst)) as d:
        assert d.router is not None
        key = d.router.home(ids["early"])
        assert key is not None
        with d.router.shards.use(key) as db, db.write() as tx:
            tx.execute("UPDATE messages SET model = 'other' WHERE session_id = ?", (ids["early"],))
        with d.db.write() as tx:
            tx.execute("DELETE FROM shard_sessions WHERE session_id = ?", (ids["fork"],))
    report = reshard.verify_report(src, dst)
    assert not report.ok
    text = "\n".join(report.problems)
    assert "table messages: " in text and "contents differ" in text
    assert f"session {ids['early']}: read through the Store API" in text
    assert f"session {ids['fork']} is in shard {key}, but the catalog's index says nothing" in text
    done = cli(str(src), str(dst), "--verify-only")
    assert done.returncode == 1 and "MISMATCH" in done.stderr


# -- export and import -----------------------------------------------------------------------


def test_export_of_a_sharded_store_imports_into_a_file_and_back(tmp_path: Path) -> None:
    with opened(sharded(tmp_path / "a")) as a:
        ids = fill(a, blobs=2)
        exported = export_store(a, tmp_path / "a.zst")
    assert len(exported.digests) == 6
    with opened(tmp_path / "one.db") as one:
        import_file(one, tmp_path / "a.zst")
        assert {sid: session_digest(one, sid) for sid in exported.digests} == exported.digests
        export_store(one, tmp_path / "one.zst")
    with opened(sharded(tmp_path / "b")) as b:
        summary = import_file(b, tmp_path / "one.zst")
        assert summary.inserted == 6 + 35 + exported.states
        assert {sid: session_digest(b, sid) for sid in exported.digests} == exported.digests
        assert b.router is not None and b.router.home(ids["early"]) == shard_key(ids["root"])
        again = import_file(b, tmp_path / "a.zst")
        assert again.inserted == again.updated == 0


def test_an_import_conflicting_with_a_sharded_row_is_refused_before_any_write(
    tmp_path: Path,
) -> None:
    """The check pass reads each operation's session in its tree's file: the catalog
    holds no messages, so a check there let this file through, and the write pass
    stopped half way at the conflict."""
    with opened(sharded(tmp_path / "a")) as a:
        root = a.sessions.create(title="t")
        a.messages.append(root.id, "user", "first", id="m-1")
        export_store(a, tmp_path / "base.zst")
        a.messages.append(root.id, "user", "the file's", id="m-2")
        new = a.sessions.create(title="new")
        a.messages.append(new.id, "user", "would be imported first")
        # The new session comes first in the file, the conflicting message after it.
        export_store(a, tmp_path / "a.zst", [new.id, root.id])
    with opened(sharded(tmp_path / "b")) as b:
        import_file(b, tmp_path / "base.zst")
        b.messages.append(root.id, "user", "the store's", id="m-2")
        with pytest.raises(AlreadyExists, match=r"m-2.*nothing was imported"):
            import_file(b, tmp_path / "a.zst")
        with pytest.raises(NotFound):
            b.sessions.get(new.id)
        assert [m.id for m in b.messages.list(root.id)] == ["m-1", "m-2"]


# -- archiving a tree ------------------------------------------------------------------------


def test_an_archived_tree_leaves_with_its_blobs_and_comes_back_equal(tmp_path: Path) -> None:
    store_dir, dest = tmp_path / "store", tmp_path / "archive"
    with opened(sharded(store_dir)) as s:
        ids = fill(s, blobs=3)
        other = s.sessions.create(title="stays")
        s.messages.append(other.id, "user", "here")
        before = digests(s)
        key = shard_key(ids["root"])
        tree = {sid for sid in before if s.router and s.router.home(sid) == key}
        assert len(tree) == 4
        done = tree_archive.archive_tree(s, ids["early"], dest)  # any session of the tree
        assert (done.key, done.sessions, done.messages) == (key, 4, 35)
        assert not s.router.shards.exists(key)  # type: ignore[union-attr]
        assert {x.id for x in s.sessions.list(include_archived=True)} == set(before) - tree
        with pytest.raises(NotFound):
            s.sessions.get(ids["root"])
        with pytest.raises(NotFound):
            s.messages.append(ids["root"], "user", "to nowhere")
        assert session_digest(s, other.id) == before[other.id]
        with pytest.raises(InvalidInput, match="catalog"):
            adk = s.db.read(lambda tx: tx.execute("SELECT fs_id FROM adk_sessions"))[0][0]
            tree_archive.archive_tree(s, adk, dest)
    # Self-contained: the file and every blob it refers to, each matching its hash.
    manifest = json.loads((dest / f"{key}.json").read_text())
    assert set(manifest["sessions"]) == tree and manifest["blobs"] == done.blobs > 0
    db = fleetstore.Database.open(dest / f"{key}.db")
    try:
        shas = [r[0] for r in db.read(lambda tx: tx.execute("SELECT sha256 FROM blobs"))]
        assert db.read(lambda tx: tx.execute("SELECT count(*) FROM messages"))[0][0] == 35
    finally:
        db.close()
    copies = BlobStore(dest / f"{key}.blobs", 1 << 30)
    assert len(shas) == done.blobs and all(copies.verify(sha) for sha in shas)
    # The archived file refuses writes, whoever opens it.
    db = fleetstore.Database.open(dest / f"{key}.db")
    try:
        with pytest.raises(IntegrityError, match=tree_archive.ARCHIVED), db.write() as tx:
            tx.execute("DELETE FROM messages")
        assert db.read(lambda tx: tx.execute("SELECT count(*) FROM messages"))[0][0] == 35
    finally:
        db.close()
    runner = CliRunner()
    url = sharded(store_dir)
    result = runner.invoke(restore_tree_command, [str(dest / f"{key}.db"), "--store", url])
    assert result.exit_code == 0, result.output
    assert "restored" in result.output
    with opened(url) as s:
        assert digests(s) == before
        s.messages.append(ids["root"], "user", "after the restore")
    assert not (dest / f"{key}.blobs").exists() and not (dest / f"{key}.db").exists()
    # Bad usage: exit 2, nothing moved.
    (tmp_path / "f.txt").write_text("a file")
    with opened(tmp_path / "one.db") as one:
        one.sessions.create()
    for sid, to, where, says in (
        ("nope", dest, url, "no session"),
        (ids["root"], tmp_path / "f.txt", url, "not a directory"),
        (ids["root"], dest, str(tmp_path / "absent.db"), "no store"),
        (ids["root"], dest, str(tmp_path / "one.db"), "not a sharded store"),
    ):
        result = runner.invoke(archive_tree_command, [sid, "--to", str(to), "--store", where])
        assert result.exit_code == 2 and says in result.output, result.output
    for archive, says in (
        (tmp_path / "one.db", "is not the archived tree one"),  # a store, not a tree
        (dest / f"{key}.db", "no archived tree"),
    ):
        result = runner.invoke(restore_tree_command, [str(archive), "--store", url])
        assert result.exit_code == 2 and says in result.output, result.output
    assert (tmp_path / "one.db").exists()
    with opened(url) as s:
        assert s.router is not None and s.router.shards.exists(key)


WRITER = """
import sys, time, fleetstore
store = fleetstore.open(sys.argv[1])
sid, n = sys.argv[2], int(sys.argv[3])
print("ready", flush=True)
for i in range(n):
    store.messages.append(sid, "user", f"m{i}")
    print(f"ok {i}", flush=True)
store.close()
print("done", flush=True)
"""

HOLDER = """
import sys, fleetstore
store = fleetstore.open(sys.argv[1])
sid = sys.argv[2]
store.messages.append(sid, "user", "before")
# The catalog's index refreshed now: its background refresh, which drops the shard of
# a tree it finds gone from this process's cache, has nothing left to do later.
store.sync_catalog()
print("ready", flush=True)
for line in sys.stdin:
    try:
        m = store.messages.append(sid, "user", line.strip())
        print("wrote", m.id, flush=True)
    except Exception as exc:
        print("refused", type(exc).__name__, str(exc).replace(chr(10), " "), flush=True)
"""


@pytest.fixture
def python() -> Iterator[Any]:
    started: list[subprocess.Popen[str]] = []

    def run(code: str, *args: str) -> subprocess.Popen[str]:
        env = dict(os.environ, PYTHONPATH=SRC_DIR)
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        started.append(proc)
        return proc

    yield run
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def line(proc: subprocess.Popen[str], timeout: float = 30) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            pytest.fail(f"no output within {timeout}s; stderr {proc.stderr}")
    return proc.stdout.readline().rstrip("\n")


@pytest.mark.slow
def test_archiving_one_tree_while_another_process_appends_to_another(
    tmp_path: Path, python: Any
) -> None:
    url = sharded(tmp_path / "store")
    with opened(url) as s:
        a, b = s.sessions.create(title="a"), s.sessions.create(title="b")
        for i in range(20):
            s.messages.append(a.id, "user", f"a{i}")
        s.messages.append(b.id, "user", "b")
        want = session_digest(s, a.id)
    writer = python(WRITER, url, b.id, "300")
    assert line(writer) == "ready"
    assert line(writer) == "ok 0"
    with opened(url) as s:
        tree_archive.archive_tree(s, a.id, tmp_path / "archive")
    lines = []
    while (text := line(writer)) != "done":
        lines.append(text)
    assert writer.wait(30) == 0, writer.stderr.read() if writer.stderr else ""
    assert lines[-1] == "ok 299"
    with opened(url) as s:
        assert len(s.messages.list(b.id, limit=1000)) == 301
        with pytest.raises(NotFound):
            s.sessions.get(a.id)
        tree_archive.restore_tree(s, tmp_path / "archive" / f"{shard_key(a.id)}.db")
        assert session_digest(s, a.id) == want


@pytest.mark.slow
def test_a_writer_that_had_the_tree_open_is_refused_never_writes_into_the_moved_file(
    tmp_path: Path, python: Any
) -> None:
    url = sharded(tmp_path / "store")
    with opened(url) as s:
        sid = s.sessions.create(title="t").id
    holder = python(HOLDER, url, sid)
    assert line(holder) == "ready"  # it wrote once: the shard is open in its cache
    with opened(url) as s:
        want = session_digest(s, sid)
        done = tree_archive.archive_tree(s, sid, tmp_path / "archive")
    assert holder.stdin is not None
    holder.stdin.write("while archived\n")
    holder.stdin.flush()
    answer = line(holder)
    kind, _, message = answer.partition(" ")[2].partition(" ")
    assert answer.startswith("refused "), answer
    # Its write found the file moved (FileMoved, in the engine), its router looked the
    # session up again and found it nowhere.
    assert kind == "NotFound" and sid in message, answer
    db = fleetstore.Database.open(done.archive)
    try:
        texts = db.read(lambda tx: tx.execute("SELECT count(*) FROM messages"))[0][0]
    finally:
        db.close()
    assert texts == 1  # "before" only
    with opened(url) as s:
        tree_archive.restore_tree(s, done.archive)
        assert session_digest(s, sid) == want
    # The same file is back at its place: the holder writes to it again.
    holder.stdin.write("after the restore\n")
    holder.stdin.flush()
    assert line(holder).startswith("wrote ")
    with opened(url) as s:
        assert [m.parts[0].text for m in s.messages.list(sid)] == ["before", "after the restore"]  # type: ignore[union-attr]


def test_trees_that_share_a_message_id_cannot_become_one_file(tmp_path: Path) -> None:
    """Message ids are unique within a tree (a file) only: the copy into one file stops
    at the table, naming why, instead of dropping one of the messages."""
    with opened(sharded(tmp_path / "s")) as s:
        a, b = s.sessions.create(), s.sessions.create()
        s.messages.append(a.id, "user", "in a", id="same")
        s.messages.append(b.id, "user", "in b", id="same")
    with pytest.raises(IntegrityError, match=r"table messages: .*unique within a session tree"):
        reshard.reshard(tmp_path / "s", tmp_path / "one.db")


@pytest.mark.slow
def test_archive_and_restore_killed_after_the_move_carry_on_when_run_again(
    tmp_path: Path,
) -> None:
    url, dest = sharded(tmp_path / "store"), tmp_path / "archive"
    with opened(url) as s:
        sid = s.sessions.create(title="t").id
        s.messages.append(sid, "user", "x" * 3000)
        want = session_digest(s, sid)
    key = shard_key(sid)
    for step, code in (
        ("after-move", "archive_tree_command"),
        ("after-restore-move", "restore_tree_command"),
    ):
        arg = sid if step == "after-move" else str(dest / f"{key}.db")
        args = [arg, "--store", url, *(["--to", str(dest)] if step == "after-move" else [])]
        run = f"from fleetstore.cli.reshard import {code} as c; c()"
        env = dict(os.environ, **{CRASH_ENV: step})
        done = subprocess.run(
            [sys.executable, "-c", run, *args], capture_output=True, text=True, env=env, timeout=60
        )
        assert done.returncode == -signal.SIGKILL, done.stderr
        with opened(url) as s:
            # Killed with the file moved and the catalog not told: the same call finishes.
            assert s.router is not None
            if step == "after-move":
                assert not s.router.shards.exists(key) and (dest / f"{key}.db").exists()
                assert s.router.home(sid) == key  # still listed
                again = tree_archive.archive_tree(s, sid, dest)
                with pytest.raises(NotFound):
                    s.sessions.get(sid)
            else:
                assert s.router.shards.exists(key) and not (dest / f"{key}.db").exists()
                with pytest.raises(NotFound):
                    s.sessions.get(sid)  # not listed yet
                again = tree_archive.restore_tree(s, dest / f"{key}.db")
                assert session_digest(s, sid) == want
            assert again.resumed and again.ok and again.sessions == 1
