"""A process of the outbox tests (tests/domain/test_outbox_fleet.py).

``python tests/agents/outbox_agent.py worker PATH --events FILE --markers DIR [options]`` runs a
``fleetstore.domain.worker.Worker`` over ``fleetstore.open(PATH)`` with two handlers: ``fx``
(replay-safe) and ``unsafe`` (``Handler(..., replay_safe=False)``).  Both do what the
effect's payload asks:

* ``plan``: one outcome per attempt, ``ok`` (return), ``retry`` (``RetryEffect`` with no
  delay), ``error`` (an exception: the worker's backoff), ``deep`` (an exception raised
  300 frames down: a traceback longer than the 8 KiB kept) or ``fail`` (``FailEffect``);
  attempts past the plan are ``ok``;
* ``hold`` ``{"file": F, "attempts": [1]}``: on those attempts wait until F exists;
* ``sleep``: seconds of work.

Every handler run is logged to the shared events file, one ``os.write`` of one JSON line
on an ``O_APPEND`` descriptor each, so the file's order is the order the writes happened
in across processes: ``start`` (id, thread, seq, attempt, pid, ``t`` its wall-clock
time) before the work, ``end`` (with the outcome) after it.  A per-thread marker file, created with ``O_CREAT|O_EXCL``
at the start and removed before the end is logged, catches two handlers of one thread
running at once: a ``start`` that finds the marker taken carries ``overlap``.

stdout, one line each, flushed: ``ready PID``, ``started ID ATTEMPT`` (a handler began),
``stats {...}`` (whenever ``worker.stats`` changed), ``log LEVEL MESSAGE`` (the worker's
log), ``failure {...}`` (the worker's record of a failed attempt: its ``extra`` fields,
its level and whether it carried a traceback), and at the end ``report {...}`` (run()'s code, stats, spool length and whether any
connection of the store was left inside a transaction), then exits with run()'s code.
With ``--barrier FILE`` it starts only once it gets a shared flock of FILE (conftest's
``Barrier``), so a fleet starts together.  SIGUSR1 dumps every thread's stack to stderr.

``python tests/agents/outbox_agent.py stale PATH --id ID --lease L --go FILE`` claims the effect
ID as owner ``stale-PID`` (it must be the only ready one), prints ``claimed ID FENCE``,
waits for FILE, then tries a heartbeat and a ``succeed`` and prints each outcome as
``heartbeat {...}`` and ``succeed {...}``: a worker that was frozen past its lease.
"""

from __future__ import annotations

import argparse
import faulthandler
import fcntl
import hashlib
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import apsw

import fleetstore
from fleetstore import errors
from fleetstore.domain.worker import FailEffect, Handler, RetryEffect, Worker
from fleetstore.models import Effect

_out = threading.Lock()


def say(*words: object) -> None:
    with _out:
        print(*words, flush=True)


def marker_name(thread_key: str) -> str:
    return hashlib.sha256(thread_key.encode()).hexdigest()[:32]


class Events:
    """The shared events file and the per-thread running markers."""

    def __init__(self, events: str, markers: str) -> None:
        self.fd = os.open(events, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.markers = Path(markers)

    def log(self, **record: Any) -> None:
        record = {**record, "pid": os.getpid(), "t": time.time()}
        line = json.dumps(record, separators=(",", ":")) + "\n"
        os.write(self.fd, line.encode())

    def run(self, effect: Effect) -> Any:
        payload = effect.payload if isinstance(effect.payload, dict) else {}
        base = {
            "id": effect.id,
            "thread": effect.thread_key,
            "seq": effect.seq,
            "attempt": effect.attempt,
        }
        marker = self.markers / marker_name(effect.thread_key)
        mine = f"{os.getpid()} {effect.id} {effect.attempt}"
        overlap = None
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            try:
                overlap = marker.read_text() or "?"
            except FileNotFoundError:
                overlap = "?"  # removed in between: it was there a moment ago
        else:
            os.write(fd, mine.encode())
            os.close(fd)
        self.log(ev="start", overlap=overlap, **base)
        say("started", effect.id, effect.attempt)
        hold = payload.get("hold")
        if hold and effect.attempt in hold.get("attempts", [1]):
            while not os.path.exists(hold["file"]):
                time.sleep(0.01)
        if payload.get("sleep"):
            time.sleep(float(payload["sleep"]))
        plan = payload.get("plan", [])
        outcome = plan[effect.attempt - 1] if effect.attempt <= len(plan) else "ok"
        if overlap is None:
            marker.unlink()
        self.log(ev="end", outcome=outcome, **base)
        if outcome == "retry":
            raise RetryEffect("planned retry", delay=0.0)
        if outcome == "error":
            raise RuntimeError(f"planned error in attempt {effect.attempt}")
        if outcome == "deep":
            deep(300, effect.attempt)
        if outcome == "fail":
            raise FailEffect("planned failure")
        return {"pid": os.getpid(), "attempt": effect.attempt}


def deep(frames: int, attempt: int) -> None:
    """Raise *frames* calls down, alternating two functions (Python folds a run of one
    repeated frame into a line, which would keep the traceback short)."""
    if frames:
        deeper(frames - 1, attempt)
    raise RuntimeError(f"deep failure in attempt {attempt}")


def deeper(frames: int, attempt: int) -> None:
    deep(frames, attempt)


class SayHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        failure = getattr(record, "failure", None)
        if failure is not None:
            fields = {**failure, "level": record.levelname, "traceback": bool(record.exc_info)}
            say("failure", json.dumps(fields, sort_keys=True))
            return
        say("log", record.levelname, record.getMessage().replace("\n", " "))


def watch_stats(worker: Worker, done: threading.Event) -> None:
    last: dict[str, int] = {}
    while not done.wait(0.02):
        now = dict(worker.stats)
        if now != last:
            say("stats", json.dumps(now, sort_keys=True))
            last = now


def connections_in_transaction(store: fleetstore.Store) -> list[str]:
    """The roles of this process's connections left inside a transaction: inside one at
    each of five looks a quarter of a second apart (another thread of this process, the
    search indexer, may be inside a short one at any single look)."""
    db: Any = store.db  # the engine's own connections: a test looks inside
    left: set[tuple[str, int]] | None = None
    for look in range(5):
        if look:
            time.sleep(0.25)
        conns = [("writer", db._writer), ("checkpointer", db._checkpointer)]
        conns += [("reader", c) for c in [*db._idle_readers, *db._busy_readers]]
        now = {(role, id(c)) for role, c in conns if c is not None and _inside(c)}
        left = now if left is None else left & now
    return sorted(role for role, _ in left or ())


def _inside(conn: Any) -> bool:
    try:
        return bool(conn.in_transaction)
    except apsw.ThreadingViolationError:
        return False  # busy in another thread (the indexer's) at this look: in use, not left


def worker_main(args: argparse.Namespace) -> int:
    logging.getLogger("fleetstore").addHandler(SayHandler())
    logging.getLogger("fleetstore").setLevel(logging.INFO)
    store = fleetstore.open(args.path, write_budget=args.budget)
    events = Events(args.events, args.markers)
    worker = Worker(
        store,
        {"fx": events.run, "unsafe": Handler(events.run, replay_safe=False)},
        concurrency=args.concurrency,
        prefetch=args.prefetch,
        lease=args.lease,
        grace=args.grace,
        poll_interval=args.poll,
        backoff=args.backoff,
        max_backoff=1.0,
        max_attempts=args.max_attempts,
        until_idle=args.until_idle,
        handler_timeout=args.handler_timeout or None,
    )
    done = threading.Event()
    watcher = threading.Thread(target=watch_stats, args=(worker, done), daemon=True)
    watcher.start()
    say("ready", os.getpid())
    if args.barrier:  # the test holds it exclusively until every worker is ready
        fd = os.open(args.barrier, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.close(fd)
    code = worker.run()
    done.set()
    watcher.join()
    report = {
        "code": code,
        "stats": dict(worker.stats),
        "spool": len(store.spool),
        "in_transaction": connections_in_transaction(store),
    }
    say("report", json.dumps(report, sort_keys=True))
    store.close()
    return code


def stale_main(args: argparse.Namespace) -> int:
    store = fleetstore.open(args.path)
    (claim,) = store.effects.claim(f"stale-{os.getpid()}", lease=args.lease)
    assert claim.id == args.id, (claim.id, args.id)
    say("claimed", claim.id, claim.fence)
    while not os.path.exists(args.go):
        time.sleep(0.01)
    for name, call in (("heartbeat", claim.heartbeat), ("succeed", lambda: claim.succeed("stale"))):
        try:
            outcome: dict[str, Any] = {"returned": call()}
        except errors.LeaseLost as exc:
            outcome = {"error": "LeaseLost", "state": exc.state, "message": str(exc)}
        except errors.FleetstoreError as exc:
            outcome = {"error": type(exc).__name__, "message": str(exc)}
        say(name, json.dumps(outcome, sort_keys=True))
    say("report", json.dumps({"spool": len(store.spool)}))
    store.close()
    return 0


def main(argv: list[str]) -> int:
    faulthandler.register(signal.SIGUSR1)  # a hung agent shows its threads' stacks
    parser = argparse.ArgumentParser(prog="outbox_agent")
    sub = parser.add_subparsers(dest="mode", required=True)
    w = sub.add_parser("worker")
    w.add_argument("path")
    w.add_argument("--events", required=True)
    w.add_argument("--markers", required=True)
    w.add_argument("--budget", type=float, default=60.0)
    w.add_argument("--lease", type=float, default=10.0)
    w.add_argument("--grace", type=float, default=60.0)
    w.add_argument("--concurrency", type=int, default=2)
    w.add_argument("--prefetch", type=int, default=0)
    w.add_argument("--poll", type=float, default=0.05)
    w.add_argument("--backoff", type=float, default=0.01)
    w.add_argument("--max-attempts", type=int, default=None, help="the worker's cap")
    w.add_argument("--until-idle", action="store_true")
    w.add_argument("--handler-timeout", type=float, default=600.0, help="0: no limit")
    w.add_argument("--barrier", help="a file to take a shared flock of before starting")
    s = sub.add_parser("stale")
    s.add_argument("path")
    s.add_argument("--id", required=True)
    s.add_argument("--lease", type=float, required=True)
    s.add_argument("--go", required=True)
    args = parser.parse_args(argv)
    return worker_main(args) if args.mode == "worker" else stale_main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
