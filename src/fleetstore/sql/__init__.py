"""SQL as named queries and numbered migrations, one folder per dialect.

Every ``<dialect>/*.sql`` file holds blocks headed ``-- name: what it does``;
the loader turns them into one dict (a name used twice is an error).  ``migrations/NNNN_name.sql`` are applied in order.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from fleetstore.engine.base import Migration

_HEADER = re.compile(r"^-- ([a-z_][a-z0-9_]*):(.*)$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@cache
def queries(dialect: str) -> dict[str, str]:
    """Every named query of *dialect*: ``{"insert_message": "INSERT ..."}``."""
    found: dict[str, str] = {}
    folder = resources.files(__package__).joinpath(dialect)
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        # schema.sql is the whole current schema, for reading and for test_schema.py
        if not entry.name.endswith(".sql") or entry.name == "schema.sql":
            continue
        text = entry.read_text("utf-8")
        headers = list(_HEADER.finditer(text))
        for i, match in enumerate(headers):
            end = headers[i + 1].start() if i + 1 < len(headers) else len(text)
            body = text[match.end() : end].strip()
            name = match.group(1)
            if name in found or not body:
                raise ValueError(f"sql/{dialect}/{entry.name}: query {name!r} duplicated or empty")
            found[name] = body
    return found


@cache
def migrations(dialect: str) -> tuple[Migration, ...]:
    """The migrations of *dialect*, in version order."""
    folder = resources.files(__package__).joinpath(dialect, "migrations")
    steps = []
    for entry in folder.iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            steps.append(Migration(int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    steps.sort(key=lambda m: m.version)
    return tuple(steps)


__all__ = ["migrations", "queries"]
