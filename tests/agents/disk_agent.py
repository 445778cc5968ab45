"""An agent of the full-disk tests (tests/engine/test_full_disk.py)::

    disk_agent.py PATH BUDGET STOPFILE

Opens ``fleetstore.open(PATH, write_budget=BUDGET)``, creates a session and appends
messages of 2 KiB to it (every tenth of 100 KiB: a blob file) until STOPFILE exists.  Prints ``ready SESSION`` once its first
message is in, ``err CLASS SECONDS`` for each call that raised (and goes on), and at the
end ``done N SLOWEST``: the messages acknowledged (each call that returned), and the
longest any of those calls took.
"""

from __future__ import annotations

import os
import sys
import time

import fleetstore
from fleetstore import errors


def main(argv: list[str]) -> int:
    path, budget, stop = argv[0], float(argv[1]), argv[2]
    store = fleetstore.open(path, write_budget=budget)
    session = store.sessions.create(title=f"disk-{os.getpid()}")
    acked, slowest = 0, 0.0
    text, big = "x" * 2048, os.urandom(50 * 1024).hex()
    while not os.path.exists(stop):
        started = time.monotonic()
        body = big + str(acked) if acked % 10 == 9 else text
        try:
            store.messages.append(session.id, role="user", parts=[fleetstore.Text(body)])
        except errors.FleetstoreError as exc:
            print(f"err {type(exc).__name__} {time.monotonic() - started:.2f}", flush=True)
            time.sleep(0.05)
            continue
        acked += 1
        slowest = max(slowest, time.monotonic() - started)
        if acked == 1:
            print(f"ready {session.id}", flush=True)
        time.sleep(0.002)
    store.close()
    print(f"done {acked} {slowest:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
