"""Engines: the only code that knows a database driver."""
