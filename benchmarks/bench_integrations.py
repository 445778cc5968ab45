"""Integrations benchmark (issue 7): each agent framework's own SQLite store against its
fleetstore adapter, same workload, same run, at 16 and 64 agent processes, through an
outside write lock of 6.5 s.

Frameworks and stores (the framework's stores with their defaults; see
benchmarks/integrations_agent.py for what a turn is in each):

  langgraph  sqlite        langgraph-checkpoint-sqlite ``SqliteSaver``
             fleetstore    ``FleetstoreSaver``
  agents     sqlite        OpenAI Agents SDK ``SQLiteSession``
             async-sqlite  ``AsyncSQLiteSession`` (aiosqlite)
             fleetstore    ``FleetstoreSession``
  adk        database      Google ADK ``DatabaseSessionService("sqlite+aiosqlite:///...")``
             sqlite        ADK's ``SqliteSessionService``
             fleetstore    ``FleetstoreSessionService``

One cell = (framework, store, N): a fresh directory and file; one launcher process
imports the framework, creates the schema and the N sessions, then forks N agent
processes, which open their own store, run one warm-up turn on a session of their own,
and wait on a barrier (an flock the benchmark holds).  Measurement starts when every
agent is ready.  Each agent runs turns for
``--run`` seconds, thinking an exponential time (mean ``--think``) before each; a share
``--large-share`` of turns carries a large output (``--large-bytes``).  At ``--lock-at``
seconds the benchmark runs ``fleetstore lock --store PATH --hold 6.5`` against the cell's
file (the framework's own file, or the fleetstore store): a process that does not use
fleetstore holding ``BEGIN IMMEDIATE``, as a backup, a migration or a slow writer would.
The stores of one (framework, N) run back to back.

Per turn:

  failed     the turn raised (an exception from the framework's store call, or
             anything else in the turn: the error is recorded and shown)
  persist    time the turn spent inside the store's own methods (LangGraph
             get_tuple/put/put_writes, Agents SDK get_items/add_items, ADK
             get_session/append_event), measured by a subclass of the store class: the
             union of the calls' intervals (LangGraph overlaps its puts with the nodes)
  lost       after the run a fresh process reads every agent's history back through
             the same store class: an acknowledged turn whose items are not all there
             is lost (counted, not assumed).  Failed turns found there whole
             ("failed, written") or in part ("partial") are counted too.

Latency columns cover acknowledged turns (a failed turn's time is not in them: that
favours the stores that fail; ``fail after`` gives the median time a failing turn took to
fail).  ``p99 clear`` is the p99 of the acknowledged turns that neither started nor ended
inside the lock window: contention without the lock.

    .venv/bin/python benchmarks/bench_integrations.py            # N = 16 and 64 (~13 min)
    .venv/bin/python benchmarks/bench_integrations.py --quick    # N = 16, shorter (~3 min)
    .venv/bin/python benchmarks/bench_integrations.py --frameworks adk --n 16
    .venv/bin/python benchmarks/bench_integrations.py --report benchmarks/results/integrations-<time>.json
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench_history import machine_info
from benchlib import loadavg, pct, print_report, proc_stat, save_results, sleep_until

BENCH_DIR = Path(__file__).resolve().parent
AGENT = str(BENCH_DIR / "integrations_agent.py")
PY = sys.executable

STORES = {
    "langgraph": ("sqlite", "fleetstore"),
    "agents": ("sqlite", "async-sqlite", "fleetstore"),
    "adk": ("database", "sqlite", "fleetstore"),
}
NS = (16, 64)
QUICK_NS = (16,)
RUN_S = 25.0
QUICK_RUN_S = 15.0
LOCK_AT_S = 8.0
QUICK_LOCK_AT_S = 4.0
HOLD_S = 6.5
THINK_S = 1.0
LARGE_SHARE = 0.03
LARGE_BYTES = 2 * 1024 * 1024
READY_TIMEOUT_S = 600.0


class Lines:
    """A child's stdout lines with their arrival time (monotonic), in a queue."""

    def __init__(self, argv: list[str], stderr_path: Path) -> None:
        self._err = stderr_path.open("w")
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            start_new_session=True,  # its own process group: kill() ends its forked agents too
        )
        self.q: queue.Queue[tuple[float, str | None]] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.q.put((time.monotonic(), line.rstrip("\n")))
        self.q.put((time.monotonic(), None))

    def next(self, timeout: float) -> tuple[float, str | None]:
        try:
            at, line = self.q.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return time.monotonic(), ""
        if line is None:
            self.q.put((at, None))
        else:
            self.seen.append(line)
        return at, line

    def wait_prefix(self, prefix: str, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            at, line = self.next(deadline - time.monotonic())
            if line is None:
                return None
            if line.startswith(prefix):
                return at
        return None

    def kill(self) -> None:
        # The launcher's process group holds its agents: end any left (none after a
        # normal exit; all of them after a timeout or an interrupt).
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait()
        self._err.close()


def run_cell(fw: str, store: str, n: int, cfg: dict[str, Any], root: Path) -> dict[str, Any]:
    cell = root / f"{fw}-{store}-n{n}"
    shutil.rmtree(cell, ignore_errors=True)
    cell.mkdir(parents=True)
    path = cell / "store.db"
    out = cell / "agents"
    row: dict[str, Any] = {"framework": fw, "store": store, "n": n, "problems": []}
    barrier_path = cell / "start.barrier"
    bfd = os.open(barrier_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(bfd, fcntl.LOCK_EX)
    argv = [
        PY, AGENT, "fleet", fw, store, str(path), "--agents", str(n),
        "--barrier", str(barrier_path), "--out", str(out), "--run", str(cfg["run"]),
        "--think", str(cfg["think"]), "--large-share", str(cfg["large_share"]),
        "--large-bytes", str(cfg["large_bytes"]), "--seed", str(cfg["seed"]),
    ]  # fmt: skip
    spawned = time.monotonic()
    launcher = Lines(argv, cell / "launcher.stderr")
    lock: Lines | None = None
    try:
        ready = 0
        deadline = spawned + READY_TIMEOUT_S
        while ready < n:
            _, line = launcher.next(deadline - time.monotonic())
            if line is None or time.monotonic() >= deadline:
                row["problems"].append(f"not ready: {ready}/{n}; stdout {launcher.seen[-5:]}")
                return row
            if line.startswith("versions "):
                row["versions"] = json.loads(line[9:])
            elif line.startswith("ready "):
                ready += 1
            elif line.startswith(("crash", "setup-failed")):
                row["problems"].append(f"launcher: {line}")
                return row
        row["startup_s"] = round(time.monotonic() - spawned, 1)
        row["loadavg_start"] = loadavg()
        stat0 = proc_stat()
        fcntl.flock(bfd, fcntl.LOCK_UN)
        start = time.monotonic()
        stat0_at = start
        sleep_until(start + cfg["lock_at"])
        lock = Lines(
            [PY, "-m", "fleetstore", "lock", "--store", str(path), "--hold", str(cfg["hold"])],
            cell / "lock.stderr",
        )
        locked_at = lock.wait_prefix("locked", 60.0)
        released_at = lock.wait_prefix("released", cfg["hold"] + 60.0) if locked_at else None
        if locked_at is None or released_at is None:
            row["problems"].append(f"outside lock not taken/released: {lock.seen}")
        rc = launcher.popen.wait(timeout=cfg["run"] + 900)
        stat1 = proc_stat()
        row["loadavg_end"] = loadavg()
        if rc != 0:
            row["problems"].append(f"launcher exit {rc}: {launcher.seen[-3:]}")
        if stat0 and stat1 and stat1["total"] > stat0["total"]:
            row["cpu_busy_pct"] = round(
                100 * (stat1["busy"] - stat0["busy"]) / (stat1["total"] - stat0["total"])
            )
            tick = os.sysconf("SC_CLK_TCK")
            row["machine_busy_s"] = round((stat1["busy"] - stat0["busy"]) / tick, 2)
            row["machine_s"] = round((stat1["total"] - stat0["total"]) / tick, 2)
            row["stat_window_s"] = round(time.monotonic() - stat0_at, 2)
        window = (
            (locked_at - start - 0.05, released_at - start)
            if locked_at is not None and released_at is not None
            else None
        )
        verified = subprocess.run(
            [PY, AGENT, "verify", fw, store, str(path), "--agents", str(n)],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if verified.returncode != 0:
            row["problems"].append(f"verify failed: {verified.stderr[-2000:]}")
            disk = None
        else:
            disk = {d["agent"]: d for d in json.loads(verified.stdout.splitlines()[-1])}
        summarise(row, out, n, start, window, disk, cfg)
    finally:
        if lock is not None:
            lock.kill()
        launcher.kill()
        os.close(bfd)
        if not cfg["keep"]:
            shutil.rmtree(cell, ignore_errors=True)
    return row


def summarise(
    row: dict[str, Any],
    out: Path,
    n: int,
    start: float,
    window: tuple[float, float] | None,
    disk: dict[int, dict[str, Any]] | None,
    cfg: dict[str, Any],
) -> None:
    turns: list[dict[str, Any]] = []
    per_agent = []
    lost = failed_written = partial = duplicates = missing = 0
    for k in range(n):
        f = out / f"agent-{k}.json"
        if not f.exists():
            missing += 1
            continue
        rec = json.loads(f.read_text())
        if "crash" in rec:
            row["problems"].append(f"agent {k} crashed: {rec['crash'][-800:]}")
        ts = rec["turns"]
        for t in ts:
            t["start"] -= start
            t["end"] -= start
        turns.extend(ts)
        acked = {t["turn"] for t in ts if t["ok"]}
        failed = {t["turn"] for t in ts if not t["ok"]}
        a: dict[str, Any] = {"agent": k, "ok": len(acked), "failed": len(failed)}
        if disk is not None:
            d = disk.get(k, {"complete": [], "partial": [], "duplicates": 0})
            complete, part = set(d["complete"]), set(d["partial"])
            a["on_disk"] = len(complete)
            a["lost"] = len(acked - complete)
            a["failed_written"] = len(failed & complete)
            a["partial"] = len(failed & part)
            # Something on disk that no turn of this agent wrote: must never happen.
            stray = (complete | part) - acked - failed
            if stray or (acked & part):
                row["problems"].append(
                    f"agent {k}: unexpected on disk {sorted(stray | (acked & part))}"
                )
            lost += a["lost"]
            failed_written += a["failed_written"]
            partial += a["partial"]
            duplicates += d["duplicates"]
        per_agent.append(a)
    if missing:
        row["problems"].append(f"{missing} agents left no results")
    if "machine_busy_s" in row:
        fleet_cpu = sum(
            json.loads((out / f"agent-{a['agent']}.json").read_text()).get("cpu_s", 0.0)
            for a in per_agent
        )
        # Machine busy time minus the agents' own CPU (the lock process and the
        # benchmark itself are counted as "other": both are small).
        row["fleet_cpu_s"] = round(fleet_cpu, 2)
        row["other_cpu_pct"] = round(
            100 * max(0.0, row["machine_busy_s"] - fleet_cpu) / row["machine_s"]
        )
    ok = [t for t in turns if t["ok"]]
    bad = [t for t in turns if not t["ok"]]

    def inside(t: dict[str, Any]) -> bool:
        return window is not None and t["end"] >= window[0] and t["start"] <= window[1]

    persist = sorted(t["persist"] * 1000 for t in ok)
    wall = sorted((t["end"] - t["start"]) * 1000 for t in ok)
    clear = sorted(t["persist"] * 1000 for t in ok if not inside(t))
    fail_after = sorted(t["end"] - t["start"] for t in bad)
    errors = Counter(str(t.get("error", ""))[:160] for t in bad)
    row.update(
        {
            "turns": len(turns),
            "ok": len(ok),
            "failed": len(bad),
            "failed_in_lock": sum(inside(t) for t in bad),
            "agents_failed": sum(a["failed"] > 0 for a in per_agent),
            "lost": lost if disk is not None else None,
            "failed_written": failed_written if disk is not None else None,
            "partial": partial if disk is not None else None,
            "duplicates": duplicates if disk is not None else None,
            "large_turns": sum(t["large"] for t in turns),
            "turns_per_s": round(len(turns) / cfg["run"], 1),
            "persist_ms": {
                "p50": pct(persist, 50),
                "p99": pct(persist, 99),
                "max": persist[-1] if persist else float("nan"),
            },
            "persist_clear_p99_ms": pct(clear, 99),
            "turn_ms": {
                "p50": pct(wall, 50),
                "p99": pct(wall, 99),
                "max": wall[-1] if wall else float("nan"),
            },
            "fail_after_s": {
                "p50": pct(fail_after, 50),
                "max": fail_after[-1] if fail_after else None,
            },
            "calls_per_turn": round(sum(t["calls"] for t in ok) / len(ok), 1) if ok else None,
            "lock_window_s": [round(w, 2) for w in window] if window else None,
            "errors": errors.most_common(4),
            "trace": next((t["trace"] for t in bad if "trace" in t), None),
            "per_agent": per_agent,
        }
    )


# --------------------------------------------------------------------------- output


def _ms(v: Any) -> str:
    if v is None or v != v:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


COLUMNS = (
    "framework | store | N | turns | ok | failed | lost | failed, written | partial "
    "| p50 ms | p99 ms | max ms | p99 clear ms | fail after s | agents failing | turns/s"
)


def table_row(r: dict[str, Any]) -> str:
    if "turns" not in r:
        return f"| {r['framework']} | {r['store']} | {r['n']} | not run: {'; '.join(r['problems'])[:200]} |"
    p = r["persist_ms"]
    fa = r["fail_after_s"]["p50"]
    cells = [
        r["framework"],
        r["store"],
        str(r["n"]),
        str(r["turns"]),
        str(r["ok"]),
        f"{r['failed']}" + (f" ({100 * r['failed'] / r['turns']:.1f} %)" if r["failed"] else ""),
        "-" if r["lost"] is None else str(r["lost"]),
        "-" if r["failed_written"] is None else str(r["failed_written"]),
        "-" if r["partial"] is None else str(r["partial"]),
        _ms(p["p50"]),
        _ms(p["p99"]),
        _ms(p["max"]),
        _ms(r["persist_clear_p99_ms"]),
        "-" if fa is None or fa != fa else f"{fa:.1f}",
        f"{r['agents_failed']}/{r['n']}",
        f"{r['turns_per_s']:g}",
    ]
    return "| " + " | ".join(cells) + " |"


def markdown(doc: dict[str, Any]) -> str:
    info, cfg = doc["info"], doc["settings"]
    versions = next((r["versions"] for r in doc["rows"] if r.get("versions")), {})
    lines = [
        f"Run {info['date']} on {info['machine']}; git {info['git_head']}, sources "
        f"{info['sources_sha256']}; stdlib sqlite3 {versions.get('sqlite3', '?')}, "
        + ", ".join(f"{k} {v}" for k, v in versions.items() if k not in ("python", "sqlite3"))
        + f"; load average at start {info['loadavg_at_start']}, at end "
        f"{info.get('loadavg_at_end', '?')}.",
        "",
        f"Settings: {cfg['run']:g} s of turns per cell; think time exponential, mean "
        f"{cfg['think']:g} s; {100 * cfg['large_share']:g} % of turns carry "
        f"{cfg['large_bytes'] / 2**20:g} MiB; outside lock (`fleetstore lock --hold "
        f"{cfg['hold']:g}`) taken {cfg['lock_at']:g} s into the run.",
        "",
        "| " + COLUMNS + " |",
        "|" + "|".join("---" if i < 2 else "---:" for i in range(COLUMNS.count("|") + 1)) + "|",
    ]
    lines += [table_row(r) for r in doc["rows"]]
    lines.append("")
    lines.append("Per cell: load average at start/end, CPU busy, startup, errors:")
    lines.append("")
    for r in doc["rows"]:
        if "turns" not in r:
            continue
        errs = "; ".join(f"{c}x {e}" for e, c in r["errors"]) or "none"
        lines.append(
            f"* {r['framework']} {r['store']} N={r['n']}: load {r['loadavg_start']} -> "
            f"{r['loadavg_end']}, CPU busy {r.get('cpu_busy_pct', '?')} % (other processes "
            f"{r.get('other_cpu_pct', '?')} %), ready after "
            f"{r['startup_s']:g} s, lock window {r['lock_window_s']} s, failed in lock window "
            f"{r['failed_in_lock']}/{r['failed']}, large turns {r['large_turns']}, store calls "
            f"per turn {r['calls_per_turn']}, turn p99 {_ms(r['turn_ms']['p99'])} ms; "
            f"errors: {errs}"
            + (f"; PROBLEMS: {' | '.join(r['problems'])[:600]}" if r["problems"] else "")
        )
    return "\n".join(lines) + "\n"


def progress(r: dict[str, Any]) -> str:
    if "turns" not in r:
        return f"{r['framework']:9} {r['store']:12} N={r['n']:<3} NOT RUN: {r['problems']}"
    p = r["persist_ms"]
    return (
        f"{r['framework']:9} {r['store']:12} N={r['n']:<3} turns {r['turns']:5} failed "
        f"{r['failed']:4} lost {r['lost']} partial {r['partial']} p50/p99/max "
        f"{_ms(p['p50'])}/{_ms(p['p99'])}/{_ms(p['max'])} ms, clear p99 "
        f"{_ms(r['persist_clear_p99_ms'])} ms; ready in {r['startup_s']} s; load "
        f"{r['loadavg_end']}" + (f"; problems: {r['problems']}" if r["problems"] else "")
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N = 16 only, shorter runs")
    ap.add_argument("--n", help="agent counts, comma-separated (default 16,64; --quick 16)")
    ap.add_argument("--frameworks", default=",".join(STORES), help="langgraph,agents,adk")
    ap.add_argument("--stores", help="only these stores, e.g. sqlite,fleetstore")
    ap.add_argument(
        "--run", type=float, help=f"seconds of turns per cell ({RUN_S:g}; quick {QUICK_RUN_S:g})"
    )
    ap.add_argument(
        "--lock-at",
        type=float,
        help=f"seconds into the run ({LOCK_AT_S:g}; quick {QUICK_LOCK_AT_S:g})",
    )
    ap.add_argument("--hold", type=float, default=HOLD_S, help="outside lock hold (s)")
    ap.add_argument("--think", type=float, default=THINK_S, help="mean think time (s)")
    ap.add_argument("--large-share", type=float, default=LARGE_SHARE)
    ap.add_argument("--large-bytes", type=int, default=LARGE_BYTES)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="default benchmarks/results/integrations-<time>.json")
    ap.add_argument("--markdown", type=Path, help="write the tables here too")
    ap.add_argument("--workdir", type=Path, help="where the cells' files go")
    ap.add_argument("--keep", action="store_true", help="keep the cells' files")
    ap.add_argument("--report", type=Path, help="run nothing: print the tables of a --json file")
    args = ap.parse_args(argv)
    if args.report:
        print_report(args.report, markdown, args.markdown)
        return 0
    frameworks = [f for f in args.frameworks.split(",") if f]
    for f in frameworks:
        if f not in STORES:
            ap.error(f"unknown framework {f!r}; known: {', '.join(STORES)}")
    only = set(args.stores.split(",")) if args.stores else None
    ns = [int(x) for x in args.n.split(",")] if args.n else list(QUICK_NS if args.quick else NS)
    cfg: dict[str, Any] = {
        "run": args.run or (QUICK_RUN_S if args.quick else RUN_S),
        "lock_at": args.lock_at
        if args.lock_at is not None
        else (QUICK_LOCK_AT_S if args.quick else LOCK_AT_S),
        "hold": args.hold,
        "think": args.think,
        "large_share": args.large_share,
        "large_bytes": args.large_bytes,
        "seed": args.seed,
        "keep": args.keep,
    }
    if min(ns) < 1 or cfg["think"] <= 0 or cfg["run"] <= cfg["lock_at"] + cfg["hold"]:
        ap.error("N and think must be positive, and the run must outlast the lock")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = args.workdir or BENCH_DIR / "results" / f"integrations-{stamp}"
    info = machine_info()
    info["command"] = " ".join(
        [".venv/bin/python", "benchmarks/bench_integrations.py", *sys.argv[1:]]
    )
    print(f"# {info['machine']}\n# load {info['loadavg_at_start']}; files under {root}", flush=True)
    doc: dict[str, Any] = {"info": info, "settings": cfg, "rows": []}
    t0 = time.monotonic()
    for n in ns:
        for fw in frameworks:
            for store in STORES[fw]:
                if only and store not in only:
                    continue
                row = run_cell(fw, store, n, cfg, root)
                doc["rows"].append(row)
                print(progress(row), flush=True)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    info["loadavg_at_end"] = loadavg()
    info["wall_s"] = round(time.monotonic() - t0, 1)
    md = markdown(doc)
    out = args.json or BENCH_DIR / "results" / f"integrations-{stamp}.json"
    save_results(doc, md, info["wall_s"], out, args.markdown)
    bad = [
        r
        for r in doc["rows"]
        if r["store"] == "fleetstore" and (r["problems"] or r.get("failed") or r.get("lost"))
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
