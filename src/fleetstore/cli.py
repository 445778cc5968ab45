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

    from fleetstore.spool import REJECTED, rejected_records
    from fleetstore.store import recover_journals

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

_STORE_HELP = (
    "The store: its file, a directory holding fleetstore.db, or sqlite:///absolute/path. "
    "Default: $FLEETSTORE_URL, else DATA_DIR/fleetstore.db."
)
_store_option = click.option(
    "--store",
    metavar="PATH",
    default=None,
    envvar="FLEETSTORE_URL",
    show_envvar=True,
    help=_STORE_HELP,
)


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


class _ProgressBars:
    """A click progress bar per stage, on stderr, only when stderr is a terminal."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self._bar: click._termui_impl.ProgressBar[int] | None = None
        self._stage = ""
        self._pos = 0

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if stage != self._stage:
            self.close()
            self._bar = click.progressbar(length=max(total, 1), label=stage, file=sys.stderr)
            self._stage, self._pos = stage, 0
        assert self._bar is not None
        self._bar.update(max(done - self._pos, 0))
        self._pos = max(done, self._pos)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.render_finish()
            self._bar = None
            self._stage = ""


def _existing_store(command: str, store: str | None) -> str:
    """The store's path; exit 2 if there is none (export and merge never create a source)."""
    from fleetstore.store import resolve_target

    try:
        path = resolve_target(store)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if not path.is_file():
        click.echo(f"fleetstore {command}: no store at {path} (nothing was created)", err=True)
        sys.exit(2)
    return str(path)


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
    from fleetstore import transfer

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


@main.command(
    name="import",
    epilog="""\b
Exit codes:
  0  the file was imported (importing it again changes nothing)
  1  the file was rejected (malformed, damaged, truncated, hostile, a newer format)
     or contradicts the store: nothing was imported; or the import stopped midway
     (the store stayed locked past the write budget): importing again is safe
  2  bad usage, or FILE does not exist""",
)
@click.argument(
    "file", type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=str)
)
@_store_option
def import_command(file: str, store: str | None) -> None:
    """Import a file written by `fleetstore export` into a store (created if missing).

    The whole file is checked first: every record, every blob's hash and size,
    the trailer's counts and checksum, and that nothing in it contradicts the
    store. A file that fails any check is rejected whole and nothing is written.
    Objects already in the store and equal are left alone, so importing twice
    changes nothing; objects the store holds at an earlier stage (a lower version,
    a message still streaming) are brought forward. FILE '-' reads standard input.
    """
    import os
    import shutil
    import tempfile

    from fleetstore import transfer

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

    from fleetstore import transfer
    from fleetstore.store import resolve_target

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
