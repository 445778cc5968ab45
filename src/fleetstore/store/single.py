"""The default layout: one SQLite file, its blob files in ``<file>.blobs/``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from fleetstore.core.keys import keyring_of
from fleetstore.core.settings import Settings
from fleetstore.domain.blobs import BlobStore
from fleetstore.domain.operations import Operation, Result
from fleetstore.engine.sqlite import Database
from fleetstore.store.backend import (
    OPS_TAG,
    OneDatabase,
    OpItem,
    blobs_durable,
    migrations,
    op_applier,
)


class FileBackend(OneDatabase):
    """One SQLite file (``fleetstore.open("path/to/store.db")``)."""

    layout = "file"

    def __init__(self, db: Database, queries: Mapping[str, str], settings: Settings) -> None:
        super().__init__(db, queries, Path(db.path))
        self._file = db
        self.blobs = BlobStore(
            str(self.path) + ".blobs",
            settings.max_payload_bytes,
            durable=blobs_durable(settings),
            wait_for_space=settings.write_budget,
            keyring=keyring_of(settings.encryption_key_file),
        )
        if not self.blobs.durable:
            db.before_checkpoint(self.blobs.sync)
        # Group commit: this process applies other processes' operations while it holds
        # the gate, and they apply its own (engine/combine.py).
        db.serve(OPS_TAG, op_applier(queries))

    def apply(self, op: Operation) -> Result:
        return self._file.submit(OpItem(op, self.queries))  # type: ignore[return-value]


def open_file(path: Path, settings: Settings, queries: Mapping[str, str]) -> FileBackend:
    """Open (creating and migrating if needed) the store file at *path*."""
    db = Database.open(path, migrations(), **dataclasses.asdict(settings))
    try:
        return FileBackend(db, queries, settings)
    except BaseException:
        db.close()
        raise


__all__ = ["FileBackend", "open_file"]
