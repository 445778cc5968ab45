"""The bytes each target keeps (``python -m fleetstore_stress.child --bytes``, a
process of its own that opens nothing but apsw): its database, WAL and blob files
after the run and after a ``wal_checkpoint(TRUNCATE)`` of each database file, and the
payload its acknowledged turns carried (raw, and compressed with zstd as fleetstore
compresses blobs), to set the bytes per turn against."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import zstandard

from fleetstore import errors
from fleetstore.core.targets import parse_target
from fleetstore_stress.agent import Turn, read_journal
from fleetstore_stress.growth import Streamed
from fleetstore_stress.patterns.plain import PlainConnection

_SAMPLE = 200  # turns compressed to estimate the payload's compression ratio


def _databases(cfg: dict[str, Any]) -> tuple[list[Path], list[Path]] | None:
    """(database files, blob directories) of the target; None for PostgreSQL."""
    if cfg["target"] != "fleetstore":
        return [Path(cfg["url"])], []
    kind, where = parse_target(cfg["url"])
    if kind == "postgresql":
        return None
    assert isinstance(where, Path)
    if kind == "sharded":
        files = [where / "catalog.db", *sorted((where / "shards").glob("*/*.db"))]
    else:
        files = [where]
    return files, [Path(f"{f}.blobs") for f in files if Path(f"{f}.blobs").is_dir()]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _tree(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _measure(files: list[Path], blobs: list[Path]) -> dict[str, int]:
    out = {
        "db": sum(_size(f) for f in files),
        "wal": sum(_size(Path(f"{f}-wal")) for f in files),
        "blobs": sum(_tree(b) for b in blobs),
    }
    out["total"] = out["db"] + out["wal"] + out["blobs"]
    return out


def payload(cfg: dict[str, Any]) -> tuple[int, int]:
    """The acknowledged turns' payload (user text, reply text, tool output): its raw
    bytes, and an estimate of them compressed (zstd level 3 on a sample of turns)."""
    turns = [
        (agent, int(e["n"]))
        for agent, path in enumerate(cfg["journals"])
        for e in read_journal(Path(path))
        if "sha" in e
    ]
    raw = 0
    for agent, n in turns:
        t = Turn(cfg, agent, n)
        raw += len(t.user) + len(Streamed(cfg, agent, t).text()) + t.output_size
    sample = random.Random(0).sample(turns, min(len(turns), _SAMPLE))
    before = after = 0
    packer = zstandard.ZstdCompressor(level=3)
    for agent, n in sample:
        t = Turn(cfg, agent, n)
        data = (t.user + Streamed(cfg, agent, t).text() + t.output(cfg, agent)).encode()
        before += len(data)
        after += len(packer.compress(data))
    return raw, round(raw * after / before) if before else 0


def _largest_table(files: list[Path]) -> dict[str, Any] | None:
    """The table (with its indexes) that takes most of the database files' pages, and
    its share of them (``dbstat``)."""
    pages: dict[str, int] = {}
    total = 0
    for f in files:
        try:
            with PlainConnection(str(f), busy_ms=30_000, readonly=True) as db:
                rows = db.execute(
                    "SELECT coalesce(m.tbl_name, d.name), sum(d.pgsize) FROM dbstat AS d "
                    "LEFT JOIN sqlite_master AS m ON m.name = d.name GROUP BY 1"
                )
        except errors.FleetstoreError:
            return None
        for name, size in rows:
            pages[str(name)] = pages.get(str(name), 0) + int(size)
            total += int(size)
    if not pages or not total:
        return None
    name = max(pages, key=lambda k: pages[k])
    return {"name": name, "bytes": pages[name], "share": round(pages[name] / total, 3)}


def measure(cfg: dict[str, Any]) -> dict[str, Any]:
    found = _databases(cfg)
    if found is None:
        return {"files": 0}
    files, blobs = found
    files = [f for f in files if f.exists()]
    after_run = _measure(files, blobs)
    for f in files:
        try:
            with PlainConnection(str(f), busy_ms=30_000) as db:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except errors.FleetstoreError:
            pass  # measured as it is
    raw, compressed = payload(cfg)
    return {
        "largest_table": _largest_table(files),
        "files": len(files),
        "after_run": after_run,
        "after_checkpoint": _measure(files, blobs),
        "payload_raw": raw,
        "payload_compressed": compressed,
    }
