"""A writing agent of the PostgreSQL fault tests (tests/engine/test_pg_faults.py):
``python tests/agents/pg_agent.py URL --agent N --log FILE --stop FILE [--barrier FILE]``.

It only writes, and only writes that may be spooled: a session, then user messages
(client-chosen ids) with a ``progress`` state put every few messages.  Each operation is
logged before (``intent``) and after the call returned (``ack``, with this process's
spool length at that moment), one ``os.write`` of one JSON line each.  Runs until the
stop file exists, then ``store.flush()``, closes the store and prints
``report {...}`` (the store's metrics: spooled, replayed, retries) and exits 0; any
exception fails the process (exit 1).  Settings come from ``FLEETSTORE_*`` variables
(the tests set ``FLEETSTORE_WRITE_BUDGET``).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import sys
import time
from typing import Any

import fleetstore
from fleetstore.core.ids import new_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pg_agent")
    parser.add_argument("url")
    parser.add_argument("--agent", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--stop", required=True)
    parser.add_argument("--barrier")
    parser.add_argument("--think", type=float, default=0.01, help="mean seconds between writes")
    args = parser.parse_args(argv)

    store = fleetstore.open(args.url)
    fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    rng = random.Random(args.agent)

    def record(ev: str, kind: str, **fields: Any) -> None:
        line = {"ev": ev, "kind": kind, "t": time.time(), "spool": len(store.spool), **fields}
        os.write(fd, (json.dumps(line) + "\n").encode())

    print("ready", os.getpid(), flush=True)
    if args.barrier:
        bfd = os.open(args.barrier, os.O_RDONLY)
        fcntl.flock(bfd, fcntl.LOCK_SH)
        os.close(bfd)
    sid = new_id()
    record("intent", "session", sid=sid)
    store.sessions.create(title=f"pg agent {args.agent}", id=sid)
    record("ack", "session", sid=sid)
    n = puts = 0
    while not os.path.exists(args.stop):
        n += 1
        mid = new_id()
        text = f"agent {args.agent} message {n}"
        record("intent", "message", sid=sid, mid=mid, index=n, text=text)
        store.messages.append(sid, "user", text, id=mid)
        record("ack", "message", sid=sid, mid=mid)
        if n % 4 == 0:
            puts += 1
            record("intent", "state", sid=sid, n=puts)
            store.state.put(sid, "progress", {"messages": n, "put": puts})
            record("ack", "state", sid=sid, n=puts)
        time.sleep(rng.expovariate(1.0 / args.think))
    flushed = store.flush(timeout=120)
    metrics = store.metrics()
    store.close()
    os.close(fd)
    report = {"agent": args.agent, "pid": os.getpid(), "flushed": flushed, **metrics}
    print("report", json.dumps(report, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
