"""Findings: what ``diagnose`` saw, turned into findings, one function per concern
(the SQLite library, permissions, the journal, the read, integrity, space, the WAL,
processes, locks; a store's schema, outbox and spool; a sharded store's files and
intents).  Every finding code is written in this package, and
tests/admin/test_doctor.py holds them to docs/doctor.md's table."""

from __future__ import annotations

import os
import stat
from typing import Any

from fleetstore.admin.doctor.probe import LONG_RUNNING_SECONDS, OVERDUE_SLACK_SECONDS, Probe
from fleetstore.admin.doctor.report import SHARDS_NAMED, Report, Severity, shards_named
from fleetstore.core.units import size
from fleetstore.errors import describe_state
from fleetstore.files import inspect
from fleetstore.files.inspect import FileFacts

# Thresholds, documented in docs/doctor.md.
WAL_LARGE_BYTES = 64 * 1024 * 1024  # = Settings.truncate_bytes
FREELIST_SHARE = 0.25
FREELIST_MIN_BYTES = 1024 * 1024
AUTO_VACUUM_BIG_BYTES = 256 * 1024 * 1024
BACKLOG_AGE_SECONDS = 300.0
DISK_FULL_BYTES = 16 * 1024 * 1024
DISK_LOW_BYTES = 512 * 1024 * 1024
#: One table (with its indexes) holding this share of a foreign file of at least
#: LARGEST_TABLE_MIN_BYTES is where that file grows (issue 28: opencode's event table
#: was about 80 % of a 303 MB file).
LARGEST_TABLE_SHARE = 0.5
LARGEST_TABLE_MIN_BYTES = 256 * 1024 * 1024

#: What the programs that share a SQLite file set, and why: the figures measured by
#: ``fleetstore stress`` (README, docs/benchmarks.md) and in issue 28.
BUSY_TIMEOUT_ADVICE = (
    "every program writing this file waits for SQLite's write lock with its own busy "
    "timeout and fails with 'database is locked' past it. Measured: a lock held 6.5 s "
    "failed the turn of every agent that met it with opencode's and the Agents SDK's "
    "5 s timeout (16 of 16 agents); 4 Agents SDK processes on SQLiteSession all died "
    "under a 6 s outside lock; a transaction that reads and then writes (deferred "
    "BEGIN) fails at once under contention whatever the timeout (55-99 % of them; "
    "zcode's pattern, 10 s timeout: 18,447 failed turns in one run); and with BEGIN "
    "IMMEDIATE and 5 s, at 64 processes some writes waited the full 5 s and failed"
)
BUSY_TIMEOUT_FIX = (
    "in each program that writes it: BEGIN IMMEDIATE for every transaction that may "
    "write (its wait then goes through the busy timeout instead of failing at once); a "
    "busy timeout longer than the longest write lock anyone holds, checkpoints and "
    "maintenance included: 30-60 s, not 5 s (it costs nothing while the lock is free); "
    "short write transactions. fleetstore's own writers instead queue on a flock gate "
    "before SQLite's lock (a freed lock passes on in 0.06 ms rather than after a busy "
    "handler's nap, 13 ms median), wait up to the write budget (60 s), and past it keep "
    "the write in a journal (the spool) rather than fail"
)


def free_bytes(path: str) -> int | None:
    """Bytes an unprivileged writer may still use on *path*'s file system (None: unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _who(proc: dict[str, Any]) -> str:
    note = describe_state(proc.get("state", ""))
    return (
        f"pid {proc['pid']}"
        + (f" ({proc['command']})" if proc["command"] else "")
        + (f" ({note})" if note else "")
    )


def _holding(proc: dict[str, Any], name: str, *, mode: str | None = None) -> list[dict[str, Any]]:
    return [
        lk for lk in proc["locks"] if name in lk["names"] and (mode is None or lk["mode"] == mode)
    ]


def file_findings(
    report: Report,
    found: Probe,
    processes: list[dict[str, Any]],
    waited: float,
    *,
    shard: bool = False,
) -> None:
    """The findings about one database file, in the order the report lists them
    within a severity; a shard's (*shard*) leave out what is said for the catalog."""
    database = found.contents["database"]
    header, before = found.header, found.before
    wal_size = before["wal"].size if before["wal"].exists else 0
    if not shard:
        _sqlite_findings(report)
    _permission_findings(report, before, found.contents.get("fleetstore") is not None, shard)
    _journal_findings(report, header, before["journal"], database)
    _read_findings(report, database, processes)
    _integrity_findings(report, database, bool(found.contents.get("changed")))
    _space_findings(report, database, before["database"].size)
    if not shard:
        _disk_findings(report, wal_size)
    _wal_findings(report, header, before["database"].size, wal_size, found.shm_index)
    _board_findings(report, report.data.get("board"))
    for proc in processes:
        _process_findings(report, proc, header)
        _lock_findings(report, proc, waited, wal_size)
    figures = report.data.get("fleetstore")
    _size_findings(report, database, foreign=figures is None)
    if figures is not None:
        _store_findings(report, figures)
    elif header is not None and not database["not_read"]:
        report.add(Severity.OK, "foreign-database", "not a fleetstore store: SQLite checks only")
        if not shard:
            report.add(Severity.OK, "busy-timeout", BUSY_TIMEOUT_ADVICE, BUSY_TIMEOUT_FIX)


def _sqlite_findings(report: Report) -> None:
    add = report.add
    version = inspect.library_version()
    if inspect.wal_reset_bug(version):
        add(
            Severity.WARNING,
            "sqlite-wal-reset-bug",
            f"this program's SQLite library is {version}, which has the WAL-reset "
            "corruption bug (3.7.0 to 3.51.2; https://sqlite.org/wal.html#the_wal_reset_bug)",
            "upgrade to a SQLite of 3.51.3 or later (or the 3.44.6 / 3.50.7 backports)",
        )
    else:
        add(Severity.OK, "sqlite-version", f"SQLite library {version}: free of the WAL-reset bug")


def _permission_findings(
    report: Report, before: dict[str, FileFacts], is_store: bool, shard: bool
) -> None:
    add = report.add
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
        elif is_store and role != "gate" and facts.mode & (stat.S_IRGRP | stat.S_IWGRP):
            add(
                Severity.PROBLEM,
                "group-access",
                f"{facts.path} can be read or written by its group (mode {facts.mode:04o}): "
                "fleetstore.open refuses it (UnsafeFile); a store is one user's",
                f"chmod g-rwx {facts.path} (fleetstore creates its files 0600)",
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


def _journal_findings(
    report: Report, header: inspect.Header | None, journal: FileFacts, database: dict[str, Any]
) -> None:
    add = report.add
    if header is None:
        add(
            Severity.WARNING,
            "empty-file",
            f"{report.path} is empty (0 bytes): a program created it but never wrote a "
            "database; SQLite would treat it as a new empty database",
            "nothing to repair; check that the program that made it is not failing at start",
        )
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
    if journal.exists and journal.size > 0 and database["not_read_reason"] == "hot-journal":
        add(
            Severity.PROBLEM,
            "hot-journal",
            f"{journal.path} holds an unfinished transaction of a writer that died: the "
            "database cannot be read until it is rolled back",
            "open the database read-write once with any SQLite program (it rolls the "
            "journal back); never delete the -journal file, that corrupts the database",
        )


def _read_findings(
    report: Report, database: dict[str, Any], processes: list[dict[str, Any]]
) -> None:
    """The contents not read, and why."""
    add = report.add
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
        elif reason == "encrypted":
            add(
                Severity.WARNING,
                "encrypted",
                f"the contents were not checked: {not_read}",
                "give the store's keyring: fleetstore --key-file FILE doctor, or "
                "FLEETSTORE_ENCRYPTION_KEY_FILE (docs/secrets.md)",
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


def _integrity_findings(report: Report, database: dict[str, Any], changed: bool) -> None:
    add = report.add
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
    if changed:
        add(
            Severity.WARNING,
            "changed-during-check",
            "the database changed while doctor read it without locks (a writer started): "
            "the figures above may be inconsistent",
            "run doctor again",
        )


def _space_findings(report: Report, database: dict[str, Any], db_size: int) -> None:
    add = report.add
    pages, page_size = database["page_count"] or 0, database["page_size"] or 0
    free = database["freelist_count"] or 0
    if pages and free / pages >= FREELIST_SHARE and free * page_size >= FREELIST_MIN_BYTES:
        add(
            Severity.WARNING,
            "freelist-high",
            f"{free} of {pages} pages ({free / pages:.0%}, {size(free * page_size)}) are free: "
            "the file is much bigger than its data",
            "reclaim the space: `fleetstore maintain` (VACUUM, or incremental_vacuum when "
            "auto_vacuum is incremental)",
        )
    if database["auto_vacuum"] == "none" and db_size >= AUTO_VACUUM_BIG_BYTES:
        add(
            Severity.WARNING,
            "auto-vacuum-off",
            f"auto_vacuum is NONE on a {size(db_size)} file: deleted data never gives "
            "space back without a full VACUUM",
            "PRAGMA auto_vacuum=INCREMENTAL followed by one VACUUM (rewrites the file; needs "
            "the write lock and free disk space of the file's size)",
        )


def _size_findings(report: Report, database: dict[str, Any], *, foreign: bool) -> None:
    """The table that holds most of the file (with its indexes): where it grows.  A
    warning on another program's big file mostly one table: that program keeps
    writing rows there and nothing deletes them (fleetstore's own stores have
    retention: ``fleetstore maintain --archive-older-than``)."""
    sizes = database.get("sizes")
    if not sizes or not sizes["tables"]:
        return
    top, total = sizes["tables"][0], sizes["total_bytes"]
    what = (
        f"table {top['table']} holds {top['share']:.0%} of the file ({size(top['bytes'])} of "
        f"{size(total)}"
        + (f", its {top['indexes']} index(es) included" if top["indexes"] else "")
        + ")"
    )
    if foreign and total >= LARGEST_TABLE_MIN_BYTES and top["share"] >= LARGEST_TABLE_SHARE:
        report.add(
            Severity.WARNING,
            "largest-table",
            f"{what}: the file grows with what is written there",
            f"find what writes {top['table']} and whether anything ever deletes its rows (an "
            "event log of every streamed update, as opencode's event table keeps, grows "
            "without bound); deleted rows' pages are reused, and given back to the file "
            "system only by VACUUM (it holds the write lock throughout and needs free disk "
            "of the file's size) or, with auto_vacuum=INCREMENTAL, by `fleetstore maintain "
            "--yes`",
        )
    else:
        report.add(Severity.OK, "largest-table", what)


def _disk_findings(report: Report, wal_size: int) -> None:
    """Free space where the store's files grow: a full disk fails commits (nothing of
    them is written), checkpoints (the WAL keeps the commits, and grows), blob files
    and spool journals (the writes that need them raise ``StorageFull``)."""
    directory = os.path.dirname(report.path)
    free = free_bytes(directory)
    if free is None:
        return
    if free < DISK_FULL_BYTES:
        report.add(
            Severity.PROBLEM,
            "disk-full",
            f"{directory} has {size(free)} free: writes, checkpoints, blob files and spool "
            "journals fail with StorageFull (nothing of a failed write is stored, the WAL "
            "keeps every committed write until a checkpoint gets through)",
            "free space on that file system (or grow it); the next commit's checkpoint "
            "then copies the WAL back",
        )
    elif free < max(DISK_LOW_BYTES, wal_size):
        report.add(
            Severity.WARNING,
            "disk-low",
            f"{directory} has {size(free)} free"
            + (f", less than the WAL holds ({size(wal_size)})" if free < wal_size else "")
            + ": writes start failing with StorageFull when it runs out",
            "free space on that file system",
        )


def _wal_findings(
    report: Report,
    header: inspect.Header | None,
    db_size: int,
    wal_size: int,
    shm: inspect.ShmIndex | None,
) -> None:
    if header is not None and header.wal and wal_size >= WAL_LARGE_BYTES and wal_size > db_size:
        live = ""
        if shm is not None and shm.valid:
            live = f"; {shm.max_frame} frames in use, {shm.backfilled} copied back"
        report.add(
            Severity.WARNING,
            "wal-large",
            f"the WAL is {size(wal_size)}, bigger than the database ({size(db_size)}){live}: "
            "checkpoints are not keeping up, or a reader keeps the WAL from being reset",
            "end long read transactions, then `fleetstore maintain` or "
            "PRAGMA wal_checkpoint(TRUNCATE) when no reader is active",
        )


def _board_findings(report: Report, board: dict[str, Any] | None) -> None:
    """Group-commit slots that did not decode: quarantined by the gate holder that met
    them (never applied; their owner applied its items itself), kept for a person."""
    if not board:
        return
    bad = [s for s in board["slots"] if s["state"] == "quarantined"]
    total = board["quarantined_total"]
    if not total and not bad:
        return
    where = ", ".join(f"slot {s['slot']} (pid {s['pid']})" for s in bad[:5]) or "none left"
    report.add(
        Severity.WARNING,
        "board-quarantined",
        f"{total} group-commit slot(s) in the gate file did not decode and were "
        f"quarantined (never applied; their owners applied their writes themselves); "
        f"quarantined now: {where}",
        "a process of another fleetstore build, or a bug: report it with this output; "
        "writes are not affected. A quarantined slot is reused once its process ends",
    )


def _process_findings(report: Report, proc: dict[str, Any], header: inspect.Header | None) -> None:
    """A process's files and library: what it does to the file whatever its locks."""
    add = report.add
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


def _lock_findings(report: Report, proc: dict[str, Any], waited: float, wal_size: int) -> None:
    """The locks a process held, in one look or both."""
    add = report.add
    who = _who(proc)
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
            f"looks, {waited:.1f}s apart: every other writer waits for it, and one whose "
            "busy timeout runs out first (5 s in opencode and the Agents SDK) fails with "
            "'database is locked'",
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
    slot = proc.get("wal_reader")  # processes.wal_readers, in both looks
    if slot is not None:
        add(
            Severity.WARNING,
            "wal-reset-blocked",
            f"{who} held a read transaction (WAL read lock {slot}) in both looks, "
            f"{waited:.1f}s apart: while it lasts the WAL cannot be reset"
            + (
                " and no checkpoint can copy frames back at all"
                if slot == 0
                else ", checkpoints stop at its snapshot"
            )
            + f", so the WAL keeps growing (now {size(wal_size)})",
            "end that read transaction (commit or roll back, keep reads short); the next "
            "checkpoint can then reset the WAL",
        )


# -- a fleetstore store ----------------------------------------------------------------------


def _store_findings(report: Report, store: dict[str, Any]) -> None:
    _schema_findings(report, store)
    blobs = store.get("blobs")
    if blobs and blobs["missing"]:
        report.add(
            Severity.PROBLEM,
            "blob-files-missing",
            f"{blobs['missing']:,} of the {blobs['checked']:,} newest blobs have no file "
            f"(first: {', '.join(blobs['missing_shas'][:3])}): reading those "
            "parts, state values or effects raises BlobCorrupt. Under synchronous=NORMAL a "
            "power cut can do this to writes made since the last checkpoint; otherwise "
            "the files were deleted by hand.",
            "restore <db>.blobs/ from a backup, or re-import the sessions that hold them; "
            "use synchronous=FULL where a power cut must not do this",
        )
    _background_findings(report, store.get("processes") or [])
    outbox = store.get("outbox")
    if outbox:
        _outbox_findings(report, outbox)
    spool = store.get("spool")
    if spool:
        _spool_findings(report, spool)


def _background_findings(report: Report, processes: list[dict[str, Any]]) -> None:
    """What processes that have the store open publish (``<db>.procs/``): checkpoints
    that failed, and work after a commit that failed.  A process learns of these only
    in its own figures, so doctor, another process, reads them there.  Only live
    processes' figures say what is wrong now: a process that is gone left its last
    figures behind, which are history (after a full disk the soak of issue 23 kept
    19 checkpoint-failing warnings naming processes that had died)."""
    gone: list[str] = []
    for proc in processes:
        figures = (proc.get("figures") or {}).get("metrics") or {}
        failed, after = figures.get("checkpoint_errors", 0), figures.get("post_commit_errors", 0)
        if not proc.get("alive"):
            if failed or after:
                gone.append(
                    f"pid {proc['pid']}: {failed} failed checkpoint(s), {after} failed "
                    "step(s) after a commit"
                )
            continue
        if not failed and not after:
            continue
        last = figures.get("last_error") or {}
        said = f"; the last: {last.get('what')}: {last.get('error')}" if last else ""
        who = _who(proc)
        if failed:
            report.add(
                Severity.WARNING,
                "checkpoint-failing",
                f"{who}: {failed} checkpoint(s) failed{said}; every committed write stays "
                "in the WAL, which grows until a checkpoint gets through",
                "look at the disk: free space (see disk-full/disk-low), the kernel log for "
                "I/O errors; checkpoints retry by themselves",
            )
        if after:
            report.add(
                Severity.WARNING,
                "post-commit-errors",
                f"{who}: {after} step(s) after a commit failed (the commits stand){said}",
                "read that process's log (logger 'fleetstore'); report it if it persists",
            )
    stale = [p for p in processes if not p.get("alive")]
    if stale:
        more = f"; and {len(gone) - 3} more" if len(gone) > 3 else ""
        report.add(
            Severity.OK,
            "procs-gone",
            f"{len(stale)} process(es) that are gone left their last figures in <db>.procs/ "
            "(`fleetstore maintain` removes them)"
            + (f"; history, not a current problem: {'; '.join(gone[:3])}{more}" if gone else ""),
        )


def _schema_findings(report: Report, store: dict[str, Any]) -> None:
    """The schema version, and the settings this environment would open it with."""
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


def _outbox_findings(report: Report, outbox: dict[str, Any]) -> None:
    add = report.add
    stuck = outbox.get("stuck_running", 0)
    if stuck:
        add(
            Severity.WARNING,
            "effects-stuck",
            f"{stuck} outbox effect(s) are 'running' with an expired lease: their worker "
            "is gone, and each blocks the later effects of its thread",
            "run a worker (it sweeps expired leases), or store.effects.sweep()",
        )
    overdue = outbox.get("overdue_running", 0)
    if overdue:
        add(
            Severity.WARNING,
            "effects-overdue",
            f"{overdue} outbox effect(s) are 'running' more than "
            f"{OVERDUE_SLACK_SECONDS:.0f}s past the deadline their worker gave their handler, "
            "and their lease is still renewed: the handler hangs and its worker does not give "
            "up on it (or cannot settle it), and each blocks the later effects of its thread",
            "look at that worker (store.effects.list(state='running') names it: lease_owner); "
            "restart it, or store.effects.cancel(id)",
        )
    long_running = outbox.get("long_running", 0)
    if long_running:
        add(
            Severity.WARNING,
            "effects-long-running",
            f"{long_running} outbox effect(s) have been 'running' for more than "
            f"{LONG_RUNNING_SECONDS:.0f}s with no deadline (their worker has no handler "
            "timeout): if the handler hangs, it blocks the later effects of its thread for ever",
            "give the worker a handler timeout (Worker(handler_timeout=...), "
            "Handler(timeout=...), fleetstore worker --handler-timeout); if they are meant to "
            "run this long, nothing to do",
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
    if (
        not stuck
        and not dead
        and not overdue
        and not long_running
        and (age is None or age < BACKLOG_AGE_SECONDS)
    ):
        add(Severity.OK, "outbox", "outbox: nothing stuck, dead or waiting long")


def _spool_findings(report: Report, spool: dict[str, Any]) -> None:
    add = report.add
    stale = [j for j in spool["journals"] if not j["live"]]
    if stale:
        ops = sum(j["operations"] for j in stale)
        add(
            Severity.WARNING,
            "spool-stale",
            f"{len(stale)} spool journal(s) of processes that are gone hold {ops} "
            "acknowledged write(s) not yet in the database",
            f"fleetstore recover --store {report.path}",
        )
    damaged = [j["journal"] for j in spool["journals"] if j["damaged"]]
    if damaged:
        add(
            Severity.PROBLEM,
            "spool-damaged",
            f"damaged spool journal(s): {', '.join(damaged)}; recover stops at the damage",
            f"fleetstore recover --store {report.path}, then look at the kept file",
        )
    lacking = [j for j in spool["journals"] if j.get("missing_blobs")]
    if lacking:
        shas = sorted({sha for j in lacking for sha in j["missing_blobs"]})
        add(
            Severity.PROBLEM,
            "spool-blob-missing",
            f"spool journal(s) {', '.join(j['journal'] for j in lacking)} refer to "
            f"{len(shas)} blob file(s) that are missing ({', '.join(shas[:3])}"
            + (" ..." if len(shas) > 3 else "")
            + "): recover stops before the operation that needs one",
            "put the blob files back under STORE.blobs/ (from a backup), then "
            f"fleetstore recover --store {report.path}",
        )
    if spool["rejected"]:
        add(
            Severity.WARNING,
            "spool-rejected",
            f"{spool['rejected']} operation(s) were rejected on replay and kept in "
            f"{spool['path']}/rejected.jsonl",
            "read each record's error; re-apply by hand what still matters",
        )


# -- a sharded store -------------------------------------------------------------------------


def shard_findings(report: Report, section: dict[str, Any], url: str) -> None:
    """The catalog's index held against the shard files, then the unfinished intents."""
    _shard_file_findings(report, section, url)
    _intent_findings(report, section["intents"], url)


def _shard_file_findings(report: Report, section: dict[str, Any], url: str) -> None:
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
            f"{files} shard file(s), {size(section['total_bytes'])}: every one checked, "
            "nothing found",
        )
    else:
        add(
            Severity.OK,
            "shards",
            f"{files} shard file(s), {size(section['total_bytes'])}: {section['with_findings']} "
            "with findings (listed with their shard)",
        )
    missing = section["missing"]
    if missing:
        named = shards_named(missing)
        add(
            Severity.WARNING,
            "shard-missing",
            f"{len(missing)} shard file(s) that the catalog lists sessions in are missing: "
            f"{named}; reading those sessions fails (NotFound)",
            "put the file back at its path (shards/<last 2 characters>/<key>.db) if it was "
            "moved by hand, or restore it from a backup (a key ending in '..' names no file "
            "now: versions before issue 23 put its file in the store's directory, at the "
            "path shown in --json); if it is lost, `fleetstore sessions "
            f"rm ID --yes --store {url}` on its top-level session drops the catalog's rows",
        )
    orphans = section["orphans"]
    if orphans:
        named = shards_named(orphans)
        add(
            Severity.WARNING,
            "shard-orphan",
            f"{len(orphans)} shard file(s) hold sessions that the catalog does not list, and "
            f"no unfinished write names them: {named}; they are not listed and cannot "
            "be read by id",
            "a crash between a shard's write and the catalog's leaves an intent that "
            f"`fleetstore recover --store {url}` (or any fleetstore.open) finishes, and none is "
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


def _intent_findings(report: Report, intents: list[dict[str, Any]], url: str) -> None:
    add = report.add
    stale = [i for i in intents if not i["alive"]]
    live = [i for i in intents if i["alive"]]
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
            f"`fleetstore recover --store {url}`, or any fleetstore.open() of the store, finishes "
            "them (it applies each to its shard again, idempotently, then to the catalog)",
        )
    if live:
        add(
            Severity.OK,
            "shard-intents",
            f"{len(live)} catalog+shard write(s) under way in live processes "
            f"(oldest {max(i['age'] for i in live):.0f}s)",
        )


__all__ = ["file_findings", "shard_findings"]
