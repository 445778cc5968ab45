"""One liveness check (core/liveness.py) behind every recorded owner: a live process
whose recorded start time differs (its PID was reused) is dead to every caller; a record
with a PID only gets the PID's answer; a killed, unreaped child (a zombie) is dead.
A real child process each time; spawning until a PID is reused would take too long, so
the reuse is a live PID recorded with another start time (what a reuse looks like)."""

from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetstore.core import liveness
from fleetstore.domain import session_jobs
from fleetstore.engine import board as bd
from fleetstore.engine.gate import GATE_FILE_BYTES
from fleetstore.store.procstats import procs_dir, read_published


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "600"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _board(owner: int) -> bd.Board:
    mm = mmap.mmap(-1, GATE_FILE_BYTES)
    return bd.Board(mm, owner, lambda at, n: True, lambda: None)


def _claimed_over(recorded: int) -> int:
    """The slot a board of this process takes once *recorded* owns slot 0."""
    theirs = _board(recorded)
    assert theirs.claim(lambda owner: False) and theirs.slot == 0
    mine = bd.Board(theirs._mm, bd.owner_word(os.getpid(), 1, 1), lambda at, n: True, lambda: None)
    assert mine.claim()
    return mine.slot


def _published_alive(tmp_path: Path, pid: int, start: int | None) -> bool:
    db = tmp_path / "p.db"
    folder = procs_dir(db)
    folder.mkdir(exist_ok=True)
    (folder / f"{pid}.json").write_text(
        json.dumps({"pid": pid, "start_time": start, "published_at": time.time()})
    )
    [found] = read_published(db)
    return found.alive


def test_a_live_pid_recorded_with_another_start_time_is_dead_to_every_caller(
    tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    pid = child.pid
    start = liveness.start_time(pid)
    assert start is not None
    reused = start + 1
    # The check itself; the sharded layout's intents and doctor's view of them (token);
    # the group-commit board's owner word (only its low bits of the start time).
    assert liveness.alive(pid, start) and liveness.token_alive(liveness.token(pid))
    assert not liveness.alive(pid, reused)
    assert not liveness.token_alive(f"{pid}:{reused}")
    assert bd.owner_alive(bd.owner_word(pid, start, 7))
    assert not bd.owner_alive(bd.owner_word(pid, reused, 7))
    # A board slot of the reused PID is taken over; the live owner's is left alone.
    assert _claimed_over(bd.owner_word(pid, reused, 7)) == 0
    assert _claimed_over(bd.owner_word(pid, start, 7)) == 1
    # Published figures (fleetstore top, doctor, maintain's cleanup).
    assert _published_alive(tmp_path, pid, start)
    assert not _published_alive(tmp_path, pid, reused)


def test_a_record_with_a_pid_only_gets_the_pids_answer(
    tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    """Records written before start times were kept: alive while the PID runs."""
    pid = child.pid
    assert liveness.alive(pid) and liveness.token_alive(str(pid))
    assert bd.owner_alive((pid << 32) | 3)  # an older version's owner word
    assert _claimed_over((pid << 32) | 3) == 1
    assert _published_alive(tmp_path, pid, None)
    # Fork copies record host:PID (read by older versions too): not abandoned while
    # the PID runs and the copy moves.
    owner = f"{session_jobs.socket.gethostname()}:{pid}"
    assert not session_jobs._abandoned(owner, time.time(), "f", stall=60)


def test_a_dead_process_and_a_damaged_record_are_dead(
    tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    pid = child.pid
    start = liveness.start_time(pid)
    os.kill(pid, signal.SIGKILL)
    # Not reaped yet: a zombie, which /proc still lists.
    for _ in range(1000):
        if Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z":
            break
        time.sleep(0.01)
    for recorded in (start, None):
        assert not liveness.alive(pid, recorded)
    assert not liveness.token_alive(f"{pid}:{start}") and not liveness.token_alive(str(pid))
    assert not bd.owner_alive(bd.owner_word(pid, start, 1))
    assert not bd.owner_alive((pid << 32) | 1)
    assert not _published_alive(tmp_path, pid, start)
    owner = f"{session_jobs.socket.gethostname()}:{pid}"
    assert session_jobs._abandoned(owner, time.time(), "f", stall=60)
    child.wait()
    assert not liveness.alive(pid) and not liveness.alive(pid, start)
    for damaged in ("", "x", "12:x", "-3", "1:2:3", None):
        assert not liveness.token_alive(damaged)
    for bad in (0, -1, 2**40, True, "12"):
        assert not liveness.alive(bad)
