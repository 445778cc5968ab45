"""``fleetstore stress``: a fleet of agent processes against a store and the
patterns agent tools ship, read back and reported."""
