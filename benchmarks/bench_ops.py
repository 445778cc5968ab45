"""Per-operation benchmark: what each public write costs, against raw apsw running the
same statements with the same bindings, one transaction each, in the same run.

For each operation (``state.put``, ``effects.enqueue``, ``messages.append``, a streamed
reply with a tool call, and a turn written both ways: the natural calls, and fused on
the reply), on a fresh store:

1. warm up (connections, caches), checkpoint, and copy the database file: the raw
   baseline starts from the same rows;
2. run the operation N times with an exec trace on the store's writer connection,
   recording every statement and its bindings, cut into transactions at BEGIN and
   COMMIT;
3. run it N more times untraced, timing CPU (``time.process_time``: the checkpoint
   thread's work is counted too) and counting Python calls (one more run, profiled);
4. on the copy, replay the recorded transactions with raw apsw (WAL, the store's
   ``synchronous``, SQLite's own auto-checkpoint, one cursor, rows read whole), timing
   CPU the same way.

Each measurement is repeated ``--rounds`` times (ABAB) and the least CPU of each is
kept: on a shared machine the least is the cost, the rest is other work.  The ratio
fleetstore / raw is the Python around the SQL.

``--search on`` charges each operation the search indexing of what it wrote too: the
timed runs end with ``store.search.catch_up()`` (the work the indexer thread does in
the background; the thread itself is off so that no batch lands in the recorded
transactions).  ``off`` (default): the writes alone (their search triggers queue what
they wrote, as they always do).

    python benchmarks/bench_ops.py [--n 2000] [--rounds 5] [--sync NORMAL] [--search on|off]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw

import fleetstore
from fleetstore import NewEffect


def _ops(store: fleetstore.Store, sid: str) -> dict[str, Callable[[int], None]]:
    def put(i: int) -> None:
        store.state.put(sid, "checkpoint", {"turn": i, "messages": 12, "cursor": "x" * 40})

    def enqueue(i: int) -> None:
        store.effects.enqueue(sid, "title.generate", {"turn": i, "session": sid})

    def append(i: int) -> None:
        store.messages.append(sid, "user", f"why does test {i} flake on the second run?")

    def reply(i: int) -> None:
        with store.messages.stream(sid, model="m-1") as r:
            r.text("Let me run it. ")
            r.text("It passes alone.")
            call = r.tool_call("bash", {"cmd": f"pytest -x tests/test_{i}.py"})
            call.result("collected 12 items\n" + "." * 200 + "\n12 passed in 0.4s\n")
            r.usage(input_tokens=1200, output_tokens=310)

    def turn_natural(i: int) -> None:
        append(i)
        reply(i)
        store.state.put(sid, "checkpoint", {"turn": i})
        store.effects.enqueue(sid, "turn.done", {"turn": i}, idempotency_key=f"{sid}/n{i}")

    def turn_fused(i: int) -> None:
        append(i)
        with store.messages.stream(sid, model="m-1") as r:
            r.text("Let me run it. ")
            r.text("It passes alone.")
            call = r.tool_call("bash", {"cmd": f"pytest -x tests/test_{i}.py"})
            call.result("collected 12 items\n" + "." * 200 + "\n12 passed in 0.4s\n")
            r.usage(input_tokens=1200, output_tokens=310)
            r.put_state("checkpoint", {"turn": i})
            r.enqueue(NewEffect(sid, "turn.done", {"turn": i}, idempotency_key=f"{sid}/f{i}"))

    return {
        "state.put": put,
        "effects.enqueue": enqueue,
        "messages.append": append,
        "a streamed reply": reply,
        "a turn, natural calls": turn_natural,
        "a turn, fused": turn_fused,
    }


def _calls(fn: Callable[[], None]) -> int:
    n = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal n
        if event in ("call", "c_call"):
            n += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n - 2  # the lambda, and setprofile itself


def _record(store: fleetstore.Store, op: Callable[[int], None], first: int, n: int) -> list[Any]:
    """The transactions of *n* runs: each a list of (sql, bindings)."""
    txs: list[list[tuple[str, Any]]] = []
    current: list[tuple[str, Any]] = []

    def trace(cursor: Any, sql: str, bindings: Any) -> bool:
        nonlocal current
        head = sql.lstrip().upper()
        if head.startswith("BEGIN"):
            current = []
        elif head.startswith("COMMIT"):
            txs.append(current)
        elif not head.startswith(("SAVEPOINT", "RELEASE", "ROLLBACK", "PRAGMA")):
            current.append((sql, bindings))
        return True

    writer = store.db._writer  # type: ignore[attr-defined]
    writer.exec_trace = trace
    try:
        for i in range(first, first + n):
            op(i)
    finally:
        writer.exec_trace = None
    return txs


def _raw(path: Path, sync: str, txs: list[Any]) -> float:
    conn = apsw.Connection(str(path))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync}")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.setbusytimeout(5000)
    cursor = conn.cursor()
    started = time.process_time()
    for statements in txs:
        cursor.execute("BEGIN IMMEDIATE")
        for sql, bindings in statements:
            cursor.execute(sql, bindings).fetchall()
        cursor.execute("COMMIT")
    spent = time.process_time() - started
    conn.close()
    return spent


def measure(
    name: str, n: int, rounds: int, sync: str, root: Path, search: bool = False
) -> dict[str, Any]:
    fs_cpu, raw_cpu = [], []
    calls = 0
    statements = transactions = 0
    for r in range(rounds):
        where = root / f"{name.replace(' ', '-').replace(',', '')}-{r}"
        where.mkdir(parents=True)
        db = where / "s.db"
        store = fleetstore.open(db, synchronous=sync, search_index=False)
        try:
            sid = store.sessions.create(title="bench").id
            op = _ops(store, sid)[name]
            for i in range(20):
                op(-1000 - i)
            store.flush()
            store.search.catch_up()
            store.db.checkpoint(truncate=True)  # type: ignore[attr-defined]
            shutil.copy(db, where / "raw.db")
            txs = _record(store, op, 0, n)
            store.search.catch_up()  # what the recorded runs queued: not timed
            started = time.process_time()
            for i in range(n, 2 * n):
                op(i)
            if search:
                store.search.catch_up()
            fs_cpu.append((time.process_time() - started) / n)
            calls = _calls(lambda op=op: op(10 * n))  # type: ignore[misc]
        finally:
            store.close()
        statements = sum(len(t) for t in txs) // n
        transactions = len(txs) / n
        raw_cpu.append(_raw(where / "raw.db", sync, txs) / n)
        shutil.rmtree(where)
    fs, raw = min(fs_cpu), min(raw_cpu)
    return {
        "operation": name,
        "fleetstore_us": round(fs * 1e6, 1),
        "raw_us": round(raw * 1e6, 1),
        "ratio": round(fs / raw, 2),
        "python_calls": calls,
        "statements": statements,
        "transactions": round(transactions, 2),
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="runs of each operation per round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (the least CPU is kept)")
    ap.add_argument("--sync", default="NORMAL", help="synchronous (NORMAL, FULL)")
    ap.add_argument("--only", help="one operation's name")
    ap.add_argument(
        "--search", choices=["on", "off"], default="off", help="charge the search indexing too"
    )
    ap.add_argument("--json", type=Path, help="write the rows here too")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-ops-") as tmp:
        for name in [
            "state.put",
            "effects.enqueue",
            "messages.append",
            "a streamed reply",
            "a turn, natural calls",
            "a turn, fused",
        ]:
            if args.only and name != args.only:
                continue
            row = measure(name, args.n, args.rounds, args.sync, Path(tmp), args.search == "on")
            rows.append(row)
            print(
                f"{name:24} fleetstore {row['fleetstore_us']:7.1f} us  raw {row['raw_us']:7.1f} us"
                f"  x{row['ratio']:.2f}  {row['python_calls']:4d} calls"
                f"  {row['statements']} statements in {row['transactions']} transaction(s)",
                flush=True,
            )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"sync": args.sync, "search": args.search, "n": args.n, "rows": rows}, indent=1
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
