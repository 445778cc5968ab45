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

The sharded layout (``sqlite+sharded:///DIR``: a catalog and a file per session
tree, fleetstore.store.sharded) is one more kind of store on either side.  Read, it is
the union of its files ("parts": the catalog, then each shard in key order), the
catalog's index copies of sharded sessions left out and a blob reference row that
several files hold counted once (the first part's); the copy goes part by part.
Written, each row goes to the file the router would have put it in: a session tree
to the shard of its root (``shard_key(root_id)``), unless a catalog table refers to
one of its sessions (an ADK session: the catalog), its messages, parts, chunks,
usage, state and operation log with it; a ``blobs`` row to every file whose rows
refer to it (in the same transaction as those rows); everything else (effects,
checkpoints, ADK tables) to the catalog; the catalog's index is built last.  A
batch then spans several files, so the rows are written idempotently (a batch
retried after a kill finds its rows and leaves them), and the progress record, in
the catalog, moves last.  Verification compares, per table, the count and an
order-free digest (the sum of the rows' SHA-256, modulo 2**256, over the union of
the parts), then every session's content digest read through the Store API
(``transfer.session_digest``: each session where the router finds it), and, for a
sharded DST, that the catalog's index names exactly the sessions each shard holds.
tests/transfer/test_reshard.py
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fleetstore import errors
from fleetstore.core.targets import CATALOG, SHARDED_SCHEME, parse_target
from fleetstore.domain.registry import TREE_FILE_OPS
from fleetstore.engine.sharded import shard_key
from fleetstore.store.facade import open as open_store
from fleetstore.transfer.stream import session_digest

#: ``progress(stage, done, total)``: called as batches are copied and tables verified.
Progress = Callable[[str, int, int], None]

#: Rows per batch (one write transaction on DST) by default.
DEFAULT_BATCH_ROWS = 500
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
_BLOBS = "blobs"
_SESSIONS = "sessions"
#: Parameters per INSERT statement: psycopg parses a statement of at most 50 once.
_GROUP_PARAMS = 50
#: Values per ``IN (...)`` list of a lookup.
_IN_LIST = 400
#: Into a sharded DST: pages read before writing them out, shard by shard (a bound on
#: the rows, and on their bytes, held in memory).
_WINDOW_PAGES = 20
_WINDOW_BYTES = 32 * 1024 * 1024
#: The sharded layout: the tables whose rows live in their session tree's shard, with
#: the column that names the session (``chunks`` through its message).
_BY_SESSION = {
    "sessions": "id",
    "messages": "session_id",
    "parts": "session_id",
    "usage": "session_id",
    "state": "session_id",
    "applied_ops": "session_id",
}
_BY_MESSAGE = {"chunks": "message_id"}
#: applied_ops rows of these operations live where the router applies them: in the
#: session's shard; any other operation's in the catalog (an effect's op names the
#: effect in its ``session_id`` column).
_TREE_OPS = TREE_FILE_OPS


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
    #: Each store's layout: "file", "sharded" or "server" (``Store.layout``).
    src_layout: str = ""
    dst_layout: str = ""
    #: Shard files of each store (0 unless sharded).
    src_shards: int = 0
    dst_shards: int = 0
    #: Sessions whose content digest (``transfer.session_digest``) was compared: every
    #: session, when either store is sharded.
    sessions_verified: int = 0

    @property
    def ok(self) -> bool:
        return self.verified and not self.problems

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)

    @property
    def sharded(self) -> bool:
        """Whether either store is sharded (rows hashed order-free, sessions compared)."""
        return "sharded" in (self.src_layout, self.dst_layout)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["ok"] = self.ok
        for t, report in zip(out["tables"], self.tables, strict=True):
            t["verified"] = report.verified
        return out


# -- opening ---------------------------------------------------------------------------------


def identity(url_or_path: str | os.PathLike[str]) -> str:
    """What names a store for ``migrate``: ``sqlite:/absolute/path``,
    ``sqlite+sharded:/absolute/directory`` or ``postgresql://host:port/database``
    (no user, no password)."""
    kind, target = parse_target(url_or_path)
    if isinstance(target, Path):
        return f"{SHARDED_SCHEME if kind == 'sharded' else 'sqlite'}:" + str(
            target.expanduser().resolve()
        )
    parts = urlsplit(str(target))
    database = parts.path.lstrip("/") or parts.username or "postgres"
    host = (parts.hostname or "localhost").lower()
    return f"{kind}://{host}:{parts.port or 5432}/{database}"


def _target(url_or_path: str | os.PathLike[str], must_exist: bool, what: str) -> Path | str:
    """What to open: a SQLite file's path, a sharded store's URL, a PostgreSQL URL."""
    kind, target = parse_target(url_or_path)
    if kind == "sharded":
        assert isinstance(target, Path)
        directory = target.expanduser().absolute()
        if must_exist and not (directory / CATALOG).is_file():
            raise errors.NotFound(
                f"{what}: no sharded store at {directory} (no {CATALOG}; nothing was created)"
            )
        if (
            not must_exist
            and directory.is_dir()
            and not (directory / CATALOG).exists()
            and any(directory.iterdir())
        ):
            raise DestinationNotEmpty(
                f"{what}: {directory} holds other files and no sharded store; give a new or "
                "empty directory. Nothing was written."
            )
        return f"{SHARDED_SCHEME}://{directory}"
    if isinstance(target, Path) and must_exist and not target.is_file():
        raise errors.NotFound(f"{what}: no store at {target} (nothing was created)")
    return target


def _open_files() -> int:
    try:
        import resource

        return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (ImportError, OSError, ValueError):
        return 1024


@contextmanager
def _opened(target: Path | str, settings: dict[str, Any]) -> Iterator[Any]:
    settings = dict(settings)
    if (
        isinstance(target, str)
        and target.startswith(SHARDED_SCHEME)
        and "max_open_shards" not in settings
        and not os.environ.get("FLEETSTORE_MAX_OPEN_SHARDS")
    ):
        # Each batch of rows in key order spans many trees: with the store's usual bound
        # (64) every batch closed and reopened shards (12 ms each: a copy of 300 trees
        # took 26 s, 6.8 s with all of them open).  As many as the file limit allows,
        # about 20 descriptors a shard (writer, reader, checkpointer, gate).
        settings["max_open_shards"] = max(64, min(4096, _open_files() // 20))
    store = open_store(target, **settings)
    try:
        yield store
    finally:
        store.close()


def _pair(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], dst_must_exist: bool
) -> tuple[Path | str, Path | str, str, str]:
    src_id, dst_id = identity(src), identity(dst)
    src_target = _target(src, True, "SRC")
    same = src_id == dst_id
    dst_path = parse_target(dst)[1]
    src_path = parse_target(src)[1]
    if isinstance(src_path, Path) and isinstance(dst_path, Path) and dst_path.exists():
        same = same or os.path.samefile(src_path, dst_path)
    if same:
        raise errors.InvalidInput(f"SRC and DST are the same store ({src_id}); nothing was done")
    dst_target = _target(dst, dst_must_exist, "DST")
    return src_target, dst_target, src_id, dst_id


# -- a store's databases ---------------------------------------------------------------------


class _Side:
    """One store as migrate reads and writes it: its databases ("parts": the store's
    own database, key None, then a sharded store's shards in key order)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.queries: dict[str, str] = store.queries
        self.router = getattr(store, "router", None)
        self.sharded = self.router is not None

    def parts(self) -> list[str | None]:
        if self.router is None:
            return [None]
        return [None, *self.router.shards.keys()]

    @contextmanager
    def use(self, part: str | None, *, create: bool = False) -> Iterator[Any]:
        if part is None:
            yield self.store.db
            return
        assert self.router is not None
        with self.router.shards.use(part, create=create) as db:
            yield db

    def source(self, part: str | None, table: Table) -> str:
        """The table as a part holds it: a sharded store's catalog without its index
        copies of the sessions that live in shards."""
        name = _quote(table.name)
        if self.sharded and part is None and table.name == _SESSIONS:
            # A primary-key probe per row; the key order of the outer query stays the
            # sessions index's (the subquery is flattened).
            return (
                f"(SELECT * FROM {name} WHERE NOT EXISTS (SELECT 1 FROM shard_sessions x "
                f"WHERE x.session_id = {name}.id)) AS {name}"
            )
        return name

    def shard_count(self) -> int:
        return len(self.parts()) - 1

    def blob_rows(self, blobs: Table, batch: int) -> Iterator[tuple[Any, ...]]:
        """Every ``blobs`` row, each hash once (the first part's row)."""
        seen: set[str] = set()
        sha_at = blobs.index("sha256")
        for part in self.parts():
            with self.use(part) as db:
                reader = _Reader(self.store, blobs, binary=False, db=db)
                for rows in reader.rows(batch):
                    for row in rows:
                        sha = str(row[sha_at])
                        if sha not in seen:
                            seen.add(sha)
                            yield row


# -- reading in key order --------------------------------------------------------------------


def _template(queries: dict[str, str], name: str, **fields: Any) -> str:
    # Templates are filled with str.format: comment lines (which may hold braces or
    # quotes) are dropped first.
    text = "\n".join(
        line for line in queries[name].splitlines() if not line.lstrip().startswith("--")
    )
    return text.format(**fields)


class _Reader:
    """The statements that read one table of one store (or one of its databases,
    *db*, the table as *source*) in key order."""

    def __init__(
        self,
        store: Any,
        table: Table,
        *,
        binary: bool,
        db: Any = None,
        source: str | None = None,
    ) -> None:
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
        fields = {"columns": columns, "table": source or _quote(table.name), "order": order}
        self.store = store
        self.db = store.db if db is None else db
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
        rows: list[tuple[Any, ...]] = self.db.read(lambda tx: tx.execute(sql, params))
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


def _counts(side: _Side, tables: Sequence[Table]) -> dict[str, int]:
    """Rows per table, over every part of *side* (each blob hash once)."""
    q = side.queries
    totals = dict.fromkeys((t.name for t in tables), 0)
    shas: set[str] = set()
    dedupe = side.sharded and any(t.name == _BLOBS for t in tables)
    for part in side.parts():
        sqls = {
            t.name: _template(q, "mig_count", table=side.source(part, t))
            for t in tables
            if not (dedupe and t.name == _BLOBS)
        }

        def run(tx: Any, sqls: dict[str, str] = sqls) -> tuple[dict[str, int], list[Any]]:
            found = {n: int(tx.execute(s)[0][0]) for n, s in sqls.items()}
            return found, tx.execute("SELECT sha256 FROM blobs") if dedupe else []

        with side.use(part) as db:
            found, blob_keys = db.read(run)
        for name, n in found.items():
            totals[name] += n
        shas.update(str(r[0]) for r in blob_keys)
    if dedupe:
        totals[_BLOBS] = len(shas)
    return totals


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
    """(rows, SHA-256 hex) of *table* in *store* (one database): the canonical
    encoding of every row, in byte order of its key."""
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


_MOD = 1 << 256


def _sum_digests(
    side: _Side,
    tables: Sequence[Table],
    *,
    batch: int,
    progress: Progress | None,
    stage: str,
    total: int,
) -> dict[str, tuple[int, str]]:
    """(rows, digest) of each table over every part of *side*, in no order: the sum of
    the SHA-256 of each row's canonical encoding, modulo 2**256 (rows are distinct by
    their key, so a row missing, added or changed changes the sum); each blob hash
    counted once, its first part's row.  One pass over the parts, each opened once."""
    sums = {t.name: [0, 0] for t in tables}
    seen: set[str] = set()
    done = 0
    for part in side.parts():
        with side.use(part) as db:
            for table in tables:
                reader = _Reader(
                    side.store, table, binary=False, db=db, source=side.source(part, table)
                )
                acc = sums[table.name]
                dedupe = side.sharded and table.name == _BLOBS
                sha_at = table.index("sha256") if dedupe else -1
                for rows in reader.rows(batch):
                    for row in rows:
                        if dedupe:
                            if row[sha_at] in seen:
                                continue
                            seen.add(str(row[sha_at]))
                        acc[0] += int.from_bytes(
                            hashlib.sha256(encode_row(row, table.kinds)).digest(), "big"
                        )
                        acc[1] += 1
                    acc[0] %= _MOD
                    done += len(rows)
                    if progress is not None:
                        progress(stage, done, total)
    return {name: (n, f"{acc:064x}") for name, (acc, n) in sums.items()}


def _part_pages(side: _Side, table: Table, batch: int) -> Iterator[list[tuple[Any, ...]]]:
    for part in side.parts():
        with side.use(part) as db:
            reader = _Reader(
                side.store, table, binary=False, db=db, source=side.source(part, table)
            )
            yield from reader.rows(batch)


# -- the destination's progress record -------------------------------------------------------


def _now_text() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _claim(dst: _Side, tables: Sequence[Table], src_id: str) -> tuple[bool, dict[str, str]]:
    """Record SRC as DST's source (refusing a DST that holds other data), or find
    the record of an earlier run from the same SRC.  (resumed, progress items)."""
    store = dst.store
    q = store.queries
    probes = [(t.name, _template(q, "mig_any_row", table=_quote(t.name))) for t in tables]
    shards = dst.shard_count()

    def run(tx: Any) -> tuple[bool, dict[str, str]]:
        tx.execute(q["mig_progress_create"])
        items = {str(k): str(v) for k, v in tx.execute(q["mig_progress_get"])}
        source = items.get("source")
        if source is None:
            holding = [name for name, sql in probes if tx.execute(sql)]
            if shards:
                holding.append(f"{shards} shard file(s)")
            if holding:
                raise DestinationNotEmpty(
                    f"DST {store.url} already holds data (tables {', '.join(holding)}) that did "
                    "not come from an interrupted migrate of this SRC; migrate into a new, "
                    "empty store. Nothing was written."
                )
            items = {"source": src_id, "started": _now_text(), "state": "copying"}
            for item, value in items.items():
                tx.execute(q["mig_progress_put"], (item, value))
            return False, items
        if source != src_id:
            raise DestinationNotEmpty(
                f"DST {store.url} holds a migrate from another store ({source}), not from "
                f"{src_id}; nothing was written"
            )
        return True, items

    result: tuple[bool, dict[str, str]] = store.db.run_write(run)
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


def _insert_sql(dst: Any, table: Table, n_rows: int, ignore: bool = False) -> str:
    blob = _template(dst.queries, "mig_blob_param", mark="?")
    group = "(" + ", ".join(blob if k == "blob" else "?" for k in table.kinds) + ")"
    sql = _template(
        dst.queries,
        "mig_insert",
        table=_quote(table.name),
        columns=", ".join(_quote(c) for c in table.columns),
        values=", ".join([group] * n_rows),
    )
    # Both dialects: a row whose key is there already is left as it is.
    return sql + " ON CONFLICT DO NOTHING" if ignore else sql


def _insert(
    tx: Any, dst: Any, table: Table, rows: Sequence[Sequence[Any]], ignore: bool = False
) -> None:
    """*rows* in statements of a few rows each, run with executemany: few enough
    parameters (at most _GROUP_PARAMS) for the driver to reuse its parsed statement.
    *ignore*: rows whose key is there already are skipped (the sharded layout's blob
    reference rows, and batches that span files, so are retried whole)."""
    per = max(1, _GROUP_PARAMS // len(table.columns))
    whole = len(rows) - len(rows) % per
    if whole:
        groups = ([v for row in rows[at : at + per] for v in row] for at in range(0, whole, per))
        tx.executemany(_insert_sql(dst, table, per, ignore), groups)
    if whole < len(rows):
        rest = rows[whole:]
        tx.execute(_insert_sql(dst, table, len(rest), ignore), [v for row in rest for v in row])


# -- where rows go in a sharded destination --------------------------------------------------


class _Homes:
    """Which file of a sharded DST each session's rows go to: the shard of its tree's
    root, or the catalog (None) for a tree a catalog table refers to."""

    def __init__(self) -> None:
        #: session id -> root_id
        self.roots: dict[str, str] = {}
        #: roots of the trees kept in the catalog
        self.in_catalog: set[str] = set()

    def of(self, session_id: Any) -> str | None:
        root = self.roots.get(session_id) if isinstance(session_id, str) else None
        if root is None or root in self.in_catalog:
            return None
        return shard_key(root)


def _homes(src: _Side, tables: dict[str, Table]) -> _Homes:
    """Read from SRC every session's tree, and the trees that must stay in the
    catalog: those whose sessions a catalog table refers to (ADK's ``adk_sessions``),
    and, from a sharded SRC, those its catalog holds."""
    homes = _Homes()
    sessions = tables[_SESSIONS]
    pinned: set[str] = set()
    refs = [
        (t, c)
        for t in tables.values()
        if t.name not in _BY_SESSION and t.name not in _BY_MESSAGE
        for c, p in t.references
        if p == _SESSIONS
    ]
    for part in src.parts():
        source = src.source(part, sessions)
        sql = f"SELECT id, root_id FROM {source}"
        lookups = [
            f"SELECT DISTINCT {_quote(c)} FROM {src.source(part, t)} WHERE {_quote(c)} IS NOT NULL"
            for t, c in refs
        ]

        def run(
            tx: Any, sql: str = sql, lookups: list[str] = lookups
        ) -> tuple[list[tuple[Any, ...]], list[Any]]:
            return tx.execute(sql), [r[0] for s in lookups for r in tx.execute(s)]

        with src.use(part) as db:
            rows, referred = db.read(run)
        for sid, root in rows:
            homes.roots[str(sid)] = str(root)
            if src.sharded and part is None:
                homes.in_catalog.add(str(root))
        pinned.update(str(s) for s in referred)
    homes.in_catalog.update(homes.roots[s] for s in pinned if s in homes.roots)
    return homes


# -- copying ---------------------------------------------------------------------------------


class _Copier:
    def __init__(
        self,
        src: _Side,
        dst: _Side,
        tables: dict[str, Table],
        items: dict[str, str],
        batch_rows: int,
        progress: Progress | None,
        report: MigrateReport,
    ) -> None:
        self.src = src
        self.dst = dst
        self.tables = tables
        self.items = items
        self.batch = batch_rows
        self.progress = progress
        self.report = report
        self.homes = _homes(src, tables) if dst.sharded else None
        #: Blob hashes whose payload this run copied (a sharded SRC's files share some).
        self.payloads: set[str] = set()
        #: Blob hashes whose row this run counted as copied.
        self.counted: set[str] = set()
        self.done = 0
        self.total = report.rows

    def part(
        self, part: str | None, tables: Sequence[Table], entries: Sequence[TableReport]
    ) -> None:
        with self.src.use(part) as db:
            for table, entry in zip(tables, entries, strict=True):
                self.table(part, db, table, entry)

    def _tell(self, table: Table, rows: int, entry: TableReport) -> None:
        if self.progress is None:
            return
        if self.src.sharded:
            # One stage for every file: a bar per table and file would flicker.
            self.progress(
                f"copy (catalog and {self.src.shard_count()} shards)", self.done, self.total
            )
        else:
            self.progress(f"copy {table.name}", rows, entry.rows)

    def table(self, part: str | None, db: Any, table: Table, entry: TableReport) -> None:
        suffix = "" if part is None else f"@{part}"
        item = f"table:{table.name}{suffix}"
        text = self.items.get(item)
        state: dict[str, Any] = (
            json.loads(text) if text else {"after": None, "rows": 0, "done": False}
        )
        reader = _Reader(
            self.src.store, table, binary=False, db=db, source=self.src.source(part, table)
        )
        links = [table.index(c) for c in table.links]
        self._tell(table, int(state["rows"]), entry)
        while not state["done"]:
            rows, done = self._window(reader, state["after"])
            if table.name == _BLOBS:
                self._blob_data(table, rows)
            values = (
                [tuple(None if i in links else v for i, v in enumerate(row)) for row in rows]
                if links
                else rows
            )
            new: dict[str, Any] = {
                "after": _json_key(reader.key_of(rows[-1]), table) if rows else state["after"],
                "rows": int(state["rows"]) + len(rows),
                "done": done,
            }
            new_text = json.dumps(new)
            self._put(part, db, table, values, item, text, new_text)
            self.items[item] = text = new_text
            state = new
            entry.copied += self._new_rows(table, rows)
            self.done += len(rows)
            self._tell(table, int(state["rows"]), entry)
        if links:
            self._links(part, db, table, reader, suffix)

    def _window(
        self, reader: _Reader, after: Sequence[Any] | None
    ) -> tuple[list[tuple[Any, ...]], bool]:
        """The next rows of a table to copy, and whether they are its last: one page
        (one batch); into a sharded DST, pages up to _WINDOW_PAGES or _WINDOW_BYTES,
        so that each shard gets its rows of many pages in one transaction (a page of
        rows in key order spans many trees: one transaction per tree and page made a
        copy of 300 trees 40 times slower)."""
        rows = reader.page(after, self.batch)
        if not self.dst.sharded:
            return rows, len(rows) < self.batch
        size, pages = _weight(rows), 1
        while len(rows) == pages * self.batch:
            if pages >= _WINDOW_PAGES or size >= _WINDOW_BYTES:
                return rows, False
            more = reader.page(reader.key_of(rows[-1]), self.batch)
            rows.extend(more)
            size += _weight(more)
            pages += 1
        return rows, True

    def _new_rows(self, table: Table, rows: Sequence[Sequence[Any]]) -> int:
        if table.name != _BLOBS or not self.src.sharded:
            return len(rows)
        # A blob row several files of SRC hold is one row of the copy.
        sha_at = table.index("sha256")
        fresh = {str(r[sha_at]) for r in rows} - self.counted
        self.counted.update(fresh)
        return len(fresh)

    # -- writing one batch ---------------------------------------------------------------

    def _put(
        self,
        part: str | None,
        src_db: Any,
        table: Table,
        rows: Sequence[Sequence[Any]],
        item: str,
        expected: str | None,
        new: str,
    ) -> None:
        """Insert one batch of SRC rows and move the progress record with it."""
        dst = self.dst.store
        if not self.dst.sharded:
            ignore = table.name == _BLOBS and self.src.sharded

            def body(tx: Any) -> None:
                if rows:
                    _insert(tx, dst, table, rows, ignore)

            try:
                _write_step(dst, item, expected, new, body)
            except errors.IntegrityError as exc:
                if not self.src.sharded:
                    raise
                raise errors.IntegrityError(
                    f"table {table.name}: a row of {self.src.store.url} ({part or 'catalog'}) "
                    f"has the key of a row another of its files holds ({exc}): ids chosen by "
                    "the caller (a message id) are unique within a session tree only, so "
                    "these trees cannot share one file as they are; this batch was not written"
                ) from exc
            return
        groups = self._route(part, src_db, table, rows)
        here = groups.pop(None, [])
        for key, part_rows in sorted(_shard_groups(groups)):
            with self.dst.use(key, create=True) as db:
                for chunk in _chunks(part_rows, self.batch):
                    db.run_write(lambda tx, c=chunk: self._insert_with_blobs(tx, src_db, table, c))
        # The catalog's rows, the last batch with the progress record: the record moves
        # once every row before it is in.
        *first, last = _chunks(here, self.batch)
        for chunk in first:
            dst.db.run_write(lambda tx, c=chunk: self._insert_with_blobs(tx, src_db, table, c))

        def catalog(tx: Any) -> None:
            self._insert_with_blobs(tx, src_db, table, last)

        _write_step(dst, item, expected, new, catalog)

    def _insert_with_blobs(
        self, tx: Any, src_db: Any, table: Table, rows: Sequence[Sequence[Any]]
    ) -> None:
        """*rows* into one file of a sharded DST, after the ``blobs`` rows they refer
        to (each file holds the reference rows of its own rows)."""
        if not rows:
            return
        at = table.refers_to(_BLOBS)
        shas = sorted({str(r[i]) for r in rows for i in at if r[i] is not None})
        if shas:
            blobs = self.tables[_BLOBS]
            found = _lookup(src_db, self.src.store, blobs, "sha256", shas)
            _insert(tx, self.dst.store, blobs, found, ignore=True)
        _insert(tx, self.dst.store, table, rows, ignore=True)

    def _route(
        self, part: str | None, src_db: Any, table: Table, rows: Sequence[Sequence[Any]]
    ) -> dict[str | None, list[Sequence[Any]]]:
        """The rows of one batch by the file of DST they go to (None: the catalog)."""
        homes = self.homes
        assert homes is not None
        name = table.name
        groups: dict[str | None, list[Sequence[Any]]] = {}
        if name in _BY_SESSION:
            at = table.index(_BY_SESSION[name])
            op_at = table.index("name") if name == "applied_ops" else -1
            for row in rows:
                key = homes.of(row[at]) if op_at < 0 or row[op_at] in _TREE_OPS else None
                groups.setdefault(key, []).append(row)
        elif name in _BY_MESSAGE:
            at = table.index(_BY_MESSAGE[name])
            owners = dict(
                _lookup_pairs(src_db, "messages", "id", "session_id", {str(r[at]) for r in rows})
            )
            for row in rows:
                groups.setdefault(homes.of(owners.get(str(row[at]))), []).append(row)
        elif name == _BLOBS:
            # The rows of the files that refer to a blob bring its reference row along
            # (_insert_with_blobs); one no tree row refers to goes to the catalog, or,
            # from a sharded SRC, to the file that holds it there.
            sha_at = table.index("sha256")
            used = self._used_in_trees(src_db, {str(r[sha_at]) for r in rows})
            keep = part if self.src.sharded else None
            rest = [r for r in rows if str(r[sha_at]) not in used]
            if rest:
                groups[keep] = rest
        elif rows:
            groups[None] = list(rows)
        return groups

    def _used_in_trees(self, src_db: Any, shas: set[str]) -> set[str]:
        """The blob hashes that rows of tables kept in shards refer to (in *src_db*)."""
        used: set[str] = set()
        for t in self.tables.values():
            if t.name not in _BY_SESSION and t.name not in _BY_MESSAGE:
                continue
            for column, parent in t.references:
                if parent == _BLOBS:
                    used.update(
                        str(a) for a, _ in _lookup_pairs(src_db, t.name, column, column, shas)
                    )
        return used

    def _links(
        self, part: str | None, src_db: Any, table: Table, reader: _Reader, suffix: str
    ) -> None:
        """Second pass: the columns that refer to the table's own rows."""
        item = f"links:{table.name}{suffix}"
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
            rows, done = self._window(reader, state["after"])
            linked = [row for row in rows if any(row[i] is not None for i in at)]
            new: dict[str, Any] = {
                "after": _json_key(reader.key_of(rows[-1]), table) if rows else state["after"],
                "done": done,
            }
            new_text = json.dumps(new)
            groups: dict[str | None, list[Sequence[Any]]] = (
                self._route(part, src_db, table, linked)
                if self.dst.sharded
                else {None: list(linked)}
            )
            here = groups.pop(None, [])
            for key, part_rows in sorted(_shard_groups(groups)):
                params = [(*[r[i] for i in at], *reader.key_of(r)) for r in part_rows]
                with self.dst.use(key, create=True) as db:
                    db.run_write(lambda tx, p=params: tx.executemany(sql, p))
            params = [(*[r[i] for i in at], *reader.key_of(r)) for r in here]

            def body(tx: Any, params: list[tuple[Any, ...]] = params) -> None:
                if params:
                    tx.executemany(sql, params)

            _write_step(self.dst.store, item, text, new_text, body)
            self.items[item] = text = new_text
            state = new

    def _blob_data(self, table: Table, rows: Sequence[Sequence[Any]]) -> None:
        """Each blob's payload into DST before the row that refers to it."""
        sha_at, size_at = table.index("sha256"), table.index("size")
        src, dst = self.src.store, self.dst.store
        for row in rows:
            sha, size = str(row[sha_at]), int(row[size_at])
            if sha in self.payloads:
                continue
            try:
                packed = src.blobs.read_stored(sha)
            except errors.BlobCorrupt as exc:
                raise errors.BlobCorrupt(f"SRC {src.url}: {exc}") from exc
            try:
                dst.blobs.put_stored(sha, packed, size)
            except errors.BlobCorrupt as exc:
                raise errors.BlobCorrupt(
                    f"SRC {src.url}: blob {sha} is damaged ({exc}); nothing of it was copied"
                ) from exc
            self.payloads.add(sha)
            self.report.blobs_copied += 1
            self.report.blob_bytes += len(packed)

    def index(self) -> None:
        """A sharded DST: the catalog's index of every shard's sessions, built from
        the shards (idempotent: a run killed in the middle does it again)."""
        if self.items.get("index") == "done":
            return
        assert self.dst.router is not None
        self.dst.router.reindex()
        _set_item(self.dst.store, "index", "done")


def _weight(rows: Sequence[Sequence[Any]]) -> int:
    """About the bytes *rows* hold (their text and byte values)."""
    return sum(len(v) for row in rows for v in row if isinstance(v, str | bytes)) + 16 * len(rows)


def _chunks(rows: Sequence[Sequence[Any]], size: int) -> list[Sequence[Sequence[Any]]]:
    return [rows[at : at + size] for at in range(0, len(rows), size)] or [rows]


def _shard_groups(
    groups: dict[str | None, list[Sequence[Any]]],
) -> list[tuple[str, list[Sequence[Any]]]]:
    return [(key, rows) for key, rows in groups.items() if key is not None]


def _lookup(db: Any, store: Any, table: Table, column: str, values: Sequence[str]) -> list[Any]:
    """The rows of *table* in *db* whose *column* is one of *values*."""
    columns = ", ".join(_quote(c) for c in table.columns)
    found: list[Any] = []
    for at in range(0, len(values), _IN_LIST):
        chunk = list(values[at : at + _IN_LIST])
        sql = (
            f"SELECT {columns} FROM {_quote(table.name)} "
            f"WHERE {_quote(column)} IN ({', '.join('?' * len(chunk))})"
        )
        found.extend(db.read(lambda tx, sql=sql, chunk=chunk: tx.execute(sql, chunk)))
    if table.payloads:
        return [_normal(table, r) for r in found]
    return found


def _lookup_pairs(
    db: Any, table: str, column: str, other: str, values: set[str]
) -> list[tuple[Any, Any]]:
    """(column, other) of the rows of *table* in *db* whose *column* is in *values*."""
    ordered = sorted(values)
    found: list[tuple[Any, Any]] = []
    for at in range(0, len(ordered), _IN_LIST):
        chunk = ordered[at : at + _IN_LIST]
        sql = (
            f"SELECT DISTINCT {_quote(column)}, {_quote(other)} FROM {_quote(table)} "
            f"WHERE {_quote(column)} IN ({', '.join('?' * len(chunk))})"
        )
        found.extend(db.read(lambda tx, sql=sql, chunk=chunk: tx.execute(sql, chunk)))
    return found


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
    src: _Side,
    dst: _Side,
    tables: Sequence[Table],
    report: MigrateReport,
    batch: int,
    progress: Progress | None,
) -> None:
    entries = {t.name: t for t in report.tables}
    layouts = src.sharded or dst.sharded
    if layouts:
        total = sum(e.rows for e in report.tables)
        mine = _sum_digests(
            src, tables, batch=batch, progress=progress, stage="verify (SRC)", total=total
        )
        theirs = _sum_digests(
            dst, tables, batch=batch, progress=progress, stage="verify (DST)", total=total
        )
    for table in tables:
        entry = entries[table.name]
        stage = f"verify {table.name}"
        if layouts:
            entry.rows, entry.src_sha256 = mine[table.name]
            entry.dst_rows, entry.dst_sha256 = theirs[table.name]
        else:
            entry.rows, entry.src_sha256 = table_digest(
                src.store,
                table,
                batch=batch,
                progress=progress,
                stage=stage + " (SRC)",
                total=entry.rows,
            )
            entry.dst_rows, entry.dst_sha256 = table_digest(
                dst.store,
                table,
                batch=batch,
                progress=progress,
                stage=stage + " (DST)",
                total=entry.rows,
            )
        if entry.dst_rows != entry.rows:
            report.problems.append(
                f"table {table.name}: {entry.rows} rows in SRC, {entry.dst_rows} in DST"
            )
        elif entry.dst_sha256 != entry.src_sha256:
            kind = "sum of row SHA-256s" if layouts else "SHA-256"
            report.problems.append(
                f"table {table.name}: {entry.rows} rows on both sides but their contents differ "
                f"({kind} {entry.src_sha256} in SRC, {entry.dst_sha256} in DST)"
            )
    blobs = next((t for t in tables if t.name == _BLOBS), None)
    if blobs is not None:
        _verify_blobs(dst, blobs, entries[_BLOBS].dst_rows or 0, report, batch, progress)
    if layouts:
        report.problems.extend(_layout_problems(src, "SRC"))
        report.problems.extend(_layout_problems(dst, "DST"))
        _verify_sessions(src, dst, tables, report, batch, progress)
    report.verified = not report.problems


def _verify_blobs(
    dst: _Side,
    blobs: Table,
    total: int,
    report: MigrateReport,
    batch: int,
    progress: Progress | None,
) -> None:
    sha_at, size_at = blobs.index("sha256"), blobs.index("size")
    store = dst.store
    if dst.sharded:
        rows: Iterable[tuple[Any, ...]] = dst.blob_rows(blobs, batch)
    else:
        rows = (row for page in _Reader(store, blobs, binary=False).rows(batch) for row in page)
    for row in rows:
        sha, size = str(row[sha_at]), int(row[size_at])
        try:
            good = len(store.blobs.get(sha, size)) == size
        except errors.BlobCorrupt:
            good = False
        if good:
            report.blobs_verified += 1
        else:
            report.problems.append(
                f"blob {sha}: missing or damaged in DST ({store.blobs.describe(sha)})"
            )
        if progress is not None and report.blobs_verified % batch == 0:
            progress("verify blob data (DST)", report.blobs_verified, total)
    if progress is not None:
        progress("verify blob data (DST)", report.blobs_verified, total)


def _layout_problems(side: _Side, what: str) -> list[str]:
    """A sharded store's own consistency: no catalog+shard write under way, and the
    catalog's index naming exactly the sessions each shard holds, rows equal."""
    if side.router is None:
        return []
    store = side.store
    q = store.queries
    problems: list[str] = []
    pending = store.db.read(lambda tx: tx.execute(q["shard_intents"]))
    if pending:
        problems.append(
            f"{what} {store.url}: {len(pending)} catalog+shard write(s) under way (a process "
            "is writing to it, or died and was not recovered); stop the fleet and run again"
        )
    index = {
        str(sid): str(key)
        for sid, key in store.db.read(
            lambda tx: tx.execute("SELECT session_id, shard FROM shard_sessions")
        )
    }
    copies = {
        str(r[0]): tuple(r) for r in store.db.read(lambda tx: tx.execute(q["shard_session_rows"]))
    }
    seen: set[str] = set()
    shards = side.router.shards.keys()
    for key in shards:
        with side.use(key) as db:
            rows = db.read(lambda tx: tx.execute(q["shard_session_rows"]))
        for row in rows:
            sid, root = str(row[0]), str(row[2])
            seen.add(sid)
            if index.get(sid) != key:
                problems.append(
                    f"{what}: session {sid} is in shard {key}, but the catalog's index "
                    f"says {index.get(sid) or 'nothing'}"
                )
            elif copies.get(sid) != tuple(row):
                problems.append(
                    f"{what}: the catalog's index row of session {sid} differs from its row "
                    f"in shard {key}"
                )
            if shard_key(root) != key:
                problems.append(
                    f"{what}: session {sid} of the tree {root} is in shard {key}, not in "
                    f"{shard_key(root)}"
                )
    for sid in sorted(index.keys() - seen):
        problems.append(
            f"{what}: the catalog's index lists session {sid} in shard {index[sid]}, which "
            "does not hold it"
        )
    return problems


def _verify_sessions(
    src: _Side,
    dst: _Side,
    tables: Sequence[Table],
    report: MigrateReport,
    batch: int,
    progress: Progress | None,
) -> None:
    """Every session of SRC read through the Store API on both sides (each where its
    router finds it): message count and content hash equal."""
    sessions = next((t for t in tables if t.name == _SESSIONS), None)
    if sessions is None:
        return
    id_at = sessions.index("id")
    ids = sorted(str(r[id_at]) for page in _part_pages(src, sessions, batch) for r in page)
    for n, sid in enumerate(ids, 1):
        want = session_digest(src.store, sid)
        got = session_digest(dst.store, sid)
        if got is None or got != want:
            found = "missing" if got is None else f"{got.messages} messages, {got.sha256[:12]}"
            expected = (
                "missing" if want is None else f"{want.messages} messages, {want.sha256[:12]}"
            )
            report.problems.append(
                f"session {sid}: read through the Store API, DST has {found}, SRC {expected}"
            )
        else:
            report.sessions_verified += 1
        if progress is not None:
            progress("verify sessions", n, len(ids))


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
    report.src_layout, report.dst_layout = src.layout, dst.layout
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
    *src* and *dst*: a path, ``sqlite:///absolute/path``,
    ``sqlite+sharded:///absolute/directory`` or ``postgresql://...``.
    *settings*: ``Settings`` fields for opening both stores."""
    _check_batch(batch_rows)
    started = time.monotonic()
    src_target, dst_target, src_id, _ = _pair(src, dst, dst_must_exist=False)
    config = dict(settings or {})
    with _opened(src_target, config) as s, _opened(dst_target, config) as d:
        source, dest = _Side(s), _Side(d)
        report = MigrateReport(str(s.url), str(d.url), s.dialect, d.dialect)
        order = _plan(s, d, report)
        report.resumed, items = _claim(dest, order, src_id)
        counts = _counts(source, order)
        report.tables = [TableReport(t.name, counts[t.name]) for t in order]
        if items.get("state") not in ("copied", "done"):
            copier = _Copier(
                source, dest, {t.name: t for t in order}, items, batch_rows, progress, report
            )
            for part in source.parts():
                copier.part(part, order, report.tables)
            if dest.sharded:
                copier.index()
            _set_item(d, "state", "copied")
        report.src_shards, report.dst_shards = source.shard_count(), dest.shard_count()
        if verify:
            _verify(source, dest, order, report, batch_rows, progress)
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
        source, dest = _Side(s), _Side(d)
        report = MigrateReport(str(s.url), str(d.url), s.dialect, d.dialect, copied=False)
        order = _plan(s, d, report)
        counts = _counts(source, order)
        report.tables = [TableReport(t.name, counts[t.name]) for t in order]
        report.src_shards, report.dst_shards = source.shard_count(), dest.shard_count()
        _verify(source, dest, order, report, batch_rows, progress)
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
    per table its row count and a SHA-256 of its rows, and every blob of *dst*
    (and, when either is sharded, every session's content digest)."""
    return verify_report(src, dst, progress=progress, settings=settings).problems


def format_report(report: MigrateReport, command: str = "migrate") -> str:
    """The report for people."""

    def layout(name: str, shards: int) -> str:
        return f", {shards} shards" if name == "sharded" else ""

    lines = [
        f"fleetstore {command}: {report.src} ({report.src_dialect}, schema {report.src_schema}"
        f"{layout(report.src_layout, report.src_shards)})"
        f" -> {report.dst} ({report.dst_dialect}, schema {report.dst_schema}"
        f"{layout(report.dst_layout, report.dst_shards)})"
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
    if report.sharded:
        lines.append(
            f"  sessions whose content digest is equal through the Store API: "
            f"{report.sessions_verified:,}"
        )
    for problem in report.problems:
        lines.append(f"  MISMATCH: {problem}")
    if report.ok:
        what = "sum of row SHA-256s" if report.sharded else "SHA-256"
        lines.append(
            f"verified: {len(report.tables)} tables, {report.rows:,} rows, every row count and "
            f"{what} equal ({report.seconds:.1f}s)"
        )
    elif report.problems:
        lines.append(f"FAILED: {len(report.problems)} difference(s) between SRC and DST")
    else:
        lines.append("copied, not verified")
    return "\n".join(lines)


__all__ = [
    "DEFAULT_BATCH_ROWS",
    "LAYOUT_TABLES",
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
