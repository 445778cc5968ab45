"""An appender for tests/integrations/test_openai_agents_compaction.py: appends items to
one SDK session through ``FleetstoreSession`` while the test compacts it.

    python tests/agents/agents_compaction_agent.py PATH --session ID --tag T --count N
        --barrier FILE

Waits on the barrier (a shared flock the test holds exclusively), then appends
``{"role": "user", "content": "T-i"}`` for i in 0..N-1, one ``add_items`` each,
with a short pause between, and prints ``done N``.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import random

import fleetstore
from fleetstore.integrations.openai_agents import FleetstoreSession


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--session", required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--barrier", required=True)
    args = parser.parse_args()
    fd = os.open(args.barrier, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    with fleetstore.open(args.path) as store:
        session = FleetstoreSession(args.session, store)
        for i in range(args.count):
            await session.add_items([{"role": "user", "content": f"{args.tag}-{i}"}])
            await asyncio.sleep(random.uniform(0.0, 0.01))
        session.close()
    print(f"done {args.count}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
