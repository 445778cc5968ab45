"""Processes for tests/admin/test_doctor.py: each prints one line when it is in position and
then holds that position until it is killed.

    python tests/agents/doctor_agent.py read PATH         a long reader: BEGIN; SELECT; stays open
    python tests/agents/doctor_agent.py write PATH N      a plain SQLite (apsw) program in WAL mode:
                                                   N rows into t(v), no checkpoint, stays open
    python tests/agents/doctor_agent.py store PATH N      a fleetstore process: N sessions, stays open
    python tests/agents/doctor_agent.py gate PATH         a fleetstore writer inside `with db.write()`:
                                                   holds the writer gate and the write lock
    python tests/agents/doctor_agent.py rollback PATH N   BEGIN EXCLUSIVE and N big rows, on a
                                                   rollback-journal database (a tiny cache:
                                                   the rows spill into the file)

They use apsw (fleetstore's SQLite library), each in its own process: never the stdlib
``sqlite3`` next to it (DESIGN.md, "Two SQLite libraries in one process").
"""

from __future__ import annotations

import os
import sys
import time

import apsw


def _hold(line: str) -> None:
    print(f"{line} pid={os.getpid()}", flush=True)
    while True:
        time.sleep(3600)


def main(argv: list[str]) -> None:
    os.umask(0o077)  # files it creates are private, as fleetstore's are
    command, path = argv[0], argv[1]
    if command == "read":
        conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM sqlite_schema").fetchall()
        _hold("reading")
    elif command == "write":
        conn = apsw.Connection(path)
        conn.execute("PRAGMA journal_mode=WAL").fetchall()
        conn.execute("PRAGMA wal_autocheckpoint=0").fetchall()
        conn.execute("CREATE TABLE IF NOT EXISTS t(v)")
        for _ in range(int(argv[2])):
            conn.execute("INSERT INTO t(v) VALUES (randomblob(2000))")
        _hold("wrote")
    elif command == "store":
        import fleetstore

        store = fleetstore.open(path)
        for i in range(int(argv[2])):
            store.sessions.create(title=f"session {i}")
        _hold("stored")
    elif command == "gate":
        import fleetstore

        db = fleetstore.Database.open(path)
        with db.write() as tx:
            tx.execute("CREATE TABLE IF NOT EXISTS g(v)")
            tx.execute("INSERT INTO g(v) VALUES (1)")
            _hold("writing")
    elif command == "rollback":
        conn = apsw.Connection(path)
        conn.execute("PRAGMA cache_size=1").fetchall()
        conn.execute("BEGIN EXCLUSIVE")
        for _ in range(int(argv[2])):
            conn.execute("INSERT INTO t(v) VALUES (randomblob(5000))")
        _hold("exclusive")
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
