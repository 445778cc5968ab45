"""Adapters that let agent frameworks keep their state in a fleetstore store.

Each lives in its own module and imports its framework, which is an optional
dependency (``pip install 'fleetstore[langgraph]'``): importing this package
imports none of them.
"""
