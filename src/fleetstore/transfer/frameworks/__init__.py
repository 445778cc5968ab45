"""Reading the agent frameworks' own SQLite files into plain records; their importers
are ``fleetstore.integrations.*_import``."""
