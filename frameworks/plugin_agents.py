"""pytest plugin: the OpenAI Agents SDK's own session tests, on fleetstore's session.

The SDK's tests build their store as ``SQLiteSession(session_id, db_path, ...)``
(in fixtures such as ``backend`` and ``underlying_session``, and inline).  This
plugin rebinds that name, in each selected test module, to ``SQLiteSessionOnFleetstore``:
a ``FleetstoreSession`` taking ``SQLiteSession``'s arguments, whose *db_path* is a
fleetstore store (``:memory:``: a fresh one in a temporary folder).  It rebinds
``EncryptedSession`` to fleetstore's subclass
(``fleetstore.integrations.openai_agents.encrypted``), whose pop authenticates over
fleetstore as the SDK's does over SQLite.  The ``async-sqlite`` parameter of
``test_compaction_suffix.py``'s ``backend`` would run the same session again: it is
deselected.  Nothing of the SDK's files is changed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from expected import deselect, mark_expected

from fleetstore.integrations.openai_agents import FleetstoreSession
from fleetstore.integrations.openai_agents.encrypted import EncryptedSession


class SQLiteSessionOnFleetstore(FleetstoreSession):
    """``SQLiteSession``'s constructor over a fleetstore store at *db_path*."""

    def __init__(
        self,
        session_id: str,
        db_path: str | Path = ":memory:",
        sessions_table: str = "agent_sessions",
        messages_table: str = "agent_messages",
        session_settings: Any = None,
    ) -> None:
        self._scratch = None
        if str(db_path) == ":memory:":
            self._scratch = tempfile.mkdtemp(prefix="fleetstore-agents-")
            path: str | Path = os.path.join(self._scratch, "sessions.db")
        else:
            path = db_path
        super().__init__(session_id, path, session_settings=session_settings)
        self.db_path = db_path

    def close(self) -> None:
        super().close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)


SWAPS = {"SQLiteSession": SQLiteSessionOnFleetstore, "EncryptedSession": EncryptedSession}

# Some of the SDK's tests read the file with the stdlib's sqlite3 beside fleetstore's
# (marked expected failures: TABLES).  That is a second SQLite library in one process:
# POSIX locks are per process, so its connection's close can reset the -shm that a
# search indexer thread of the same file is reading, and the run died of SIGBUS
# (docs/caveats.md).  No test here searches: the stores index nothing in this process.
os.environ["FLEETSTORE_SEARCH_INDEX"] = "0"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        params = getattr(item, "callspec", None)
        if params is not None and params.params.get("backend") is True:
            drop.append(item)  # AsyncSQLiteSession: the same fleetstore session again
            continue
        keep.append(item)
        module = getattr(item, "module", None)
        if module is not None:
            for name, swap in SWAPS.items():
                if name in vars(module):
                    setattr(module, name, swap)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
    deselect("agents", config, items)
    mark_expected("agents", items)
