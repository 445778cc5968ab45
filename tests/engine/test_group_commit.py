"""Group commit (engine/combine.py), with real processes and real SIGKILL.

A ``serve`` agent takes the gate and holds it until the writers have posted their
items on the board, then commits them with an item of its own in one transaction;
``FLEETSTORE_TEST_CRASH`` makes it kill itself before COMMIT, inside it (at its
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
from fleetstore.core.crash import CRASH_ENV
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


def _writers(
    procs: list[Proc], path: Path, barrier: Barrier, keys: list[str], budget: float | None = None
) -> list[Proc]:
    extra = [str(budget)] if budget else []
    ws = [_proc(procs, "write", str(path), k, barrier.path, *extra) for k in keys]
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
    tmp_path: Path,
    procs: list[Proc],
    barrier: Barrier,
    keys: list[str],
    crash: str | None,
    env: dict[str, str] | None = None,
    budget: float | None = None,
) -> tuple[Path, Proc, list[Proc]]:
    path = tmp_path / "gc.db"
    Database.open(path, migrations=combine_agent.SCHEMA).close()
    writers = _writers(procs, path, barrier, keys, budget)
    env = {**(env or {}), **({CRASH_ENV: crash} if crash else {})}
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


@pytest.mark.parametrize(
    ("own", "keys"),
    [
        (True, ["k0", "bad1", "k2"]),
        # An item that writes, then raises: only its savepoint's rollback keeps it out.
        (True, ["k0", "half1", "k2"]),
        # A lone item taken from another process, with none of the holder's own: it
        # ran without a savepoint and its half stayed (issue 23, cause 1: 311 of 1,200
        # appends that raised AlreadyExists were stored anyway).
        (False, ["half1"]),
        (False, ["k0", "half1"]),
    ],
)
def test_an_item_that_fails_in_a_batch_fails_alone_and_the_others_commit(
    tmp_path: Path, procs: list[Proc], barrier: Barrier, own: bool, keys: list[str]
) -> None:
    env = {} if own else {"COMBINE_OWN": "0"}
    path, holder, writers = _run_batch(tmp_path, procs, barrier, keys, None, env)
    assert holder.finish(60) == 0, holder.stderr_tail()
    assert _figures(holder)["batch_max"] == len(keys) + own
    outcomes = []
    for w in writers:
        assert w.finish(60) == 0, w.stderr_tail()
        outcomes.append(_line(w, "ok", "err")[1].split()[:2])
    good = [k for k in keys if k.startswith("k")]
    assert outcomes == [["ok", k] if k in good else ["err", "InvalidInput"] for k in keys]
    stored = {k for k, _ in _keys(path)}
    assert set(good) <= stored and not any(k.startswith(("bad", "half")) for k in stored)


@pytest.mark.parametrize(
    # mid-results: one slot's results written, not yet marked done: its request must
    # still be whole for the next holder (cause 3: results overwrote it, and the next
    # holder decoded them as a request).
    "point",
    ["before-commit", "during-commit", "after-commit", "mid-results", "after-results"],
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


@pytest.mark.timing
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


@pytest.mark.parametrize("fault", ["ioerr", "fsync"])
def test_a_batch_whose_commit_failed_tells_no_waiter_its_write_was_saved(
    tmp_path: Path, procs: list[Proc], barrier: Barrier, fault: str
) -> None:
    """The holder's COMMIT fails writing the WAL (nothing of the batch is in the file)
    or syncing it (it may be): a waiter told "ok" must find its item, once; one told
    an error must not find it."""
    keys = [f"k{i}" for i in range(3)]
    env = {"COMBINE_FAULT": fault, "COMBINE_SYNC": "FULL"}
    path, holder, writers = _run_batch(tmp_path, procs, barrier, keys, None, env)
    assert holder.finish(60) == 0, holder.stderr_tail()
    assert _line(holder, "own err")[1].split()[2] == (
        "StorageError" if fault == "ioerr" else "unknown"
    )
    stored = [k for k, _ in _keys(path)]
    assert len(stored) == len(set(stored))
    told = {}
    for w, key in zip(writers, keys, strict=True):
        assert w.finish(60) == 0, w.stderr_tail()
        told[key] = _line(w, "ok", "err")[1].split()[0]
    for key, said in told.items():
        assert (said == "ok") == (key in stored), (told, stored)
    if fault == "fsync":
        # Its outcome unknown, each waiter applied its item again: found or written.
        assert set(told.values()) == {"ok"}, told


@pytest.mark.timing
def test_a_holder_stopped_mid_batch_keeps_no_waiter_past_its_budget(
    tmp_path: Path, procs: list[Proc], barrier: Barrier
) -> None:
    """Issue 23, cause 2: a holder stopped (SIGSTOP, a debugger, a frozen cgroup) while
    applying the waiters' items held them 10.7 s against a 2 s budget, and their
    processes' other threads with no timeout at all.  Now each gives up at its budget,
    and what it gave up on is never written, even once the holder goes on."""
    path = tmp_path / "gc.db"
    Database.open(path, migrations=combine_agent.SCHEMA).close()
    stopper = _proc(procs, "write", str(path), "stop1", barrier.path, "2")
    pair = _proc(procs, "write", str(path), "k1", barrier.path, "2", env={"COMBINE_THREADS": "2"})
    for w in (stopper, pair):
        w.wait_line("ready", timeout=60)
    holder = _proc(procs, "serve", str(path), "2")
    holder.wait_line("holding", timeout=60)
    barrier.release()
    lines = []
    for w in (stopper, pair):
        assert w.finish(30) == 0, w.stderr_tail()  # while the holder is still stopped
        lines += [text for _, text in w.seen if text.startswith(("ok", "err"))]
    assert holder.popen.poll() is None
    os.kill(holder.pid, signal.SIGCONT)
    assert holder.finish(60) == 0, holder.stderr_tail()
    assert len(lines) == 3, lines
    for line in lines:
        word, kind, waited, _key = line.split()
        assert (word, kind) == ("err", "StoreBusy"), lines
        assert float(waited) < 2 + 1.5, lines  # the budget, not the holder's 30 s stop
    stored = {k for k, _ in _keys(path)}
    assert not stored & {"stop1", "k1-0", "k1-1"}, stored  # given up on: never written
    assert any(k.startswith("holder-") for k in stored)


@pytest.mark.timing
def test_a_holder_stopped_while_committing_reports_the_outcome_unknown_in_time(
    tmp_path: Path, procs: list[Proc], barrier: Barrier
) -> None:
    """Stopped after deciding what it commits: its waiters cannot know whether it will,
    so past their budget (and a short grace) they say so: CommitUncertain."""
    keys = ["k0", "k1"]
    path, holder, writers = _run_batch(
        tmp_path, procs, barrier, keys, "stop:before-commit", budget=2
    )
    for w in writers:
        assert w.finish(30) == 0, w.stderr_tail()
        word, kind, waited, _key = _line(w, "ok", "err")[1].split()
        assert (word, kind) == ("err", "CommitUncertain"), w.seen
        assert float(waited) < 2 + 1.5
    os.kill(holder.pid, signal.SIGCONT)
    assert holder.finish(60) == 0, holder.stderr_tail()
    assert set(keys) <= {k for k, _ in _keys(path)}  # decided in time: committed


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_an_item_applied_for_another_process_rings_after_the_holders_commit(
    tmp_path: Path, procs: list[Proc], barrier: Barrier
) -> None:
    """A writer's item that rings (``tx.notify``) is applied by the gate holder in its
    own transaction: the ring is the holder's to make, after ITS COMMIT.  The holder
    stopped just before that COMMIT: nobody is woken; let go, it commits: the waiter
    wakes and sees the writer's row."""
    path, holder, writers = _run_batch(tmp_path, procs, barrier, ["ring1"], "stop:before-commit")
    db = Database.open(path, migrations=combine_agent.SCHEMA)
    try:
        # (The token after the release is fine: nothing can ring before the holder's
        # COMMIT, and the holder stops before it.)
        token = db.notify_token(combine_agent.RING_CHANNEL)
        deadline = time.monotonic() + 60
        while not _stopped(holder.pid):
            assert time.monotonic() < deadline, "the holder never stopped before its COMMIT"
            time.sleep(0.01)
        assert db.notify_wait(combine_agent.RING_CHANNEL, 0.5, token) is False
        assert "ring1" not in {k for k, _ in _keys(path)}
        os.kill(holder.pid, signal.SIGCONT)
        assert db.notify_wait(combine_agent.RING_CHANNEL, 60, token) is True
        pids = dict(db.read(lambda tx: tx.execute("SELECT k, pid FROM t")))
        assert pids["ring1"] == writers[0].pid, pids  # the writer's item, the holder's commit
    finally:
        db.close()
    assert holder.finish(60) == 0, holder.stderr_tail()
    assert writers[0].finish(60) == 0, writers[0].stderr_tail()
    assert _line(writers[0], "ok", "err")[1].startswith("ok ring1 "), writers[0].seen
    assert _figures(writers[0])["handed_over"] == 1  # applied by the holder, not by itself


def _plant(gate: Path, slot: int, how: str, tag: int) -> None:
    """Post a slot in the gate file as a process of our tag would, damaged *how*."""
    import mmap
    import struct
    import zlib

    from fleetstore.engine import board as bd

    request = bd.encode_request([(time.monotonic() + 30, b'{"key": "planted", "pid": 1}')])
    count, length, crc = 1, len(request), zlib.crc32(request)
    if how == "crc":
        crc ^= 0xFFFF
    elif how == "count":
        count = 100_000
    elif how == "length":
        length = bd.REQUEST_CAP + 1
    elif how == "frames":  # a checksum that matches bytes that do not frame
        request = request[:-3]
        length, crc = len(request), zlib.crc32(request)
    with open(gate, "r+b") as f:
        mm = mmap.mmap(f.fileno(), bd.GATE_FILE_BYTES)
        at = bd.BOARD_OFFSET + slot * bd.SLOT_BYTES
        owner = (os.getppid() << 32) | 1  # a live process that is not us
        mm[at : at + 40] = struct.pack("<QQIIIIII", owner, 1, count, length, tag, crc, 1, 0)
        mm[at + bd.REQUEST_AT : at + bd.REQUEST_AT + len(request)] = request
        struct.pack_into("<I", mm, bd.STATES_AT + 4 * slot, 77 if how == "state" else bd.POSTED)
        mm.close()


@pytest.mark.parametrize("how", ["crc", "count", "length", "frames", "state"])
def test_a_slot_that_does_not_decode_is_quarantined_and_wedges_nobody(
    tmp_path: Path, how: str
) -> None:
    """Issue 23, cause 4: one malformed slot (a bug, another build, any process of the
    user) left the holder inside BEGIN IMMEDIATE, and every process after it the same
    way, since the slot stays in the gate file; doctor said nothing.  Now it is
    quarantined, counted and reported, and never applied."""
    import subprocess

    from fleetstore.engine.board import read_board

    path = tmp_path / "gc.db"
    db = combine_agent.open_db(str(path))
    other = combine_agent.open_db(str(path))  # a second process, as far as the board goes
    try:
        db.submit(_Key("warm"))
        board = db._combiner.board()
        assert board is not None
        _plant(Path(str(path) + ".gate"), board.slot + 5, how, db._combiner._tag)
        for i in range(3):
            assert db.submit(_Key(f"a{i}")) == {"key": f"a{i}", "inserted": True}
            assert other.submit(_Key(f"b{i}")) == {"key": f"b{i}", "inserted": True}
        assert not db._in_transaction() and not other._in_transaction()
        found = read_board(str(path) + ".gate")
        assert found is not None
        quarantined, slots = found
        states = {s.slot: s.state for s in slots}
        if how == "state":  # no state of ours: left alone, never read
            assert quarantined == 0 and states[board.slot + 5] == "unknown (77)"
        else:
            assert quarantined == 1 and states[board.slot + 5] == "quarantined"
    finally:
        other.close()
        db.close()
    doctor = subprocess.run(
        [sys.executable, "-m", "fleetstore", "doctor", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    codes = {f["code"] for f in json.loads(doctor.stdout)["findings"]}
    assert ("board-quarantined" in codes) == (how != "state"), codes
    stored = {k for k, _ in _keys(path)}
    assert "planted" not in stored
    assert {"a0", "a1", "a2", "b0", "b1", "b2"} <= stored
