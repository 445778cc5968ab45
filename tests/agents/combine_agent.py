"""Processes for the group-commit tests (tests/engine/test_group_commit.py).

    combine_agent.py write PATH KEY BARRIER [BUDGET]
                                                once the BARRIER file's lock is free, submit
                                                one item; print "ok KEY" or "err CLASS"
    combine_agent.py hold PATH SECONDS          hold the gate (nothing else) for SECONDS
    combine_agent.py serve PATH WAITERS [HOLD]  hold the gate until WAITERS items are posted
                                                (or HOLD seconds pass), then commit them with
                                                an item of its own in one transaction; print
                                                its figures.  FLEETSTORE_TEST_CRASH
                                                makes it SIGKILL itself at that point
                                                ("during-commit": inside COMMIT, at its
                                                first WAL write).

An item inserts its key into ``t`` (a key already there is left alone: applying an
item twice is applying it once); a key starting with "bad" raises ``InvalidInput``; one
starting with "half" inserts its key, then raises (only a rollback keeps it out); one
starting with "stop", applied by a process other than its own, SIGSTOPs that process
first (a holder frozen mid-batch); one starting with "ring" rings the channel
``RING_CHANNEL`` (``tx.notify``: heard once the transaction that applied it commits).

Environment: COMBINE_THREADS=N (write: N threads submit KEY-0 .. KEY-N-1, each prints
its own line), COMBINE_OWN=0 (serve: no item of its own), COMBINE_SYNC=FULL (the
process's synchronous), COMBINE_FAULT=ioerr|fsync (serve: its batch's COMMIT fails
writing the WAL, or syncing it).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import threading
import time

from fleetstore import errors
from fleetstore.core.crash import POINTS
from fleetstore.engine.base import Migration, Tx
from fleetstore.engine.board import POSTED, Board
from fleetstore.engine.combine import Request
from fleetstore.engine.sqlite import Database
from tests.fix_faults import install

SCHEMA = [Migration(1, "t", "CREATE TABLE t(k TEXT PRIMARY KEY, pid INTEGER)")]
RING_CHANNEL = "combine_test"
TAG = "combine-test/1"


def insert(tx: Tx, key: str, pid: int) -> dict[str, object]:
    if key.startswith("bad"):
        raise errors.InvalidInput(f"refused: {key}")
    if key.startswith("stop") and pid != os.getpid():
        os.kill(os.getpid(), signal.SIGSTOP)
    rows = tx.execute(
        "INSERT INTO t(k, pid) VALUES (?, ?) ON CONFLICT DO NOTHING RETURNING k", (key, pid)
    )
    if key.startswith("half"):
        raise errors.InvalidInput(f"refused after writing: {key}")
    if key.startswith("ring"):
        tx.notify(RING_CHANNEL)
    return {"key": key, "inserted": bool(rows)}


class KeyItem:
    def __init__(self, key: str, pid: int) -> None:
        self.key, self.pid = key, pid

    def run(self, tx: Tx) -> object:
        return insert(tx, self.key, self.pid)

    def payload(self) -> bytes | None:
        return json.dumps({"key": self.key, "pid": self.pid}).encode()

    def result(self, data: bytes) -> object:
        return json.loads(data)


def applier(tx: Tx, payload: bytes) -> bytes:
    data = json.loads(payload)
    return json.dumps(insert(tx, data["key"], data["pid"])).encode()


def open_db(path: str, budget: float = 30.0) -> Database:
    sync = os.environ.get("COMBINE_SYNC", "NORMAL")
    db = Database.open(path, migrations=SCHEMA, write_budget=budget, synchronous=sync)
    db.serve(TAG, applier)
    return db


def submit(db: Database, key: str) -> None:
    started = time.monotonic()
    try:
        db.submit(KeyItem(key, os.getpid()))
    except errors.FleetstoreError as exc:
        print(f"err {type(exc).__name__} {time.monotonic() - started:.3f} {key}", flush=True)
    else:
        print(f"ok {key} {time.monotonic() - started:.3f}", flush=True)


def main(argv: list[str]) -> int:
    command, path = argv[0], argv[1]
    if command == "write":
        budget = float(argv[4]) if len(argv) > 4 else 30.0
        db = open_db(path, budget)
        # Own a slot first (one is taken while holding the gate), as a process that has
        # written before has: the tests' writers post straight away.
        db.submit(KeyItem(f"warm-{os.getpid()}", os.getpid()))
        print("ready", flush=True)
        with open(argv[3], "rb") as barrier:
            fcntl.flock(barrier, fcntl.LOCK_SH)  # the test's start line
        threads = int(os.environ.get("COMBINE_THREADS", "0"))
        if threads:
            keys = [f"{argv[2]}-{i}" for i in range(threads)]
            workers = [threading.Thread(target=submit, args=(db, k)) for k in keys]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        else:
            submit(db, argv[2])
        m = db.metrics()
        print("figures " + json.dumps({k: m[k] for k in ("handed_over", "served", "writes")}))
        db.close()
        return 0
    if command == "hold":
        db = open_db(path)
        db._gate.acquire(time.monotonic() + 30)
        print("holding", flush=True)
        time.sleep(float(argv[2]))
        db._gate.release()
        print("released", flush=True)
        db.close()
        return 0
    if command == "serve":
        waiters = int(argv[2])
        hold = float(argv[3]) if len(argv) > 3 else 30.0
        fault = os.environ.get("COMBINE_FAULT")
        crash = "during-commit" in POINTS
        faults = install() if crash or fault else None
        db = open_db(path)
        db.submit(KeyItem(f"warm-{os.getpid()}", os.getpid()))  # own a slot
        combiner = db._combiner
        db._gate.acquire(time.monotonic() + 30)
        print("holding", flush=True)
        board = combiner.board()
        assert isinstance(board, Board)
        until = time.monotonic() + hold
        while time.monotonic() < until:
            low = [board.states[i] for i in range(len(board.states)) if i != board.slot]
            if sum(1 for s in low if s == POSTED) >= waiters:
                break
            time.sleep(0.005)
        started = time.monotonic()
        own = Request(KeyItem(f"holder-{os.getpid()}", os.getpid()), started + 30)
        if faults is not None and crash:
            # The writer's cache never spills (cache_spill=OFF): a transaction's first
            # WAL write is its COMMIT's, so nothing of the batch's commit is on disk.
            faults.fail("xWrite", "wal", error="kill")
        elif faults is not None and fault == "ioerr":
            faults.fail("xWrite", "wal", error="ioerr")
        elif faults is not None and fault == "fsync":
            faults.fail("xSync", "wal", error="ioerr")
        mine = [] if os.environ.get("COMBINE_OWN") == "0" else [own]
        combiner._serve(mine, None, started)  # releases the gate
        try:
            if mine and not own.done:
                print("own err unknown", flush=True)  # left for submit to apply again
            elif mine:
                own.outcome()
        except errors.FleetstoreError as exc:
            print(f"own err {type(exc).__name__}", flush=True)
        m = db.metrics()
        keys = ("writes", "batched_items", "served", "batch_max")
        print("figures " + json.dumps({k: m[k] for k in keys}), flush=True)
        db.close()
        return 0
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
