"""Outbox benchmark (issue 4): claims/s and enqueue->start latency, fleetstore against a
naive polling outbox, with 1, 4 and 8 worker processes, in one invocation.

Strategies (each worker count runs them back to back, each cell on a fresh file):

  fleetstore        ``fleetstore.domain.worker.Worker(store, {"bench": handler}, concurrency=C,
                    lease=L, poll_interval=P)`` in each worker process, default store
                    settings (write budget 60 s, busy_timeout 5000, synchronous NORMAL).
  naive             the outbox as it is usually written: a plain table ``jobs`` in its own
                    file (stdlib ``sqlite3``, WAL, busy_timeout 5000, synchronous NORMAL),
                    and in each worker process one loop (``--naive-threads``: more, each
                    with its own connection): ``BEGIN`` (deferred); ``SELECT`` the oldest
                    pending row; ``UPDATE jobs SET state='running' ... WHERE id=?``;
                    ``COMMIT``; run the handler; ``UPDATE ... SET state='done'``; again at
                    once.  No row: sleep P.  A claim that fails ("database is locked": a
                    deferred transaction's read-to-write upgrade does not wait on
                    busy_timeout) is rolled back and counted, and the loop waits for its
                    next poll, as it would after an empty one.  A failed ``done`` update
                    is counted and leaves its row ``running`` for good.
  naive-autocommit  the same loop with Python's default transaction handling instead of
                    an explicit BEGIN: the SELECT runs outside any transaction and the
                    UPDATE opens its own, which waits on busy_timeout and so succeeds on
                    a row another worker already took: a duplicate start.

P is the same for every strategy (the Worker's default, 0.1 s, unless ``--poll``).  A
fleetstore worker runs one claim loop (up to C = ``--concurrency``, the Worker's default
4, effects in flight, claimed in one transaction); a naive worker one polling loop: so an
idle worker process of either kind looks for work once per P, and enqueue->start latency
compares like with like.  (With ``--naive-threads C`` a naive process polls C times per P.)
The naive outbox has no per-thread order, leases, fencing or retries: it does less work
per effect.

The handler is trivial: it records ``time.time()`` at its start (a plain function; the
Worker runs it in its thread pool) and returns.

Modes:

  backlog   N effects (``--backlog``) over T thread keys (``--threads``), enqueued before the
            workers start; claims/s = N / (the last settlement - the common start).
  latency   an enqueuer process enqueues at a steady rate (one every 1/rate s against a
            clock) for ``--seconds``, round-robin over 256 thread keys, once per rate of
            ``--rates`` (20/s: workers mostly idle, waiting for their next poll; 200/s:
            work found at most polls); the payload carries ``time.time()`` taken just before the enqueue call;
            enqueue->start = the handler's start - that time (so it includes the
            enqueue's commit).  The run ends when every enqueued effect is done.  Each
            worker (each naive loop) starts at a random phase of P: pollers started at
            one instant would stay in step, which no real fleet does.

Checked in every cell: every effect done exactly once in the file, the handler started
once per effect (duplicate starts are counted: they must be 0 for fleetstore), per-thread
order of starts (fleetstore promises it; the naive outbox does not), rows left stuck.

    .venv/bin/python benchmarks/bench_outbox.py            # the full run (a few minutes)
    .venv/bin/python benchmarks/bench_outbox.py --quick    # about a minute
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import shutil
import sqlite3
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from itertools import pairwise
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench_history import machine_info
from benchlib import (
    Children,
    expect,
    fmt,
    loadavg,
    pct,
    print_report,
    proc_stat,
    save_results,
    sleep_until,
)

BENCH_DIR = Path(__file__).resolve().parent

STRATEGIES = ("fleetstore", "naive", "naive-autocommit")
QUICK_STRATEGIES = ("fleetstore", "naive")
MODES = ("backlog", "latency")
WORKERS = (1, 4, 8)
KIND = "bench"
# Worker defaults (fleetstore.domain.worker.Worker), used for every strategy unless overridden.
POLL_S = 0.1
CONCURRENCY = 4
NAIVE_THREADS = 1
LEASE_S = 30.0
BACKLOG = 10000
QUICK_BACKLOG = 2000
BACKLOG_THREADS = 500
QUICK_BACKLOG_THREADS = 100
#: Enqueues/s of the latency mode: sparse (workers mostly idle, waiting for their next
#: poll) and busy (work found at most polls).
RATES = (20.0, 200.0)
QUICK_RATES = (200.0,)
SECONDS = 15.0
QUICK_SECONDS = 3.0
LATENCY_THREADS = 256
BUSY_TIMEOUT_MS = 5000
#: A run whose remaining effects have not changed for this long is stuck.
STALL_S = 15.0

NAIVE_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY,
    thread_key TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    owner TEXT,
    enqueued_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, id);
"""
NAIVE_INSERT = "INSERT INTO jobs (thread_key, kind, payload, state, enqueued_at) VALUES (?, ?, ?, 'pending', ?)"
NAIVE_SELECT = (
    "SELECT id, thread_key, payload FROM jobs WHERE state = 'pending' ORDER BY id LIMIT 1"
)
NAIVE_CLAIM = "UPDATE jobs SET state = 'running', owner = ?, started_at = ? WHERE id = ?"
NAIVE_DONE = "UPDATE jobs SET state = 'done', finished_at = ? WHERE id = ?"

# A start record: (effect id, thread key, seq within the thread, enqueued at, started at).
Record = tuple[str, str, int, float, float]


# --------------------------------------------------------------------------- naive outbox


def naive_connect(path: str, autocommit: bool = True) -> sqlite3.Connection:
    """A connection as such code opens one: WAL, busy_timeout 5000, synchronous NORMAL.
    *autocommit*: no implicit BEGIN (the code issues its own); else Python's default,
    which opens a deferred transaction before an INSERT/UPDATE/DELETE only."""
    con = sqlite3.connect(
        path,
        timeout=BUSY_TIMEOUT_MS / 1000,
        isolation_level=None if autocommit else "DEFERRED",
        check_same_thread=False,  # opened by the process's main thread, used by one loop
    )
    con.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    con.execute("PRAGMA journal_mode = WAL")
    con.execute("PRAGMA synchronous = NORMAL")
    return con


def naive_create(path: Path) -> None:
    con = naive_connect(str(path))
    try:
        con.executescript(NAIVE_SCHEMA)
    finally:
        con.close()


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


class _NaiveLoop:
    """One polling loop of a naive worker process (a thread with its own connection)."""

    def __init__(
        self, strategy: str, path: str, owner: str, poll: float, stop: threading.Event
    ) -> None:
        self.explicit = strategy == "naive"
        self.con = naive_connect(path, autocommit=self.explicit)
        self.owner = owner
        self.poll = poll
        self.stop = stop
        self.records: list[Record] = []
        self.counts: Counter[str] = Counter()

    def run(self, phase: float = 0.0) -> None:
        try:
            self.stop.wait(phase)
            while not self.stop.is_set():
                row = self._claim()
                if row is None:
                    self.stop.wait(self.poll)
                    continue
                jid, thread, payload = row
                started = time.time()  # the trivial handler
                self.records.append((str(jid), thread, jid, json.loads(payload)["t"], started))
                try:
                    self.con.execute(NAIVE_DONE, (time.time(), jid))
                    if not self.explicit:
                        self.con.commit()
                    self.counts["done"] += 1
                except sqlite3.OperationalError as exc:
                    if not _is_locked(exc):
                        raise
                    # The row stays 'running' for good: the known failure of such code.
                    self._rollback()
                    self.counts["done_failed"] += 1
        finally:
            self.con.close()

    def _claim(self) -> tuple[int, str, str] | None:
        con = self.con
        self.counts["polls"] += 1
        try:
            if self.explicit:
                con.execute("BEGIN")
            row = con.execute(NAIVE_SELECT).fetchone()
            if row is None:
                if self.explicit:
                    con.execute("COMMIT")
                self.counts["empty"] += 1
                return None
            con.execute(NAIVE_CLAIM, (self.owner, time.time(), row[0]))
            if self.explicit:
                con.execute("COMMIT")
            else:
                con.commit()
            self.counts["claimed"] += 1
            return (int(row[0]), str(row[1]), str(row[2]))
        except sqlite3.OperationalError as exc:
            if not _is_locked(exc):
                raise
            self._rollback()
            self.counts["claim_locked"] += 1
            return None

    def _rollback(self) -> None:
        if self.con.in_transaction:
            self.con.execute("ROLLBACK")


# --------------------------------------------------------------------------- worker processes


def _await_start(conn: Connection) -> None:
    conn.send(("ready", os.getpid()))
    start_at = conn.recv()
    sleep_until(start_at)


def _stop_listener(conn: Connection, stop: Any) -> threading.Thread:
    """A thread that calls *stop()* when the parent says so."""

    def listen() -> None:
        msg = conn.recv()
        if msg != "stop":
            raise RuntimeError(f"expected 'stop', got {msg!r}")
        stop()

    thread = threading.Thread(target=listen, name="bench-stop", daemon=True)
    thread.start()
    return thread


class _LogCounter(logging.Handler):
    """Counts the worker's warnings and errors (claims deferred, leases lost, ...)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[record.levelname.lower()] += 1


def _fleet_worker(
    path: str, index: int, cfg: dict[str, Any], jitter: float, conn: Connection
) -> dict[str, Any]:
    import fleetstore
    from fleetstore.domain.worker import Worker
    from fleetstore.models import Effect

    log_counter = _LogCounter()
    logging.getLogger("fleetstore").addHandler(log_counter)
    store = fleetstore.open(path)
    records: list[Record] = []

    def handler(effect: Effect) -> None:
        started = time.time()
        records.append(
            (effect.id, effect.thread_key, effect.seq or 0, float(effect.payload["t"]), started)
        )

    worker = Worker(
        store,
        {KIND: handler},
        concurrency=cfg["concurrency"],
        lease=cfg["lease"],
        poll_interval=cfg["poll"],
        owner=f"bench-{index}-{os.getpid()}",
    )
    # Warm both connections (a write and a read) before the clock starts.
    store.effects.declare({KIND: True})
    store.effects.next_ready([KIND])
    m0 = store.metrics()
    _await_start(conn)
    cpu0 = time.process_time()
    listener = _stop_listener(conn, worker.stop)
    time.sleep(random.uniform(0, jitter))
    code = worker.run()
    listener.join()
    cpu_s = time.process_time() - cpu0
    m1 = store.metrics()
    store.close()
    logging.getLogger("fleetstore").removeHandler(log_counter)
    return {
        "pid": os.getpid(),
        "exit": code,
        "records": records,
        "counts": dict(worker.stats) | dict(log_counter.counts),
        "busy_timeouts": m1["busy_timeouts"] - m0["busy_timeouts"],
        "spooled": m1["spooled"] - m0["spooled"],
        "cpu_s": cpu_s,
    }


def _naive_worker(
    strategy: str, path: str, index: int, cfg: dict[str, Any], jitter: float, conn: Connection
) -> dict[str, Any]:
    stop = threading.Event()
    loops = [
        _NaiveLoop(strategy, path, f"bench-{index}-{os.getpid()}-{k}", cfg["poll"], stop)
        for k in range(cfg["naive_threads"])
    ]
    for loop in loops:  # warm: the read path once per connection
        loop.con.execute("SELECT count(*) FROM jobs").fetchone()
    _await_start(conn)
    cpu0 = time.process_time()
    failures: list[str] = []

    def guarded(loop: _NaiveLoop) -> None:
        try:
            loop.run(random.uniform(0, jitter))
        except BaseException:
            failures.append(traceback.format_exc())

    threads = [
        threading.Thread(target=guarded, args=(loop,), name=f"naive-{k}")
        for k, loop in enumerate(loops)
    ]
    for t in threads:
        t.start()
    listener = _stop_listener(conn, stop.set)
    for t in threads:
        t.join()
    listener.join()
    if failures:
        raise RuntimeError("a naive loop failed:\n" + failures[0])
    counts: Counter[str] = Counter()
    for loop in loops:
        counts.update(loop.counts)
    return {
        "pid": os.getpid(),
        "exit": 0,
        "records": [r for loop in loops for r in loop.records],
        "counts": dict(counts),
        "busy_timeouts": None,
        "spooled": None,
        "cpu_s": time.process_time() - cpu0,
    }


def _worker_main(strategy: str, index: int, cfg: dict[str, Any], conn: Connection) -> None:
    """A worker process: serves one run per ("run", path) message until ("exit",)."""
    logging.basicConfig(level=logging.WARNING, format=f"worker {index}: %(message)s")
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "exit":
                return
            _, path, jitter = msg
            if strategy == "fleetstore":
                result = _fleet_worker(path, index, cfg, jitter, conn)
            else:
                result = _naive_worker(strategy, path, index, cfg, jitter, conn)
            conn.send(("done", result))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _enqueuer_main(strategy: str, path: str, cfg: dict[str, Any], conn: Connection) -> None:
    """The latency mode's producer: one enqueue every 1/rate s against a clock."""
    try:
        n = round(cfg["rate"] * cfg["seconds"])
        interval = 1.0 / cfg["rate"]
        store: Any = None
        con: sqlite3.Connection | None = None
        if strategy == "fleetstore":
            import fleetstore

            store = fleetstore.open(path)
            store.effects.next_ready([KIND])
        else:
            con = naive_connect(path)
            con.execute("SELECT count(*) FROM jobs").fetchone()
        conn.send(("ready", os.getpid()))
        start_at = conn.recv()
        sleep_until(start_at)
        cpu0 = time.process_time()
        took: list[float] = []
        failed = 0
        behind = 0.0
        for i in range(n):
            due = start_at + i * interval
            sleep_until(due)
            behind = max(behind, time.monotonic() - due)
            thread = f"th-{i % LATENCY_THREADS:03d}"
            t0 = time.monotonic()
            t = time.time()
            if store is not None:
                store.effects.enqueue(thread, KIND, {"t": t})
            else:
                assert con is not None
                try:
                    con.execute(NAIVE_INSERT, (thread, KIND, json.dumps({"t": t}), t))
                except sqlite3.OperationalError as exc:
                    if not _is_locked(exc):
                        raise
                    failed += 1
            took.append(time.monotonic() - t0)
        elapsed = time.monotonic() - start_at
        cpu_s = time.process_time() - cpu0
        if store is not None:
            store.close()
        if con is not None:
            con.close()
        took.sort()
        conn.send(
            (
                "done",
                {
                    "enqueued": n - failed,
                    "failed": failed,
                    "seconds": elapsed,
                    "enqueue_p50_ms": 1000 * pct(took, 50),
                    "enqueue_p99_ms": 1000 * pct(took, 99),
                    "enqueue_max_ms": 1000 * took[-1] if took else math.nan,
                    "behind_max_ms": 1000 * behind,
                    "cpu_s": cpu_s,
                },
            )
        )
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


# --------------------------------------------------------------------------- one cell


class _Target:
    """Reads the cell's file from the parent: how many effects are done, and at the end
    what the file holds."""

    def __init__(self, strategy: str, path: Path) -> None:
        self.strategy = strategy
        self.store: Any = None
        self.con: sqlite3.Connection | None = None
        if strategy == "fleetstore":
            import fleetstore

            self.store = fleetstore.open(path)
        else:
            naive_create(path)
            self.con = naive_connect(str(path))

    def fill(self, n: int, threads: int) -> None:
        t = time.time()
        if self.store is not None:
            for i in range(n):
                self.store.effects.enqueue(f"th-{i % threads:03d}", KIND, {"t": t})
        else:
            assert self.con is not None
            payload = json.dumps({"t": t})
            with self.con:
                self.con.execute("BEGIN")
                self.con.executemany(
                    NAIVE_INSERT, ((f"th-{i % threads:03d}", KIND, payload, t) for i in range(n))
                )

    def remaining(self) -> int:
        """Effects not done yet: pending or running (both read through an index, so
        polling this costs the workers little)."""
        sql = "SELECT count(*) FROM {} WHERE state IN ('pending', 'running')"
        if self.store is not None:
            rows = self.store.read(lambda tx: tx.execute(sql.format("effects")))
            return int(rows[0][0])
        assert self.con is not None
        return int(self.con.execute(sql.format("jobs")).fetchone()[0])

    def final(self) -> dict[str, Any]:
        """States, the last settlement's time, effects run more than once (attempts)."""
        if self.store is not None:
            rows = self.store.read(
                lambda tx: tx.execute(
                    "SELECT state, count(*), max(finished_at), sum(attempt > 1) "
                    "FROM effects WHERE kind = ? GROUP BY state",
                    (KIND,),
                )
            )
        else:
            assert self.con is not None
            rows = self.con.execute(
                "SELECT state, count(*), max(finished_at), 0 FROM jobs GROUP BY state"
            ).fetchall()
        states = {str(s): int(n) for s, n, _f, _a in rows}
        last = max((f for _s, _n, f, _a in rows if f is not None), default=math.nan)
        return {"states": states, "last_finish": last, "rerun": sum(int(a or 0) for *_, a in rows)}

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        if self.con is not None:
            self.con.close()


def _fifo_violations(first: dict[str, Record]) -> int:
    """Starts that came before an earlier (lower seq) effect of the same thread."""
    by_thread: dict[str, list[Record]] = defaultdict(list)
    for r in first.values():
        by_thread[r[1]].append(r)
    bad = 0
    for recs in by_thread.values():
        recs.sort(key=lambda r: r[4])
        bad += sum(1 for a, b in pairwise(recs) if b[2] < a[2])
    return bad


def run_cell(
    fleet: Children,
    strategy: str,
    workers: int,
    mode: str,
    rate: float | None,
    cfg: dict[str, Any],
    root: Path,
) -> dict[str, Any]:
    cfg = {**cfg, "rate": rate}
    cell = root / (f"{strategy}-w{workers}-{mode}" + (f"-{rate:g}" if rate else ""))
    shutil.rmtree(cell, ignore_errors=True)
    cell.mkdir(parents=True)
    path = cell / "bench.db"
    target = _Target(strategy, path)
    enq_proc: Any = None
    enq_conn: Connection | None = None
    try:
        expected = 0
        if mode == "backlog":
            expected = cfg["backlog"]
            target.fill(expected, cfg["backlog_threads"])
        os.sync()  # earlier cells' dirty pages written back before this one starts
        wall0 = time.monotonic()
        # Pollers that all start at one instant stay in step, which no real fleet does:
        # in the latency mode each starts at a random phase of its poll interval.
        jitter = cfg["poll"] if mode == "latency" else 0.0
        for c in fleet.conns:
            c.send(("run", str(path), jitter))
        if mode == "latency":
            enq_conn, child = fleet.ctx.Pipe()
            enq_proc = fleet.ctx.Process(
                target=_enqueuer_main, args=(strategy, str(path), cfg, child), daemon=True
            )
            enq_proc.start()
            child.close()
        for c in [*fleet.conns, *([enq_conn] if enq_conn else [])]:
            expect(c, "ready", 180)
        start_at = time.monotonic() + 0.25
        ready_s = start_at - wall0
        for c in [*fleet.conns, *([enq_conn] if enq_conn else [])]:
            c.send(start_at)
        load0 = loadavg()
        sleep_until(start_at)
        wall_start = time.time()
        cpu0 = proc_stat()
        own0 = time.process_time()
        enq: dict[str, Any] | None = None
        budget = cfg["seconds"] + 120 if mode == "latency" else max(120.0, expected / 20)
        deadline = start_at + budget
        timed_out = False
        last, changed = -1, time.monotonic()
        while True:
            if enq_conn is not None and enq is None and enq_conn.poll():
                kind, payload = enq_conn.recv()
                if kind != "done":
                    raise RuntimeError(f"the enqueuer failed:\n{payload}")
                enq = payload
                expected = payload["enqueued"]
            left = target.remaining()
            if left != last:
                last, changed = left, time.monotonic()
            producing = enq_conn is not None and enq is None
            if not producing and left == 0:
                break
            for c in fleet.conns:
                if c.poll():  # a worker spoke before it was told to stop: it failed
                    expect(c, "done", 0)
                    raise RuntimeError("a worker stopped on its own")
            now = time.monotonic()
            if now > deadline or (not producing and now - changed > STALL_S):
                timed_out = True  # rows stuck 'running' (naive) or a bug: reported below
                break
            time.sleep(0.05)
        cpu1 = proc_stat()
        own_s = time.process_time() - own0
        load1 = loadavg()
        for c in fleet.conns:
            c.send("stop")
        results = [expect(c, "done", 120) for c in fleet.conns]
        if enq_proc is not None:
            enq_proc.join(30)
        final = target.final()
    finally:
        target.close()
        if enq_conn is not None:
            enq_conn.close()
        if enq_proc is not None and enq_proc.is_alive():
            enq_proc.kill()
            enq_proc.join(5)

    records = [r for res in results for r in res["records"]]
    records.sort(key=lambda r: r[4])
    first: dict[str, Record] = {}
    for r in records:
        first.setdefault(r[0], r)
    counts: Counter[str] = Counter()
    for res in results:
        counts.update(res["counts"])
    done = final["states"].get("succeeded" if strategy == "fleetstore" else "done", 0)
    drain_s = final["last_finish"] - wall_start
    latencies = sorted(r[4] - r[3] for r in first.values())
    row: dict[str, Any] = {
        "strategy": strategy,
        "workers": workers,
        "mode": mode,
        "concurrency": cfg["concurrency"] if strategy == "fleetstore" else cfg["naive_threads"],
        "poll_s": cfg["poll"],
        "lease_s": cfg["lease"] if strategy == "fleetstore" else None,
        "effects": expected,
        "done": done,
        "states": final["states"],
        "drain_s": drain_s,
        "claims_per_s": done / drain_s if drain_s > 0 else math.nan,
        "starts": len(records),
        "dup_starts": len(records) - len(first),
        "rerun": final["rerun"],
        "fifo_violations": _fifo_violations(first),
        "lock_errors": counts.get("claim_locked", 0) + counts.get("done_failed", 0),
        "counts": dict(counts),
        "busy_timeouts": sum(r["busy_timeouts"] or 0 for r in results),
        "spooled": sum(r["spooled"] or 0 for r in results),
        "exit_codes": sorted({r["exit"] for r in results}),
        "timed_out": timed_out,
        "ready_s": ready_s,
        "workers_cpu_s": sum(r["cpu_s"] for r in results),
        "cpu_ms_per_effect": 1000 * sum(r["cpu_s"] for r in results) / max(done, 1),
        "load_at_start": load0,
        "load_at_end": load1,
        "cpu_busy_pct": math.nan,
        "cpu_other_pct": math.nan,
    }
    if mode == "latency":
        assert enq is not None or timed_out
        row["enqueuer"] = enq
        row["rate"] = cfg["rate"]
        row["p50_ms"] = 1000 * pct(latencies, 50)
        row["p90_ms"] = 1000 * pct(latencies, 90)
        row["p99_ms"] = 1000 * pct(latencies, 99)
        row["max_ms"] = 1000 * latencies[-1] if latencies else math.nan
    if cpu0 and cpu1 and cpu1["total"] > cpu0["total"]:
        total = cpu1["total"] - cpu0["total"]
        row["cpu_busy_pct"] = 100.0 * (cpu1["busy"] - cpu0["busy"]) / total
        # Machine busy time minus the benchmark's own (workers, enqueuer, this process):
        # what other processes on the machine took during the window.
        ours = row["workers_cpu_s"] + own_s + ((enq or {}).get("cpu_s") or 0.0)
        available_s = total / os.sysconf("SC_CLK_TCK")
        row["cpu_other_pct"] = max(0.0, row["cpu_busy_pct"] - 100.0 * ours / available_s)
    problems = []
    if done != expected or final["states"].keys() - {"succeeded", "done"}:
        problems.append(f"{done} of {expected} done; states {final['states']}")
    if len(first) != expected:
        problems.append(f"{len(first)} distinct effects started, {expected} expected")
    if strategy == "fleetstore":
        if row["dup_starts"] or row["rerun"]:
            problems.append(f"{row['dup_starts']} duplicate starts, {row['rerun']} re-runs")
        if row["fifo_violations"]:
            problems.append(f"{row['fifo_violations']} per-thread order violations")
        if row["exit_codes"] != [0]:
            problems.append(f"worker exit codes {row['exit_codes']}")
    if timed_out:
        problems.append(f"not drained: {last} effect(s) left pending or running")
    row["problems"] = "; ".join(problems)
    if not cfg["keep"]:
        shutil.rmtree(cell, ignore_errors=True)
    return row


# --------------------------------------------------------------------------- report


def _ok(r: dict[str, Any]) -> str:
    return "yes" if not r["problems"] else "NO: " + r["problems"]


def markdown(doc: dict[str, Any]) -> str:
    info, cfg, rows = doc["info"], doc["settings"], doc["rows"]
    lines = [
        f"Run {info['date']} on {info['machine']}; git {info['git_head']}, sources "
        f"{info['sources_sha256']}; load average at start {info['loadavg_at_start']}, "
        f"at end {info.get('loadavg_at_end', '?')}.",
        f"Command: `{info['command']}`",
        "",
        f"Settings: poll interval {cfg['poll'] * 1000:g} ms for every strategy; trivial "
        f"handler; busy_timeout {BUSY_TIMEOUT_MS} ms, synchronous NORMAL, WAL. fleetstore: "
        f"`Worker(concurrency={cfg['concurrency']}, lease={cfg['lease']:g}, "
        f"poll_interval={cfg['poll']:g})`, prefetch 0, default store settings (write budget "
        f"60 s). naive: {cfg['naive_threads']} polling loop(s) per worker process, each "
        "one effect at a time.",
        "",
    ]
    backlog = [r for r in rows if r["mode"] == "backlog"]
    if backlog:
        lines += [
            f"Backlog: {cfg['backlog']:,} effects over {cfg['backlog_threads']} threads, "
            "enqueued before the workers start; claims/s = effects / (last settlement - start).",
            "",
            "| workers | strategy | claims/s | drain s | dup starts | claim/settle "
            '"locked" | FIFO violations | worker CPU ms/effect | CPU busy % | other CPU % '
            "| load at start | ok |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for r in backlog:
            lines.append(
                f"| {r['workers']} | {r['strategy']} | {fmt(r['claims_per_s'], 0)} "
                f"| {fmt(r['drain_s'], 2)} | {r['dup_starts']} | {r['lock_errors']} "
                f"| {r['fifo_violations']} | {fmt(r['cpu_ms_per_effect'], 2)} "
                f"| {fmt(r['cpu_busy_pct'], 0)} | {fmt(r['cpu_other_pct'], 0)} "
                f"| {r['load_at_start']} | {_ok(r)} |"
            )
        lines.append("")
    latency = [r for r in rows if r["mode"] == "latency"]
    if latency:
        lines += [
            f"Latency: one enqueuer process enqueues at a steady rate for {cfg['seconds']:g} s, "
            f"round-robin over {LATENCY_THREADS} threads; enqueue->start = handler start - "
            "time taken just before the enqueue call.",
            "",
            "| rate /s | workers | strategy | effects | p50 ms | p90 ms | p99 ms | max ms "
            '| enqueue p99 ms | dup starts | claim/settle "locked" | worker CPU ms/effect '
            "| CPU busy % | other CPU % | load at start | ok |",
            "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for r in latency:
            enq = r.get("enqueuer") or {}
            lines.append(
                f"| {r['rate']:g} | {r['workers']} | {r['strategy']} | {r['effects']:,} "
                f"| {fmt(r['p50_ms'])} "
                f"| {fmt(r['p90_ms'])} | {fmt(r['p99_ms'])} | {fmt(r['max_ms'])} "
                f"| {fmt(enq.get('enqueue_p99_ms'), 2)} | {r['dup_starts']} "
                f"| {r['lock_errors']} | {fmt(r['cpu_ms_per_effect'], 2)} "
                f"| {fmt(r['cpu_busy_pct'], 0)} | {fmt(r['cpu_other_pct'], 0)} "
                f"| {r['load_at_start']} | {_ok(r)} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def _progress(r: dict[str, Any]) -> str:
    mode = r["mode"] + (f" {r['rate']:g}/s" if r["mode"] == "latency" else "")
    head = f"{mode:<14} w={r['workers']} {r['strategy']:<17}"
    if r["mode"] == "backlog":
        body = f"{fmt(r['claims_per_s'], 0):>7} claims/s  drain {fmt(r['drain_s'], 2)} s"
    else:
        body = f"p50 {fmt(r['p50_ms'])} ms  p99 {fmt(r['p99_ms'])} ms  max {fmt(r['max_ms'])} ms"
    tail = (
        f"  dup {r['dup_starts']}  locked {r['lock_errors']}  fifo {r['fifo_violations']}  "
        f"cpu {fmt(r['cpu_busy_pct'], 0)} % (other {fmt(r['cpu_other_pct'], 0)} %)  load {r['load_at_start']}  ready "
        f"{r['ready_s']:.1f} s"
    )
    warn = f"\n    WARNING: {r['problems']}" if r["problems"] else ""
    return head + body + tail + warn


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="about a minute: for development")
    ap.add_argument("--workers", help="worker process counts, comma-separated (1,4,8)")
    ap.add_argument(
        "--strategies",
        help=f"comma-separated (default {','.join(STRATEGIES)}; --quick: "
        f"{','.join(QUICK_STRATEGIES)})",
    )
    ap.add_argument("--modes", default=",".join(MODES), help="backlog,latency")
    ap.add_argument("--poll", type=float, default=POLL_S, help="poll interval, every strategy")
    ap.add_argument(
        "--concurrency", type=int, default=CONCURRENCY, help="fleetstore Worker concurrency"
    )
    ap.add_argument(
        "--naive-threads",
        type=int,
        default=NAIVE_THREADS,
        help="polling loops per naive worker process",
    )
    ap.add_argument("--lease", type=float, default=LEASE_S, help="fleetstore lease (s)")
    ap.add_argument("--backlog", type=int, help=f"effects of the backlog mode ({BACKLOG})")
    ap.add_argument("--threads", type=int, help=f"thread keys of the backlog ({BACKLOG_THREADS})")
    ap.add_argument(
        "--rates",
        help="enqueues/s of the latency mode, comma-separated (default "
        f"{','.join(f'{r:g}' for r in RATES)}; --quick: {','.join(f'{r:g}' for r in QUICK_RATES)})",
    )
    ap.add_argument("--seconds", type=float, help=f"latency mode's length ({SECONDS:g} s)")
    ap.add_argument("--json", type=Path, help="default benchmarks/results/outbox-<time>.json")
    ap.add_argument("--markdown", type=Path, help="write the tables here too")
    ap.add_argument("--workdir", type=Path, help="where the databases go")
    ap.add_argument("--keep", action="store_true", help="keep the databases")
    ap.add_argument("--report", type=Path, help="run nothing: print the tables of a --json file")
    args = ap.parse_args(argv)
    if args.report:
        print_report(args.report, markdown, args.markdown)
        return 0

    strategies = (
        _csv(args.strategies)
        if args.strategies
        else list(QUICK_STRATEGIES if args.quick else STRATEGIES)
    )
    modes = _csv(args.modes)
    workers = [int(x) for x in _csv(args.workers)] if args.workers else list(WORKERS)
    for name in strategies:
        if name not in STRATEGIES:
            ap.error(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
    for name in modes:
        if name not in MODES:
            ap.error(f"unknown mode {name!r}; known: {', '.join(MODES)}")
    cfg: dict[str, Any] = {
        "poll": args.poll,
        "concurrency": args.concurrency,
        "naive_threads": args.naive_threads,
        "lease": args.lease,
        "backlog": args.backlog or (QUICK_BACKLOG if args.quick else BACKLOG),
        "backlog_threads": args.threads
        or (QUICK_BACKLOG_THREADS if args.quick else BACKLOG_THREADS),
        "rates": [float(x) for x in _csv(args.rates)]
        if args.rates
        else list(QUICK_RATES if args.quick else RATES),
        "seconds": args.seconds or (QUICK_SECONDS if args.quick else SECONDS),
        "keep": args.keep,
    }
    if (
        min(workers, default=0) < 1
        or cfg["concurrency"] < 1
        or cfg["naive_threads"] < 1
        or min(cfg["rates"], default=0) <= 0
    ):
        ap.error("workers, concurrency and rate must be positive")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = args.workdir or BENCH_DIR / "results" / f"outbox-{stamp}"
    info = machine_info()
    info["command"] = " ".join([".venv/bin/python", "benchmarks/bench_outbox.py", *sys.argv[1:]])
    print(f"# {info['machine']}\n# load {info['loadavg_at_start']}; databases under {root}")
    doc: dict[str, Any] = {"info": info, "settings": cfg, "rows": []}
    t0 = time.monotonic()
    for w in workers:
        for strategy in strategies:
            fleet = Children(w, _worker_main, lambda i, s=strategy: (s, i, cfg))
            try:
                for mode in modes:
                    for rate in cfg["rates"] if mode == "latency" else [None]:
                        row = run_cell(fleet, strategy, w, mode, rate, cfg, root)
                        doc["rows"].append(row)
                        print(_progress(row), flush=True)
            finally:
                fleet.close()
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    info["loadavg_at_end"] = loadavg()
    info["wall_s"] = round(time.monotonic() - t0, 1)
    md = markdown(doc)
    out = args.json or BENCH_DIR / "results" / f"outbox-{stamp}.json"
    save_results(doc, md, info["wall_s"], out, args.markdown)
    bad = [r for r in doc["rows"] if r["problems"] and r["strategy"] == "fleetstore"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
