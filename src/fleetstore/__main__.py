"""``python -m fleetstore`` runs the ``fleetstore`` command."""

from fleetstore.cli.main import main

if __name__ == "__main__":
    main(prog_name="fleetstore")
