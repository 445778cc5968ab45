"""Import ADK's own session files (``DatabaseSessionService`` / ``SqliteSessionService``
SQLite files) into a store.  The importer lives with the other transfers
(``fleetstore.transfer.frameworks.adk``); this module keeps its public name."""

from fleetstore.transfer.frameworks.adk import AdkImportSummary, import_adk_sqlite

__all__ = ["AdkImportSummary", "import_adk_sqlite"]
