"""Outbox drain with one flaky kind (issue 25): how long 1,443 effects take when one kind
fails half its attempts, and what lanes and a per-kind retry policy change.

Issue 25 measured it: one flaky webhook retrying at the default 1 s backoff made 1,443
effects take 84 s to drain, because a retrying effect stays its thread's head (per-thread
FIFO) and its thread's later effects wait behind it.

The backlog, enqueued before the worker starts: ``--sessions`` (37) sessions of
``--rounds`` (13) rounds, each round three effects of the session, in order:
``turn.finish`` and ``title.generate`` (1 ms of work each) and ``webhook.notify``, whose
attempts fail with probability ``--fail`` (0.5): 37 x 13 x 3 = 1,443 effects.  Whether an
attempt fails is drawn from its effect's idempotency key and attempt number, so every
configuration meets the same failures.  One in-process ``Worker`` (``--concurrency``, 4 by
default as the CLI's) runs them with ``until_idle``; each configuration gets a fresh store.

Configurations (``--configs``):

  before        every effect of a session on the session's thread key; the worker's
                defaults: backoff 1 s doubling to 300 s, the effect's 5 attempts.
  policy        the same threads; the webhook kind's own policy:
                ``Handler(fn, backoff=0.2, max_backoff=5)``.
  lanes         the webhook on a lane of its own per session (thread key
                ``SESSION/webhook``); the worker's defaults.
  lanes+policy  both.
  cap           the same threads; ``Handler(fn, max_attempts=2)``: the flaky kind gives up
                sooner (and more of its effects end dead).

Per configuration: ``drain_s`` (worker start to the last effect final), ``others_s`` and
``others_p50_s`` (when the last, and the median, of the non-webhook effects was final:
what the session's own work waited), ``webhooks_s``, attempts and dead effects.  Every
effect must end final, and configurations with the same webhook policy must have made the
same attempts (checked; the run fails otherwise).

    .venv/bin/python benchmarks/bench_outbox_failures.py           # the full run, ~2 minutes
    .venv/bin/python benchmarks/bench_outbox_failures.py --quick   # ~10 s: 60 effects, 0.05 s backoff
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import fleetstore
from fleetstore import Effect, Handler, Worker

CONFIGS = ("before", "policy", "lanes", "lanes+policy", "cap")
KINDS = ("turn.finish", "title.generate", "webhook.notify")


class _Formatted(logging.Handler):
    """The worker's log formatted (a failure's traceback included) and dropped: its cost
    is in the figures, its ~700 tracebacks are not on the screen."""

    def emit(self, record: logging.LogRecord) -> None:
        self.format(record)


def failing(effect: Effect, fail: float) -> bool:
    """Whether this attempt of *effect* fails: drawn from its key and attempt, so every
    configuration meets the same failures."""
    return random.Random(f"{effect.idempotency_key}#{effect.attempt}").random() < fail


def run(config: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    path = workdir / f"{config.replace('+', '-')}.db"
    lanes = config.startswith("lanes")
    scale = args.backoff  # the worker's backoff; the policies scale with it
    with fleetstore.open(path) as store:
        for s in range(args.sessions):
            for r in range(args.rounds):
                for kind in KINDS:
                    thread = f"s{s}/webhook" if lanes and kind == "webhook.notify" else f"s{s}"
                    store.effects.enqueue(
                        thread, kind, {"s": s, "r": r}, idempotency_key=f"s{s}/r{r}/{kind}"
                    )

        def work(effect: Effect) -> None:
            time.sleep(0.001)

        def webhook(effect: Effect) -> None:
            time.sleep(0.001)
            if failing(effect, args.fail):
                raise ConnectionError("webhook: 503 Service Unavailable")

        policy: dict[str, Any] = {}
        if config.endswith("policy"):
            policy = {"backoff": 0.2 * scale, "max_backoff": 5.0 * scale}
        elif config == "cap":
            policy = {"max_attempts": 2}
        worker = Worker(
            store,
            {
                "turn.finish": work,
                "title.generate": work,
                "webhook.notify": Handler(webhook, **policy),
            },
            concurrency=args.concurrency,
            backoff=scale,
            max_backoff=300.0 * scale,
            until_idle=True,
        )
        start = time.time()
        code = worker.run()
        effects = list(store.effects.list(limit=100_000))
    done = {k: sorted(e.finished_at - start for e in effects if e.kind == k) for k in KINDS}
    others = sorted(done["turn.finish"] + done["title.generate"])
    not_final = [e.id for e in effects if e.finished_at is None]
    return {
        "config": config,
        "effects": len(effects),
        "exit": code,
        "not_final": len(not_final),
        "drain_s": max(e.finished_at for e in effects) - start if not not_final else None,
        "others_s": others[-1],
        "others_p50_s": statistics.median(others),
        "webhooks_s": done["webhook.notify"][-1],
        "attempts": sum(e.attempt for e in effects if e.kind == "webhook.notify"),
        "dead": sum(e.state == "dead" for e in effects),
        "attempts_by_key": {e.idempotency_key: e.attempt for e in effects},
        "stats": dict(worker.stats),
    }


def check(results: list[dict[str, Any]], total: int) -> list[str]:
    problems = []
    for r in results:
        if r["effects"] != total or r["not_final"]:
            problems.append(f"{r['config']}: {r['not_final']} of {r['effects']} not final")
    same = [r for r in results if r["config"] in ("before", "lanes")]
    if len(same) == 2 and same[0]["attempts_by_key"] != same[1]["attempts_by_key"]:
        problems.append("before and lanes met different failures")
    return problems


def table(results: list[dict[str, Any]]) -> str:
    rows = [
        "| configuration | drain | the others' last | the others' p50 | webhooks' last "
        "| webhook attempts | dead |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        rows.append(
            f"| `{r['config']}` | {r['drain_s']:.1f} s | {r['others_s']:.1f} s "
            f"| {r['others_p50_s']:.1f} s | {r['webhooks_s']:.1f} s | {r['attempts']} "
            f"| {r['dead']} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="5 sessions x 4 rounds, backoff 0.05 s")
    ap.add_argument("--sessions", type=int, default=37)
    ap.add_argument("--rounds", type=int, default=13)
    ap.add_argument("--fail", type=float, default=0.5, help="a webhook attempt's failure rate")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--backoff", type=float, default=1.0, help="the worker's backoff (s)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument(
        "--json", type=Path, help="default benchmarks/results/outbox-failures-<time>.json"
    )
    ap.add_argument("--workdir", type=Path, help="where the stores go (default: a temporary dir)")
    args = ap.parse_args(argv)
    if args.quick:
        args.sessions, args.rounds, args.backoff = 5, 4, 0.05
    log = logging.getLogger("fleetstore")
    log.addHandler(_Formatted())
    log.propagate = False
    configs = [c for c in args.configs.split(",") if c]
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        ap.error(f"unknown configurations: {', '.join(sorted(unknown))}")
    total = args.sessions * args.rounds * len(KINDS)
    print(
        f"{total:,} effects ({args.sessions} sessions x {args.rounds} rounds x 3 kinds), "
        f"webhook attempts failing at {args.fail:g}, concurrency {args.concurrency}, "
        f"backoff {args.backoff:g} s",
        flush=True,
    )
    results = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for config in configs:
            r = run(config, args, Path(tmp))
            results.append(r)
            print(
                f"  {config:<13} drain {r['drain_s']:6.1f} s  others {r['others_s']:5.1f} s "
                f"(p50 {r['others_p50_s']:.1f})  webhooks {r['webhooks_s']:5.1f} s  "
                f"attempts {r['attempts']}  dead {r['dead']}",
                flush=True,
            )
    problems = check(results, total)
    print()
    print(table(results))
    out = args.json or Path(__file__).parent / "results" / (
        f"outbox-failures-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"args": vars(args) | {"json": str(out), "workdir": None}, "results": results}
    out.write_text(json.dumps(doc, indent=1, default=str))
    print(f"\n-> {out}")
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
