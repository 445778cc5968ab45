"""The operator commands on the sharded layout (``sqlite+sharded:///DIR``): ``doctor``
sees every shard and what ties them to the catalog and changes no byte, ``maintain``
works on every file (retention through the router, a blob shared by shards collected
only once no shard refers to it, empty shard files removed only when nobody uses
them), ``top`` shows the shards, and ``sessions``/``stats`` read each session's shard.

Real processes and files: the commands run as the operator runs them, writers are
separate OS processes, and the test process closes its stores before a command runs.
"""

from __future__ import annotations

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
from fleetstore.admin import doctor
from fleetstore.admin.maintain.config import Config
from fleetstore.admin.maintain.report import format_report
from fleetstore.admin.maintain.run import maintain
from fleetstore.admin.maintain.shards import _put_back, _ShardFile
from fleetstore.store.sharded.shards import shard_key
from fleetstore.transfer.digest import session_digest
from fleetstore.transfer.importing import import_file

DAY = 86400.0
PAYLOAD = random.Random(7).randbytes(150_000)  # a blob file (incompressible)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}
    return {**env, **extra}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetstore", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env or clean_env(),
        stdin=subprocess.DEVNULL,
    )


def url(directory: Path) -> str:
    return f"sqlite+sharded://{directory}"


def shard_path(directory: Path, root_id: str) -> Path:
    key = shard_key(root_id)
    return directory / "shards" / key[-2:] / f"{key}.db"


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under *directory* and the sha256 of its bytes, except the figures
    live processes publish (``catalog.db.procs/``)."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.parent.name.endswith(".procs")
    }


def make_tree(store: fleetstore.Store, title: str, payload: bytes | None = None) -> list[str]:
    """A session with a subagent, messages, and state (a blob when *payload* is big)."""
    s = store.sessions.create(title=title, project="/src/app")
    store.messages.append(s.id, role="user", parts=[fleetstore.Text(f"{title}: why?")])
    store.messages.append(s.id, role="assistant", parts=[fleetstore.Text("because")])
    sub = store.sessions.create(title=f"{title}/sub", parent_id=s.id)
    store.messages.append(sub.id, role="user", parts=[fleetstore.Text("sub task")])
    store.state.put(s.id, "plan", payload if payload is not None else {"step": 1})
    return [s.id, sub.id]


def on_every_file(store: fleetstore.Store, sql: str, params: Any = ()) -> None:
    """A raw write in the catalog and in every shard (test set-up only)."""
    assert store.router is not None

    def run(_key: str | None, db: Any) -> None:
        with db.write() as tx:
            tx.execute(sql, params)

    store.router.each(run)


def backdate(store: fleetstore.Store, session_ids: list[str], days: float) -> None:
    """Make sessions and their state look last written *days* ago, in the shards and
    in the catalog's index alike."""
    ago = days * DAY
    for sid in session_ids:
        on_every_file(
            store,
            "UPDATE sessions SET created_at = created_at - ?, updated_at = updated_at - ? "
            "WHERE id = ?",
            (ago, ago, sid),
        )
        on_every_file(
            store, "UPDATE state SET updated_at = updated_at - ? WHERE session_id = ?", (ago, sid)
        )


def blob_files(directory: Path) -> set[str]:
    root = directory / "catalog.db.blobs"
    # The collector's lock file (.collecting) is not a blob.
    return {p.name for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")}


def contents(store: fleetstore.Store, sid: str) -> Any:
    session = store.sessions.get(sid)
    messages = [(m.id, m.role, m.parts) for m in store.messages.list(sid, limit=1000)]
    state = [store.state.get(sid, k) for k in store.state.keys(sid)]
    return session, messages, state, session_digest(store, sid)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
            p.wait()
            for pipe in (p.stdin, p.stdout):
                if pipe is not None:
                    pipe.close()


def start(procs: list[subprocess.Popen[str]], code: str, *args: str) -> subprocess.Popen[str]:
    """A child process running *code*; returns once it printed its first line."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    procs.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith("ready"), line
    return proc


# A process that wrote to two trees and keeps the store open (idle) until stdin closes.
IDLE_WRITER = """
import sys, fleetstore
# (No figures published, no search indexer: no thread of its own reads while doctor
# looks, which would move its read mark in a -shm.)
store = fleetstore.open(sys.argv[1], publish_interval=0, search_index=False)
for sid in sys.argv[2:]:
    store.messages.append(sid, role="user", parts=[fleetstore.Text("live")])
store.sync_catalog()  # now, not from its background thread while doctor looks
print("ready", flush=True)
sys.stdin.read()
store.close()
"""

# Creates a session and is SIGKILLed by the router between the shard and the catalog.
CRASHED_CREATE = """
import sys, fleetstore
store = fleetstore.open(sys.argv[1])
store.sessions.create(title="half done")
"""


# -- doctor ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_doctor_on_a_sharded_store_reports_missing_orphan_and_stale_intent_and_changes_no_byte(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    directory = tmp_path / "fleet"
    with fleetstore.open(url(directory)) as store:
        trees = [make_tree(store, f"t{i}") for i in range(4)]
    roots = [t[0] for t in trees]
    writer = start(procs, IDLE_WRITER, url(directory), roots[0], roots[1])
    # A shard whose file went (the writer never opened it), and a copy of a shard
    # under a key the catalog does not know (an orphan), both while nobody uses them.
    missing = shard_path(directory, roots[2])
    for suffix in ("", "-wal", "-shm", ".gate"):
        Path(f"{missing}{suffix}").unlink(missing_ok=True)
    orphan_key = "orphan-shard-00"
    orphan = directory / "shards" / orphan_key[-2:] / f"{orphan_key}.db"
    orphan.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shard_path(directory, roots[3]), orphan)
    orphan.chmod(0o600)  # as fleetstore makes its files (doctor flags a readable one)
    # A process killed between its shard's write and the catalog's: an intent is left.
    crashed = subprocess.run(
        [sys.executable, "-c", CRASHED_CREATE, url(directory)],
        env=clean_env(FLEETSTORE_TEST_CRASH="after-shard"),
        capture_output=True,
        timeout=60,
    )
    assert crashed.returncode == -9
    before = snapshot(directory)

    done = cli("doctor", str(directory), "--json", "--interval", "0.2")

    assert snapshot(directory) == before  # no byte changed, no file created (nor removed)
    report = json.loads(done.stdout)
    worst = [f for f in report["findings"] if f["severity"] != "ok"]
    assert done.returncode == doctor.EXIT_WARNINGS, worst
    codes = {f["code"]: f for f in report["findings"]}
    section = report["sharded"]
    assert report["layout"] == "sharded" and report["path"] == str(directory / "catalog.db")
    assert section["shard_files"] == 5  # 3 trees + the orphan + the crashed create's
    assert [m["key"] for m in section["missing"]] == [shard_key(roots[2])]
    assert section["missing"][0]["sessions"] == 2
    assert [o["key"] for o in section["orphans"]] == [orphan_key]
    assert section["orphans"][0]["sessions"] == 2
    assert shard_key(roots[2]) in codes["shard-missing"]["message"]
    assert orphan_key in codes["shard-orphan"]["message"]
    (intent,) = section["intents"]
    assert intent["operation"] == "create_session" and intent["alive"] is False
    assert intent["shard_file"] is True  # killed after its shard's write
    stale = codes["shard-intent-stale"]
    assert stale["severity"] == "warning" and "fleetstore recover" in stale["fix"]
    # Every shard checked as a file; the writer seen on the shards it has open.
    entries = {e["key"]: e for e in section["shards"]}
    assert all(e["quick_check"] == ["ok"] for e in entries.values())
    assert writer.pid in entries[shard_key(roots[0])]["processes"]
    assert writer.pid not in entries[shard_key(roots[3])]["processes"]
    assert writer.pid in {p["pid"] for p in report["processes"]}
    assert section["with_findings"] == 0 and codes["shards"]["severity"] == "ok"

    text = cli("doctor", url(directory), "--interval", "0")
    assert text.returncode == doctor.EXIT_WARNINGS
    assert "5 shard files" in text.stdout and "5 fine, 0 with findings" in text.stdout
    assert snapshot(directory) == before

    # `fleetstore recover` finishes the intent; doctor then sees the tree listed.
    assert cli("recover", url(directory)).returncode == 0
    again = json.loads(cli("doctor", str(directory), "--json", "--interval", "0").stdout)
    assert again["sharded"]["intents"] == []
    assert "shard-intent-stale" not in {f["code"] for f in again["findings"]}
    writer.stdin.close()  # type: ignore[union-attr]
    assert writer.wait(30) == 0


def test_doctor_names_a_damaged_shard_with_its_key(tmp_path: Path) -> None:
    directory = tmp_path / "fleet"
    with fleetstore.open(url(directory)) as store:
        roots = [make_tree(store, f"t{i}")[0] for i in range(2)]
    damaged = shard_path(directory, roots[1])
    damaged.write_bytes(b"not a database at all" * 10)
    before = snapshot(directory)
    report = doctor.diagnose(url(directory), interval=0)
    assert snapshot(directory) == before
    assert report.exit_code == doctor.EXIT_PROBLEMS
    (found,) = [f for f in report.findings if f.code == "unreadable"]
    assert found.message.startswith(f"shard {shard_key(roots[1])}: ")
    assert report.data["sharded"]["with_findings"] == 1


# -- maintain --------------------------------------------------------------------------------

HOLDER = """
import sys, fleetstore
db = fleetstore.Database.open(sys.argv[1])
db.read(lambda tx: tx.execute("SELECT count(*) FROM sessions"))
print("ready", flush=True)
sys.stdin.read()
db.close()
"""


def age_ops_in(path: Path, seconds: float) -> None:
    """Make a shard's applied_ops look applied *seconds* ago (nobody has it open)."""
    db = fleetstore.Database.open(path)
    try:
        with db.write() as tx:
            tx.execute("UPDATE applied_ops SET applied_at = applied_at - ?", (seconds,))
    finally:
        db.close()


def run_maintain(directory: Path, **config: Any) -> dict[str, Any]:
    report = maintain(Config(path=str(directory), **config))
    assert report.ok, format_report(report)
    return {s.name: s for s in report.steps}


@pytest.mark.slow
def test_maintain_on_shards_archives_old_trees_and_collects_a_shared_blob_only_when_unused(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    directory = tmp_path / "fleet"
    with fleetstore.open(url(directory)) as store:
        a = make_tree(store, "a", PAYLOAD)  # old, shares the blob with b
        b = make_tree(store, "b", PAYLOAD)  # recent
        c = make_tree(store, "c")  # old
        d = make_tree(store, "d")  # recent
        backdate(store, a + c, 40)
        before = {sid: contents(store, sid) for sid in a + b + c + d}
    assert len(blob_files(directory)) == 1
    files_before = snapshot(directory)

    dry = run_maintain(directory, dry_run=True, archive_older_than=30 * DAY, archive_to="x")
    assert dry["archive"].status == "dry-run" and dry["archive"].detail["trees"] == 2
    assert dry["archive"].detail["messages"] == 6
    assert snapshot(directory) == files_before  # a dry run writes nothing

    archive = tmp_path / "old.jsonl.zst"
    done = cli(
        "maintain", url(directory), "--archive-older-than", "30d", str(archive),
        "--blob-grace", "0", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    steps = {s["name"]: s for s in json.loads(done.stdout)["steps"]}
    assert steps["archive"]["detail"]["trees"] == 2 and steps["archive"]["detail"]["verified"]
    assert steps["archive"]["detail"]["deleted_messages"] == 6
    blobs = steps["blobs"]["detail"]
    # a's shard held a row for the blob (now unreferenced, deleted); b's still refers.
    assert blobs["deleted_rows"] == 1 and blobs["shared_kept"] == 1
    assert blobs["deleted_files"] == 0 and len(blob_files(directory)) == 1
    assert steps["optimize"]["detail"]["files_by_status"] == {"done": 5}
    # The emptied shards were applied to within the hour: kept for their exactly-once log.
    assert steps["shards"]["detail"]["empty_young"] == 2
    with fleetstore.open(url(directory)) as store:
        assert {s.id for s in store.sessions.list()} == set(b + d)
        for sid in a + c:
            with pytest.raises(fleetstore.NotFound):
                store.sessions.get(sid)
        for sid in b + d:
            assert contents(store, sid) == before[sid]
        # The archive holds the old trees exactly (imported into a single file).
        with fleetstore.open(tmp_path / "restored.db") as restored:
            import_file(restored, archive)
            for sid in a + c:
                assert contents(restored, sid)[3] == before[sid][3]
        store.sessions.delete(b[0])

    # b was the last to refer to the blob: its file goes.  The empty shards, now past
    # the horizon, are removed, except the one a process holds open.
    for tree in (a, b, c):
        age_ops_in(shard_path(directory, tree[0]), 2 * 3600)
    holder = start(procs, HOLDER, str(shard_path(directory, c[0])))
    steps2 = run_maintain(directory, blob_grace=0.0)
    assert steps2["blobs"].detail["deleted_files"] == 1 and blob_files(directory) == set()
    shards = steps2["shards"].detail
    assert shards["removed"] == 2 and shards["kept_in_use"] == 1
    assert not shard_path(directory, a[0]).exists() and not shard_path(directory, b[0]).exists()
    assert shard_path(directory, c[0]).exists()  # put back where it was, for its user
    assert shard_path(directory, d[0]).exists()
    holder.stdin.close()  # type: ignore[union-attr]
    assert holder.wait(30) == 0
    with fleetstore.open(url(directory)) as store:
        assert {s.id for s in store.sessions.list()} == set(d)
        assert contents(store, d[0]) == before[d[0]]
        # A removed shard's key used again starts a fresh shard.
        again = store.sessions.create(title="a again", id=a[0])
        store.messages.append(again.id, role="user", parts=[fleetstore.Text("new")])
        assert [m.parts for m in store.messages.list(a[0])] == [(fleetstore.Text("new"),)]
    assert shard_path(directory, a[0]).exists()


def test_a_shard_set_aside_is_never_put_back_over_a_file_made_meanwhile(tmp_path: Path) -> None:
    directory = tmp_path / "fleet"
    with fleetstore.open(url(directory)) as store:
        root = make_tree(store, "a")[0]
    shard = _ShardFile(shard_key(root), shard_path(directory, root))
    sides = [(src, dst) for src, dst in shard.sides() if src.exists()]
    original = shard.path.read_bytes()
    for src, dst in sides:
        os.rename(src, dst)
    shard.path.write_bytes(b"")  # a first use made a fresh shard at the name meanwhile
    assert _put_back(sides) is False
    assert shard.path.read_bytes() == b""  # the new file stays, untouched
    assert sides[0][1].read_bytes() == original  # the old one is kept aside, not lost
    shard.path.unlink()
    assert _put_back(sides) is True
    assert shard.path.read_bytes() == original and not sides[0][1].exists()


def test_maintain_deletes_a_tree_in_short_batches_through_the_router(tmp_path: Path) -> None:
    directory = tmp_path / "fleet"
    with fleetstore.open(url(directory)) as store:
        old = store.sessions.create(title="long")
        for i in range(60):
            store.messages.append(old.id, role="user", parts=[fleetstore.Text(f"m{i}")])
        keep = make_tree(store, "keep")
        backdate(store, [old.id], 40)
        # The catalog's index says "old", the shard was written since: kept.
        written = make_tree(store, "written")
        on_every_file(
            store,
            "UPDATE sessions SET updated_at = updated_at - ? WHERE id = ? AND ? IN "
            "(SELECT session_id FROM shard_sessions)",
            (40 * DAY, written[0], written[0]),
        )
    steps = run_maintain(directory, delete_older_than=30 * DAY, yes=True)
    step = steps["delete"]
    assert step.detail["trees"] == 1 and step.detail["deleted_messages"] == 60
    with fleetstore.open(url(directory)) as store:
        with pytest.raises(fleetstore.NotFound):
            store.sessions.get(old.id)
        assert {s.id for s in store.sessions.list()} == set(keep + written)
        # Nothing left half done between the catalog and the shard.
        assert store.router is not None
        assert store.router.catalog.read(lambda tx: tx.execute("SELECT * FROM shard_intents")) == []


# -- top -------------------------------------------------------------------------------------

BUSY_WRITER = """
import sys, time, fleetstore
store = fleetstore.open(sys.argv[1], publish_interval=0.1)
ids = [store.sessions.create(title=f"w{i}").id for i in range(2)]
print("ready", flush=True)
end = time.time() + 30
while time.time() < end:
    for sid in ids:
        store.messages.append(sid, role="user", parts=[fleetstore.Text("x")])
    time.sleep(0.01)
store.close()
"""


@pytest.mark.slow
def test_top_json_frame_of_a_sharded_store_shows_its_shards_and_writer(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    directory = tmp_path / "fleet"
    with fleetstore.open(url(directory)) as store:
        make_tree(store, "idle")
    writer = start(procs, BUSY_WRITER, url(directory))
    procs_dir = directory / "catalog.db.procs"
    deadline = time.monotonic() + 30
    while not (procs_dir / f"{writer.pid}.json").exists():
        assert time.monotonic() < deadline, "the writer never published"
        time.sleep(0.05)

    done = cli("top", str(directory), "--json", "--count", "1", "--interval", "0.3")

    assert done.returncode == 0, done.stderr
    frame = json.loads(done.stdout)
    assert frame["layout"] == "sharded" and frame["path"] == url(directory)
    assert frame["shards"]["on_disk"] == 3
    assert frame["shards"]["open"] >= 2  # the writer's two trees
    assert frame["files"]["db"] > 0
    (row,) = [p for p in frame["processes"] if p["pid"] == writer.pid]
    assert row["writes"] > 0 and row["writes_per_s"] > 0 and row["shards_open"] >= 2
    assert frame["writes_per_s"] > 0
    writer.kill()


# -- sessions and stats ----------------------------------------------------------------------


@pytest.mark.slow
def test_sessions_list_show_rm_and_stats_read_each_sessions_shard(tmp_path: Path) -> None:
    directory = tmp_path / "fleet"
    with fleetstore.open(url(directory)) as store:
        a = make_tree(store, "a", PAYLOAD)
        b = make_tree(store, "b", PAYLOAD)
        c = make_tree(store, "c")
    env = clean_env(FLEETSTORE_URL=str(directory))

    listed = cli("sessions", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    rows = {r["id"]: r for r in map(json.loads, listed.stdout.splitlines())}
    assert set(rows) == set(a + b + c)
    assert rows[a[0]]["messages"] == 2 and rows[a[1]]["messages"] == 1

    shown = cli("sessions", "show", b[0], "--summary", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    facts = json.loads(shown.stdout)
    assert facts["children"] == [b[1]] and sum(m["count"] for m in facts["messages"]) == 2
    assert facts["bytes"]["blobs"] == 1 and facts["bytes"]["blob_stored"] > 100_000

    stats = cli("stats", "--json", env=env)
    assert stats.returncode == 0, stats.stderr
    figures = json.loads(stats.stdout)
    assert figures["layout"] == "sharded" and figures["database_files"] == 4
    assert figures["counts"]["sessions"] == 6 and figures["counts"]["messages"] == 9
    per = {r["id"]: r for r in figures["sessions"]}
    assert per[a[0]]["blob_stored_bytes"] == per[b[0]]["blob_stored_bytes"] > 100_000
    assert per[c[0]]["blobs"] == 0 and per[c[0]]["messages"] == 2
    assert figures["blobs"]["rows"] == 1  # shared by two shards, counted once
    assert {r["id"] for r in figures["largest"][:2]} == {a[0], b[0]}

    removed = cli("sessions", "rm", a[0], "--yes", env=env)
    assert removed.returncode == 0, removed.stderr
    assert "removed 2 session(s), 3 message(s)" in removed.stdout
    after = cli("sessions", "list", "--json", env=env)
    assert {json.loads(r)["id"] for r in after.stdout.splitlines()} == set(b + c)
    with fleetstore.open(url(directory)) as store:
        assert store.sessions.get(b[1]).parent_id == b[0]
    assert shard_path(directory, a[0]).exists()  # empty now: maintain removes it later


@pytest.mark.slow
def test_commands_on_a_missing_sharded_store_exit_2_and_create_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "nothing"
    for args in (
        ["sessions", "list", "--store", url(directory)],
        ["top", url(directory), "--count", "1"],
        ["maintain", url(directory)],
        ["doctor", url(directory)],
    ):
        done = cli(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "nothing was created" in done.stderr or "no sharded store" in done.stderr
    assert not directory.exists()
