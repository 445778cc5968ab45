"""Copying: table by table in key order, in batches through DST's write path, each
batch with its progress record (resumable); blob payloads before the rows that refer
to them; columns that refer to their own table in a second pass; into a sharded DST,
each row to the file the router would have put it in, idempotently."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fleetstore import errors
from fleetstore.transfer.migrate.progress import _set_item, _write_step
from fleetstore.transfer.migrate.report import (
    Guard,
    MigrateReport,
    Progress,
    SchemaMismatch,
    TableReport,
)
from fleetstore.transfer.migrate.routing import _BY_MESSAGE, _BY_SESSION, _TREE_OPS, _homes
from fleetstore.transfer.migrate.schema import _BLOBS, Table, _normal, _quote
from fleetstore.transfer.migrate.side import _Reader, _Side, _template

#: Parameters per INSERT statement: psycopg parses a statement of at most 50 once.
_GROUP_PARAMS = 50
#: Values per ``IN (...)`` list of a lookup.
_IN_LIST = 400
#: Into a sharded DST: pages read before writing them out, shard by shard (a bound on
#: the rows, and on their bytes, held in memory).
_WINDOW_PAGES = 20
_WINDOW_BYTES = 32 * 1024 * 1024


# -- inserting rows ---------------------------------------------------------------------------


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
        #: Called before each batch (fleetstore.transfer.migrate.run.migrate's *guard*).
        self.guard: Guard | None = None

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
            if self.guard is not None:
                self.guard(False)
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
            if self.guard is not None:
                self.guard(False)
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
        assert self.dst.store.router is not None
        self.dst.store.router.reindex()
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
