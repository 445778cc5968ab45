"""32 agent processes on one sharded store (issue 9), checked by the history fleet's
own checker and file by file.

The agents are tests/agents/history_agent.py's (sessions of a few turns, streamed replies
with tool outputs from bytes to 8 MB as blobs in the shared blob directory,
subagent sessions in their parent's tree, state puts); each of their root sessions
is a tree, so the fleet makes hundreds of shard files while it writes.  Afterwards:
every process exited 0; tests/domain/test_history_fleet.py's ``check_store`` finds every
acknowledged write exactly once and nothing unacknowledged; tests/store/test_sharded.py's
``check_consistent`` finds the catalog's index equal to the shards.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fleetstore
from tests.domain.test_history_fleet import check_store, run_clean_fleet
from tests.fix_procs import Barrier, Proc
from tests.store.test_sharded import check_consistent

AGENTS = 32
RUN = 6.0  # seconds the fleet writes
SURE_BIG = 2  # agents whose first reply carries a 7-8 MB output (run_clean_fleet)


@pytest.mark.fleet
@pytest.mark.timeout(300)
def test_32_agents_on_one_sharded_store_lose_and_duplicate_nothing(
    procs: list[Proc], barrier: Barrier, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    url = f"sqlite+sharded://{root}"
    fleetstore.open(url).close()  # the catalog exists before the fleet starts
    parsed = run_clean_fleet(url, procs, barrier, tmp_path, AGENTS, RUN)

    lay = check_consistent(root)
    roots = {sid for log in parsed for sid, rec in log.sessions.items() if rec["parent"] is None}
    assert len(lay.shards) == len(roots) >= AGENTS  # a file per tree, nothing else
    subagents = sum(len(rows) for rows in lay.shards.values()) - len(roots)
    tally = check_store(url, parsed)
    assert tally.messages >= 2 * AGENTS and tally.big_outputs >= SURE_BIG, tally.counts()
    assert tally.subagent_sessions == subagents >= 1, tally.counts()
    assert not lay.messages[None], "messages in the catalog"
    print(
        "sharded fleet:",
        json.dumps({"agents": AGENTS, "run_s": RUN, "shards": len(lay.shards), **tally.counts()}),
    )
