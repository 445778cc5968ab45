"""The schema of each dialect, and the two dialects against each other.

* Migrations applied in order build exactly the schema that ``schema.sql`` writes out
  whole (SQLite and PostgreSQL), compared catalog by catalog.
* Both dialects have the same tables, columns in the same order, and indexes
  (PostgreSQL adds blob_chunks, where blob bytes live).
* Every named query exists in both dialects with the same parameters, and every
  query of each dialect (common/ merged with its overrides) prepares on a database its
  migrations built: SQLite without running it, PostgreSQL with PREPARE (types checked).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import apsw
import apsw.ext
import psycopg
import pytest

from fleetstore import sql
from tests.pgserver import PgServer

#: Tables only PostgreSQL has: blob bytes live in the database there, in files beside
#: the SQLite database; a search section's tsvector and folded text (search_text).
PG_ONLY_TABLES = {"blob_chunks", "search_text"}
#: Tables only SQLite has: the FTS5 indexes of search (virtual tables and their own).
SQLITE_ONLY_TABLE = re.compile(r"^search_(words|grams)(_|$)")
PG_ONLY_QUERY = sql.DIALECT_ONLY["postgresql"]
SQLITE_ONLY_QUERY = sql.DIALECT_ONLY["sqlite"]


def schema_text(dialect: str) -> str:
    return resources.files(sql).joinpath(dialect, "schema.sql").read_text("utf-8")


# -- placeholders -----------------------------------------------------------------------


@dataclass
class Placeholders:
    positional: int = 0  # bare ?
    numbered: set[int] = field(default_factory=set)  # SQLite's ?NNN
    named: list[str] = field(default_factory=list)  # :name, first appearance order


_TOKEN = re.compile(
    r"""
      (?P<escaped>[Ee]'(?:[^'\\]|\\.|'')*')
    | (?P<string>'(?:[^']|'')*')
    | (?P<ident>"(?:[^"]|"")*")
    | (?P<line>--[^\n]*)
    | (?P<block>/\*.*?\*/)
    | (?P<dollar>\$(?P<tag>[A-Za-z_]*)\$.*?\$(?P=tag)\$)
    | (?P<cast>::)
    | \?(?P<number>\d+)?
    | :(?P<name>[A-Za-z_][A-Za-z0-9_]*)
    """,
    re.VERBOSE | re.DOTALL,
)


def scan(text: str, replace: bool = False) -> tuple[Placeholders, str]:
    """The placeholders of *text* (outside strings, identifiers, comments and
    dollar quotes; ``::`` is a cast), and the text with them as $1, $2, ...: bare ``?``
    numbered in order, then each ``:name`` by its first appearance."""
    found = Placeholders()
    positions: dict[str, int] = {}

    def sub(m: re.Match[str]) -> str:
        if m.group("name") is not None:
            name = m.group("name")
            if name not in found.named:
                found.named.append(name)
            positions.setdefault(name, len(positions) + 1)
            return f"${positions[name]}"
        if m.group(0).startswith("?"):
            if m.group("number") is not None:
                found.numbered.add(int(m.group("number")))
                return f"${m.group('number')}"
            found.positional += 1
            return f"${found.positional}"
        return m.group(0)

    out = _TOKEN.sub(sub, text)
    if found.positional and positions:
        raise AssertionError("a query mixes ? and :name placeholders")
    return found, (out if replace else text)


def test_scan_sees_placeholders_only_outside_quotes_and_casts() -> None:
    text = "SELECT ':x ?', \"a?\", ?::jsonb, $$ :c ? $$, E'\\' ?' -- :d ?\n, ?"
    found, out = scan(text, replace=True)
    assert (found.positional, found.named, found.numbered) == (2, [], set())
    assert out == "SELECT ':x ?', \"a?\", $1::jsonb, $$ :c ? $$, E'\\' ?' -- :d ?\n, $2"
    found, out = scan("SELECT :a, :b::int, :a, ?3", replace=True)
    assert (found.named, found.numbered, out) == (["a", "b"], {3}, "SELECT $1, $2::int, $1, $3")
    with pytest.raises(AssertionError):
        scan("SELECT ?, :a")


# -- SQLite -----------------------------------------------------------------------------


def _sqlite_build(path: Path, scripts: list[str]) -> apsw.Connection:
    conn = apsw.Connection(str(path))
    for script in scripts:
        with conn:  # each migration in its transaction, as the engine applies them
            conn.execute(script)
    return conn


def _normalise_sql(text: str | None) -> str | None:
    if text is None:
        return None
    text = re.sub(r"--[^\n]*", " ", text)
    text = re.sub(r"\s+", " ", text)
    return re.sub(r"\s*([(),])\s*", r"\1", text).strip()


def _sqlite_catalog(conn: apsw.Connection) -> dict[str, Any]:
    objects = conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY type, name"
    ).fetchall()
    catalog: dict[str, Any] = {
        "objects": [
            (t, n, tbl, _normalise_sql(None if s is None else str(s))) for t, n, tbl, s in objects
        ]
    }
    for kind, name, _tbl, _sql in objects:
        if kind == "table":
            catalog[f"columns {name}"] = conn.execute(
                "SELECT * FROM pragma_table_xinfo(?)", (name,)
            ).fetchall()
            catalog[f"foreign keys {name}"] = conn.execute(
                "SELECT * FROM pragma_foreign_key_list(?)", (name,)
            ).fetchall()
            catalog[f"indexes {name}"] = conn.execute(
                'SELECT name, "unique", origin, partial FROM pragma_index_list(?) ORDER BY name',
                (name,),
            ).fetchall()
        elif kind == "index":
            catalog[f"index {name}"] = conn.execute(
                "SELECT * FROM pragma_index_xinfo(?)", (name,)
            ).fetchall()
    return catalog


def _sqlite_tables(conn: apsw.Connection) -> dict[str, list[str]]:
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    return {
        t: [str(r[0]) for r in conn.execute("SELECT name FROM pragma_table_info(?)", (t,))]
        for t in tables
    }


def _sqlite_indexes(conn: apsw.Connection) -> set[str]:
    return {
        str(r[0])
        for r in conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'index' AND sql IS NOT NULL"
        )
    }


@pytest.fixture
def sqlite_pair(tmp_path: Path) -> Iterator[tuple[apsw.Connection, apsw.Connection]]:
    migrated = _sqlite_build(tmp_path / "migrated.db", [m.sql for m in sql.migrations("sqlite")])
    whole = _sqlite_build(tmp_path / "whole.db", [schema_text("sqlite")])
    yield migrated, whole
    migrated.close()
    whole.close()


def test_sqlite_migrations_build_the_schema(
    sqlite_pair: tuple[apsw.Connection, apsw.Connection],
) -> None:
    migrated, whole = sqlite_pair
    got, want = _sqlite_catalog(migrated), _sqlite_catalog(whole)
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == want[key], key
    assert len(_sqlite_tables(whole)) >= 15


def test_sqlite_catalog_notices_a_difference(tmp_path: Path) -> None:
    """The comparison can fail: one column more, or one index less, is seen."""
    steps = [m.sql for m in sql.migrations("sqlite")]

    def catalog(name: str, *more: str) -> dict[str, Any]:
        conn = _sqlite_build(tmp_path / name, [*steps, *more])
        try:
            return _sqlite_catalog(conn)
        finally:
            conn.close()

    base = catalog("a.db")
    assert catalog("b.db", "ALTER TABLE usage ADD COLUMN x TEXT") != base
    assert catalog("c.db", "DROP INDEX usage_by_session") != base


# -- PostgreSQL -------------------------------------------------------------------------

_PG_CATALOG = {
    "columns": """
        SELECT table_name, ordinal_position, column_name, data_type, is_nullable,
               column_default, collation_name
        FROM information_schema.columns WHERE table_schema = current_schema()
        ORDER BY table_name, ordinal_position""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = current_schema() ORDER BY tablename, indexname""",
    "constraints": """
        SELECT t.relname, c.conname, c.contype, pg_get_constraintdef(c.oid)
        FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
        WHERE t.relnamespace = current_schema()::regnamespace
        ORDER BY t.relname, c.conname""",
    "triggers": """
        SELECT t.relname, g.tgname, pg_get_triggerdef(g.oid)
        FROM pg_trigger g JOIN pg_class t ON t.oid = g.tgrelid
        WHERE NOT g.tgisinternal AND t.relnamespace = current_schema()::regnamespace
        ORDER BY t.relname, g.tgname""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
        FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace
        ORDER BY 1, 2""",
    "relations": """
        SELECT relname, relkind FROM pg_class
        WHERE relnamespace = current_schema()::regnamespace ORDER BY relname""",
}


def _pg_build(url: str, scripts: list[str]) -> None:
    with psycopg.connect(url) as conn:
        for script in scripts:
            with conn.transaction():  # one transaction per migration, as the engine runs them
                conn.execute(script.encode("utf-8"))  # bytes: no placeholders to parse


def _pg_catalog(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {name: conn.execute(q).fetchall() for name, q in _PG_CATALOG.items()}


@pytest.fixture(scope="module")
def pg_migrated(pg_server: PgServer) -> str:
    """A database built by the PostgreSQL migrations, in order (read only to the tests)."""
    url = pg_server.create_database("schema")
    _pg_build(url, [m.sql for m in sql.migrations("postgresql")])
    return url


def test_postgresql_migrations_build_the_schema(pg_migrated: str, pg_url: str) -> None:
    _pg_build(pg_url, [schema_text("postgresql")])
    got, want = _pg_catalog(pg_migrated), _pg_catalog(pg_url)
    for key in _PG_CATALOG:
        assert got[key] == want[key], key
    assert len({r[0] for r in want["columns"]}) >= 16
    assert want["triggers"] and want["functions"]


def test_postgresql_catalog_notices_a_difference(pg_migrated: str, pg_url: str) -> None:
    _pg_build(
        pg_url, [schema_text("postgresql"), "ALTER TABLE effects ALTER COLUMN kind DROP NOT NULL"]
    )
    assert _pg_catalog(pg_url)["columns"] != _pg_catalog(pg_migrated)["columns"]


def test_migration_text_has_no_placeholders() -> None:
    """Each migration is run as one statement string; the PostgreSQL engine rewrites
    ? and :name in what it runs, so a migration (comments included) has none."""
    for text in [m.sql for m in sql.migrations("postgresql")] + [schema_text("postgresql")]:
        bare = text.replace("::", "")
        assert "?" not in bare and not re.search(r":[A-Za-z_]", bare), text[:80]


# -- the dialects against each other -----------------------------------------------------


def _pg_tables(url: str) -> dict[str, list[str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(_PG_CATALOG["columns"]).fetchall()
    tables: dict[str, list[str]] = {}
    for table, _pos, column, *_ in rows:
        tables.setdefault(table, []).append(column)
    return tables


def _pg_indexes(url: str) -> set[str]:
    """Indexes made by CREATE INDEX (not those behind a primary key or UNIQUE)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            """SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
               WHERE i.relnamespace = current_schema()::regnamespace
                 AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)"""
        ).fetchall()
    return {str(r[0]) for r in rows}


def test_dialects_have_the_same_tables_columns_and_indexes(
    sqlite_pair: tuple[apsw.Connection, apsw.Connection], pg_migrated: str
) -> None:
    lite, _whole = sqlite_pair
    pg = _pg_tables(pg_migrated)
    tables = {t: c for t, c in _sqlite_tables(lite).items() if not SQLITE_ONLY_TABLE.match(t)}
    assert set(pg) - set(tables) == PG_ONLY_TABLES
    for table in PG_ONLY_TABLES:
        del pg[table]
    assert pg == tables
    pg_only = {i for i in _pg_indexes(pg_migrated) if i.startswith(tuple(PG_ONLY_TABLES))}
    assert _pg_indexes(pg_migrated) - pg_only == _sqlite_indexes(lite)


def test_every_query_is_in_both_dialects_with_the_same_parameters() -> None:
    lite, pg = sql.queries("sqlite"), sql.queries("postgresql")
    shared = sorted(n for n in lite if not n.startswith(SQLITE_ONLY_QUERY))
    assert sorted(n for n in pg if not n.startswith(PG_ONLY_QUERY)) == shared
    assert all(not n.startswith(PG_ONLY_QUERY) for n in lite)
    assert all(not n.startswith(SQLITE_ONLY_QUERY) for n in pg)
    for name in shared:
        text = lite[name]
        want, _ = scan(text)
        got, _ = scan(pg[name])
        assert not got.numbered, f"{name}: PostgreSQL queries use ? in order, not ?NNN"
        positional = want.positional or len(want.numbered)
        assert want.numbered in (set(), set(range(1, positional + 1))), name
        assert got.positional == positional, name
        assert sorted(got.named) == sorted(want.named), name


#: The type a named parameter is declared with for PREPARE.  The engine binds values
#: client-side (literals), so at run time the values give the types; a prepared
#: statement needs them where PostgreSQL cannot infer one (``:x IS NULL OR ...``,
#: ``:now + :lease``).  Bare ``?`` are left to inference.
_NAMED_TYPES = {
    **dict.fromkeys(
        [
            "now",
            "lease",
            "available_at",
            "finished_at",
            "after_time",
            "before_at",
            "since",
            "after",
            "after_updated",
            "at",
        ],
        "double precision",
    ),
    **dict.fromkeys(
        [
            "limit",
            "seq",
            "size",
            "idx",
            "fence",
            "bump",
            "is_head",
            "attempt",
            "kept",
            "max_attempts",
            "replay_safe",
            "after_seq",
            "part_seq",
            "upto",
            "lo",
            "hi",
            "below",
            "skip",
            "ver",
            "part",
            "start",
            "stop",
            "doc_id",
            "pages",
        ],
        "bigint",
    ),
    **dict.fromkeys(["include_archived", "roots"], "boolean"),
}


def _preparable(name: str, text: str) -> bool:
    """Not a template filled in by its caller (``{table}``), DDL or a cursor command;
    migrate.sql's queries (its own progress table, templates) are tests/transfer/test_migrate.py's."""
    if name.startswith("mig_") or re.search(r"\{[a-z_]+\}", text):
        return False
    return bool(re.match(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH|VALUES)\b", text, re.I))


#: Result types whose Python values differ from SQLite's: numeric is Decimal (SQLite
#: gives int or float: a sum needs ::bigint), boolean is bool (SQLite: 0 or 1), json and
#: jsonb are parsed (SQLite: the JSON text).
_FOREIGN_RESULT_TYPES = {1700: "numeric", 16: "boolean", 114: "json", 3802: "jsonb"}


def _pg_prepare(conn: psycopg.Connection[Any], text: str) -> list[int]:
    """PREPARE *text* (its ? and :name as $n, named ones typed by _NAMED_TYPES) and
    give the type oids of its result columns."""
    found, prepared = scan(text, replace=True)
    types = ["unknown"] * found.positional
    types += [_NAMED_TYPES.get(n, "text") for n in found.named]
    head = f"PREPARE q ({', '.join(types)})" if types else "PREPARE q"
    conn.execute(f"{head} AS {prepared}".encode())
    try:
        described = conn.pgconn.describe_prepared(b"q")
        return [described.ftype(i) for i in range(described.nfields)]
    finally:
        conn.execute("DEALLOCATE q")


def test_every_postgresql_query_prepares(pg_migrated: str) -> None:
    """Parse analysis on the real schema: a wrong column, table, function or type
    mismatch fails here, before any contract test runs the query; and no query
    returns a type that would reach Python other than as SQLite's would."""
    failed = []
    with psycopg.connect(pg_migrated, autocommit=True) as conn:
        for name, text in sorted(sql.queries("postgresql").items()):
            if not _preparable(name, text):
                continue
            try:
                result = _pg_prepare(conn, text)
            except psycopg.Error as exc:
                failed.append(f"{name}: {exc}".strip())
                continue
            for i, oid in enumerate(result):
                foreign = _FOREIGN_RESULT_TYPES.get(oid)
                if foreign:
                    failed.append(f"{name}: result column {i + 1} is {foreign}")
    assert not failed, "\n".join(failed)
    assert len(sql.queries("postgresql")) > 150


def test_prepare_catches_a_broken_query_and_a_foreign_result_type(pg_migrated: str) -> None:
    with psycopg.connect(pg_migrated, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.UndefinedColumn):
            conn.execute(b"PREPARE q AS SELECT no_such_column FROM sessions WHERE id = $1")
        conn.execute(b"PREPARE s AS SELECT sum(size), count(*) > 0 FROM parts")
        described = conn.pgconn.describe_prepared(b"s")
        assert [described.ftype(i) for i in range(2)] == [1700, 16]


def _sqlite_prepare(conn: apsw.Connection, text: str) -> int:
    """Prepare each statement of *text* on *conn* without running it (apsw's
    query_info stops at the exec tracer, before the first step); the number of result
    columns of the last one."""
    rest: str | None = text
    columns = 0
    while rest and rest.strip():
        info = apsw.ext.query_info(conn, rest)
        rest, columns = info.query_remaining, len(info.description or ())
    return columns


def test_every_sqlite_query_prepares(
    sqlite_pair: tuple[apsw.Connection, apsw.Connection],
) -> None:
    """The SQLite dict (common/ with sql/sqlite/'s overrides) on the migrated schema: a
    wrong column, table or function, or a common text only PostgreSQL accepts, fails here."""
    migrated, _whole = sqlite_pair
    failed = []
    for name, text in sorted(sql.queries("sqlite").items()):
        if not _preparable(name, text):
            continue
        try:
            _sqlite_prepare(migrated, text)
        except apsw.Error as exc:
            failed.append(f"{name}: {exc}")
    assert not failed, "\n".join(failed)
    assert len(sql.queries("sqlite")) > 150


def test_sqlite_prepare_runs_nothing_and_sees_every_statement(
    sqlite_pair: tuple[apsw.Connection, apsw.Connection],
) -> None:
    migrated, _whole = sqlite_pair
    migrated.execute("CREATE TEMP TABLE t (x); INSERT INTO t VALUES (1)")
    _sqlite_prepare(migrated, "DELETE FROM t; DELETE FROM t WHERE x = ?")
    assert migrated.execute("SELECT count(*) FROM t").fetchall() == [(1,)]
    with pytest.raises(apsw.SQLError, match="no_such_column"):
        _sqlite_prepare(migrated, "SELECT 1; SELECT no_such_column FROM sessions")


def test_a_dialect_s_own_text_returns_the_columns_of_the_common_one(
    sqlite_pair: tuple[apsw.Connection, apsw.Connection], pg_migrated: str
) -> None:
    """Where PostgreSQL has its own text of a query, the caller reads as many result
    columns from it as from SQLite's (the parameters are test_every_query_is_in_both_...'s)."""
    migrated, _whole = sqlite_pair
    lite, pg = sql.queries("sqlite"), sql.queries("postgresql")
    own = [n for n in sorted(lite) if n in pg and lite[n] != pg[n] and _preparable(n, lite[n])]
    assert len(own) > 50
    with psycopg.connect(pg_migrated, autocommit=True) as conn:
        differ = [
            f"{n}: SQLite {a}, PostgreSQL {b}"
            for n in own
            if (a := _sqlite_prepare(migrated, lite[n])) != (b := len(_pg_prepare(conn, pg[n])))
        ]
    assert differ == []


def test_schema_files_hold_no_named_queries() -> None:
    """schema.sql sits among the query files: a comment shaped like a query header
    (``-- word: ...``) would become a query."""
    header = re.compile(r"^-- [a-z_][a-z0-9_]*:", re.MULTILINE)
    for dialect in ("sqlite", "postgresql"):
        assert not header.search(schema_text(dialect)), dialect
