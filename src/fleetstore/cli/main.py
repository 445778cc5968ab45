"""The ``fleetstore`` command: the ``main`` group, ``--version``, and every command
registered on it.  Each command group is a module of fleetstore.cli of its own.

Every option can also be set by the ``FLEETSTORE_*`` variable shown in
``--help``; every command documents its exit codes, and none exits 0 on failure.
The commands are thin: the work lives in ``fleetstore.admin``.
"""

from __future__ import annotations

import click

import fleetstore
from fleetstore.cli.doctor import doctor_command
from fleetstore.cli.effects import effects
from fleetstore.cli.lock import lock
from fleetstore.cli.maintain import maintain_command
from fleetstore.cli.migrate import migrate_command
from fleetstore.cli.recover import recover
from fleetstore.cli.reshard import archive_tree_command, reshard_command, restore_tree_command
from fleetstore.cli.scan import scan_command
from fleetstore.cli.sessions import sessions
from fleetstore.cli.stats import stats_command
from fleetstore.cli.stress import stress_command
from fleetstore.cli.top import top
from fleetstore.cli.transfer import export_command, import_command, merge_command
from fleetstore.cli.worker import worker

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(
    context_settings=CONTEXT,
    epilog="""\b
Exit codes: 0 success; 1 the command failed (see its --help); 2 bad usage.
Run `fleetstore COMMAND --help` for a command's options and exit codes.""",
)
@click.version_option(
    fleetstore.__version__, "--version", prog_name="fleetstore", message="%(prog)s %(version)s"
)
def main() -> None:
    """fleetstore: session storage a fleet of agent processes can write at once.

    Commands for a fleetstore store: one SQLite file, a sharded directory
    (sqlite+sharded:///DIR) or a PostgreSQL database (postgresql://...). doctor,
    maintain, reshard and top work on SQLite stores only. doctor and lock also work
    on any SQLite file, fleetstore's or another program's; so do maintain's generic
    steps (with --yes, on a file in WAL mode).
    """


main.add_command(lock)
main.add_command(stress_command)
main.add_command(recover)
main.add_command(export_command)
main.add_command(import_command)
main.add_command(merge_command)
main.add_command(effects)
main.add_command(worker)
main.add_command(top)
main.add_command(doctor_command, "doctor")
main.add_command(maintain_command)
main.add_command(migrate_command)
main.add_command(reshard_command)
sessions.add_command(archive_tree_command)
sessions.add_command(restore_tree_command)
main.add_command(sessions)
main.add_command(stats_command)
main.add_command(scan_command)
