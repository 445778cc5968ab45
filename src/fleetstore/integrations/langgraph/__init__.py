"""LangGraph: ``FleetstoreSaver``, a checkpointer (``adapter``); importing a
``SqliteSaver`` file (``importer``, ``fleetstore import --from langgraph-sqlite``),
which ``reader`` reads.  The graph checkpoints' operations are the domain's
(``fleetstore.domain.langgraph``).

Importing this package imports LangGraph (``MissingDependency`` without the
``langgraph`` extra), as ``fleetstore.integrations.langgraph`` always did.
"""

from fleetstore.integrations.langgraph.adapter import DEFAULT_THREADS, FleetstoreSaver

__all__ = ["DEFAULT_THREADS", "FleetstoreSaver"]
