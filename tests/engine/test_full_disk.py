"""A full disk, for real: a small tmpfs mounted for the test, filled by a file of the
test's while a fleet of agent processes writes to a store on it (issue 23).

A full disk that frees within the write budget costs latency, not turns: writes (and
``open()``) wait it out as they wait out an outside lock, then fail typed
(``StorageFull``).  The gate file is memory-mapped; a store into a page that has no
block behind it on a full file system is a SIGBUS, which killed 5 of 6 writers: every
page the mapping writes is allocated before it is written.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import fleetstore
from tests.agents import script
from tests.fix_procs import Proc

AGENT = script("disk_agent.py")
pytestmark = pytest.mark.slow


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs of the test's own (the suite runs as root, as CI does)."""
    where = tmp_path / "disk"
    where.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", str(where)], check=True
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: Path) -> Path:
    """Fill the file system of *where* to its last byte; the filler's path."""
    filler = where / "filler"
    # Unbuffered: a buffered file kept what the full disk refused and raised ENOSPC
    # again when closed (seen once the indexer's writes shifted the timing).
    with open(filler, "wb", buffering=0) as f:
        chunk = b"\0" * (256 * 1024)
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
        # What a chunk could not take, byte by byte.
        while True:
            try:
                os.write(f.fileno(), b"\0" * 512)
            except OSError:
                break
    return filler


def _agent(procs: list[Proc], store: Path, budget: float, stop: Path) -> Proc:
    p = Proc([sys.executable, AGENT, str(store), str(budget), str(stop)], "agent")
    procs.append(p)
    return p


def _counts(store: Path) -> dict[str, int]:
    with fleetstore.open(store) as s:
        return {x.id: len(s.messages.list(x.id)) for x in s.sessions.list(limit=1000)}


def test_a_full_disk_that_frees_within_the_budget_costs_latency_not_turns(
    disk: Path, procs: list[Proc]
) -> None:
    store, stop = disk / "s.db", disk.parent / "stop"
    fleetstore.open(store).close()
    agents = [_agent(procs, store, 20.0, stop) for _ in range(3)]
    ids = [a.wait_line("ready", timeout=60)[1].split()[1] for a in agents]
    time.sleep(0.3)
    filler = fill(disk)
    late = _agent(procs, store, 20.0, stop)  # started, and opening, while the disk is full
    time.sleep(2.0)
    filler.unlink()
    ids.append(late.wait_line("ready", timeout=30)[1].split()[1])
    time.sleep(0.3)
    stop.touch()
    for a in [*agents, late]:
        assert a.finish(60) == 0, (a.seen, a.stderr_tail())  # no SIGBUS, no exit at open
        assert not [t for _, t in a.seen if t.startswith("err")], a.seen
    counts = _counts(store)
    for a, sid in zip([*agents, late], ids, strict=True):
        done = int(a.last_line().split()[1])
        assert counts[sid] == done, (sid, counts[sid], done)
    # The writers met the full disk (and waited it out), rather than missing it.
    assert max(float(a.last_line().split()[2]) for a in agents) > 1.0


@pytest.mark.timing
def test_a_disk_full_past_the_budget_fails_writes_typed_and_kills_nobody(
    disk: Path, procs: list[Proc]
) -> None:
    store, stop = disk / "s.db", disk.parent / "stop"
    fleetstore.open(store).close()
    agents = [_agent(procs, store, 1.0, stop) for _ in range(3)]
    ids = [a.wait_line("ready", timeout=60)[1].split()[1] for a in agents]
    filler = fill(disk)
    time.sleep(3.5)
    filler.unlink()
    time.sleep(1.0)
    stop.touch()
    errs = set()
    for a in agents:
        assert a.finish(60) == 0, (a.seen, a.stderr_tail())
        for _, line in a.seen:
            if line.startswith("err"):
                _, kind, waited = line.split()
                errs.add(kind)
                assert float(waited) < 1.0 + 1.5, line  # the budget, then typed
    assert errs == {"StorageFull"}, errs
    counts = _counts(store)
    for a, sid in zip(agents, ids, strict=True):
        assert counts[sid] == int(a.last_line().split()[1])


def test_open_of_a_store_nobody_has_open_waits_for_space(disk: Path, procs: list[Proc]) -> None:
    """With no process left on the store its -wal and -shm are gone, and a new one's
    first connection must create them: on a full disk that failed at open() at once."""
    store, stop = disk / "s.db", disk.parent / "stop"
    fleetstore.open(store).close()
    filler = fill(disk)
    agent = _agent(procs, store, 20.0, stop)
    time.sleep(2.0)
    assert agent.popen.poll() is None, agent.stderr_tail()  # still waiting, not dead
    filler.unlink()
    sid = agent.wait_line("ready", timeout=30)[1].split()[1]
    stop.touch()
    assert agent.finish(60) == 0, agent.stderr_tail()
    assert not [t for _, t in agent.seen if t.startswith("err")], agent.seen
    assert _counts(store)[sid] == int(agent.last_line().split()[1])
