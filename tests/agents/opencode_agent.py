"""Another program's database, written as opencode writes its own (fleetstore stress's
opencode pattern, stress/src/fleetstore_stress/peers.py): one shared WAL file, busy_timeout 5000, every
streamed delta rewriting the whole part plus an ``event`` row that carries the whole
part.  For tests of ``fleetstore doctor`` and ``maintain`` on a file that is not ours.

    python tests/agents/opencode_agent.py fill PATH TURNS    TURNS turns, then exit
    python tests/agents/opencode_agent.py live PATH TURNS    TURNS turns, print "ready",
                                                   then a turn every 20 ms until killed,
                                                   printing "turns N" after each 10
    python tests/agents/opencode_agent.py hold PATH SECONDS  BEGIN IMMEDIATE, print
                                                   "holding", hold it SECONDS, roll back

apsw (fleetstore's SQLite library), through fleetstore_stress.patterns.plain.PlainConnection; it
never opens the file through fleetstore.
"""

from __future__ import annotations

import json
import os
import sys
import time

from fleetstore_stress.patterns.plain import PlainConnection
from fleetstore_stress.peers import OPENCODE_SCHEMA

_PART = (
    "INSERT INTO part(id, message_id, session_id, time_created, time_updated, data) "
    "VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(id) DO UPDATE SET time_updated = excluded.time_updated, data = excluded.data"
)
_EVENT = "INSERT INTO event(session_id, type, time, data) VALUES (?, ?, ?, ?)"


def _ms() -> int:
    return int(time.time() * 1000)


def turn(db: PlainConnection, n: int) -> None:
    sid = f"ses_{n % 3}"
    mid = f"msg_{n}"
    with db.transaction("IMMEDIATE") as tx:
        now = _ms()
        tx.execute(
            "INSERT OR IGNORE INTO session VALUES (?, ?, ?, ?)",
            (sid, now, now, json.dumps({"title": f"session {n % 3}"})),
        )
        tx.execute(
            "INSERT INTO message VALUES (?, ?, ?, ?, ?)",
            (mid, sid, now, now, json.dumps({"role": "assistant"})),
        )
    text = ""
    for d in range(20):
        text += f"delta {d} of turn {n}; " * 8
        part = {"type": "text", "text": text}
        with db.transaction("IMMEDIATE") as tx:
            now = _ms()
            tx.execute(_PART, (mid + "/0", mid, sid, now, now, json.dumps(part)))
            event = {"type": "message.part.updated", "part": part}
            tx.execute(_EVENT, (sid, "message.part.updated", now, json.dumps(event)))


def main(argv: list[str]) -> None:
    os.umask(0o077)
    command, path, count = argv[0], argv[1], argv[2]
    db = PlainConnection(path, busy_ms=5000, schema=OPENCODE_SCHEMA)
    if command == "hold":
        with db.transaction("IMMEDIATE"):
            print(f"holding pid={os.getpid()}", flush=True)
            time.sleep(float(count))
        return
    for n in range(int(count)):
        turn(db, n)
    if command == "fill":
        db.close()
        return
    print(f"ready pid={os.getpid()}", flush=True)
    n = int(count)
    while True:
        turn(db, n)
        n += 1
        if n % 10 == 0:
            print(f"turns {n}", flush=True)
        time.sleep(0.02)


if __name__ == "__main__":
    main(sys.argv[1:])
