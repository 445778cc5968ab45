"""``fleetstore migrate SRC DST``: copy a whole store to another one, SQLite or
PostgreSQL in either direction, then prove the copy equal.

Both stores are opened with ``fleetstore.open`` (which brings each to the newest
schema this program knows).  The tables and their columns, keys and foreign keys
are read from each store's catalog (the ``mig_*`` queries of ``sql/<dialect>/
migrate.sql``), so a table added by a later migration is copied without a change
here; two stores whose schemas differ are refused before anything is copied.

The copy goes table by table, parents before children (the foreign keys give the
order), each table in primary-key order, in batches: one read transaction on SRC,
one write transaction on DST per batch, through the engines' write path
(``db.run_write``).  A column that refers to its own table (``sessions.parent_id``)
is copied empty and set in a second pass, once every row it may point at is there.
A ``blobs`` row is written only after its payload: the compressed bytes go from
SRC's blob store to DST's (``put_stored`` checks their size and hash) first.

Resuming: the destination records its source and, for each table, the last key
copied, in a table of its own (``fleetstore_migrate``), in the same transaction as
each batch.  Killed at any point, a second run carries on after the last committed
batch.  A destination that holds rows but no such record (or the record of another
source) is refused: nothing is written to it.

Verification: per table, the row count and a SHA-256 over every row in key order
(byte order of text keys, SQLite's order, on both dialects) in a canonical encoding
of values, computed on both sides; and every blob of DST must read back whole and
match its hash.  Any difference is an error naming the table, counts and hashes.

The copy is of a store at rest: a fleet still writing to SRC meanwhile makes the
verification fail (loudly), never the copy silently incomplete.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fleetstore import errors
from fleetstore.store import open as open_store
from fleetstore.store import parse_target

#: ``progress(stage, done, total)``: called as batches are copied and tables verified.
Progress = Callable[[str, int, int], None]

#: Rows per batch (one write transaction on DST) by default.
DEFAULT_BATCH_ROWS = 500
#: Where DST records its source and the progress of the copy.
PROGRESS_TABLE = "fleetstore_migrate"
#: Tables each store keeps for itself: the migration log (each store applies its own
#: migrations), this module's progress record, and PostgreSQL's blob payloads (copied
#: through the blob stores, before the ``blobs`` rows that refer to them).
NOT_COPIED = frozenset({"fleetstore_migrations", PROGRESS_TABLE, "blob_chunks"})
_BLOBS = "blobs"
#: Parameters per INSERT statement: psycopg parses a statement of at most 50 once.
_GROUP_PARAMS = 50


class DestinationNotEmpty(errors.AlreadyExists):
    """The destination holds data that did not come from an earlier, interrupted
    migrate of the same source; nothing was written to it."""


class SchemaMismatch(errors.MigrationError):
    """The two stores' schemas differ (a table or column one of them lacks, or a
    different key); nothing was copied."""


class ConcurrentMigrate(errors.TransientError):
    """Another migrate is writing to the same destination; this one stopped."""


class VerificationFailed(errors.CorruptStore):
    """The destination does not equal the source: a table's row count or SHA-256
    differs, or a blob of the destination is missing or damaged."""

    def __init__(self, message: str, problems: Sequence[str], report: MigrateReport) -> None:
        self.problems = list(problems)
        self.report = report
        super().__init__(message)


# -- schema ----------------------------------------------------------------------------------


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

    def index(self, column: str) -> int:
        return self.columns.index(column)


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
        if name in NOT_COPIED or name.startswith("sqlite_"):
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


# -- reports ---------------------------------------------------------------------------------


@dataclass(slots=True)
class TableReport:
    """One table: its rows in SRC, what this run copied, and the verification."""

    name: str
    rows: int = 0
    copied: int = 0
    dst_rows: int | None = None
    src_sha256: str | None = None
    dst_sha256: str | None = None

    @property
    def verified(self) -> bool:
        return (
            self.src_sha256 is not None
            and self.dst_rows == self.rows
            and self.src_sha256 == self.dst_sha256
        )


@dataclass(slots=True)
class MigrateReport:
    src: str
    dst: str
    src_dialect: str = ""
    dst_dialect: str = ""
    #: Each store's schema version once opened (fleetstore.open migrates both).
    src_schema: int = 0
    dst_schema: int = 0
    #: False for ``verify`` alone.
    copied: bool = True
    #: Whether this run continued an interrupted one (or found it finished).
    resumed: bool = False
    tables: list[TableReport] = field(default_factory=list)
    blobs_copied: int = 0
    blob_bytes: int = 0
    blobs_verified: int = 0
    verified: bool = False
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.verified and not self.problems

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["ok"] = self.ok
        for t, report in zip(out["tables"], self.tables, strict=True):
            t["verified"] = report.verified
        return out


# -- opening ---------------------------------------------------------------------------------


def identity(url_or_path: str | os.PathLike[str]) -> str:
    """What names a store for ``migrate``: ``sqlite:/absolute/path`` or
    ``postgresql://host:port/database`` (no user, no password)."""
    kind, target = parse_target(url_or_path)
    if isinstance(target, Path):
        return "sqlite:" + str(target.expanduser().resolve())
    parts = urlsplit(str(target))
    database = parts.path.lstrip("/") or parts.username or "postgres"
    host = (parts.hostname or "localhost").lower()
    return f"{kind}://{host}:{parts.port or 5432}/{database}"


def _target(url_or_path: str | os.PathLike[str], must_exist: bool, what: str) -> Path | str:
    _, target = parse_target(url_or_path)
    if isinstance(target, Path) and must_exist and not target.is_file():
        raise errors.NotFound(f"{what}: no store at {target} (nothing was created)")
    return target


@contextmanager
def _opened(target: Path | str, settings: dict[str, Any]) -> Iterator[Any]:
    store = open_store(target, **settings)
    try:
        yield store
    finally:
        store.close()


def _pair(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], dst_must_exist: bool
) -> tuple[Path | str, Path | str, str, str]:
    src_target = _target(src, True, "SRC")
    dst_target = _target(dst, dst_must_exist, "DST")
    src_id, dst_id = identity(src), identity(dst)
    same = src_id == dst_id
    if isinstance(src_target, Path) and isinstance(dst_target, Path) and dst_target.exists():
        same = same or os.path.samefile(src_target, dst_target)
    if same:
        raise errors.InvalidInput(f"SRC and DST are the same store ({src_id}); nothing was done")
    return src_target, dst_target, src_id, dst_id


# -- reading in key order --------------------------------------------------------------------


def _template(queries: dict[str, str], name: str, **fields: Any) -> str:
    # Templates are filled with str.format: comment lines (which may hold braces or
    # quotes) are dropped first.
    text = "\n".join(
        line for line in queries[name].splitlines() if not line.lstrip().startswith("--")
    )
    return text.format(**fields)


class _Reader:
    """The statements that read one table of one store in key order."""

    def __init__(self, store: Any, table: Table, *, binary: bool) -> None:
        q = store.queries
        columns = ", ".join(_quote(c) for c in table.columns)
        if binary:
            # Byte order of text keys, the same on both dialects: for verification.
            keys = [
                _template(q, "mig_text_order", column=_quote(c))
                if table.kinds[table.index(c)] == "text"
                else _quote(c)
                for c in table.key
            ]
        else:
            keys = [_quote(c) for c in table.key]
        order = ", ".join(keys)
        fields = {"columns": columns, "table": _quote(table.name), "order": order}
        self.store = store
        self.table = table
        self.first = _template(q, "mig_page_first", **fields)
        self.after = _template(
            q, "mig_page_after", key=order, marks=", ".join("?" * len(keys)), **fields
        )
        self.scan: str | None = None
        if binary and "mig_scan_open" in q:
            self.scan = _template(q, "mig_scan_open", **fields)
        self.key_at = [table.index(c) for c in table.key]

    def page(self, after: Sequence[Any] | None, limit: int) -> list[tuple[Any, ...]]:
        sql, params = (self.first, (limit,)) if after is None else (self.after, (*after, limit))
        rows: list[tuple[Any, ...]] = self.store.db.read(lambda tx: tx.execute(sql, params))
        if self.table.payloads:
            return [_normal(self.table, row) for row in rows]
        return rows

    def key_of(self, row: Sequence[Any]) -> list[Any]:
        return [row[i] for i in self.key_at]

    def rows(self, batch: int) -> Iterator[list[tuple[Any, ...]]]:
        """Every row in pages of *batch*, each page its own read transaction."""
        after: list[Any] | None = None
        while True:
            rows = self.page(after, batch)
            if rows:
                yield rows
            if len(rows) < batch:
                return
            after = self.key_of(rows[-1])


def _count(store: Any, table: Table) -> int:
    sql = _template(store.queries, "mig_count", table=_quote(table.name))
    return int(store.db.read(lambda tx: tx.execute(sql))[0][0])


# -- the canonical encoding ------------------------------------------------------------------


def encode_row(row: Sequence[Any], kinds: Sequence[str]) -> bytes:
    """A row as bytes that are equal exactly when the values are: each value tagged
    with its type, strings and bytes with their length.  A whole number in a real
    column is a float on both dialects (SQLite may hand it back as an integer)."""
    out = bytearray(b"R")
    for value, kind in zip(row, kinds, strict=True):
        if value is None:
            out += b"N"
        elif isinstance(value, bool):
            out += b"I%d;" % int(value)
        elif isinstance(value, int):
            out += b"F" + float(value).hex().encode() + b";" if kind == "real" else b"I%d;" % value
        elif isinstance(value, float):
            out += b"F" + value.hex().encode() + b";"
        elif isinstance(value, str):
            data = value.encode("utf-8", "surrogatepass")
            out += b"S%d:" % len(data) + data
        elif isinstance(value, bytes | bytearray | memoryview):
            data = bytes(value)
            out += b"B%d:" % len(data) + data
        else:
            raise errors.DatabaseError(f"a value of an unexpected type: {type(value).__name__}")
    return bytes(out)


def table_digest(
    store: Any,
    table: Table,
    *,
    batch: int = DEFAULT_BATCH_ROWS,
    progress: Progress | None = None,
    stage: str = "",
    total: int = 0,
) -> tuple[int, str]:
    """(rows, SHA-256 hex) of *table* in *store*: the canonical encoding of every
    row, in byte order of its key."""
    reader = _Reader(store, table, binary=True)
    kinds = table.kinds
    if reader.scan is not None:
        scan = reader.scan
        fetch = _template(store.queries, "mig_scan_fetch", rows=int(batch))

        def run(tx: Any) -> tuple[int, str]:
            digest, n = hashlib.sha256(), 0
            tx.execute(scan)
            while rows := tx.execute(fetch):
                for row in rows:
                    digest.update(encode_row(_normal(table, row), kinds))
                n += len(rows)
                if progress is not None:
                    progress(stage, n, total)
            return n, digest.hexdigest()

        result: tuple[int, str] = store.db.read(run)
        return result
    digest, n = hashlib.sha256(), 0
    for rows in reader.rows(batch):
        for row in rows:
            digest.update(encode_row(row, kinds))
        n += len(rows)
        if progress is not None:
            progress(stage, n, total)
    return n, digest.hexdigest()


# -- the destination's progress record -------------------------------------------------------


def _now_text() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _claim(dst: Any, tables: Sequence[Table], src_id: str) -> tuple[bool, dict[str, str]]:
    """Record SRC as DST's source (refusing a DST that holds other data), or find
    the record of an earlier run from the same SRC.  (resumed, progress items)."""
    q = dst.queries
    probes = [(t.name, _template(q, "mig_any_row", table=_quote(t.name))) for t in tables]

    def run(tx: Any) -> tuple[bool, dict[str, str]]:
        tx.execute(q["mig_progress_create"])
        items = {str(k): str(v) for k, v in tx.execute(q["mig_progress_get"])}
        source = items.get("source")
        if source is None:
            holding = [name for name, sql in probes if tx.execute(sql)]
            if holding:
                raise DestinationNotEmpty(
                    f"DST {dst.url} already holds data (tables {', '.join(holding)}) that did "
                    "not come from an interrupted migrate of this SRC; migrate into a new, "
                    "empty store. Nothing was written."
                )
            items = {"source": src_id, "started": _now_text(), "state": "copying"}
            for item, value in items.items():
                tx.execute(q["mig_progress_put"], (item, value))
            return False, items
        if source != src_id:
            raise DestinationNotEmpty(
                f"DST {dst.url} holds a migrate from another store ({source}), not from "
                f"{src_id}; nothing was written"
            )
        return True, items

    result: tuple[bool, dict[str, str]] = dst.db.run_write(run)
    return result


def _set_item(dst: Any, item: str, value: str) -> None:
    q = dst.queries
    dst.db.run_write(lambda tx: tx.execute(q["mig_progress_put"], (item, value)))


def _write_step(
    dst: Any,
    item: str,
    expected: str | None,
    new: str,
    body: Callable[[Any], None],
) -> None:
    """*body* and the progress item moved from *expected* to *new*, in one write
    transaction: a batch is committed together with the record that it was."""
    q = dst.queries

    def run(tx: Any) -> None:
        rows = tx.execute(q["mig_progress_item"], (item,))
        current = str(rows[0][0]) if rows else None
        if current == new and tx.uncertain:
            return  # an earlier run of this body committed; its COMMIT's reply was lost
        if current != expected:
            raise ConcurrentMigrate(
                f"DST {dst.url}: the progress of {item} moved under this migrate "
                f"(expected {expected}, found {current}): another migrate is writing to it"
            )
        body(tx)
        tx.execute(q["mig_progress_put"], (item, new))

    dst.db.run_write(run)


def _insert_sql(dst: Any, table: Table, n_rows: int) -> str:
    blob = _template(dst.queries, "mig_blob_param", mark="?")
    group = "(" + ", ".join(blob if k == "blob" else "?" for k in table.kinds) + ")"
    return _template(
        dst.queries,
        "mig_insert",
        table=_quote(table.name),
        columns=", ".join(_quote(c) for c in table.columns),
        values=", ".join([group] * n_rows),
    )


def _insert(tx: Any, dst: Any, table: Table, rows: Sequence[Sequence[Any]]) -> None:
    """*rows* in statements of a few rows each, run with executemany: few enough
    parameters (at most _GROUP_PARAMS) for the driver to reuse its parsed statement."""
    per = max(1, _GROUP_PARAMS // len(table.columns))
    whole = len(rows) - len(rows) % per
    if whole:
        groups = ([v for row in rows[at : at + per] for v in row] for at in range(0, whole, per))
        tx.executemany(_insert_sql(dst, table, per), groups)
    if whole < len(rows):
        rest = rows[whole:]
        tx.execute(_insert_sql(dst, table, len(rest)), [v for row in rest for v in row])


# -- copying ---------------------------------------------------------------------------------


class _Copier:
    def __init__(
        self,
        src: Any,
        dst: Any,
        items: dict[str, str],
        batch_rows: int,
        progress: Progress | None,
        report: MigrateReport,
    ) -> None:
        self.src = src
        self.dst = dst
        self.items = items
        self.batch = batch_rows
        self.progress = progress
        self.report = report

    def table(self, table: Table, entry: TableReport) -> None:
        item = f"table:{table.name}"
        text = self.items.get(item)
        state: dict[str, Any] = (
            json.loads(text) if text else {"after": None, "rows": 0, "done": False}
        )
        reader = _Reader(self.src, table, binary=False)
        links = [table.index(c) for c in table.links]
        stage = f"copy {table.name}"
        if self.progress is not None:
            self.progress(stage, int(state["rows"]), entry.rows)
        while not state["done"]:
            rows = reader.page(state["after"], self.batch)
            if table.name == _BLOBS:
                self._blob_data(table, rows)
            values = (
                [[None if i in links else v for i, v in enumerate(row)] for row in rows]
                if links
                else rows
            )
            new: dict[str, Any] = {
                "after": _json_key(reader.key_of(rows[-1]), table) if rows else state["after"],
                "rows": int(state["rows"]) + len(rows),
                "done": len(rows) < self.batch,
            }
            new_text = json.dumps(new)

            def body(tx: Any, values: Sequence[Sequence[Any]] = values) -> None:
                if values:
                    _insert(tx, self.dst, table, values)

            _write_step(self.dst, item, text, new_text, body)
            self.items[item] = text = new_text
            state = new
            entry.copied += len(rows)
            if self.progress is not None:
                self.progress(stage, int(state["rows"]), entry.rows)
        if links:
            self._links(table, reader)

    def _links(self, table: Table, reader: _Reader) -> None:
        """Second pass: the columns that refer to the table's own rows."""
        item = f"links:{table.name}"
        text = self.items.get(item)
        state: dict[str, Any] = json.loads(text) if text else {"after": None, "done": False}
        at = [table.index(c) for c in table.links]
        q = self.dst.queries
        sql = _template(
            q,
            "mig_set_links",
            table=_quote(table.name),
            assignments=", ".join(f"{_quote(c)} = ?" for c in table.links),
            key=", ".join(_quote(c) for c in table.key),
            marks=", ".join("?" * len(table.key)),
        )
        while not state["done"]:
            rows = reader.page(state["after"], self.batch)
            updates = [
                ([row[i] for i in at], reader.key_of(row))
                for row in rows
                if any(row[i] is not None for i in at)
            ]
            new: dict[str, Any] = {
                "after": _json_key(reader.key_of(rows[-1]), table) if rows else state["after"],
                "done": len(rows) < self.batch,
            }
            new_text = json.dumps(new)

            def body(tx: Any, updates: list[tuple[list[Any], list[Any]]] = updates) -> None:
                if updates:
                    tx.executemany(sql, [(*values, *key) for values, key in updates])

            _write_step(self.dst, item, text, new_text, body)
            self.items[item] = text = new_text
            state = new

    def _blob_data(self, table: Table, rows: Sequence[Sequence[Any]]) -> None:
        """Each blob's payload into DST before the row that refers to it."""
        sha_at, size_at = table.index("sha256"), table.index("size")
        for row in rows:
            sha, size = str(row[sha_at]), int(row[size_at])
            try:
                packed = self.src.blobs.read_stored(sha)
            except errors.BlobCorrupt as exc:
                raise errors.BlobCorrupt(f"SRC {self.src.url}: {exc}") from exc
            try:
                self.dst.blobs.put_stored(sha, packed, size)
            except errors.BlobCorrupt as exc:
                raise errors.BlobCorrupt(
                    f"SRC {self.src.url}: blob {sha} is damaged ({exc}); nothing of it was copied"
                ) from exc
            self.report.blobs_copied += 1
            self.report.blob_bytes += len(packed)


def _json_key(key: list[Any], table: Table) -> list[Any]:
    for value in key:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise SchemaMismatch(
                f"table {table.name}: a key value of type {type(value).__name__} cannot be "
                "recorded for resuming"
            )
    return key


# -- verifying -------------------------------------------------------------------------------


def _verify(
    src: Any,
    dst: Any,
    tables: Sequence[Table],
    report: MigrateReport,
    batch: int,
    progress: Progress | None,
) -> None:
    entries = {t.name: t for t in report.tables}
    for table in tables:
        entry = entries[table.name]
        stage = f"verify {table.name}"
        entry.rows, entry.src_sha256 = table_digest(
            src, table, batch=batch, progress=progress, stage=stage + " (SRC)", total=entry.rows
        )
        entry.dst_rows, entry.dst_sha256 = table_digest(
            dst, table, batch=batch, progress=progress, stage=stage + " (DST)", total=entry.rows
        )
        if entry.dst_rows != entry.rows:
            report.problems.append(
                f"table {table.name}: {entry.rows} rows in SRC, {entry.dst_rows} in DST"
            )
        elif entry.dst_sha256 != entry.src_sha256:
            report.problems.append(
                f"table {table.name}: {entry.rows} rows on both sides but their contents differ "
                f"(SHA-256 {entry.src_sha256} in SRC, {entry.dst_sha256} in DST)"
            )
    blobs = next((t for t in tables if t.name == _BLOBS), None)
    if blobs is not None:
        reader = _Reader(dst, blobs, binary=False)
        sha_at, size_at = blobs.index("sha256"), blobs.index("size")
        total = entries[_BLOBS].dst_rows or 0
        for rows in reader.rows(batch):
            for row in rows:
                sha, size = str(row[sha_at]), int(row[size_at])
                try:
                    good = len(dst.blobs.get(sha, size)) == size
                except errors.BlobCorrupt:
                    good = False
                if good:
                    report.blobs_verified += 1
                else:
                    report.problems.append(
                        f"blob {sha}: missing or damaged in DST ({dst.blobs.describe(sha)})"
                    )
            if progress is not None:
                progress("verify blob data (DST)", report.blobs_verified, total)
    report.verified = not report.problems


# -- the public functions --------------------------------------------------------------------


def _check_batch(batch_rows: int) -> None:
    if (
        not isinstance(batch_rows, int)
        or isinstance(batch_rows, bool)
        or not 0 < batch_rows <= 100_000
    ):
        raise errors.InvalidInput(
            f"batch_rows must be an integer in [1, 100000], not {batch_rows!r}"
        )


def _plan(src: Any, dst: Any, report: MigrateReport) -> list[Table]:
    report.src_schema, report.dst_schema = src.db.schema_version, dst.db.schema_version
    src_tables = _read_schema(src)
    _compare(src_tables, _read_schema(dst), src.url, dst.url)
    return copy_order(src_tables)


def migrate(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    progress: Progress | None = None,
    verify: bool = True,
    settings: dict[str, Any] | None = None,
) -> MigrateReport:
    """Copy every table of the store *src* into *dst* (created if it does not
    exist; it must be empty, or hold an interrupted migrate of *src*, which this
    run continues), then verify the copy (``VerificationFailed`` on a difference).
    *src* and *dst*: a path, ``sqlite:///absolute/path`` or ``postgresql://...``.
    *settings*: ``Settings`` fields for opening both stores."""
    _check_batch(batch_rows)
    started = time.monotonic()
    src_target, dst_target, src_id, _ = _pair(src, dst, dst_must_exist=False)
    config = dict(settings or {})
    with _opened(src_target, config) as s, _opened(dst_target, config) as d:
        report = MigrateReport(str(s.url), str(d.url), s.dialect, d.dialect)
        tables = _plan(s, d, report)
        report.resumed, items = _claim(d, tables, src_id)
        report.tables = [TableReport(t.name, _count(s, t)) for t in tables]
        if items.get("state") not in ("copied", "done"):
            copier = _Copier(s, d, items, batch_rows, progress, report)
            for table, entry in zip(tables, report.tables, strict=True):
                copier.table(table, entry)
            _set_item(d, "state", "copied")
        if verify:
            _verify(s, d, tables, report, batch_rows, progress)
        report.seconds = time.monotonic() - started
        if report.problems:
            raise VerificationFailed(
                f"DST {d.url} does not equal SRC {s.url}: " + "; ".join(report.problems),
                report.problems,
                report,
            )
        if verify:
            _set_item(d, "state", "done")
            _set_item(d, "finished", _now_text())
    return report


def verify_report(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    progress: Progress | None = None,
    settings: dict[str, Any] | None = None,
) -> MigrateReport:
    """Compare two existing stores as ``migrate`` verifies a copy, changing
    neither (beyond the schema migrations ``fleetstore.open`` applies).  The
    report's ``problems`` list every difference; ``SchemaMismatch`` if the
    schemas differ."""
    _check_batch(batch_rows)
    started = time.monotonic()
    src_target, dst_target, _, _ = _pair(src, dst, dst_must_exist=True)
    config = dict(settings or {})
    with _opened(src_target, config) as s, _opened(dst_target, config) as d:
        report = MigrateReport(str(s.url), str(d.url), s.dialect, d.dialect, copied=False)
        tables = _plan(s, d, report)
        report.tables = [TableReport(t.name, _count(s, t)) for t in tables]
        _verify(s, d, tables, report, batch_rows, progress)
    report.seconds = time.monotonic() - started
    return report


def verify(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    progress: Progress | None = None,
    settings: dict[str, Any] | None = None,
) -> list[str]:
    """Every difference between the stores *src* and *dst* (empty: equal):
    per table its row count and a SHA-256 of its rows, and every blob of *dst*."""
    return verify_report(src, dst, progress=progress, settings=settings).problems


def format_report(report: MigrateReport) -> str:
    """The report for people."""
    lines = [
        f"fleetstore migrate: {report.src} ({report.src_dialect}, schema {report.src_schema})"
        f" -> {report.dst} ({report.dst_dialect}, schema {report.dst_schema})"
        + (" [verify only]" if not report.copied else " [resumed]" if report.resumed else "")
    ]
    width = max((len(t.name) for t in report.tables), default=5)
    lines.append(f"  {'table':<{width}}  {'rows':>10}  {'copied':>10}  verified")
    for t in report.tables:
        check = "ok" if t.verified else ("-" if t.src_sha256 is None else "DIFFERS")
        lines.append(f"  {t.name:<{width}}  {t.rows:>10,}  {t.copied:>10,}  {check}")
    if report.copied:
        lines.append(
            f"  blob payloads copied: {report.blobs_copied:,} ({report.blob_bytes:,} bytes stored)"
        )
    lines.append(f"  blob payloads verified in DST: {report.blobs_verified:,}")
    for problem in report.problems:
        lines.append(f"  MISMATCH: {problem}")
    if report.ok:
        lines.append(
            f"verified: {len(report.tables)} tables, {report.rows:,} rows, every row count and "
            f"SHA-256 equal ({report.seconds:.1f}s)"
        )
    elif report.problems:
        lines.append(f"FAILED: {len(report.problems)} difference(s) between SRC and DST")
    else:
        lines.append("copied, not verified")
    return "\n".join(lines)


__all__ = [
    "DEFAULT_BATCH_ROWS",
    "NOT_COPIED",
    "PROGRESS_TABLE",
    "ConcurrentMigrate",
    "DestinationNotEmpty",
    "MigrateReport",
    "Progress",
    "SchemaMismatch",
    "Table",
    "TableReport",
    "VerificationFailed",
    "copy_order",
    "encode_row",
    "format_report",
    "identity",
    "migrate",
    "table_digest",
    "verify",
    "verify_report",
]
