"""Fleets of real processes on one PostgreSQL store (issue 5, "Tests"), checked by the
SQLite fleet tests' own checkers:

* 32 agent processes (tests/agents/history_agent.py: sessions, streamed replies with tool
  outputs up to 8 MB, stored in the database in 1 MiB chunks, subagents, state) for
  ~16 s: every process exits 0, and
  tests/domain/test_history_fleet.py's ``check_store`` finds every acknowledged write exactly
  once and nothing that was not acknowledged;
* 8 outbox worker processes (tests/agents/outbox_agent.py through tests/agents/pg_outbox_agent.py)
  running 50 threads x 20 effects that fail, retry and succeed: the very test of
  tests/domain/test_outbox_fleet.py, on a PostgreSQL store: per-thread order, one run at a time,
  exactly-once settlement.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import fleetstore
from tests.agents import script
from tests.domain import test_outbox_fleet as outbox_fleet
from tests.domain.test_history_fleet import check_store, run_clean_fleet
from tests.fix_procs import Barrier, Proc

#: Per-host state of the PostgreSQL stores (spool journals) under tmp_path.
pytestmark = pytest.mark.usefixtures("data_dir")

PG_OUTBOX_AGENT = script("pg_outbox_agent.py")
AGENTS = 32
RUN = 16.0  # seconds the fleet writes
SURE_BIG = 2  # agents whose first reply carries a 7-8 MB output (run_clean_fleet)


@pytest.mark.fleet
@pytest.mark.timeout(300)
def test_32_agents_on_one_postgresql_store_lose_and_duplicate_nothing(
    pg_url: str, procs: list[Proc], barrier: Barrier, tmp_path: Path
) -> None:
    fleetstore.open(pg_url).close()  # the schema exists before the fleet starts
    parsed = run_clean_fleet(pg_url, procs, barrier, tmp_path, AGENTS, RUN)
    tally = check_store(pg_url, parsed)
    assert tally.messages >= 2 * AGENTS and tally.big_outputs >= SURE_BIG, tally.counts()
    print("pg fleet:", json.dumps({"agents": AGENTS, "run_s": RUN, **tally.counts()}))


@pytest.fixture
def pg_env(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[outbox_fleet.Env]:
    """test_outbox_fleet's ``env`` on a PostgreSQL store, its workers run through
    tests/agents/pg_outbox_agent.py."""
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


@pytest.mark.fleet
@pytest.mark.timeout(300)
def test_8_outbox_workers_on_postgresql_keep_thread_order_and_settle_once(
    pg_env: outbox_fleet.Env, barrier: Barrier
) -> None:
    outbox_fleet.test_fleet_of_8_workers_runs_threads_in_order_one_at_a_time_exactly_once(
        pg_env, barrier
    )
