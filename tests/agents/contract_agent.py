"""The other processes of the engine contract suite (tests/engine/test_contract.py):
``python tests/agents/contract_agent.py COMMAND KIND LOCATION [--key KEY] ...``.

KIND is the engine under test: ``sqlite`` (a ``Database`` file at LOCATION),
``postgresql`` (a ``PgDatabase`` at the URL LOCATION) or ``shard`` (the shard KEY of
the ``ShardSet`` in the directory LOCATION, opened with ``shards.use(KEY, create=True)``).

Commands print short, flushed lines on stdout that the tests wait for:

* ``migrate``  - ``ready``, waits on a barrier, opens a fresh engine with
  ``logged_migrations`` (each step logs its application), prints a JSON line.
* ``inside``   - opens the engine, inserts the row ``INSIDE_KEY`` inside ``db.write()``,
  prints ``inside``, and sleeps there without committing (the test kills it).
* ``notify``   - opens the engine, prints ``ready``, waits on a barrier, then rings
  ``--channel`` (``tx.notify``) in a ``run_write`` that commits and prints ``sent``;
  with ``--hold`` it inserts the row ``(channel, pid)`` and rings inside a transaction,
  prints ``inside``, and commits only once the barrier is released.

The module is also imported by the tests for the contract schema and ``open_engine``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fleetstore import Database, Migration
from fleetstore.store.sharded.shards import ShardSet

#: The contract schema: SQL both dialects accept, keys chosen by the tests (no
#: INTEGER PRIMARY KEY / SERIAL difference); one SQL step and one function step.
SCHEMA: tuple[Migration, ...] = (
    Migration(1, "items", "CREATE TABLE items(k TEXT PRIMARY KEY, v INTEGER NOT NULL)"),
    Migration(2, "items by value", lambda tx: tx.execute("CREATE INDEX items_v ON items(v)")),
)

#: The key of the row the ``inside`` command writes and never commits.
INSIDE_KEY = "uncommitted"


def logged_migrations(pid: int, runs: str) -> tuple[Migration, ...]:
    """SCHEMA's versions, each step also logging itself: the SQL step inserts a
    ``migration_log`` row (committed with it), the function step appends a line to the
    file *runs* every time it runs (committed or not) and inserts its row too."""

    def step_two(tx: Any) -> None:
        fd = os.open(runs, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, f"2 {pid}\n".encode())
        finally:
            os.close(fd)
        tx.execute("CREATE INDEX items_v ON items(v)")
        tx.execute("INSERT INTO migration_log(version, pid) VALUES (2, ?)", (pid,))

    return (
        Migration(
            1,
            "items and the log",
            "CREATE TABLE items(k TEXT PRIMARY KEY, v INTEGER NOT NULL);"
            "CREATE TABLE migration_log(version INTEGER NOT NULL, pid INTEGER NOT NULL);"
            f"INSERT INTO migration_log(version, pid) VALUES (1, {int(pid)})",
        ),
        Migration(2, "items by value, logged", step_two),
    )


# A shard set's catalog is migrated with SCHEMA and its new shards with the logged
# steps (tests/engine/test_contract.py, the migration test): same versions, or the
# catalog would be migrated again by every child.
assert [m.version for m in logged_migrations(0, os.devnull)] == [m.version for m in SCHEMA]


@contextlib.contextmanager
def open_engine(
    kind: str, location: str, key: str | None, migrations: Sequence[Migration], **settings: Any
) -> Iterator[Any]:
    """The engine *kind* at *location* (shard *key*), opened with *migrations*; closed
    (for a shard: its whole ShardSet) when the block ends."""
    if kind == "sqlite":
        with Database.open(location, migrations, **settings) as db:
            yield db
    elif kind == "postgresql":
        from fleetstore.engine.postgres import PgDatabase  # psycopg only when needed

        with PgDatabase.open(location, migrations, **settings) as pg:
            yield pg
    elif kind == "shard":
        assert key is not None, "a shard needs --key"
        shards = ShardSet(Path(location), migrations, settings)
        try:
            with shards.use(key, create=True) as db:
                yield db
        finally:
            shards.close()
    else:
        raise SystemExit(f"unknown engine kind {kind!r}")


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def wait_barrier(path: str) -> None:
    """Block until the test releases its exclusive flock on *path*."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def cmd_migrate(args: argparse.Namespace) -> int:
    say("ready")
    wait_barrier(args.barrier)
    began = time.time()
    with open_engine(
        args.kind, args.location, args.key, logged_migrations(os.getpid(), args.runs)
    ) as db:
        version = db.schema_version
    say(json.dumps({"pid": os.getpid(), "schema_version": version, "began": began}))
    return 0


def cmd_inside(args: argparse.Namespace) -> int:
    with open_engine(args.kind, args.location, args.key, SCHEMA) as db, db.write() as tx:
        tx.execute("INSERT INTO items(k, v) VALUES (?, ?)", (INSIDE_KEY, os.getpid()))
        say("inside")
        time.sleep(args.sleep)
    return 0


def cmd_notify(args: argparse.Namespace) -> int:
    with open_engine(args.kind, args.location, args.key, SCHEMA) as db:
        say("ready")
        if not args.hold:
            wait_barrier(args.barrier)
            db.run_write(lambda tx: tx.notify(args.channel))
            say("sent")
            return 0
        with db.write() as tx:
            tx.execute("INSERT INTO items(k, v) VALUES (?, ?)", (args.channel, os.getpid()))
            tx.notify(args.channel)
            say("inside")
            wait_barrier(args.barrier)
        say("sent")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contract_agent")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name)
        p.add_argument("kind", choices=["sqlite", "postgresql", "shard"])
        p.add_argument("location")
        p.add_argument("--key", default=None)
        return p

    p = command("migrate")
    p.add_argument("--barrier", required=True)
    p.add_argument("--runs", required=True, help="the file each function-step run appends to")
    p.set_defaults(fn=cmd_migrate)

    p = command("inside")
    p.add_argument("--sleep", type=float, default=120.0)
    p.set_defaults(fn=cmd_inside)

    p = command("notify")
    p.add_argument("--barrier", required=True)
    p.add_argument("--channel", required=True)
    p.add_argument("--hold", action="store_true", help="ring inside, commit at the barrier")
    p.set_defaults(fn=cmd_notify)

    args = parser.parse_args(argv)
    result: int = args.fn(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
