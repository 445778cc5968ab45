"""Import LangGraph ``SqliteSaver`` checkpoint files into a store.  The importer lives
with the other transfers (``fleetstore.transfer.frameworks.langgraph``); this module
keeps its public name."""

from fleetstore.transfer.frameworks.langgraph import (
    LangGraphImportSummary,
    import_langgraph_sqlite,
)

__all__ = ["LangGraphImportSummary", "import_langgraph_sqlite"]
