"""How long a fork and a delete of one large session hold the write lock.

Writes a session of ``--messages`` messages (100,000 by default, through the API: user
turns of one text part, replies of text, a tool call, its result and usage,
alternating), then forks it whole and deletes it, each from a store opened afresh, and
prints per call its time and the longest write-lock hold of the process
(``store.metrics()["lock_hold"]["max"]``: every other writer of the store waits at
most that long for one of them).  Before issue 23 each was one transaction (on the
2-core development machine: fork 4.2 s, delete 0.8 s of lock for 100,000 messages);
now each is many short ones (docs/benchmarks.md, "Forking and deleting a large
session").

    .venv/bin/python benchmarks/bench_fork_delete.py [--messages 100000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import fleetstore
from fleetstore.models import Text, ToolCall, ToolResult, Usage


def fill(path: Path, n: int) -> str:
    with fleetstore.open(path) as store:
        sid = store.sessions.create(title="large").id
        for i in range(n):
            if i % 2 == 0:
                store.messages.append(sid, "user", f"question {i}: why does the build flake?")
            else:
                parts = [
                    Text(f"answer {i}: a test reads a file another test deletes."),
                    ToolCall("bash", {"cmd": f"pytest -k test_{i}"}, call_id=f"c{i}"),
                    ToolResult(f"c{i}", f"{i} passed in 0.1s"),
                ]
                store.messages.append(
                    sid, "assistant", parts, model="m", usage=Usage(1000, 200, 50, 0, 10, 0.001)
                )
    return sid


def timed(path: Path, call: Any) -> dict[str, Any]:
    with fleetstore.open(path) as store:
        started = time.monotonic()
        call(store)
        seconds = time.monotonic() - started
        hold = store.metrics()["lock_hold"]
    return {
        "seconds": round(seconds, 3),
        "transactions": hold["count"],
        "longest_hold_ms": round(hold["max"] * 1000, 1),
        "p50_hold_ms": round(hold["p50"] * 1000, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--json", help="write the result here too")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "large.db"
        t = time.monotonic()
        sid = fill(path, args.messages)
        print(f"wrote {args.messages:,} messages in {time.monotonic() - t:.1f}s")
        fork: dict[str, Any] = {}
        result = {
            "messages": args.messages,
            "loadavg": os.getloadavg()[0],
            "fork": timed(path, lambda s: fork.setdefault("id", s.sessions.fork(sid).id)),
            "delete": timed(path, lambda s: s.sessions.delete(sid)),
        }
    for name in ("fork", "delete"):
        r = result[name]
        print(
            f"{name}: {r['seconds']:.2f}s in {r['transactions']} transactions, "
            f"longest lock hold {r['longest_hold_ms']} ms (p50 {r['p50_hold_ms']} ms)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
