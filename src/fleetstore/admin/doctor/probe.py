"""What doctor observes in one database file and beside it, changing nothing: the
facts and headers of the database, ``-wal``, ``-shm``, ``-journal`` and ``.gate``
(read before anything is opened), its contents through a read-only connection
(``fleetstore.files.foreign``: pragmas, ``quick_check``, a fleetstore store's own
figures), and the spool journals and published figures beside a store.  Each is
returned as the JSON that ``--json`` shows (docs/doctor.md)."""

from __future__ import annotations

import dataclasses
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetstore import errors, sql
from fleetstore.core.keys import Keyring
from fleetstore.core.settings import Settings
from fleetstore.core.targets import resolve_target
from fleetstore.domain.blobs import referenced_shas
from fleetstore.domain.worker import DEFAULT_HANDLER_TIMEOUT
from fleetstore.engine import cipher
from fleetstore.engine.board import read_board
from fleetstore.files import foreign, inspect
from fleetstore.files.inspect import FileFacts
from fleetstore.files.processes import Lock
from fleetstore.store.procstats import read_published
from fleetstore.store.spool import REJECTED, journal_pid, read_journal

QUICK_CHECK_ROWS = 20
FLEETSTORE_TABLES = {"sessions", "applied_ops", "fleetstore_migrations"}
SHARD_TABLES = {"shard_sessions", "shard_intents"}
EFFECT_STATES = ("pending", "running", "succeeded", "dead", "cancelled")
#: A running effect this long past its deadline is reported: its worker gives up at
#: the deadline and settles within its write budget; one that has not done so in a
#: minute does not enforce it (or cannot write).
OVERDUE_SLACK_SECONDS = 60.0
#: A running effect with no deadline (a worker without a handler timeout), running
#: longer than the default timeout, is reported: its handler may hang.
LONG_RUNNING_SECONDS = DEFAULT_HANDLER_TIMEOUT

Idents = dict[str, tuple[int, int, int] | None]


def resolve(path: str | os.PathLike[str] | None) -> str:
    """The database file *path* names (a file, a directory holding fleetstore.db, a
    sqlite:/// URL, or None for the default store), symlinks resolved.  ``NotFound`` if
    there is no such file; nothing is ever created."""
    target = resolve_target(path)
    if not target.exists():
        raise errors.NotFound(f"{target}: no such file")
    if not target.is_file():
        raise errors.NotFound(f"{target}: not a regular file")
    return os.path.realpath(target)


@dataclass(slots=True)
class Probe:
    """One database file: its side files' facts and headers (read before anything is
    opened), then what was read from it (``read_contents``)."""

    db: str
    sides: dict[str, str]
    before: dict[str, FileFacts]
    header: inspect.Header | None
    shm_index: inspect.ShmIndex | None
    wal_header: inspect.WalHeader | None
    contents: dict[str, Any] = field(default_factory=dict)

    def watched(self) -> tuple[Idents, dict[str, str]]:
        """The files whose locks (role -> identity) and users (role -> path) the two
        looks watch: the database, its side files and the spool journals beside it."""
        spool_dir = self.db + ".spool"
        idents = {role: facts.ident for role, facts in self.before.items()}
        idents.update(spool_idents(spool_dir))
        return idents, {**self.sides, "spool": spool_dir + "/"}


def sides(db: str) -> dict[str, str]:
    return {
        "database": db,
        "wal": db + "-wal",
        "shm": db + "-shm",
        "journal": db + "-journal",
        "gate": db + ".gate",
    }


def probe_file(db: str) -> Probe:
    """The files' facts and headers (``InspectFailed`` if *db* is not SQLite)."""
    paths = sides(db)
    before = {role: FileFacts.of(p) for role, p in paths.items()}
    header = inspect.read_header(db)
    shm_index = inspect.read_shm_index(paths["shm"]) if before["shm"].exists else None
    wal_header = inspect.read_wal_header(paths["wal"]) if before["wal"].exists else None
    return Probe(db, paths, before, header, shm_index, wal_header)


def file_data(
    probe: Probe,
    processes: list[dict[str, Any]],
    waited: float,
    spool: dict[str, Any] | None,
    checked_at: float,
    *,
    layout: str | None = None,
) -> dict[str, Any]:
    """The ``--json`` object of one file, less the verdict and the findings."""
    data: dict[str, Any] = {"checked_at": checked_at}
    if layout is not None:
        data["layout"] = layout
    data.update(
        {
            "sqlite": {
                "library_version": inspect.library_version(),
                "wal_reset_bug": inspect.wal_reset_bug(inspect.library_version()),
            },
            "files": {role: file_json(facts) for role, facts in probe.before.items()},
            "database": probe.contents["database"],
            "wal": wal_json(probe.header, probe.before, probe.shm_index, probe.wal_header),
            "processes": processes,
            "locks_interval": round(waited, 3),
            "fleetstore": fleetstore_json(probe.db, probe.contents.get("fleetstore"), spool),
            "board": board_json(probe.sides["gate"]),
        }
    )
    return data


def board_json(gate: str) -> dict[str, Any] | None:
    """The group-commit board in the gate file (engine/board.py): slots in use, and
    those quarantined because they did not decode.  None: no board there."""
    found = read_board(gate)
    if found is None:
        return None
    quarantined, slots = found
    return {
        "quarantined_total": quarantined,
        "slots": [
            {"slot": s.slot, "state": s.state, "pid": s.pid, "items": s.items} for s in slots
        ],
    }


def file_json(facts: FileFacts) -> dict[str, Any] | None:
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


def wal_json(
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


# -- the contents ----------------------------------------------------------------------------


def read_contents(
    db: str,
    header: inspect.Header | None,
    quick_check: bool,
    now: float,
    *,
    catalog: bool = False,
    blob_dir: str | None = None,
    sizes: bool = False,
    keyring: Keyring | None = None,
) -> dict[str, Any]:
    """The database's pragmas and, for a fleetstore store, its own figures, read in one
    read-only transaction (a sharded store's *catalog*: its index of shards and the
    catalog+shard intents too, as ``shard_index`` and ``shard_intents``; with *sizes*,
    the bytes of every table and index, ``database.sizes``).  A read
    that SQLite refuses is recorded, not raised; ``changed`` is true if the file
    changed during a read without locks (the figures may be inconsistent)."""
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
        "sizes": None,
        "not_read": None,
        "not_read_reason": None,
        "encrypted": bool(header and header.encrypted),
    }
    out: dict[str, Any] = {"database": database}
    if header is None:
        database["journal_mode"] = None
        database["not_read"] = "empty file (0 bytes): no SQLite header yet"
        database["not_read_reason"] = "empty"
        return out
    database["journal_mode"] = "wal" if header.wal else "rollback"
    failed: inspect.InspectFailed | None = None
    try:
        source = foreign.ForeignFile(db, cipher.key_of_file(db, keyring, strict=False))
        database["open_mode"], database["open_mode_reason"] = source.mode, source.why
        if source.mode is None:
            database["not_read"], database["not_read_reason"] = source.why, "wal-without-shm"
            return out
        source.read(lambda conn: _read_database(conn, out, quick_check, now, catalog, sizes))
    except foreign.FileChanged as exc:
        out["changed"] = True
        if isinstance(exc.__cause__, inspect.InspectFailed):
            failed = exc.__cause__
    except inspect.InspectFailed as exc:
        failed = exc
    except (errors.NotFound, OSError) as exc:  # gone since it was probed
        database["not_read"], database["not_read_reason"] = str(exc), "cannot-open"
    except (errors.KeyMissing, errors.WrongKey) as exc:
        database["not_read"], database["not_read_reason"] = str(exc), "encrypted"
    if failed is not None:
        database["not_read"], database["not_read_reason"] = str(failed), failed.reason
    pages = database["page_count"] or 0
    if pages:
        database["freelist_share"] = round((database["freelist_count"] or 0) / pages, 4)
    figures = out.get("fleetstore")
    if figures is not None and "blob_shas" in figures:
        # A sharded store's shards keep their blobs beside the catalog.
        figures["blobs"] = blob_files(blob_dir or db + ".blobs", figures.pop("blob_shas"))
    return out


#: Blob rows, newest first (a power cut can only take the newest files), at most
#: ``BLOBS_CHECKED``: every row has a file (garbage collection deletes the row first).
BLOBS_CHECKED = 100_000
_BLOB_SHAS = f"SELECT sha256 FROM blobs ORDER BY created_at DESC LIMIT {BLOBS_CHECKED}"


def blob_files(directory: str, shas: list[str]) -> dict[str, Any]:
    """Which referenced blobs have no file (a ``stat`` each: nothing is opened).  Under
    ``synchronous=NORMAL`` a power cut can leave a committed row whose blob file the
    kernel had not written back yet (docs/design.md, "Blobs")."""
    missing = []
    for sha in shas:
        try:
            os.stat(os.path.join(directory, sha[:2], sha))
        except FileNotFoundError:
            missing.append(sha)
        except OSError:
            pass  # unreadable: the permission findings say why
    return {"checked": len(shas), "missing": len(missing), "missing_shas": missing[:20]}


def _read_database(
    conn: inspect.ReadOnlyDatabase,
    out: dict[str, Any],
    quick_check: bool,
    now: float,
    catalog: bool,
    sizes: bool = False,
) -> None:
    database = out["database"]
    for name in ("page_size", "page_count", "freelist_count", "user_version"):
        database[name] = int(conn.pragma(name))
    database["application_id"] = int(conn.pragma("application_id"))
    database["encoding"] = str(conn.pragma("encoding"))
    database["auto_vacuum"] = {0: "none", 1: "full", 2: "incremental"}.get(
        int(conn.pragma("auto_vacuum")), "unknown"
    )
    tables = {str(r[0]) for r in conn.query("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    database["tables"] = len(tables)
    if quick_check:
        rows = conn.query(f"PRAGMA quick_check({QUICK_CHECK_ROWS})")
        database["quick_check"] = [str(r[0]) for r in rows]
    if sizes:
        database["sizes"] = table_sizes(conn, database["page_size"], database["freelist_count"])
    if FLEETSTORE_TABLES.issubset(tables):
        out["fleetstore"] = _store_figures(conn, tables, now)
        if "blobs" in tables:
            out["fleetstore"]["blob_shas"] = [str(r[0]) for r in conn.query(_BLOB_SHAS)]
    if catalog and SHARD_TABLES.issubset(tables):
        out["shard_index"] = {
            str(k): int(n)
            for k, n in conn.query("SELECT shard, count(*) FROM shard_sessions GROUP BY shard")
        }
        out["shard_intents"] = conn.query(
            "SELECT op_id, shard, op, owner, created_at FROM shard_intents "
            "ORDER BY created_at, op_id"
        )


#: Every b-tree of the file (a table, an index, the schema) with its bytes and pages:
#: SQLite's ``dbstat`` virtual table, read-only, one row per b-tree (``aggregate``).
_SIZES = (
    "SELECT d.name, coalesce(s.type, 'table'), coalesce(s.tbl_name, d.name), d.pgsize, "
    "d.pageno FROM dbstat AS d LEFT JOIN sqlite_schema AS s ON s.name = d.name "
    "WHERE d.aggregate = TRUE"
)


def table_sizes(conn: inspect.ReadOnlyDatabase, page_size: int, free_pages: int) -> dict[str, Any]:
    """The bytes of each table with its indexes, largest first, and of each b-tree,
    and each one's share of the file's pages (free pages included): where a file that
    grew put its bytes (issue 28: opencode's ``event`` table was about 80 % of a 303 MB
    file)."""
    objects: list[dict[str, Any]] = [
        {"name": str(n), "type": str(t), "table": str(tbl), "bytes": int(b), "pages": int(p)}
        for n, t, tbl, b, p in conn.query(_SIZES)
    ]
    objects.sort(key=lambda o: (-o["bytes"], o["name"]))
    free = int(free_pages) * int(page_size)
    total = sum(int(o["bytes"]) for o in objects) + free
    tables: dict[str, dict[str, Any]] = {}
    for o in objects:
        t = tables.setdefault(
            o["table"],
            {"table": o["table"], "bytes": 0, "table_bytes": 0, "index_bytes": 0, "indexes": 0},
        )
        t["bytes"] += o["bytes"]
        if o["type"] == "index":
            t["index_bytes"] += o["bytes"]
            t["indexes"] += 1
        else:
            t["table_bytes"] += o["bytes"]
        o["share"] = round(o["bytes"] / total, 4) if total else 0.0
    ranked = sorted(tables.values(), key=lambda t: (-t["bytes"], t["table"]))
    for t in ranked:
        t["share"] = round(t["bytes"] / total, 4) if total else 0.0
    return {"total_bytes": total, "free_bytes": free, "tables": ranked, "objects": objects}


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
        if "deadline" in columns:
            # Running, lease renewed, long past the time its worker gives it: a handler
            # that hangs in a worker that does not give up (issue 23: doctor was silent).
            count, oldest = conn.query(
                "SELECT count(*), min(deadline) FROM effects "
                "WHERE state = 'running' AND deadline < ?",
                (now - OVERDUE_SLACK_SECONDS,),
            )[0]
            outbox["overdue_running"] = int(count)
            outbox["overdue_since"] = float(oldest) if oldest is not None else None
            count, oldest = conn.query(
                "SELECT count(*), min(started_at) FROM effects "
                "WHERE state = 'running' AND deadline IS NULL AND started_at < ?",
                (now - LONG_RUNNING_SECONDS,),
            )[0]
            outbox["long_running"] = int(count)
            outbox["long_running_since"] = float(oldest) if oldest is not None else None
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


# -- beside a store: spool journals, published figures, settings -----------------------------


def spool_idents(spool_dir: str) -> Idents:
    try:
        names = sorted(os.listdir(spool_dir))
    except OSError:
        return {}
    return {
        f"spool:{name}": FileFacts.of(os.path.join(spool_dir, name)).ident
        for name in names
        if name.endswith(".jsonl")
    }


def read_spool(spool_dir: str, locks: list[Lock], keyring: Keyring | None = None) -> dict[str, Any]:
    """The spool journals beside a store: whose they are, whether that process still
    holds them (its flock, seen in /proc/locks), how many operations wait in each."""
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
            read = read_journal(full, keyring)
            ops, damaged = len(read.ops), read.damaged
            size = full.stat().st_size
        except OSError:
            continue
        except (errors.KeyMissing, errors.WrongKey):
            # Sealed under a key not given: its operations cannot be counted here.
            journals.append({"journal": name, "pid": pid, "sealed": True, "operations": None})
            continue
        blobs = Path(spool_dir).with_suffix(".blobs")
        missing = sorted(
            {
                sha
                for op in read.ops
                for sha in set(referenced_shas(op.args))
                if not (blobs / sha[:2] / sha).is_file()
            }
        )
        holder = holders.get(name)
        journals.append(
            {
                "journal": name,
                "pid": pid,
                "operations": ops,
                "bytes": size,
                "damaged": damaged,
                "missing_blobs": missing,
                "held_by": holder,
                "live": holder is not None,
            }
        )
    return {"path": spool_dir, "journals": journals, "rejected": rejected}


def published_figures(store_path: str) -> list[dict[str, Any]]:
    """The figures processes publish beside the store (``<db>.procs/<pid>.json``, as
    ``Store.metrics()`` returns them, for ``fleetstore top``), one dict per process.
    Reading them changes nothing."""
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


def known_schema_version() -> int:
    return max((m.version for m in sql.migrations("sqlite")), default=0)


def fleetstore_json(
    db: str, figures: dict[str, Any] | None, spool: dict[str, Any] | None
) -> dict[str, Any] | None:
    if figures is None:
        return None
    known = known_schema_version()
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


__all__ = [
    "Probe",
    "file_data",
    "known_schema_version",
    "probe_file",
    "published_figures",
    "read_contents",
    "read_spool",
    "resolve",
    "sides",
    "table_sizes",
]
