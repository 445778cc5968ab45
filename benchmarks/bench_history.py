"""Session-history benchmarks (issue 3): streamed replies and large tool outputs.

One invocation measures both parts, each against a baseline run in the same
invocation, and prints the issue's targets as PASS/MISS.

Streaming (``stream``): a reply of ``--deltas`` (1,000) text deltas of 100 bytes
(100,000 bytes in all), written

  fleetstore  ``with store.messages.stream(...) as reply: reply.text(delta)``, default
              settings (stream_flush_interval 0.25 s, stream_flush_bytes 16 KiB)
  rewrite     what agent tools do today (opencode 1.2's tables ``message`` and ``part``
              with a JSON ``data`` column): on every delta one transaction UPSERTs the
              part row with the whole text so far and INSERTs an event row carrying
              the delta; one transaction creates the message and one completes it.
              It runs over ``fleetstore.Database`` with default settings, so the lock
              discipline, checkpoints and ``synchronous`` are the same and only the
              data pattern differs.

at several paces: as fast as the loop goes (pace 0), and one delta every
``--paces`` seconds, scheduled against a clock (start + i x pace).  Each run gets a
fresh file; the WAL is checkpointed before it starts and once more at its end.

  transactions   committed write transactions (``metrics()["writes"]``) of the run
  bytes written  growth of ``wchar`` in /proc/self/io over the run and its final
                 checkpoint: every byte this process handed to write()/pwrite(), i.e.
                 WAL frames (page + 24-byte header), checkpoint copies into the
                 database file, and the WAL header.  The -shm index is mmapped and not
                 counted (it is not data).  Nothing else in the process writes then.
                 The bytes written inside checkpoint() calls (the engine's and ours)
                 are counted apart: "WAL bytes" is the rest.

Large outputs (``fleet``): ``--agents`` (16) real OS processes (multiprocessing,
spawn) on one store, each in its own session, with exponential think time (mean
10 ms) before every append; appends alternate between an assistant message (~300 B
of text and a tool call) and a tool message with the tool's output (100-2,000 B).
The outputs are hex text (zstd halves it).  Variants, in one invocation, same seeds
(so the same sequence of choices):

  none     no large outputs (the baseline; run first and again last, the ratios use
           the mean of the two)
  blob     2 % of tool outputs are 4-8 MB, fleetstore defaults: written as a blob file
           (zstd, fsynced) before the transaction, which stores the reference
  cpu-only for analysis: the same large outputs are built, encoded, hashed and
           compressed as the blob path does, then thrown away and a small output
           appended instead (the blob path's CPU cost without its file write)
  inline   the same outputs inline in the transaction (blob_threshold 16 MiB; the
           default max_payload_bytes, 256 MiB, already admits them): what the blobs
           exist to prevent

  lock hold      ``metrics()["lock_hold"]`` of every process (BEGIN IMMEDIATE acquired
                 to COMMIT done), over the measured window: the per-process histograms'
                 bucket counts (log buckets 10 % wide, fleetstore.core.metrics) are summed
                 and the fleet's percentiles read from the sum, so one process's tail
                 weighs as much as its share of the writes.  The worst per-process
                 p99 is shown too.
  small p99      measured by the agents around ``store.messages.append`` of messages
                 without a large output (nearest rank over all their samples)

    .venv/bin/python benchmarks/bench_history.py               # the full run
    .venv/bin/python benchmarks/bench_history.py --quick       # a few seconds, for development
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing as mp
import os
import platform
import random
import shutil
import sys
import time
import traceback
import zlib
from array import array
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import apsw

from benchlib import loadavg, pct, print_report, proc_stat, save_results, sleep_until

BENCH_DIR = Path(__file__).resolve().parent

# -- streaming
DELTAS = 1000
DELTA_BYTES = 100
PACES = (0.0, 0.001, 0.005, 0.02, 0.05)
QUICK_PACES = (0.0, 0.001)
TARGET_TRANSACTIONS = 20
TARGET_BYTES_FACTOR = 3.0

REWRITE_SCHEMA = """
CREATE TABLE session(id TEXT PRIMARY KEY, time_created INTEGER NOT NULL,
    time_updated INTEGER NOT NULL, data TEXT NOT NULL);
CREATE TABLE message(id TEXT PRIMARY KEY, session_id TEXT NOT NULL,
    time_created INTEGER NOT NULL, time_updated INTEGER NOT NULL, data TEXT NOT NULL);
CREATE INDEX message_session_idx ON message(session_id);
CREATE TABLE part(id TEXT PRIMARY KEY, message_id TEXT NOT NULL, session_id TEXT NOT NULL,
    time_created INTEGER NOT NULL, time_updated INTEGER NOT NULL, data TEXT NOT NULL);
CREATE INDEX part_message_idx ON part(message_id);
CREATE INDEX part_session_idx ON part(session_id);
CREATE TABLE event(id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, type TEXT NOT NULL,
    time INTEGER NOT NULL, data TEXT NOT NULL);
"""
PART_UPSERT = (
    "INSERT INTO part(id, message_id, session_id, time_created, time_updated, data) "
    "VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(id) DO UPDATE SET time_updated = excluded.time_updated, data = excluded.data"
)
EVENT_INSERT = "INSERT INTO event(session_id, type, time, data) VALUES (?, ?, ?, ?)"

# -- large outputs
AGENTS = 16
SECONDS = 20.0
QUICK_SECONDS = 3.0
THINK_MEAN_S = 0.010
LARGE_SHARE = 0.02
LARGE_MIN = 4 * 1024 * 1024
LARGE_MAX = 8 * 1024 * 1024
SMALL_OUTPUT = (100, 2000)
VARIANTS = ("none", "blob", "cpu-only", "inline")
VARIANT_SETTINGS: dict[str, dict[str, Any]] = {
    "none": {},
    "blob": {},
    "cpu-only": {},
    "inline": {"blob_threshold": 16 * 1024 * 1024, "max_payload_bytes": 256 * 1024 * 1024},
}
TARGET_FLEET_RATIO = 1.5


# --------------------------------------------------------------------------- helpers


def _wchar() -> int:
    """Bytes this process (all its threads) has passed to write syscalls."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


class _CheckpointMeter:
    """Counts the bytes written by the database's checkpoints (automatic and ours), so
    that a run's wchar splits into WAL writes and checkpoint copies.  Wraps the
    instance's ``checkpoint`` (the engine calls it after a commit that grew the WAL)."""

    def __init__(self, db: Any) -> None:
        self.bytes = 0
        self.calls = 0
        self._checkpoint = db.checkpoint
        db.checkpoint = self._metered

    def _metered(self) -> Any:
        before = _wchar()
        try:
            return self._checkpoint()
        finally:
            self.bytes += _wchar() - before
            self.calls += 1


def _dir_bytes(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _deltas(n: int) -> list[str]:
    """*n* deltas of exactly DELTA_BYTES ASCII bytes of word-like text (nothing JSON escapes)."""
    rng = random.Random(3)
    words = ["stream", "reply", "token", "the", "of", "a", "write", "part", "lock", "delta"]
    out = []
    for _ in range(n):
        text = ""
        while len(text) < DELTA_BYTES:
            text += rng.choice(words) + " "
        out.append(text[:DELTA_BYTES])
    return out


# --------------------------------------------------------------------------- streaming


def _paced(deltas: list[str], pace: float) -> Any:
    """Yield the deltas, each at its scheduled time (start + i x pace)."""
    start = time.monotonic()
    for i, d in enumerate(deltas):
        if pace:
            sleep_until(start + i * pace)
        yield d


def stream_fleetstore(path: Path, deltas: list[str], pace: float) -> dict[str, Any]:
    import fleetstore

    store = fleetstore.open(path)
    try:
        session = store.sessions.create(title="stream bench")
        store.db.checkpoint()
        meter = _CheckpointMeter(store.db)
        m0 = store.metrics()
        w0 = _wchar()
        t0 = time.monotonic()
        with store.messages.stream(session.id, model="bench") as reply:
            for d in _paced(deltas, pace):
                reply.text(d)
        t1 = time.monotonic()
        m1 = store.metrics()
        store.db.checkpoint()
        w2 = _wchar()
        message = store.messages.get(reply.id)
        ok = message.text == "".join(deltas) and message.status.value == "complete"
        return {
            "strategy": "fleetstore",
            "pace_s": pace,
            "seconds": t1 - t0,
            "transactions": m1["writes"] - m0["writes"],
            "flushes": reply.flushes,
            "bytes_wal": w2 - w0 - meter.bytes,
            "bytes_checkpoint": meter.bytes,
            "bytes": w2 - w0,
            "checkpoints": m1["checkpoints"] - m0["checkpoints"],
            "final_size": len("".join(deltas).encode()),
            "db_bytes": path.stat().st_size,
            "ok": ok,
        }
    finally:
        store.close()


def stream_rewrite(path: Path, deltas: list[str], pace: float) -> dict[str, Any]:
    """The baseline: the whole part rewritten, plus an event row, on every delta."""
    from fleetstore import Database, Migration

    db = Database.open(path, migrations=(Migration(1, "opencode-like tables", REWRITE_SCHEMA),))
    sid, mid, pid = "ses_bench", "msg_bench", "prt_bench"
    commits = 0
    try:
        now = int(time.time() * 1000)
        with db.write() as tx:
            tx.execute(
                "INSERT INTO session VALUES (?, ?, ?, ?)", (sid, now, now, '{"title":"bench"}')
            )
        db.checkpoint()
        meter = _CheckpointMeter(db)
        m0 = db.metrics()
        w0 = _wchar()
        t0 = time.monotonic()
        created = int(time.time() * 1000)
        info = {"role": "assistant", "modelID": "bench", "time": {"created": created}}
        with db.write() as tx:
            tx.execute(
                "INSERT INTO message VALUES (?, ?, ?, ?, ?)",
                (mid, sid, created, created, json.dumps(info)),
            )
        commits += 1
        text = ""
        for d in _paced(deltas, pace):
            text += d
            now = int(time.time() * 1000)
            part = {
                "id": pid,
                "sessionID": sid,
                "messageID": mid,
                "type": "text",
                "text": text,
                "time": {"start": created},
            }
            event = {"type": "message.part.updated", "partID": pid, "delta": d}
            with db.write() as tx:
                tx.execute(PART_UPSERT, (pid, mid, sid, created, now, json.dumps(part)))
                tx.execute(EVENT_INSERT, (sid, "message.part.updated", now, json.dumps(event)))
            commits += 1
        done = int(time.time() * 1000)
        info["time"] = {"created": created, "completed": done}
        with db.write() as tx:
            tx.execute(
                "UPDATE message SET time_updated = ?, data = ? WHERE id = ?",
                (done, json.dumps(info), mid),
            )
        commits += 1
        t1 = time.monotonic()
        m1 = db.metrics()
        db.checkpoint()
        w2 = _wchar()
        stored = db.read(lambda tx: tx.execute("SELECT data FROM part WHERE id = ?", (pid,)))
        ok = json.loads(stored[0][0])["text"] == "".join(deltas)
        writes = m1["writes"] - m0["writes"]
        if writes != commits:
            raise RuntimeError(f"rewrite: engine counted {writes} writes, the loop {commits}")
        return {
            "strategy": "rewrite",
            "pace_s": pace,
            "seconds": t1 - t0,
            "transactions": writes,
            "flushes": None,
            "bytes_wal": w2 - w0 - meter.bytes,
            "bytes_checkpoint": meter.bytes,
            "bytes": w2 - w0,
            "checkpoints": m1["checkpoints"] - m0["checkpoints"],
            "final_size": len("".join(deltas).encode()),
            "db_bytes": path.stat().st_size,
            "ok": ok,
        }
    finally:
        db.close()


def run_streams(root: Path, n: int, paces: tuple[float, ...], keep: bool) -> list[dict[str, Any]]:
    deltas = _deltas(n)
    rows = []
    for pace in paces:
        for name, fn in (("fleetstore", stream_fleetstore), ("rewrite", stream_rewrite)):
            cell = root / f"stream-{name}-{pace * 1000:g}ms"
            shutil.rmtree(cell, ignore_errors=True)
            cell.mkdir(parents=True)
            print(f"stream  pace {pace * 1000:>4g} ms  {name:<10} ...", end="", flush=True)
            row = fn(cell / "bench.db", deltas, pace)
            rows.append(row)
            print(
                f" {row['seconds']:6.2f} s  {row['transactions']:5d} tx  "
                f"{row['bytes'] / 1e6:8.3f} MB written ({row['bytes'] / row['final_size']:.1f}x)"
                f"  text ok {row['ok']}",
                flush=True,
            )
            if not keep:
                shutil.rmtree(cell, ignore_errors=True)
    return rows


# --------------------------------------------------------------------------- fleet


def _raw_hist(store: Any, name: str) -> dict[str, Any] | None:
    """A copy of one of the engine's per-process histograms (bucket counts, n, sum,
    max).  Store.metrics() gives percentiles only, which cannot be combined across
    processes; the buckets can.  Private attributes: None if they moved."""
    try:
        metrics = store.db._metrics
        with metrics._lock:
            h = getattr(metrics, name)
            return {"counts": list(h._counts), "n": h._n, "sum": h._sum, "max": h._max}
    except AttributeError:
        return None


def _hist_delta(end: dict[str, Any] | None, start: dict[str, Any] | None) -> dict[str, Any] | None:
    """The samples added between two copies (the max is that of the later copy)."""
    if end is None or start is None:
        return None
    return {
        "counts": [a - b for a, b in zip(end["counts"], start["counts"], strict=True)],
        "n": end["n"] - start["n"],
        "sum": end["sum"] - start["sum"],
        "max": end["max"],
    }


def _merge_hists(parts: list[dict[str, Any] | None]) -> dict[str, float] | None:
    """The fleet's histogram: bucket counts summed, read with the library's own
    quantile rule (upper bound of the bucket, capped at the max)."""
    if not parts or any(p is None for p in parts):
        return None
    from fleetstore.core.metrics import Histogram

    h = Histogram()
    counts = [0] * len(h._counts)
    for p in parts:
        assert p is not None
        for i, c in enumerate(p["counts"]):
            counts[i] += c
    h._counts = counts
    h._n = sum(p["n"] for p in parts if p)
    h._sum = sum(p["sum"] for p in parts if p)
    h._max = max(p["max"] for p in parts if p)
    return h.snapshot()


def _agent(
    variant: str, path: str, seconds: float, index: int, seed: int, conn: Connection
) -> None:
    """One agent process: open, report ready, wait for the common start, append, report."""
    try:
        import zstandard

        import fleetstore
        from fleetstore import Text, ToolCall, ToolResult
        from fleetstore.domain.blobs import COMPRESSION_LEVEL

        rng = random.Random(seed)
        pid = os.getpid()
        store = fleetstore.open(path, **VARIANT_SETTINGS[variant])
        session = store.sessions.create(title=f"agent {index}", project="bench")
        sid = session.id
        filler = os.urandom(SMALL_OUTPUT[1] // 2).hex()
        base = os.urandom(LARGE_MAX // 2).hex() if variant != "none" else ""
        store.messages.append(sid, "user", "start")  # warm: connections, statements
        conn.send(("ready", pid))
        start_at = conn.recv()
        end_at = start_at + seconds
        sleep_until(start_at)
        hold0 = _raw_hist(store, "lock_hold")
        wait0 = _raw_hist(store, "lock_wait")
        m0 = store.metrics()
        cpu0 = time.process_time()

        lat_small = array("d")
        lat_large = array("d")
        done_at = array("d")
        large_bytes = 0
        large_count = 0
        acked = 1  # the warm-up message
        k = 0
        call_id = ""
        while True:
            pause = rng.expovariate(1.0 / THINK_MEAN_S)
            if time.monotonic() + pause >= end_at:
                break
            time.sleep(pause)
            k += 1
            is_large = False
            large_now = 0
            if k % 2:
                call_id = f"call-{index}-{k}"
                role = "assistant"
                parts: list[Any] = [
                    Text(f"step {k}: " + filler[: rng.randint(250, 350)]),
                    ToolCall("bash", {"cmd": f"grep -rn pattern src/{k}"}, call_id),
                ]
            else:
                role = "tool"
                # Drawn in every variant, so that all of them make the same choices.
                is_large = rng.random() < LARGE_SHARE and variant != "none"
                size = rng.randint(LARGE_MIN, LARGE_MAX)
                small = rng.randint(*SMALL_OUTPUT)
                if is_large:
                    prefix = f"agent {index} output {k}\n"  # unique: no two share a blob
                    output = prefix + base[: size - len(prefix)]
                    large_now = size
                    if variant == "cpu-only":
                        # What encode_payload and BlobStore.put compute, thrown away:
                        # separates their CPU cost from the blob file's write and fsync.
                        raw = output.encode("utf-8")
                        hashlib.sha256(raw).hexdigest()
                        zstandard.ZstdCompressor(
                            level=COMPRESSION_LEVEL, write_content_size=True
                        ).compress(raw)
                        is_large = False
                        output = filler[:small]
                else:
                    output = filler[:small]
                parts = [ToolResult(call_id, output, False, "bash")]
            t0 = time.monotonic()
            if t0 >= end_at:
                break
            store.messages.append(sid, role, parts)
            t1 = time.monotonic()
            acked += 1
            if large_now:
                large_count += 1
                large_bytes += large_now
            (lat_large if is_large else lat_small).append(t1 - t0)
            done_at.append(t1)
        cpu_s = time.process_time() - cpu0
        m1 = store.metrics()
        hold = _hist_delta(_raw_hist(store, "lock_hold"), hold0)
        waited = _hist_delta(_raw_hist(store, "lock_wait"), wait0)
        store.close()
        conn.send(
            (
                "done",
                {
                    "pid": pid,
                    "session_id": sid,
                    "acked": acked,
                    "lat_small": lat_small.tobytes(),
                    "lat_large": lat_large.tobytes(),
                    "done_at": done_at.tobytes(),
                    "large_bytes": large_bytes,
                    "large_count": large_count,
                    "cpu_s": cpu_s,
                    "hold": hold,
                    "wait": waited,
                    "metrics": m1,
                    "writes": m1["writes"] - m0["writes"],
                    "spooled": m1["spooled"] - m0["spooled"],
                    "busy_timeouts": m1["busy_timeouts"] - m0["busy_timeouts"],
                    "checkpoints": m1["checkpoints"] - m0["checkpoints"],
                },
            )
        )
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _verify_fleet(path: Path, variant: str, results: list[dict[str, Any]], large: int) -> str:
    """'' if the file holds exactly what the agents acknowledged, else what differs."""
    problems = []
    con = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        for r in results:
            ((n,),) = con.execute(
                "SELECT count(*) FROM messages WHERE session_id = ?", (r["session_id"],)
            ).fetchall()
            if n != r["acked"]:
                problems.append(f"session of pid {r['pid']}: {n} messages, {r['acked']} acked")
        ((blob_parts,),) = con.execute(
            "SELECT count(*) FROM parts WHERE kind = 'tool_result' AND blob_sha IS NOT NULL"
        ).fetchall()
        ((inline_big,),) = con.execute(
            "SELECT count(*) FROM parts WHERE kind = 'tool_result' AND blob_sha IS NULL"
            " AND size >= ?",
            (LARGE_MIN,),
        ).fetchall()
    finally:
        con.close()
    want_blob = large if variant == "blob" else 0
    want_inline = large if variant == "inline" else 0
    if blob_parts != want_blob:
        problems.append(f"{blob_parts} blob tool results, expected {want_blob}")
    if inline_big != want_inline:
        problems.append(f"{inline_big} inline large tool results, expected {want_inline}")
    files = sum(1 for _ in Path(f"{path}.blobs").rglob("*") if _.is_file())
    if files != want_blob:
        problems.append(f"{files} blob files, expected {want_blob}")
    return "; ".join(problems)


def run_fleet(
    variant: str, label: str, agents: int, seconds: float, root: Path, keep: bool
) -> dict[str, Any]:
    import fleetstore

    cell = root / f"fleet-{label}"
    shutil.rmtree(cell, ignore_errors=True)
    path = cell / "bench.db"
    fleetstore.open(path).close()  # schema first, outside the measurement
    os.sync()  # the previous run's dirty pages written back before this one starts
    ctx = mp.get_context("spawn")
    procs: list[Any] = []
    conns: list[Connection] = []
    load1 = loadavg()
    wall0 = time.monotonic()
    try:
        for i in range(agents):
            parent, child = ctx.Pipe()
            seed = zlib.crc32(f"agent/{i}".encode())
            proc = ctx.Process(
                target=_agent, args=(variant, str(path), seconds, i, seed, child), daemon=True
            )
            proc.start()
            child.close()
            procs.append(proc)
            conns.append(parent)
        for c in conns:
            if not c.poll(180):
                raise RuntimeError("an agent did not report ready within 180 s")
            kind, payload = c.recv()
            if kind != "ready":
                raise RuntimeError(f"agent failed before start:\n{payload}")
        start_at = time.monotonic() + 0.25
        ready_s = start_at - wall0
        for c in conns:
            c.send(start_at)
        sleep_until(start_at)
        cpu0 = proc_stat()
        sleep_until(start_at + seconds)
        cpu1 = proc_stat()
        wal_bytes = path.with_name(path.name + "-wal").stat().st_size
        results: list[dict[str, Any]] = []
        pending = set(conns)
        deadline = start_at + seconds + 300
        while pending:
            ready = wait(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise RuntimeError(f"{len(pending)} agent(s) did not finish in time")
            for c in ready:
                kind, payload = c.recv()  # type: ignore[union-attr]
                if kind != "done":
                    raise RuntimeError(f"agent failed:\n{payload}")
                results.append(payload)
                pending.discard(c)  # type: ignore[arg-type]
        drain_s = time.monotonic() - (start_at + seconds)
        for proc in procs:
            proc.join(30)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for c in conns:
            c.close()

    end_at = start_at + seconds
    small: list[float] = []
    large: list[float] = []
    in_window = 0
    for r in results:
        for key, out in (("lat_small", small), ("lat_large", large)):
            values = array("d")
            values.frombytes(r[key])
            out.extend(values)
        done = array("d")
        done.frombytes(r["done_at"])
        in_window += sum(1 for d in done if d <= end_at)
    small.sort()
    large.sort()
    hold = _merge_hists([r["hold"] for r in results])
    waited = _merge_hists([r["wait"] for r in results])
    per_proc_p99 = sorted(r["metrics"]["lock_hold"]["p99"] for r in results)
    row: dict[str, Any] = {
        "variant": variant,
        "label": label,
        "agents": agents,
        "seconds": seconds,
        "appends_per_s": in_window / seconds,
        "small": len(small),
        "large": sum(r["large_count"] for r in results),
        "large_mb": sum(r["large_bytes"] for r in results) / 1e6,
        "small_p50_ms": 1000 * pct(small, 50),
        "small_p99_ms": 1000 * pct(small, 99),
        "small_max_ms": 1000 * small[-1] if small else math.nan,
        "large_p50_ms": 1000 * pct(large, 50),
        "large_max_ms": 1000 * large[-1] if large else math.nan,
        "hold": hold,
        "wait": waited,
        "hold_p99_ms": 1000 * hold["p99"] if hold else math.nan,
        "hold_max_ms": 1000 * hold["max"] if hold else math.nan,
        "hold_worst_proc_p99_ms": 1000 * per_proc_p99[-1] if per_proc_p99 else math.nan,
        "hold_share_pct": 100 * hold["mean"] * hold["count"] / seconds if hold else math.nan,
        "wait_p99_ms": 1000 * waited["p99"] if waited else math.nan,
        "writes": sum(r["writes"] for r in results),
        "spooled": sum(r["spooled"] for r in results),
        "busy_timeouts": sum(r["busy_timeouts"] for r in results),
        "checkpoints": sum(r["checkpoints"] for r in results),
        "wal_mb_at_end": wal_bytes / 1e6,
        "db_mb": path.stat().st_size / 1e6,
        "blobs_mb": _dir_bytes(Path(f"{path}.blobs")) / 1e6,
        "load_at_start": load1,
        "ready_s": ready_s,
        "drain_s": drain_s,
        "cpu_busy_pct": math.nan,
        "cpu_other_pct": math.nan,
    }
    if cpu0 and cpu1 and cpu1["total"] > cpu0["total"]:
        total = cpu1["total"] - cpu0["total"]
        row["cpu_busy_pct"] = 100.0 * (cpu1["busy"] - cpu0["busy"]) / total
        available_s = total / os.sysconf("SC_CLK_TCK")
        own = sum(r["cpu_s"] for r in results)
        row["cpu_other_pct"] = max(0.0, row["cpu_busy_pct"] - 100.0 * own / available_s)
    row["problems"] = _verify_fleet(path, variant, results, row["large"])
    if not keep:
        shutil.rmtree(cell, ignore_errors=True)
    return row


# --------------------------------------------------------------------------- report


def _fmt(x: Any, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}f}"


def _mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def targets(doc: dict[str, Any]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    streams = doc.get("streams") or []
    for fs in (r for r in streams if r["strategy"] == "fleetstore"):
        pace = f"{fs['pace_s'] * 1000:g} ms"
        base = next(
            (r for r in streams if r["strategy"] == "rewrite" and r["pace_s"] == fs["pace_s"]),
            None,
        )
        vs = ""
        tx = f"{fs['transactions']} tx"
        if base:
            vs = f"; rewrite baseline {base['bytes'] / fs['final_size']:.0f}x"
            tx += f" (rewrite baseline {base['transactions']})"
        out.append(
            {
                "target": f"stream, pace {pace}: <= {TARGET_TRANSACTIONS} write transactions",
                "value": tx,
                "verdict": _verdict(fs["transactions"] <= TARGET_TRANSACTIONS and fs["ok"]),
            }
        )
        factor = fs["bytes"] / fs["final_size"]
        out.append(
            {
                "target": f"stream, pace {pace}: <= {TARGET_BYTES_FACTOR:g}x final size "
                "written (WAL + checkpoints)",
                "value": f"{factor:.2f}x ({fs['bytes']:,} B, of which checkpoints "
                f"{fs['bytes_checkpoint']:,}){vs}",
                "verdict": _verdict(factor <= TARGET_BYTES_FACTOR and fs["ok"]),
            }
        )
        wal = fs["bytes_wal"] / fs["final_size"]
        wal_vs = f"; rewrite baseline {base['bytes_wal'] / fs['final_size']:.0f}x" if base else ""
        out.append(
            {
                "target": f"stream, pace {pace}: the same, WAL writes only",
                "value": f"{wal:.2f}x ({fs['bytes_wal']:,} B){wal_vs}",
                "verdict": _verdict(wal <= TARGET_BYTES_FACTOR and fs["ok"]),
            }
        )
    fleet = doc.get("fleet") or []
    base_rows = [r for r in fleet if r["variant"] == "none"]
    if base_rows:
        for variant in ("blob", "cpu-only", "inline"):
            row = next((r for r in fleet if r["variant"] == variant), None)
            if row is None:
                continue
            for key, what in (
                ("hold_p99_ms", "p99 lock hold"),
                ("small_p99_ms", "small-write p99"),
            ):
                base = _mean([r[key] for r in base_rows])
                ratio = row[key] / base if base else math.nan
                target = variant == "blob"
                out.append(
                    {
                        "target": f"fleet {variant}/none: {what}"
                        + (f" <= {TARGET_FLEET_RATIO:g}x" if target else " (contrast, no target)"),
                        "value": f"{ratio:.2f}x ({row[key]:.2f} vs {base:.2f} ms)",
                        "verdict": _verdict(ratio <= TARGET_FLEET_RATIO) if target else "-",
                    }
                )
        bad = [r["label"] for r in fleet if r["problems"]]
        out.append(
            {
                "target": "(check) every acknowledged append in the file, large outputs "
                "where the variant puts them",
                "value": f"{len(fleet) - len(bad)} of {len(fleet)} runs clean"
                + (": " + ", ".join(bad) if bad else ""),
                "verdict": _verdict(not bad),
            }
        )
    return out


def markdown(doc: dict[str, Any]) -> str:
    info = doc["info"]
    lines = [
        f"Run {info['date']} on {info['machine']}; git {info['git_head']}, sources "
        f"{info['sources_sha256']}; load average at start {info['loadavg_at_start']}, "
        f"at end {info.get('loadavg_at_end', '?')}.",
        f"Command: `{info['command']}`",
        "",
    ]
    streams = doc.get("streams") or []
    if streams:
        lines += [
            f"Streaming: {streams[0]['final_size']:,} bytes as {info['deltas']} deltas.",
            "",
            "| pace ms | strategy | seconds | transactions | flushes | WAL bytes "
            "| checkpoint bytes | bytes written | x final size | x, WAL only "
            "| bytes per transaction | checkpoints | text ok |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in streams:
            lines.append(
                f"| {r['pace_s'] * 1000:g} | {r['strategy']} | {r['seconds']:.2f} "
                f"| {r['transactions']} | {r['flushes'] if r['flushes'] is not None else '-'} "
                f"| {r['bytes_wal']:,} | {r['bytes_checkpoint']:,} | {r['bytes']:,} "
                f"| {r['bytes'] / r['final_size']:.2f} | {r['bytes_wal'] / r['final_size']:.2f} "
                f"| {r['bytes'] / r['transactions']:,.0f} | {r['checkpoints']} "
                f"| {'yes' if r['ok'] else 'NO'} |"
            )
        lines.append("")
    fleet = doc.get("fleet") or []
    if fleet:
        lines += [
            f"Large outputs: {fleet[0]['agents']} agents, {fleet[0]['seconds']:g} s per run, "
            f"think time exponential, mean {1000 * THINK_MEAN_S:g} ms.",
            "",
            "| run | appends/s | large (MB) | small p50 ms | small p99 ms | small max ms "
            "| large p50 ms | lock hold p99 ms | worst process p99 ms | hold max ms "
            "| gate held % | lock wait p99 ms | spooled | CPU busy % | other CPU % | rows ok |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in fleet:
            lines.append(
                f"| {r['label']} | {r['appends_per_s']:.0f} | {r['large']} ({r['large_mb']:.0f}) "
                f"| {_fmt(r['small_p50_ms'], 2)} | {_fmt(r['small_p99_ms'], 2)} "
                f"| {_fmt(r['small_max_ms'])} | {_fmt(r['large_p50_ms'])} "
                f"| {_fmt(r['hold_p99_ms'], 2)} | {_fmt(r['hold_worst_proc_p99_ms'], 2)} "
                f"| {_fmt(r['hold_max_ms'])} | {_fmt(r['hold_share_pct'], 0)} "
                f"| {_fmt(r['wait_p99_ms'], 2)} | {r['spooled']} | {_fmt(r['cpu_busy_pct'], 0)} "
                f"| {_fmt(r['cpu_other_pct'], 0)} | {'yes' if not r['problems'] else 'NO: ' + r['problems']} |"
            )
        lines.append("")
    lines += ["| target | this run | verdict |", "|---|---|---|"]
    for t in targets(doc):
        lines.append(f"| {t['target']} | {t['value']} | **{t['verdict']}** |")
    return "\n".join(lines) + "\n"


def machine_info() -> dict[str, Any]:
    import fleetstore

    digest = hashlib.sha256()
    for f in sorted((BENCH_DIR.parent / "src" / "fleetstore").rglob("*")):
        if f.suffix in (".py", ".sql"):
            digest.update(f.read_bytes())
    try:
        head = (BENCH_DIR.parent / ".git" / "HEAD").read_text().strip()
        if head.startswith("ref: "):
            head = (BENCH_DIR.parent / ".git" / head[5:]).read_text().strip()
    except OSError:
        head = "?"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": (
            f"{os.cpu_count()} CPUs ({platform.machine()}), Linux {platform.release()}, "
            f"Python {platform.python_version()}, apsw {apsw.apsw_version()}, "
            f"SQLite {apsw.sqlite_lib_version()}, "
            f"fleetstore {getattr(fleetstore, '__version__', '?')}"
        ),
        "git_head": head[:12],
        "sources_sha256": digest.hexdigest()[:12],
        "loadavg_at_start": loadavg(),
        "command": " ".join([".venv/bin/python", "benchmarks/bench_history.py", *sys.argv[1:]]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few seconds: for development")
    ap.add_argument("--only", choices=("stream", "fleet"), help="run one part only")
    ap.add_argument("--deltas", type=int, default=DELTAS, help="deltas per streamed reply")
    ap.add_argument(
        "--paces",
        help="seconds between deltas, comma-separated (default 0,0.001,0.005,0.02,0.05; "
        "--quick: 0,0.001)",
    )
    ap.add_argument(
        "--variants",
        help="fleet variants in run order, comma-separated (default none,blob,cpu-only,inline "
        "and none again; --quick: none,blob,inline)",
    )
    ap.add_argument("--agents", type=int, default=AGENTS, help="agent processes (fleet)")
    ap.add_argument("--seconds", type=float, help=f"measured seconds per fleet run ({SECONDS:g})")
    ap.add_argument(
        "--json",
        type=Path,
        help="where the figures go (default benchmarks/results/history-<time>.json)",
    )
    ap.add_argument("--markdown", type=Path, help="write the tables and verdicts here too")
    ap.add_argument(
        "--workdir", type=Path, help="where the databases go (default benchmarks/results/)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the databases")
    ap.add_argument("--report", type=Path, help="run nothing: print the tables of a --json file")
    args = ap.parse_args(argv)
    if args.report:
        print_report(args.report, markdown, args.markdown)
        return 0

    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = args.workdir or BENCH_DIR / "results" / f"history-{stamp}"
    if args.paces:
        paces = tuple(float(x) for x in args.paces.split(",") if x.strip())
    else:
        paces = QUICK_PACES if args.quick else PACES
    seconds = args.seconds or (QUICK_SECONDS if args.quick else SECONDS)
    info = machine_info()
    info["deltas"] = args.deltas
    print(f"# {info['machine']}\n# databases under {root}", flush=True)
    doc: dict[str, Any] = {"info": info, "streams": [], "fleet": []}
    t0 = time.monotonic()
    if args.only in (None, "stream"):
        doc["streams"] = run_streams(root, args.deltas, paces, args.keep)
    if args.only in (None, "fleet"):
        # The baseline first and again last: drift in the machine's state shows as
        # the gap between the two, and the ratios use their mean.
        if args.variants:
            names = [v.strip() for v in args.variants.split(",") if v.strip()]
        elif args.quick:
            names = ["none", "blob", "inline"]
        else:
            names = [*VARIANTS, "none"]
        for name in names:
            if name not in VARIANTS:
                ap.error(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")
        plan = []
        for name in names:
            runs = sum(1 for v, _ in plan if v == name)
            plan.append((name, name if not runs else f"{name} (run {runs + 1})"))
        for variant, label in plan:
            print(
                f"fleet   {label:<13} {args.agents} agents x {seconds:g} s ...", end="", flush=True
            )
            row = run_fleet(variant, label, args.agents, seconds, root, args.keep)
            doc["fleet"].append(row)
            print(
                f" {row['appends_per_s']:6.0f} appends/s  large {row['large']:3d}  "
                f"small p99 {_fmt(row['small_p99_ms'], 2)} ms  "
                f"hold p99 {_fmt(row['hold_p99_ms'], 2)} ms (worst process "
                f"{_fmt(row['hold_worst_proc_p99_ms'], 2)})  spooled {row['spooled']}  "
                f"cpu {_fmt(row['cpu_busy_pct'], 0)} % (other {_fmt(row['cpu_other_pct'], 0)} %)  "
                f"ready {row['ready_s']:.1f} s drain {row['drain_s']:.1f} s"
                + (f"\n    WARNING: {row['problems']}" if row["problems"] else ""),
                flush=True,
            )
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    info["loadavg_at_end"] = loadavg()
    info["wall_s"] = round(time.monotonic() - t0, 1)
    doc["targets"] = targets(doc)
    md = markdown(doc)
    out = args.json or BENCH_DIR / "results" / f"history-{stamp}.json"
    save_results(doc, md, info["wall_s"], out, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
