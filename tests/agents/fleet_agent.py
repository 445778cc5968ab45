"""A fleet member for the process tests: run as ``python tests/agents/fleet_agent.py COMMAND ...``.

Every "outside" or "other" process in tests/engine/test_fleet.py is one of these, a real OS
process, so that no test ever mixes two SQLite libraries (or two owners of the same
POSIX locks) in one process (DESIGN.md, "Two SQLite libraries in one process").

Commands print short, flushed lines on stdout that the tests wait for:

* ``writer``   - ``started``, ``ready``; appends ``agent seq time`` to its ack file after
  each ``with db.write()`` block has returned; a final JSON line with its counts.
* ``inside``   - inserts marker rows inside ``with db.write()``, prints ``inside`` (with
  ``--fork-child``, forks there a child that sleeps, ``inside child=PID``), sleeps.
* ``migrate``  - waits on a barrier, then ``Database.open`` on a fresh path with migrations
  that log each application; a final JSON line.
* ``hold-gate`` / ``probe-gate`` - take the writer gate (``<db>.gate``) with flock directly.

The module is also imported by the tests for the shared schema.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import sys
import time

from fleetstore import Database, Migration

#: The table every writer appends to.  No UNIQUE constraint on (agent, seq), so a write
#: committed twice shows up as a duplicate instead of an error.
SCHEMA = (
    Migration(
        1,
        "rows written by the fleet",
        "CREATE TABLE rows("
        " id INTEGER PRIMARY KEY,"
        " agent INTEGER NOT NULL,"
        " seq INTEGER NOT NULL,"
        " pid INTEGER NOT NULL,"
        " t REAL NOT NULL)",
    ),
)

#: agent number of the rows the ``inside`` command writes and never commits.
MARKER_AGENT = -1


def logged_migrations(pid: int) -> tuple[Migration, ...]:
    """Three migrations, each of which also logs its own application (with *pid*), so a
    migration applied twice leaves two log rows (or fails on the second CREATE/ALTER)."""
    log = "INSERT INTO migration_log(version, pid) VALUES ({v}, {pid})"
    return (
        Migration(
            1,
            "log table and notes",
            "CREATE TABLE migration_log(version INTEGER NOT NULL, pid INTEGER NOT NULL);"
            "CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT NOT NULL);"
            + log.format(v=1, pid=pid),
        ),
        Migration(
            2,
            "tags",
            "CREATE TABLE tags(note_id INTEGER NOT NULL REFERENCES notes(id), tag TEXT NOT NULL);"
            + log.format(v=2, pid=pid),
        ),
        Migration(
            3,
            "notes.created",
            "ALTER TABLE notes ADD COLUMN created REAL;" + log.format(v=3, pid=pid),
        ),
    )


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def wait_barrier(path: str) -> None:
    """Block until the test releases its exclusive flock on *path* (all waiters wake at once)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def cmd_writer(args: argparse.Namespace) -> int:
    say("started")
    budget = {} if args.budget is None else {"write_budget": args.budget}
    db = Database.open(args.path, migrations=SCHEMA, **budget)
    say("ready")
    if args.barrier:
        wait_barrier(args.barrier)
    rng = random.Random(args.agent)
    acked = failed = 0
    errors: list[str] = []
    deadline = time.monotonic() + args.duration
    seq = 0
    with open(args.ack, "a", buffering=1) as ack:
        while time.monotonic() < deadline:
            if args.count is not None and seq >= args.count:
                break
            if args.stop and os.path.exists(args.stop):
                break
            if args.think_ms > 0:
                time.sleep(rng.expovariate(1000.0 / args.think_ms))
            seq += 1
            try:
                with db.write() as tx:
                    tx.execute(
                        "INSERT INTO rows(agent, seq, pid, t) VALUES (?, ?, ?, ?)",
                        (args.agent, seq, os.getpid(), time.time()),
                    )
            except Exception as exc:
                failed += 1
                if len(errors) < 5:
                    errors.append(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
                continue
            # Acknowledged: the block returned, so the row is committed.
            ack.write(f"{args.agent} {seq} {time.time():.6f}\n")
            acked += 1
    db.close()
    say(json.dumps({"agent": args.agent, "acked": acked, "failed": failed, "errors": errors}))
    return 1 if failed else 0


def cmd_inside(args: argparse.Namespace) -> int:
    db = Database.open(args.path, migrations=SCHEMA)
    with db.write() as tx:
        tx.executemany(
            "INSERT INTO rows(agent, seq, pid, t) VALUES (?, ?, ?, ?)",
            [(MARKER_AGENT, i, os.getpid(), time.time()) for i in range(args.markers)],
        )
        if args.fork_child:
            # As multiprocessing's "fork" does: a child that never touches the store.
            child = os.fork()
            if child == 0:
                time.sleep(args.fork_child)
                os._exit(0)
            say(f"inside child={child}")
        else:
            say("inside")
        time.sleep(args.sleep)
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    say("ready")
    wait_barrier(args.barrier)
    began = time.time()
    db = Database.open(args.path, migrations=logged_migrations(os.getpid()))
    version = db.schema_version
    db.close()
    say(json.dumps({"pid": os.getpid(), "schema_version": version, "began": began}))
    return 0


def _gate_fd(path: str) -> int:
    return os.open(path + ".gate", os.O_RDWR | os.O_CREAT, 0o600)


def cmd_hold_gate(args: argparse.Namespace) -> int:
    fd = _gate_fd(args.path)
    fcntl.flock(fd, fcntl.LOCK_EX)
    say(f"held pid={os.getpid()}")
    time.sleep(args.hold)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    say("released")
    return 0


def cmd_probe_gate(args: argparse.Namespace) -> int:
    """Try to take the gate without blocking, repeatedly, for up to ``--within`` seconds."""
    fd = _gate_fd(args.path)
    start = time.monotonic()
    got = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            got = True
            break
        except BlockingIOError:
            if time.monotonic() - start > args.within:
                break
            time.sleep(0.005)
    after = time.monotonic() - start
    if got:
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    say(json.dumps({"got": got, "after": after}))
    return 0 if got else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fleet_agent")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("writer")
    p.add_argument("path")
    p.add_argument("--agent", type=int, required=True)
    p.add_argument("--ack", required=True)
    p.add_argument("--think-ms", type=float, default=0.0)
    p.add_argument("--count", type=int, default=None)
    p.add_argument("--duration", type=float, default=120.0)
    p.add_argument("--barrier", default=None)
    p.add_argument("--stop", default=None)
    p.add_argument("--budget", type=float, default=None)
    p.set_defaults(fn=cmd_writer)

    p = sub.add_parser("inside")
    p.add_argument("path")
    p.add_argument("--markers", type=int, default=50)
    p.add_argument("--sleep", type=float, default=600.0)
    p.add_argument("--fork-child", type=float, default=0.0, help="fork a child sleeping this long")
    p.set_defaults(fn=cmd_inside)

    p = sub.add_parser("migrate")
    p.add_argument("path")
    p.add_argument("--barrier", required=True)
    p.set_defaults(fn=cmd_migrate)

    p = sub.add_parser("hold-gate")
    p.add_argument("path")
    p.add_argument("--hold", type=float, required=True)
    p.set_defaults(fn=cmd_hold_gate)

    p = sub.add_parser("probe-gate")
    p.add_argument("path")
    p.add_argument("--within", type=float, default=1.0)
    p.set_defaults(fn=cmd_probe_gate)

    args = parser.parse_args(argv)
    result: int = args.fn(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
