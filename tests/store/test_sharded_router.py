"""The sharded layout's routing: which file each write lands in, the bounded cache of
open shards, store-wide session ids, a moved shard file, a catalog+shard write that
stopped half-way in a live process.  (Crashes and fleets: test_sharded.py.)"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore import NewEffect, Store, errors
from fleetstore.engine.sharded import shard_key
from fleetstore.engine.sqlite import Database
from fleetstore.store import sharded as sharding
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
            [sys.executable, "-m", "fleetstore", "lock", store.url, "--hold", "30"],
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
