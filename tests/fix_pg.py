"""PostgreSQL fixtures: a server the suite starts itself (tests/pgserver.py), fresh
databases on it, and a migrated template the contract tests copy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import fleetstore
from tests import pgserver
from tests.pgserver import PgServer


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A throwaway PostgreSQL server (tests/pgserver.py), one per test process, or the
    one FLEETSTORE_TEST_PG_URL names.  Never skipped: a machine without PostgreSQL
    fails these tests (.ci/run installs it)."""
    with pgserver.server() as srv:
        yield srv


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """A fresh, empty database on the test server; dropped after the test."""
    url = pg_server.create_database()
    yield url
    pg_server.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture(scope="session")
def pg_template(pg_server: PgServer, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The name of a database holding a freshly migrated, empty store: contract tests
    get copies of it (CREATE DATABASE … TEMPLATE), which skips running every
    migration for each of a few hundred tests."""
    url = pg_server.create_database("template")
    fleetstore.open(url, local_dir=str(tmp_path_factory.mktemp("template"))).close()
    return url.rsplit("/", 1)[1]
