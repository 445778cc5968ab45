"""The ``fleetstore`` command: one module per command group, thin over admin/."""

from fleetstore.cli.main import main

__all__ = ["main"]
