"""An agent of the maintenance-under-load test: ``python tests/agents/maintain_agent.py PATH --stop FILE``.

It writes like an agent (a session, user and assistant messages, now and then a
200 KB tool output stored as a blob, a state put) against ``fleetstore.open(PATH)``
with ``on_busy="raise"``, so a write that cannot take the lock within the budget
fails loudly instead of going to the spool.  Each write's duration is measured
around the call.  Prints ``ready`` once open, runs until the ``--stop`` file
exists, then prints one JSON line: writes, failures (with the first errors), and
the longest write.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import fleetstore


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--stop", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=30.0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    store = fleetstore.open(args.path, on_busy="raise", write_budget=args.budget)
    print("ready", flush=True)
    writes = failures = 0
    errors: list[str] = []
    longest = 0.0
    session = None
    turns = 0
    while not os.path.exists(args.stop):
        started = time.monotonic()
        try:
            if session is None or turns >= 6:
                session = store.sessions.create(title=f"agent {args.seed}", project="/load")
                turns = 0
            elif rng.random() < 0.1:
                output = os.urandom(200 * 1024)
                store.messages.append(
                    session.id,
                    role="tool",
                    parts=[fleetstore.ToolResult("call", output)],
                )
            elif rng.random() < 0.1:
                store.state.put(session.id, "plan", {"turn": turns})
            else:
                role = "user" if turns % 2 == 0 else "assistant"
                store.messages.append(
                    session.id, role=role, parts=[fleetstore.Text("word " * rng.randint(5, 200))]
                )
                turns += 1
            writes += 1
        except fleetstore.FleetstoreError as exc:
            failures += 1
            if len(errors) < 5:
                errors.append(f"{type(exc).__name__}: {exc}")
        longest = max(longest, time.monotonic() - started)
        time.sleep(rng.expovariate(1 / 0.01))
    store.close()
    print(
        json.dumps({"writes": writes, "failures": failures, "errors": errors, "max_write": longest})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
