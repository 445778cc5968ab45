"""``fleetstore migrate SRC DST``: copy a whole store to another one, SQLite or
PostgreSQL in either direction, then prove the copy equal.

Both stores are opened with ``fleetstore.open`` (which brings each to the newest
schema this program knows).  The tables and their columns, keys and foreign keys
are read from each store's catalog (the ``mig_*`` queries of ``sql/common/
migrate.sql`` and PostgreSQL's overrides), so a table added by a later migration is copied without a change
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
tree, fleetstore.store.sharded.router) is one more kind of store on either side.  Read, it is
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

The modules, each importing only those before it: ``report`` (the report types,
the errors, ``Progress``), ``schema`` (tables, keys, the copy order), ``side`` (a
store's parts, reading in key order), ``progress`` (DST's progress record),
``routing`` (where rows go in a sharded DST), ``copying``, ``verification``, and
``run`` (``migrate``, ``verify_report``, ``verify``).  Tested by
tests/transfer/test_migrate.py and tests/transfer/test_reshard.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleetstore.transfer.migrate.report import (
    ConcurrentMigrate,
    DestinationNotEmpty,
    MigrateReport,
    SchemaMismatch,
    SourceInUse,
    TableReport,
    VerificationFailed,
)

if TYPE_CHECKING:
    from fleetstore.transfer.migrate.run import migrate, verify, verify_report


def __getattr__(name: str) -> Any:
    # The run (and the store, apsw, zstandard with it) only when used: the CLI
    # imports report.DEFAULT_BATCH_ROWS for `fleetstore --help` (tests/cli/test_startup.py).
    if name in ("migrate", "verify", "verify_report"):
        from fleetstore.transfer.migrate import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ConcurrentMigrate",
    "DestinationNotEmpty",
    "MigrateReport",
    "SchemaMismatch",
    "SourceInUse",
    "TableReport",
    "VerificationFailed",
    "migrate",
    "verify",
    "verify_report",
]
