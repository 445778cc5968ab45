"""What ``migrate`` reports and raises: its report types (``MigrateReport``, one
``TableReport`` per table, ``format_report`` for people), its errors, the progress
callback it calls and the default batch size."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetstore import errors
from fleetstore.core.render import table

#: ``progress(stage, done, total)``: called as batches are copied and tables verified.
Progress = Callable[[str, int, int], None]

#: ``guard(force)``: raises (``SourceInUse``) when the copy cannot go on; called
#: between batches (``force`` False: it may skip the check if it made one recently).
Guard = Callable[[bool], None]

#: Rows per batch (one write transaction on DST) by default.
DEFAULT_BATCH_ROWS = 500


class DestinationNotEmpty(errors.AlreadyExists):
    """The destination holds data that did not come from an earlier, interrupted
    migrate of the same source; nothing was written to it."""


class SchemaMismatch(errors.MigrationError):
    """The two stores' schemas differ (a table or column one of them lacks, or a
    different key); nothing was copied."""


class ConcurrentMigrate(errors.TransientError):
    """Another migrate is writing to the same destination; this one stopped."""


class SourceInUse(errors.TransientError):
    """Another process could write to the source (it has one of its files open for
    writing, or holds its writer gate or write lock): a copy would miss its writes.
    ``writers``: {pid: command line}."""

    def __init__(self, message: str, writers: dict[int, str]) -> None:
        self.writers = dict(writers)
        super().__init__(message)


class VerificationFailed(errors.CorruptStore):
    """The destination does not equal the source: a table's row count or SHA-256
    differs, or a blob of the destination is missing or damaged."""

    def __init__(self, message: str, problems: Sequence[str], report: MigrateReport) -> None:
        self.problems = list(problems)
        self.report = report
        super().__init__(message)


# -- reports ---------------------------------------------------------------------------------


@dataclass(slots=True)
class TableReport:
    """One table: its rows in SRC, what this run copied, and the verification."""

    name: str
    rows: int = 0
    copied: int = 0
    dst_rows: int | None = None
    src_sha256: str | None = None
    dst_sha256: str | None = None

    @property
    def verified(self) -> bool:
        return (
            self.src_sha256 is not None
            and self.dst_rows == self.rows
            and self.src_sha256 == self.dst_sha256
        )


@dataclass(slots=True)
class MigrateReport:
    src: str
    dst: str
    src_dialect: str = ""
    dst_dialect: str = ""
    #: Each store's schema version once opened (fleetstore.open migrates both).
    src_schema: int = 0
    dst_schema: int = 0
    #: False for ``verify`` alone.
    copied: bool = True
    #: Whether this run continued an interrupted one (or found it finished).
    resumed: bool = False
    #: Why this run threw away what an earlier run had copied and started over (a
    #: reshard whose source changed since), or None.
    restarted: str | None = None
    tables: list[TableReport] = field(default_factory=list)
    blobs_copied: int = 0
    blob_bytes: int = 0
    blobs_verified: int = 0
    verified: bool = False
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: Each store's layout: "file", "sharded" or "server" (``Store.layout``).
    src_layout: str = ""
    dst_layout: str = ""
    #: Shard files of each store (0 unless sharded).
    src_shards: int = 0
    dst_shards: int = 0
    #: Sessions whose content digest (``transfer.session_digest``) was compared: every
    #: session, when either store is sharded.
    sessions_verified: int = 0

    @property
    def ok(self) -> bool:
        return self.verified and not self.problems

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)

    @property
    def sharded(self) -> bool:
        """Whether either store is sharded (rows hashed order-free, sessions compared)."""
        return "sharded" in (self.src_layout, self.dst_layout)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["ok"] = self.ok
        for t, report in zip(out["tables"], self.tables, strict=True):
            t["verified"] = report.verified
        return out


def format_report(report: MigrateReport, command: str = "migrate") -> str:
    """The report for people."""

    def layout(name: str, shards: int) -> str:
        return f", {shards} shards" if name == "sharded" else ""

    lines = [
        f"fleetstore {command}: {report.src} ({report.src_dialect}, schema {report.src_schema}"
        f"{layout(report.src_layout, report.src_shards)})"
        f" -> {report.dst} ({report.dst_dialect}, schema {report.dst_schema}"
        f"{layout(report.dst_layout, report.dst_shards)})"
        + (" [verify only]" if not report.copied else " [resumed]" if report.resumed else "")
    ]
    if report.restarted:
        lines.append(f"  started over: {report.restarted}")
    rows = [
        (
            t.name,
            f"{t.rows:,}",
            f"{t.copied:,}",
            "ok" if t.verified else ("-" if t.src_sha256 is None else "DIFFERS"),
        )
        for t in report.tables
    ]
    lines.append(table(("table", "rows", "copied", "verified"), rows, right={"rows", "copied"}))
    if report.copied:
        lines.append(
            f"  blob payloads copied: {report.blobs_copied:,} ({report.blob_bytes:,} bytes stored)"
        )
    lines.append(f"  blob payloads verified in DST: {report.blobs_verified:,}")
    if report.sharded:
        lines.append(
            f"  sessions whose content digest is equal through the Store API: "
            f"{report.sessions_verified:,}"
        )
    for problem in report.problems:
        lines.append(f"  MISMATCH: {problem}")
    if report.ok:
        what = "sum of row SHA-256s" if report.sharded else "SHA-256"
        lines.append(
            f"verified: {len(report.tables)} tables, {report.rows:,} rows, every row count and "
            f"{what} equal ({report.seconds:.1f}s)"
        )
    elif report.problems:
        lines.append(f"FAILED: {len(report.problems)} difference(s) between SRC and DST")
    else:
        lines.append("copied, not verified")
    return "\n".join(lines)


__all__ = [
    "DEFAULT_BATCH_ROWS",
    "ConcurrentMigrate",
    "DestinationNotEmpty",
    "Guard",
    "MigrateReport",
    "Progress",
    "SchemaMismatch",
    "SourceInUse",
    "TableReport",
    "VerificationFailed",
    "format_report",
]
