"""Moving stores: export, import, merge, migrate, reshard, archiving a session tree,
and importing the frameworks' own SQLite files."""
