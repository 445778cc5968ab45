"""The path of ``fleetstore.integrations.langgraph.importer`` before each framework had a
folder of its own (issue 26), kept for code that imports it."""

from fleetstore.integrations.langgraph.importer import *  # noqa: F403
from fleetstore.integrations.langgraph.importer import __all__ as __all__
