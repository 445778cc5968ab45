"""Group commit (engine/combine.py), with real processes and real SIGKILL.

A ``serve`` agent takes the gate and holds it until the writers have posted their
items on the board, then commits them with an item of its own in one transaction;
``FLEETSTORE_TEST_CRASH_COMBINE`` makes it kill itself before COMMIT, inside it (at its
first WAL write), after COMMIT (before any waiter learns its result) or after writing
the results (before waking anyone).  Whatever happens, each writer's item lands exactly once, the writers carry
on within a second or so of the holder's death, and an item that fails, fails alone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fleetstore import errors
from fleetstore.engine.combine import CRASH_ENV
from fleetstore.engine.sqlite import Database
from tests.agents import combine_agent, script
from tests.fix_faults import importable_env
from tests.fix_procs import Barrier, Proc

AGENT = script("combine_agent.py")


def _proc(procs: list[Proc], *args: str, env: dict[str, str] | None = None) -> Proc:
    # The agent imports tests.fix_faults (the holder killed inside its COMMIT).
    p = Proc(
        [sys.executable, AGENT, *args], " ".join(args[:1]), env={**importable_env(), **(env or {})}
    )
    procs.append(p)
    return p


def _keys(path: Path) -> list[tuple[str, int]]:
    db = Database.open(path, migrations=combine_agent.SCHEMA)
    try:
        return sorted(db.read(lambda tx: tx.execute("SELECT k, pid FROM t")))
    finally:
        db.close()


def _writers(procs: list[Proc], path: Path, barrier: Barrier, keys: list[str]) -> list[Proc]:
    ws = [_proc(procs, "write", str(path), k, barrier.path) for k in keys]
    for w in ws:
        w.wait_line("ready", timeout=60)
    return ws


def _line(p: Proc, *prefixes: str) -> tuple[float, str]:
    """The first line *p* printed that starts with one of *prefixes*, and when."""
    return next((at, text) for at, text in p.seen if text.startswith(prefixes))


def _figures(p: Proc) -> dict[str, Any]:
    line = next(text for _, text in p.seen if text.startswith("figures "))
    return json.loads(line.split(" ", 1)[1])


def _run_batch(
    tmp_path: Path, procs: list[Proc], barrier: Barrier, keys: list[str], crash: str | None
) -> tuple[Path, Proc, list[Proc]]:
    path = tmp_path / "gc.db"
    Database.open(path, migrations=combine_agent.SCHEMA).close()
    writers = _writers(procs, path, barrier, keys)
    env = {CRASH_ENV: crash} if crash else {}
    holder = _proc(procs, "serve", str(path), str(len(keys)), env=env)
    holder.wait_line("holding", timeout=60)
    barrier.release()
    return path, holder, writers


def test_waiting_processes_are_committed_in_the_holders_one_transaction(
    tmp_path: Path, procs: list[Proc], barrier: Barrier
) -> None:
    keys = [f"k{i}" for i in range(4)]
    path, holder, writers = _run_batch(tmp_path, procs, barrier, keys, None)
    assert holder.finish(60) == 0, holder.stderr_tail()
    served = _figures(holder)
    # Its own item and the four it was handed: one transaction, one commit.
    assert served["batch_max"] == 5 and served["served"] == 4, served
    for w, key in zip(writers, keys, strict=True):
        assert w.finish(60) == 0, w.stderr_tail()
        assert _line(w, "ok", "err")[1].startswith(f"ok {key} "), w.seen
        assert _figures(w)["handed_over"] == 1
    stored = {k for k, _ in _keys(path)}
    assert set(keys) <= stored and any(k.startswith("holder-") for k in stored)


def test_an_item_that_fails_in_a_batch_fails_alone_and_the_others_commit(
    tmp_path: Path, procs: list[Proc], barrier: Barrier
) -> None:
    keys = ["k0", "bad1", "k2"]
    path, holder, writers = _run_batch(tmp_path, procs, barrier, keys, None)
    assert holder.finish(60) == 0, holder.stderr_tail()
    assert _figures(holder)["batch_max"] == 4
    outcomes = []
    for w in writers:
        assert w.finish(60) == 0, w.stderr_tail()
        outcomes.append(_line(w, "ok", "err")[1].split()[:2])
    assert outcomes == [["ok", "k0"], ["err", "InvalidInput"], ["ok", "k2"]]
    stored = {k for k, _ in _keys(path)}
    assert {"k0", "k2"} <= stored and "bad1" not in stored


@pytest.mark.parametrize(
    "point", ["before-commit", "during-commit", "after-commit", "after-results"]
)
def test_a_holder_killed_mid_batch_loses_nothing_and_applies_nothing_twice(
    tmp_path: Path, procs: list[Proc], barrier: Barrier, point: str
) -> None:
    keys = [f"k{i}" for i in range(5)]
    path, holder, writers = _run_batch(tmp_path, procs, barrier, keys, point)
    assert holder.finish(60) == -signal.SIGKILL
    died = time.time()
    for w, key in zip(writers, keys, strict=True):
        assert w.finish(60) == 0, w.stderr_tail()
        at, line = _line(w, "ok", "err")
        assert line.startswith(f"ok {key} "), w.seen
        # They notice the holder is gone within a nap of the board (50 ms) and go on.
        assert at - died < 3.0, (at - died, w.seen)
    rows = _keys(path)
    stored = [k for k, _ in rows]
    assert len(stored) == len(set(stored))  # nothing applied twice
    assert set(keys) <= set(stored)
    holder_keys = [k for k in stored if k.startswith("holder-")]
    # The holder's own item committed with the batch, or not at all.
    if point in ("before-commit", "during-commit"):
        assert holder_keys == []
    else:
        assert len(holder_keys) == 1


def test_a_waiter_whose_budget_runs_out_while_posted_is_never_applied_later(
    tmp_path: Path, procs: list[Proc], barrier: Barrier
) -> None:
    path = tmp_path / "gc.db"
    Database.open(path, migrations=combine_agent.SCHEMA).close()
    writer = _proc(procs, "write", str(path), "late", barrier.path, "0.5")
    writer.wait_line("ready", timeout=60)
    holder = _proc(procs, "serve", str(path), "99", "2.0")  # holds 2 s, then serves
    holder.wait_line("holding", timeout=60)
    barrier.release()
    assert writer.finish(60) == 0, writer.stderr_tail()
    line = _line(writer, "ok", "err")[1]
    assert line.startswith("err StoreBusy"), writer.seen
    waited = float(line.split()[2])
    assert 0.4 < waited < 1.5, waited
    assert holder.finish(60) == 0, holder.stderr_tail()
    assert "late" not in {k for k, _ in _keys(path)}


class _Key:
    def __init__(self, key: str) -> None:
        self.key = key

    def run(self, tx: Any) -> object:
        return combine_agent.insert(tx, self.key, os.getpid())

    def payload(self) -> bytes | None:
        return json.dumps({"key": self.key, "pid": os.getpid()}).encode()

    def result(self, data: bytes) -> object:
        return json.loads(data)


def test_threads_of_one_process_are_combined_into_few_commits(
    tmp_path: Path, procs: list[Proc]
) -> None:
    path = tmp_path / "gc.db"
    db = combine_agent.open_db(str(path))
    try:
        db.submit(_Key("warm"))
        before = db.metrics()
        holder = _proc(procs, "hold", str(path), "1.0")
        holder.wait_line("holding", timeout=60)
        results: list[object] = []
        threads = [
            threading.Thread(target=lambda i=i: results.append(db.submit(_Key(f"t{i}"))))
            for i in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert holder.finish(60) == 0
        after = db.metrics()
        assert len(results) == 8
        commits = after["writes"] - before["writes"]
        assert after["batched_items"] - before["batched_items"] == 8
        # They queued behind one leader while another process held the gate.
        assert commits <= 3, commits
    finally:
        db.close()
    assert {k for k, _ in _keys(path)} >= {f"t{i}" for i in range(8)}


def test_an_item_of_another_code_version_is_left_to_its_own_process(
    tmp_path: Path, procs: list[Proc], barrier: Barrier
) -> None:
    path = tmp_path / "gc.db"
    db = Database.open(path, migrations=combine_agent.SCHEMA)
    db.serve("another-version", combine_agent.applier)  # a holder of other code
    writer = _proc(procs, "write", str(path), "mine", barrier.path)
    writer.wait_line("ready", timeout=60)
    try:
        db.submit(_Key("warm-other"))
        db._gate.acquire(time.monotonic() + 30)
        barrier.release()
        time.sleep(0.3)  # the writer posts under its own tag
        served: list[object] = []
        from fleetstore.engine.combine import Request

        own = Request(_Key("other"), time.monotonic() + 30)
        db._combiner._serve([own], None, time.monotonic())
        served.append(own.outcome())
        assert db.metrics()["served"] == 0  # not ours to apply
    finally:
        db.close()
    assert writer.finish(60) == 0, writer.stderr_tail()
    assert _line(writer, "ok", "err")[1].startswith("ok mine")
    assert _figures(writer)["handed_over"] == 0  # it applied its own, after the kick
    assert {"mine", "other"} <= {k for k, _ in _keys(path)}


def test_no_item_goes_to_another_process_when_it_says_it_must_not(tmp_path: Path) -> None:
    class Local(_Key):
        def payload(self) -> bytes | None:
            return None

    db = combine_agent.open_db(str(tmp_path / "gc.db"))
    try:
        assert db.submit(Local("x")) == {"key": "x", "inserted": True}
        with pytest.raises(errors.InvalidInput):
            db.submit(Local("bad"))
        assert db.submit(Local("x")) == {"key": "x", "inserted": False}
    finally:
        db.close()
