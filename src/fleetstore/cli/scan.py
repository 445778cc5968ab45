"""The ``fleetstore scan`` command (the work is in fleetstore.admin.scan)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from fleetstore import errors
from fleetstore.cli.util import env, json_option, settings_keyring, store_params

if TYPE_CHECKING:
    from fleetstore.admin.scan import ScanFinding, ScanReport

EXIT_FOUND = 1
EXIT_USAGE = 2
EXIT_UNREAD = 3


@click.command(
    name="scan",
    epilog="""\b
Exit codes:
  0  nothing found, and everything was read
  1  secrets found (also when part of PATH could not be read: see the summary)
  2  bad usage: PATH does not exist, is a PostgreSQL URL, a bad --rules file
  3  nothing found, but part of PATH could not be read (see the summary)""",
)
@click.argument("path", metavar="[PATH]", required=False, default=None)
@store_params(
    help="The store to scan when no PATH is given: its file, a directory holding "
    "fleetstore.db, sqlite:///..., sqlite+sharded:///DIR. Default: $FLEETSTORE_URL, "
    "else DATA_DIR/fleetstore.db."
)
@json_option("scan", each='finding, then a last line {"summary": {...}}')
@click.option(
    "--rules",
    metavar="FILE",
    default=None,
    **env("scan", "rules"),
    help="A rules file of your own (TOML, as docs/secrets.md describes): its rules are "
    "added to the built-in ones, its allow lists applied, its disable list drops kinds.",
)
def scan_command(path: str | None, store: str | None, as_json: bool, rules: str | None) -> None:
    """Find secrets kept in PATH (else the store), strictly read-only, and say where
    without showing them.

    PATH is a fleetstore store (its file, with its blob files and spool journals; a
    sharded store's directory; sqlite:///... or sqlite+sharded:///...), another
    program's SQLite file (every text and blob column of every table: opencode, zcode,
    Codex, LangGraph's and the SDKs' files), a JSONL transcript, or a directory holding
    any of these (walked without following links; *.jsonl, *.ndjson and *.json files
    and SQLite files are read, others skipped). The rules are fleetstore's redaction
    rules: provider keys by their prefixes, private key blocks, JWTs, keys named before
    their value, passwords and tokens in URLs (docs/secrets.md).

    Each finding names its kind and where it is: the file; for a database the table,
    column and the row's key columns (a store's session and message ids); the line of a
    file; the JSON path inside a value; the offset. Never the secret: at most its first
    4 characters and a fingerprint (sha256 of the secret, 12 hex digits) to match it
    against a key you hold. Nothing is written: no byte or mtime of any file changes,
    no -wal, -shm or lock file is created.
    """
    if (
        path is not None
        and click.get_current_context().get_parameter_source("store") is ParameterSource.COMMANDLINE
        and store != path
    ):
        raise click.UsageError(f"scan names what to scan twice: PATH {path} and --store {store}")
    if path is None:
        from fleetstore.core.targets import parse_target

        path = store if store is not None else str(parse_target(None)[1])
    from fleetstore.admin.scan import scan
    from fleetstore.core.redact import Redactor, Ruleset

    try:
        redactor = Redactor(Ruleset.load(rules)) if rules else None
    except (errors.ConfigError, errors.NotFound) as exc:
        raise click.UsageError(f"--rules: {exc}") from None

    def show(finding: ScanFinding) -> None:
        if as_json:
            click.echo(json.dumps(finding.to_json(), default=_json_default))
        else:
            click.echo(_line(finding))

    try:
        report = scan(path, show, redactor, settings_keyring())
    except errors.NotFound as exc:
        click.echo(f"fleetstore scan: {exc} (nothing was read)", err=True)
        sys.exit(EXIT_USAGE)
    except errors.ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"summary": report.to_json()}, default=_json_default))
    else:
        click.echo(_summary(report))
    sys.exit(report.exit_code)


def _json_default(value: object) -> object:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return str(value)


def _safe(value: Any) -> str:
    """*value* for a terminal: no control character of the data reaches it."""
    text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)


def _line(finding: ScanFinding) -> str:
    where = finding.where
    place = [finding.path]
    if "table" in where:
        row = ", ".join(f"{k}={_safe(v)}" for k, v in where.get("row", {}).items())
        place.append(f"{where['table']}({row}).{where['column']}")
    if "line" in where:
        place.append(f"line {where['line']}")
    if "blob" in where:
        refs = "; ".join(
            f"{r['table']}(" + ", ".join(f"{k}={_safe(v)}" for k, v in r["row"].items()) + ")"
            for r in where.get("referenced_by", [])
        )
        place.append(f"blob {where['blob']}" + (f" <- {refs}" if refs else ""))
    if "json_path" in where:
        place.append(where["json_path"])
    place.append(f"@{where.get('offset', 0)}")
    return (
        f"{finding.kind}  {_safe(' '.join(str(p) for p in place))}  "
        f"{_safe(finding.preview)} {finding.fingerprint}"
    )


def _summary(report: ScanReport) -> str:
    s = report.scanned
    read = [
        f"{s[k]:,} {name}"
        for k, name in (
            ("databases", "database(s)"),
            ("tables", "table(s)"),
            ("rows", "row(s)"),
            ("blobs", "blob file(s)"),
            ("journals", "spool journal(s)"),
            ("files", "file(s)"),
            ("lines", "line(s)"),
        )
        if s[k]
    ]
    lines = [f"scanned {', '.join(read) or 'nothing'} in {report.seconds:.1f}s"]
    if report.findings:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(report.by_kind.items()))
        lines.append(f"{report.findings:,} secret(s) found: {kinds}")
    else:
        lines.append("no secret found")
    if report.skipped:
        lines.append(f"{len(report.skipped)} file(s) skipped:")
        lines += [f"  {_safe(x['path'])}: {x['why']}" for x in report.skipped[:20]]
        if len(report.skipped) > 20:
            lines.append(f"  ... and {len(report.skipped) - 20} more (--json lists them all)")
    if report.errors:
        lines.append(f"{len(report.errors)} could not be read:")
        lines += [f"  {_safe(x['path'])}: {_safe(x['error'])}" for x in report.errors]
    return "\n".join(lines)


__all__ = ["scan_command"]
