"""The ``fleetstore`` command.

Every option can also be set by the ``FLEETSTORE_*`` variable shown in
``--help``; every command documents its exit codes, and none exits 0 on failure.
The commands are thin: the work lives in ``fleetstore.admin``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

import fleetstore
from fleetstore.admin import lock as lockdriver
from fleetstore.admin.stress import fleet as stress
from fleetstore.cli.doctor import doctor_command
from fleetstore.cli.maintain import maintain_command
from fleetstore.cli.migrate import migrate_command
from fleetstore.cli.reshard import archive_tree_command, reshard_command, restore_tree_command
from fleetstore.cli.sessions import sessions, stats_command
from fleetstore.cli.util import ProgressBars as _ProgressBars
from fleetstore.cli.util import env as _env
from fleetstore.cli.util import existing_store as _existing_store
from fleetstore.cli.util import size as _size
from fleetstore.cli.util import store_option as _store_option
from fleetstore.errors import ConfigError, FleetstoreError

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

    PATH may be a sharded store (sqlite+sharded:///DIR or DIR): its catalog and
    then every shard file are locked. PATH may be a postgresql:// URL: every
    table of the database is then locked IN EXCLUSIVE MODE (ACCESS EXCLUSIVE with --exclusive) from a connection of
    its own: reads go on, every write waits.
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
  0    fleetstore failed no turn and the read-back found every acknowledged write
       exactly once, in order, intact; no effect stuck; integrity ok (the peers of
       --compare are reported, their failures do not change the exit code)
  1    fleetstore failed a turn, lost, duplicated, reordered or damaged a write, left
       an effect stuck, a process crashed, integrity_check failed (any file of a
       sharded store), a sharded store's catalog disagreed with its shards, or the
       run could not be carried out
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
    help="HOLD@AT: at second AT of each target's run, start `fleetstore lock TARGET --hold "
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
    help="SIGKILLs per second, at random times, of a random agent or worker, each "
    "restarted at once.",
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
    help="Outbox worker processes settling the agents' effects (fleetstore target).",
)
@click.option(
    "--compare",
    is_flag=True,
    default=False,
    envvar="FLEETSTORE_STRESS_COMPARE",
    show_envvar=True,
    help="Run the same workload, same seed, after fleetstore against opencode's and "
    "zcode's SQLite patterns and the OpenAI Agents SDK's SQLiteSession (when installed), "
    "each in its own directory; one table.",
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
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    default=False,
    envvar="FLEETSTORE_STRESS_JSON",
    show_envvar=True,
    help="Print the result as JSON on stdout instead of the table.",
)
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
    external_locks: tuple[stress.ExternalLock, ...],
    kill_rate: float,
    maintain: bool,
    workers: int,
    compare: bool,
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
    latency p50/p99/max, fairness, integrity. Progress goes to stderr.
    """
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
        from fleetstore.admin.stress import report as report_html

        report["report"] = report_html.write(report, report_file)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(stress.format_report(report))
        if report_file:
            click.echo(f"report: {report['report']}")
    sys.exit(0 if report["verdict"] == "pass" else 1)


@main.command(
    epilog="""\b
Exit codes:
  0  every journal of a dead process was replayed and deleted, or there was none
     (journals of live processes are theirs to replay and are left alone)
  1  an operation was rejected (kept in STORE.spool/rejected.jsonl), a journal is
     damaged (kept), the replay stopped unfinished (the store stayed locked past
     the budget, or failed; the journal is kept), or the store could not be opened
  2  bad usage, or there is no store at PATH (nothing is created)""",
)
@click.argument("path", required=False, default=None, type=click.Path(path_type=str))
@click.option(
    "--write-budget",
    type=click.FloatRange(min=0),
    default=None,
    envvar="FLEETSTORE_WRITE_BUDGET",
    show_envvar=True,
    help="Seconds each replayed write may wait for the lock before the replay stops "
    "unfinished. Default: the store's (60).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    default=False,
    envvar="FLEETSTORE_RECOVER_JSON",
    show_envvar=True,
    help="Print the result as JSON on stdout instead of text.",
)
def recover(path: str | None, write_budget: float | None, as_json: bool) -> None:
    """Replay the spool journals that dead processes left beside a store.

    PATH is the store's file, a directory holding fleetstore.db, or
    sqlite:///absolute/path; default $FLEETSTORE_URL, else DATA_DIR/fleetstore.db.
    Each journal whose process is gone is replayed in order and deleted; a live
    process's journal is left alone (busy). A torn last line (a crash mid-append,
    never acknowledged) is ignored. Operations that can no longer apply are kept,
    with the reason, in STORE.spool/rejected.jsonl. Replaying twice changes nothing.
    """
    import logging

    from fleetstore.store.facade import recover_journals
    from fleetstore.store.spool import REJECTED, rejected_records

    # What the library logs about the replay is all in the report below.
    logging.getLogger("fleetstore").addHandler(logging.NullHandler())
    settings = {} if write_budget is None else {"write_budget": write_budget}
    try:
        store_path, results = recover_journals(path, **settings)
    except fleetstore.NotFound as exc:
        click.echo(f"fleetstore recover: {exc} (nothing was created)", err=True)
        sys.exit(2)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    except (FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore recover: {exc}", err=True)
        sys.exit(1)
    spool_dir = f"{store_path}.spool"
    rejected_file = f"{spool_dir}/{REJECTED}"
    in_file = rejected_records(spool_dir)
    failed = any(r.status in ("damaged", "unfinished") or r.rejected for r in results)
    if as_json:
        report = {
            "store": str(store_path),
            "journals": [r.to_json() for r in results],
            "replayed": sum(r.replayed for r in results),
            "rejected": sum(r.rejected for r in results),
            "rejected_file": rejected_file if in_file else None,
            "rejected_in_file": in_file,
            "ok": not failed,
        }
        click.echo(json.dumps(report, indent=2))
    else:
        if not results:
            click.echo(f"fleetstore recover: {store_path}: nothing to recover")
        else:
            click.echo(f"fleetstore recover: {store_path}")
        for r in results:
            name = r.journal.rsplit("/", 1)[-1]
            what = {
                "replayed": f"replayed {r.replayed} operation(s), journal deleted",
                "busy": "busy",
                "damaged": f"damaged, kept; replayed {r.replayed} operation(s)",
                "unfinished": f"unfinished, kept; replayed {r.replayed} operation(s)",
            }.get(r.status, r.status)
            click.echo(f"  {name}: {what}" + (f"; {r.detail}" if r.detail else ""))
            for rej in r.rejections:
                session = f" (session {rej.session_id})" if rej.session_id else ""
                click.echo(f"    rejected {rej.op} op {rej.op_id}{session}: {rej.error}")
        if in_file:
            click.echo(f"{rejected_file} holds {in_file} rejected operation(s) in all")
    sys.exit(1 if failed else 0)


# -- export / import / merge (fleetstore.transfer) -------------------------------------------


@main.command(
    name="export",
    epilog="""\b
Exit codes:
  0  the sessions were written to FILE
  1  a SESSION does not exist, a blob of the store is damaged, or FILE could not be
     written (FILE is then left as it was: the export goes to a temporary file first)
  2  bad usage, or there is no store at --store (nothing is created)""",
)
@click.argument("sessions", nargs=-1, metavar="[SESSION]...")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, allow_dash=True, path_type=str),
    envvar="FLEETSTORE_EXPORT_OUTPUT",
    show_envvar=True,
    help="The file to write ('-': standard output).",
)
@_store_option
def export_command(sessions: tuple[str, ...], output: str, store: str | None) -> None:
    """Write sessions, with their messages, state and blobs, to one file.

    All sessions of the store, or the SESSIONs given with their subagent trees.
    The file is zstd-compressed JSON lines: a versioned header, the blobs and
    the operations that recreate each session exactly, and a trailer with counts
    and a SHA-256 of everything before it. `fleetstore import` reads it back.
    """
    from fleetstore.transfer import stream as transfer

    path = _existing_store("export", store)
    if output == "-" and sys.stdout.isatty():
        raise click.UsageError("refusing to write compressed data to a terminal; use -o FILE")
    bars = _ProgressBars()
    try:
        with fleetstore.open(path) as opened:
            if output == "-":
                summary = transfer.export_store(
                    opened, sys.stdout.buffer, sessions or None, progress=bars
                )
                sys.stdout.buffer.flush()
            else:
                summary = transfer.export_store(opened, output, sessions or None, progress=bars)
    except (FleetstoreError, OSError) as exc:
        bars.close()
        click.echo(f"fleetstore export: {exc}", err=True)
        sys.exit(1)
    bars.close()
    click.echo(
        f"fleetstore export: {summary.sessions} sessions, {summary.messages} messages, "
        f"{summary.states} state values, {summary.blobs} blobs ({_size(summary.blob_bytes)}) "
        f"-> {'stdout' if output == '-' else output} ({_size(summary.file_bytes)})",
        err=output == "-",
    )


#: ``fleetstore import --from X``: the module of fleetstore.transfer.frameworks whose
#: run_cli reads X.
_FOREIGN_IMPORTERS = {
    "adk-sqlite": "adk",
    "openai-agents-sqlite": "openai_agents",
    "langgraph-sqlite": "langgraph",
}


@main.command(
    name="import",
    epilog="""\b
Exit codes:
  0  the file was imported (importing it again changes nothing)
  1  the file was rejected (malformed, damaged, truncated, hostile, a newer format;
     with --from openai-agents-sqlite: not an SDK session database, a row that is not
     a JSON object, a session the store holds with other items) or contradicts the
     store: nothing was imported; or the import stopped midway (the store stayed
     locked past the write budget): importing again is safe
  2  bad usage, or FILE does not exist""",
)
@click.argument(
    "file", type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=str)
)
@_store_option
@click.option(
    "--from",
    "source",
    type=click.Choice(["fleetstore", *_FOREIGN_IMPORTERS]),
    default="fleetstore",
    show_default=True,
    envvar="FLEETSTORE_IMPORT_FROM",
    show_envvar=True,
    help="What FILE is: a `fleetstore export` file, an ADK session database "
    "(the SQLite file of ADK's DatabaseSessionService or SqliteSessionService), or an "
    "OpenAI Agents SDK SQLiteSession database (tables agent_sessions, agent_messages), "
    "or a LangGraph SqliteSaver checkpoint file (tables checkpoints, writes).",
)
def import_command(file: str, store: str | None, source: str) -> None:
    """Import a file written by `fleetstore export` into a store (created if missing).

    The whole file is checked first: every record, every blob's hash and size,
    the trailer's counts and checksum, and that nothing in it contradicts the
    store. A file that fails any check is rejected whole and nothing is written.
    Objects already in the store and equal are left alone, so importing twice
    changes nothing; objects the store holds at an earlier stage (a lower version,
    a message still streaming) are brought forward. FILE '-' reads standard input.
    """
    if source in _FOREIGN_IMPORTERS:
        import importlib

        if file == "-":
            raise click.UsageError(f"--from {source} reads a file, not standard input")
        importer = importlib.import_module(
            f"fleetstore.transfer.frameworks.{_FOREIGN_IMPORTERS[source]}"
        )
        try:
            code = importer.run_cli(file, store)
        except ConfigError as exc:
            raise click.UsageError(str(exc)) from None
        sys.exit(code)
    import os
    import shutil
    import tempfile

    from fleetstore.transfer import stream as transfer

    bars = _ProgressBars()
    tmp: str | None = None
    try:
        with fleetstore.open(store) as opened:
            if file == "-":
                fd, tmp = tempfile.mkstemp(prefix=".fleetstore-import-", dir=opened.path.parent)
                with os.fdopen(fd, "wb") as fh:
                    shutil.copyfileobj(sys.stdin.buffer, fh)
            summary = transfer.import_file(opened, tmp or file, progress=bars)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    except fleetstore.StoreBusy as exc:
        bars.close()
        click.echo(
            f"fleetstore import: {exc}; the import stopped midway (what was imported stays; "
            "importing the file again is safe)",
            err=True,
        )
        sys.exit(1)
    except (FleetstoreError, OSError) as exc:
        bars.close()
        click.echo(f"fleetstore import: {exc}", err=True)
        sys.exit(1)
    finally:
        if tmp is not None:
            os.unlink(tmp)
    bars.close()
    click.echo(
        f"fleetstore import: {summary.sessions} sessions, {summary.messages} messages, "
        f"{summary.states} state values, {summary.blobs} blobs ({_size(summary.blob_bytes)}): "
        f"{summary.inserted} new, {summary.updated} brought forward, {summary.unchanged} "
        f"unchanged, {summary.newer} newer in the store"
    )


@main.command(
    name="merge",
    epilog="""\b
Exit codes:
  0  every session of every SRC is in DST exactly as exported, and every blob verifies
  1  verification failed (DST differs from what was exported, a SRC changed during
     the merge, a blob does not verify: each problem is printed), or an export was
     rejected, or a SRC contradicts DST (nothing of that SRC was imported)
  2  bad usage: fewer than two stores, a SRC that does not exist, a SRC that is DST""",
)
@click.argument("stores", nargs=-1, required=True, metavar="SRC... DST")
def merge_command(stores: tuple[str, ...]) -> None:
    """Bring every session of the SRC stores into DST (created if missing), verified.

    Each SRC is exported to a temporary file beside DST and imported (see
    `fleetstore import`); then each exported session is compared with DST
    (message count and a hash of its whole content) and with SRC as it is now,
    and every blob is verified in DST. Merging again changes nothing. For
    fleets that keep one store per worker during a run and merge afterwards.
    """
    import os

    from fleetstore.core.targets import resolve_target
    from fleetstore.transfer import stream as transfer

    if len(stores) < 2:
        raise click.UsageError("give at least one SRC and the DST")
    *sources, dest = stores
    try:
        dest_path = resolve_target(dest).resolve()
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    paths = [_existing_store("merge", s) for s in sources]
    for p in paths:
        if os.path.realpath(p) == str(dest_path):
            raise click.UsageError(f"{p} is both a SRC and the DST")
    bars = _ProgressBars()
    try:
        report = transfer.merge(paths, dest, progress=bars)
    except (FleetstoreError, OSError) as exc:
        bars.close()
        click.echo(f"fleetstore merge: {exc}", err=True)
        sys.exit(1)
    bars.close()
    for problem in report.problems:
        click.echo(f"fleetstore merge: {problem}", err=True)
    verdict = "verified" if report.ok else f"NOT verified ({len(report.problems)} problems)"
    click.echo(
        f"fleetstore merge: {len(report.sources)} stores, {report.sessions} sessions, "
        f"{report.messages} messages, {report.blobs} blobs ({_size(report.blob_bytes)}) "
        f"-> {report.dest}: {verdict}"
    )
    sys.exit(0 if report.ok else 1)


# -- the outbox ---------------------------------------------------------------------------------


def _effect_json(effect: fleetstore.Effect) -> dict[str, object]:
    import base64
    import dataclasses

    data = dataclasses.asdict(effect)
    data["state"] = effect.state.value
    if isinstance(effect.payload, bytes):
        data["payload"] = {"base64": base64.b64encode(effect.payload).decode("ascii")}
    return data


def _when(t: float | None) -> str:
    import datetime

    if t is None:
        return "-"
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _open_existing(command: str, store: str | None) -> fleetstore.Store:
    path = _existing_store(command, store)
    try:
        return fleetstore.open(path)
    except (FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore {command}: {exc}", err=True)
        sys.exit(1)


_EFFECT_STATES = [s.value for s in fleetstore.EffectState]


F = TypeVar("F", bound=Callable[..., Any])


def _json_flag(command: str) -> Callable[[F], F]:
    option: Callable[[F], F] = click.option(
        "--json", "as_json", is_flag=True, help="JSON on stdout.", **_env(command, "json")
    )
    return option


_EFFECTS_EXIT = """\b
Exit codes:
  0  done
  1  the store failed, or refused: the effect's state does not allow it (nothing changed)
  2  bad usage, no store at --store (nothing is created), or no such effect"""


@main.group(
    epilog="""\b
States: pending -> running -> succeeded | pending (retry) | dead | cancelled;
docs/outbox.md has the diagram and the rules.
Exit codes (every subcommand):
  0  done
  1  the store failed, or refused: the effect's state does not allow it (nothing changed)
  2  bad usage, no store at --store (nothing is created), or no such effect"""
)
def effects() -> None:
    """Inspect and steer the effect outbox of a store."""


@effects.command(name="list", epilog=_EFFECTS_EXIT)
@click.option(
    "--thread",
    "thread_key",
    default=None,
    help="Only this thread.",
    **_env("effects list", "thread"),
)
@click.option(
    "--state",
    type=click.Choice(_EFFECT_STATES),
    default=None,
    help="Only this state.",
    **_env("effects list", "state"),
)
@click.option("--kind", default=None, help="Only this kind.", **_env("effects list", "kind"))
@click.option(
    "--limit",
    type=click.IntRange(1, 100_000),
    default=100,
    show_default=True,
    help="At most this many.",
    **_env("effects list", "limit"),
)
@_json_flag("effects list")
@_store_option
def effects_list(
    thread_key: str | None,
    state: str | None,
    kind: str | None,
    limit: int,
    as_json: bool,
    store: str | None,
) -> None:
    """Effects by thread and sequence (JSON: one object per line), with a count
    per state on stderr."""
    with _open_existing("effects list", store) as opened:
        try:
            found = opened.effects.list(thread_key=thread_key, state=state, kind=kind, limit=limit)
            counts = opened.effects.counts()
        except FleetstoreError as exc:
            click.echo(f"fleetstore effects list: {exc}", err=True)
            sys.exit(1)
    if as_json:
        for effect in found:
            click.echo(json.dumps(_effect_json(effect), ensure_ascii=False))
        return
    for e in found:
        note = e.dead_reason or e.last_error or ""
        if e.state == "running":
            note = f"{e.lease_owner} until {_when(e.lease_expires_at)}"
        click.echo(
            f"{e.id}  {e.thread_key}#{e.seq}  {e.kind:<20} {e.state.value:<9} "
            f"attempt {e.attempt}/{e.max_attempts}  {note[:80]}"
        )
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    click.echo(f"-- {len(found)} shown; in the store: {summary or 'no effects'}", err=True)


@effects.command(name="show", epilog=_EFFECTS_EXIT)
@click.argument("effect_id")
@_json_flag("effects show")
@_store_option
def effects_show(effect_id: str, as_json: bool, store: str | None) -> None:
    """One effect with its payload, result and every failed attempt."""
    with _open_existing("effects show", store) as opened:
        effect = _get_effect(opened, "show", effect_id)
    if as_json:
        click.echo(json.dumps(_effect_json(effect), ensure_ascii=False, indent=2))
        return
    times = {"available_at", "lease_expires_at", "created_at", "updated_at", "started_at"}
    for name, value in _effect_json(effect).items():
        if name in times or name == "finished_at":
            value = _when(value if isinstance(value, float) else None)
        elif name in ("payload", "result"):
            value = json.dumps(value, ensure_ascii=False)
        if name != "errors":
            click.echo(f"{name:>16}: {value}")
    for err in effect.errors:
        click.echo(
            f"{'error':>16}: attempt {err.attempt}, {_when(err.at)}, {err.owner}: {err.error}"
        )


def _get_effect(opened: fleetstore.Store, command: str, effect_id: str) -> fleetstore.Effect:
    try:
        return opened.effects.get(effect_id)
    except fleetstore.NotFound as exc:
        click.echo(f"fleetstore effects {command}: {exc}", err=True)
        sys.exit(2)
    except FleetstoreError as exc:
        click.echo(f"fleetstore effects {command}: {exc}", err=True)
        sys.exit(1)


@effects.command(name="retry", epilog=_EFFECTS_EXIT)
@click.argument("effect_id")
@_store_option
def effects_retry(effect_id: str, store: str | None) -> None:
    """Run a dead or cancelled effect again (at the end of its thread, with fresh
    attempts), or a pending one now."""
    _steer("retry", effect_id, store)


@effects.command(name="cancel", epilog=_EFFECTS_EXIT)
@click.argument("effect_id")
@_store_option
def effects_cancel(effect_id: str, store: str | None) -> None:
    """Cancel a pending or running effect (a worker running it is told at its next
    heartbeat); its thread moves on to its next effect."""
    _steer("cancel", effect_id, store)


def _steer(command: str, effect_id: str, store: str | None) -> None:
    with _open_existing(f"effects {command}", store) as opened:
        _get_effect(opened, command, effect_id)
        try:
            effect = getattr(opened.effects, command)(effect_id)
        except FleetstoreError as exc:
            click.echo(f"fleetstore effects {command}: {exc}", err=True)
            sys.exit(1)
    click.echo(f"{effect.id}: {effect.state.value} ({effect.thread_key}#{effect.seq})")


@effects.command(name="sweep", epilog=_EFFECTS_EXIT)
@_json_flag("effects sweep")
@_store_option
def effects_sweep(as_json: bool, store: str | None) -> None:
    """Take effects whose lease expired from their lost workers: back to pending
    (replay-safe, attempts left) or to dead, with the reason. Workers also do this
    on their own, every half lease."""
    with _open_existing("effects sweep", store) as opened:
        try:
            swept = opened.effects.sweep()
        except FleetstoreError as exc:
            click.echo(f"fleetstore effects sweep: {exc}", err=True)
            sys.exit(1)
    if as_json:
        click.echo(json.dumps([{"id": s.id, "state": s.state.value} for s in swept]))
        return
    for s in swept:
        click.echo(f"{s.id}: {s.state.value}")
    click.echo(f"-- swept {len(swept)} effect(s)", err=True)


@effects.command(
    name="enqueue",
    epilog="""\b
Exit codes:
  0  enqueued (or the idempotency key was used before: nothing new); the id is printed
  1  the store failed, or the key names an effect of another thread or kind
  2  bad usage: PAYLOAD is not JSON, an empty THREAD_KEY or KIND""",
)
@click.argument("thread_key")
@click.argument("kind")
@click.argument("payload", required=False, default="null")
@click.option(
    "--idempotency-key",
    default=None,
    help="Enqueue nothing if this key was used.",
    **_env("effects enqueue", "idempotency-key"),
)
@click.option(
    "--delay",
    type=click.FloatRange(min=0),
    default=0.0,
    help="Seconds before it may run.",
    **_env("effects enqueue", "delay"),
)
@click.option(
    "--max-attempts",
    type=click.IntRange(1, 10_000),
    default=5,
    show_default=True,
    help="Attempts before it is dead.",
    **_env("effects enqueue", "max-attempts"),
)
@click.option(
    "--replay-safe/--not-replay-safe",
    default=None,
    help="May it run again after its worker was lost? Default: as its kind is declared.",
    **_env("effects enqueue", "replay-safe"),
)
@_store_option
def effects_enqueue(
    thread_key: str,
    kind: str,
    payload: str,
    idempotency_key: str | None,
    delay: float,
    max_attempts: int,
    replay_safe: bool | None,
    store: str | None,
) -> None:
    """Add an effect of KIND at the end of THREAD_KEY; PAYLOAD is JSON. Prints its id.
    The store is created if missing."""
    try:
        value = json.loads(payload)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="PAYLOAD") from None
    try:
        with fleetstore.open(store) as opened:
            effect_id = opened.effects.enqueue(
                thread_key,
                kind,
                value,
                idempotency_key=idempotency_key,
                delay=delay,
                max_attempts=max_attempts,
                replay_safe=replay_safe,
            )
    except fleetstore.AlreadyExists as exc:
        click.echo(f"fleetstore effects enqueue: {exc}", err=True)
        sys.exit(1)
    except fleetstore.InvalidInput as exc:
        raise click.BadParameter(str(exc)) from None
    except (FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore effects enqueue: {exc}", err=True)
        sys.exit(1)
    click.echo(effect_id)


def _load_handlers(spec: str) -> dict[str, object]:
    import importlib
    import os
    from collections.abc import Mapping

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise click.BadParameter("write MODULE:HANDLERS, e.g. myapp.effects:HANDLERS")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the project's own modules
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name!r}: {exc}") from None
    value = getattr(module, attr, None)
    if callable(value) and not isinstance(value, Mapping):
        try:
            value = value()
        except TypeError as exc:
            raise click.BadParameter(f"{spec} is a function that takes arguments: {exc}") from None
    if not isinstance(value, Mapping) or not value:
        raise click.BadParameter(
            f"{spec} must be a non-empty mapping of kind -> handler (or a function returning one)"
        )
    return dict(value)


@main.command(
    epilog="""\b
Signals: the first SIGINT/SIGTERM stops claiming, gives back claimed effects
that have not started (no attempt spent) and waits up to --grace seconds for
running ones; a second one stops hard: running effects are settled as
interrupted (replay-safe ones go back to pending, the others to dead).
Exit codes:
  0  stopped after its running effects finished (or, with --until-idle, nothing was left)
  1  the store could not be opened or failed
  2  bad usage: MODULE:HANDLERS cannot be imported or is not a mapping, no store at --store
  3  stopped hard: effects were interrupted""",
)
@click.argument("handlers", metavar="MODULE:HANDLERS")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 1024),
    default=4,
    show_default=True,
    help="Effects run at once.",
    **_env("worker", "concurrency"),
)
@click.option(
    "--lease",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds a claim lasts unless renewed (heartbeats renew it every third).",
    **_env("worker", "lease"),
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds running effects get to finish after the first signal.",
    **_env("worker", "grace"),
)
@click.option(
    "--prefetch",
    type=click.IntRange(0, 1024),
    default=0,
    show_default=True,
    help="Effects claimed ahead of a free slot.",
    **_env("worker", "prefetch"),
)
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0.001),
    default=0.1,
    show_default=True,
    help="The longest an idle worker waits between looks for ready effects "
    "(a random half to whole of it).",
    **_env("worker", "poll-interval"),
)
@click.option(
    "--until-idle",
    is_flag=True,
    help="Stop once no effect of its kinds is pending.",
    **_env("worker", "until-idle"),
)
@_store_option
def worker(
    handlers: str,
    concurrency: int,
    lease: float,
    grace: float,
    prefetch: int,
    poll_interval: float,
    until_idle: bool,
    store: str | None,
) -> None:
    """Run effects of the store's outbox with the handlers in MODULE:HANDLERS.

    HANDLERS is a mapping of kind -> function (or fleetstore.Handler, which also
    declares whether the kind is replay-safe); a function taking the Effect, sync
    or async, returning a JSON result. Raising fleetstore.RetryEffect or any error
    retries with backoff, fleetstore.FailEffect fails for good.
    """
    import logging

    table = _load_handlers(handlers)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    opened = _open_existing("worker", store)
    try:
        runner = fleetstore.Worker(
            opened,
            table,  # type: ignore[arg-type]
            concurrency=concurrency,
            lease=lease,
            grace=grace,
            prefetch=prefetch,
            poll_interval=poll_interval,
            until_idle=until_idle,
        )
    except ConfigError as exc:
        opened.close()
        raise click.BadParameter(str(exc)) from None
    try:
        code = runner.run()
    except FleetstoreError as exc:
        click.echo(f"fleetstore worker: {exc}", err=True)
        code = 1
    finally:
        opened.close()
    stats = ", ".join(f"{n} {k}" for k, n in sorted(runner.stats.items())) or "nothing run"
    click.echo(f"fleetstore worker: {runner.owner}: {stats}", err=True)
    sys.exit(code)


@main.command(
    epilog="""\b
Keys (on a terminal): q quits; so does Ctrl-C.
Exit codes:
  0  quit, or --count frames shown
  1  the store could not be opened
  2  bad usage, or there is no store at PATH (nothing is created)""",
)
@click.argument("path", required=False, default=None, type=click.Path(path_type=str))
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    help="Seconds between frames.",
    **_env("top", "interval"),
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="Show this many frames, then exit (each with rates over the last interval).",
    **_env("top", "count"),
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object per frame instead of the screen.",
    **_env("top", "json"),
)
def top(path: str | None, interval: float, count: int | None, as_json: bool) -> None:
    """A live view of a store: the processes using it, writes/s, lock-wait p99,
    retries and spooled writes per process, the database and WAL sizes, and the
    outbox by state.

    Processes publish their figures beside the store about once a second
    (`publish_interval`); rates and p99 are over the last interval. PATH: the
    store (default: $FLEETSTORE_URL, else the default store); a sharded store
    (sqlite+sharded:///DIR, or DIR) adds its shard files on disk, the shards the
    processes have open and the largest shard WAL.
    """
    from fleetstore.admin import top as top_view

    db = _existing_store("top", path, server=False)
    try:
        opened = fleetstore.open(db, publish_interval=0)
    except (FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore top: {exc}", err=True)
        sys.exit(1)
    try:
        top_view.run(db, opened.effects.counts, interval, count, sys.stdout, as_json)
    except KeyboardInterrupt:
        pass
    finally:
        opened.close()


main.add_command(doctor_command, "doctor")
main.add_command(maintain_command)
main.add_command(migrate_command)
main.add_command(reshard_command)
sessions.add_command(archive_tree_command)
sessions.add_command(restore_tree_command)
main.add_command(sessions)
main.add_command(stats_command)
