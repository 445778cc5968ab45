"""Reading another program's SQLite file (``fleetstore.files.foreign``): a WAL file
with no ``-wal`` or ``-shm`` is read ``immutable=1``, without locks, so a writer can
change it under the read; the importers must then refuse what they read rather than
import it half old, half new.

The change is deterministic: just before the importer's first query of a given
table, a writer appends a row to that table and checkpoints it into the main file.
The writer is a process of its own: the stdlib ``sqlite3`` must never share a process
with fleetstore's connections (two SQLite libraries in one process drop each other's
POSIX locks, DESIGN.md).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore.files import foreign, inspect
from tests.agents import script

# python -c SQLITE3 PATH SQL...: each statement, committed, then the WAL checkpointed
# into the main file (the WAL and -shm go when the last connection closes).
SQLITE3 = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
for sql in sys.argv[2:]:
    db.execute(sql)
db.commit()
db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
db.close()
"""


def sqlite3_process(path: Path, *sql: str) -> None:
    subprocess.run([sys.executable, "-c", SQLITE3, str(path), *sql], check=True, timeout=60)


def everything(store: fleetstore.Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of *store*, for "nothing was imported"."""

    def read(tx: Any) -> dict[str, list[tuple[Any, ...]]]:
        names = [r[0] for r in tx.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")]
        return {n: tx.execute(f'SELECT * FROM "{n}" ORDER BY 1') for n in sorted(names)}

    return store.read(read)


def change_before(monkeypatch: pytest.MonkeyPatch, path: Path, table: str, sql: str) -> list[str]:
    """Run *sql* on *path*, in another process, just before this process's first query
    ``FROM table``; the queries from then on are listed in the list returned."""
    query = inspect.ReadOnlyDatabase.query
    seen: list[str] = []

    def changing(self: inspect.ReadOnlyDatabase, q: str, params: Any = ()) -> list[Any]:
        if not seen and f"FROM {table}" in q:
            assert self.mode == "immutable", "only a read without locks can see a change"
            sqlite3_process(path, sql)
        if seen or f"FROM {table}" in q:
            seen.append(q)
        return query(self, q, params)

    monkeypatch.setattr(inspect.ReadOnlyDatabase, "query", changing)
    return seen


def adk_file(path: Path) -> Callable[[fleetstore.Store, Path], object]:
    from fleetstore.integrations.adk.importer import import_adk_sqlite

    make = [sys.executable, script("adk_make_db.py"), str(path), "--kind", "database"]
    subprocess.run(make, check=True, capture_output=True, timeout=120)
    sqlite3_process(path, "PRAGMA journal_mode=WAL")  # ADK leaves a rollback journal
    return import_adk_sqlite


def langgraph_file(path: Path) -> Callable[[fleetstore.Store, Path], object]:
    from fleetstore.integrations.langgraph.importer import import_langgraph_sqlite
    from tests.integrations.test_langgraph_import import make_source

    make_source(path)  # SqliteSaver writes in WAL mode
    return import_langgraph_sqlite


# The file, then the table read after others and a row appended to it meanwhile: an
# event of a session already read; a pending write of a checkpoint already read.
IMPORTERS = {
    "adk": (
        adk_file,
        "events",
        "INSERT INTO events SELECT id || '-new', app_name, user_id, session_id, "
        "invocation_id, timestamp, event_data FROM events LIMIT 1",
    ),
    "langgraph": (
        langgraph_file,
        "writes",
        "INSERT INTO writes SELECT thread_id, checkpoint_ns, checkpoint_id, task_id || '-new', "
        "task_path, idx, channel, type, value FROM writes LIMIT 1",
    ),
}


@pytest.mark.parametrize("framework", sorted(IMPORTERS))
def test_a_file_changed_during_the_import_is_refused_with_nothing_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, framework: str
) -> None:
    make, table, append = IMPORTERS[framework]
    source = tmp_path / "source.db"
    import_file = make(source)
    assert not Path(f"{source}-wal").exists() and not Path(f"{source}-shm").exists()
    with fleetstore.open(tmp_path / "store.db") as store:
        before = everything(store)
        seen = change_before(monkeypatch, source, table, append)
        with pytest.raises(foreign.FileChanged, match="changed while it was read; nothing was"):
            import_file(store, source)
        assert seen, f"the import never read {table}"
        assert everything(store) == before
        monkeypatch.undo()
        import_file(store, source)  # unchanged since: imported whole, the new row with it
        assert everything(store) != before


def test_the_agents_sdk_import_of_a_file_changed_meanwhile_asks_for_a_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It writes while it reads (a transaction per batch): what it wrote is whole per
    # batch, and importing again continues from there.
    from fleetstore.integrations.openai_agents.importer import import_sqlite

    source = tmp_path / "sdk.db"
    sqlite3_process(
        source,
        "PRAGMA journal_mode=WAL",
        "CREATE TABLE agent_sessions (session_id TEXT PRIMARY KEY, created_at, updated_at)",
        "CREATE TABLE agent_messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id, "
        "message_data, created_at)",
        """INSERT INTO agent_messages (session_id, message_data) VALUES ('s', '{"a": 1}')""",
    )
    append = (
        "INSERT INTO agent_messages (session_id, message_data) "
        "SELECT session_id, message_data FROM agent_messages LIMIT 1"
    )
    with fleetstore.open(tmp_path / "store.db") as store:
        change_before(monkeypatch, source, "agent_messages", append)
        with pytest.raises(foreign.FileChanged, match="changed while it was read; import it"):
            import_sqlite(store, source)
        monkeypatch.undo()
        assert import_sqlite(store, source).items == 2


def test_read_foreign_refuses_an_immutable_read_of_a_file_that_changed(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    sqlite3_process(
        path, "PRAGMA journal_mode=WAL", "CREATE TABLE t (v)", "INSERT INTO t VALUES (1)"
    )
    count = "SELECT count(*) FROM t"
    assert foreign.read_foreign(path, lambda db: db.query(count)) == [(1,)]

    def read_then_change(db: inspect.ReadOnlyDatabase) -> list[Any]:
        rows = db.query(count)
        sqlite3_process(path, "INSERT INTO t VALUES (2)")
        return rows

    with pytest.raises(foreign.FileChanged) as raised:
        foreign.read_foreign(path, read_then_change)
    assert isinstance(raised.value, fleetstore.errors.TransientError)
    assert str(raised.value) == f"{path}: the file changed while it was read; nothing was imported"
    assert foreign.read_foreign(path, lambda db: db.query(count)) == [(2,)]


def test_doctor_reports_a_file_changed_while_it_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetstore.admin import doctor

    path = tmp_path / "other.db"
    sqlite3_process(
        path, "PRAGMA journal_mode=WAL", "CREATE TABLE t (v)", "INSERT INTO t VALUES (1)"
    )
    change_before(monkeypatch, path, "sqlite_schema", "INSERT INTO t VALUES (2)")
    report = doctor.diagnose(path, interval=0)
    (changed,) = [f for f in report.findings if f.code == "changed-during-check"]
    assert changed.severity is doctor.Severity.WARNING
    assert report.data["database"]["open_mode"] == "immutable"
    assert report.data["database"]["quick_check"] == ["ok"]  # what was read is still shown
