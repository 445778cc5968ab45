"""The outbox with real processes (issue 4, "Tests"): workers are tests/agents/outbox_agent.py
processes, the outside lock holder is ``fleetstore lock``, crashes are ``kill -9``.

Handlers log a ``start`` and an ``end`` line per run to one ``O_APPEND`` file shared by
every process (so its order is the order things happened in) and hold a per-thread
``O_CREAT|O_EXCL`` marker while they run.  ``check_threads`` and ``check_outcomes`` read
that log against the store: per thread, starts in seq order (a retry repeats its seq
before the next one starts), never two at once, every effect started; per effect, the
attempts the store counts are the runs logged, the final state is what the handler's
outcomes make it, and a succeeded effect completed successfully exactly once.
``test_checker_catches_doctored_logs`` proves the checker can fail.

Nothing waits for a duration: every step waits for evidence (a line, a row, a file), and
the timeouts are only safety nets.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore.engine.proclocks import lock_holders
from fleetstore.models import FINAL_EFFECT_STATES
from tests.agents import script
from tests.fix_procs import Barrier, Proc, Spawn, start_lock

AGENT = script("outbox_agent.py")
WAIT = 60.0  # safety net for every wait on evidence


# -- the log checker ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Final:
    """What the store holds for an effect at the end of a run."""

    id: str
    thread: str
    seq: int
    state: str
    attempt: int
    dead_reason: str | None = None
    result: Any = None


def finals(store: fleetstore.Store) -> dict[str, Final]:
    return {
        e.id: Final(
            e.id, e.thread_key, e.seq or 0, str(e.state), e.attempt, e.dead_reason, e.result
        )
        for e in store.effects.list(limit=100_000)
    }


def check_threads(
    events: list[dict[str, Any]], stored: dict[str, Final], killed: frozenset[int] = frozenset()
) -> list[str]:
    """Per thread: starts in (seq, attempt) order with no attempt skipped, each run ended
    before the next one started (a run of a *killed* process may end without an ``end``),
    no marker overlap, and every effect of the thread started, in seq order."""
    problems: list[str] = []
    by_thread: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ev in events:
        by_thread[ev["thread"]].append(ev)
    for thread, evs in sorted(by_thread.items()):
        running: dict[str, Any] | None = None
        last = (0, 0)
        started: list[int] = []
        for ev in evs:
            key = (ev["seq"], ev["attempt"])
            if ev["ev"] == "start":
                if running is not None and running["pid"] not in killed:
                    problems.append(f"thread {thread}: {key} started while {running} ran")
                if ev.get("overlap"):
                    problems.append(f"thread {thread}: {key} found the marker {ev['overlap']!r}")
                if key[0] == last[0]:
                    if key[1] != last[1] + 1:
                        problems.append(f"thread {thread}: attempt {key} after {last}")
                elif key[0] < last[0]:
                    problems.append(f"thread {thread}: seq {key} started after {last}")
                elif key[1] != 1:
                    problems.append(f"thread {thread}: {key} is its seq's first start")
                if not started or started[-1] != key[0]:
                    started.append(key[0])
                running, last = ev, key
            else:
                if running is None or (running["id"], running["attempt"]) != (
                    ev["id"],
                    ev["attempt"],
                ):
                    problems.append(f"thread {thread}: end of {key} without its start")
                running = None
        seqs = sorted(f.seq for f in stored.values() if f.thread == thread)
        if started != seqs:
            problems.append(f"thread {thread}: seqs started {started}, stored {seqs}")
    for f in stored.values():
        if f.thread not in by_thread:
            problems.append(f"thread {f.thread}: never started")
    return problems


def expected(plan: list[str], max_attempts: int) -> tuple[str, str | None, int]:
    """(state, dead_reason, attempts) that running *plan* must end in."""
    for attempt in range(1, max_attempts + 1):
        outcome = plan[attempt - 1] if attempt <= len(plan) else "ok"
        if outcome == "ok":
            return "succeeded", None, attempt
        if outcome == "fail":
            return "dead", "failed", attempt
    return "dead", "attempts_exhausted", max_attempts


def check_outcomes(
    events: list[dict[str, Any]], stored: dict[str, Final], plans: dict[str, tuple[list[str], int]]
) -> list[str]:
    """Per effect: the store's final state, reason and attempt count are what its plan
    makes them, every run logged its planned outcome, and a succeeded effect completed
    successfully exactly once, with the result of that run."""
    problems: list[str] = []
    starts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    ends: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ev in events:
        (starts if ev["ev"] == "start" else ends)[ev["id"]].append(ev)
    for eid, (plan, max_attempts) in sorted(plans.items()):
        f = stored.get(eid)
        if f is None:
            problems.append(f"{eid}: not in the store")
            continue
        state, reason, attempts = expected(plan, max_attempts)
        if (f.state, f.dead_reason, f.attempt) != (state, reason, attempts):
            problems.append(
                f"{eid}: stored {f.state}/{f.dead_reason} after {f.attempt} attempt(s), "
                f"planned {state}/{reason} after {attempts}"
            )
        if [e["attempt"] for e in starts[eid]] != list(range(1, f.attempt + 1)):
            problems.append(f"{eid}: {f.attempt} attempt(s) stored, runs {starts[eid]}")
        logged = [(e["attempt"], e["outcome"]) for e in ends[eid]]
        planned = [(a, plan[a - 1] if a <= len(plan) else "ok") for a in range(1, attempts + 1)]
        if logged != planned:
            problems.append(f"{eid}: runs ended {logged}, planned {planned}")
        oks = [e for e in ends[eid] if e["outcome"] == "ok"]
        if f.state == "succeeded":
            if len(oks) != 1:
                problems.append(f"{eid}: succeeded with {len(oks)} successful runs")
            elif f.result != {"pid": oks[0]["pid"], "attempt": oks[0]["attempt"]}:
                problems.append(f"{eid}: result {f.result} is not its successful run's {oks[0]}")
        elif oks:
            problems.append(f"{eid}: {f.state} but a run succeeded: {oks}")
    return problems


def test_checker_catches_doctored_logs() -> None:
    """A checker that cannot fail is a defect: a clean synthetic run passes, and every
    kind of violation planted in it is reported."""
    plans = {"a1": (["error", "ok"], 3), "a2": (["fail"], 3), "b1": (["retry"] * 3, 3)}
    where = {"a1": ("A", 1), "a2": ("A", 2), "b1": ("B", 1)}
    events: list[dict[str, Any]] = []
    stored: dict[str, Final] = {}
    for eid, (plan, max_attempts) in plans.items():
        thread, seq = where[eid]
        state, reason, attempts = expected(plan, max_attempts)
        for attempt in range(1, attempts + 1):
            base = {"id": eid, "thread": thread, "seq": seq, "attempt": attempt, "pid": 7}
            outcome = plan[attempt - 1] if attempt <= len(plan) else "ok"
            events += [
                {"ev": "start", "overlap": None, **base},
                {"ev": "end", **base, "outcome": outcome},
            ]
        result = {"pid": 7, "attempt": attempts} if state == "succeeded" else None
        stored[eid] = Final(eid, thread, seq, state, attempts, reason, result)
    assert check_threads(events, stored) == []
    assert check_outcomes(events, stored, plans) == []

    def problems(evs: list[dict[str, Any]], st: dict[str, Final] = stored) -> list[str]:
        return check_threads(evs, st) + check_outcomes(evs, st, plans)

    # a1's two runs are events 0-3, a2's run 4-5, b1's runs 6-11.
    assert any("started after" in p for p in problems(events[4:6] + events[:4] + events[6:]))
    assert any(
        "started while" in p for p in problems([*events[:3], events[4], events[3], *events[5:]])
    )
    overlapped = [dict(e, overlap="99 x 1") if i == 4 else e for i, e in enumerate(events)]
    assert any("marker" in p for p in problems(overlapped))
    assert any("attempt" in p for p in problems(events[2:]))  # a1's first run missing
    twice = events[:4] + [dict(e, attempt=3) for e in events[2:4]] + events[4:]
    assert any("2 successful runs" in p for p in problems(twice))
    assert any("without its start" in p for p in problems(events[1:]))
    assert any(
        "planned" in p
        for p in problems(events, {**stored, "a2": replace(stored["a2"], state="succeeded")})
    )
    wrong_result = {**stored, "a1": replace(stored["a1"], result={"pid": 8, "attempt": 2})}
    assert any("result" in p for p in problems(events, wrong_result))
    assert any("seqs started" in p for p in problems(events[:4] + events[6:]))  # a2 never ran
    assert any("never started" in p for p in check_threads(events[:6], stored))
    # A run of a killed process may end without an `end`; of a live one it may not.
    cut = events[:1] + events[2:]
    assert check_threads(cut, stored, killed=frozenset({7})) == []
    assert any("started while" in p for p in check_threads(cut, stored))


# -- processes ----------------------------------------------------------------------------------


@dataclass
class Env:
    """A store, the shared events file and markers, and the worker processes of one test."""

    tmp: Path
    path: str
    events: Path
    markers: Path
    procs: list[Proc]

    def worker(self, *options: str, name: str = "worker") -> Proc:
        argv = [sys.executable, AGENT, "worker", self.path, "--events", str(self.events)]
        proc = Proc([*argv, "--markers", str(self.markers), *options], name)
        self.procs.append(proc)
        proc.wait_line("ready", timeout=WAIT)
        return proc

    def stale(self, effect_id: str, lease: float, go: Path) -> Proc:
        argv = [sys.executable, AGENT, "stale", self.path, "--id", effect_id]
        proc = Proc([*argv, "--lease", str(lease), "--go", str(go)], "stale")
        self.procs.append(proc)
        return proc

    def hold(self, name: str, attempts: tuple[int, ...] = (1,)) -> tuple[Path, dict[str, Any]]:
        """A file to create later, and the payload whose handler waits for it."""
        path = self.tmp / f"hold-{name}"
        return path, {"hold": {"file": str(path), "attempts": list(attempts)}}

    def read_events(self) -> list[dict[str, Any]]:
        if not self.events.exists():
            return []
        return [json.loads(line) for line in self.events.read_text().splitlines()]

    def clear_markers(self, pid: int) -> None:
        """Remove the running markers a killed process left (its handlers died with it)."""
        for marker in self.markers.iterdir():
            if marker.read_text().split()[0] == str(pid):
                marker.unlink()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    markers = tmp_path / "markers"
    markers.mkdir()
    path = str(tmp_path / "outbox.db")
    fleetstore.open(path).close()
    e = Env(tmp_path, path, tmp_path / "events.jsonl", markers, [])
    try:
        yield e
    finally:
        for proc in e.procs:
            proc.kill()


def wait_for(what: str, check: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.02)


def states(store: fleetstore.Store, *ids: str) -> list[str]:
    return [str(store.effects.get(i).state) for i in ids]


def all_final(store: fleetstore.Store) -> bool:
    return all(e.state in FINAL_EFFECT_STATES for e in store.effects.list(limit=100_000))


def wait_stats(proc: Proc, key: str, at_least: int = 1) -> dict[str, int]:
    """The first ``stats`` line of *proc* with ``key >= at_least``."""
    while True:
        _, line = proc.wait_line("stats ", timeout=WAIT)
        stats: dict[str, int] = json.loads(line.split(" ", 1)[1])
        if stats.get(key, 0) >= at_least:
            return stats


def stop(proc: Proc, expect: int = 0) -> dict[str, Any]:
    """SIGTERM *proc*, wait for its exit (code *expect*) and return its final report."""
    os.kill(proc.pid, signal.SIGTERM)
    rc = proc.finish(timeout=WAIT)
    assert rc == expect, (rc, proc.seen, proc.stderr_tail())
    return report(proc)


def report(proc: Proc) -> dict[str, Any]:
    lines = [line for _, line in proc.seen if line.startswith("report ")]
    assert lines, proc.seen
    result: dict[str, Any] = json.loads(lines[-1].split(" ", 1)[1])
    return result


def release(lock: Proc) -> None:
    os.kill(lock.pid, signal.SIGTERM)
    lock.wait_line("released", timeout=WAIT)
    assert lock.finish(timeout=WAIT) == 0


def kill9(proc: Proc) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.popen.wait(timeout=WAIT) == -signal.SIGKILL


def runs(events: list[dict[str, Any]], eid: str) -> list[tuple[str, int, int, str | None]]:
    """(ev, pid, attempt, outcome) of every logged event of effect *eid*, in order."""
    return [(e["ev"], e["pid"], e["attempt"], e.get("outcome")) for e in events if e["id"] == eid]


def spool_files(path: str) -> list[str]:
    folder = Path(path + ".spool")
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


# -- an outside lock meets a settlement ---------------------------------------------------------


def test_settlement_past_the_budget_lands_after_an_outside_lock_and_the_thread_goes_on(
    env: Env, spawn: Spawn
) -> None:
    """The handler finishes while ``fleetstore lock`` holds BEGIN IMMEDIATE past the
    write budget: the settlement goes to the worker's spool, lands once the lock is
    released, and the same worker process runs the thread's next effect; no connection
    of the worker is left inside a transaction and an outside write succeeds at once."""
    go, payload = env.hold("e1")
    with fleetstore.open(env.path) as store:
        e1 = store.effects.enqueue("T", "fx", payload)
        e2 = store.effects.enqueue("T", "fx", {})
    worker = env.worker("--budget", "0.3", "--lease", "20", "--concurrency", "1")
    worker.wait_line(f"started {e1} 1", timeout=WAIT)
    lock, _ = start_lock(spawn, env.path, 120)
    go.touch()
    stats = wait_stats(worker, "spooled")
    assert stats.get("lost", 0) == 0
    store = fleetstore.open(env.path)
    try:
        # Locked: the outcome waits in the worker's journal, the thread waits for it.
        assert [f for f in spool_files(env.path) if f.startswith(f"{worker.pid}-")]
        assert states(store, e1, e2) == ["running", "pending"]
        assert [e["id"] for e in env.read_events()] == [e1, e1]
        release(lock)
        wait_for("e1 and e2 succeeded", lambda: states(store, e1, e2) == ["succeeded"] * 2)
        assert worker.popen.poll() is None  # nothing was restarted
        result = store.effects.get(e1).result
        assert result == {"pid": worker.pid, "attempt": 1}
        # Nothing of the worker's is stuck in a transaction: an outside write that may
        # not spool gets the lock, and the worker runs what it wrote.
        with fleetstore.open(env.path, write_budget=10, on_busy="raise") as outside:
            e3 = outside.effects.enqueue("T", "fx", {})
        wait_for("e3 succeeded", lambda: states(store, e3) == ["succeeded"])
        final = finals(store)
    finally:
        store.close()
    rep = stop(worker)
    assert rep["in_transaction"] == [] and rep["spool"] == 0, rep
    assert rep["stats"].get("spooled") == 1 and rep["stats"].get("lost", 0) == 0, rep
    assert spool_files(env.path) == []  # drained, nothing rejected
    events = env.read_events()
    assert check_threads(events, final) == []
    assert [(e["ev"], e["id"], e["pid"]) for e in events] == [
        (ev, eid, worker.pid) for eid in (e1, e2, e3) for ev in ("start", "end")
    ]


@pytest.mark.slow
def test_settlement_spooled_past_its_lease_is_not_lost_to_a_sweep(env: Env, spawn: Spawn) -> None:
    """The outside lock outlasts the lease while the (not replay-safe) effect's success
    waits in the spool; heartbeats cannot be written either.  Another process's sweep
    is first in line for the lock.  The module's promise: a lock held from outside
    delays a settlement but never loses it: the effect must end ``succeeded``, not
    ``dead``/``not_replay_safe`` with its success rejected."""
    go, payload = env.hold("e1")
    with fleetstore.open(env.path) as store:
        e1 = store.effects.enqueue("T", "unsafe", payload)
        e2 = store.effects.enqueue("T", "fx", {})
    worker = env.worker("--budget", "0.3", "--lease", "1.5", "--concurrency", "1")
    worker.wait_line(f"started {e1} 1", timeout=WAIT)
    lock, _ = start_lock(spawn, env.path, 120)
    go.touch()
    wait_stats(worker, "spooled")
    store = fleetstore.open(env.path, write_budget=WAIT)
    try:
        wait_for("e1's lease expired", lambda: store.effects.counts()["expired"] == 1)
        swept: list[Any] = []
        sweeper = threading.Thread(target=lambda: swept.append(store.effects.sweep()))
        sweeper.start()
        me = os.getpid()
        wait_for(
            "the sweeper holds the writer gate",
            lambda: any(h.pid == me and h.lock == "gate" for h in lock_holders(env.path)),
        )
        release(lock)
        sweeper.join(WAIT)
        wait_for("e2 succeeded", lambda: states(store, e2) == ["succeeded"])
        wait_for(
            "the worker's spool drained",
            lambda: not any(f.startswith(f"{worker.pid}-") for f in spool_files(env.path)),
        )
        effect = store.effects.get(e1)
    finally:
        store.close()
    stop(worker)
    assert (effect.state, effect.dead_reason, effect.result) == (
        "succeeded",
        None,
        {"pid": worker.pid, "attempt": 1},
    ), (effect, swept, spool_files(env.path))


# -- wake-ups and batches, on every layout ------------------------------------------------------


PG_AGENT = script("pg_outbox_agent.py")


@pytest.fixture(params=["sqlite", "sharded", "postgresql"])
def any_env(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Env]:
    """``env`` on one SQLite file, a sharded store, or a PostgreSQL database (its workers
    run through tests/agents/pg_outbox_agent.py)."""
    markers = tmp_path / "markers"
    markers.mkdir()
    if request.param == "postgresql":
        path = request.getfixturevalue("pg_url")
        monkeypatch.setattr(sys.modules[__name__], "AGENT", PG_AGENT)
    elif request.param == "sharded":
        path = f"sqlite+sharded://{tmp_path / 'sharded'}"
    else:
        path = str(tmp_path / "outbox.db")
    fleetstore.open(path).close()
    e = Env(tmp_path, path, tmp_path / "events.jsonl", markers, [])
    try:
        yield e
    finally:
        for proc in e.procs:
            proc.kill()


def test_an_idle_worker_in_another_process_starts_an_effect_at_once(any_env: Env) -> None:
    """The worker polls every 300 s here: only a ring of the enqueue's commit (the gate
    file's futex word on SQLite, NOTIFY on PostgreSQL) can make it start the effect
    within the 60 s this test allows, and it starts after the enqueue committed.  (The
    time it takes is measured in benchmarks/bench_outbox.py: about a millisecond.)"""
    env = any_env
    worker = env.worker("--poll", "300", "--concurrency", "2")
    with fleetstore.open(env.path) as store:
        first = store.effects.enqueue("T", "fx", {})
        worker.wait_line(f"started {first} 1", timeout=WAIT)
        wait_for("the first settled", lambda: states(store, first) == ["succeeded"])
        # Idle now: nothing to claim, its next look 300 s away.
        sent = time.time()
        second = store.effects.enqueue("U", "fx", {})
        worker.wait_line(f"started {second} 1", timeout=WAIT)
        wait_for("the second settled", lambda: states(store, second) == ["succeeded"])
    (start,) = [e for e in env.read_events() if e["id"] == second and e["ev"] == "start"]
    assert start["t"] >= sent, "started before it was enqueued"
    rep = stop(worker)
    assert rep["in_transaction"] == [] and rep["stats"]["succeeded"] == 2, rep


@pytest.mark.slow
def test_kill9_of_a_worker_mid_batch_brings_its_claims_back_after_the_lease_only(
    any_env: Env,
) -> None:
    """A worker claims seven effects in one transaction; three finish and are settled,
    four hang in their handlers; it is killed (SIGKILL).  A second worker starts at once:
    it runs none of the four while the dead worker's leases last (its first start of
    each comes after that lease's expiry as the store held it), then the replay-safe
    ones once each, and buries the one that may not run twice; the three settled ones
    never run again."""
    env = any_env
    held: list[str] = []
    with fleetstore.open(env.path) as store:
        quick = [store.effects.enqueue(f"q{i}", "fx", {}) for i in range(3)]
        holds = []
        for i in range(3):
            go, payload = env.hold(f"h{i}")
            holds.append(go)
            held.append(store.effects.enqueue(f"h{i}", "fx", payload))
        go, payload = env.hold("u")
        holds.append(go)
        unsafe = store.effects.enqueue("u", "unsafe", payload)
    victim = env.worker("--lease", "3", "--concurrency", "8", name="victim")
    for _ in range(7):
        victim.wait_line("started", timeout=WAIT)
    with fleetstore.open(env.path) as store:
        wait_for("the quick ones settled", lambda: states(store, *quick) == ["succeeded"] * 3)
        claim_ops = store.read(
            lambda tx: tx.execute("SELECT count(DISTINCT claim_op) FROM effects")
        )
        assert claim_ops == [(1,)], "not claimed in one batch"
        kill9(victim)
        killed = time.time()
        env.clear_markers(victim.pid)
        expiry = {e: store.effects.get(e).lease_expires_at for e in [*held, unsafe]}
        for go in holds:
            go.touch()
        heir = env.worker("--lease", "3", "--concurrency", "8", name="heir")
        wait_for("every effect final", lambda: all_final(store))
        stored = finals(store)
    rep = stop(heir)
    assert rep["in_transaction"] == [] and rep["stats"].get("lost", 0) == 0, rep
    events = env.read_events()
    assert check_threads(events, stored, killed=frozenset({victim.pid})) == []
    for eid in held:
        starts = [e for e in events if e["id"] == eid and e["ev"] == "start"]
        assert [(e["pid"], e["attempt"]) for e in starts] == [(victim.pid, 1), (heir.pid, 2)]
        lease = expiry[eid]
        assert lease is not None and lease >= killed - 3.5
        assert starts[1]["t"] >= lease, (eid, starts[1]["t"], lease)  # not while it lived
        assert (stored[eid].state, stored[eid].attempt) == ("succeeded", 2)
    assert (stored[unsafe].state, stored[unsafe].dead_reason) == ("dead", "not_replay_safe")
    assert runs(events, unsafe) == [("start", victim.pid, 1, None)]
    for eid in quick:
        assert runs(events, eid) == [("start", victim.pid, 1, None), ("end", victim.pid, 1, "ok")]
        assert stored[eid].state == "succeeded"


# -- kill -9 ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_kill9_mid_effect_replays_a_replay_safe_one_and_buries_the_other(env: Env) -> None:
    """A worker is killed (SIGKILL) inside a replay-safe and a not replay-safe effect.
    Once the leases expire another worker runs the replay-safe one again, and it
    succeeds exactly once; the other goes to ``dead`` (``not_replay_safe``) without
    running again, and its thread goes on with its next effect."""
    hold_s, safe_payload = env.hold("s1")
    hold_u, unsafe_payload = env.hold("u1")
    with fleetstore.open(env.path) as store:
        s1 = store.effects.enqueue("safe", "fx", safe_payload)
        s2 = store.effects.enqueue("safe", "fx", {})
        u1 = store.effects.enqueue("unsafe", "unsafe", unsafe_payload)
        u2 = store.effects.enqueue("unsafe", "fx", {})
    victim = env.worker("--lease", "1.5", "--concurrency", "2", name="victim")
    started = {victim.wait_line("started", timeout=WAIT)[1] for _ in range(2)}
    assert started == {f"started {s1} 1", f"started {u1} 1"}
    kill9(victim)
    env.clear_markers(victim.pid)
    # The held runs would finish at once now; they died with their process instead.
    hold_s.touch()
    hold_u.touch()
    heir = env.worker("--lease", "1.5", "--concurrency", "2", name="heir")
    with fleetstore.open(env.path) as store:
        wait_for("every effect final", lambda: all_final(store))
        stored = finals(store)
        safe = store.effects.get(s1)
        unsafe = store.effects.get(u1)
    rep = stop(heir)
    assert rep["in_transaction"] == [] and rep["stats"].get("lost", 0) == 0, rep
    events = env.read_events()
    assert check_threads(events, stored, killed=frozenset({victim.pid})) == []

    assert (safe.state, safe.attempt) == ("succeeded", 2)
    assert safe.result == {"pid": heir.pid, "attempt": 2}
    assert runs(events, s1) == [
        ("start", victim.pid, 1, None),
        ("start", heir.pid, 2, None),
        ("end", heir.pid, 2, "ok"),
    ]
    (lost,) = safe.errors
    assert lost.attempt == 1 and "expired" in lost.error and f":{victim.pid}:" in str(lost.owner)

    assert (unsafe.state, unsafe.dead_reason, unsafe.attempt) == ("dead", "not_replay_safe", 1)
    assert runs(events, u1) == [("start", victim.pid, 1, None)]
    for eid in (s2, u2):
        assert stored[eid].state == "succeeded"
        assert runs(events, eid) == [("start", heir.pid, 1, None), ("end", heir.pid, 1, "ok")]


@pytest.mark.slow
def test_kill9_of_a_worker_holding_chained_claims_brings_them_back_after_the_lease_only(
    env: Env,
) -> None:
    """Settle-and-claim: a worker's settlement of a lane's first effect claims the next
    one for it in the same transaction (its claim_op is that settle_effects operation,
    logged in applied_ops), and it starts.  The worker is killed (SIGKILL) while it
    holds those chained claims: once their leases run out another worker runs the
    replay-safe one again, once, and never while the dead worker's lease lasted; the
    one that may not run twice is buried (``not_replay_safe``); each lane goes on."""
    hold_s, safe_payload = env.hold("s2")
    hold_u, unsafe_payload = env.hold("u2")
    with fleetstore.open(env.path) as store:
        s1 = store.effects.enqueue("safe", "fx", {})
        s2 = store.effects.enqueue("safe", "fx", safe_payload)
        s3 = store.effects.enqueue("safe", "fx", {})
        u1 = store.effects.enqueue("unsafe", "fx", {})
        u2 = store.effects.enqueue("unsafe", "unsafe", unsafe_payload)
        u3 = store.effects.enqueue("unsafe", "fx", {})
    victim = env.worker("--lease", "1.5", "--concurrency", "2", name="victim")
    started = {victim.wait_line("started", timeout=WAIT)[1] for _ in range(4)}
    assert {f"started {s2} 1", f"started {u2} 1"} <= started
    with fleetstore.open(env.path) as store:
        for first, held in ((s1, s2), (u1, u2)):
            (op,) = store.read(
                lambda tx, i=held: tx.execute("SELECT claim_op FROM effects WHERE id = ?", (i,))
            )[0]
            names = store.read(
                lambda tx, o=op: tx.execute("SELECT name FROM applied_ops WHERE op_id = ?", (o,))
            )
            assert names == [("settle_effects",)], (held, op, names)  # chained, not claimed
            assert states(store, first) == ["succeeded"]
        kill9(victim)
        killed = time.time()
        env.clear_markers(victim.pid)
        expiry = store.effects.get(s2).lease_expires_at
        hold_s.touch()
        hold_u.touch()
        heir = env.worker("--lease", "1.5", "--concurrency", "2", name="heir")
        wait_for("every effect final", lambda: all_final(store))
        stored = finals(store)
    rep = stop(heir)
    assert rep["in_transaction"] == [] and rep["stats"].get("lost", 0) == 0, rep
    events = env.read_events()
    assert check_threads(events, stored, killed=frozenset({victim.pid})) == []
    starts = [e for e in events if e["id"] == s2 and e["ev"] == "start"]
    assert [(e["pid"], e["attempt"]) for e in starts] == [(victim.pid, 1), (heir.pid, 2)]
    assert expiry is not None and expiry >= killed - 2.0
    assert starts[1]["t"] >= expiry, (starts[1]["t"], expiry)  # not while its lease lived
    assert runs(events, s2)[1:] == [("start", heir.pid, 2, None), ("end", heir.pid, 2, "ok")]
    assert (stored[s2].state, stored[s2].attempt) == ("succeeded", 2)
    assert (stored[u2].state, stored[u2].dead_reason) == ("dead", "not_replay_safe")
    assert runs(events, u2) == [("start", victim.pid, 1, None)]
    for eid in (s1, u1):
        assert runs(events, eid) == [("start", victim.pid, 1, None), ("end", victim.pid, 1, "ok")]
    for eid in (s3, u3):
        assert stored[eid].state == "succeeded"
        assert runs(events, eid) == [("start", heir.pid, 1, None), ("end", heir.pid, 1, "ok")]


# -- a handler that hangs -----------------------------------------------------------------------


def test_a_hung_handler_times_out_its_thread_goes_on_and_its_late_outcome_is_refused(
    env: Env,
) -> None:
    """The soak's handler that never returns blocked its thread for ever: its worker kept
    renewing the lease.  Now the worker gives up on the attempt at its timeout: the
    replay-safe effect runs again (attempt 2) while the abandoned thread still hangs, the
    not replay-safe one is buried (``timed_out``), one on its last attempt too
    (``attempts_exhausted``), and each thread's next effect runs.  When the hung handlers
    finally return, their outcomes are offered with the old token and refused
    (``LeaseLost``): the newer outcome stands."""
    hold_x, x_payload = env.hold("x")
    hold_u, u_payload = env.hold("u")
    hold_l, l_payload = env.hold("l")
    with fleetstore.open(env.path) as store:
        x = store.effects.enqueue("X", "fx", x_payload)
        x2 = store.effects.enqueue("X", "fx", {})
        u = store.effects.enqueue("U", "unsafe", u_payload)
        u2 = store.effects.enqueue("U", "fx", {})
        last = store.effects.enqueue("L", "fx", l_payload, max_attempts=1)
        last2 = store.effects.enqueue("L", "fx", {})
        worker = env.worker(
            "--handler-timeout", "1", "--concurrency", "4", "--lease", "10", name="worker"
        )
        wait_for("every effect final", lambda: all_final(store))
        events = env.read_events()
        # The hung attempts never ended, yet every thread went on.
        for eid in (x, u, last):
            assert [r for r in runs(events, eid) if r[2] == 1] == [("start", worker.pid, 1, None)]
        done = store.effects.get(x)
        assert (done.state, done.attempt) == ("succeeded", 2)
        assert done.result == {"pid": worker.pid, "attempt": 2}
        (timed_out,) = done.errors
        assert timed_out.attempt == 1 and "timeout of 1s" in timed_out.error
        buried = store.effects.get(u)
        assert (buried.state, buried.dead_reason, buried.attempt) == ("dead", "timed_out", 1)
        spent = store.effects.get(last)
        assert (spent.state, spent.dead_reason) == ("dead", "attempts_exhausted")
        for eid in (x2, u2, last2):
            assert store.effects.get(eid).state == "succeeded"
        # The next attempt of x ran while the abandoned one still held its marker: a
        # timed-out attempt of a replay-safe kind may still run, as after a lost lease.
        second = next(e for e in events if e["id"] == x and e["attempt"] == 2)
        assert second["overlap"] is not None
        stats = wait_stats(worker, "timed_out", 3)
        assert stats.get("late", 0) == 0
        for hold in (hold_x, hold_u, hold_l):
            hold.touch()
        stats = wait_stats(worker, "lost", 3)
        assert stats["late"] == 3 and stats["timed_out"] == 3, stats
        for eid, state in ((x, "succeeded"), (u, "dead"), (last, "dead")):
            assert states(store, eid) == [state]  # the late success landed nowhere
        assert store.effects.get(x).result == {"pid": worker.pid, "attempt": 2}
        refused = [line for _, line in worker.seen if "late outcome is refused" in line]
        assert len(refused) == 3 and all("lease of token 1 is lost" in r for r in refused)
    rep = stop(worker)
    assert rep["in_transaction"] == [] and rep["spool"] == 0, rep
    assert spool_files(env.path) == []
    events = env.read_events()
    for eid in (x, u, last):
        assert ("end", worker.pid, 1, "ok") in runs(events, eid)  # it did come back


def test_a_worker_whose_every_slot_hangs_exits_4_and_another_runs_the_effects(
    env: Env,
) -> None:
    """Abandoned handlers keep their slots (a thread cannot be stopped): with all of them
    hung the worker can do nothing, so it stops (exit 4) rather than hold effects, and
    the process exits though the hung threads still run; another worker takes over."""
    hold, payload = env.hold("x")
    with fleetstore.open(env.path) as store:
        x = store.effects.enqueue("X", "fx", payload)
        y = store.effects.enqueue("Y", "fx", {})
        hung = env.worker("--handler-timeout", "0.5", "--concurrency", "1", name="hung")
        hung.wait_line(f"started {x} 1", timeout=WAIT)
        assert hung.finish(timeout=WAIT) == 4, (hung.seen, hung.stderr_tail())
        rep = report(hung)
        assert rep["code"] == 4 and rep["stats"]["timed_out"] == 1, rep
        assert any("every handler slot (1) is held" in line for _, line in hung.seen)
        assert states(store, x, y) == ["pending", "pending"]  # y never claimed, x retried
        heir = env.worker("--until-idle", name="heir")
        assert heir.finish(timeout=WAIT) == 0
        effect = store.effects.get(x)
        assert (effect.state, effect.result) == ("succeeded", {"pid": heir.pid, "attempt": 2})
        assert states(store, y) == ["succeeded"]
    hold.touch()


# -- a handler that raises ------------------------------------------------------------------------


def failures(proc: Proc) -> list[dict[str, Any]]:
    """The worker's records of failed attempts (``failure {...}`` lines), in order."""
    return [
        json.loads(line.split(" ", 1)[1]) for _, line in proc.seen if line.startswith("failure ")
    ]


@pytest.mark.slow
def test_a_failing_handler_is_logged_once_per_attempt_and_its_traceback_kept_bounded(
    env: Env,
) -> None:
    """Issue 25: a handler's exception was never logged and only ``KeyError: ...`` was
    kept.  A worker process with real handlers that raise: each failed attempt is logged
    once, after its settlement, with its fields and what came of it (an unexpected
    exception's record with its traceback, a ``FailEffect``'s without); the traceback is
    kept from the handler's frame on, a 300-frame one cut to its last 8 KiB; the worker's
    ``--max-attempts 2`` gives up sooner than an effect's 5 and its thread goes on."""
    from fleetstore.domain.outbox_ops import MAX_TRACEBACK

    with fleetstore.open(env.path) as store:
        once = store.effects.enqueue("A", "fx", {"plan": ["error"]})
        after = store.effects.enqueue("A", "fx", {})
        deep = store.effects.enqueue("B", "fx", {"plan": ["deep"]}, max_attempts=1)
        refused = store.effects.enqueue("C", "unsafe", {"plan": ["fail"]})
        capped = store.effects.enqueue("D", "fx", {"plan": ["error"] * 5})  # 5 allowed
        capped_next = store.effects.enqueue("D", "fx", {})
    worker = env.worker("--until-idle", "--max-attempts", "2")
    assert worker.finish(timeout=WAIT) == 0, (worker.seen, worker.stderr_tail())
    rep = report(worker)
    assert (rep["stats"]["dead"], rep["stats"]["retried"]) == (3, 2), rep

    logged = failures(worker)
    assert sorted((f["effect_id"], f["attempt"], f["next"]) for f in logged) == sorted(
        [
            (once, 1, "retry"),
            (deep, 1, "dead"),
            (refused, 1, "dead"),
            (capped, 1, "retry"),
            (capped, 2, "dead"),
        ]
    ), logged  # once per failed attempt: no more, no fewer
    by = {(f["effect_id"], f["attempt"]): f for f in logged}
    first = by[(once, 1)]
    assert first["error"] == "RuntimeError: planned error in attempt 1"
    assert first["where"].endswith("outbox_agent.py:" + first["where"].split(":")[-1])
    assert " in run" in first["where"] and first["traceback"] and first["level"] == "WARNING"
    assert (first["kind"], first["thread_key"], first["max_attempts"]) == ("fx", "A", 2)
    assert first["retry_at"] is not None and first["dead_reason"] is None
    assert by[(deep, 1)]["where"].endswith(" in deep") and by[(deep, 1)]["level"] == "ERROR"
    assert by[(refused, 1)]["traceback"] is False  # FailEffect: deliberate, no traceback
    assert by[(refused, 1)]["dead_reason"] == "failed"
    assert by[(capped, 2)]["dead_reason"] == "attempts_exhausted"

    with fleetstore.open(env.path) as store:
        stored = finals(store)
        (kept,) = store.effects.get(once).errors
        assert kept.traceback is not None
        assert kept.traceback.startswith("Traceback (most recent call last):")
        assert "outbox_agent.py" in kept.traceback and ", in run\n" in kept.traceback
        assert kept.traceback.endswith("RuntimeError: planned error in attempt 1\n")
        assert "domain/worker.py" not in kept.traceback  # the handler's frames only
        (cut,) = store.effects.get(deep).errors
        assert cut.traceback is not None and len(cut.traceback) <= MAX_TRACEBACK
        assert cut.traceback.startswith("…")  # the outer frames went, the end is kept
        assert cut.traceback.endswith("RuntimeError: deep failure in attempt 1\n")
        assert ", in deep\n" in cut.traceback
        assert store.effects.get(refused).errors[0].traceback is not None  # kept, not logged
        dead = store.effects.get(capped)
        assert (dead.attempt, dead.max_attempts, dead.dead_reason) == (2, 5, "attempts_exhausted")
        assert states(store, after, capped_next) == ["succeeded", "succeeded"]
    plans = {
        once: (["error"], 2),
        after: ([], 2),
        deep: (["deep"], 1),
        refused: (["fail"], 2),
        capped: (["error"] * 5, 2),
        capped_next: ([], 2),
    }
    events = env.read_events()
    assert check_threads(events, stored) == []
    assert check_outcomes(events, stored, plans) == []


# -- a stale worker -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("newer", ["running", "succeeded"])
def test_stale_worker_settling_after_its_lease_was_swept_and_reclaimed_gets_lease_lost(
    env: Env, newer: str
) -> None:
    """A process claims an effect and stalls past its lease; a worker sweeps it, claims
    it again and (``newer``) is still running it or has finished it.  The stale process's
    heartbeat and settlement raise ``LeaseLost`` and change nothing: the newer outcome
    stands, and nothing of the stale one is spooled."""
    hold, payload = env.hold("e", attempts=(2,) if newer == "running" else ())
    go = env.tmp / "go"
    with fleetstore.open(env.path) as store:
        e = store.effects.enqueue("T", "fx", payload)
        stale = env.stale(e, 1.0, go)
        stale.wait_line(f"claimed {e} 1", timeout=WAIT)
        wait_for("the stale claim expired", lambda: store.effects.counts()["expired"] == 1)
        worker = env.worker("--lease", "10")
        if newer == "running":
            worker.wait_line(f"started {e} 2", timeout=WAIT)
            effect = store.effects.get(e)
            assert (effect.state, effect.fence, effect.attempt) == ("running", 2, 2)
        else:
            wait_for("the newer run succeeded", lambda: states(store, e) == ["succeeded"])
        go.touch()
        _, heartbeat = stale.wait_line("heartbeat ", timeout=WAIT)
        _, succeed = stale.wait_line("succeed ", timeout=WAIT)
        assert stale.finish(timeout=WAIT) == 0
        assert report(stale) == {"spool": 0}
        for line in (heartbeat, succeed):
            outcome = json.loads(line.split(" ", 1)[1])
            assert (outcome["error"], outcome["state"]) == ("LeaseLost", newer), outcome
        if newer == "running":
            assert store.effects.get(e).state == "running"  # untouched by the stale claim
            hold.touch()
            wait_for("the newer run succeeded", lambda: states(store, e) == ["succeeded"])
        effect = store.effects.get(e)
        stored = finals(store)
    stop(worker)
    assert (effect.attempt, effect.fence) == (2, 2)
    assert effect.result == {"pid": worker.pid, "attempt": 2}  # never "stale"
    (lost,) = effect.errors
    assert lost.attempt == 1 and lost.owner == f"stale-{stale.pid}"
    assert spool_files(env.path) == []  # nothing rejected either
    events = env.read_events()
    assert runs(events, e) == [("start", worker.pid, 2, None), ("end", worker.pid, 2, "ok")]
    assert stored[e].state == "succeeded"


# -- shutdown -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_sigterm_once_finishes_the_running_effect_and_releases_prefetched_ones(env: Env) -> None:
    """SIGTERM once: no new claims, the prefetched (claimed, never started) effects go
    back to ``pending`` with their attempt unspent, the running one finishes, exit 0."""
    hold, payload = env.hold("x")
    with fleetstore.open(env.path) as store:
        x = store.effects.enqueue("X", "fx", payload)
        y = store.effects.enqueue("Y", "fx", {})
        z = store.effects.enqueue("Z", "fx", {})
        worker = env.worker("--concurrency", "1", "--prefetch", "2", "--lease", "10")
        worker.wait_line(f"started {x} 1", timeout=WAIT)
        for eid in (y, z):  # claimed with x, waiting for a free slot
            prefetched = store.effects.get(eid)
            assert (prefetched.state, prefetched.attempt) == ("running", 1)
        os.kill(worker.pid, signal.SIGTERM)
        worker.wait_line("log WARNING SIGTERM: no new claims", timeout=WAIT)
        wait_for("y and z released", lambda: states(store, y, z) == ["pending"] * 2)
        late = store.effects.enqueue("L", "fx", {})  # not claimed: the worker is stopping
        assert states(store, x) == ["running"]
        hold.touch()
        rc = worker.finish(timeout=WAIT)
        assert rc == 0, (worker.seen, worker.stderr_tail())
        rep = report(worker)
        assert rep["stats"] == {"claimed": 3, "released": 2, "succeeded": 1}, rep
        assert rep["in_transaction"] == [] and rep["spool"] == 0, rep
        done = store.effects.get(x)
        assert (done.state, done.result) == ("succeeded", {"pid": worker.pid, "attempt": 1})
        for eid in (y, z, late):
            effect = store.effects.get(eid)
            assert (effect.state, effect.attempt, effect.errors) == ("pending", 0, ()), effect
        assert [e["id"] for e in env.read_events()] == [x, x]
        # The released effects' first real run is attempt 1.
        after = env.worker("--until-idle", name="after")
        assert after.finish(timeout=WAIT) == 0
        for eid in (y, z, late):
            effect = store.effects.get(eid)
            assert (effect.state, effect.attempt) == ("succeeded", 1), effect


@pytest.mark.slow
def test_sigterm_twice_interrupts_running_effects_and_exits_3(env: Env) -> None:
    """SIGTERM twice: a hard stop.  The running effects are settled as interrupted (the
    replay-safe one back to ``pending``, the other ``dead``), the process exits 3 even
    though its handlers never return, and both threads go on under the next worker."""
    hold_a, payload_a = env.hold("a")
    hold_u, payload_u = env.hold("u")
    with fleetstore.open(env.path) as store:
        a = store.effects.enqueue("A", "fx", payload_a)
        a2 = store.effects.enqueue("A", "fx", {})
        u = store.effects.enqueue("U", "unsafe", payload_u)
        u2 = store.effects.enqueue("U", "fx", {})
        worker = env.worker("--concurrency", "2", "--lease", "10", "--grace", "600")
        started = {worker.wait_line("started", timeout=WAIT)[1] for _ in range(2)}
        assert started == {f"started {a} 1", f"started {u} 1"}
        os.kill(worker.pid, signal.SIGTERM)
        worker.wait_line("log WARNING SIGTERM: no new claims", timeout=WAIT)
        os.kill(worker.pid, signal.SIGTERM)
        # The handlers are still blocked: a hard stop must not wait for them.
        rc = worker.finish(timeout=20)
        assert rc == 3, (worker.seen, worker.stderr_tail())
        rep = report(worker)
        # The unsafe one went dead with the stop: counted (issue 25's stats["dead"]).
        assert rep["code"] == 3, rep
        assert rep["stats"] == {"claimed": 2, "interrupted": 2, "dead": 1}, rep
        assert rep["in_transaction"] == [] and rep["spool"] == 0, rep
        safe, unsafe = store.effects.get(a), store.effects.get(u)
        assert (safe.state, safe.attempt) == ("pending", 1), safe
        assert unsafe.state == "dead", unsafe
        for effect in (safe, unsafe):
            assert effect.last_error is not None and "stopped hard" in effect.last_error
        assert states(store, a2, u2) == ["pending", "pending"]
        assert runs(env.read_events(), a) == [("start", worker.pid, 1, None)]
        env.clear_markers(worker.pid)
        hold_a.touch()
        hold_u.touch()
        after = env.worker("--until-idle", name="after")
        assert after.finish(timeout=WAIT) == 0
        stored = finals(store)
    assert [stored[i].state for i in (a, a2, u, u2)] == [
        "succeeded",
        "succeeded",
        "dead",
        "succeeded",
    ]
    assert stored[a].attempt == 2 and stored[a].result == {"pid": after.pid, "attempt": 2}
    events = env.read_events()
    assert check_threads(events, stored, killed=frozenset({worker.pid})) == []
    assert runs(events, u) == [("start", worker.pid, 1, None)]


# -- the fleet ----------------------------------------------------------------------------------

WORKERS = 8
THREADS = 50
PER_THREAD = 20
#: (weight, plan, max_attempts): the handler's outcome per attempt.
PLANS: list[tuple[int, list[str], int]] = [
    (60, ["ok"], 5),
    (12, ["error", "ok"], 5),
    (8, ["retry", "retry", "ok"], 5),
    (6, ["fail"], 5),
    (5, ["error", "fail"], 5),
    (5, ["error", "retry", "error"], 3),  # dead: attempts_exhausted
    (4, ["retry", "error", "retry", "ok"], 5),
]


@pytest.mark.fleet
def test_fleet_of_8_workers_runs_threads_in_order_one_at_a_time_exactly_once(
    env: Env, barrier: Barrier
) -> None:
    """8 worker processes, 50 threads x 20 effects whose handlers fail, retry and
    succeed at random: per thread, effects start in seq order (retries before the next
    seq), never two at once; each succeeds exactly once or dies as planned."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    plans: dict[str, tuple[list[str], int]] = {}
    weights = [w for w, _, _ in PLANS]
    with fleetstore.open(env.path) as store:
        for _n in range(PER_THREAD):
            for t in range(THREADS):
                (_, plan, max_attempts) = rng.choices(PLANS, weights)[0]
                payload = {"plan": plan, "sleep": rng.choice([0, 0, 0.001, 0.003])}
                eid = store.effects.enqueue(
                    f"thread-{t:02d}", "fx", payload, max_attempts=max_attempts
                )
                plans[eid] = (plan, max_attempts)
        assert len(plans) == THREADS * PER_THREAD
    options = ("--until-idle", "--concurrency", "3", "--lease", "30", "--barrier", barrier.path)
    workers = [env.worker(*options, name=f"worker {i}") for i in range(WORKERS)]
    barrier.release()  # all start together
    for w in workers:
        assert w.finish(timeout=240) == 0, (seed, w.seen[-5:], w.stderr_tail())
    with fleetstore.open(env.path) as store:
        stored = finals(store)
        counts = store.effects.counts()
    events = env.read_events()
    problems = check_threads(events, stored) + check_outcomes(events, stored, plans)
    assert problems == [], (seed, problems[:20])
    assert counts["pending"] == counts["running"] == counts["expired"] == 0, counts
    planned_dead = sum(expected(*p)[0] == "dead" for p in plans.values())
    assert counts["dead"] == planned_dead and counts["succeeded"] == len(plans) - planned_dead
    chained = 0
    for w in workers:
        rep = report(w)
        assert rep["in_transaction"] == [] and rep["spool"] == 0, rep
        assert rep["stats"].get("lost", 0) == 0, rep
        chained += rep["stats"].get("chained", 0)
    # Settlements claimed threads' next effects (settle-and-claim), and the order held.
    assert chained > 0
    # The planned failures happened, and the work was shared between the processes.
    assert {e.get("outcome") for e in events} == {None, "ok", "error", "retry", "fail"}
    assert len({e["pid"] for e in events}) >= 2
