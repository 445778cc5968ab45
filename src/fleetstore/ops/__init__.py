"""Operator tools behind the ``fleetstore`` command: ``lock``, ``stress``.

Kept free of imports so that ``python -m fleetstore.ops.stress`` (the stress
agents' entry point) starts without loading the other tools.
"""
