"""``fleetstore maintain`` (the steps are split out of ``run`` in the next commit)."""
