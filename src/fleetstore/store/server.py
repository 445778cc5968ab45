"""The PostgreSQL layout: one database on a server (``postgresql://...``), its blobs
in ``blob_chunks`` rows so that every host sees them; this host's spool and
published figures live under the data directory (``core/targets.local_base``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from fleetstore.core.files import private_dirs
from fleetstore.core.keys import keyring_of
from fleetstore.core.settings import Settings
from fleetstore.core.targets import local_base
from fleetstore.domain.blobs import DbBlobStore
from fleetstore.engine.base import Engine
from fleetstore.store.backend import OneDatabase, migrations


class ServerBackend(OneDatabase):
    """A PostgreSQL database shared by every host of the fleet."""

    layout = "server"

    def __init__(
        self, db: Engine, queries: Mapping[str, str], settings: Settings, local: Path
    ) -> None:
        super().__init__(db, queries, local)
        self.blobs = DbBlobStore(
            db, queries, settings.max_payload_bytes, keyring_of(settings.encryption_key_file)
        )


def open_server(url: str, settings: Settings, queries: Mapping[str, str]) -> ServerBackend:
    """Connect to (and migrate if needed) the PostgreSQL store at *url*."""
    # An extra: without psycopg this raises MissingDependency naming its pip install.
    from fleetstore.engine.postgres import PgDatabase

    pg = PgDatabase.open(url, migrations("postgresql"), **dataclasses.asdict(settings))
    try:
        local = local_base(url, settings)
        private_dirs(local.parent)
        return ServerBackend(pg, queries, settings, local)
    except BaseException:
        pg.close()
        raise


__all__ = ["ServerBackend", "open_server"]
