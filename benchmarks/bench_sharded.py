"""The sharded layout beside the single file (issue 9): the same fleet of agent processes,
same seed, against ``DIR/fleetstore.db`` and against ``sqlite+sharded:///DIR``, at N = 8,
32 and 64 processes, without and with large tool outputs.

Each cell is one ``fleetstore stress --json`` run (``python -m fleetstore_stress``, stress/) in a
fresh directory: N agent processes, each living its own session (a tree of its own:
one shard file each on the sharded layout) in a closed loop by default (``--think-ms
0``): a user message, a streamed reply with a tool call and its output, usage, a state
checkpoint and an outbox effect, which ``--workers`` worker processes settle; 9 write
transactions per turn.  On the sharded layout the effect's enqueue and the workers'
claims and settlements go to the catalog, everything else to the agent's shard.
Tool outputs are log-normal around 2,000 bytes (``small``), or with 2 % of them
log-uniform from 1 to 8 MiB, written as blobs before their transaction (``large``).

Per cell: turns/s and store writes/s (write transactions the agents committed, from
their engines' counters), turn latency p50/p99 (time inside the store's calls per
turn), lock wait p99 (the agents' write-lock wait histograms summed), CPU (the agents'
CPU ms per turn; the machine's busy share from /proc/stat), failed and lost turns and
the read-back verdict (every acknowledged turn present once, in order, intact; every
file's integrity_check; on the sharded layout the catalog's index equal to the shards).
The single file is the baseline of each (N, outputs) pair, run next to it (the order
alternates, so drift in the machine's load does not favour one layout); the table gives
sharded / single for turns/s, writes/s and p99.

    .venv/bin/python benchmarks/bench_sharded.py            # about 10-15 minutes on 2 cores
    .venv/bin/python benchmarks/bench_sharded.py --quick    # N = 8 and 32, 3 s cells
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_history import machine_info
from benchlib import fmt, loadavg, print_report, proc_stat, save_results

BENCH_DIR = Path(__file__).resolve().parent
LAYOUTS = ("file", "sharded")
OUTPUTS = ("small", "large")
NS = (8, 32, 64)
QUICK_NS = (8, 32)
SECONDS = 10.0
QUICK_SECONDS = 3.0
SEED = 9
#: --large-rate of each outputs variant (the large outputs: 1 MiB to --large-bytes).
LARGE_RATE = {"small": 0.0, "large": 0.02}


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}
    env["FLEETSTORE_DATA_DIR"] = str(root / "data")
    src = str(BENCH_DIR.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def run_cell(layout: str, outputs: str, n: int, cfg: dict[str, Any], root: Path) -> dict[str, Any]:
    cell = root / f"{layout}-{outputs}-n{n}"
    shutil.rmtree(cell, ignore_errors=True)
    cell.mkdir(parents=True)
    url = str(cell / "fleetstore.db") if layout == "file" else f"sqlite+sharded://{cell / 'store'}"
    argv = [
        *(sys.executable, "-m", "fleetstore_stress", "--json", "--url", url),
        *("--dir", str(cell / "run"), "--agents", str(n), "--duration", f"{cfg['seconds']:g}"),
        *("--think-ms", f"{cfg['think_ms']:g}", "--workers", str(cfg["workers"])),
        *("--seed", str(cfg["seed"]), "--large-rate", f"{LARGE_RATE[outputs]:g}"),
    ]
    load0 = loadavg()
    cpu0 = proc_stat()
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=_env(root))
    wall = time.monotonic() - began
    cpu1 = proc_stat()
    row: dict[str, Any] = {
        "layout": layout,
        "outputs": outputs,
        "n": n,
        "exit_code": done.returncode,
        "wall_s": round(wall, 1),
        "load_at_start": load0,
        "load_at_end": loadavg(),
        "cpu_busy_pct": math.nan,
    }
    if cpu0 and cpu1 and cpu1["total"] > cpu0["total"]:
        # The whole cell (start-up and read-back included): the machine's share.
        row["cpu_busy_pct"] = (
            100.0 * (cpu1["busy"] - cpu0["busy"]) / (cpu1["total"] - cpu0["total"])
        )
    try:
        report = json.loads(done.stdout)
    except ValueError:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        row["problems"] = f"no report (exit {done.returncode}): {tail}"
        return row
    (t,) = report["targets"]
    engine = t.get("engine", {})
    turns = int(t["acknowledged"])
    row.update(
        turns=turns,
        elapsed_s=t["elapsed_s"],
        turns_per_s=t["turns_per_s"],
        writes_per_s=engine.get("writes_per_s", math.nan),
        p50_ms=t["latency_ms"]["p50"],
        p99_ms=t["latency_ms"]["p99"],
        max_ms=t["latency_ms"]["max"],
        lock_wait_p99_ms=engine.get("lock_wait_ms", {}).get("p99", math.nan),
        lock_hold_p99_ms=engine.get("lock_hold_ms", {}).get("p99", math.nan),
        agent_cpu_ms_per_turn=1000 * engine.get("agent_cpu_s", math.nan) / max(turns, 1),
        worker_cpu_s=engine.get("worker_cpu_s", math.nan),
        fairness=t["fairness"]["ratio"],
        failed=t["failed"],
        lost=t["lost"],
        effects=t["effects"],
        files=t.get("files_checked"),
        startup_s=t["startup_s"],
        verdict=report["verdict"],
        problems="; ".join(report["problems"]),
    )
    if not cfg["keep"]:
        shutil.rmtree(cell, ignore_errors=True)
    return row


def _ratio(a: Any, b: Any) -> float:
    try:
        return float(a) / float(b) if float(b) > 0 else math.nan
    except (TypeError, ValueError):
        return math.nan


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """sharded / single file for each (N, outputs) measured with both layouts."""
    out = []
    by = {(r["layout"], r["outputs"], r["n"]): r for r in rows}
    for (layout, outputs, n), sh in by.items():
        base = by.get(("file", outputs, n))
        if layout != "sharded" or base is None:
            continue
        out.append(
            {
                "n": n,
                "outputs": outputs,
                "turns_per_s": _ratio(sh.get("turns_per_s"), base.get("turns_per_s")),
                "writes_per_s": _ratio(sh.get("writes_per_s"), base.get("writes_per_s")),
                "p99": _ratio(sh.get("p99_ms"), base.get("p99_ms")),
                "lock_wait_p99": _ratio(sh.get("lock_wait_p99_ms"), base.get("lock_wait_p99_ms")),
            }
        )
    return sorted(out, key=lambda r: (r["outputs"], r["n"]))


def markdown(doc: dict[str, Any]) -> str:
    info, cfg, rows = doc["info"], doc["settings"], doc["rows"]
    think = f"{cfg['think_ms']:g} ms mean think time" if cfg["think_ms"] else "closed loop"
    lines = [
        f"Run {info['date']} on {info['machine']}; git {info['git_head']}, sources "
        f"{info['sources_sha256']}; load average at start {info['loadavg_at_start']}, "
        f"at end {info.get('loadavg_at_end', '?')}.",
        f"Command: `{info['command']}`",
        "",
        f"`fleetstore stress`, {cfg['seconds']:g} s per cell, {think}, {cfg['workers']} outbox "
        f"workers, seed {cfg['seed']}; outputs small (log-normal around 2,000 bytes) or "
        "large (the same with 2 % from 1 to 8 MiB). SQLite defaults (WAL, synchronous "
        "NORMAL, write budget 60 s).",
        "",
        "| N | outputs | layout | turns/s | writes/s | turn p50 ms | turn p99 ms "
        "| lock wait p99 ms | lock hold p99 ms | agent CPU ms/turn | CPU busy % "
        "| min/max per agent | failed | lost | ok |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["outputs"], r["n"], r["layout"])):
        ok = (
            "yes"
            if r.get("verdict") == "pass" and not r.get("problems")
            else ("NO: " + str(r.get("problems") or r.get("verdict")))
        )
        lines.append(
            f"| {r['n']} | {r['outputs']} | {r['layout']} | {fmt(r.get('turns_per_s'), 0)} "
            f"| {fmt(r.get('writes_per_s'), 0)} | {fmt(r.get('p50_ms'), 1)} "
            f"| {fmt(r.get('p99_ms'), 0)} | {fmt(r.get('lock_wait_p99_ms'), 1)} "
            f"| {fmt(r.get('lock_hold_p99_ms'), 1)} "
            f"| {fmt(r.get('agent_cpu_ms_per_turn'), 2)} | {fmt(r.get('cpu_busy_pct'), 0)} "
            f"| {fmt(r.get('fairness'), 2)} | {r.get('failed', '-')} | {r.get('lost', '-')} "
            f"| {ok} |"
        )
    lines += [
        "",
        "sharded / single file:",
        "",
        "| N | outputs | turns/s | writes/s | turn p99 | lock wait p99 |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for q in doc["ratios"]:
        lines.append(
            f"| {q['n']} | {q['outputs']} | {fmt(q['turns_per_s'], 2)}x "
            f"| {fmt(q['writes_per_s'], 2)}x | {fmt(q['p99'], 2)}x "
            f"| {fmt(q['lock_wait_p99'], 2)}x |"
        )
    return "\n".join(lines) + "\n"


def _progress(r: dict[str, Any]) -> str:
    warn = f"\n    WARNING: {r['problems']}" if r.get("problems") else ""
    return (
        f"n={r['n']:<3} {r['outputs']:<5} {r['layout']:<7} {fmt(r.get('turns_per_s'), 0):>6} "
        f"turns/s {fmt(r.get('writes_per_s'), 0):>6} writes/s  p99 {fmt(r.get('p99_ms'), 0)} ms  "
        f"lock wait p99 {fmt(r.get('lock_wait_p99_ms'), 1)} ms  cpu {fmt(r.get('cpu_busy_pct'), 0)} %"
        f"  wall {r['wall_s']} s  load {r['load_at_start']}" + warn
    )


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N = 8 and 32, 3 s cells")
    ap.add_argument("--n", help="process counts, comma-separated (8,32,64)")
    ap.add_argument("--outputs", default=",".join(OUTPUTS), help="small,large")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="file,sharded")
    ap.add_argument("--seconds", type=float, help=f"seconds per cell ({SECONDS:g})")
    ap.add_argument("--think-ms", type=float, default=0.0, help="mean think time (0: closed loop)")
    ap.add_argument("--workers", type=int, default=2, help="outbox worker processes")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--json", type=Path, help="default benchmarks/results/sharded-<time>.json")
    ap.add_argument("--markdown", type=Path, help="write the tables here too")
    ap.add_argument("--workdir", type=Path, help="where the stores go")
    ap.add_argument("--keep", action="store_true", help="keep the stores")
    ap.add_argument("--report", type=Path, help="run nothing: print the tables of a --json file")
    args = ap.parse_args(argv)
    if args.report:
        print_report(args.report, markdown, args.markdown)
        return 0
    layouts, outputs = _csv(args.layouts), _csv(args.outputs)
    for name in layouts:
        if name not in LAYOUTS:
            ap.error(f"unknown layout {name!r}; known: {', '.join(LAYOUTS)}")
    for name in outputs:
        if name not in OUTPUTS:
            ap.error(f"unknown outputs {name!r}; known: {', '.join(OUTPUTS)}")
    ns = [int(x) for x in _csv(args.n)] if args.n else list(QUICK_NS if args.quick else NS)
    cfg: dict[str, Any] = {
        "seconds": args.seconds or (QUICK_SECONDS if args.quick else SECONDS),
        "think_ms": args.think_ms,
        "workers": args.workers,
        "seed": args.seed,
        "keep": args.keep,
    }
    if min(ns, default=0) < 1 or cfg["seconds"] <= 0 or cfg["think_ms"] < 0 or cfg["workers"] < 0:
        ap.error("process counts and seconds must be positive, think time and workers >= 0")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = args.workdir or Path(tempfile.mkdtemp(prefix="fleetstore-bench-sharded-"))
    info = machine_info()
    info["command"] = " ".join([".venv/bin/python", "benchmarks/bench_sharded.py", *sys.argv[1:]])
    doc: dict[str, Any] = {"info": info, "settings": cfg, "rows": [], "ratios": []}
    print(f"# {info['machine']}\n# load {info['loadavg_at_start']}; files under {root}")
    t0 = time.monotonic()
    pair = 0
    try:
        for outs in outputs:
            for n in ns:
                # Alternate which layout runs first, so a machine getting busier or
                # quieter over the run does not favour one of them.
                order = layouts if pair % 2 == 0 else list(reversed(layouts))
                pair += 1
                for layout in order:
                    row = run_cell(layout, outs, n, cfg, root)
                    doc["rows"].append(row)
                    print(_progress(row), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    doc["ratios"] = ratios(doc["rows"])
    info["loadavg_at_end"] = loadavg()
    info["wall_s"] = round(time.monotonic() - t0, 1)
    md = markdown(doc)
    out = args.json or BENCH_DIR / "results" / f"sharded-{stamp}.json"
    save_results(doc, md, info["wall_s"], out, args.markdown)
    bad = [r for r in doc["rows"] if r.get("verdict") != "pass" or r.get("problems")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
