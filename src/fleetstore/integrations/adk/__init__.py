"""Google ADK: ``FleetstoreSessionService``, a session service (``adapter``);
importing an ADK session file (``importer``, ``fleetstore import --from
adk-sqlite``), which ``reader`` reads.  The sessions' operations are the domain's
(``fleetstore.domain.adk``).

Importing this package imports ADK (``MissingDependency`` without the ``adk``
extra), as ``fleetstore.integrations.adk`` always did.
"""

from fleetstore.integrations.adk.adapter import (
    DEFAULT_THREADS,
    EVENT_ORDERS,
    FleetstoreSessionService,
    SessionExists,
    SessionNotFound,
    SessionPage,
    StaleSession,
)

__all__ = [
    "DEFAULT_THREADS",
    "EVENT_ORDERS",
    "FleetstoreSessionService",
    "SessionExists",
    "SessionNotFound",
    "SessionPage",
    "StaleSession",
]
