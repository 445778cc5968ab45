"""What doctor observes in a sharded store (``sqlite+sharded:///DIR``) beyond its
catalog: the shard files on disk (each probed as a file of its own), and what ties
them together, the catalog's index of shards held against the files and the
catalog+shard intents not finished (the ``sharded`` section of ``--json``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetstore.admin.doctor.probe import Probe, probe_file, read_contents
from fleetstore.core import liveness
from fleetstore.core.keys import Keyring
from fleetstore.files import inspect
from fleetstore.store.sharded import shards as sharded
from fleetstore.store.spool import decode_line

#: Largest shards listed.
SHARDS_LARGEST = 5


@dataclass(slots=True)
class Shard:
    """One shard file: its probe, or why it could not be probed."""

    key: str
    probe: Probe | None
    error: str | None = None


def shard_files(root: Path) -> list[tuple[str, str]]:
    """(key, path) of every shard file under *root*, by key."""
    return [(key, str(path)) for key, path in sharded.shard_files(root)]


def probe_shards(files: list[tuple[str, str]]) -> list[Shard]:
    shards: list[Shard] = []
    for key, path in files:
        try:
            shards.append(Shard(key, probe_file(path)))
        except inspect.InspectFailed as exc:
            shards.append(Shard(key, None, str(exc)))
        except OSError:
            continue  # gone meanwhile (removed by maintain): not a shard any more
    return shards


def watch(
    shards: list[Shard],
    watched: dict[str, tuple[int, int, int] | None],
    paths: dict[str, str],
) -> None:
    """Add each shard's files to what the two looks watch, as ``shard:KEY:ROLE``."""
    for shard in shards:
        if shard.probe is not None:
            for role, facts in shard.probe.before.items():
                watched[f"shard:{shard.key}:{role}"] = facts.ident
                paths[f"shard:{shard.key}:{role}"] = shard.probe.sides[role]


def read_shards(
    shards: list[Shard], quick_check: bool, now: float, blob_dir: str, keyring: Keyring | None
) -> None:
    for shard in shards:
        if shard.probe is not None:
            shard.probe.contents = read_contents(
                shard.probe.db,
                shard.probe.header,
                quick_check,
                now,
                blob_dir=blob_dir,
                keyring=keyring,
            )


def shard_figures(probe: Probe, processes: list[dict[str, Any]]) -> dict[str, Any]:
    """A readable shard's entry in the ``sharded`` section (after its key and path)."""
    figures = probe.contents.get("fleetstore")
    database = probe.contents["database"]
    return {
        "bytes": probe.before["database"].size,
        "wal_bytes": probe.before["wal"].size if probe.before["wal"].exists else 0,
        "shm_bytes": probe.before["shm"].size if probe.before["shm"].exists else 0,
        "sessions": figures["sessions"] if figures else None,
        "schema_version": figures["schema_version"] if figures else None,
        "journal_mode": database["journal_mode"],
        "open_mode": database["open_mode"],
        "quick_check": database["quick_check"],
        "not_read_reason": database["not_read_reason"],
        "processes": [p["pid"] for p in processes],
    }


def shard_section(
    root: Path,
    url: str,
    contents: dict[str, Any],
    entries: list[dict[str, Any]],
    now: float,
) -> dict[str, Any]:
    """The ``sharded`` section: the catalog's *contents* (its index and intents) held
    against the shard files' *entries*."""
    index: dict[str, int] | None = contents.get("shard_index")
    on_disk = {e["key"]: e for e in entries}
    intents = _intents(contents, on_disk, now)
    intended = {i["shard"] for i in intents}
    missing: list[dict[str, Any]] = []
    orphans: list[dict[str, Any]] = []
    empty: list[str] = []
    if index is not None:
        for key, count in sorted(index.items()):
            if key in on_disk:
                continue
            if not sharded.is_key(key):
                # A session id ending in ".." before issue 23: fleetstore put its
                # tree's file in DIR itself, where no shard is looked for now.
                missing.append({"key": key, "path": str(root / f"{key}.db"), "sessions": count})
                continue
            path = sharded.shard_path(root, key)
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


def _intents(
    contents: dict[str, Any], on_disk: dict[str, dict[str, Any]], now: float
) -> list[dict[str, Any]]:
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
                "alive": liveness.token_alive(owner),
                "age": round(now - float(created), 3),
                "shard_file": str(key) in on_disk,
            }
        )
    return intents


__all__ = [
    "Shard",
    "probe_shards",
    "read_shards",
    "shard_figures",
    "shard_files",
    "shard_section",
    "watch",
]
