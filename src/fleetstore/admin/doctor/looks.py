"""Who uses the files doctor checks, seen twice: at the first look the locks
(``/proc/locks``) and the open files (``/proc/*/fd``), at the second, ``interval``
seconds later, the locks again.  A lock seen both times was held at least that long;
each process with a database open is checked for the SQLite library it runs
(``/proc/PID/maps``)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from fleetstore.core import liveness
from fleetstore.files import inspect, processes
from fleetstore.files.processes import Lock, OpenFile, SqliteLibrary


@dataclass(slots=True)
class Looks:
    """The two looks at the watched files (role -> identity; roles of a sharded store's
    shard files are qualified ``shard:KEY:ROLE``)."""

    watched: dict[str, tuple[int, int, int] | None]
    started: float
    first: list[Lock]
    opened: dict[int, list[OpenFile]]
    second: list[Lock] = field(default_factory=list)
    #: Seconds from the first look to the end of the second.
    waited: float = 0.0
    #: Each PID's SQLite libraries, read once however many files it has open.
    libraries: dict[int, list[SqliteLibrary]] = field(default_factory=dict)

    @classmethod
    def first_look(
        cls, watched: dict[str, tuple[int, int, int] | None], paths: dict[str, str]
    ) -> Looks:
        started = time.monotonic()
        return cls(
            watched, started, processes.locks_on(watched), processes.open_by_processes(paths)
        )

    def second_look(self, interval: float) -> None:
        """The locks again, *interval* seconds after the first look (at once if the
        files took longer than that to read)."""
        inspect_time = time.monotonic() - self.started
        if interval > inspect_time:
            time.sleep(interval - inspect_time)
        self.second = processes.locks_on(self.watched)
        self.waited = time.monotonic() - self.started

    def processes(self, prefix: str | None = None) -> list[dict[str, Any]]:
        """The processes using one file: the main one (prefix None) or a shard's
        (prefix ``shard:KEY:``), with roles as for a file of its own."""

        def mine(role: str) -> str | None:
            if prefix is None:
                return None if role.startswith("shard:") else role
            return role[len(prefix) :] if role.startswith(prefix) else None

        first = [dataclasses.replace(lk, file=r) for lk in self.first if (r := mine(lk.file))]
        second = [dataclasses.replace(lk, file=r) for lk in self.second if (r := mine(lk.file))]
        files = {
            pid: [dataclasses.replace(f, role=r) for f in fs if (r := mine(f.role))]
            for pid, fs in self.opened.items()
        }
        files = {pid: fs for pid, fs in files.items() if fs}
        pids = sorted({lk.pid for lk in first + second if lk.pid > 0} | set(files))
        procs = _processes(pids, files, first, second, self.libraries)
        # A read transaction seen in both looks, on the same read mark (fleetstore top
        # follows the same reading frame after frame).
        seen_first = processes.wal_readers(first)
        seen_second = processes.wal_readers(second)
        for proc in procs:
            slot = seen_first.get(proc["pid"])
            proc["wal_reader"] = (
                slot if slot is not None and seen_second.get(proc["pid"]) == slot else None
            )
        return procs


def _processes(
    pids: list[int],
    opened: dict[int, list[OpenFile]],
    first: list[Lock],
    second: list[Lock],
    libraries: dict[int, list[SqliteLibrary]],
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
        libs: list[SqliteLibrary] = []
        if any(f.role in ("database", "wal", "shm") for f in files):
            if pid not in libraries:
                libraries[pid] = processes.sqlite_libraries(pid)
            libs = libraries[pid]
        out.append(
            {
                "pid": pid,
                "command": processes.command_line(pid),
                "alive": liveness.alive(pid),
                "state": processes.process_state(pid),
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


__all__ = ["Looks"]
