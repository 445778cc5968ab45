"""``fleetstore top``: a live view of a store and the processes using it.

Each frame reads what the processes publish (``<db>.procs/<pid>.json``, see
``fleetstore.store.procstats``), the sizes of the database, WAL and SHM files, and the
outbox by state; rates and the lock-wait p99 are over the last interval (the
difference of two snapshots), not over each process's lifetime.  A process found in
a read transaction frame after frame (``processes.wal_readers``, what doctor's
``wal-reset-blocked`` reads) is named with how long it has held it and how much the
WAL grew meanwhile: any process may pin the WAL, publishing or not (a 60 s reader let
it reach 2.3 GB in the soak of issue 23, and top did not say who).

A sharded store (``sqlite+sharded:///DIR``) publishes under ``DIR/catalog.db.procs/``
and its files are the catalog's; a frame adds the shard files on disk (a directory
listing and a ``stat`` of each ``-wal``: linear in shards, no database opened), the
largest shard WAL, and the shards the processes have open (their published
``shards_open``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from fleetstore.core.metrics import Histogram
from fleetstore.core.render import console, is_terminal, table, use_color
from fleetstore.core.targets import CATALOG, sharded_root
from fleetstore.core.units import size as _size
from fleetstore.engine.proclocks import lock_holders
from fleetstore.errors import LockHolder
from fleetstore.files import inspect, processes
from fleetstore.store.procstats import Published, read_published
from fleetstore.store.sharded.shards import shard_files as listed_shards


@dataclass(frozen=True, slots=True)
class Reader:
    """A process in a read transaction on the store's WAL, followed across samples."""

    pid: int
    #: The lowest WAL read mark it holds (0: checkpoints copy nothing back at all).
    slot: int
    #: When a sample first saw it in this read transaction, and the WAL's size then.
    since: float
    wal_then: int


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    procs: tuple[Published, ...]
    files: dict[str, int]
    outbox: dict[str, int] | None
    outbox_error: str | None = None
    #: A sharded store's shard files (``shard_files``), else None.
    shards: dict[str, Any] | None = None
    #: Who holds the writer gate or SQLite's write lock now (a sharded store: the
    #: catalog's), with their process state.
    holders: tuple[LockHolder, ...] = ()
    #: Processes in a read transaction now (a sharded store: on the catalog).
    readers: tuple[Reader, ...] = ()


@dataclass(slots=True)
class ProcRow:
    pid: int
    command: str
    alive: bool
    writes: int
    writes_per_s: float | None
    wait_p99: float | None
    retries: int
    busy: int
    spool_pending: int
    spooled: int
    age: float
    #: Shard databases the process has open (a sharded store), else None.
    shards_open: int | None = None
    #: Group commit, over the interval: this process's own operations committed per
    #: second (by itself or by another process for it), and the mean operations per
    #: transaction it committed; over its life: the largest such transaction.
    ops_per_s: float | None = None
    batch_mean: float | None = None
    batch_max: int = 0


@dataclass(slots=True)
class Frame:
    path: str
    at: float
    interval: float | None
    files: dict[str, int]
    outbox: dict[str, int] | None
    outbox_error: str | None
    rows: list[ProcRow] = field(default_factory=list)
    writes_per_s: float | None = None
    #: Operations committed per second, by every process; per commit (the batch size).
    ops_per_s: float | None = None
    batch_mean: float | None = None
    batch_max: int = 0
    wait_p99: float | None = None
    stale: int = 0
    #: A sharded store: shard files on disk, their WAL, shards open (None: one file).
    shards: dict[str, Any] | None = None
    holders: tuple[LockHolder, ...] = ()
    #: Readers seen in this sample and an earlier one: pinning the WAL.
    readers: list[dict[str, Any]] = field(default_factory=list)
    #: The search index, from the indexers' figures: sections indexed per second, and
    #: what they saw queued and how old its oldest entry was at their last look (the
    #: index's lag); None before any process published them.
    search: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "layout": "file" if self.shards is None else "sharded",
            "at": self.at,
            "interval": self.interval,
            "files": self.files,
            "shards": self.shards,
            "outbox": self.outbox,
            "outbox_error": self.outbox_error,
            "search": self.search,
            "writes_per_s": self.writes_per_s,
            "commits_per_s": self.writes_per_s,
            "operations_per_s": self.ops_per_s,
            "batch_mean": self.batch_mean,
            "batch_max": self.batch_max,
            "lock_wait_p99": self.wait_p99,
            "stale_files": self.stale,
            "lock_holders": [
                {
                    "pid": h.pid,
                    "lock": h.lock,
                    "command": h.command,
                    "state": h.state,
                    "stopped": h.state in ("T", "t"),
                }
                for h in self.holders
            ],
            "wal_readers": self.readers,
            "processes": [
                {
                    "pid": r.pid,
                    "command": r.command,
                    "writes": r.writes,
                    "writes_per_s": r.writes_per_s,
                    "operations_per_s": r.ops_per_s,
                    "batch_mean": r.batch_mean,
                    "batch_max": r.batch_max,
                    "lock_wait_p99": r.wait_p99,
                    "retries": r.retries,
                    "busy_timeouts": r.busy,
                    "spool_pending": r.spool_pending,
                    "spooled": r.spooled,
                    "shards_open": r.shards_open,
                    "published_age": r.age,
                }
                for r in self.rows
            ],
        }


def _file_sizes(path: str) -> dict[str, int]:
    sizes = {}
    for name, suffix in (("db", ""), ("wal", "-wal"), ("shm", "-shm")):
        try:
            sizes[name] = os.stat(path + suffix).st_size
        except OSError:
            sizes[name] = 0
    return sizes


def layout(path: str) -> tuple[str, Path | None]:
    """(the file whose figures and sizes are shown, the shard directory or None) for a
    store file's path or a ``sqlite+sharded:///DIR`` URL."""
    directory = sharded_root(path)
    if directory is not None:
        return str(directory / CATALOG), directory
    return path, None


def shard_files(directory: Path) -> dict[str, Any]:
    """The shard files under a sharded store's *directory*: how many, their bytes
    (database and WAL) and the largest WAL.  Only ``stat``: nothing is opened."""

    count = db_bytes = wal_bytes = 0
    largest: dict[str, Any] | None = None
    for key, path in listed_shards(directory):
        count += 1
        with contextlib.suppress(OSError):
            db_bytes += os.stat(path).st_size
        try:
            wal = os.stat(f"{path}-wal").st_size
        except OSError:
            continue
        wal_bytes += wal
        if largest is None or wal > largest["bytes"]:
            largest = {"key": key, "bytes": wal}
    return {
        "on_disk": count,
        "db_bytes": db_bytes,
        "wal_bytes": wal_bytes,
        "largest_wal": largest,
    }


def sample(path: str, outbox: Any = None, previous: Sample | None = None) -> Sample:
    """One reading of a store (its file's path, or a sharded store's URL).  *outbox*: a
    callable returning the outbox counts (or None); *previous*: the sample before,
    whose readers still in the same read transaction keep when they were first seen."""
    counts: dict[str, int] | None = None
    error = None
    if outbox is not None:
        try:
            counts = outbox()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
    db, directory = layout(path)
    shards = shard_files(directory) if directory is not None else None
    holders = tuple(lock_holders(db))
    at, sizes = time.time(), _file_sizes(db)
    return Sample(
        at,
        tuple(read_published(db)),
        sizes,
        counts,
        error,
        shards,
        holders,
        _readers(db, at, sizes["wal"], previous),
    )


def _readers(db: str, at: float, wal: int, previous: Sample | None) -> tuple[Reader, ...]:
    roles = {role: inspect.FileFacts.of(db + suffix).ident for role, suffix in _ROLES}
    known = {(r.pid, r.slot): r for r in previous.readers} if previous is not None else {}
    found = []
    for pid, slot in sorted(processes.wal_readers(processes.locks_on(roles)).items()):
        # The same read mark in consecutive samples: taken as one read transaction
        # (as doctor takes its two looks); it began before the first sample saw it.
        first = known.get((pid, slot))
        found.append(first if first is not None else Reader(pid, slot, at, wal))
    return tuple(found)


_ROLES = (("database", ""), ("wal", "-wal"), ("shm", "-shm"))


def _delta_hist(new: Published, old: Published | None, name: str) -> Histogram:
    """The histogram of what happened between two snapshots of one process."""
    hist = new.histogram(name)
    if old is None:
        return hist
    before = old.histogram(name).export()
    after = hist.export()
    diff: dict[str, Any] = {
        "buckets": {
            i: c - int(before["buckets"].get(i, 0))
            for i, c in after["buckets"].items()
            if c - int(before["buckets"].get(i, 0)) > 0
        },
        "n": after["n"] - before["n"],
        "sum": after["sum"] - before["sum"],
        "max": after["max"],
    }
    return Histogram.from_buckets(diff)


def frame(path: str, new: Sample, old: Sample | None) -> Frame:
    interval = new.at - old.at if old is not None else None
    previous = {p.pid: p for p in old.procs} if old is not None else {}
    result = Frame(path, new.at, interval, new.files, new.outbox, new.outbox_error)
    result.holders = new.holders
    result.readers = [
        {
            "pid": r.pid,
            "command": " ".join(processes.command_line(r.pid).split()),  # one line
            "read_mark": r.slot,
            "held_s": round(new.at - r.since, 3),  # at least: it began before
            "wal_bytes_then": r.wal_then,
            "wal_bytes": new.files["wal"],
            "wal_grew": max(new.files["wal"] - r.wal_then, 0),
        }
        for r in new.readers
        if r.since < new.at  # seen in an earlier sample too: not a short read
    ]
    merged = Histogram()
    total_rate = total_items = 0.0
    shards_open = 0
    indexed = 0
    for proc in new.procs:
        if not proc.alive:
            result.stale += 1
            continue
        metrics = proc.record.get("metrics", {})
        prev = previous.get(proc.pid)
        prev_metrics = prev.record.get("metrics", {}) if prev is not None else {}
        writes = int(metrics.get("writes", 0))
        rate = ops = mean = None
        wait = None
        if prev is not None and interval:
            commits = max(writes - int(prev_metrics.get("writes", 0)), 0)
            rate = commits / interval
            total_rate += rate
            items = _grew(metrics, prev_metrics, "batched_items")
            total_items += items
            own = items - _grew(metrics, prev_metrics, "served")
            ops = max(own + _grew(metrics, prev_metrics, "handed_over"), 0) / interval
            mean = items / commits if commits else None
            window = _delta_hist(proc, prev, "lock_wait")
            merged.merge_export(window.export())
            wait = window.quantile(0.99) if window.export()["n"] else None
            indexed += _grew(metrics, prev_metrics, "search_sections")
        if "search_queued" in metrics:
            seen = result.search or {"queued": 0, "lag_s": 0.0, "sections_per_s": None}
            seen["queued"] = max(seen["queued"], int(metrics.get("search_queued", 0)))
            seen["lag_s"] = max(seen["lag_s"], float(metrics.get("search_lag_s", 0.0)))
            result.search = seen
        result.rows.append(
            ProcRow(
                pid=proc.pid,
                command=proc.command,
                alive=proc.alive,
                writes=writes,
                writes_per_s=rate,
                wait_p99=wait,
                retries=int(metrics.get("begin_busy_retries", 0)),
                busy=int(metrics.get("busy_timeouts", 0)),
                spool_pending=int(metrics.get("spool_pending", 0)),
                spooled=int(metrics.get("spooled", 0)),
                age=proc.age,
                shards_open=_int_or_none(metrics.get("shards_open")),
                ops_per_s=ops,
                batch_mean=mean,
                batch_max=int(metrics.get("batch_max", 0)),
            )
        )
        result.batch_max = max(result.batch_max, int(metrics.get("batch_max", 0)))
        shards_open += int(metrics.get("shards_open") or 0)
    if new.shards is not None:
        result.shards = {**new.shards, "open": shards_open}
    if interval and result.search is not None:
        result.search["sections_per_s"] = indexed / interval
    if interval:
        result.writes_per_s = total_rate
        result.ops_per_s = total_items / interval
        result.batch_mean = total_items / (total_rate * interval) if total_rate else None
        result.wait_p99 = merged.quantile(0.99) if merged.export()["n"] else None
    return result


def _grew(new: dict[str, Any], old: dict[str, Any], key: str) -> int:
    return max(int(new.get(key, 0)) - int(old.get(key, 0)), 0)


def _batch(mean: float | None) -> str:
    return "-" if mean is None else f"{mean:.1f}"


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def render(
    f: Frame, width: int | None = None, height: int | None = None, styled: bool = False
) -> list[str]:
    """The frame as screen lines, at most *width* characters (unstyled: they read in
    any terminal and in logs) and *height* lines; *styled* (a terminal that takes
    colour): the table's header bold, lines not cut (the live screen crops them)."""
    width = width or shutil.get_terminal_size((100, 30)).columns
    lines = [
        f"fleetstore top  {f.path}  {time.strftime('%H:%M:%S', time.localtime(f.at))}",
        f"files      {'catalog ' if f.shards is not None else ''}db {_size(f.files['db'])}   "
        f"WAL {_size(f.files['wal'])}   "
        f"SHM {_size(f.files['shm'])}",
        f"commits/s  {_rate(f.writes_per_s)}   operations/s {_rate(f.ops_per_s)}   "
        f"batch {_batch(f.batch_mean)} (max {f.batch_max})   lock wait p99 {_ms(f.wait_p99)}   "
        f"processes {len(f.rows)}" + (f" (+{f.stale} gone)" if f.stale else ""),
    ]
    if f.shards is not None:
        largest = f.shards["largest_wal"]
        lines.insert(
            2,
            f"shards     {f.shards['on_disk']:,} on disk ({_size(f.shards['db_bytes'])}, "
            f"WAL {_size(f.shards['wal_bytes'])})   open {f.shards['open']:,}   largest WAL "
            + (f"{_size(largest['bytes'])} ({largest['key']})" if largest else "-"),
        )
    for holder in f.holders:
        lines.append(f"lock       {holder}")
    for rd in f.readers:
        lines.append(
            f"reader     pid {rd['pid']} ({rd['command'] or '?'}) has held a read transaction "
            f"for {rd['held_s']:.0f}+ s (WAL read lock {rd['read_mark']}): the WAL cannot be "
            f"reset, and grew {_size(rd['wal_grew'])} meanwhile, to {_size(rd['wal_bytes'])}"
        )
    if f.outbox is not None:
        states = ("pending", "running", "succeeded", "dead", "cancelled", "expired")
        lines.append("outbox     " + "   ".join(f"{s} {f.outbox.get(s, 0):,}" for s in states))
    elif f.outbox_error:
        lines.append(f"outbox     unavailable: {f.outbox_error}")
    if f.search is not None:
        lines.append(
            f"search     queued {f.search['queued']:,}   lag {f.search['lag_s']:.1f} s   "
            f"sections/s {_rate(f.search['sections_per_s'])}"
        )
    lines.append("")
    columns = ("PID", "OPS/S", "COMMITS/S", "BATCH", "WAIT P99", "COMMITS", "RETRIES", "BUSY")
    rows = [
        (
            r.pid,
            _rate(r.ops_per_s),
            _rate(r.writes_per_s),
            _batch(r.batch_mean),
            _ms(r.wait_p99),
            f"{r.writes:,}",
            f"{r.retries:,}",
            f"{r.busy:,}",
            f"{r.spool_pending:,}",
            r.command,
        )
        for r in f.rows
    ]
    lines += table(
        (*columns, "SPOOL", "COMMAND"),
        rows,
        right={*columns, "SPOOL"},
        indent=0,
        styled=styled,
        width=width,
    ).splitlines()
    if not f.rows:
        lines.append("        (no process is publishing figures for this store)")
    if f.interval is None:
        lines.append("")
        lines.append("rates appear from the second frame on")
    clipped = lines if styled else [line[:width] for line in lines]
    if height is not None and len(clipped) > height:
        clipped = [*clipped[: height - 1], f"... {len(lines) - height + 1} more"]
    return clipped


class _Keys:
    """Single keys from a terminal's stdin without Enter (cbreak), restored on exit."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._saved: Any = None

    def __enter__(self) -> _Keys:
        if sys.stdin.isatty():
            import termios
            import tty

            self._fd = sys.stdin.fileno()
            self._saved = termios.tcgetattr(self._fd)
            tty.setcbreak(self._fd)
        return self

    def wait(self, seconds: float) -> str:
        """Wait up to *seconds* for a key; the key, or ``""``."""
        if self._fd is None:
            time.sleep(seconds)
            return ""
        ready, _, _ = select.select([self._fd], [], [], seconds)
        return os.read(self._fd, 1).decode("utf-8", "replace") if ready else ""

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            import termios

            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)


def run(
    path: str,
    outbox: Any,
    interval: float,
    count: int | None,
    out: TextIO,
    as_json: bool = False,
) -> None:
    """Show frames on *out*: redrawn in place on a terminal (``q`` quits), one
    after another otherwise; ``as_json`` prints one JSON object per frame."""
    live = is_terminal(out) and not as_json
    old = sample(path, outbox)
    shown = 0
    with _Keys() as keys, _Screen(out, live) as screen:
        if count is not None and count > 0 and not live:
            # Rates need two samples: a frame printed once is the second.
            time.sleep(interval)
        else:
            screen.show(frame(path, old, None), as_json)
            shown += 1
        while count is None or shown < count:
            if live:
                key = keys.wait(interval)
                if key in ("q", "Q"):
                    return
            elif shown:
                time.sleep(interval)
            new = sample(path, outbox, old)
            screen.show(frame(path, new, old), as_json)
            old = new
            shown += 1


class _Screen:
    """Where frames go: on a terminal a rich ``Live`` screen (the alternate screen,
    redrawn in place, the terminal as it was after ``q``); elsewhere frame after
    frame (``--json``: one JSON object per line)."""

    def __init__(self, out: TextIO, live: bool) -> None:
        self.out = out
        self.live: Any = None
        if live:
            from rich.live import Live

            self.live = Live(console=console(out), screen=True, auto_refresh=False)

    def __enter__(self) -> _Screen:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()

    def show(self, f: Frame, as_json: bool) -> None:
        if as_json:
            self.out.write(json.dumps(f.to_json()) + "\n")
        elif self.live is not None:
            from rich.text import Text

            size = shutil.get_terminal_size((100, 30))
            body = render(f, size.columns, size.lines - 1, styled=use_color(self.out))
            text = Text.from_ansi("\n".join([*body, "(q quits)"]), no_wrap=True, overflow="crop")
            self.live.update(text, refresh=True)
        else:
            self.out.write("\n".join(render(f, 200)) + "\n\n")
        self.out.flush()


__all__ = ["Frame", "Reader", "Sample", "frame", "layout", "render", "run", "sample", "shard_files"]
