"""``python -m fleetstore_stress``: the same command as ``fleetstore stress``."""

from fleetstore_stress.cli import stress_command

if __name__ == "__main__":
    stress_command(prog_name="fleetstore stress")
