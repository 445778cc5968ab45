"""``fleetstore doctor PATH``: a strictly read-only health check of any SQLite file.

What it looks at, in order (docs/doctor.md has the findings and the ``--json`` schema):

1. the files: database, ``-wal``, ``-shm``, ``-journal``, fleetstore's ``.gate``; sizes,
   permissions, the database header, the WAL header and the WAL index;
2. who has them open (``/proc/*/fd``), which locks they hold (``/proc/locks``), and
   which SQLite library each such process runs (``/proc/PID/maps``);
3. the contents, through a read-only connection (``fleetstore.engine.inspect``):
   pragmas, ``quick_check``, and for a fleetstore store its schema version, outbox
   and settings; plus the spool journals beside it;
4. the locks again, ``interval`` seconds after the first look: a lock seen both times
   was held at least that long.

Nothing is written, created, checkpointed or switched: the database's bytes are the
same after (tests/admin/test_doctor.py hashes them, with a live writer and reader).

A sharded store (``sqlite+sharded:///DIR``): the catalog is looked at as above, every
shard file gets the same per-file checks in the same two looks at the locks, and the
catalog's index is held against the files on disk (``_diagnose_sharded``;
tests/admin/test_sharded_ops.py hashes every file under DIR).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from fleetstore import errors
from fleetstore.engine import inspect
from fleetstore.engine.inspect import FileFacts, Lock

#: Version of the ``--json`` object; raised when a field changes meaning or goes away.
REPORT_VERSION = 1

EXIT_HEALTHY = 0
EXIT_WARNINGS = 1
EXIT_PROBLEMS = 2

# Thresholds, documented in docs/doctor.md.
WAL_LARGE_BYTES = 64 * 1024 * 1024  # = Settings.truncate_bytes
FREELIST_SHARE = 0.25
FREELIST_MIN_BYTES = 1024 * 1024
AUTO_VACUUM_BIG_BYTES = 256 * 1024 * 1024
BACKLOG_AGE_SECONDS = 300.0
QUICK_CHECK_ROWS = 20

FLEETSTORE_TABLES = {"sessions", "applied_ops", "fleetstore_migrations"}
SHARD_TABLES = {"shard_sessions", "shard_intents"}
#: Shards named one by one under a finding code; the rest are counted.
SHARDS_NAMED = 5


def _shards_named(items: list[dict[str, Any]]) -> str:
    """``key (N sessions), ...`` for the first SHARDS_NAMED shards, then how many more."""
    named = ", ".join(f"{i['key']} ({i['sessions']} sessions)" for i in items[:SHARDS_NAMED])
    more = len(items) - SHARDS_NAMED
    return named + (f" and {more} more" if more > 0 else "")


#: Largest shards listed.
SHARDS_LARGEST = 5
EFFECT_STATES = ("pending", "running", "succeeded", "dead", "cancelled")


class Severity(enum.Enum):
    """How bad a finding is; the worst one decides the exit code."""

    #: Checked, and fine (listed so the report says what was looked at).
    OK = "ok"
    #: Works now, but is a risk or wastes something: exit 1.
    WARNING = "warning"
    #: Broken, or losing data or progress now: exit 2.
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
        ordered = sorted(self.findings, key=lambda f: -f.severity.rank)
        return {
            "report_version": REPORT_VERSION,
            "path": self.path,
            "verdict": self.verdict.value,
            "exit_code": self.exit_code,
            **self.data,
            "findings": [f.to_json() for f in ordered],
        }


# -- gathering -------------------------------------------------------------------------------


def resolve(path: str | os.PathLike[str] | None) -> str:
    """The database file *path* names (a file, a directory holding fleetstore.db, a
    sqlite:/// URL, or None for the default store), symlinks resolved.  ``NotFound`` if
    there is no such file; nothing is ever created."""
    from fleetstore.core.targets import resolve_target

    target = resolve_target(path)
    if not target.exists():
        raise errors.NotFound(f"{target}: no such file")
    if not target.is_file():
        raise errors.NotFound(f"{target}: not a regular file")
    return os.path.realpath(target)


@dataclass(slots=True)
class _Probe:
    """One database file: its side files' facts and headers (read before anything is
    opened), then what was read from it and its facts again after."""

    db: str
    sides: dict[str, str]
    before: dict[str, FileFacts]
    header: inspect.Header | None
    shm_index: inspect.ShmIndex | None
    wal_header: inspect.WalHeader | None
    contents: dict[str, Any] = field(default_factory=dict)
    after: dict[str, FileFacts] = field(default_factory=dict)


def _sides(db: str) -> dict[str, str]:
    return {
        "database": db,
        "wal": db + "-wal",
        "shm": db + "-shm",
        "journal": db + "-journal",
        "gate": db + ".gate",
    }


def _probe(db: str) -> _Probe:
    """The files' facts and headers (``InspectFailed`` if *db* is not SQLite)."""
    sides = _sides(db)
    before = {role: FileFacts.of(p) for role, p in sides.items()}
    header = inspect.read_header(db)
    shm_index = inspect.read_shm_index(sides["shm"]) if before["shm"].exists else None
    wal_header = inspect.read_wal_header(sides["wal"]) if before["wal"].exists else None
    return _Probe(db, sides, before, header, shm_index, wal_header)


def diagnose(
    path: str | os.PathLike[str] | None,
    *,
    interval: float = 1.0,
    quick_check: bool = True,
    now: Callable[[], float] = time.time,
) -> Report:
    """Look at the SQLite file *path* without changing it and return the report.  A
    sharded store (``sqlite+sharded:///DIR``, or its directory): its catalog as a
    file, plus the ``sharded`` section (every shard file checked, see
    ``_diagnose_sharded``).

    ``NotFound`` if there is no file; ``InspectFailed`` (reason ``not-a-database``) if it
    is not SQLite; ``PermanentError`` if this very process has it open (run doctor from
    another process: see ``inspect.check_not_open_here``)."""
    from fleetstore.core.targets import parse_target

    kind, target = parse_target(path)
    if kind == "sharded":
        assert isinstance(target, Path)
        return _diagnose_sharded(target, interval=interval, quick_check=quick_check, now=now)
    db = resolve(path)
    sides = _sides(db)
    inspect.check_not_open_here([db, sides["wal"], sides["shm"]])
    report = Report(db, {})
    probe = _probe(db)
    before, header = probe.before, probe.header
    spool_dir = db + ".spool"
    watched = {role: facts.ident for role, facts in before.items()}
    watched.update(_spool_idents(spool_dir))
    first_look = time.monotonic()
    locks_first = inspect.locks_on(watched)
    opened = inspect.open_by_processes({**sides, "spool": spool_dir + "/"})

    contents = _read_contents(db, header, before, quick_check, now())

    inspect_time = time.monotonic() - first_look
    if interval > inspect_time:
        time.sleep(interval - inspect_time)
    locks_second = inspect.locks_on(watched)
    waited = time.monotonic() - first_look
    after = {role: FileFacts.of(p) for role, p in sides.items()}

    pids = sorted({lk.pid for lk in locks_first + locks_second if lk.pid > 0} | set(opened))
    processes = _processes(pids, opened, locks_first, locks_second)
    spool = _spool(spool_dir, locks_second) if contents.get("fleetstore") else None

    report.data = {
        "checked_at": now(),
        "sqlite": {
            "library_version": inspect.library_version(),
            "wal_reset_bug": inspect.wal_reset_bug(inspect.library_version()),
        },
        "files": {role: _file_json(facts) for role, facts in before.items()},
        "database": contents["database"],
        "wal": _wal_json(header, before, probe.shm_index, probe.wal_header),
        "processes": processes,
        "locks_interval": round(waited, 3),
        "fleetstore": _fleetstore_json(db, contents.get("fleetstore"), spool),
    }
    _findings(report, header, before, after, contents, processes, probe.shm_index, waited)
    return report


def _diagnose_sharded(
    directory: Path, *, interval: float, quick_check: bool, now: Callable[[], float]
) -> Report:
    """A sharded store: the catalog as one file (its report is the body of this one),
    then each shard file with the same per-file checks (pragmas, ``quick_check``, the
    WAL, who has it open, which locks), all files' locks looked at in the same two
    looks; and what ties the files together: the catalog's index of shards against
    the files on disk, and the catalog+shard intents not finished.

    The files are listed before the catalog is read: a tree created meanwhile is then
    seen with its intent or its index row, never as an orphan; an index row whose
    file is not in the list is looked for again after the read."""
    from fleetstore.core.targets import CATALOG, SHARDED_SCHEME, SHARDS
    from fleetstore.engine.sharded import shard_key

    root = Path(os.path.realpath(directory))
    catalog_path = root / CATALOG
    if not catalog_path.is_file():
        raise errors.NotFound(f"{root}: no sharded store here (no {CATALOG})")
    db = str(catalog_path)
    shard_files = [
        (p.name[:-3], str(p))
        for p in sorted((root / SHARDS).glob("*/*.db"))
        if shard_key(p.name[:-3]) == p.name[:-3]
    ]
    sides = _sides(db)
    inspect.check_not_open_here(
        [p for f in [db, *(path for _k, path in shard_files)] for p in (f, f + "-wal", f + "-shm")]
    )
    report = Report(db, {})
    probe = _probe(db)
    shards: list[tuple[str, _Probe | None, str | None]] = []
    for key, path in shard_files:
        try:
            shards.append((key, _probe(path), None))
        except inspect.InspectFailed as exc:
            shards.append((key, None, str(exc)))
        except OSError:
            continue  # gone meanwhile (removed by maintain): not a shard any more
    spool_dir = db + ".spool"
    watched = {role: facts.ident for role, facts in probe.before.items()}
    watched.update(_spool_idents(spool_dir))
    paths = {**sides, "spool": spool_dir + "/"}
    for key, shard, _error in shards:
        if shard is not None:
            for role, facts in shard.before.items():
                watched[f"shard:{key}:{role}"] = facts.ident
                paths[f"shard:{key}:{role}"] = shard.sides[role]
    first_look = time.monotonic()
    locks_first = inspect.locks_on(watched)
    opened = inspect.open_by_processes(paths)

    checked_at = now()
    contents = _read_contents(db, probe.header, probe.before, quick_check, checked_at, catalog=True)
    for _key, shard, _error in shards:
        if shard is not None:
            shard.contents = _read_contents(
                shard.db, shard.header, shard.before, quick_check, checked_at
            )

    inspect_time = time.monotonic() - first_look
    if interval > inspect_time:
        time.sleep(interval - inspect_time)
    locks_second = inspect.locks_on(watched)
    waited = time.monotonic() - first_look
    after = {role: FileFacts.of(p) for role, p in sides.items()}
    for _key, shard, _error in shards:
        if shard is not None:
            shard.after = {role: FileFacts.of(p) for role, p in shard.sides.items()}

    libraries: dict[int, list[inspect.SqliteLibrary]] = {}

    def of_file(prefix: str | None) -> list[dict[str, Any]]:
        """The processes using one file: the catalog (prefix None) or a shard."""

        def mine(role: str) -> str | None:
            if prefix is None:
                return None if role.startswith("shard:") else role
            return role[len(prefix) :] if role.startswith(prefix) else None

        first = [dataclasses.replace(lk, file=r) for lk in locks_first if (r := mine(lk.file))]
        second = [dataclasses.replace(lk, file=r) for lk in locks_second if (r := mine(lk.file))]
        files = {
            pid: [dataclasses.replace(f, role=r) for f in fs if (r := mine(f.role))]
            for pid, fs in opened.items()
        }
        files = {pid: fs for pid, fs in files.items() if fs}
        pids = sorted({lk.pid for lk in first + second if lk.pid > 0} | set(files))
        return _processes(pids, files, first, second, libraries)

    processes = of_file(None)
    spool = _spool(spool_dir, locks_second) if contents.get("fleetstore") else None
    report.data = {
        "checked_at": checked_at,
        "layout": "sharded",
        "sqlite": {
            "library_version": inspect.library_version(),
            "wal_reset_bug": inspect.wal_reset_bug(inspect.library_version()),
        },
        "files": {role: _file_json(facts) for role, facts in probe.before.items()},
        "database": contents["database"],
        "wal": _wal_json(probe.header, probe.before, probe.shm_index, probe.wal_header),
        "processes": processes,
        "locks_interval": round(waited, 3),
        "fleetstore": _fleetstore_json(db, contents.get("fleetstore"), spool),
    }
    _findings(
        report,
        probe.header,
        probe.before,
        after,
        contents,
        processes,
        probe.shm_index,
        waited,
    )

    # -- each shard, as a file
    known = _known_schema_version()
    entries: list[dict[str, Any]] = []
    flagged: dict[tuple[Severity, str], list[tuple[str, Finding]]] = {}
    for key, shard, error in shards:
        entry: dict[str, Any] = {"key": key, "path": str(root / SHARDS / key[-2:] / f"{key}.db")}
        if shard is None:
            entry.update(bytes=None, findings=[])
            found = [
                Finding(
                    Severity.PROBLEM,
                    "unreadable",
                    f"SQLite cannot read the database: {error}",
                    "restore this shard from a backup (its sessions are unreachable)",
                )
            ]
        else:
            sub = Report(shard.db, {})
            figures = shard.contents.get("fleetstore")
            if figures is not None:
                sub.data["fleetstore"] = {
                    **figures,
                    "known_schema_version": known,
                    "settings_error": None,
                    "spool": None,
                }
            procs = of_file(f"shard:{key}:")
            _findings(
                sub,
                shard.header,
                shard.before,
                shard.after,
                shard.contents,
                procs,
                shard.shm_index,
                waited,
                shard=True,
            )
            found = [f for f in sub.findings if f.severity is not Severity.OK]
            database = shard.contents["database"]
            entry.update(
                bytes=shard.before["database"].size,
                wal_bytes=shard.before["wal"].size if shard.before["wal"].exists else 0,
                shm_bytes=shard.before["shm"].size if shard.before["shm"].exists else 0,
                sessions=figures["sessions"] if figures else None,
                schema_version=figures["schema_version"] if figures else None,
                journal_mode=database["journal_mode"],
                open_mode=database["open_mode"],
                quick_check=database["quick_check"],
                not_read_reason=database["not_read_reason"],
                processes=[p["pid"] for p in procs],
            )
        entry["findings"] = [f.to_json() for f in found]
        for f in found:
            flagged.setdefault((f.severity, f.code), []).append((key, f))
        entries.append(entry)
    for (_severity, _code), hits in flagged.items():
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

    # -- the catalog's index against the files, and the intents
    url = f"{SHARDED_SCHEME}://{root}"
    section = _shard_section(root, url, contents, entries, checked_at)
    report.data["sharded"] = section
    _shard_findings(report, section, url)
    return report


def _known_schema_version() -> int:
    from fleetstore import sql

    return max((m.version for m in sql.migrations("sqlite")), default=0)


def _shard_section(
    root: Path,
    url: str,
    contents: dict[str, Any],
    entries: list[dict[str, Any]],
    now: float,
) -> dict[str, Any]:
    from fleetstore.store.sharded import owner_alive
    from fleetstore.store.spool import decode_line

    index: dict[str, int] | None = contents.get("shard_index")
    on_disk = {e["key"]: e for e in entries}
    intents: list[dict[str, Any]] = []
    for op_id, key, text, owner, created in contents.get("shard_intents") or []:
        try:
            name = decode_line(str(text).encode("utf-8")).name
        except Exception:  # a damaged record: shown, not decoded
            name = None
        pid_text = str(owner).partition(":")[0]
        intents.append(
            {
                "op_id": str(op_id),
                "shard": str(key),
                "operation": name,
                "owner": str(owner),
                "pid": int(pid_text) if pid_text.isdigit() else None,
                "alive": owner_alive(str(owner)),
                "age": round(now - float(created), 3),
                "shard_file": str(key) in on_disk,
            }
        )
    intended = {i["shard"] for i in intents}
    missing: list[dict[str, Any]] = []
    orphans: list[dict[str, Any]] = []
    empty: list[str] = []
    if index is not None:
        for key, count in sorted(index.items()):
            if key in on_disk:
                continue
            path = root / "shards" / key[-2:] / f"{key}.db"
            if not path.is_file():  # not made since the listing
                missing.append({"key": key, "path": str(path), "sessions": count})
        for key, e in sorted(on_disk.items()):
            if key in index or key in intended:
                continue
            if e.get("sessions") == 0:
                empty.append(key)
            else:
                orphans.append(
                    {
                        "key": key,
                        "path": e["path"],
                        "sessions": e.get("sessions"),
                        "bytes": e.get("bytes"),
                    }
                )
    sized = [e for e in entries if e.get("bytes") is not None]
    total = sum(e["bytes"] + e["wal_bytes"] + e["shm_bytes"] for e in sized)
    largest = sorted(sized, key=lambda e: (-(e["bytes"] + e["wal_bytes"]), e["key"]))
    return {
        "directory": str(root),
        "url": url,
        "shard_files": len(entries),
        "total_bytes": total,
        "wal_bytes": sum(e["wal_bytes"] for e in sized),
        "indexed_shards": None if index is None else len(index),
        "indexed_sessions": None if index is None else sum(index.values()),
        "largest": [
            {
                "key": e["key"],
                "bytes": e["bytes"],
                "wal_bytes": e["wal_bytes"],
                "sessions": e.get("sessions"),
            }
            for e in largest[:SHARDS_LARGEST]
        ],
        "missing": missing,
        "orphans": orphans,
        "empty": empty,
        "intents": intents,
        "with_findings": sum(1 for e in entries if e["findings"]),
        "shards": entries,
    }


def _shard_findings(report: Report, section: dict[str, Any], url: str) -> None:
    add = report.add
    files = section["shard_files"]
    if section["indexed_shards"] is None:
        add(
            Severity.WARNING,
            "shard-index-not-read",
            "the catalog's index of shards could not be read: missing and orphan shard files "
            "were not looked for",
            "see the catalog's findings above; run doctor again",
        )
    if not section["with_findings"]:
        add(
            Severity.OK,
            "shards",
            f"{files} shard file(s), {_mb(section['total_bytes'])}: every one checked, "
            "nothing found",
        )
    else:
        add(
            Severity.OK,
            "shards",
            f"{files} shard file(s), {_mb(section['total_bytes'])}: {section['with_findings']} "
            "with findings (listed with their shard)",
        )
    missing = section["missing"]
    if missing:
        named = _shards_named(missing)
        add(
            Severity.WARNING,
            "shard-missing",
            f"{len(missing)} shard file(s) that the catalog lists sessions in are missing: "
            f"{named}; reading those sessions fails (NotFound)",
            "put the file back at its path (shards/<last 2 characters>/<key>.db) if it was "
            "moved by hand, or restore it from a backup; if it is lost, `fleetstore sessions "
            f"rm ID --yes --store {url}` on its top-level session drops the catalog's rows",
        )
    orphans = section["orphans"]
    if orphans:
        named = _shards_named(orphans)
        add(
            Severity.WARNING,
            "shard-orphan",
            f"{len(orphans)} shard file(s) hold sessions that the catalog does not list, and "
            f"no unfinished write names them: {named}; they are not listed and cannot "
            "be read by id",
            "a crash between a shard's write and the catalog's leaves an intent that "
            f"`fleetstore recover {url}` (or any fleetstore.open) finishes, and none is "
            "left here: export the sessions from a copy of the file, or put back the "
            "catalog from a backup",
        )
    if section["empty"]:
        add(
            Severity.OK,
            "shard-empty",
            f"{len(section['empty'])} shard file(s) hold no session (their trees were "
            "deleted); `fleetstore maintain` removes them",
        )
    stale = [i for i in section["intents"] if not i["alive"]]
    live = [i for i in section["intents"] if i["alive"]]
    if stale:
        named = ", ".join(
            f"{i['operation'] or '?'} on shard {i['shard']} (pid {i['pid']}, "
            f"{i['age']:.0f}s ago{'' if i['shard_file'] else ', no shard file yet'})"
            for i in stale[:SHARDS_NAMED]
        )
        add(
            Severity.WARNING,
            "shard-intent-stale",
            f"{len(stale)} catalog+shard write(s) of processes that are gone were left "
            f"half done: {named}; until finished, the catalog may not list what the shard "
            "holds (or list what it lost)",
            f"`fleetstore recover {url}`, or any fleetstore.open() of the store, finishes "
            "them (it applies each to its shard again, idempotently, then to the catalog)",
        )
    if live:
        add(
            Severity.OK,
            "shard-intents",
            f"{len(live)} catalog+shard write(s) under way in live processes "
            f"(oldest {max(i['age'] for i in live):.0f}s)",
        )


def _file_json(facts: FileFacts) -> dict[str, Any] | None:
    if not facts.exists:
        return None
    return {
        "path": facts.path,
        "size": facts.size,
        "mode": f"{facts.mode:04o}",
        "uid": facts.uid,
        "world_readable": bool(facts.mode & stat.S_IROTH),
        "world_writable": bool(facts.mode & stat.S_IWOTH),
    }


def _wal_json(
    header: inspect.Header | None,
    files: dict[str, FileFacts],
    shm: inspect.ShmIndex | None,
    wal: inspect.WalHeader | None,
) -> dict[str, Any] | None:
    if header is None or not header.wal:
        return None
    frame = (header.page_size or 4096) + 24
    return {
        "file_bytes": files["wal"].size if files["wal"].exists else None,
        "file_frames": wal.file_frames if wal else None,
        "frames": shm.max_frame if shm and shm.valid else None,
        "frame_bytes": frame,
        "backfilled": shm.backfilled if shm and shm.valid else None,
        "read_marks": list(shm.read_marks) if shm and shm.valid else None,
        "index_valid": shm.valid if shm else None,
        "checkpoint_seq": wal.checkpoint_seq if wal and wal.valid else None,
    }


def _read_contents(
    db: str,
    header: inspect.Header | None,
    files: dict[str, FileFacts],
    quick_check: bool,
    now: float,
    *,
    catalog: bool = False,
) -> dict[str, Any]:
    """The database's pragmas and, for a fleetstore store, its own figures, read in one
    read-only transaction (a sharded store's *catalog*: its index of shards and the
    catalog+shard intents too, as ``shard_index`` and ``shard_intents``).  A read
    that SQLite refuses is recorded, not raised."""
    database: dict[str, Any] = {
        "journal_mode": None,
        "page_size": header.page_size if header else None,
        "page_count": header.page_count if header else 0,
        "freelist_count": header.freelist_pages if header else 0,
        "freelist_share": None,
        "auto_vacuum": header.auto_vacuum if header else None,
        "encoding": header.text_encoding if header else None,
        "user_version": header.user_version if header else 0,
        "application_id": header.application_id if header else 0,
        "header_written_by": header.writer_version if header else None,
        "tables": None,
        "open_mode": None,
        "open_mode_reason": None,
        "quick_check": None,
        "not_read": None,
        "not_read_reason": None,
    }
    out: dict[str, Any] = {"database": database}
    if header is None:
        database["journal_mode"] = None
        database["not_read"] = "empty file (0 bytes): no SQLite header yet"
        database["not_read_reason"] = "empty"
        return out
    database["journal_mode"] = "wal" if header.wal else "rollback"
    mode, why = inspect.choose_open_mode(header.wal, files["wal"], files["shm"])
    database["open_mode"], database["open_mode_reason"] = mode, why
    if mode is None:
        database["not_read"], database["not_read_reason"] = why, "wal-without-shm"
        return out
    try:
        with inspect.open_readonly(db, mode) as conn:
            for name in ("page_size", "page_count", "freelist_count", "user_version"):
                database[name] = int(conn.pragma(name))
            database["application_id"] = int(conn.pragma("application_id"))
            database["encoding"] = str(conn.pragma("encoding"))
            database["auto_vacuum"] = {0: "none", 1: "full", 2: "incremental"}.get(
                int(conn.pragma("auto_vacuum")), "unknown"
            )
            tables = {
                str(r[0]) for r in conn.query("SELECT name FROM sqlite_schema WHERE type = 'table'")
            }
            database["tables"] = len(tables)
            if quick_check:
                rows = conn.query(f"PRAGMA quick_check({QUICK_CHECK_ROWS})")
                database["quick_check"] = [str(r[0]) for r in rows]
            if FLEETSTORE_TABLES.issubset(tables):
                out["fleetstore"] = _store_figures(conn, tables, now)
            if catalog and SHARD_TABLES.issubset(tables):
                out["shard_index"] = {
                    str(k): int(n)
                    for k, n in conn.query(
                        "SELECT shard, count(*) FROM shard_sessions GROUP BY shard"
                    )
                }
                out["shard_intents"] = conn.query(
                    "SELECT op_id, shard, op, owner, created_at FROM shard_intents "
                    "ORDER BY created_at, op_id"
                )
    except inspect.InspectFailed as exc:
        database["not_read"], database["not_read_reason"] = str(exc), exc.reason
    pages = database["page_count"] or 0
    if pages:
        database["freelist_share"] = round((database["freelist_count"] or 0) / pages, 4)
    return out


def _store_figures(conn: inspect.ReadOnlyDatabase, tables: set[str], now: float) -> dict[str, Any]:
    """What a fleetstore store holds that an operator asks about: its schema version,
    its size in sessions, and its outbox backlog."""
    version = int(conn.query("SELECT coalesce(max(version), 0) FROM fleetstore_migrations")[0][0])
    figures: dict[str, Any] = {
        "schema_version": version,
        "sessions": int(conn.query("SELECT count(*) FROM sessions")[0][0]),
        "outbox": None,
    }
    if "effects" in tables:
        columns = {str(r[1]) for r in conn.query("PRAGMA table_info(effects)")}
        outbox: dict[str, Any] = {"by_state": dict.fromkeys(EFFECT_STATES, 0)}
        for state, count in conn.query("SELECT state, count(*) FROM effects GROUP BY state"):
            outbox["by_state"][str(state)] = int(count)
        if "lease_expires_at" in columns:
            count, oldest = conn.query(
                "SELECT count(*), min(lease_expires_at) FROM effects "
                "WHERE state = 'running' AND lease_expires_at < ?",
                (now,),
            )[0]
            outbox["stuck_running"] = int(count)
            outbox["stuck_since"] = float(oldest) if oldest is not None else None
        if "available_at" in columns:
            count, oldest = conn.query(
                "SELECT count(*), min(available_at) FROM effects "
                "WHERE state = 'pending' AND available_at <= ?",
                (now,),
            )[0]
            outbox["ready_pending"] = int(count)
            outbox["oldest_ready_age"] = round(now - float(oldest), 3) if oldest else None
        figures["outbox"] = outbox
    return figures


def _spool_idents(spool_dir: str) -> dict[str, tuple[int, int, int] | None]:
    try:
        names = sorted(os.listdir(spool_dir))
    except OSError:
        return {}
    return {
        f"spool:{name}": FileFacts.of(os.path.join(spool_dir, name)).ident
        for name in names
        if name.endswith(".jsonl")
    }


def _spool(spool_dir: str, locks: list[Lock]) -> dict[str, Any]:
    """The spool journals beside a store: whose they are, whether that process still
    holds them (its flock, seen in /proc/locks), how many operations wait in each."""
    from fleetstore.store.spool import REJECTED, journal_pid, read_journal

    holders = {lk.file.removeprefix("spool:"): lk.pid for lk in locks if lk.kind == "FLOCK"}
    journals: list[dict[str, Any]] = []
    rejected = 0
    try:
        names = sorted(os.listdir(spool_dir))
    except OSError:
        return {"path": spool_dir, "journals": [], "rejected": 0}
    for name in names:
        full = Path(spool_dir) / name
        if name == REJECTED:
            try:
                rejected = full.read_bytes().count(b"\n")
            except OSError:
                pass
            continue
        pid = journal_pid(full)
        if pid is None:
            continue
        try:
            read = read_journal(full)
            ops, damaged = len(read.ops), read.damaged
            size = full.stat().st_size
        except OSError:
            continue
        holder = holders.get(name)
        journals.append(
            {
                "journal": name,
                "pid": pid,
                "operations": ops,
                "bytes": size,
                "damaged": damaged,
                "held_by": holder,
                "live": holder is not None,
            }
        )
    return {"path": spool_dir, "journals": journals, "rejected": rejected}


def published_figures(store_path: str) -> list[dict[str, Any]]:
    """The figures processes publish beside the store (``<db>.procs/<pid>.json``, as
    ``Store.metrics()`` returns them, for ``fleetstore top``), one dict per process.
    Reading them changes nothing."""
    from fleetstore.store.procstats import read_published

    return [
        {
            "pid": p.pid,
            "command": p.command,
            "alive": p.alive,
            "age": round(p.age, 3),
            "figures": {k: v for k, v in p.record.items() if k != "histograms"},
        }
        for p in read_published(store_path)
    ]


def _fleetstore_json(
    db: str, figures: dict[str, Any] | None, spool: dict[str, Any] | None
) -> dict[str, Any] | None:
    if figures is None:
        return None
    from fleetstore.core.settings import Settings

    known = _known_schema_version()
    settings: dict[str, Any] | None
    try:
        settings = dataclasses.asdict(Settings.load())
        settings_error = None
    except errors.ConfigError as exc:
        settings, settings_error = None, str(exc)
    return {
        **figures,
        "known_schema_version": known,
        "settings": settings,
        "settings_error": settings_error,
        "spool": spool,
        "processes": published_figures(db),
    }


def _processes(
    pids: list[int],
    opened: dict[int, list[inspect.OpenFile]],
    first: list[Lock],
    second: list[Lock],
    libraries: dict[int, list[inspect.SqliteLibrary]] | None = None,
) -> list[dict[str, Any]]:
    """Each process's open files and locks (seen in the first look, the second, or
    both); *libraries* caches each PID's SQLite libraries across files."""
    keys_first = {lk.key for lk in first}
    keys_second = {lk.key for lk in second}
    out: list[dict[str, Any]] = []
    for pid in pids:
        locks: list[dict[str, Any]] = []
        seen: set[tuple[int, str, str, str, int, int | None]] = set()
        for lk in [*first, *second]:
            if lk.pid != pid or lk.key in seen:
                continue
            seen.add(lk.key)
            locks.append(
                {
                    "file": lk.file,
                    "kind": lk.kind,
                    "mode": lk.mode,
                    "names": list(lk.names),
                    "range": [lk.start, lk.end],
                    "seen": "both"
                    if lk.key in keys_first and lk.key in keys_second
                    else ("first" if lk.key in keys_first else "second"),
                }
            )
        files = opened.get(pid, [])
        libs: list[inspect.SqliteLibrary] = []
        if any(f.role in ("database", "wal", "shm") for f in files):
            if libraries is None:
                libs = inspect.sqlite_libraries(pid)
            else:
                if pid not in libraries:
                    libraries[pid] = inspect.sqlite_libraries(pid)
                libs = libraries[pid]
        out.append(
            {
                "pid": pid,
                "command": inspect.command_line(pid),
                "alive": inspect.process_alive(pid),
                "open": sorted({f.role for f in files}),
                "deleted_open": sorted({f.role for f in files if f.deleted}),
                "locks": locks,
                "sqlite_libraries": [
                    {
                        "path": lib.path,
                        "version": lib.version,
                        "wal_reset_bug": bool(lib.version and inspect.wal_reset_bug(lib.version)),
                    }
                    for lib in libs
                ],
            }
        )
    return out


# -- findings --------------------------------------------------------------------------------


def _mb(n: int | float) -> str:
    return f"{n / 1e6:.1f} MB"


def _who(proc: dict[str, Any]) -> str:
    return f"pid {proc['pid']}" + (f" ({proc['command']})" if proc["command"] else "")


def _holding(proc: dict[str, Any], name: str, *, mode: str | None = None) -> list[dict[str, Any]]:
    return [
        lk for lk in proc["locks"] if name in lk["names"] and (mode is None or lk["mode"] == mode)
    ]


def _findings(
    report: Report,
    header: inspect.Header | None,
    before: dict[str, FileFacts],
    after: dict[str, FileFacts],
    contents: dict[str, Any],
    processes: list[dict[str, Any]],
    shm: inspect.ShmIndex | None,
    waited: float,
    *,
    shard: bool = False,
) -> None:
    add = report.add
    database = contents["database"]
    is_store = contents.get("fleetstore") is not None
    db_size = before["database"].size

    version = inspect.library_version()
    if shard:
        pass  # said once, for the catalog
    elif inspect.wal_reset_bug(version):
        add(
            Severity.WARNING,
            "sqlite-wal-reset-bug",
            f"this program's SQLite library is {version}, which has the WAL-reset "
            "corruption bug (3.7.0 to 3.51.2; https://sqlite.org/wal.html#the_wal_reset_bug)",
            "upgrade to a SQLite of 3.51.3 or later (or the 3.44.6 / 3.50.7 backports)",
        )
    else:
        add(Severity.OK, "sqlite-version", f"SQLite library {version}: free of the WAL-reset bug")

    # -- files and permissions
    for role, facts in before.items():
        if not facts.exists:
            continue
        if facts.mode & stat.S_IWOTH:
            add(
                Severity.PROBLEM,
                "world-writable",
                f"{facts.path} is writable by every user (mode {facts.mode:04o}): anyone can "
                "change or corrupt it",
                f"chmod o-w {facts.path} (fleetstore creates its files 0600)",
            )
        elif facts.mode & stat.S_IROTH:
            add(
                Severity.PROBLEM if is_store and role != "gate" else Severity.WARNING,
                "world-readable",
                f"{facts.path} is readable by every user (mode {facts.mode:04o})"
                + (": session history often carries secrets" if is_store else ""),
                f"chmod o-rwx {facts.path} (fleetstore creates its files 0600)",
            )
    directory = os.path.dirname(report.path)
    dmode = FileFacts.of(directory).mode
    if dmode & stat.S_IWOTH and not dmode & stat.S_ISVTX and not shard:
        add(
            Severity.WARNING,
            "directory-world-writable",
            f"{directory} is writable by every user (mode {dmode:04o}): anyone can delete or "
            "replace the database, its -wal or its -shm",
            f"chmod o-w {directory}, or move the database to a private directory",
        )

    if header is None:
        add(
            Severity.WARNING,
            "empty-file",
            f"{report.path} is empty (0 bytes): a program created it but never wrote a "
            "database; SQLite would treat it as a new empty database",
            "nothing to repair; check that the program that made it is not failing at start",
        )

    # -- journal mode
    if header is not None and not header.wal:
        add(
            Severity.WARNING,
            "wal-not-enabled",
            "the database uses a rollback journal, not WAL: readers and the writer block "
            "each other, so concurrent processes meet 'database is locked' far more often",
            "switch once, while no other process has the file open: "
            "PRAGMA journal_mode=WAL (fleetstore.open does this for its stores)",
        )
    elif header is not None:
        add(Severity.OK, "wal-enabled", "the database is in WAL mode")
    journal = before["journal"]
    if journal.exists and journal.size > 0 and database["not_read_reason"] == "hot-journal":
        add(
            Severity.PROBLEM,
            "hot-journal",
            f"{journal.path} holds an unfinished transaction of a writer that died: the "
            "database cannot be read until it is rolled back",
            "open the database read-write once with any SQLite program (it rolls the "
            "journal back); never delete the -journal file, that corrupts the database",
        )

    # -- contents
    not_read = database["not_read"]
    reason = database["not_read_reason"]
    if not_read and reason not in ("hot-journal", "empty"):
        if reason in ("corrupt", "not-a-database"):
            add(
                Severity.PROBLEM,
                "unreadable",
                f"SQLite cannot read the database: {not_read}",
                "stop every writer, keep a copy of all files (db, -wal, -shm), then restore "
                "from a backup or salvage with `sqlite3 DB .recover`",
            )
        elif reason == "busy":
            holders = [
                _who(p)
                for p in processes
                if _holding(p, "exclusive") or _holding(p, "pending") or _holding(p, "recover")
            ]
            add(
                Severity.WARNING,
                "not-read-busy",
                "the contents were not checked: the database stayed locked"
                + (f" by {', '.join(holders)}" if holders else ""),
                "run doctor again once the long transaction ends",
            )
        elif reason == "wal-without-shm":
            add(
                Severity.WARNING,
                "wal-without-shm",
                f"the contents were not checked: {not_read}",
                "nothing is wrong by itself; to check the contents, let the application open "
                "the database (it rebuilds the -shm), then run doctor again",
            )
        else:
            add(
                Severity.WARNING,
                "not-read",
                f"the contents were not checked: {not_read}",
                "run doctor again; if it persists, check the file's permissions",
            )
    checked = database["quick_check"]
    if checked is not None:
        if checked == ["ok"]:
            add(Severity.OK, "quick-check", "PRAGMA quick_check: ok")
        else:
            shown = "; ".join(checked[:5]) + (" ..." if len(checked) > 5 else "")
            add(
                Severity.PROBLEM,
                "quick-check-failed",
                f"PRAGMA quick_check found damage: {shown}",
                "stop every writer, copy the db with its -wal and -shm, then restore from a "
                "backup or salvage with `sqlite3 DB .recover`; run PRAGMA integrity_check "
                "for the full list",
            )
    # Without locks, only a checkpoint writing the main file meanwhile can mislead.
    if database["open_mode"] == "immutable" and not before["database"].same_content_as(
        after["database"]
    ):
        add(
            Severity.WARNING,
            "changed-during-check",
            "the database changed while doctor read it without locks (a writer started): "
            "the figures above may be inconsistent",
            "run doctor again",
        )

    pages, page_size = database["page_count"] or 0, database["page_size"] or 0
    free = database["freelist_count"] or 0
    if pages and free / pages >= FREELIST_SHARE and free * page_size >= FREELIST_MIN_BYTES:
        add(
            Severity.WARNING,
            "freelist-high",
            f"{free} of {pages} pages ({free / pages:.0%}, {_mb(free * page_size)}) are free: "
            "the file is much bigger than its data",
            "reclaim the space: `fleetstore maintain` (VACUUM, or incremental_vacuum when "
            "auto_vacuum is incremental)",
        )
    if database["auto_vacuum"] == "none" and db_size >= AUTO_VACUUM_BIG_BYTES:
        add(
            Severity.WARNING,
            "auto-vacuum-off",
            f"auto_vacuum is NONE on a {_mb(db_size)} file: deleted data never gives "
            "space back without a full VACUUM",
            "PRAGMA auto_vacuum=INCREMENTAL followed by one VACUUM (rewrites the file; needs "
            "the write lock and free disk space of the file's size)",
        )

    # -- WAL
    wal_size = before["wal"].size if before["wal"].exists else 0
    if header is not None and header.wal and wal_size >= WAL_LARGE_BYTES and wal_size > db_size:
        live = ""
        if shm is not None and shm.valid:
            live = f"; {shm.max_frame} frames in use, {shm.backfilled} copied back"
        add(
            Severity.WARNING,
            "wal-large",
            f"the WAL is {_mb(wal_size)}, bigger than the database ({_mb(db_size)}){live}: "
            "checkpoints are not keeping up, or a reader keeps the WAL from being reset",
            "end long read transactions, then `fleetstore maintain` or "
            "PRAGMA wal_checkpoint(TRUNCATE) when no reader is active",
        )

    # -- processes and locks
    for proc in processes:
        who = _who(proc)
        if proc["deleted_open"]:
            add(
                Severity.PROBLEM,
                "deleted-file-open",
                f"{who} holds a deleted or replaced {', '.join(proc['deleted_open'])} file "
                "open: it reads and writes a file nobody else sees, and its commits there "
                "are lost (a -wal or -shm deleted under a live process corrupts the database)",
                f"restart {who}; never delete or replace -wal/-shm files while a process has "
                "the database open",
            )
        for lib in proc["sqlite_libraries"]:
            if lib["wal_reset_bug"] and header is not None and header.wal:
                add(
                    Severity.WARNING,
                    "process-sqlite-wal-reset-bug",
                    f"{who} uses SQLite {lib['version']} ({lib['path']}), which has the "
                    "WAL-reset corruption bug (https://sqlite.org/wal.html#the_wal_reset_bug), "
                    "on this WAL database: several writers and checkpoints at once can corrupt "
                    "it",
                    "upgrade that program's SQLite to 3.51.3 or later (fleetstore bundles a "
                    "fixed one through apsw)",
                )
        both = [lk for lk in proc["locks"] if lk["seen"] == "both"]
        writing = _holding(proc, "wal-write", mode="WRITE") or [
            lk
            for lk in proc["locks"]
            if {"reserved", "pending", "exclusive"} & set(lk["names"]) and lk["mode"] == "WRITE"
        ]
        long_write = [lk for lk in writing if lk in both]
        if long_write:
            add(
                Severity.WARNING,
                "write-lock-held",
                f"{who} held SQLite's write lock ({', '.join(long_write[0]['names'])}) in both "
                f"looks, {waited:.1f}s apart: every other writer waits for it",
                "if that program is not mid-way through a big write, it keeps a write "
                "transaction open: make it commit promptly (ending the process rolls back)",
            )
        elif writing:
            add(Severity.OK, "writer", f"{who} was writing (held the write lock once)")
        gate = [lk for lk in proc["locks"] if lk["file"] == "gate" and lk["mode"] == "WRITE"]
        if gate and any(lk["seen"] == "both" for lk in gate):
            add(
                Severity.WARNING,
                "gate-held",
                f"{who} held fleetstore's writer gate in both looks, {waited:.1f}s apart: "
                "fleetstore writers queue behind it",
                "it is inside a long write; if it hangs, end it (the kernel frees the gate)",
            )
        readers = [
            lk
            for lk in both
            if lk["mode"] == "READ" and any(n.startswith("wal-read-") for n in lk["names"])
        ]
        if readers and not writing:
            slots = sorted(
                int(n.rsplit("-", 1)[1])
                for lk in readers
                for n in lk["names"]
                if n.startswith("wal-read-")
            )
            add(
                Severity.WARNING,
                "wal-reset-blocked",
                f"{who} held a read transaction (WAL read lock {slots[0]}) in both looks, "
                f"{waited:.1f}s apart: while it lasts the WAL cannot be reset"
                + (
                    " and no checkpoint can copy frames back at all"
                    if slots[0] == 0
                    else ", checkpoints stop at its snapshot"
                )
                + f", so the WAL keeps growing (now {_mb(wal_size)})",
                "end that read transaction (commit or roll back, keep reads short); the next "
                "checkpoint can then reset the WAL",
            )

    # -- fleetstore store
    figures = report.data.get("fleetstore")
    if figures is not None:
        _store_findings(report, figures)
    elif header is not None and not database["not_read"]:
        add(Severity.OK, "foreign-database", "not a fleetstore store: SQLite checks only")


def _store_findings(report: Report, store: dict[str, Any]) -> None:
    add = report.add
    version, known = store["schema_version"], store["known_schema_version"]
    if version > known:
        add(
            Severity.WARNING,
            "schema-newer",
            f"the store is at schema version {version}, newer than this fleetstore knows "
            f"({known}): this version refuses to open it",
            "upgrade fleetstore on this host",
        )
    elif version < known:
        add(
            Severity.OK,
            "schema-older",
            f"schema version {version}; the next fleetstore.open() migrates it to {known}",
        )
    else:
        add(Severity.OK, "schema", f"schema version {version} (current)")
    if store["settings_error"]:
        add(
            Severity.WARNING,
            "settings-invalid",
            f"the FLEETSTORE_* environment here is invalid: {store['settings_error']}",
            "fix or unset that variable; fleetstore.open() refuses to start with it",
        )
    outbox = store.get("outbox")
    if outbox:
        stuck = outbox.get("stuck_running", 0)
        if stuck:
            add(
                Severity.WARNING,
                "effects-stuck",
                f"{stuck} outbox effect(s) are 'running' with an expired lease: their worker "
                "is gone, and each blocks the later effects of its thread",
                "run a worker (it sweeps expired leases), or store.effects.sweep()",
            )
        dead = outbox["by_state"].get("dead", 0)
        if dead:
            add(
                Severity.WARNING,
                "effects-dead",
                f"{dead} outbox effect(s) are dead (out of attempts or not replay-safe)",
                "look at their last_error; store.effects.retry(id) or cancel(id) each",
            )
        age = outbox.get("oldest_ready_age")
        if age is not None and age >= BACKLOG_AGE_SECONDS:
            add(
                Severity.WARNING,
                "outbox-backlog",
                f"{outbox['ready_pending']} effect(s) are ready and waiting, the oldest for "
                f"{age:.0f}s: no worker is taking them",
                "start (more) workers for these kinds",
            )
        if not stuck and not dead and (age is None or age < BACKLOG_AGE_SECONDS):
            add(Severity.OK, "outbox", "outbox: nothing stuck, dead or waiting long")
    spool = store.get("spool")
    if spool:
        stale = [j for j in spool["journals"] if not j["live"]]
        if stale:
            ops = sum(j["operations"] for j in stale)
            add(
                Severity.WARNING,
                "spool-stale",
                f"{len(stale)} spool journal(s) of processes that are gone hold {ops} "
                "acknowledged write(s) not yet in the database",
                f"fleetstore recover {report.path}",
            )
        damaged = [j["journal"] for j in spool["journals"] if j["damaged"]]
        if damaged:
            add(
                Severity.PROBLEM,
                "spool-damaged",
                f"damaged spool journal(s): {', '.join(damaged)}; recover stops at the damage",
                f"fleetstore recover {report.path}, then look at the kept file",
            )
        if spool["rejected"]:
            add(
                Severity.WARNING,
                "spool-rejected",
                f"{spool['rejected']} operation(s) were rejected on replay and kept in "
                f"{spool['path']}/rejected.jsonl",
                "read each record's error; re-apply by hand what still matters",
            )


# -- output ----------------------------------------------------------------------------------

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
    for role in ("database", "wal", "shm", "journal", "gate"):
        f = files.get(role)
        if f:
            lines.append(f"  {role:<9} {f['size']:>14,} bytes  mode {f['mode']}  uid {f['uid']}")
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
        lines.append(f"  pid {proc['pid']}: {proc['command'] or '?'}")
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
    for f in sorted(report.findings, key=lambda f: -f.severity.rank):
        lines.append(f"  [{_MARK[f.severity]}] {f.code}: {f.message}")
        if f.fix and f.severity is not Severity.OK:
            lines.append(f"      fix: {f.fix}")
    verdict = {
        Severity.OK: "healthy",
        Severity.WARNING: "warnings",
        Severity.PROBLEM: "problems",
    }[report.verdict]
    lines += ["", f"verdict: {verdict} (exit {report.exit_code})"]
    return "\n".join(lines)


def _shard_lines(section: dict[str, Any]) -> list[str]:
    """The sharded section as text: a few summary lines however many shards; the
    shards with findings are named in the findings."""
    lines = ["", f"Shards ({section['directory']}/shards)"]
    indexed = section["indexed_shards"]
    lines.append(
        f"  {section['shard_files']:,} shard files, {_mb(section['total_bytes'])} "
        f"(WAL {_mb(section['wal_bytes'])}); "
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
                f"{e['key']} {_mb(e['bytes'])}"
                + (f" (WAL {_mb(e['wal_bytes'])})" if e["wal_bytes"] else "")
                for e in section["largest"]
            )
        )
    for name, items in (("missing", section["missing"]), ("orphan", section["orphans"])):
        if items:
            lines.append(f"  {name} files: {_shards_named(items)}")
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


# -- the command -----------------------------------------------------------------------------


@click.command(
    name="doctor",
    epilog="""\b
Exit codes:
  0  healthy: every check passed
  1  warnings: works now, but something is a risk or wastes space (see the findings)
  2  problems (damage, a deleted file held open, a hot journal, world-writable files...),
     or PATH does not exist or is not a SQLite database, or bad usage""",
)
@click.argument("path", required=False, default=None, type=click.Path(path_type=str))
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    default=False,
    envvar="FLEETSTORE_DOCTOR_JSON",
    show_envvar=True,
    help="Print the report as one JSON object on stdout instead of text.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    envvar="FLEETSTORE_DOCTOR_INTERVAL",
    show_envvar=True,
    help="Seconds between the two looks at the locks: a lock seen both times was held at "
    "least that long (0: look twice at once).",
)
@click.option(
    "--quick-check/--no-quick-check",
    default=True,
    show_default=True,
    envvar="FLEETSTORE_DOCTOR_QUICK_CHECK",
    show_envvar=True,
    help="Run PRAGMA quick_check (reads every page; on a rollback-journal database it holds "
    "a shared lock meanwhile, which delays writers' commits).",
)
def doctor_command(path: str | None, as_json: bool, interval: float, quick_check: bool) -> None:
    """Check any SQLite database, fleetstore's or another program's, strictly read-only.

    PATH is a database file, a directory holding fleetstore.db, or sqlite:///absolute/path;
    default $FLEETSTORE_URL, else DATA_DIR/fleetstore.db. A sharded store
    (sqlite+sharded:///DIR, or DIR) is checked whole: its catalog, every shard file, the
    catalog's index against the files (missing, orphan and empty shards) and the
    catalog+shard writes left unfinished. Reports the journal mode, page
    size, sizes of the database/WAL/SHM files, freelist share, auto_vacuum, the SQLite
    library version (flagging the WAL-reset bug), which processes hold the file open and
    which locks they hold (naming the WAL write lock's holder and readers that keep the
    WAL from being reset), quick_check, and for a fleetstore store its schema version,
    settings, outbox backlog and spool journals. Each finding says how to fix it. Nothing
    is written: no byte of the files changes, no -wal/-shm is created, nothing is
    checkpointed. Processes of other users are visible only to root.
    """
    try:
        report = diagnose(path, interval=interval, quick_check=quick_check)
    except errors.ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    except errors.NotFound as exc:
        click.echo(f"fleetstore doctor: {exc} (nothing was created)", err=True)
        sys.exit(EXIT_PROBLEMS)
    except inspect.InspectFailed as exc:
        click.echo(f"fleetstore doctor: {exc}", err=True)
        sys.exit(EXIT_PROBLEMS)
    except (errors.FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore doctor: {exc}", err=True)
        sys.exit(EXIT_PROBLEMS)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(format_report(report))
    sys.exit(report.exit_code)


__all__ = [
    "EXIT_HEALTHY",
    "EXIT_PROBLEMS",
    "EXIT_WARNINGS",
    "Finding",
    "REPORT_VERSION",
    "Report",
    "Severity",
    "diagnose",
    "doctor_command",
    "format_report",
    "published_figures",
]
