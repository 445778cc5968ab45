"""Moving stores: export, import, merge, migrate, reshard, and importing the
frameworks' own SQLite files."""
