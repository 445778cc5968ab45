"""``fleetstore migrate SRC DST`` (fleetstore.transfer.migrate): whole stores copied between
SQLite and PostgreSQL in every direction, resumed after kill -9, verified.

Real stores (files under tmp_path, databases on the suite's throwaway PostgreSQL
server), real subprocesses for the command.  The test process reads SQLite stores
only through fleetstore (apsw), never the stdlib ``sqlite3``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore import File, Reasoning, Text, ToolCall, ToolResult
from fleetstore.core.ids import new_id
from fleetstore.domain.adk import adk_fs_id
from fleetstore.domain.langgraph import ChannelValue, Checkpoints, version_key
from fleetstore.domain.operations import Operation
from fleetstore.errors import AlreadyExists, BlobCorrupt, InvalidInput, NotFound
from fleetstore.store.facade import Store
from fleetstore.transfer import migrate
from fleetstore.transfer.migrate import schema, side, verification

#: Per-host state of the PostgreSQL stores (spool journals) under tmp_path.
pytestmark = pytest.mark.usefixtures("data_dir")

ROOT = Path(__file__).resolve().parents[2]
BLOB_THRESHOLD = 1024


@pytest.fixture
def pg_db(pg_server: Any) -> Iterator[Callable[[], str]]:
    """``pg_db()``: a new empty database on the test server (dropped at the end)."""
    made: list[str] = []

    def _make() -> str:
        url = str(pg_server.create_database("mig"))
        made.append(url)
        return url

    yield _make
    for url in made:
        pg_server.drop_database(url.rsplit("/", 1)[1])


def target(kind: str, tmp_path: Path, pg_db: Callable[[], str], name: str) -> str:
    return str(tmp_path / f"{name}.db") if kind == "sqlite" else pg_db()


def opened(url: str, **settings: Any) -> Store:
    return fleetstore.open(url, blob_threshold=BLOB_THRESHOLD, **settings)


# -- a store holding a bit of everything -----------------------------------------------------


def fill(store: Store, *, messages: int = 30, blobs: int = 0) -> dict[str, str]:
    """Session trees (a subagent whose id sorts before its parent's), a fork, an archived
    session; every part kind, inline and as blobs, a streamed message, usage; state
    of both encodings; effects in every state with a declared kind; graph
    checkpoints with channel values and pending writes; an ADK session with app and
    user state."""
    root = store.sessions.create(title="fix flaky test", project="/src/app", metadata={"ü": 1})
    # Ids are time ordered, so a child normally sorts after its parent; this one does
    # not, so the copy must not rely on key order for parents.
    early = store.sessions.create(parent_id=root.id, title="sub", id="00000000-early-child")
    store.sessions.create(parent_id=early.id, title="sub-sub")
    user = store.messages.append(root.id, "user", "why does it flake? ✓ \\x00 'q' 100%")
    store.messages.append(
        root.id,
        "assistant",
        [
            Text("inline"),
            Reasoning("because"),
            ToolCall("bash", {"cmd": "pytest -x"}, call_id="c1"),
            ToolResult("c1", b"\x00\x01\\binary" * 10, is_error=True, name="bash"),
            ToolResult("c2", "x" * 5000, name="read"),  # a blob
            File(os.urandom(3000), "image/png", "shot.png"),  # a blob of bytes
        ],
        model="m-1",
        usage={"input_tokens": 10, "output_tokens": 3, "cost": 0.25},
    )
    with store.messages.stream(root.id, model="m-2") as reply:
        for i in range(20):
            reply.text(f"delta {i} ")
        reply.tool_call("grep", {"pattern": "flaky"}).result("match\n" * 1000)
        reply.usage(input_tokens=1200, output_tokens=310)
    for i in range(messages):
        store.messages.append(early.id, "user" if i % 2 else "assistant", f"m{i}")
    fork = store.sessions.fork(root.id, at_message_id=user.id, title="the fork")
    store.messages.append(fork.id, "user", "another way")
    old = store.sessions.create(title="old")
    store.sessions.archive(old.id)
    store.state.put(root.id, "cursor", {"seq": 3, "ünï": "côdé"})
    store.state.put(root.id, "cursor", {"seq": 4})
    store.state.put(root.id, "snapshot", b"\x00" * 4000, namespace="agent")  # a blob
    store.state.put(early.id, "raw", b"\x01\\\x02")
    for i in range(blobs):
        store.state.put(early.id, f"blob-{i}", os.urandom(BLOB_THRESHOLD + i))
    store.effects.declare({"title.generate": True, "provider.turn": False})
    done = store.effects.enqueue(root.id, "title.generate", {"n": 1})
    store.effects.enqueue(root.id, "title.generate", b"\x00bytes")
    store.effects.enqueue(early.id, "provider.turn", {"big": "y" * 3000}, idempotency_key="k1")
    (claim,) = store.effects.claim("worker-1", kinds=["title.generate"])
    assert claim.id == done
    claim.succeed({"title": "flaky"})
    store.effects.claim("worker-2", kinds=["provider.turn"])  # left running
    cancelled = store.effects.enqueue("other-thread", "title.generate", None)
    store.effects.cancel(cancelled)
    ckpt = Checkpoints(store)
    ckpt.put(
        "graph-1",
        "",
        "c1",
        parent_id=None,
        body=("json", b'{"v": 1}'),
        metadata={"step": 1, "run_id": "r1"},
        channel_versions={"messages": 1},
        values=[ChannelValue("messages", version_key(1), ("msgpack", b"\x93\x01\x02" * 700))],
    )
    ckpt.put(
        "graph-1",
        "",
        "c2",
        parent_id="c1",
        body=("json", b'{"v": 2}'),
        metadata={"step": 2},
        channel_versions={"messages": 2},
        values=[ChannelValue("messages", version_key(2), ("json", b"[1, 2]"))],
    )
    ckpt.put_writes("graph-1", "", "c2", "task-1", [(0, "messages", ("json", b"3"))])
    fs_id = adk_fs_id("app", "user-1", "s1")
    store.submit(
        Operation(
            "adk_create_session",
            {
                "session_id": fs_id,
                "app_name": "app",
                "user_id": "user-1",
                "adk_session_id": "s1",
                "revision": new_id(),
                "created_at": time.time(),
                "state": {
                    "session": {"k": {"enc": "json", "body": '"v"'}},
                    "app": {"theme": {"enc": "json", "body": '{"dark": true}'}},
                    "user": {"name": {"enc": "json", "body": '"ada \\\\ lovelace"'}},
                },
            },
            new_id(),
        )
    )
    return {"root": root.id, "early": early.id, "fork": fork.id}


def schema_tables(store: Store) -> list[schema.Table]:
    return list(schema._read_schema(store).values())


def catalog_tables(store: Store) -> set[str]:
    """Every table of the store, straight from the catalog."""
    sql = (
        "SELECT name FROM sqlite_master WHERE type = 'table'"
        if store.dialect == "sqlite"
        else "SELECT table_name FROM information_schema.tables "
        "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
    )
    return {str(r[0]) for r in store.db.read(lambda tx: tx.execute(sql))}


def dump(store: Store) -> dict[str, list[bytes]]:
    """Every copied table, each row in the canonical encoding migrate hashes (the
    form SQLite keeps: text payloads as text), in key order."""
    out: dict[str, list[bytes]] = {}
    for table in schema_tables(store):
        rows: list[bytes] = []
        reader = side._Reader(store, table, binary=True)
        for page in reader.rows(1000):
            rows.extend(
                verification.encode_row(schema._normal(table, r), table.kinds) for r in page
            )
        out[table.name] = rows
    return out


def api_view(store: Store, ids: dict[str, str]) -> dict[str, Any]:
    """What the API returns for the filled store: sessions, messages (parts decoded,
    blobs read), state, effects, checkpoints."""
    out: dict[str, Any] = {}
    for s in store.sessions.list(include_archived=True, limit=1000):
        out[s.id] = (
            s,
            store.messages.list(s.id),
            {k: store.state.get(s.id, k) for k in store.state.keys(s.id)},
            {
                k: store.state.get(s.id, k, namespace="agent")
                for k in store.state.keys(s.id, namespace="agent")
            },
        )
    out["effects"] = store.effects.list(limit=1000)
    out["kinds"] = store.effects.kinds()
    ckpt = Checkpoints(store)
    out["checkpoints"] = [ckpt.get("graph-1", "", c) for c in ("c1", "c2")]
    return out


def count(store: Store, table: str) -> int:
    return int(store.db.read(lambda tx: tx.execute(f"SELECT count(*) FROM {table}"))[0][0])


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``fleetstore migrate ARGS`` in a subprocess (the command run on its own, so the
    test does not depend on where it is registered)."""
    code = "from fleetstore.cli.migrate import migrate_command; migrate_command()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or dict(os.environ),
    )


# -- copies ----------------------------------------------------------------------------------


DIRECTIONS = [
    ("sqlite", "sqlite"),
    ("sqlite", "postgresql"),
    ("postgresql", "sqlite"),
    ("postgresql", "postgresql"),
]


@pytest.mark.parametrize(("src_kind", "dst_kind"), DIRECTIONS, ids=lambda k: k)
def test_copy_is_exact_in_every_direction(
    src_kind: str, dst_kind: str, tmp_path: Path, pg_db: Callable[[], str]
) -> None:
    src = target(src_kind, tmp_path, pg_db, "src")
    dst = target(dst_kind, tmp_path, pg_db, "dst")
    with opened(src) as s:
        ids = fill(s)
        before = dump(s)
        view = api_view(s, ids)
    seen: list[tuple[str, int, int]] = []
    report = migrate.migrate(src, dst, batch_rows=7, progress=lambda *a: seen.append(a))
    assert report.ok and report.verified and not report.problems
    assert not report.resumed
    assert report.src_schema == report.dst_schema > 0
    assert report.blobs_copied == report.blobs_verified == len(before["blobs"]) >= 4
    with opened(dst) as d:
        assert dump(d) == before
        assert api_view(d, ids) == view
        # Every table of the schema was copied (a table added by a later migration
        # is found in the catalog, or this fails), and every one held rows here.
        # The search index is not copied: DST's triggers queued what was copied, and
        # its indexer builds the index from it.
        d.search.catch_up()
        assert ids["root"] in {h.session_id for h in d.search("flake")}
        copied = {n for n in catalog_tables(d) if not n.startswith(schema.DERIVED_PREFIX)}
        assert {t.name for t in report.tables} == copied - schema.NOT_COPIED
        empty = {t.name for t in report.tables if t.rows == 0}
        assert empty == set(), f"fill() leaves these tables empty: {empty}"
        for t in report.tables:
            assert t.copied == t.rows == count(d, t.name) and t.verified
    parts = len(before["parts"])
    assert ("copy parts", 7, parts) in seen and ("copy parts", parts, parts) in seen
    assert ("verify parts (DST)", parts, parts) in seen
    assert migrate.verify(src, dst) == []
    assert {
        "fleetstore_migrations",
        "fleetstore_migrate",
        "blob_chunks",
        "shard_sessions",
        "shard_intents",
    } == schema.NOT_COPIED


def test_round_trip_sqlite_postgresql_sqlite_is_identical(
    tmp_path: Path, pg_db: Callable[[], str]
) -> None:
    src, pg, back = str(tmp_path / "a.db"), pg_db(), str(tmp_path / "b.db")
    with opened(src) as s:
        ids = fill(s)
    migrate.migrate(src, pg)
    migrate.migrate(pg, back)
    with opened(src) as a, opened(back) as b:
        # Raw rows, Python types included (a text body stays text, bytes stay bytes).
        for table in schema_tables(a):
            cols = ", ".join(table.columns)
            keys = ", ".join(table.key)
            sql = f"SELECT {cols} FROM {table.name} ORDER BY {keys}"
            rows_a = a.db.read(lambda tx, sql=sql: tx.execute(sql))
            rows_b = b.db.read(lambda tx, sql=sql: tx.execute(sql))
            assert rows_a == rows_b, table.name
        assert api_view(a, ids) == api_view(b, ids)


# -- refusals --------------------------------------------------------------------------------


def test_a_destination_with_other_data_is_refused_and_left_alone(tmp_path: Path) -> None:
    src, dst = str(tmp_path / "src.db"), str(tmp_path / "dst.db")
    with opened(src) as s:
        fill(s, messages=2)
    with opened(dst) as d:
        d.sessions.create(title="already here")
        tables_before = d.db.read(lambda tx: tx.execute("SELECT name FROM sqlite_master"))
    with pytest.raises(migrate.DestinationNotEmpty) as caught:
        migrate.migrate(src, dst)
    assert isinstance(caught.value, AlreadyExists)
    assert "sessions" in str(caught.value)
    with opened(dst) as d:
        assert d.db.read(lambda tx: tx.execute("SELECT name FROM sqlite_master")) == tables_before
        assert count(d, "sessions") == 1
    done = cli(src, dst)
    assert done.returncode == 2, done.stderr
    assert "already holds data" in done.stderr


def test_a_destination_holding_a_migrate_of_another_store_is_refused(tmp_path: Path) -> None:
    a, b, dst = (str(tmp_path / n) for n in ("a.db", "b.db", "dst.db"))
    for path in (a, b):
        with opened(path) as s:
            s.sessions.create(title=path)
    migrate.migrate(a, dst)
    with pytest.raises(migrate.DestinationNotEmpty, match="another store"):
        migrate.migrate(b, dst)


def test_same_store_and_missing_source_are_refused(tmp_path: Path) -> None:
    src = tmp_path / "src.db"
    with opened(str(src)) as s:
        s.sessions.create()
    for dst in (str(src), f"sqlite://{src}", str(tmp_path)):
        if dst == str(tmp_path):
            (tmp_path / "fleetstore.db").symlink_to(src)
        with pytest.raises(InvalidInput, match="same store"):
            migrate.migrate(str(src), dst)
    missing = tmp_path / "absent.db"
    with pytest.raises(NotFound):
        migrate.migrate(str(missing), str(tmp_path / "out.db"))
    assert not missing.exists() and not (tmp_path / "out.db").exists()
    done = cli(str(missing), str(tmp_path / "out.db"))
    assert done.returncode == 2 and "no store at" in done.stderr
    assert not (tmp_path / "out.db").exists()
    done = cli(str(src), str(src))
    assert done.returncode == 2 and "same store" in done.stderr


def test_schemas_that_differ_are_refused_before_anything_is_copied(tmp_path: Path) -> None:
    src, dst = str(tmp_path / "src.db"), str(tmp_path / "dst.db")
    with opened(src) as s:
        s.sessions.create()
        with s.db.write() as tx:
            tx.execute("CREATE TABLE notes (id TEXT PRIMARY KEY, body TEXT)")
            tx.execute("INSERT INTO notes VALUES ('n1', 'kept')")
    with pytest.raises(migrate.SchemaMismatch, match="table notes is in SRC"):
        migrate.migrate(src, dst)
    with opened(dst) as d:
        assert count(d, "sessions") == 0
        # The same table in both: found in the catalog and copied like any other.
        with d.db.write() as tx:
            tx.execute("CREATE TABLE notes (id TEXT PRIMARY KEY, body TEXT)")
    report = migrate.migrate(src, dst)
    assert {t.name: t.rows for t in report.tables}["notes"] == 1
    with opened(dst) as d:
        assert d.db.read(lambda tx: tx.execute("SELECT * FROM notes")) == [("n1", "kept")]


# -- resuming --------------------------------------------------------------------------------


def progress_items(url: str) -> dict[str, Any]:
    """The destination's progress record, read by another client (empty until it exists)."""
    try:
        if "://" not in url and not Path(url).exists():
            return {}
        if "://" in url:
            import psycopg

            with psycopg.connect(url, autocommit=True) as conn:
                rows = conn.execute("SELECT item, value FROM fleetstore_migrate").fetchall()
        else:
            db = fleetstore.Database.open(url)
            try:
                rows = db.read(lambda tx: tx.execute("SELECT item, value FROM fleetstore_migrate"))
            finally:
                db.close()
    except Exception:
        return {}
    return {
        str(k): (json.loads(v) if str(k).startswith(("table:", "links:")) else v) for k, v in rows
    }


@pytest.mark.parametrize(
    ("dst_kind", "table"),
    [
        ("sqlite", "messages"),
        ("postgresql", "messages"),
        ("sqlite", "blobs"),
        ("postgresql", "blobs"),
    ],
)
def test_killed_mid_copy_it_resumes_where_it_stopped(
    dst_kind: str, table: str, tmp_path: Path, pg_db: Callable[[], str]
) -> None:
    src = str(tmp_path / "src.db")
    dst = target(dst_kind, tmp_path, pg_db, "dst")
    with opened(src) as s:
        ids = fill(
            s, messages=600 if table == "messages" else 10, blobs=150 if table == "blobs" else 0
        )
        before = dump(s)
        view = api_view(s, ids)
    code = "from fleetstore.cli.migrate import migrate_command; migrate_command()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, src, dst, "--batch-rows", "5"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
    )
    item = f"table:{table}"
    killed_at: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            items = progress_items(dst)
            # Kill it in the middle of a big table, not between tables.
            if items.get(item) and items[item]["rows"] > 0 and not items[item]["done"]:
                os.kill(proc.pid, signal.SIGKILL)
                killed_at = items
                break
            time.sleep(0.005)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert killed_at, f"the copy ended before it could be killed: {err.decode()}"
    assert proc.returncode == -signal.SIGKILL
    # What the killed run had committed is exactly what its record says.
    with opened(dst) as d:
        committed = progress_items(dst)[item]["rows"]
        assert count(d, table) == committed >= killed_at[item]["rows"]
        if table == "blobs":  # each row's payload went first
            shas = d.db.read(lambda tx: tx.execute("SELECT sha256 FROM blobs"))
            assert all(d.blobs.verify(str(sha)) for (sha,) in shas)
    report = migrate.migrate(src, dst, batch_rows=50)
    assert report.resumed and report.ok
    copied = {t.name: t.copied for t in report.tables}
    rows = {t.name: t.rows for t in report.tables}
    # It carried on: the tables finished before the kill were not copied again, and
    # this one only from where the record said.
    done_before = [t.name for t in report.tables][: [t.name for t in report.tables].index(table)]
    assert done_before and all(copied[name] == 0 for name in done_before)
    assert copied[table] == rows[table] - committed
    assert sum(copied.values()) < sum(rows.values())
    with opened(dst) as d:
        assert dump(d) == before
        assert api_view(d, ids) == view
    # Run once more: nothing left to copy, verified again.
    again = migrate.migrate(src, dst)
    assert again.ok and again.resumed and sum(t.copied for t in again.tables) == 0


def test_two_migrates_into_one_destination_at_once_end_with_one_exact_copy(
    tmp_path: Path,
) -> None:
    src, dst = str(tmp_path / "src.db"), str(tmp_path / "dst.db")
    with opened(src) as s:
        fill(s, messages=300)
        before = dump(s)
    code = "from fleetstore.cli.migrate import migrate_command; migrate_command()"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, src, dst, "--batch-rows", "5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
    # Each batch moves the progress record from what that run last saw: the run
    # that finds it moved stops, loudly; the other finishes and verifies.
    assert 0 in [code for code, _ in results], results
    for code, err in results:
        assert code == 0 or (code == 1 and "another migrate is writing to it" in err), err
    with opened(dst) as d:
        assert dump(d) == before
    assert migrate.verify(src, dst) == []


# -- verification ----------------------------------------------------------------------------


def damage_blob(store: Store, sha: str) -> None:
    if store.dialect == "sqlite":
        path = store.blobs.path(sha)  # type: ignore[union-attr]
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        store.db.run_write(
            lambda tx: tx.execute(
                "UPDATE blob_chunks SET data = decode('00', 'hex') || data WHERE sha256 = ?",
                (sha,),
            )
        )


@pytest.mark.parametrize("dst_kind", ["sqlite", "postgresql"])
def test_verification_names_a_changed_row_and_a_damaged_blob(
    dst_kind: str, tmp_path: Path, pg_db: Callable[[], str]
) -> None:
    src = str(tmp_path / "src.db")
    dst = target(dst_kind, tmp_path, pg_db, "dst")
    with opened(src) as s:
        ids = fill(s, messages=3)
    assert migrate.migrate(src, dst).ok
    with opened(dst) as d:
        mid = d.messages.list(ids["early"])[1].id
        d.db.run_write(
            lambda tx: tx.execute("UPDATE messages SET model = 'changed' WHERE id = ?", (mid,))
        )
        sha = str(d.db.read(lambda tx: tx.execute("SELECT min(sha256) FROM blobs"))[0][0])
        damage_blob(d, sha)
    problems = migrate.verify(src, dst)
    assert len(problems) == 2, problems
    assert problems[0].startswith("table messages:") and "contents differ" in problems[0]
    assert problems[1].startswith(f"blob {sha}: missing or damaged in DST")
    done = cli(src, dst, "--verify-only")
    assert done.returncode == 1
    assert "MISMATCH: table messages" in done.stderr and sha in done.stderr
    # A re-run of the migrate itself refuses to call the copy good.
    with pytest.raises(migrate.VerificationFailed) as caught:
        migrate.migrate(src, dst)
    assert caught.value.problems == problems
    # A deleted row: the counts are named.
    with opened(dst) as d:
        d.db.run_write(lambda tx: tx.execute("DELETE FROM usage"))
    problems = migrate.verify(src, dst)
    assert any(p.startswith("table usage: 2 rows in SRC, 0 in DST") for p in problems), problems


def test_a_damaged_blob_in_the_source_stops_the_copy_by_name(tmp_path: Path) -> None:
    src, dst = str(tmp_path / "src.db"), str(tmp_path / "dst.db")
    with opened(src) as s:
        fill(s, messages=1)
        sha = str(s.db.read(lambda tx: tx.execute("SELECT max(sha256) FROM blobs"))[0][0])
        damage_blob(s, sha)
    with pytest.raises(BlobCorrupt, match=sha):
        migrate.migrate(src, dst)
    with opened(dst) as d:
        rows = d.db.read(lambda tx: tx.execute("SELECT 1 FROM blobs WHERE sha256 = ?", (sha,)))
        assert rows == [] and not d.blobs.exists(sha)
    done = cli(src, dst)
    assert done.returncode == 1 and sha in done.stderr


def test_cli_json_report_and_rerun(tmp_path: Path) -> None:
    src, dst = str(tmp_path / "src.db"), str(tmp_path / "dst.db")
    with opened(src) as s:
        fill(s, messages=3)
    done = cli(src, f"sqlite://{dst}", "--json", "--batch-rows", "3")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["verified"] and report["src_dialect"] == "sqlite"
    assert all(t["verified"] and t["copied"] == t["rows"] for t in report["tables"])
    again = cli(src, dst)
    assert again.returncode == 0, again.stderr
    assert "verified:" in again.stdout and "[resumed]" in again.stdout
    only = cli(src, dst, "--verify-only", env={**os.environ, "FLEETSTORE_MIGRATE_JSON": "1"})
    assert only.returncode == 0 and json.loads(only.stdout)["copied"] is False
    assert cli(src, str(tmp_path / "absent.db"), "--verify-only").returncode == 2


def test_the_canonical_encoding_tells_types_apart() -> None:
    kinds = ("integer", "real", "text", "blob")
    enc = verification.encode_row
    assert enc((1, 2, "a", b"b"), kinds) == enc((1, 2.0, "a", b"b"), kinds)  # a real is a real
    assert enc((1, 2.0, "a", b"b"), kinds) != enc((1, 2.0, "a", "b"), kinds)
    assert enc((1, 2.0, "ab", b""), kinds) != enc((1, 2.0, "a", b"b"), kinds)
    assert enc((None, 2.0, "", b""), kinds) != enc((0, 2.0, "", b""), kinds)
    assert enc(("1", 2.0, "", b""), kinds) != enc((1, 2.0, "", b""), kinds)
