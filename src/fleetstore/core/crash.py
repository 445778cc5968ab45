"""The test suite's crash points: ``crash_point(name)`` SIGKILLs this process there when
``FLEETSTORE_TEST_CRASH`` (read once, at import) names it, or SIGSTOPs it when the
variable names ``stop:NAME`` (a process frozen by a debugger or a cgroup).  Several
points: ``FLEETSTORE_TEST_CRASH=a,b``.  Unset (every real run), a point is one
function call that tests an empty set.  The tests that kill processes at these points
are the end-to-end checks of what a crash there leaves behind (tests/engine/
test_group_commit.py, tests/store/test_sharded.py, tests/transfer/test_reshard.py)."""

from __future__ import annotations

import os
import signal

#: The variable naming the points (comma-separated).
CRASH_ENV = "FLEETSTORE_TEST_CRASH"
#: The points it names (empty unless a test set it).
POINTS = frozenset(p.strip() for p in os.environ.get(CRASH_ENV, "").split(",") if p.strip())


def crash_point(name: str) -> None:
    if POINTS:
        if name in POINTS:
            os.kill(os.getpid(), signal.SIGKILL)
        elif "stop:" + name in POINTS:
            os.kill(os.getpid(), signal.SIGSTOP)


__all__ = ["CRASH_ENV", "POINTS", "crash_point"]
