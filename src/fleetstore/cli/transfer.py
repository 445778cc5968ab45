"""``fleetstore export``, ``import`` and ``merge``: stores as verified streams of
operations (the work is in fleetstore.transfer)."""

from __future__ import annotations

import sys

import click

import fleetstore
from fleetstore.cli.util import ProgressBars as _ProgressBars
from fleetstore.cli.util import check_target as _check_target
from fleetstore.cli.util import emit_json, json_option
from fleetstore.cli.util import env as _env
from fleetstore.cli.util import existing_store as _existing_store
from fleetstore.cli.util import size as _size
from fleetstore.cli.util import store_params as _store_params
from fleetstore.errors import ConfigError, FleetstoreError


@click.command(
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
    **_env("export", "output"),
    help="The file to write ('-': standard output).",
)
@click.option(
    "--plain",
    is_flag=True,
    default=False,
    **_env("export", "plain"),
    help="An encrypted store's export is encrypted with its current key (any holder of "
    "its keyring imports it); --plain writes it unencrypted, on purpose.",
)
@json_option("export")
@_store_params()
def export_command(
    sessions: tuple[str, ...], output: str, plain: bool, as_json: bool, store: str | None
) -> None:
    """Write sessions, with their messages, state and blobs, to one file.

    All sessions of the store, or the SESSIONs given with their subagent trees.
    The file is zstd-compressed JSON lines: a versioned header, the blobs and
    the operations that recreate each session exactly, and a trailer with counts
    and a SHA-256 of everything before it. `fleetstore import` reads it back.
    An encrypted store's export is sealed (AES-256-GCM, under the keyring's current
    key) unless --plain. The summary (--json: one object) goes to stdout, to stderr
    with -o -.
    """
    from fleetstore.transfer.export import export_store

    path = _existing_store("export", store)
    if output == "-" and sys.stdout.isatty():
        raise click.UsageError("refusing to write compressed data to a terminal; use -o FILE")
    bars = _ProgressBars()
    try:
        with _open_to_read(path) as opened:
            if output == "-":
                summary = export_store(
                    opened, sys.stdout.buffer, sessions or None, progress=bars, plain=plain
                )
                sys.stdout.buffer.flush()
            else:
                summary = export_store(opened, output, sessions or None, progress=bars, plain=plain)
            sealed = opened.keyring is not None and not plain
    except (FleetstoreError, OSError) as exc:
        bars.close()
        click.echo(f"fleetstore export: {exc}", err=True)
        sys.exit(1)
    bars.close()
    if as_json:
        figures = ("sessions", "messages", "states", "blobs", "blob_bytes", "file_bytes")
        report = {
            "output": output,
            **{k: getattr(summary, k) for k in figures},
            "encrypted": sealed,
        }
        emit_json(report, err=output == "-")
        return
    click.echo(
        f"fleetstore export: {summary.sessions} sessions, {summary.messages} messages, "
        f"{summary.states} state values, {summary.blobs} blobs ({_size(summary.blob_bytes)}) "
        f"-> {'stdout' if output == '-' else output} ({_size(summary.file_bytes)}"
        f"{', encrypted' if sealed else ''})",
        err=output == "-",
    )


def _open_to_read(path: str) -> fleetstore.Store:
    """A SQLite store strictly read-only (nothing written to any of its files), a
    PostgreSQL store as usual."""
    from fleetstore.store.readonly import open_read_only

    if path.startswith(("postgresql://", "postgres://")):
        return fleetstore.open(path)
    return open_read_only(path)


#: ``fleetstore import --from X``: the framework whose importer
#: (``fleetstore.integrations.<framework>.importer``; its run_cli) imports X.
_FOREIGN_IMPORTERS = {
    "adk-sqlite": "adk",
    "openai-agents-sqlite": "openai_agents",
    "langgraph-sqlite": "langgraph",
}


@click.command(
    name="import",
    epilog="""\b
Exit codes:
  0  the file was imported (importing it again changes nothing)
  1  --store is not a fleetstore store (unchanged; see --add-to-foreign-db), or
     the file was rejected (malformed, damaged, truncated, hostile, a newer format;
     with --from openai-agents-sqlite: not an SDK session database, a row that is not
     a JSON object, a session the store holds with other items) or contradicts the
     store, also when another process wrote a contradicting record since the check:
     nothing was imported; or the store stayed locked past the write budget: nothing
     was imported (a sharded store: what was, stays); importing again is safe
  2  bad usage, or FILE does not exist""",
)
@click.argument(
    "file", type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=str)
)
@_store_params()
@click.option(
    "--from",
    "source",
    type=click.Choice(["fleetstore", *_FOREIGN_IMPORTERS]),
    default="fleetstore",
    show_default=True,
    **_env("import", "from"),
    help="What FILE is: a `fleetstore export` file, an ADK session database "
    "(the SQLite file of ADK's DatabaseSessionService or SqliteSessionService), or an "
    "OpenAI Agents SDK SQLiteSession database (tables agent_sessions, agent_messages), "
    "or a LangGraph SqliteSaver checkpoint file (tables checkpoints, writes).",
)
@click.option(
    "--add-to-foreign-db",
    "foreign_ok",
    is_flag=True,
    **_env("import", "add-to-foreign-db"),
    help="--store names another program's SQLite database: add fleetstore's tables to "
    "it (switching it to WAL mode). Without this flag such a file is refused, unchanged.",
)
@click.option(
    "--export-key",
    metavar="FILE",
    default=None,
    **_env("import", "export-key"),
    help="The keyring of an encrypted export (default: the store's own, --key-file): to "
    "import an encrypted store's export into a store without that keyring.",
)
@json_option("import")
def import_command(
    file: str,
    store: str | None,
    source: str,
    foreign_ok: bool,
    export_key: str | None,
    as_json: bool,
) -> None:
    """Import a file written by `fleetstore export` into a store (created if missing;
    a --store that is another program's SQLite file is refused unless
    --add-to-foreign-db).

    The whole file is checked first: every record, every blob's hash and size,
    the trailer's counts and checksum, and that nothing in it contradicts the
    store. A file that fails any check is rejected whole and nothing is written.
    Objects already in the store and equal are left alone, so importing twice
    changes nothing; objects the store holds at an earlier stage (a lower version,
    a message still streaming) are brought forward. FILE '-' reads standard input;
    standard input or a pipe (`<(cat f)`) is first copied to a private (0600)
    temporary file beside the store, removed afterwards.
    """
    _check_target(
        "import",
        store,
        foreign_ok=foreign_ok,
        hint=" (--add-to-foreign-db adds fleetstore's tables to it)",
    )
    if source in _FOREIGN_IMPORTERS:
        import importlib

        if file == "-":
            raise click.UsageError(f"--from {source} reads a file, not standard input")
        importer = importlib.import_module(
            f"fleetstore.integrations.{_FOREIGN_IMPORTERS[source]}.importer"
        )
        try:
            code = importer.run_cli(file, store, as_json=as_json)
        except ConfigError as exc:
            raise click.UsageError(str(exc)) from None
        sys.exit(code)
    import os
    import shutil
    import stat
    import tempfile

    from fleetstore.core.keys import keyring_of
    from fleetstore.transfer.importing import import_file

    # The file is read twice (checked whole, then written): standard input, a pipe
    # (`import <(cat f)`) or any file that cannot seek is copied first, privately.
    stream = file == "-" or not stat.S_ISREG(os.stat(file).st_mode)
    bars = _ProgressBars()
    tmp: str | None = None
    try:
        with fleetstore.open(store) as opened:
            if stream:
                fd, tmp = tempfile.mkstemp(prefix=".fleetstore-import-", dir=opened.path.parent)
                with os.fdopen(fd, "wb") as fh:
                    if file == "-":
                        shutil.copyfileobj(sys.stdin.buffer, fh)
                    else:
                        with open(file, "rb") as src:
                            shutil.copyfileobj(src, fh)
            summary = import_file(
                opened, tmp or file, progress=bars, keyring=keyring_of(export_key or "")
            )
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    except fleetstore.StoreBusy as exc:
        bars.close()
        click.echo(
            f"fleetstore import: {exc}; the import did not finish (into one file or "
            "PostgreSQL nothing was imported; into a sharded store what was imported "
            "stays); importing the file again is safe",
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
    if as_json:
        import dataclasses

        emit_json(dataclasses.asdict(summary))
        return
    click.echo(
        f"fleetstore import: {summary.sessions} sessions, {summary.messages} messages, "
        f"{summary.states} state values, {summary.blobs} blobs ({_size(summary.blob_bytes)}): "
        f"{summary.inserted} new, {summary.updated} brought forward, {summary.unchanged} "
        f"unchanged, {summary.newer} newer in the store"
    )


@click.command(
    name="merge",
    epilog="""\b
Exit codes:
  0  every session of every SRC is in DST exactly as exported, and every blob verifies
  1  verification failed (DST differs from what was exported, a SRC changed during
     the merge, a blob does not verify: each problem is printed), or an export was
     rejected, or a SRC contradicts DST (nothing of that SRC was imported), or a
     SRC or DST is a file that is not a fleetstore store (nothing is written)
  2  bad usage: fewer than two stores, a SRC that does not exist, a SRC that is DST""",
)
@click.argument("stores", nargs=-1, required=True, metavar="SRC... DST")
@json_option("merge")
def merge_command(stores: tuple[str, ...], as_json: bool) -> None:
    """Bring every session of the SRC stores into DST (created if missing), verified.

    Each SRC is exported to a temporary file beside DST and imported (see
    `fleetstore import`); then each exported session is compared with DST
    (message count and a hash of its whole content) and with SRC as it is now,
    and every blob is verified in DST. Merging again changes nothing. For
    fleets that keep one store per worker during a run and merge afterwards.
    """
    import os

    from fleetstore.core.targets import resolve_target
    from fleetstore.transfer.merge import merge

    if len(stores) < 2:
        raise click.UsageError("give at least one SRC and the DST")
    *sources, dest = stores
    try:  # SQLite store files only, each SRC as the DST (a sharded SRC exited 1, not 2)
        dest_path = resolve_target(dest).resolve()
        for source in sources:
            resolve_target(source)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    paths = [_existing_store("merge", s) for s in sources]
    _check_target("merge", dest)
    for p in paths:
        if os.path.realpath(p) == str(dest_path):
            raise click.UsageError(f"{p} is both a SRC and the DST")
    bars = _ProgressBars()
    try:
        report = merge(paths, dest, progress=bars)
    except (FleetstoreError, OSError) as exc:
        bars.close()
        click.echo(f"fleetstore merge: {exc}", err=True)
        sys.exit(1)
    bars.close()
    for problem in report.problems:
        click.echo(f"fleetstore merge: {problem}", err=True)
    if as_json:
        emit_json(
            {
                "dest": str(report.dest),
                "sources": [s.source for s in report.sources],
                "sessions": report.sessions,
                "messages": report.messages,
                "blobs": report.blobs,
                "blob_bytes": report.blob_bytes,
                "problems": list(report.problems),
                "ok": report.ok,
            }
        )
        sys.exit(0 if report.ok else 1)
    verdict = "verified" if report.ok else f"NOT verified ({len(report.problems)} problems)"
    click.echo(
        f"fleetstore merge: {len(report.sources)} stores, {report.sessions} sessions, "
        f"{report.messages} messages, {report.blobs} blobs ({_size(report.blob_bytes)}) "
        f"-> {report.dest}: {verdict}"
    )
    sys.exit(0 if report.ok else 1)
