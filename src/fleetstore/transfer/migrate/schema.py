"""Schema discovery: each store's tables, their columns, keys and foreign keys as
its catalog describes them (the ``mig_*`` queries of ``sql/*/migrate.sql``),
the comparison of the two sides (``SchemaMismatch`` before anything is copied), and
the copy order (parents before children)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleetstore.transfer.migrate.report import SchemaMismatch

#: Where DST records its source and the progress of the copy.
PROGRESS_TABLE = "fleetstore_migrate"
#: The sharded layout's own catalog tables (which shard holds a session, the
#: catalog+shard writes under way): empty in every other layout, built by a sharded
#: DST for what it holds.
LAYOUT_TABLES = frozenset({"shard_sessions", "shard_intents"})
#: Tables each store keeps for itself: the migration log (each store applies its own
#: migrations), this module's progress record, PostgreSQL's blob payloads (copied
#: through the blob stores, before the ``blobs`` rows that refer to them) and the
#: sharded layout's map of its files.
NOT_COPIED = frozenset({"fleetstore_migrations", PROGRESS_TABLE, "blob_chunks"}) | LAYOUT_TABLES
#: The search index (migration 0011: its documents, queue, indexer state, and FTS5's
#: tables with their shadow tables, which have no primary key) is derived from the
#: rows copied: DST's own triggers queue each session and message as it is copied, and
#: its indexer builds DST's index (a reshard or migrate refused every store once the
#: index existed: "table search_grams has no primary key").
DERIVED_PREFIX = "search_"
_BLOBS = "blobs"
_SESSIONS = "sessions"


@dataclass(frozen=True, slots=True)
class Table:
    """A table as the catalog describes it."""

    name: str
    columns: tuple[str, ...]
    #: Per column: integer, real, text or blob.
    kinds: tuple[str, ...]
    #: The primary key's columns, in key order.
    key: tuple[str, ...]
    #: Columns with a foreign key to this same table: copied in a second pass.
    links: tuple[str, ...] = ()
    #: Other tables this one refers to: copied before it.
    parents: frozenset[str] = frozenset()
    #: The place of the ``enc`` column (-1: none) and of the blob columns it governs.
    enc_at: int = -1
    payloads: tuple[int, ...] = ()
    #: (column, table) of each foreign key to another table.
    references: tuple[tuple[str, str], ...] = ()

    def index(self, column: str) -> int:
        return self.columns.index(column)

    def refers_to(self, table: str) -> list[int]:
        """The places of the columns with a foreign key to *table*."""
        return [self.index(c) for c, t in self.references if t == table]


def _kind(declared: str) -> str:
    """The class of values a column holds, from its declared type (SQLite's affinity rules)."""
    t = declared.upper()
    if "INT" in t:
        return "integer"
    if "CHAR" in t or "CLOB" in t or "TEXT" in t:
        return "text"
    if not t or "BLOB" in t or "BYTEA" in t:
        return "blob"
    return "real"


def _normal(table: Table, row: Sequence[Any]) -> tuple[Any, ...]:
    """*row* in SQLite's form.  An inline payload (a blob column of a table with an
    ``enc`` column) is text for every encoding but ``bytes``: SQLite keeps that text
    as text, PostgreSQL as its UTF-8 bytes (BYTEA); read from PostgreSQL it is text
    again, so both dialects hash and copy the same values (and writing it to
    PostgreSQL goes through ``mig_blob_param``, which turns it back into bytes)."""
    if not table.payloads or row[table.enc_at] == "bytes":
        return tuple(row)
    out = list(row)
    for i in table.payloads:
        value = out[i]
        if isinstance(value, bytes | bytearray | memoryview):
            try:
                out[i] = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                pass  # not what the encoding says: kept, and verification will tell
    return tuple(out)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _read_schema(store: Any) -> dict[str, Table]:
    q = store.queries

    def run(tx: Any) -> tuple[list[str], list[tuple[Any, ...]], dict[str, list[tuple[Any, ...]]]]:
        names = [str(r[0]) for r in tx.execute(q["mig_tables"])]
        fks = tx.execute(q["mig_foreign_keys"])
        return names, fks, {n: tx.execute(q["mig_columns"], (n,)) for n in names}

    names, fks, columns = store.db.read(run)
    refs: dict[str, list[tuple[str, str]]] = {}
    for table, column, parent in fks:
        refs.setdefault(str(table), []).append((str(column), str(parent)))
    tables: dict[str, Table] = {}
    for name in names:
        if name in NOT_COPIED or name.startswith(("sqlite_", DERIVED_PREFIX)):
            continue
        cols = columns[name]
        key = tuple(str(c[0]) for c in sorted((c for c in cols if c[2]), key=lambda c: int(c[2])))
        if not key:
            raise SchemaMismatch(
                f"{store.url}: table {name} has no primary key; migrate copies tables in key order"
            )
        names_ = tuple(str(c[0]) for c in cols)
        kinds = tuple(_kind(str(c[1] or "")) for c in cols)
        enc_at = names_.index("enc") if "enc" in names_ else -1
        tables[name] = Table(
            name=name,
            columns=names_,
            kinds=kinds,
            key=key,
            enc_at=enc_at,
            payloads=tuple(i for i, k in enumerate(kinds) if k == "blob") if enc_at >= 0 else (),
            links=tuple(sorted({c for c, p in refs.get(name, []) if p == name})),
            parents=frozenset(
                p for _, p in refs.get(name, []) if p != name and p not in NOT_COPIED
            ),
            references=tuple(sorted({(c, p) for c, p in refs.get(name, []) if p != name})),
        )
    return tables


def _compare(src: dict[str, Table], dst: dict[str, Table], src_url: str, dst_url: str) -> None:
    problems = []
    for name in sorted(src.keys() - dst.keys()):
        problems.append(f"table {name} is in SRC ({src_url}) but not in DST")
    for name in sorted(dst.keys() - src.keys()):
        problems.append(f"table {name} is in DST ({dst_url}) but not in SRC")
    for name in sorted(src.keys() & dst.keys()):
        a, b = src[name], dst[name]
        if a.columns != b.columns:
            problems.append(
                f"table {name}: columns {list(a.columns)} in SRC, {list(b.columns)} in DST"
            )
        elif a.kinds != b.kinds:
            diff = [
                f"{c} {x}/{y}"
                for c, x, y in zip(a.columns, a.kinds, b.kinds, strict=True)
                if x != y
            ]
            problems.append(f"table {name}: column types differ (SRC/DST): {', '.join(diff)}")
        if a.key != b.key:
            problems.append(f"table {name}: primary key {a.key} in SRC, {b.key} in DST")
    if problems:
        raise SchemaMismatch(
            "the two stores' schemas differ (is one of them from a newer fleetstore?); "
            "nothing was copied: " + "; ".join(problems)
        )


def copy_order(tables: dict[str, Table]) -> list[Table]:
    """The tables, each after every table it refers to (ties by name)."""
    order: list[Table] = []
    placed: set[str] = set()
    left = dict(tables)
    while left:
        ready = sorted(
            n for n, t in left.items() if t.parents <= placed | (t.parents - tables.keys())
        )
        if not ready:
            raise SchemaMismatch(f"tables refer to each other in a cycle: {sorted(left)}")
        for name in ready:
            order.append(left.pop(name))
            placed.add(name)
    return order


__all__ = ["LAYOUT_TABLES", "NOT_COPIED", "PROGRESS_TABLE", "Table", "copy_order"]
