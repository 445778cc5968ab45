"""The doctor's report: the findings, the verdict and exit code they give, and the
report rendered as text for a person (``format_report``) or as the ``--json`` object
(``Report.to_json``; docs/doctor.md has its schema)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from fleetstore.core.render import table
from fleetstore.core.units import size
from fleetstore.errors import describe_state

#: Version of the ``--json`` object; raised when a field changes meaning or goes away
#: (2: ``exit_code`` 3 for problems, which was 2, the code of bad usage: issue 28).
REPORT_VERSION = 2

EXIT_HEALTHY = 0
EXIT_WARNINGS = 1
#: Bad usage, or nothing to check (PATH missing, not a SQLite database): no report.
EXIT_USAGE = 2
EXIT_PROBLEMS = 3

#: Within a severity, findings are listed in this order: what loses data or stops
#: writers now, then what holds writers back now, then what will go wrong or is a
#: risk, then what wastes space, then what was only checked (issue 28: a lock holder
#: was listed like a file mode).  tests/admin/test_doctor.py holds every code to it.
ORDER: tuple[str, ...] = (
    # broken, or losing writes now
    "unreadable",
    "hot-journal",
    "quick-check-failed",
    "deleted-file-open",
    "disk-full",
    "blob-files-missing",
    "spool-damaged",
    "spool-blob-missing",
    "world-writable",
    # holding writers back now
    "write-lock-held",
    "gate-held",
    "wal-reset-blocked",
    "not-read-busy",
    "encrypted",
    "checkpoint-failing",
    "effects-stuck",
    "effects-overdue",
    "shard-missing",
    "shard-intent-stale",
    "spool-stale",
    "outbox-backlog",
    "wal-large",
    "disk-low",
    # risks, and what went wrong before
    "world-readable",
    "group-access",
    "process-sqlite-wal-reset-bug",
    "sqlite-wal-reset-bug",
    "wal-not-enabled",
    "busy-timeout",
    "schema-newer",
    "settings-invalid",
    "effects-long-running",
    "effects-dead",
    "spool-rejected",
    "post-commit-errors",
    "board-quarantined",
    "shard-orphan",
    "shard-index-not-read",
    "directory-world-writable",
    "changed-during-check",
    "wal-without-shm",
    "not-read",
    "empty-file",
    # space
    "largest-table",
    "freelist-high",
    "auto-vacuum-off",
    # checked, fine
    "writer",
    "wal-enabled",
    "quick-check",
    "sqlite-version",
    "foreign-database",
    "schema",
    "schema-older",
    "outbox",
    "procs-gone",
    "shards",
    "shard-empty",
    "shard-intents",
)
_PLACE = {code: i for i, code in enumerate(ORDER)}

#: Shards named one by one under a finding code; the rest are counted.
SHARDS_NAMED = 5


def shards_named(items: list[dict[str, Any]]) -> str:
    """``key (N sessions), ...`` for the first SHARDS_NAMED shards, then how many more."""
    named = ", ".join(f"{i['key']} ({i['sessions']} sessions)" for i in items[:SHARDS_NAMED])
    more = len(items) - SHARDS_NAMED
    return named + (f" and {more} more" if more > 0 else "")


class Severity(enum.Enum):
    """How bad a finding is; the worst one decides the exit code."""

    #: Checked, and fine (listed so the report says what was looked at).
    OK = "ok"
    #: Works now, but is a risk or wastes something: exit 1.
    WARNING = "warning"
    #: Broken, or losing data or progress now: exit 3.
    PROBLEM = "problem"

    @property
    def rank(self) -> int:
        return ("ok", "warning", "problem").index(self.value)


@dataclass(frozen=True, slots=True)
class Finding:
    """One plain-language result: what was found and how to fix it."""

    severity: Severity
    code: str
    message: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return {
            "severity": self.severity.value,
            "code": self.code,
            "message": self.message,
            "fix": self.fix,
        }


@dataclass(slots=True)
class Report:
    """Everything doctor saw (``data``, the ``--json`` object less the findings) and
    what it concluded."""

    path: str
    data: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)

    @property
    def verdict(self) -> Severity:
        return max((f.severity for f in self.findings), key=lambda s: s.rank, default=Severity.OK)

    def ranked(self) -> list[Finding]:
        """The findings worst first: by severity, then in ``ORDER`` (then as found)."""
        return sorted(
            self.findings, key=lambda f: (-f.severity.rank, _PLACE.get(f.code, len(ORDER)))
        )

    @property
    def exit_code(self) -> int:
        return {
            Severity.OK: EXIT_HEALTHY,
            Severity.WARNING: EXIT_WARNINGS,
            Severity.PROBLEM: EXIT_PROBLEMS,
        }[self.verdict]

    def add(self, severity: Severity, code: str, message: str, fix: str = "") -> None:
        self.findings.append(Finding(severity, code, message, fix))

    def to_json(self) -> dict[str, Any]:
        ordered = self.ranked()
        return {
            "report_version": REPORT_VERSION,
            "path": self.path,
            "verdict": self.verdict.value,
            "exit_code": self.exit_code,
            **self.data,
            "findings": [f.to_json() for f in ordered],
        }


_MARK = {Severity.OK: "ok", Severity.WARNING: "WARNING", Severity.PROBLEM: "PROBLEM"}


def format_report(report: Report) -> str:
    """The report as text for a person: sections, then the findings with their fixes."""
    data = report.to_json()
    title = report.path
    if data.get("sharded"):
        title = f"{data['sharded']['url']} (sharded store; its catalog: {report.path})"
    lines = [f"fleetstore doctor: {title}", ""]
    files = data["files"]
    lines.append("Files")
    rows = [
        (role, f"{f['size']:,} bytes", size(f["size"]), f["mode"], f["uid"])
        for role in ("database", "wal", "shm", "journal", "gate")
        if (f := files.get(role))
    ]
    lines.append(table(("", "bytes", "size", "mode", "uid"), rows, right={"bytes", "size"}))
    db = data["database"]
    lines += ["", "SQLite"]
    lines.append(
        f"  library {data['sqlite']['library_version']}"
        + (f"; header last written by {db['header_written_by']}" if db["header_written_by"] else "")
    )
    if db["journal_mode"]:
        lines.append(
            f"  journal {db['journal_mode']}, page size {db['page_size']}, "
            f"{db['page_count']} pages, {db['freelist_count']} free"
            + (f" ({db['freelist_share']:.1%})" if db["freelist_share"] is not None else "")
            + f", auto_vacuum {db['auto_vacuum']}, encoding {db['encoding']}"
        )
    if db["open_mode"]:
        lines.append(f"  read as: {db['open_mode']} ({db['open_mode_reason']})")
    if db["quick_check"] is not None:
        lines.append(f"  quick_check: {'; '.join(db['quick_check'][:3])}")
    if db.get("sizes"):
        lines += _size_lines(db["sizes"])
    wal = data["wal"]
    if wal:
        lines += ["", "WAL"]
        if not wal["file_bytes"]:
            lines.append("  no -wal content: everything is in the database file")
        elif wal["frames"] is None:
            lines.append(f"  file {wal['file_bytes']:,} bytes; no readable WAL index (-shm)")
        else:
            lines.append(
                f"  file {wal['file_bytes']:,} bytes ({wal['file_frames']} frames of room); "
                f"{wal['frames']} frames in use, {wal['backfilled']} copied back"
            )
            marks = ", ".join(
                f"{i}:{'-' if m is None else m}" for i, m in enumerate(wal["read_marks"])
            )
            lines.append(f"  read marks (slot:frame) {marks}")
    lines += ["", f"Processes (locks looked at twice, {data['locks_interval']}s apart)"]
    if not data["processes"]:
        lines.append("  none has the database open (or /proc shows none)")
    for proc in data["processes"]:
        note = describe_state(proc.get("state", ""))
        lines.append(
            f"  pid {proc['pid']}: {proc['command'] or '?'}" + (f" ({note})" if note else "")
        )
        if proc["open"]:
            lines.append(f"    open: {', '.join(proc['open'])}")
        for lk in proc["locks"]:
            lines.append(
                f"    {lk['file']}: {lk['mode'].lower()} {', '.join(lk['names'])} "
                f"(seen {lk['seen']})"
            )
        for lib in proc["sqlite_libraries"]:
            lines.append(f"    SQLite {lib['version'] or '?'} from {lib['path']}")
    store = data["fleetstore"]
    if store:
        lines += ["", "fleetstore store"]
        lines.append(
            f"  schema version {store['schema_version']} (this fleetstore: "
            f"{store['known_schema_version']}), {store['sessions']} sessions"
        )
        if store["outbox"]:
            states = ", ".join(f"{k} {v}" for k, v in store["outbox"]["by_state"].items())
            lines.append(
                f"  outbox: {states}; stuck running {store['outbox'].get('stuck_running', 0)}"
            )
        if store["spool"]:
            for j in store["spool"]["journals"]:
                lines.append(
                    f"  spool {j['journal']}: {j['operations']} op(s), "
                    + (f"held by pid {j['held_by']}" if j["live"] else "its process is gone")
                )
        if store["settings"]:
            lines.append(
                "  settings here: " + ", ".join(f"{k}={v}" for k, v in store["settings"].items())
            )
    sharded = data.get("sharded")
    if sharded:
        lines += _shard_lines(sharded)
    lines += ["", "Findings"]
    for f in report.ranked():
        lines.append(f"  [{_MARK[f.severity]}] {f.code}: {f.message}")
        if f.fix:
            lines.append(f"      {'fix' if f.severity is not Severity.OK else 'advice'}: {f.fix}")
    verdict = {
        Severity.OK: "healthy",
        Severity.WARNING: "warnings",
        Severity.PROBLEM: "problems",
    }[report.verdict]
    lines += ["", f"verdict: {verdict} (exit {report.exit_code})"]
    return "\n".join(lines)


#: Tables listed in the text report's sizes (--json has them all).
SIZES_LISTED = 8


def _size_lines(sizes: dict[str, Any]) -> list[str]:
    """The bytes of the largest tables (each with its indexes) and of the free pages."""
    total = sizes["total_bytes"]
    rows: list[tuple[str, str, str, str, str]] = [
        (
            t["table"],
            size(t["bytes"]),
            f"{t['share']:.1%}",
            size(t["table_bytes"]) if t["indexes"] else "",
            f"{t['indexes']}: {size(t['index_bytes'])}" if t["indexes"] else "",
        )
        for t in sizes["tables"][:SIZES_LISTED]
    ]
    more = len(sizes["tables"]) - SIZES_LISTED
    if more > 0:
        rest = sum(t["bytes"] for t in sizes["tables"][SIZES_LISTED:])
        rows.append(
            (f"{more} more table(s)", size(rest), f"{rest / total if total else 0.0:.1%}", "", "")
        )
    free = sizes["free_bytes"]
    rows.append(("(free pages)", size(free), f"{free / total if total else 0.0:.1%}", "", ""))
    return [
        "",
        f"Sizes (dbstat: each table with its indexes, of {size(total)})",
        table(
            ("table", "size", "share", "table alone", "indexes"),
            rows,
            right={"size", "share", "table alone"},
        ),
    ]


def _shard_lines(section: dict[str, Any]) -> list[str]:
    """The sharded section as text: a few summary lines however many shards; the
    shards with findings are named in the findings."""
    lines = ["", f"Shards ({section['directory']}/shards)"]
    indexed = section["indexed_shards"]
    lines.append(
        f"  {section['shard_files']:,} shard files, {size(section['total_bytes'])} "
        f"(WAL {size(section['wal_bytes'])}); "
        + (
            f"the catalog's index names {indexed:,} ({section['indexed_sessions']:,} sessions)"
            if indexed is not None
            else "the catalog's index could not be read"
        )
    )
    if section["largest"]:
        lines.append(
            "  largest: "
            + ", ".join(
                f"{e['key']} {size(e['bytes'])}"
                + (f" (WAL {size(e['wal_bytes'])})" if e["wal_bytes"] else "")
                for e in section["largest"]
            )
        )
    for name, items in (("missing", section["missing"]), ("orphan", section["orphans"])):
        if items:
            lines.append(f"  {name} files: {shards_named(items)}")
    if section["empty"]:
        lines.append(f"  empty files (no session): {len(section['empty'])}")
    intents = section["intents"]
    if intents:
        alive = sum(1 for i in intents if i["alive"])
        lines.append(
            f"  catalog+shard writes unfinished: {len(intents)} ({alive} of live processes, "
            f"{len(intents) - alive} of processes that are gone)"
        )
    lines.append(
        f"  checked: {section['shard_files']:,} files, "
        f"{section['shard_files'] - section['with_findings']:,} fine, "
        f"{section['with_findings']:,} with findings"
    )
    return lines


__all__ = [
    "EXIT_HEALTHY",
    "EXIT_PROBLEMS",
    "EXIT_USAGE",
    "EXIT_WARNINGS",
    "ORDER",
    "REPORT_VERSION",
    "SHARDS_NAMED",
    "Finding",
    "Report",
    "Severity",
    "format_report",
    "shards_named",
]
