"""PostgreSQL beside SQLite (issue 5): writes/s and outbox claims/s with N = 8, 32 and 64
processes, both engines in the same run, on the same workloads, one fresh store per cell.

Workloads (each process opens the store with default settings, warms it up, and starts
with the others at one instant):

  writes   each process appends messages to its own session in a closed loop, one
           ``store.messages.append`` per message (one operation, one transaction): a
           ~100-byte text part and a small tool call.  writes/s = acknowledged appends /
           the run's seconds; latency = each call's wall time.  Checked: the store holds
           exactly the acknowledged messages, per session with seqs 1..n.
  claims   a backlog of effects over 512 thread keys is enqueued before the start; each
           process runs a claim loop: ``store.effects.claim(owner, limit=1)``, then
           ``claim.succeed()`` (a trivial handler), again at once; nothing claimable
           while effects are still running elsewhere: a 5 ms pause.  claims/s = backlog
           / (the last settlement - the start).  Checked: every effect succeeded, each
           claimed once (attempt 1), nothing left pending or running.

PostgreSQL: a server the benchmark starts (tests/pgserver.py: initdb in a temporary
directory, loopback, max_connections 300), set to fsync on, full_page_writes on and
synchronous_commit off (``--synchronous-commit on`` for commits that wait for the WAL
flush): the durability of SQLite's WAL with synchronous NORMAL, which these SQLite
cells use.  ``--pg-url`` runs against another server instead (its user must be allowed
to CREATE DATABASE; its settings are reported as found).  Each process's pool holds
up to ``pool_size`` connections (the setting, default 4; ``--pool-size``); each
process reports what its pool held at the end (``store.db.metrics()["pool"]``).

    .venv/bin/python benchmarks/bench_pg.py            # the full run (several minutes)
    .venv/bin/python benchmarks/bench_pg.py --quick    # N = 8 and 32, short cells
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
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
sys.path.insert(0, str(BENCH_DIR.parent / "tests"))

ENGINES = ("sqlite", "postgresql")
WORKLOADS = ("writes", "claims")
NS = (8, 32, 64)
QUICK_NS = (8, 32)
SECONDS = 8.0
QUICK_SECONDS = 3.0
BACKLOG = 4000
QUICK_BACKLOG = 1000
BACKLOG_THREADS = 512
KIND = "bench"
IDLE_PAUSE = 0.005
#: Engine counters summed over a cell's processes (SQLite reports zeros for the
#: PostgreSQL-only ones).
COUNTERS = (
    "writes",
    "busy_timeouts",
    "serialization_retries",
    "deadlock_retries",
    "connection_retries",
    "ambiguous_commits",
    "unique_retries",
    "write_errors",
)
PG_SETTINGS = (
    "server_version",
    "max_connections",
    "shared_buffers",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_level",
)


# --------------------------------------------------------------------------- the processes


def _metrics_delta(m0: dict[str, Any], m1: dict[str, Any]) -> dict[str, int]:
    return {k: int(m1.get(k, 0)) - int(m0.get(k, 0)) for k in COUNTERS}


def _append_loop(
    store: Any, sid: str, text: str, start_at: float, seconds: float
) -> dict[str, Any]:
    from fleetstore import Text, ToolCall
    from fleetstore.core.ids import new_id

    took: list[float] = []
    failed = 0
    end = start_at + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
        call = new_id()
        parts = [Text(f"{n} {text}"), ToolCall("read", {"path": f"/src/{n}.py"}, call)]
        t0 = time.monotonic()
        try:
            store.messages.append(sid, "assistant", parts, model="m")
        except Exception:
            failed += 1
            continue
        took.append(time.monotonic() - t0)
    return {"sid": sid, "acked": len(took), "failed": failed, "took": took, "last": time.time()}


def _claim_loop(store: Any, index: int) -> dict[str, Any]:
    owner = f"bench-{index}-{os.getpid()}"
    took: list[float] = []
    failed = idle = 0
    last = time.time()
    while True:
        t0 = time.monotonic()
        try:
            claims = store.effects.claim(owner, limit=1, lease=60)
        except Exception:
            failed += 1
            continue
        if not claims:
            if store.effects.active([KIND]) == 0:
                break
            idle += 1
            time.sleep(IDLE_PAUSE)
            continue
        for claim in claims:
            claim.succeed()
        took.append(time.monotonic() - t0)  # claim + settlement
        last = time.time()
    return {"acked": len(took), "failed": failed, "idle": idle, "took": took, "last": last}


def _child(index: int, conn: Connection) -> None:
    """A benchmark process: serves one cell per ("run", ...) message until ("exit",)."""
    import fleetstore

    try:
        while True:
            msg = conn.recv()
            if msg[0] == "exit":
                return
            _, workload, url, seconds, pool_size = msg
            settings = {"pool_size": pool_size} if url.startswith("postgresql") else {}
            store = fleetstore.open(url, **settings)
            try:
                if workload == "writes":
                    sid = store.sessions.create(title=f"bench {index}").id
                    store.sessions.get(sid)  # warm the read path too
                else:
                    store.effects.active([KIND])
                m0 = store.db.metrics()
                conn.send(("ready", os.getpid()))
                start_at = conn.recv()
                sleep_until(start_at)
                cpu0 = time.process_time()
                if workload == "writes":
                    text = ("the quick brown fox jumps over the lazy dog " * 3)[:100]
                    result = _append_loop(store, sid, text, start_at, seconds)
                else:
                    result = _claim_loop(store, index)
                result["cpu_s"] = time.process_time() - cpu0
                m1 = store.db.metrics()
                result["counters"] = _metrics_delta(m0, m1)
                result["pool"] = m1.get("pool")
                result["pool_size_setting"] = getattr(store.settings, "pool_size", None)
                result["took"].sort()
            finally:
                store.close()
            conn.send(("done", result))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


# --------------------------------------------------------------------------- stores


class _Server:
    """Where the PostgreSQL cells' databases live."""

    def __init__(self, url: str | None, synchronous_commit: str) -> None:
        import pgserver

        self.pgserver = pgserver
        if url:
            from urllib.parse import urlsplit

            parts = urlsplit(url)
            self.server = pgserver.PgServer(
                parts.hostname or "127.0.0.1", parts.port or 5432, parts.username or "postgres"
            )
        else:
            self.server = pgserver.start_server()
            self.server.admin("ALTER SYSTEM SET fsync = on")
            self.server.admin("ALTER SYSTEM SET full_page_writes = on")
            self.server.admin(f"ALTER SYSTEM SET synchronous_commit = {synchronous_commit}")
            self.server.admin("SELECT pg_reload_conf()")
        self.settings = {name: str(self.server.admin(f"SHOW {name}")[0][0]) for name in PG_SETTINGS}

    def new_database(self) -> str:
        return self.server.create_database("bench")

    def drop(self, url: str) -> None:
        self.server.drop_database(url.rsplit("/", 1)[1])

    def close(self) -> None:
        self.pgserver.stop_server(self.server)


def _fill(store: Any, backlog: int) -> None:
    """The backlog, 500 effects per transaction (enqueued with a session's creation)."""
    from fleetstore.models import NewEffect

    for start in range(0, backlog, 500):
        effects = [
            NewEffect(f"th-{i % BACKLOG_THREADS:03d}", KIND, {"i": i})
            for i in range(start, min(start + 500, backlog))
        ]
        store.sessions.create(title=f"backlog {start}", effects=effects)


def _check(store: Any, workload: str, results: list[dict[str, Any]], backlog: int) -> list[str]:
    problems = []
    if workload == "writes":
        for r in results:
            rows = store.read(
                lambda tx, sid=r["sid"]: tx.execute(
                    "SELECT seq FROM messages WHERE session_id = ? ORDER BY seq", (sid,)
                )
            )
            seqs = [int(seq) for (seq,) in rows]
            if seqs != list(range(1, r["acked"] + 1)):
                problems.append(f"session {r['sid']}: {len(seqs)} stored, {r['acked']} acked")
        total = store.read(lambda tx: tx.execute("SELECT count(*) FROM messages"))[0][0]
        if int(total) != sum(r["acked"] for r in results):
            problems.append(f"{total} messages stored, {sum(r['acked'] for r in results)} acked")
    else:
        counts = store.effects.counts()
        if counts["succeeded"] != backlog or counts["pending"] or counts["running"]:
            problems.append(f"effects {counts}, {backlog} expected succeeded")
        rerun = store.read(
            lambda tx: tx.execute("SELECT count(*) FROM effects WHERE attempt <> 1")
        )[0][0]
        if int(rerun):
            problems.append(f"{rerun} effects claimed more than once")
    if any(r["failed"] for r in results):
        problems.append(f"{sum(r['failed'] for r in results)} calls raised")
    return problems


# --------------------------------------------------------------------------- one cell


def run_cell(
    fleet: Children,
    engine: str,
    workload: str,
    n: int,
    cfg: dict[str, Any],
    server: _Server | None,
    root: Path,
) -> dict[str, Any]:
    import fleetstore

    cell = root / f"{engine}-{workload}-n{n}"
    shutil.rmtree(cell, ignore_errors=True)
    cell.mkdir(parents=True)
    if engine == "sqlite":
        url = str(cell / "bench.db")
    else:
        assert server is not None
        url = server.new_database()
    try:
        backlog = cfg["backlog"] if workload == "claims" else 0
        with fleetstore.open(url) as setup:
            if backlog:
                _fill(setup, backlog)
        os.sync()
        for c in fleet.conns:
            c.send(("run", workload, url, cfg["seconds"], cfg["pool_size"]))
        for c in fleet.conns:
            expect(c, "ready", 300)
        start_at = time.monotonic() + 0.25
        for c in fleet.conns:
            c.send(start_at)
        load0 = loadavg()
        sleep_until(start_at)
        wall_start = time.time()
        cpu0 = proc_stat()
        timeout = cfg["seconds"] + 300 if workload == "writes" else max(300.0, backlog / 5)
        results = [expect(c, "done", timeout) for c in fleet.conns]
        cpu1 = proc_stat()
        with fleetstore.open(url) as check:
            problems = _check(check, workload, results, backlog)
    finally:
        if engine == "postgresql" and server is not None and not cfg["keep"]:
            server.drop(url)
        if not cfg["keep"]:
            shutil.rmtree(cell, ignore_errors=True)

    took = sorted(t for r in results for t in r["took"])
    acked = sum(r["acked"] for r in results)
    # From the common start to the last call's return (a write under way at the end of
    # the closed loop is counted, and so is the time it took).
    elapsed = max(r["last"] for r in results) - wall_start
    per_proc = [r["acked"] for r in results]
    counters: Counter[str] = Counter()
    for r in results:
        counters.update(r["counters"])
    pools = [r["pool"] for r in results if r.get("pool")]
    row: dict[str, Any] = {
        "engine": engine,
        "workload": workload,
        "n": n,
        "seconds": elapsed,
        "ops": acked,
        "per_s": acked / elapsed if elapsed > 0 else math.nan,
        "p50_ms": 1000 * pct(took, 50),
        "p99_ms": 1000 * pct(took, 99),
        "max_ms": 1000 * took[-1] if took else math.nan,
        "fairness": min(per_proc) / max(per_proc) if max(per_proc, default=0) else math.nan,
        "failed": sum(r["failed"] for r in results),
        "idle_polls": sum(r.get("idle", 0) for r in results),
        "counters": dict(counters),
        "retries": sum(
            counters[k]
            for k in (
                "serialization_retries",
                "deadlock_retries",
                "connection_retries",
                "unique_retries",
                "ambiguous_commits",
            )
        ),
        "pool_size_setting": results[0].get("pool_size_setting")
        if engine == "postgresql"
        else None,
        "pool_max_open": max((int(p.get("size", 0)) for p in pools), default=None),
        "cpu_ms_per_op": 1000 * sum(r["cpu_s"] for r in results) / max(acked, 1),
        "cpu_busy_pct": math.nan,
        "load_at_start": load0,
        "load_at_end": loadavg(),
        "problems": "; ".join(problems),
    }
    if cpu0 and cpu1 and cpu1["total"] > cpu0["total"]:
        row["cpu_busy_pct"] = (
            100.0 * (cpu1["busy"] - cpu0["busy"]) / (cpu1["total"] - cpu0["total"])
        )
    return row


# --------------------------------------------------------------------------- report


def markdown(doc: dict[str, Any]) -> str:
    info, cfg, rows = doc["info"], doc["settings"], doc["rows"]
    pg = doc.get("postgresql") or {}
    lines = [
        f"Run {info['date']} on {info['machine']}; git {info['git_head']}, sources "
        f"{info['sources_sha256']}; load average at start {info['loadavg_at_start']}, "
        f"at end {info.get('loadavg_at_end', '?')}.",
        f"Command: `{info['command']}`",
        "",
        "PostgreSQL " + ", ".join(f"{k} {v}" for k, v in pg.items()) + f"; pool_size "
        f"{cfg['pool_size']} per process (psycopg_pool, opened on demand). SQLite: WAL, "
        "synchronous NORMAL, the writer gate, busy_timeout 5000. Default store settings "
        "otherwise (write budget 60 s).",
        "",
    ]
    for workload, what in (
        ("writes", f"writes: message appends, {cfg['seconds']:g} s closed loop per process"),
        (
            "claims",
            f"claims: claim + succeed, backlog {cfg['backlog']:,} effects over "
            f"{BACKLOG_THREADS} threads",
        ),
    ):
        cells = [r for r in rows if r["workload"] == workload]
        if not cells:
            continue
        unit = "writes/s" if workload == "writes" else "claims/s"
        lines += [
            f"{what}:",
            "",
            f"| N | engine | {unit} | p50 ms | p99 ms | max ms | min/max per process "
            "| retries | pool open (max) | CPU ms/op | CPU busy % | ok |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in cells:
            pool = (
                "-"
                if r["pool_max_open"] is None or r["engine"] == "sqlite"
                else (f"{r['pool_max_open']} of {r['pool_size_setting']}")
            )
            lines.append(
                f"| {r['n']} | {r['engine']} | {fmt(r['per_s'], 0)} | {fmt(r['p50_ms'], 2)} "
                f"| {fmt(r['p99_ms'], 1)} | {fmt(r['max_ms'], 0)} | {fmt(r['fairness'], 2)} "
                f"| {r['retries']} | {pool} | {fmt(r['cpu_ms_per_op'], 2)} "
                f"| {fmt(r['cpu_busy_pct'], 0)} | {'yes' if not r['problems'] else 'NO: ' + r['problems']} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def _progress(r: dict[str, Any]) -> str:
    unit = "writes/s" if r["workload"] == "writes" else "claims/s"
    warn = f"\n    WARNING: {r['problems']}" if r["problems"] else ""
    return (
        f"{r['workload']:<6} n={r['n']:<3} {r['engine']:<10} {fmt(r['per_s'], 0):>7} {unit}  "
        f"p50 {fmt(r['p50_ms'], 2)} ms  p99 {fmt(r['p99_ms'], 1)} ms  "
        f"retries {r['retries']}  fair {fmt(r['fairness'], 2)}  "
        f"cpu {fmt(r['cpu_busy_pct'], 0)} %  load {r['load_at_start']}" + warn
    )


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N = 8 and 32, short cells")
    ap.add_argument("--n", help="process counts, comma-separated (8,32,64)")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--seconds", type=float, help=f"writes: seconds per cell ({SECONDS:g})")
    ap.add_argument("--backlog", type=int, help=f"claims: effects per cell ({BACKLOG})")
    ap.add_argument("--pool-size", type=int, default=4, help="PostgreSQL pool per process")
    ap.add_argument("--pg-url", help="a server to use instead of starting one")
    ap.add_argument(
        "--synchronous-commit",
        default="off",
        choices=("off", "on"),
        help="of the server the benchmark starts",
    )
    ap.add_argument("--json", type=Path, help="default benchmarks/results/pg-<time>.json")
    ap.add_argument("--markdown", type=Path, help="write the tables here too")
    ap.add_argument("--workdir", type=Path, help="where the SQLite files and spools go")
    ap.add_argument("--keep", action="store_true", help="keep the databases")
    ap.add_argument("--report", type=Path, help="run nothing: print the tables of a --json file")
    args = ap.parse_args(argv)
    if args.report:
        print_report(args.report, markdown, args.markdown)
        return 0
    engines, workloads = _csv(args.engines), _csv(args.workloads)
    for name in engines:
        if name not in ENGINES:
            ap.error(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    for name in workloads:
        if name not in WORKLOADS:
            ap.error(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    ns = [int(x) for x in _csv(args.n)] if args.n else list(QUICK_NS if args.quick else NS)
    cfg: dict[str, Any] = {
        "seconds": args.seconds or (QUICK_SECONDS if args.quick else SECONDS),
        "backlog": args.backlog or (QUICK_BACKLOG if args.quick else BACKLOG),
        "pool_size": args.pool_size,
        "keep": args.keep,
    }
    if min(ns, default=0) < 1 or cfg["seconds"] <= 0 or cfg["backlog"] < 1 or cfg["pool_size"] < 1:
        ap.error("process counts, seconds, backlog and pool size must be positive")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = args.workdir or Path(tempfile.mkdtemp(prefix="fleetstore-bench-pg-"))
    # The PostgreSQL stores' spools and published figures, for every child.
    os.environ["FLEETSTORE_DATA_DIR"] = str(root / "data")
    info = machine_info()
    info["command"] = " ".join([".venv/bin/python", "benchmarks/bench_pg.py", *sys.argv[1:]])
    server = _Server(args.pg_url, args.synchronous_commit) if "postgresql" in engines else None
    doc: dict[str, Any] = {
        "info": info,
        "settings": cfg,
        "postgresql": server.settings if server else None,
        "rows": [],
    }
    print(f"# {info['machine']}\n# load {info['loadavg_at_start']}; files under {root}")
    if server:
        print("# PostgreSQL " + ", ".join(f"{k} {v}" for k, v in server.settings.items()))
    t0 = time.monotonic()
    try:
        for n in ns:
            fleet = Children(n, _child, lambda i: (i,))
            try:
                for workload in workloads:
                    for engine in engines:
                        row = run_cell(fleet, engine, workload, n, cfg, server, root)
                        doc["rows"].append(row)
                        print(_progress(row), flush=True)
            finally:
                fleet.close()
    finally:
        if server is not None and not args.pg_url:
            server.close()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    info["loadavg_at_end"] = loadavg()
    info["wall_s"] = round(time.monotonic() - t0, 1)
    md = markdown(doc)
    out = args.json or BENCH_DIR / "results" / f"pg-{stamp}.json"
    save_results(doc, md, info["wall_s"], out, args.markdown)
    return 1 if any(r["problems"] for r in doc["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
