"""``fleetstore stress``: a fleet of agent processes living real sessions, then a verdict
read back from disk.

Every target gets the same workload (same seed, one target after another, each in a
directory of its own): ``--agents`` OS processes start, open the target, say
``ready`` and wait for a common start time, so the slow start of many interpreters
is not counted.  Until the end each agent lives turns (fleetstore_stress.agent):
think, a user message, a streamed reply with a tool call (heavy-tailed output
sizes, up to ``--large-bytes``), usage, a state checkpoint and an outbox effect that
``--workers`` processes settle.  Faults on demand: outside write locks
(``--external-lock HOLD@AT``), SIGKILL of agents and workers with restarts
(``--kill-rate``; ``procs.RestartPolicy``), ``fleetstore maintain`` during the load
(``--maintain``).

Afterwards a separate process reads every target back from disk against the agents'
journals: every acknowledged turn present exactly once, in order, its tool output
intact, its state checkpoint and effect there; no effect ``running`` past its lease;
``integrity_check`` of every file (a sharded store: the catalog and each shard) and,
on a sharded store, the catalog's index equal to the shards.  Every process, killed
ones too, also reports its CPU time and fleetstore's write figures (spooled, replayed,
recovered; lock wait and hold histograms), summed per target.
The verdict (and exit code) is fleetstore's; the other targets are shown beside it.
"""

from __future__ import annotations

import json
import math
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from fleetstore import Settings
from fleetstore.core.files import private_dirs
from fleetstore.core.metrics import Histogram
from fleetstore.core.targets import redact
from fleetstore_stress.agent import (
    COUNTERS,
    WORKER_LEASE,
    figures_dir,
    read_figures,
    read_journal,
)
from fleetstore_stress.config import (
    PEER_NOTES,
    ExternalLock,
    StressConfig,
    StressError,
    default_dir,
    peers_available,
    peers_to_run,
    version_of,
)
from fleetstore_stress.growth import read_stats
from fleetstore_stress.procs import (
    MODULE,
    Fleet,
    LockRun,
    Progress,
    child_env,
    sigterm_interrupts,
    stop_processes,
    tail,
)
from fleetstore_stress.table import format_report

_POLL = 0.05
_BUCKET = 0.25  # seconds per point of the lock-wait-over-time series


def _target_url(config: StressConfig, target: str, tdir: Path) -> str:
    if target != "fleetstore":
        return str(tdir / f"{target}.db")
    if config.url is None:
        return str(tdir / "fleetstore.db")
    if "://" in config.url:
        return config.url
    return str(Path(config.url).expanduser().resolve())


def _run_child(args: list[str], env: dict[str, str], what: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", MODULE, *args], capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise StressError(f"{what} failed (exit {done.returncode}): {tail}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(config: StressConfig, progress_stream: TextIO | None = None) -> dict[str, Any]:
    """Run the stress test on fleetstore (and with ``compare`` on the peers, one after
    another); return the report (JSON-serialisable).

    Raises ``ValueError`` for unusable options, ``StressError`` (or a
    ``FleetstoreError``) when the run cannot be carried out, and
    ``KeyboardInterrupt`` if interrupted (SIGINT or SIGTERM); every child
    process is killed before it propagates.
    """
    config.validate()
    progress = Progress(progress_stream)
    explicit: dict[str, Any] = {}
    if config.write_budget is not None:
        explicit["write_budget"] = config.write_budget
    if config.synchronous is not None:
        explicit["synchronous"] = config.synchronous
    effective = Settings.load(**explicit)  # what the agents will get, env included
    seed = config.seed if config.seed is not None else random.SystemRandom().randrange(2**31)
    run_dir = Path(config.directory).expanduser().resolve() if config.directory else default_dir()
    private_dirs(run_dir)
    targets = ["fleetstore", *peers_to_run(config)]
    progress.note(f"fleetstore stress: results under {run_dir}")
    results = []
    not_run: list[dict[str, str]] = []
    with sigterm_interrupts():
        try:
            for target in targets:
                try:
                    results.append(_run_target(config, target, run_dir, seed, explicit, progress))
                except StressError as exc:
                    if target == "fleetstore":
                        raise
                    # A peer that cannot be run is reported; fleetstore's verdict stands.
                    not_run.append({"target": target, "reason": str(exc)})
                    progress.note(f"fleetstore stress: {target} not run: {exc}")
        finally:
            progress.done()
    main = results[0]
    return {
        "verdict": main["verdict"],
        "problems": main["problems"],
        "dir": str(run_dir),
        "url": main["url"],
        "agents": config.agents,
        "duration": config.duration,
        "think_ms": config.think_ms,
        "output_bytes": config.output_bytes,
        "large_rate": config.large_rate,
        "large_bytes": config.large_bytes,
        "synchronous": effective.synchronous,
        "write_budget": effective.write_budget,
        "seed": seed,
        "workers": config.workers,
        "kill_rate": config.kill_rate,
        "maintain": config.maintain,
        "drop_every": config.drop_every,
        "long_replies": config.long_replies,
        "hang_worker": config.hang_worker,
        "drain_wait": config.drain_wait,
        "external_locks": [str(lock) for lock in config.external_locks],
        "targets": results,
        "not_run": not_run,
    }


def _run_target(
    config: StressConfig,
    target: str,
    run_dir: Path,
    seed: int,
    explicit: dict[str, Any],
    progress: Progress,
) -> dict[str, Any]:
    tdir = run_dir / target
    private_dirs(tdir)
    for old in [
        *tdir.glob("agent-*.jsonl"),
        *figures_dir(tdir).glob("*.json"),
        tdir / "executions.log",
        tdir / "outbox-stats.jsonl",
    ]:
        old.unlink(missing_ok=True)  # journals and figures of an earlier run here
    url = _target_url(config, target, tdir)
    cfg: dict[str, Any] = {
        "target": target,
        "url": url,
        "run_id": f"{seed}-{time.time_ns()}",
        "seed": seed,
        "think_ms": config.think_ms,
        "output_bytes": config.output_bytes,
        "large_rate": config.large_rate,
        "large_bytes": config.large_bytes,
        "settings": explicit,
        "synchronous": config.synchronous,
        "drop_every": config.drop_every if target == "fleetstore" else 0,
        "long_replies": config.long_replies,
        "hang_worker": config.hang_worker,
    }
    env = child_env()
    progress.note(f"fleetstore stress: {target}: {redact(url)}")
    _run_child(["--verify", json.dumps({**cfg, "prepare": True})], env, f"{target}: set-up")
    rng = random.Random(f"{seed}/faults")
    with Fleet(config, cfg, tdir) as fleet:
        began = time.monotonic()
        fleet.spawn()
        # Interpreters importing big libraries at once start slowly on few cores.
        fleet.wait_ready(fleet.children, 60.0 + 3.0 * len(fleet.children), progress)
        startup = time.monotonic() - began
        fleet.go()
        _drive(fleet, rng, progress)
        hung = fleet.kill_stopped()  # --hang-worker's frozen worker: SIGKILL, not a crash
        # The effects a worker killed near the end held: one lease and one sweep for the
        # other workers to take them back before they are stopped and the outbox read.
        killed = [k["t"] for k in fleet.kills if k["role"] == "worker"]
        if killed:
            _sleep_until(fleet.start + max(killed) + WORKER_LEASE * 1.5 + 1.0)
        workers = [c.proc for c in fleet.children if c.role == "worker"]
        drained = None
        if target == "fleetstore" and workers and config.drain_wait > 0:
            progress.note(f"fleetstore stress: {target}: waiting for the outbox to drain")
            drain_cfg = {**cfg, "drain_wait": config.drain_wait}
            drained = _run_child(["--drain", json.dumps(drain_cfg)], env, f"{target}: drain")
        stop_processes(workers, grace=15.0)
        stop_processes([r.proc for r in fleet.locks if r.proc is not None], grace=5.0)
        for r in fleet.locks:
            if r.thread is not None:
                r.thread.join(5)
        fleet.finish_maintenance()
        crashed = [
            {
                "role": c.role,
                "index": c.index,
                "exit_code": c.proc.returncode,
                "error": tail(c.errfile),
            }
            for c in fleet.children
            if c.proc.returncode not in (0, -signal.SIGTERM) and c not in hung
        ]
        progress.note(f"fleetstore stress: {target}: reading back what was acknowledged")
        journals = [str(fleet.journal(i)) for i in range(config.agents)]
        # The run's start on the wall clock, which the stores' timestamps use.
        start_wall = time.time() - (time.monotonic() - fleet.start)
        check = {**cfg, "journals": journals, "start_wall": start_wall, "dir": str(tdir)}
        verified = _run_child(["--verify", json.dumps(check)], env, f"{target}: verify")
        # Its own process (apsw only): the library peers' verifiers load the stdlib sqlite3.
        sizes = _run_child(["--bytes", json.dumps(check)], env, f"{target}: bytes")
        summary = _summarize(config, fleet, startup, crashed, verified)
        summary["bytes"] = _bytes_per_turn(sizes, summary["acknowledged"])
        summary["hung"] = [{"role": c.role, "index": c.index} for c in hung]
        if summary.get("outbox"):
            summary["outbox"]["workers"] = read_stats(tdir)
            summary["outbox"]["drain"] = drained
        return summary


def _sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _bytes_per_turn(sizes: dict[str, Any], acknowledged: int) -> dict[str, Any]:
    if not sizes.get("files"):
        return sizes  # PostgreSQL: not measured here
    kept = sizes["after_checkpoint"]["total"]
    sizes["per_turn"] = round(kept / acknowledged) if acknowledged else None
    payload = sizes.get("payload_compressed", 0)
    sizes["vs_compressed_payload"] = round(kept / payload, 2) if payload else None
    return sizes


def _drive(fleet: Fleet, rng: random.Random, progress: Progress) -> None:
    config = fleet.config
    pending = sorted(config.external_locks, key=lambda lock: lock.at)
    longest_lock = max((lock.hold for lock in pending), default=0.0)
    budget = Settings.load(**fleet.cfg["settings"]).write_budget
    hard_stop = fleet.end + budget + longest_lock + 30.0
    next_kill = (
        fleet.start + rng.expovariate(config.kill_rate) if config.kill_rate > 0 else math.inf
    )
    maintain_at = (
        fleet.start + config.duration / 3
        if config.maintain and fleet.cfg["target"] == "fleetstore"
        else math.inf
    )
    target = fleet.cfg["target"]
    # An agent whose restart failed is not running until its next attempt: the run
    # goes on for it (a lone agent's failed restart ended the run at once).
    while fleet.agents_running() or fleet.restarting():
        now = time.monotonic()
        while pending and now >= fleet.start + pending[0].at:
            fleet.launch_lock(LockRun(pending.pop(0)))
        # Kills on a clock of their own (a Poisson process from the start), so
        # the rate holds however long the replacements take to start.
        while now >= next_kill and next_kill < fleet.end - 0.5:
            fleet.kill_one(rng)
            next_kill += rng.expovariate(config.kill_rate)
        fleet.poll_restarts(progress)
        fleet.sample_wal()
        if now >= maintain_at:
            fleet.launch_maintain()
            maintain_at = math.inf
        if now >= hard_stop:
            progress.note("fleetstore stress: agents still running long after the end; killing")
            stop_processes([c.proc for c in fleet.children], grace=1.0)
            return
        if progress.due():
            elapsed = max(0.0, now - fleet.start)
            turns = fleet.count_turns()
            if now < fleet.end:
                progress.show(
                    target,
                    elapsed,
                    config.duration,
                    f"{elapsed:5.1f}/{config.duration:g}s {turns:,} turns",
                )
            else:
                running = fleet.agents_running()
                progress.show(target, 1, 1, f"{running} agents finishing their turn")
        time.sleep(_POLL)


def _percentile(ordered: Sequence[float], q: float) -> float:
    if not ordered:
        return 0.0
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _summarize(
    config: StressConfig,
    fleet: Fleet,
    startup: float,
    crashed: list[dict[str, Any]],
    verified: dict[str, Any],
) -> dict[str, Any]:
    lats: list[float] = []
    by_type: Counter[str] = Counter()
    failure_samples: list[dict[str, Any]] = []
    per_agent = []
    series: dict[int, list[float]] = {}
    ends = []
    for i in range(config.agents):
        journal = read_journal(fleet.journal(i))
        ok = [e for e in journal if "sha" in e]
        failed = [e for e in journal if "fail" in e]
        by_type.update(e["fail"] for e in failed)
        failure_samples += [
            {"agent": i, "turn": e["n"], "type": e["fail"], "message": e["msg"], "waited": e["w"]}
            for e in failed[:3]
        ]
        lats += [float(e["lat"]) for e in ok]
        for e in journal:
            if "w" in e:
                series.setdefault(int(float(e["t"]) / _BUCKET), []).append(float(e["w"]))
                ends.append(float(e["t"]))
        per_agent.append({"agent": i, "acknowledged": len(ok), "failed": len(failed)})
    lats.sort()
    acknowledged = len(lats)
    elapsed = max(config.duration, max(ends, default=0.0))
    counts = [a["acknowledged"] for a in per_agent]
    low, high = min(counts), max(counts)
    lost = int(verified["lost"])
    problems = []
    failed_n = sum(by_type.values())
    if failed_n:
        problems.append(f"{failed_n} turns failed")
    if lost:
        problems.append(f"{lost} acknowledged writes are missing")
    for key, what in (
        ("duplicated", "acknowledged writes are stored more than once"),
        ("out_of_order", "acknowledged writes are out of order"),
        ("corrupt", "tool outputs or messages do not read back intact"),
    ):
        if verified.get(key):
            problems.append(f"{verified[key]} {what}")
    stuck = (verified.get("outbox") or {}).get("stuck", verified.get("stuck_effects", 0))
    if stuck:
        problems.append(f"{stuck} effects are stuck running past their lease")
    if crashed:
        problems.append(f"{len(crashed)} processes crashed")
    integrity = verified.get("integrity", "ok")
    if integrity != "ok":
        problems.append(f"integrity_check: {integrity}")
    if verified.get("index_problems"):
        problems.append(
            f"{verified['index_problems']} disagreements between the sharded store's "
            "catalog and its shards"
        )
    points = []
    for b in sorted(series):
        waits = sorted(series[b])
        points.append([round(b * _BUCKET, 3), _ms(_percentile(waits, 0.5)), _ms(waits[-1])])
    quantiles = [
        _ms(_percentile(lats, q / 200)) for q in range(1, 201)
    ]  # 0.5 % steps, for the distribution chart
    target = fleet.cfg["target"]
    return {
        "target": target,
        "note": PEER_NOTES.get(target, target),
        "url": fleet.cfg["url"],
        "verdict": "fail" if problems else "pass",
        "problems": problems,
        "startup_s": round(startup, 3),
        "elapsed_s": round(elapsed, 3),
        "acknowledged": acknowledged,
        "failed": failed_n,
        "failures_by_type": dict(by_type),
        "lost": lost,
        "duplicated": verified.get("duplicated", 0),
        "out_of_order": verified.get("out_of_order", 0),
        "corrupt": verified.get("corrupt", 0),
        "stuck_effects": verified.get("stuck_effects", 0),
        "effects": verified.get("effects", {}),
        "outbox": verified.get("outbox"),
        "wal_peak": fleet.wal_peak,
        "integrity": integrity,
        "layout": verified.get("layout"),
        "files_checked": verified.get("files", 0),
        "index_problems": verified.get("index_problems", 0),
        "turns_per_s": round(acknowledged / elapsed, 1) if elapsed > 0 else 0.0,
        "engine": _engine_figures(fleet, elapsed),
        "latency_ms": {
            "p50": _ms(_percentile(lats, 0.50)),
            "p99": _ms(_percentile(lats, 0.99)),
            "max": _ms(lats[-1] if lats else 0.0),
        },
        "latency_quantiles_ms": quantiles,
        "lock_wait_series": points,
        "fairness": {"min": low, "max": high, "ratio": round(low / high, 3) if high else 0.0},
        "per_agent": per_agent,
        "crashed": crashed,
        "kills": fleet.kills,
        "restarts": fleet.restarts.report(),
        "kill_rate_achieved": round(len(fleet.kills) / config.duration, 3),
        "version": version_of(target),
        "maintenance": fleet.maintenance,
        "external_locks": [r.as_dict() for r in fleet.locks],
        "samples": {**verified.get("samples", {}), "failures": failure_samples[:10]},
    }


def _engine_figures(fleet: Fleet, elapsed: float) -> dict[str, Any]:
    """What every process of the run reported (``agent.Figures``), killed ones
    included (their figures up to half a second before the kill): their CPU time over
    the run and, for fleetstore, the write transactions they committed, the writes
    that spooled, were replayed from a spool or recovered from a dead process's
    journal, and the lock wait and hold of the agents' writes (histograms summed
    across processes, so the percentiles are the fleet's)."""
    return sum_figures(read_figures(fleet.workdir), elapsed)


def sum_figures(rows: list[dict[str, Any]], elapsed: float) -> dict[str, Any]:
    """The run's figures from each process's (``agent.read_figures``)."""
    out: dict[str, Any] = {
        "processes": len(rows),
        "finished": sum(1 for r in rows if r.get("finished")),
    }
    for role in ("agent", "worker"):
        out[f"{role}_cpu_s"] = round(sum(float(r["cpu_s"]) for r in rows if r["role"] == role), 3)
    engine = [r for r in rows if "histograms" in r]
    if not engine:
        return out
    agents = [r for r in engine if r["role"] == "agent"]
    writes = sum(int(r["writes"]) for r in agents)
    out["agent_writes"] = writes
    out["worker_writes"] = sum(int(r["writes"]) for r in engine if r["role"] == "worker")
    out["writes_per_s"] = round(writes / elapsed, 1) if elapsed > 0 else 0.0
    for key in COUNTERS:
        if key != "writes":  # (above, by role)
            out[key] = sum(int(r.get(key, 0)) for r in engine)
    for name in ("lock_wait", "lock_hold"):
        hist = Histogram()
        for r in agents:
            before = r["histograms_before"].get(name, {})
            hist.merge_export(_run_part(r["histograms"][name], before))
        out[f"{name}_ms"] = {
            "p50": _ms(hist.quantile(0.50)),
            "p99": _ms(hist.quantile(0.99)),
        }
    return out


def _run_part(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The samples a histogram (``Histogram.export()``) gained between two exports."""
    old = {k: int(v) for k, v in dict(before.get("buckets", {})).items()}
    gained = {k: int(v) - old.get(k, 0) for k, v in dict(after.get("buckets", {})).items()}
    return {
        "buckets": {k: v for k, v in gained.items() if v > 0},
        "n": int(after.get("n", 0)) - int(before.get("n", 0)),
        "sum": float(after.get("sum", 0.0)) - float(before.get("sum", 0.0)),
        "max": float(after.get("max", 0.0)),  # only bounds the quantiles from above
    }


__all__ = [
    "ExternalLock",
    "StressConfig",
    "StressError",
    "default_dir",
    "format_report",
    "peers_available",
    "run",
]
