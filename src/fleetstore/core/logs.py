"""The library's loggers: ``fleetstore`` and its children (``fleetstore.worker``,
``fleetstore.adk``, ...).  A ``NullHandler`` on ``fleetstore`` keeps the library
silent (not even Python's last-resort handler prints its warnings) until the
application configures logging; the events an operator needs carry structured fields
(``extra=``: ``event``, ``store``, ...; docs/telemetry.md, "Logs").  Attached here, not
in ``fleetstore/__init__.py``: ``import fleetstore`` does not load ``logging``."""

from __future__ import annotations

import logging

logging.getLogger("fleetstore").addHandler(logging.NullHandler())


def logger(name: str = "fleetstore") -> logging.Logger:
    """The logger *name* (``fleetstore`` or a child of it)."""
    if name != "fleetstore" and not name.startswith("fleetstore."):
        raise ValueError(f"not a fleetstore logger: {name!r}")
    return logging.getLogger(name)


__all__ = ["logger"]
