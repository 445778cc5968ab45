"""``maintain``'s search step (issue 30): the index caught up and its FTS5 segments
merged in short transactions (what a delete left behind dropped with them), on one file
and on every file of a sharded store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore.admin.maintain.config import Config
from fleetstore.admin.maintain.run import maintain

#: FTS5's own check of each table against itself (contentless: no content to compare).
CHECK = (
    "INSERT INTO search_words (search_words, rank) VALUES ('integrity-check', 0)",
    "INSERT INTO search_grams (search_grams, rank) VALUES ('integrity-check', 0)",
)


@pytest.mark.parametrize("layout", ["file", "sharded"])
def test_maintain_catches_up_and_merges_the_segments(tmp_path: Path, layout: str) -> None:
    url = str(tmp_path / "s.db") if layout == "file" else f"sqlite+sharded://{tmp_path / 'sh'}"
    with fleetstore.open(url, search_index=False) as store:
        gone = store.sessions.create(title="gone gecko")
        kept = store.sessions.create(title="kept gecko")
        for i in range(40):  # one catch_up each: a segment each in the FTS5 tables
            store.messages.append(gone.id, "user", f"gecko {i} iguana")
            store.messages.append(kept.id, "user", f"gecko {i}")
            store.search.catch_up()
        store.sessions.delete(gone.id)
        store.messages.append(kept.id, "user", "gecko queued")  # not indexed yet
    report = maintain(Config(url, settings={"write_budget": 0.5}))
    assert report.ok, report.to_json()
    step = next(s for s in report.steps if s.name == "search")
    assert step.status == "done" and step.detail["written"] == 1, step.detail
    with fleetstore.open(url, search_index=False) as store:
        assert store.search.status().current
        assert len(store.search("iguana")) == 0
        assert len(store.search("gecko", limit=100)) == 42  # kept's title and 41 messages
        assert [h.seq for h in store.search("gecko", limit=3)] == [41, 40, 39]

        def check(db: Any) -> None:
            for sql in CHECK:  # raises (SQLITE_CORRUPT_VTAB) if a merge broke a table
                db.run_write(lambda tx, sql=sql: tx.execute(sql))

        for key in store.search_files(session_id=None, root_id=None, project=None):
            store.with_file(key, check)
    # each table of each file merged (at least one merge transaction each: FTS5's
    # automerge leaves a merge little to do here)
    files = 1 if layout == "file" else 2
    assert step.detail["merge_transactions"] >= 2 * files, step.detail


def test_retention_takes_a_deleted_tree_out_of_the_index(tmp_path: Path) -> None:
    url = str(tmp_path / "s.db")
    with fleetstore.open(url, search_index=False) as store:
        old = store.sessions.create(title="old newt")
        sub = store.sessions.create(parent_id=old.id)
        kept = store.sessions.create(title="kept newt")
        for s in (old, sub, kept):
            store.messages.append(s.id, "user", "newt salamander")
        # written a month ago (before it was indexed: a section's id is made from its
        # owner's created_at, which nothing changes once written)
        ago = 30 * 86400
        with store.db.write() as tx:
            tx.execute(
                "UPDATE sessions SET created_at = created_at - ?, updated_at = updated_at - ? "
                "WHERE root_id = ?",
                (ago, ago, old.id),
            )
            tx.execute(
                "UPDATE messages SET created_at = created_at - ? WHERE session_id IN "
                "(SELECT id FROM sessions WHERE root_id = ?)",
                (ago, old.id),
            )
        store.search.catch_up()
        assert len(store.search("newt")) == 5
    report = maintain(Config(url, yes=True, delete_older_than=7 * 86400))
    assert report.ok and next(s for s in report.steps if s.name == "delete").status == "done"
    with fleetstore.open(url, search_index=False) as store:
        assert {h.session_id for h in store.search("newt")} == {kept.id}
        assert {h.session_id for h in store.search("alamand", match="substring")} == {kept.id}
        rows = store.read(lambda tx: tx.execute("SELECT count(*) FROM search_docs"))
        assert rows[0][0] == 2  # kept's title and message: nothing of the deleted tree
