"""``fleetstore stress``: a fleet of agent processes against a store, then the read-back
(the work is in fleetstore_stress.fleet).  fleetstore finds this command through the
``fleetstore.commands`` entry point (stress/pyproject.toml); ``python -m
fleetstore_stress`` runs it too."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from fleetstore.cli.main import CONTEXT
from fleetstore.cli.util import emit_json, json_option
from fleetstore.errors import ConfigError, FleetstoreError

if TYPE_CHECKING:
    from fleetstore_stress.config import ExternalLock


def _parse_external_locks(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[ExternalLock, ...]:
    from fleetstore_stress import fleet as stress

    try:
        return tuple(stress.ExternalLock.parse(v) for v in values)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


@click.command(
    name="stress",
    # The fleetstore command's own (-h, width) when run as python -m fleetstore_stress.
    context_settings=CONTEXT,
    epilog="""\b
Exit codes:
  0    fleetstore failed no turn and the read-back found every acknowledged write
       exactly once, in order, intact; no effect stuck; integrity ok (the peers of
       --compare are reported, their failures do not change the exit code)
  1    fleetstore failed a turn, lost, duplicated, reordered or damaged a write, left
       an effect stuck, a process crashed, integrity_check failed (any file of a
       sharded store), a sharded store's catalog disagreed with its shards, or the
       run could not be carried out
  2    bad usage, before any process starts (an option out of range, a --url
       that is not a store URL or path, an unknown --targets name, unparsable
       --external-lock)
  130  interrupted (Ctrl-C or SIGTERM); every child process is killed first""",
)
@click.option(
    "--agents",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    envvar="FLEETSTORE_STRESS_AGENTS",
    show_envvar=True,
    help="Agent processes living sessions at once (per target).",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    envvar="FLEETSTORE_STRESS_DURATION",
    show_envvar=True,
    help="Seconds each target runs, from a common start after all agents are ready.",
)
@click.option(
    "--think-ms",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    envvar="FLEETSTORE_STRESS_THINK_MS",
    show_envvar=True,
    help="Mean think time before each turn and while each tool runs (exponential); "
    "0 is a closed loop.",
)
@click.option(
    "--url",
    default=None,
    envvar="FLEETSTORE_STRESS_URL",
    show_envvar=True,
    help="The fleetstore target: a path, sqlite:///path, sqlite+sharded:///directory or "
    "postgresql://... "
    "Default: a fresh fleetstore.db under --dir.",
)
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=str),
    default=None,
    envvar="FLEETSTORE_STRESS_DIR",
    show_envvar=True,
    help="Where each target's directory (files, agent journals) goes. "
    "Default: DATA_DIR/stress/run-<timestamp>-<pid>.",
)
@click.option(
    "--output-bytes",
    type=click.IntRange(min=1),
    default=2000,
    show_default=True,
    envvar="FLEETSTORE_STRESS_OUTPUT_BYTES",
    show_envvar=True,
    help="Median size of a tool output (log-normal, capped at 256 KiB).",
)
@click.option(
    "--large-rate",
    type=click.FloatRange(min=0, max=1),
    default=0.02,
    show_default=True,
    envvar="FLEETSTORE_STRESS_LARGE_RATE",
    show_envvar=True,
    help="Fraction of tool outputs that are large: log-uniform from 1 MiB to --large-bytes.",
)
@click.option(
    "--large-bytes",
    type=click.IntRange(min=0),
    default=8 * 1024 * 1024,
    show_default=True,
    envvar="FLEETSTORE_STRESS_LARGE_BYTES",
    show_envvar=True,
    help="Largest tool output.",
)
@click.option(
    "--synchronous",
    type=click.Choice(["NORMAL", "FULL", "EXTRA"], case_sensitive=False),
    default=None,
    envvar="FLEETSTORE_SYNCHRONOUS",
    show_envvar=True,
    help="SQLite synchronous mode of every target's connections. Default: the store's (NORMAL).",
)
@click.option(
    "--write-budget",
    type=click.FloatRange(min=0),
    default=None,
    envvar="FLEETSTORE_WRITE_BUDGET",
    show_envvar=True,
    help="fleetstore's write budget in the agents. Default: the store's (60).",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    envvar="FLEETSTORE_STRESS_SEED",
    show_envvar=True,
    help="Seed of the workload and the faults (reported, so a run can be repeated). "
    "Default: random.",
)
@click.option(
    "--external-lock",
    "external_locks",
    metavar="HOLD@AT",
    multiple=True,
    callback=_parse_external_locks,
    envvar="FLEETSTORE_STRESS_EXTERNAL_LOCK",
    show_envvar=True,
    help="HOLD@AT: at second AT of each target's run, start `fleetstore lock --store TARGET --hold "
    "HOLD` as a separate process (an outside writer). Repeatable; the variable takes "
    "several, separated by spaces.",
)
@click.option(
    "--kill-rate",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    envvar="FLEETSTORE_STRESS_KILL_RATE",
    show_envvar=True,
    help="SIGKILLs per second (a Poisson process on its own clock), of a random agent "
    "or worker, each restarted at once (a restart that fails before it is ready is "
    "tried again until the run ends); the rate achieved is reported.",
)
@click.option(
    "--maintain",
    is_flag=True,
    default=False,
    envvar="FLEETSTORE_STRESS_MAINTAIN",
    show_envvar=True,
    help="Run `fleetstore maintain` on the fleetstore target a third into the run.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    envvar="FLEETSTORE_STRESS_WORKERS",
    show_envvar=True,
    help="Outbox worker processes settling the agents' effects, 8 at a time each "
    "(fleetstore target).",
)
@click.option(
    "--compare",
    is_flag=True,
    default=False,
    envvar="FLEETSTORE_STRESS_COMPARE",
    show_envvar=True,
    help="Run the same workload, same seed, after fleetstore against t3code's, opencode's "
    "and zcode's SQLite patterns, the OpenAI Agents SDK's SQLiteSession and LangGraph's "
    "SqliteSaver (when installed), each in its own directory; one table.",
)
@click.option(
    "--targets",
    "target_names",
    metavar="NAME,...",
    default=None,
    envvar="FLEETSTORE_STRESS_TARGETS",
    show_envvar=True,
    help="The peers to run after fleetstore (which always runs first), comma-separated: "
    "t3code, opencode, zcode, agents-sdk, langgraph. Default with --compare: every "
    "installed one.",
)
@click.option(
    "--long-replies",
    is_flag=True,
    default=False,
    envvar="FLEETSTORE_STRESS_LONG_REPLIES",
    show_envvar=True,
    help="The growth scenario: every reply streamed in 200-400 deltas and every tool "
    "output in 20-60 chunks as it grows (a few ms apart).",
)
@click.option(
    "--drain-wait",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    envvar="FLEETSTORE_STRESS_DRAIN_WAIT",
    show_envvar=True,
    help="Once the agents stopped, wait up to this long for the outbox workers to settle "
    "the effects still pending (fleetstore target); the report says how long it waited.",
)
@click.option(
    "--hang-worker",
    is_flag=True,
    default=False,
    envvar="FLEETSTORE_STRESS_HANG_WORKER",
    show_envvar=True,
    help="Self-test of the outbox: one effect worker hangs on its first effect "
    "(fleetstore: worker 0 stops with SIGSTOP; t3code: agent 0's server's effect "
    "execution never returns).",
)
@click.option(
    "--drop-every",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    envvar="FLEETSTORE_STRESS_DROP_EVERY",
    show_envvar=True,
    help="Self-test: make the fleetstore target broken, skipping every Nth write while "
    "acknowledging it; the verdict must then fail. 0: off.",
)
@json_option("stress")
@click.option(
    "--report",
    "report_file",
    type=click.Path(dir_okay=False, path_type=str),
    default=None,
    envvar="FLEETSTORE_STRESS_REPORT",
    show_envvar=True,
    help="Also write a self-contained HTML report (no network) to this file.",
)
def stress_command(
    agents: int,
    duration: float,
    think_ms: float,
    url: str | None,
    directory: str | None,
    output_bytes: int,
    large_rate: float,
    large_bytes: int,
    synchronous: str | None,
    write_budget: float | None,
    seed: int | None,
    external_locks: tuple[ExternalLock, ...],
    kill_rate: float,
    maintain: bool,
    workers: int,
    compare: bool,
    target_names: str | None,
    long_replies: bool,
    hang_worker: bool,
    drain_wait: float,
    drop_every: int,
    as_json: bool,
    report_file: str | None,
) -> None:
    """Run a fleet of agent processes living real sessions, then check what was kept.

    Each agent is a separate OS process living turns until --duration ends: a
    user message, a streamed reply with a tool call (heavy-tailed output sizes),
    usage, a state checkpoint and an outbox effect, with think time between.
    Then a separate process reads the target back: every acknowledged turn
    there exactly once, in order, its tool output intact, no effect stuck
    running past its lease. Prints one table (or --json), one column per target:
    acknowledged and failed turns, lost, duplicated, turns/s, turn-persistence
    latency p50/p99/max, fairness, integrity; the effects of the targets with an
    outbox (stuck, lanes blocked, enqueue-to-settled); the bytes each SQLite target
    keeps (per turn, against the compressed payload). Progress goes to stderr.
    """
    from fleetstore_stress import fleet as stress

    config = stress.StressConfig(
        agents=agents,
        duration=duration,
        think_ms=think_ms,
        url=url,
        directory=directory,
        output_bytes=output_bytes,
        large_rate=large_rate,
        large_bytes=large_bytes,
        synchronous=synchronous.upper() if synchronous else None,
        write_budget=write_budget,
        seed=seed,
        external_locks=external_locks,
        kill_rate=kill_rate,
        maintain=maintain,
        workers=workers,
        compare=compare,
        drop_every=drop_every,
        targets=(
            None
            if target_names is None
            else tuple(n.strip() for n in target_names.split(",") if n.strip())
        ),
        long_replies=long_replies,
        hang_worker=hang_worker,
        drain_wait=drain_wait,
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
    if report_file:
        from fleetstore_stress import report as report_html

        report["report"] = report_html.write(report, report_file)
    if as_json:
        emit_json(report)
    else:
        click.echo(stress.format_report(report))
        if report_file:
            click.echo(f"report: {report['report']}")
    sys.exit(0 if report["verdict"] == "pass" else 1)
