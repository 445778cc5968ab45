"""fleetstore-stress: ``fleetstore stress``, a fleet of agent processes against a store
and the patterns other agent tools ship, read back and reported.  A distribution of
its own (stress/pyproject.toml), never imported by the fleetstore library: the
``fleetstore`` command finds it through the ``fleetstore.commands`` entry point."""
