"""Processes for the group-commit tests (tests/engine/test_group_commit.py).

    combine_agent.py write PATH KEY BARRIER [BUDGET]
                                                once the BARRIER file's lock is free, submit
                                                one item; print "ok KEY" or "err CLASS"
    combine_agent.py hold PATH SECONDS          hold the gate (nothing else) for SECONDS
    combine_agent.py serve PATH WAITERS [HOLD]  hold the gate until WAITERS items are posted
                                                (or HOLD seconds pass), then commit them with
                                                an item of its own in one transaction; print
                                                its figures.  FLEETSTORE_TEST_CRASH_COMBINE
                                                makes it SIGKILL itself at that point
                                                ("during-commit": inside COMMIT, at its
                                                first WAL write).

An item inserts its key into ``t`` (a key already there is left alone: applying an
item twice is applying it once); a key starting with "bad" raises ``InvalidInput``.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time

from fleetstore import errors
from fleetstore.engine.base import Migration, Tx
from fleetstore.engine.combine import CRASH_ENV, POSTED, Board, Request
from fleetstore.engine.sqlite import Database
from tests.fix_faults import install

SCHEMA = [Migration(1, "t", "CREATE TABLE t(k TEXT PRIMARY KEY, pid INTEGER)")]
TAG = "combine-test/1"


def insert(tx: Tx, key: str, pid: int) -> dict[str, object]:
    if key.startswith("bad"):
        raise errors.InvalidInput(f"refused: {key}")
    rows = tx.execute(
        "INSERT INTO t(k, pid) VALUES (?, ?) ON CONFLICT DO NOTHING RETURNING k", (key, pid)
    )
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
    db = Database.open(path, migrations=SCHEMA, write_budget=budget)
    db.serve(TAG, applier)
    return db


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
        started = time.monotonic()
        try:
            db.submit(KeyItem(argv[2], os.getpid()))
        except errors.FleetstoreError as exc:
            print(f"err {type(exc).__name__} {time.monotonic() - started:.3f}", flush=True)
        else:
            print(f"ok {argv[2]} {time.monotonic() - started:.3f}", flush=True)
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
        faults = install() if os.environ.get(CRASH_ENV) == "during-commit" else None
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
        if faults is not None:
            # The writer's cache never spills (cache_spill=OFF): a transaction's first
            # WAL write is its COMMIT's, so nothing of the batch's commit is on disk.
            faults.fail("xWrite", "wal", error="kill")
        combiner._serve([own], None, started)  # releases the gate
        own.outcome()
        m = db.metrics()
        keys = ("writes", "batched_items", "served", "batch_max")
        print("figures " + json.dumps({k: m[k] for k in keys}), flush=True)
        db.close()
        return 0
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
