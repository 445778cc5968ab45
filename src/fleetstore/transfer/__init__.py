"""Moving stores: export, import, merge, migrate, reshard, archiving a session tree,
and reading the frameworks' own SQLite files (for ``fleetstore.integrations``'
importers)."""
