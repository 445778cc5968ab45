"""A process that meets one injected fault (tests/fix_faults.py) in a write or a
checkpoint of a Database, reports what its caller saw, then dies or closes
(tests/engine/test_faults.py).

    PYTHONPATH=<repository>:... fault_agent.py PATH SPEC

SPEC (JSON): ``sync`` (NORMAL/FULL), ``setup`` ("", "stale": another connection wrote
last, "restart": the WAL was fully checkpointed, so the write starts it over), ``op``
("write" or "checkpoint"), ``rule`` (``Faults.fail`` arguments, ``match`` one of
MATCHERS), ``end`` ("crash": SIGKILL itself with the WAL as the fault left it, "close").

It first commits rows ``a`` and ``b``; the faulted write inserts ``x`` (three pages
and more).  Prints one JSON line: ``raised`` (the class, or null), ``message``,
``fired`` (did the rule fire), and its figures.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable

from fleetstore import errors
from fleetstore.engine.base import Migration
from fleetstore.engine.sqlite import Database
from tests.fix_faults import Call, install

SCHEMA = [Migration(1, "t", "CREATE TABLE t(k TEXT PRIMARY KEY, v BLOB)")]


def _commit_header(call: Call) -> bool:
    # A WAL frame header whose "database size after commit" is set: the commit frame.
    return len(call.data) == 24 and call.data[4:8] != b"\0\0\0\0"


def _after_commit_header() -> Callable[[Call], bool]:
    seen = [False]

    def match(call: Call) -> bool:
        if _commit_header(call):
            seen[0] = True
            return False
        return seen[0] and len(call.data) > 24

    return match


MATCHERS: dict[str, Callable[[], Callable[[Call], bool]]] = {
    "commit-header": lambda: _commit_header,
    "commit-page": _after_commit_header,
    "wal-header": lambda: lambda call: call.offset == 0 and len(call.data) == 32,
}


def main(path: str, spec: dict[str, object]) -> None:
    faults = install()
    db = Database.open(path, migrations=SCHEMA, synchronous=str(spec["sync"]))
    for key in ("a", "b"):
        with db.write() as tx:
            tx.execute("INSERT INTO t VALUES (?, randomblob(6000))", (key,))
    if spec["setup"] == "stale":
        other = Database.open(path, migrations=SCHEMA)
        with other.write() as tx:
            tx.execute("UPDATE t SET v = randomblob(6000) WHERE k = 'a'")
        other.close()
    elif spec["setup"] == "restart":
        log, done = db.checkpoint()
        assert log == done > 0, (log, done)
    rule = dict(spec["rule"])  # type: ignore[call-overload]
    matcher = rule.pop("match", None)
    armed = faults.fail(**rule, match=MATCHERS[matcher]() if matcher else None)
    raised: BaseException | None = None
    try:
        if spec["op"] == "write":
            with db.write() as tx:
                tx.execute("INSERT INTO t VALUES ('x', randomblob(9000))")
        else:
            db.checkpoint(truncate=True)
    except errors.FleetstoreError as exc:
        raised = exc
    figures = db.metrics()
    report = {
        "raised": type(raised).__name__ if raised else None,
        "message": str(raised) if raised else "",
        "fired": armed.fired,
        "figures": {k: figures[k] for k in ("checkpoint_errors", "write_errors", "last_error")},
    }
    faults.clear()
    if spec["op"] == "checkpoint":
        report["checkpoint_after"] = db.checkpoint(truncate=True)  # the fault gone: it works
    print(json.dumps(report), flush=True)
    if spec["end"] == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    db.close()


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
