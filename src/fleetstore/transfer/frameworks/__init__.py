"""Importers of the agent frameworks' own SQLite files."""
