"""Import the OpenAI Agents SDK's ``SQLiteSession`` files into a store.  The importer
lives with the other transfers (``fleetstore.transfer.frameworks.openai_agents``); this
module keeps its public name."""

from fleetstore.transfer.frameworks.openai_agents import (
    ImportNotVerified,
    ImportSummary,
    import_sqlite,
    imported_id,
)

__all__ = ["ImportNotVerified", "ImportSummary", "import_sqlite", "imported_id"]
