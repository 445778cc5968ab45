"""SQL as named queries and numbered migrations.

A ``*.sql`` file of queries holds blocks headed ``-- name: what it does``.  Each query
is written once, in ``common/<file>.sql``; ``<dialect>/<file>.sql`` holds only what that
dialect does differently: a query of the same name replaces the common one, and a query
named with one of the dialect's own prefixes (``DIALECT_ONLY``) exists there alone.  The
loader refuses a copy kept by hand: an override equal to its common text, an override
of no common query (a misspelt name), a name used twice, two names for one text (texts
compared without their comments and layout).
``<dialect>/schema.sql`` is the whole current schema and ``<dialect>/migrations/NNNN_name.sql``
the steps that build it, applied in order: whole scripts, one per dialect.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

from fleetstore.engine.base import Migration

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

_HEADER = re.compile(r"^-- ([a-z_][a-z0-9_]*):(.*)$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

#: Name prefixes of the queries only one dialect has: SQLite's FTS5 tables; PostgreSQL's
#: blob bytes (blob_chunks), migrate's server-side cursor, search's tsvector and trigrams.
DIALECT_ONLY = {"sqlite": ("fts5_",), "postgresql": ("blobdata_", "mig_scan_", "tsv_")}
_ANY_ONLY = tuple(p for prefixes in DIALECT_ONLY.values() for p in prefixes)
_COMMENT = re.compile(r"--[^\n]*")


def _bare(text: str) -> str:
    """*text* without comments and with its white space collapsed: a copy that differs
    from the original in its layout only is still a copy."""
    return " ".join((_COMMENT.sub(" ", text) if "--" in text else text).split())


def _named(entry: Traversable, where: str) -> dict[str, str]:
    """The blocks of one file, ``{name: text}``."""
    text = entry.read_text("utf-8")
    headers = list(_HEADER.finditer(text))
    found: dict[str, str] = {}
    for i, match in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(text)
        body = text[match.end() : end].strip()
        name = match.group(1)
        if name in found or not body:
            raise ValueError(f"{where}: query {name!r} duplicated or empty")
        found[name] = body
    return found


def _files(folder: Traversable) -> list[Traversable]:
    # schema.sql is the whole current schema, for reading and for test_schema.py
    entries = [e for e in folder.iterdir() if e.name.endswith(".sql") and e.name != "schema.sql"]
    return sorted(entries, key=lambda e: e.name)


def merge(root: Traversable, dialect: str) -> dict[str, str]:
    """``common/*.sql`` with ``<dialect>/*.sql``'s queries replacing or added to them."""
    if dialect not in DIALECT_ONLY:
        raise ValueError(f"no SQL dialect {dialect!r}: one of {sorted(DIALECT_ONLY)}")
    found: dict[str, str] = {}
    bare: dict[str, str] = {}  # query name -> its text as _bare() has it
    home: dict[str, str] = {}  # query name -> the common file it is in
    for entry in _files(root / "common"):
        for name, body in _named(entry, f"sql/common/{entry.name}").items():
            if name in found or name.startswith(_ANY_ONLY):
                raise ValueError(
                    f"sql/common/{entry.name}: query {name!r} duplicated or a dialect's own"
                )
            found[name], bare[name], home[name] = body, _bare(body), entry.name
    own: set[str] = set()
    for entry in _files(root / dialect):
        where = f"sql/{dialect}/{entry.name}"
        for name, body in _named(entry, where).items():
            if name in own:
                raise ValueError(f"{where}: query {name!r} duplicated")
            if not name.startswith(DIALECT_ONLY[dialect]) and home.get(name) != entry.name:
                raise ValueError(
                    f"{where}: {name!r} replaces no query of sql/common/{entry.name}"
                    f" (and is not named {' or '.join(p + '*' for p in DIALECT_ONLY[dialect])})"
                )
            text = _bare(body)
            if text == bare.get(name):
                raise ValueError(f"{where}: {name!r} is the same as in sql/common/: delete it")
            own.add(name)
            found[name], bare[name] = body, text
    names: dict[str, str] = {}
    for name, text in bare.items():
        if text in names:
            raise ValueError(f"sql ({dialect}): {names[text]!r} and {name!r} are one query")
        names[text] = name
    return found


@cache
def queries(dialect: str) -> dict[str, str]:
    """Every named query of *dialect*: ``{"insert_message": "INSERT ..."}``."""
    return merge(resources.files(__package__), dialect)


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


__all__ = ["DIALECT_ONLY", "merge", "migrations", "queries"]
