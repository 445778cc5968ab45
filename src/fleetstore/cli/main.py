"""The ``fleetstore`` command: the ``main`` group, ``--version``, and every command
registered on it.  Each command group is a module of fleetstore.cli of its own,
imported when the command is used (``COMMANDS``); a command another distribution
adds (``fleetstore stress``, from fleetstore-stress) is found through the
``PLUGINS`` entry-point group.

Every option can also be set by the ``FLEETSTORE_*`` variable shown in
``--help``; every command documents its exit codes, and none exits 0 on failure.
Every command names its store the same way (``--store``, util.store_params) and
prints the same JSON shapes (``--json``, util.json_option).  The commands are thin:
the work lives in ``fleetstore.admin``.
"""

from __future__ import annotations

import os
from typing import Any

import click
from click.core import ParameterSource

from fleetstore.cli.util import KEY_FILE_ENV, STORE_ENV, LazyGroup
from fleetstore.core.version import __version__
from fleetstore.errors import MissingDependency

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

#: Every command: the module:attribute that defines it.
COMMANDS = {
    "backup": "fleetstore.cli.backup:backup_command",
    "doctor": "fleetstore.cli.doctor:doctor_command",
    "effects": "fleetstore.cli.effects:effects",
    "export": "fleetstore.cli.transfer:export_command",
    "import": "fleetstore.cli.transfer:import_command",
    "index": "fleetstore.cli.search:index_command",
    "lock": "fleetstore.cli.lock:lock",
    "maintain": "fleetstore.cli.maintain:maintain_command",
    "metrics": "fleetstore.cli.metrics:metrics_command",
    "merge": "fleetstore.cli.transfer:merge_command",
    "migrate": "fleetstore.cli.migrate:migrate_command",
    "recover": "fleetstore.cli.recover:recover",
    "redact": "fleetstore.cli.redact:redact_command",
    "rekey": "fleetstore.cli.rekey:rekey_command",
    "reshard": "fleetstore.cli.reshard:reshard_command",
    "restore": "fleetstore.cli.backup:restore_command",
    "scan": "fleetstore.cli.scan:scan_command",
    "search": "fleetstore.cli.search:search_command",
    "sessions": "fleetstore.cli.sessions:sessions",
    "stats": "fleetstore.cli.stats:stats_command",
    "top": "fleetstore.cli.top:top",
    "worker": "fleetstore.cli.worker:worker",
}

#: The entry-point group where a distribution of its own adds commands: fleetstore-stress
#: adds ``stress`` (stress/pyproject.toml).  The library never imports the harness.
PLUGINS = "fleetstore.commands"

#: The commands of other distributions that fleetstore names, and the extra that
#: installs each: without it the command is one line naming the ``pip install``.
OPTIONAL = {"stress": "stress"}


class Main(LazyGroup):
    """The root group: a missing optional dependency is one line naming its ``pip
    install`` (exit 1), never a traceback (tests/cli/test_extras.py)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MissingDependency as exc:
            command = " ".join(filter(None, ["fleetstore", ctx.invoked_subcommand]))
            click.echo(f"{command}: {exc}", err=True)
            ctx.exit(1)


@click.group(
    cls=Main,
    lazy=COMMANDS,
    plugins=PLUGINS,
    optional=OPTIONAL,
    context_settings=CONTEXT,
    epilog="""\b
Exit codes: 0 success; 1 the command failed (see its --help), or an optional
dependency it needs is not installed (one line names the pip install); 2 bad usage,
or a command whose package is not installed (stress: one line names the pip install).
Run `fleetstore COMMAND --help` for a command's options and exit codes.""",
)
@click.version_option(
    __version__, "--version", prog_name="fleetstore", message="%(prog)s %(version)s"
)
@click.option(
    "--store",
    metavar="PATH",
    default=None,
    envvar=STORE_ENV,
    show_envvar=True,
    help="The store of the command that follows, as if given to it as --store "
    "(its own --store wins).",
)
@click.option(
    "-v",
    "--verbose",
    count=True,
    envvar="FLEETSTORE_VERBOSE",
    show_envvar=True,
    help="Log more of what the library does on stderr: -v INFO, -vv DEBUG (default: "
    "warnings and errors).",
)
@click.option(
    "-q",
    "--quiet",
    count=True,
    envvar="FLEETSTORE_QUIET",
    show_envvar=True,
    help="Log less: -q errors only, -qq critical only.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    envvar="FLEETSTORE_LOG_FORMAT",
    show_envvar=True,
    help="The log on stderr as text, or as one JSON object a line with each record's "
    "fields (event, store, operation, ...).",
)
@click.option(
    "--key-file",
    metavar="FILE",
    default=None,
    envvar=KEY_FILE_ENV,
    show_envvar=True,
    help="The keyring of an encrypted store (docs/secrets.md): every command opens its "
    "stores with it, and what a command writes of an encrypted store (exports, backups, "
    "archives) is encrypted with its current key.",
)
@click.pass_context
def main(
    ctx: click.Context,
    store: str | None,
    verbose: int,
    quiet: int,
    log_format: str,
    key_file: str | None,
) -> None:
    """fleetstore: session storage a fleet of agent processes can write at once.

    Commands for a fleetstore store: one SQLite file, a sharded directory
    (sqlite+sharded:///DIR) or a PostgreSQL database (postgresql://...). Every command
    names its store with --store PATH (default $FLEETSTORE_URL, else the default
    store), and prints JSON with --json: JSON lines for a list, one object otherwise.
    doctor, maintain, reshard and top work on SQLite stores only. doctor and lock also
    work on any SQLite file, fleetstore's or another program's; so do maintain's
    generic steps (with --yes, on a file in WAL mode).
    """
    from fleetstore.cli import logs

    logs.configure(verbose, quiet, log_format)
    if key_file:
        # Every store the command opens reads its settings from the environment.
        os.environ[KEY_FILE_ENV] = key_file
    # The group's --store before a command that takes none (merge, migrate, reshard
    # name their stores as arguments; stress has --url) would be silently ignored.
    name = ctx.invoked_subcommand
    if name and ctx.get_parameter_source("store") is ParameterSource.COMMANDLINE:
        command = ctx.command.get_command(ctx, name)  # type: ignore[attr-defined]
        takes = command is None or isinstance(command, click.Group)
        if not takes and "store" not in {p.name for p in command.params}:
            raise click.UsageError(
                f"fleetstore {name} does not take --store: its --help says how it names its stores",
                ctx,
            )
