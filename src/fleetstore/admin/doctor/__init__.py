"""``fleetstore doctor``: a strictly read-only health check of any SQLite file.

What it looks at, in order (docs/doctor.md has the findings and the ``--json`` schema):

1. the files: database, ``-wal``, ``-shm``, ``-journal``, fleetstore's ``.gate``; sizes,
   permissions, the database header, the WAL header and the WAL index (``probe``);
2. who has them open (``/proc/*/fd``), which locks they hold (``/proc/locks``), and
   which SQLite library each such process runs (``/proc/PID/maps``; ``looks``);
3. the contents, through a read-only connection (``fleetstore.files.foreign``):
   pragmas, ``quick_check``, the bytes of every table and index (``dbstat``), and for
   a fleetstore store its schema version, outbox and settings; plus the spool journals
   beside it (``probe``);
4. the locks again, ``interval`` seconds after the first look: a lock seen both times
   was held at least that long.

Nothing is written, created, checkpointed or switched: the database's bytes are the
same after (tests/admin/test_doctor.py hashes them, with a live writer and reader).

A sharded store (``sqlite+sharded:///DIR``): the catalog is looked at as above, every
shard file gets the same per-file checks in the same two looks at the locks, and the
catalog's index is held against the files on disk (``shards``;
tests/admin/test_sharded_ops.py hashes every file under DIR).

``findings`` turns what was seen into findings, one function per concern, and
``report`` renders the report as text or JSON.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetstore import errors
from fleetstore.admin.doctor import findings, probe, shards
from fleetstore.admin.doctor.looks import Looks
from fleetstore.admin.doctor.probe import Probe, published_figures, resolve
from fleetstore.admin.doctor.report import (
    EXIT_HEALTHY,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    EXIT_WARNINGS,
    REPORT_VERSION,
    SHARDS_NAMED,
    Finding,
    Report,
    Severity,
    format_report,
)
from fleetstore.core.keys import Keyring
from fleetstore.core.targets import CATALOG, SHARDED_SCHEME, parse_target
from fleetstore.files import inspect
from fleetstore.store.sharded.shards import shard_path


def diagnose(
    path: str | os.PathLike[str] | None,
    *,
    interval: float = 1.0,
    quick_check: bool = True,
    sizes: bool = True,
    now: Callable[[], float] = time.time,
    keyring: Keyring | None = None,
) -> Report:
    """Look at the SQLite file *path* without changing it and return the report.  An
    encrypted store's contents and spool journals are read with *keyring* (without it
    the report says they were not read, and why).  A
    sharded store (``sqlite+sharded:///DIR``, or its directory): its catalog as a
    file, plus the ``sharded`` section (every shard file checked, see
    ``_diagnose_sharded``).

    ``NotFound`` if there is no file; ``InspectFailed`` (reason ``not-a-database``) if it
    is not SQLite; ``PermanentError`` if this very process has it open (run doctor from
    another process: see ``inspect.check_not_open_here``)."""
    kind, target = parse_target(path)
    if kind == "sharded":
        assert isinstance(target, Path)
        return _diagnose_sharded(
            target,
            interval=interval,
            quick_check=quick_check,
            sizes=sizes,
            now=now,
            keyring=keyring,
        )
    db = resolve(path)
    inspect.check_not_open_here([db, db + "-wal", db + "-shm"])
    found = probe.probe_file(db)
    looks = Looks.first_look(*found.watched())
    found.contents = probe.read_contents(
        db, found.header, quick_check, now(), sizes=sizes, keyring=keyring
    )
    looks.second_look(interval)
    processes = looks.processes()
    spool = _spool(found, looks, keyring)
    report = Report(db, probe.file_data(found, processes, looks.waited, spool, now()))
    findings.file_findings(report, found, processes, looks.waited)
    return report


def _diagnose_sharded(
    directory: Path,
    *,
    interval: float,
    quick_check: bool,
    sizes: bool,
    now: Callable[[], float],
    keyring: Keyring | None,
) -> Report:
    """A sharded store: the catalog as one file (its report is the body of this one),
    then each shard file with the same per-file checks (pragmas, ``quick_check``, the
    WAL, who has it open, which locks), all files' locks looked at in the same two
    looks; and what ties the files together: the catalog's index of shards against
    the files on disk, and the catalog+shard intents not finished.

    The files are listed before the catalog is read: a tree created meanwhile is then
    seen with its intent or its index row, never as an orphan; an index row whose
    file is not in the list is looked for again after the read."""
    root = Path(os.path.realpath(directory))
    catalog_path = root / CATALOG
    if not catalog_path.is_file():
        raise errors.NotFound(f"{root}: no sharded store here (no {CATALOG})")
    db = str(catalog_path)
    files = shards.shard_files(root)
    inspect.check_not_open_here(
        [p for f in [db, *(path for _k, path in files)] for p in (f, f + "-wal", f + "-shm")]
    )
    catalog = probe.probe_file(db)
    found = shards.probe_shards(files)
    watched, paths = catalog.watched()
    shards.watch(found, watched, paths)
    looks = Looks.first_look(watched, paths)

    checked_at = now()
    catalog.contents = probe.read_contents(
        db, catalog.header, quick_check, checked_at, catalog=True, sizes=sizes, keyring=keyring
    )
    shards.read_shards(found, quick_check, checked_at, db + ".blobs", keyring)
    looks.second_look(interval)

    processes = looks.processes()
    spool = _spool(catalog, looks, keyring)
    data = probe.file_data(catalog, processes, looks.waited, spool, checked_at, layout="sharded")
    report = Report(db, data)
    findings.file_findings(report, catalog, processes, looks.waited)
    entries = _shard_entries(report, root, found, looks)
    url = f"{SHARDED_SCHEME}://{root}"
    section = shards.shard_section(root, url, catalog.contents, entries, checked_at)
    report.data["sharded"] = section
    findings.shard_findings(report, section, url)
    return report


def _spool(found: Probe, looks: Looks, keyring: Keyring | None) -> dict[str, Any] | None:
    if not found.contents.get("fleetstore"):
        return None
    return probe.read_spool(found.db + ".spool", looks.second, keyring)


def _shard_entries(
    report: Report, root: Path, found: list[shards.Shard], looks: Looks
) -> list[dict[str, Any]]:
    """Each shard checked as a file: its entry in the ``sharded`` section, with its
    findings; on *report*, each finding that is not ok, named with its shard."""
    known = probe.known_schema_version()
    entries: list[dict[str, Any]] = []
    flagged: dict[tuple[Severity, str], list[tuple[str, Finding]]] = {}
    for shard in found:
        entry: dict[str, Any] = {"key": shard.key, "path": str(shard_path(root, shard.key))}
        if shard.probe is None:
            entry.update(bytes=None, findings=[])
            hits = [
                Finding(
                    Severity.PROBLEM,
                    "unreadable",
                    f"SQLite cannot read the database: {shard.error}",
                    "restore this shard from a backup (its sessions are unreachable)",
                )
            ]
        else:
            sub = Report(shard.probe.db, {})
            figures = shard.probe.contents.get("fleetstore")
            if figures is not None:
                sub.data["fleetstore"] = {
                    **figures,
                    "known_schema_version": known,
                    "settings_error": None,
                    "spool": None,
                }
            procs = looks.processes(f"shard:{shard.key}:")
            findings.file_findings(sub, shard.probe, procs, looks.waited, shard=True)
            hits = [f for f in sub.findings if f.severity is not Severity.OK]
            entry.update(shards.shard_figures(shard.probe, procs))
        entry["findings"] = [f.to_json() for f in hits]
        for f in hits:
            flagged.setdefault((f.severity, f.code), []).append((shard.key, f))
        entries.append(entry)
    for of_one_code in flagged.values():
        _name_shards(report, of_one_code)
    return entries


def _name_shards(report: Report, hits: list[tuple[str, Finding]]) -> None:
    """One finding of several shards: the first SHARDS_NAMED one by one, the rest counted."""
    for key, f in hits[:SHARDS_NAMED]:
        report.add(f.severity, f.code, f"shard {key}: {f.message}", f.fix)
    if len(hits) > SHARDS_NAMED:
        rest = [k for k, _f in hits[SHARDS_NAMED:]]
        first = hits[0][1]
        report.add(
            first.severity,
            first.code,
            f"and {len(rest)} more shard(s) with this finding: {', '.join(rest[:20])}"
            + (" ..." if len(rest) > 20 else ""),
            first.fix,
        )


# -- the findings of one file ----------------------------------------------------------------


__all__ = [
    "EXIT_HEALTHY",
    "EXIT_PROBLEMS",
    "EXIT_USAGE",
    "EXIT_WARNINGS",
    "REPORT_VERSION",
    "Finding",
    "Report",
    "Severity",
    "diagnose",
    "format_report",
    "published_figures",
]
