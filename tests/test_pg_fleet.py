"""Fleets of real processes on one PostgreSQL store (issue 5, "Tests"), checked by the
SQLite fleet tests' own checkers:

* 32 agent processes (tests/history_agent.py: sessions, streamed replies with tool
  outputs up to 8 MB, stored in the database in 1 MiB chunks, subagents, state) for
  ~16 s: every process exits 0, and
  tests/test_history_fleet.py's ``check_store`` finds every acknowledged write exactly
  once and nothing that was not acknowledged;
* 8 outbox worker processes (tests/outbox_agent.py through tests/pg_outbox_agent.py)
  running 50 threads x 20 effects that fail, retry and succeed: the very test of
  tests/test_outbox_fleet.py, on a PostgreSQL store: per-thread order, one run at a time,
  exactly-once settlement.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fleetstore
import test_outbox_fleet as outbox_fleet
from conftest import Barrier, Proc
from test_history_fleet import check_store, read_log

#: Per-host state of the PostgreSQL stores (spool journals) under tmp_path.
pytestmark = pytest.mark.usefixtures("data_dir")

HISTORY_AGENT = str(Path(__file__).with_name("history_agent.py"))
PG_OUTBOX_AGENT = str(Path(__file__).with_name("pg_outbox_agent.py"))
AGENTS = 32
RUN = 16.0  # seconds the fleet writes
SURE_BIG = 2  # agents whose first reply carries a 7-8 MB output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_32_agents_on_one_postgresql_store_lose_and_duplicate_nothing(
    pg_url: str, procs: list[Proc], barrier: Barrier, tmp_path: Path
) -> None:
    fleetstore.open(pg_url).close()  # the schema exists before the fleet starts
    stop = tmp_path / "stop"
    logs = [tmp_path / f"agent-{i}.log" for i in range(AGENTS)]
    for i in range(AGENTS):
        args = ["--agent", str(i), "--log", str(logs[i]), "--seed", "7", "--big-prob", "0.002"]
        args += ["--barrier", barrier.path, "--stop", str(stop), "--duration", "600"]
        if i < SURE_BIG:  # a 7-8 MB tool output in its first reply: a blob of 8 chunks
            args += ["--big-at", "1"]
        procs.append(Proc([sys.executable, HISTORY_AGENT, pg_url, *args], name=f"agent {i}"))
    for p in procs:
        p.wait_line("ready", timeout=120)
    t0 = barrier.release()
    time.sleep(max(0.0, t0 + RUN - time.time()))
    stop.touch()
    summaries: list[dict[str, Any]] = []
    for p in procs:
        rc = p.finish(timeout=120)
        assert rc == 0, (p.name, rc, p.stderr_tail())
        summaries.append(json.loads(p.last_line()))
    parsed = [read_log(logs[i], i, killed=False) for i in range(AGENTS)]
    for log, counts in zip(parsed, summaries, strict=True):
        # Each agent's own count of returned calls matches its log: the log is what it did.
        for kind in ("session", "user", "open", "reply", "whole", "state"):
            assert log.ack_counts[kind] == counts.get(kind, 0), (log.agent, kind)
        assert log.reply_ack_times, f"agent {log.agent} finished no reply"
    tally = check_store(pg_url, parsed)
    assert tally.messages >= 2 * AGENTS and tally.big_outputs >= SURE_BIG, tally.counts()
    print("pg fleet:", json.dumps({"agents": AGENTS, "run_s": RUN, **tally.counts()}))


@pytest.fixture
def pg_env(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[outbox_fleet.Env]:
    """test_outbox_fleet's ``env`` on a PostgreSQL store, its workers run through
    tests/pg_outbox_agent.py."""
    monkeypatch.setattr(outbox_fleet, "AGENT", PG_OUTBOX_AGENT)
    markers = tmp_path / "markers"
    markers.mkdir()
    fleetstore.open(pg_url).close()
    env = outbox_fleet.Env(tmp_path, pg_url, tmp_path / "events.jsonl", markers, [])
    try:
        yield env
    finally:
        for proc in env.procs:
            proc.kill()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_8_outbox_workers_on_postgresql_keep_thread_order_and_settle_once(
    pg_env: outbox_fleet.Env, barrier: Barrier
) -> None:
    outbox_fleet.test_fleet_of_8_workers_runs_threads_in_order_one_at_a_time_exactly_once(
        pg_env, barrier
    )
