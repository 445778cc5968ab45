"""A store as migrate reads and writes it (``_Side``: a single file, a PostgreSQL
database, or a sharded store's catalog and shards, its "parts"), and reading one
table of one part in key order, page by page (``_Reader``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from fleetstore.transfer.migrate.schema import _BLOBS, _SESSIONS, Table, _normal, _quote

# -- a store's databases ---------------------------------------------------------------------


class _Side:
    """One store as migrate reads and writes it: its databases ("parts": the store's
    own database, key None, then a sharded store's shards in key order)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.queries: dict[str, str] = store.queries
        self.sharded: bool = store.spans_files

    def parts(self) -> list[str | None]:
        return list(self.store.backend.file_keys())

    @contextmanager
    def use(self, part: str | None, *, create: bool = False) -> Iterator[Any]:
        with self.store.backend.use(part, create=create) as db:
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


def _part_pages(side: _Side, table: Table, batch: int) -> Iterator[list[tuple[Any, ...]]]:
    for part in side.parts():
        with side.use(part) as db:
            reader = _Reader(
                side.store, table, binary=False, db=db, source=side.source(part, table)
            )
            yield from reader.rows(batch)
