"""Store fixtures: the contract tests open stores through ``open_store``, so the suite
runs unchanged on each engine (one SQLite file, the sharded layout, PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore import Store
from tests.pgserver import PgServer


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """FLEETSTORE_DATA_DIR under tmp_path, inherited by child processes: where a
    PostgreSQL store keeps this host's spool journals and published figures."""
    path = tmp_path / "data"
    monkeypatch.setenv("FLEETSTORE_DATA_DIR", str(path))
    return path


@pytest.fixture
def store_path(tmp_path: Path) -> str:
    """A store with the fleet schema (tests/agents/fleet_agent.py SCHEMA) already applied; the
    Database used to create it is closed again."""
    from fleetstore import Database
    from tests.agents.fleet_agent import SCHEMA

    path = str(tmp_path / "fleet.db")
    db = Database.open(path, migrations=SCHEMA)
    db.close()
    return path


# -- the store contract fixtures: every contract test opens stores through these, so the
# suite runs unchanged on each engine.

OpenStore = Callable[..., Store]


@pytest.fixture(params=["sqlite", "postgresql", "sharded"])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def open_store(tmp_path: Path, engine: str, request: pytest.FixtureRequest) -> Iterator[OpenStore]:
    """``open_store(name="s.db", **settings)``: a store (a file under tmp_path, or a
    database of its own on the test server, one per name), closed when the test ends."""
    opened: list[Store] = []
    databases: dict[str, str] = {}

    def _open(name: str = "s.db", **settings: Any) -> Store:
        if engine == "sqlite":
            store = fleetstore.open(tmp_path / name, **settings)
        elif engine == "sharded":
            store = fleetstore.open(f"sqlite+sharded://{tmp_path / name}", **settings)
        else:
            server: PgServer = request.getfixturevalue("pg_server")
            if name not in databases:
                template = request.getfixturevalue("pg_template")
                databases[name] = server.create_database(template=template)
            settings.setdefault("local_dir", str(tmp_path / f"{name}.local"))
            store = fleetstore.open(databases[name], **settings)
        opened.append(store)
        return store

    yield _open
    for store in reversed(opened):
        store.close()
    if databases:
        server = request.getfixturevalue("pg_server")
        for url in databases.values():
            server.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture
def store(open_store: OpenStore) -> Store:
    return open_store()


def read_everywhere(store: Store, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    """Raw rows of *sql* from the whole store: a sharded store's catalog and then
    each shard, concatenated (the catalog's index rows of sharded sessions left out,
    so each session counts once); a ``SELECT count(*)`` is summed into one row."""
    if store.router is None:
        return [tuple(r) for r in store.read(lambda tx: tx.execute(sql, params))]
    found: list[tuple[Any, ...]] = []

    def collect(key: str | None, db: Any) -> None:
        if key is None and " sessions" in sql:
            # the catalog's index rows are copies of the shards' rows
            text = sql.replace(
                " sessions",
                " (SELECT * FROM sessions WHERE id NOT IN "
                "(SELECT session_id FROM shard_sessions)) AS sessions",
                1,
            )
            found.extend(tuple(r) for r in db.read(lambda tx: tx.execute(text, params)))
            return
        found.extend(tuple(r) for r in db.read(lambda tx: tx.execute(sql, params)))

    store.router.each(collect)
    if sql.lstrip().lower().startswith("select count(*)"):
        return [(sum(int(r[0]) for r in found),)]
    return found
