"""The path of ``fleetstore.integrations.openai_agents.encrypted`` before each framework had a
folder of its own (issue 26), kept for code that imports it."""

from fleetstore.integrations.openai_agents.encrypted import *  # noqa: F403
from fleetstore.integrations.openai_agents.encrypted import __all__ as __all__
