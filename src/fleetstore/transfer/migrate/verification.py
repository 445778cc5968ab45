"""Verification: per table the row count and a SHA-256 in key order of a canonical
encoding of each row (``encode_row``), or, when either store is sharded, an
order-free digest over every part; every blob of DST read back against its hash;
then, with a sharded store, every session's content digest through the Store API
and the sharded store's own index."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from fleetstore import errors
from fleetstore.store.sharded.shards import shard_key
from fleetstore.transfer.digest import session_digest
from fleetstore.transfer.migrate.report import DEFAULT_BATCH_ROWS, MigrateReport, Progress
from fleetstore.transfer.migrate.schema import _BLOBS, _SESSIONS, Table, _normal
from fleetstore.transfer.migrate.side import _part_pages, _Reader, _Side, _template

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
    if not side.sharded:
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
    shards = side.parts()[1:]
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


__all__ = ["encode_row", "table_digest"]
