"""The ``fleetstore`` command.

Every option can also be set by the ``FLEETSTORE_*`` variable shown in
``--help``; every command documents its exit codes, and none exits 0 on failure.
The commands are thin: the work lives in ``fleetstore.ops``.
"""

from __future__ import annotations

import json
import sys

import click

import fleetstore
from fleetstore.errors import ConfigError, FleetstoreError
from fleetstore.ops import lockdriver, stress

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

    Operator tools for fleetstore databases (SQLite files).
    """


@main.command(
    epilog="""\b
Exit codes:
  0  the lock was taken, held and released (also when SIGTERM/SIGINT ended the hold)
  1  SQLite error (not a database, I/O error)
  2  bad usage, or PATH is not an existing file (lock never creates a database)
  3  the lock was not taken within --wait seconds (or a signal arrived while waiting)""",
)
@click.argument("path", type=click.Path(dir_okay=True, path_type=str))
@click.option(
    "--hold",
    type=click.FloatRange(min=0),
    required=True,
    envvar="FLEETSTORE_LOCK_HOLD",
    show_envvar=True,
    help="Seconds to hold the lock once taken ('inf': until SIGTERM/SIGINT).",
)
@click.option(
    "--exclusive",
    is_flag=True,
    default=False,
    envvar="FLEETSTORE_LOCK_EXCLUSIVE",
    show_envvar=True,
    help="BEGIN EXCLUSIVE instead of BEGIN IMMEDIATE (also keeps out readers of a "
    "non-WAL database).",
)
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    envvar="FLEETSTORE_LOCK_WAIT",
    show_envvar=True,
    help="Seconds to wait for the lock before giving up (exit 3).",
)
def lock(path: str, hold: float, exclusive: bool, wait: float) -> None:
    """Hold PATH's write lock as a process that does not use fleetstore would.

    Opens PATH with raw apsw (not through fleetstore's writer gate), runs BEGIN
    IMMEDIATE, prints `locked PATH pid=PID`, holds the lock for --hold seconds,
    rolls back and prints `released PATH after X.XXs`. SIGTERM and SIGINT release
    the lock early. Use it to test how any program copes with a busy database.
    """
    sys.exit(lockdriver.hold_lock(path, hold, exclusive=exclusive, wait=wait))


def _parse_external_locks(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[stress.ExternalLock, ...]:
    try:
        return tuple(stress.ExternalLock.parse(v) for v in values)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


@main.command(
    name="stress",
    epilog="""\b
Exit codes:
  0    every write acknowledged: none failed, none lost, none duplicated, integrity ok
  1    some write failed, was lost or duplicated, an agent crashed, integrity_check
       failed, or the run could not be carried out
  2    bad usage (an option out of range, unparsable --external-lock)
  130  interrupted (Ctrl-C or SIGTERM); every child process is killed first""",
)
@click.option(
    "--agents",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    envvar="FLEETSTORE_STRESS_AGENTS",
    show_envvar=True,
    help="Agent processes writing at once.",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    envvar="FLEETSTORE_STRESS_DURATION",
    show_envvar=True,
    help="Seconds every agent writes, from a common start after all have opened the store.",
)
@click.option(
    "--think-ms",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    envvar="FLEETSTORE_STRESS_THINK_MS",
    show_envvar=True,
    help="Mean think time before each write, exponentially distributed; 0 is a closed loop.",
)
@click.option(
    "--path",
    type=click.Path(dir_okay=False, path_type=str),
    default=None,
    envvar="FLEETSTORE_STRESS_PATH",
    show_envvar=True,
    help="Database file (created if missing; rows of earlier runs are left out of the "
    "check). Default: DATA_DIR/stress/stress-<timestamp>-<pid>.db.",
)
@click.option(
    "--payload-bytes",
    type=click.IntRange(min=0),
    default=200,
    show_default=True,
    envvar="FLEETSTORE_STRESS_PAYLOAD_BYTES",
    show_envvar=True,
    help="Size of each write's payload.",
)
@click.option(
    "--large-rate",
    type=click.FloatRange(min=0, max=1),
    default=0.0,
    show_default=True,
    envvar="FLEETSTORE_STRESS_LARGE_RATE",
    show_envvar=True,
    help="Fraction of writes that carry --large-bytes inline instead.",
)
@click.option(
    "--large-bytes",
    type=click.IntRange(min=0),
    default=4 * 1024 * 1024,
    show_default=True,
    envvar="FLEETSTORE_STRESS_LARGE_BYTES",
    show_envvar=True,
    help="Size of a large payload.",
)
@click.option(
    "--synchronous",
    type=click.Choice(["NORMAL", "FULL", "EXTRA"], case_sensitive=False),
    default=None,
    envvar="FLEETSTORE_SYNCHRONOUS",
    show_envvar=True,
    help="SQLite synchronous mode of the agents' connections. Default: the store's (NORMAL).",
)
@click.option(
    "--write-budget",
    type=click.FloatRange(min=0),
    default=None,
    envvar="FLEETSTORE_WRITE_BUDGET",
    show_envvar=True,
    help="Seconds a write may wait for the lock before StoreBusy. Default: the store's (60).",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    envvar="FLEETSTORE_STRESS_SEED",
    show_envvar=True,
    help="Seed for think times and payloads (reported, so a run can be repeated). Default: random.",
)
@click.option(
    "--external-lock",
    "external_locks",
    metavar="HOLD@AT",
    multiple=True,
    callback=_parse_external_locks,
    envvar="FLEETSTORE_STRESS_EXTERNAL_LOCK",
    show_envvar=True,
    help="HOLD@AT: at second AT of the run, start `fleetstore lock PATH --hold HOLD` as a "
    "separate process (an outside writer that does not use fleetstore). Repeatable; the "
    "variable takes several, separated by spaces.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    default=False,
    envvar="FLEETSTORE_STRESS_JSON",
    show_envvar=True,
    help="Print the result as JSON on stdout instead of the table.",
)
def stress_command(
    agents: int,
    duration: float,
    think_ms: float,
    path: str | None,
    payload_bytes: int,
    large_rate: float,
    large_bytes: int,
    synchronous: str | None,
    write_budget: float | None,
    seed: int | None,
    external_locks: tuple[stress.ExternalLock, ...],
    as_json: bool,
) -> None:
    """Run N agent processes writing one database through fleetstore, then check it.

    Each agent is a separate OS process that inserts rows in `with db.write()`
    blocks, thinking between writes, until --duration ends. The file is then
    read back from disk: every acknowledged write must be there exactly once,
    no write may have failed, and PRAGMA integrity_check must be ok. Prints one
    table (or --json): acknowledged, failed, lost, duplicated, writes/s, lock
    wait p50/p99/max (from before write() to after commit), fairness (min/max
    acknowledged writes per agent), integrity. Progress goes to stderr.
    """
    config = stress.StressConfig(
        agents=agents,
        duration=duration,
        think_ms=think_ms,
        path=path,
        payload_bytes=payload_bytes,
        large_rate=large_rate,
        large_bytes=large_bytes,
        synchronous=synchronous.upper() if synchronous else None,
        write_budget=write_budget,
        seed=seed,
        external_locks=external_locks,
    )
    try:
        config.validate()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        report = stress.run(config, progress_stream=sys.stderr)
    except KeyboardInterrupt:
        click.echo("fleetstore stress: interrupted; agents stopped", err=True)
        sys.exit(130)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    except (stress.StressError, FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore stress: {exc}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(stress.format_report(report))
    sys.exit(0 if report["verdict"] == "pass" else 1)
