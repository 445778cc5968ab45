"""The sharded layout's routing: which file each write lands in (a shard key names a
file in shards/ whatever the id), the bounded cache of open shards, store-wide
session ids, a moved shard file, a catalog+shard write that stopped half-way in a
live process or failed.  (Crashes and fleets: test_sharded.py.)"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fleetstore
from fleetstore import NewEffect, Operation, Store, errors
from fleetstore.core.ids import is_valid_id
from fleetstore.core.validate import check_id
from fleetstore.engine.gate import announce_moved
from fleetstore.engine.sqlite import IDENTITY_EVERY, Database
from fleetstore.store.sharded import router as sharding
from fleetstore.store.sharded.shards import is_key, shard_files, shard_key, shard_path
from fleetstore.store.spool import encode_line
from tests.fix_stores import read_everywhere


def sharded(tmp_path: Path, **settings: Any) -> Store:
    return fleetstore.open(f"sqlite+sharded://{tmp_path / 'st'}", **settings)


def shard_rows(store: Store, key: str, sql: str) -> list[tuple[Any, ...]]:
    assert store.router is not None
    with store.router.shards.use(key, create=False) as db:
        return [tuple(r) for r in db.read(lambda tx: tx.execute(sql))]


def test_each_tree_is_one_file_and_the_catalog_holds_the_index(tmp_path: Path) -> None:
    with sharded(tmp_path) as store:
        assert store.layout == "sharded" and store.router is not None
        a = store.sessions.create("a")
        sub = store.sessions.create("sub", parent_id=a.id)
        fork = store.sessions.fork(a.id, title="fork")
        b = store.sessions.create("b")
        store.messages.append(sub.id, "user", "in a's tree")
        store.messages.append(b.id, "user", "in b's tree")
        assert store.router.shards.keys() == sorted([shard_key(a.id), shard_key(b.id)])
        in_a = {r[0] for r in shard_rows(store, shard_key(a.id), "SELECT id FROM sessions")}
        assert in_a == {a.id, sub.id, fork.id}
        assert shard_rows(store, shard_key(b.id), "SELECT count(*) FROM messages") == [(1,)]
        # The catalog has no history rows, only the index of every session.
        catalog = store.db.read(lambda tx: tx.execute("SELECT count(*) FROM messages"))
        assert catalog == [(0,)]
        listed = {s.id for s in store.sessions.list(limit=10)}
        assert listed == {a.id, sub.id, fork.id, b.id}
        assert [s.id for s in store.sessions.children(a.id)] == [sub.id]


def test_session_ids_are_unique_across_trees(tmp_path: Path) -> None:
    with sharded(tmp_path) as store:
        a = store.sessions.create("a")
        b = store.sessions.create("b")
        before = read_everywhere(store, "SELECT count(*) FROM sessions")
        with pytest.raises(errors.AlreadyExists):
            store.sessions.create("sub of b", parent_id=b.id, id=a.id)
        with pytest.raises(errors.AlreadyExists):
            store.sessions.fork(b.id, id=a.id)
        assert read_everywhere(store, "SELECT count(*) FROM sessions") == before
        # The same create again is a retry, not a clash.
        assert store.sessions.create("a", id=a.id).id == a.id


def test_a_refused_first_write_of_a_tree_leaves_no_file(tmp_path: Path) -> None:
    with sharded(tmp_path) as store:
        assert store.router is not None
        with pytest.raises(errors.InvalidInput):
            store.sessions.create("x", metadata={"bad": float("nan")})
        with pytest.raises(errors.NotFound):
            store.sessions.create("orphan", parent_id="no-such-session")
        assert store.router.shards.keys() == []
        assert store.db.read(lambda tx: tx.execute("SELECT count(*) FROM shard_intents")) == [(0,)]


def test_messages_get_finds_a_message_in_any_shard(tmp_path: Path) -> None:
    with sharded(tmp_path) as store:
        ids = []
        for i in range(3):
            s = store.sessions.create(f"s{i}")
            ids.append(store.messages.append(s.id, "user", f"m{i}").id)
        assert [store.messages.get(m).text for m in ids] == ["m0", "m1", "m2"]
        with pytest.raises(errors.NotFound):
            store.messages.get("no-such-message")


def test_the_listing_catches_up_with_writes_of_another_process(tmp_path: Path) -> None:
    with sharded(tmp_path) as one, sharded(tmp_path) as two:
        s = one.sessions.create("s")
        created = one.sessions.get(s.id).updated_at
        two.messages.append(s.id, "user", "later")
        exact = two.sessions.get(s.id).updated_at
        assert exact > created  # read from the shard: exact at once
        two.sync_catalog()  # what its background refresh does within a second
        (listed,) = one.sessions.list()
        assert listed.updated_at == exact


def test_open_shards_stay_within_the_bound(tmp_path: Path) -> None:
    with sharded(tmp_path, max_open_shards=2) as store:
        assert store.router is not None
        sessions = [store.sessions.create(f"s{i}") for i in range(5)]
        for s in sessions:
            store.messages.append(s.id, "user", "x")
            assert store.router.shards.open_count() <= 2
        assert [len(store.messages.list(s.id)) for s in sessions] == [1] * 5
        assert store.router.shards.open_count() <= 2
        assert store.metrics()["shards_opened"] >= 5


def test_a_moved_shard_is_never_written_and_its_sessions_are_gone(tmp_path: Path) -> None:
    with sharded(tmp_path) as store:
        assert store.router is not None
        a = store.sessions.create("a")
        store.messages.append(a.id, "user", "before")
        key = shard_key(a.id)
        path = store.router.shards.path_of(key)
        store.db.checkpoint(truncate=True)
        with store.router.shards.use(key) as db:
            db.checkpoint(truncate=True)
        moved = tmp_path / "moved.db"
        shutil.move(path, moved)
        announce_moved(f"{path}.gate")  # as archiving a tree does after the move
        # the tree leaves the catalog's index (what archiving a tree does after the move)
        with store.db.write() as tx:
            tx.execute("DELETE FROM shard_sessions WHERE session_id = ?", (a.id,))
            tx.execute("DELETE FROM sessions WHERE id = ?", (a.id,))
        with pytest.raises(errors.NotFound):
            store.messages.append(a.id, "user", "after")
        with pytest.raises(errors.NotFound):
            store.messages.list(a.id)
        # The moved file has only what was written before the move.
        db = Database.open(moved)
        try:
            assert db.read(lambda tx: tx.execute("SELECT count(*) FROM messages")) == [(1,)]
        finally:
            db.close()


def test_a_database_refuses_to_write_a_file_that_was_moved(tmp_path: Path) -> None:
    db = Database.open(tmp_path / "a.db", [])
    try:
        with db.write() as tx:
            tx.execute("CREATE TABLE t(v)")
        db.checkpoint(truncate=True)
        os.rename(tmp_path / "a.db", tmp_path / "b.db")
        # Moved by hand (nothing announced it in the gate file): seen within
        # IDENTITY_EVERY (an os.stat per write and read was a tenth of a write's cost).
        time.sleep(IDENTITY_EVERY * 1.5)
        with pytest.raises(errors.FileMoved), db.write() as tx:
            tx.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(errors.FileMoved):
            db.read(lambda tx: tx.execute("SELECT 1"))
    finally:
        db.close()
    other = Database.open(tmp_path / "b.db", [])
    try:
        assert other.read(lambda tx: tx.execute("SELECT count(*) FROM t")) == [(0,)]
    finally:
        other.close()


def test_an_intent_left_by_a_busy_catalog_is_finished_by_the_same_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shard part commits, then the catalog stays locked past the budget: the
    caller gets StoreBusy, and this live process finishes the write later (the
    session is indexed, its effect enqueued once)."""
    # The background refresh would finish it within a second; here the test does.
    monkeypatch.setattr(sharding, "_SYNC_INTERVAL", 3600.0)
    with sharded(tmp_path, write_budget=0.3, on_busy="raise") as store:
        assert store.router is not None
        router = store.router
        s = store.sessions.create("s")
        real = router._catalog_part
        calls = 0

        def busy_once(*args: Any) -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise errors.StoreBusy(str(store.path), 0.3, 1)
            real(*args)

        router._catalog_part = busy_once  # type: ignore[method-assign]
        with pytest.raises(errors.StoreBusy):
            store.messages.append(s.id, "user", "hi", effects=[NewEffect("t", "k")])
        pending = store.db.read(lambda tx: tx.execute("SELECT count(*) FROM shard_intents"))
        assert pending == [(1,)]
        assert router.recover() == 0  # its owner is alive: not another process's to finish
        assert router.recover(own=True) == 1
        assert [e.kind for e in store.effects.list(thread_key="t")] == ["k"]
        assert [m.text for m in store.messages.list(s.id)] == ["hi"]
        assert router.recover(own=True) == 0


def test_lock_cli_holds_the_catalog_and_every_shard(tmp_path: Path) -> None:
    import subprocess
    import sys

    with sharded(tmp_path, write_budget=0.3, on_busy="raise") as store:
        s = store.sessions.create("s")
        store.messages.append(s.id, "user", "x")
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetstore", "lock", "--store", store.url, "--hold", "30"],
            stdout=subprocess.PIPE,
            text=True,
        )
        with proc:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith(f"locked {store.url} ")
            with pytest.raises(errors.StoreBusy):
                store.messages.append(s.id, "user", "shard write")
            with pytest.raises(errors.StoreBusy):
                store.effects.enqueue("t", "catalog write")
            proc.terminate()
            assert proc.wait(30) == 0
        store.messages.append(s.id, "user", "after")
        assert [m.text for m in store.messages.list(s.id)] == ["x", "after"]


def test_reindex_puts_a_shard_file_back_into_the_catalog(tmp_path: Path) -> None:
    with sharded(tmp_path) as store:
        assert store.router is not None
        a = store.sessions.create("a")
        sub = store.sessions.create("sub", parent_id=a.id)
        with store.db.write() as tx:  # the index lost, as if the file came from elsewhere
            tx.execute("DELETE FROM shard_sessions")
            tx.execute("DELETE FROM sessions")
        assert store.sessions.list() == []
        assert store.router.reindex() == 1
        assert {s.id for s in store.sessions.list()} == {a.id, sub.id}
        assert store.router.home(sub.id, fresh=True) == shard_key(a.id)


@pytest.mark.timeout(40)
def test_a_listing_does_not_wait_out_a_locked_catalog(tmp_path: Path) -> None:
    """The index refresh a listing asks for is a write: with the catalog locked from
    outside it must not hold the listing for the write budget (60 s here, past this
    test's timeout); the listing returns what the index has."""
    import apsw

    with sharded(tmp_path) as store:
        s = store.sessions.create("s")
        outside = apsw.Connection(str(store.path))  # the catalog only, not the shards
        outside.execute("BEGIN IMMEDIATE")
        try:
            store.messages.append(s.id, "user", "a write to the shard only")
            assert [x.id for x in store.sessions.list()] == [s.id]
            assert store.sync_catalog(timeout=0.2) is False  # still locked: not refreshed
        finally:
            outside.execute("ROLLBACK")
            outside.close()
        assert store.sync_catalog(timeout=30) is True
        assert store.sessions.list()[0].updated_at == store.sessions.get(s.id).updated_at


# -- shard keys: a file in shards/, whatever the id (issue 23, cause 8) ---------------------

#: The key rule before issue 23, kept here to prove no key it gave a file is renamed.
_OLD_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def _old_key_was_name(name: str) -> bool:
    return bool(_OLD_SAFE.fullmatch(name)) and not name.endswith((".db", "-wal", "-shm"))


#: Ids as they come: any printable text, and names made of the characters a key may
#: hold (so that dots at either end, "..", "." and near-keys are drawn often).
_IDS = st.one_of(
    st.text(alphabet="aZ09._-", min_size=1, max_size=8),
    st.text(alphabet="aZ09._-", min_size=95, max_size=105),
    st.text(min_size=1, max_size=128),
).filter(is_valid_id)


@settings(max_examples=400, deadline=None)
@given(_IDS)
def test_a_shard_key_names_a_plain_file_in_its_own_directory_of_shards(name: str) -> None:
    assert check_id(name, "id") == name
    key = shard_key(name)
    assert is_key(key) and shard_key(key) == key
    if _old_key_was_name(name) and not name.endswith(".."):
        assert key == name  # a store's existing files keep their names
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = shard_path(root, key)
        directory = path.parent
        assert directory.parent == root / "shards" and directory.name == key[-2:]
        assert directory.name not in (".", "..") and not path.name.startswith(".")
        assert path.name == f"{key}.db" and os.path.normpath(path) == str(path)
        # On disk: the file is where its path says, and the listing every tool uses
        # (stats, doctor, maintain, reshard, top) finds it.
        directory.mkdir(parents=True)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        assert os.path.realpath(path).startswith(os.path.realpath(root / "shards") + os.sep)
        assert shard_files(root) == [(key, path)]
        assert sorted(os.listdir(root)) == ["shards"]


_ODD_IDS = ["Ab", "x..", "..", "...", "0..", "a.", "-..-", "..x"]


def test_ids_ending_in_dots_keep_their_trees_in_shards_and_every_tool_sees_them(
    tmp_path: Path,
) -> None:
    """Issue 23: "x.." made shards/../x...db (the store's own directory); stats,
    doctor and maintain missed the file and reshard failed."""
    from fleetstore.admin import doctor
    from fleetstore.admin.maintain.config import Config
    from fleetstore.admin.maintain.run import maintain
    from fleetstore.admin.stats import store_stats
    from fleetstore.transfer import reshard

    directory = tmp_path / "st"
    with sharded(tmp_path) as store:
        for sid in _ODD_IDS:
            store.sessions.create(sid, id=sid)
            store.messages.append(sid, "user", f"in {sid}")
        keys = sorted(shard_key(sid) for sid in _ODD_IDS)
        assert store.router is not None and store.router.shards.keys() == keys
        figures = store_stats(store, 10)
        assert figures["database_files"] == 1 + len(_ODD_IDS)
        assert figures["counts"]["messages"] == len(_ODD_IDS)
    made = {str(p.relative_to(directory)) for p in directory.rglob("*.db")}
    assert made == {"catalog.db"} | {f"shards/{k[-2:]}/{k}.db" for k in keys}
    report = doctor.diagnose(f"sqlite+sharded://{directory}", interval=0)
    section = report.data["sharded"]
    assert section["shard_files"] == len(_ODD_IDS)
    assert section["missing"] == [] and section["orphans"] == []
    done = maintain(Config(f"sqlite+sharded://{directory}", yes=True))
    (checkpoint,) = [s for s in done.steps if s.name == "checkpoint"]
    assert sum(checkpoint.detail["files_by_status"].values()) == 1 + len(_ODD_IDS)
    assert reshard.reshard(f"sqlite+sharded://{directory}", tmp_path / "one.db").ok
    assert reshard.reshard(tmp_path / "one.db", tmp_path / "again").ok
    with fleetstore.open(f"sqlite+sharded://{tmp_path / 'again'}") as again:
        for sid in _ODD_IDS:
            assert [m.text for m in again.messages.list(sid)] == [f"in {sid}"]


def test_a_catalog_row_naming_no_shard_key_is_shown_by_doctor_and_dropped_by_open(
    tmp_path: Path,
) -> None:
    """What the old rule left in a catalog when shards/ did not exist yet: create("x..")
    raised, its reservation and intent stayed.  Doctor names it with the place the old
    rule gave its file; the next open drops both, and the id can be used again."""
    from fleetstore.admin import doctor

    with sharded(tmp_path) as store:
        op = Operation("create_session", {"id": "x..", "title": "t", "metadata": {}}, "op-1")
        text = encode_line(op).decode()
        with store.db.write() as tx:  # as a process that died left them
            tx.execute("INSERT INTO shard_sessions VALUES ('x..', 'x..')")
            tx.execute("INSERT INTO shard_intents VALUES ('op-1', 'x..', ?, '1:1', 0)", (text,))
    report = doctor.diagnose(f"sqlite+sharded://{tmp_path / 'st'}", interval=0)
    old_place = str(tmp_path / "st" / "x...db")
    assert report.data["sharded"]["missing"] == [{"key": "x..", "path": old_place, "sessions": 1}]
    with sharded(tmp_path) as store:
        assert store.router is not None
        assert _catalog_counts(store) == (0, 0)
        assert store.sessions.create("again", id="x..").id == "x.."
        assert store.router.home("x..") == shard_key("x..") != "x.."


# -- a catalog+shard write that failed leaves nothing to finish (issue 23) ------------------


def _catalog_counts(store: Store) -> tuple[int, int]:
    rows = store.db.read(
        lambda tx: tx.execute(
            "SELECT (SELECT count(*) FROM shard_sessions), (SELECT count(*) FROM shard_intents)"
        )
    )
    return rows[0][0], rows[0][1]


def test_a_create_refused_by_a_planted_shard_file_leaves_no_catalog_entry(tmp_path: Path) -> None:
    with sharded(tmp_path) as store:
        assert store.router is not None
        store.sessions.create("first")
        before = _catalog_counts(store)
        planted = store.router.shards.path_of(shard_key("victim"))
        planted.parent.mkdir(mode=0o700, exist_ok=True)
        planted.touch()
        planted.chmod(0o666)  # someone else's, for whatever is written into it
        with pytest.raises(errors.UnsafeFile, match="writable by its group and others"):
            store.sessions.create("mine", id="victim")
        assert _catalog_counts(store) == before
        assert "victim" not in {s.id for s in store.sessions.list()}
        assert planted.stat().st_size == 0 and sorted(os.listdir(planted.parent)) == [planted.name]
        planted.unlink()
        assert store.sessions.create("mine", id="victim").id == "victim"
        assert store.router.recover(own=True) == 0


def test_a_write_refused_by_a_busy_shard_is_not_finished_later(tmp_path: Path) -> None:
    """The caller is told StoreBusy (on_busy="raise"): nothing was written, and
    nothing is, when the shard is free again (the intent used to stay, and this
    process's background recovery applied the message and its effect later)."""
    import subprocess
    import sys

    with sharded(tmp_path, write_budget=0.3, on_busy="raise") as store:
        assert store.router is not None
        s = store.sessions.create("s")
        shard = store.router.shards.path_of(shard_key(s.id))
        before = _catalog_counts(store)
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetstore", "lock", "--store", str(shard), "--hold", "30"],
            stdout=subprocess.PIPE,
            text=True,
        )
        with proc:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith("locked ")
            with pytest.raises(errors.StoreBusy):
                store.messages.append(s.id, "user", "hi", effects=[NewEffect("t", "k")])
            assert _catalog_counts(store) == before
            proc.terminate()
            assert proc.wait(30) == 0
        assert store.router.recover(own=True) == 0
        store.router.sync_dirty()
        assert store.messages.list(s.id) == [] and store.effects.list(thread_key="t") == []
