"""Where a PostgreSQL store keeps this host's spool: named after its server(s) and
database, the same name as before multi-host URLs for a one-host URL (a spool journal
left by an older version must still be found)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetstore import errors
from fleetstore.core.settings import Settings
from fleetstore.core.targets import local_base, url_servers
from fleetstore.transfer.migrate.run import identity


def test_a_one_host_url_keeps_its_spool_directory_name(data_dir: Path) -> None:
    settings = Settings.load()
    base = local_base("postgresql://app:secret@DB.internal:5433/agents", settings)
    assert base == data_dir / "postgres" / "db.internal_5433_agents"
    assert local_base("postgresql:///agents", settings).name == "local_5432_agents"


def test_a_multi_host_url_names_every_server(data_dir: Path) -> None:
    url = "postgresql://app:secret@db1:5432,db2:5433/agents?target_session_attrs=read-write"
    assert url_servers(url) == [("db1", 5432), ("db2", 5433)]
    base = local_base(url, Settings.load())
    assert base == data_dir / "postgres" / "db1_5432_db2_5433_agents"
    assert identity(url) == "postgresql://db1:5432,db2:5433/agents"


def test_a_port_that_is_not_a_number_is_a_config_error() -> None:
    with pytest.raises(errors.ConfigError, match="'db2:x'") as info:
        url_servers("postgresql://app:secret@db1:5432,db2:x/agents")
    assert "secret" not in str(info.value)
