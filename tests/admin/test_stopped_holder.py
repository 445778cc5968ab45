"""A lock holder that was SIGSTOPped keeps the lock until it is continued: every place
that names a holder (``StoreBusy``'s message, doctor, top) says it is stopped, with a
real ``fleetstore lock`` process stopped by a real SIGSTOP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fleetstore
from fleetstore.engine.proclocks import lock_holders, process_state
from tests.fix_procs import Spawn, start_lock


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetstore", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )


def stopped(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while process_state(pid) != "T":
        assert time.monotonic() < deadline, f"pid {pid} not stopped: {process_state(pid)!r}"
        time.sleep(0.01)


@pytest.fixture
def held(tmp_path: Path, spawn: Spawn) -> tuple[str, int]:
    path = str(tmp_path / "s.db")
    with fleetstore.open(path) as store:
        store.sessions.create(title="x")
    proc, _ = start_lock(spawn, path, hold=120)
    stopped(proc.pid)
    return path, proc.pid


def test_store_busy_says_the_holder_is_stopped(held: tuple[str, int]) -> None:
    path, pid = held
    [holder] = [h for h in lock_holders(path) if h.pid == pid]
    assert holder.state == "T"
    with (
        fleetstore.open(path, write_budget=0.3, on_busy="raise") as store,
        pytest.raises(fleetstore.StoreBusy) as caught,
    ):
        store.sessions.create(title="blocked")
    message = str(caught.value)
    assert f"pid {pid}" in message, message
    assert "stopped: SIGSTOP or SIGTSTP, state T" in message, message
    assert "kill -CONT" in message, message


def test_doctor_says_the_holder_is_stopped(held: tuple[str, int]) -> None:
    path, pid = held
    done = run("doctor", path, "--interval", "0.2", "--json")
    report = json.loads(done.stdout)
    [proc] = [p for p in report["processes"] if p["pid"] == pid]
    assert proc["state"] == "T"
    named = [f["message"] for f in report["findings"] if f"pid {pid}" in f["message"]]
    assert named, report["findings"]
    assert all("stopped: SIGSTOP or SIGTSTP, state T" in m for m in named), named
    text = run("doctor", path, "--interval", "0.2")
    assert f"pid {pid}" in text.stdout and "state T" in text.stdout, text.stdout


def test_top_names_the_stopped_holder(held: tuple[str, int]) -> None:
    path, pid = held
    done = run("top", path, "--count", "1", "--json", "--interval", "0.1")
    assert done.returncode == 0, done.stderr
    frame = json.loads(done.stdout.splitlines()[-1])
    [holder] = [h for h in frame["lock_holders"] if h["pid"] == pid]
    assert holder["lock"] == "sqlite-write" and holder["stopped"] is True
    assert holder["state"] == "T"
    screen = run("top", path, "--count", "1", "--interval", "0.1")
    assert screen.returncode == 0, screen.stderr
    line = next(x for x in screen.stdout.splitlines() if x.startswith("lock "))
    assert f"pid {pid}" in line and "stopped: SIGSTOP" in line, line
