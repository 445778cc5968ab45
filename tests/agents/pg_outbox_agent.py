"""tests/agents/outbox_agent.py on a PostgreSQL store: the same worker and handlers, with its
end-of-run check "which of this process's connections are inside a transaction" asked
of the server (``pg_stat_activity``) instead of SQLite connection objects.

``python tests/agents/pg_outbox_agent.py worker URL --events FILE --markers DIR [options]``
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import outbox_agent

import fleetstore

SESSIONS = """
SELECT pid, state, pid = pg_backend_pid(), xact_start FROM pg_stat_activity
WHERE application_name = ?
"""

#: Looks, and seconds between them: a transaction left open stays open through all of
#: them, while one that another thread of this process (the search indexer, a gauge's
#: read) is running between two statements shows as "idle in transaction" for a moment.
LOOKS, EVERY = 5, 0.25


def connections_in_transaction(store: fleetstore.Store) -> list[str]:
    """This process's server sessions left inside a transaction (``idle in transaction``):
    a connection the engine returned to its pool without ending its transaction."""
    # The engine names its sessions after the process (application_name); the session
    # running this query must be among them, or the check would look at nothing.
    me = f"fleetstore pid {os.getpid()}"
    left: dict[tuple[int, Any], str] | None = None
    for look in range(LOOKS):
        if look:
            time.sleep(EVERY)
        rows: list[Any] = store.read(lambda tx: tx.execute(SESSIONS, (me,)))
        if not any(own for _pid, _state, own, _start in rows):
            return [f"no server session named {me!r}: the check sees nothing"]
        now = {
            (pid, start): f"backend {pid}: {state}"
            for pid, state, _own, start in rows
            if "transaction" in str(state)
        }
        left = now if left is None else {k: v for k, v in now.items() if k in left}
    return sorted((left or {}).values())


if __name__ == "__main__":
    outbox_agent.connections_in_transaction = connections_in_transaction
    sys.exit(outbox_agent.main(sys.argv[1:]))
