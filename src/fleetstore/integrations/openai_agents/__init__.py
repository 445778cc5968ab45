"""The OpenAI Agents SDK: ``FleetstoreSession``, a session (``adapter``;
``encrypted``: the SDK's ``EncryptedSession`` over it); importing a
``SQLiteSession`` file (``importer``, ``fleetstore import --from
openai-agents-sqlite``), which ``reader`` reads.  The sessions' operations are the
domain's (``fleetstore.domain.openai_agents``).

The adapter's names are imported on first use, not with the package: the importer
and the reader do not need the SDK (``import --from openai-agents-sqlite`` works
without it), and importing them imports this package first.  Without the
``openai-agents`` extra, ``from fleetstore.integrations.openai_agents import
FleetstoreSession`` raises ``MissingDependency`` (tests/cli/test_extras.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetstore.integrations.openai_agents.adapter import (
        DEFAULT_THREADS,
        AgentSession,
        CompactionConflict,
        FleetstoreSession,
        InvalidItem,
        InvalidSessionSettings,
        SessionClosed,
        SessionPage,
        alist_sessions,
        list_sessions,
    )

__all__ = [
    "DEFAULT_THREADS",
    "AgentSession",
    "CompactionConflict",
    "FleetstoreSession",
    "InvalidItem",
    "InvalidSessionSettings",
    "SessionClosed",
    "SessionPage",
    "alist_sessions",
    "list_sessions",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(f"{__name__}.adapter"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
