"""Per-process write figures: counters and log-bucketed latency histograms.

Cheap enough for the write path: one ``math.log`` and a list increment per sample.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

# Buckets grow by 10 % from 1 µs: percentile error stays under 10 %, and
# 300 buckets reach past an hour.
_BASE = 1e-6
_GROWTH = 1.1
_LOG_GROWTH = math.log(_GROWTH)
_BUCKETS = 300


class Histogram:
    """Durations in seconds; reports count, mean, p50/p90/p99 and max."""

    __slots__ = ("_counts", "_max", "_n", "_sum")

    def __init__(self) -> None:
        self._counts = [0] * _BUCKETS
        self._n = 0
        self._sum = 0.0
        self._max = 0.0

    def add(self, seconds: float) -> None:
        # Plain comparisons rather than min()/max(): this runs twice per write.
        if seconds <= _BASE:
            index = 0
            seconds = max(seconds, 0.0)
        else:
            index = int(math.log(seconds / _BASE) / _LOG_GROWTH) + 1
            if index >= _BUCKETS:
                index = _BUCKETS - 1
        self._counts[index] += 1
        self._n += 1
        self._sum += seconds
        if seconds > self._max:
            self._max = seconds

    def quantile(self, q: float) -> float:
        if self._n == 0:
            return 0.0
        rank = q * self._n
        seen = 0
        for index, count in enumerate(self._counts):
            seen += count
            if seen >= rank and count:
                upper = _BASE * _GROWTH**index
                return min(upper, self._max)
        return self._max

    def export(self) -> dict[str, Any]:
        """The raw histogram (non-empty buckets only), for ``from_buckets`` in another
        process: histograms merge by adding bucket counts, percentiles do not."""
        return {
            "buckets": {str(i): c for i, c in enumerate(self._counts) if c},
            "n": self._n,
            "sum": self._sum,
            "max": self._max,
        }

    @classmethod
    def from_buckets(cls, data: Any) -> Histogram:
        """A histogram from ``export()`` output; malformed input gives an empty one."""
        hist = cls()
        if isinstance(data, dict):
            hist.merge_export(data)
        return hist

    def merge_export(self, data: dict[str, Any]) -> None:
        """Add another histogram's ``export()`` to this one."""
        try:
            buckets = {int(i): int(c) for i, c in dict(data.get("buckets", {})).items()}
            n, total, top = int(data.get("n", 0)), float(data.get("sum", 0.0)), float(data["max"])
        except (TypeError, ValueError, KeyError):
            return
        for index, count in buckets.items():
            if 0 <= index < _BUCKETS and count > 0:
                self._counts[index] += count
        self._n += n
        self._sum += total
        self._max = max(self._max, top)

    def snapshot(self) -> dict[str, float]:
        return {
            "count": self._n,
            "mean": self._sum / self._n if self._n else 0.0,
            "p50": self.quantile(0.50),
            "p90": self.quantile(0.90),
            "p99": self.quantile(0.99),
            "max": self._max,
        }


class WriteMetrics:
    """What one process's writes to one database cost.  Thread-safe."""

    COUNTERS = (
        "writes",  # committed write transactions
        "write_errors",  # write blocks that raised and were rolled back
        "busy_timeouts",  # writes that ran out of budget (StoreBusy)
        "begin_busy_retries",  # BEGIN IMMEDIATE met an outside holder and was retried
        "gate_contended",  # the gate was not free at the first try
        "checkpoints",  # checkpoints run after commit
        "checkpoint_errors",  # checkpoints that failed (the WAL keeps the frames)
        "wal_restarts",  # commits that found the WAL started over (a checkpoint caught up)
        "post_commit_errors",  # work after a COMMIT that failed (the commit stands)
        "discarded_connections",  # connections thrown away after a failed rollback
        # PostgreSQL: a write transaction started over (always 0 on SQLite)
        "serialization_retries",  # SQLSTATE 40001
        "deadlock_retries",  # 40P01
        "connection_retries",  # the connection was lost (server restart, terminated backend)
        "ambiguous_commits",  # lost during COMMIT: run again, the operation's idempotency decides
        "unique_retries",  # a unique violation met under concurrency, run again to read the row
        # Group commit (engine/combine.py)
        "batched_items",  # items committed by this process's transactions, its own and others'
        "served",  # items of other processes this process committed for them
        "handed_over",  # items of this process another process committed
        "batch_max",  # the most items one of this process's transactions committed
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters = dict.fromkeys(self.COUNTERS, 0)
        self.lock_wait = Histogram()
        self.lock_hold = Histogram()
        #: The last failure of work beside the writes (a checkpoint, a gate hand-over).
        self.last_error: dict[str, Any] | None = None

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def peak(self, name: str, value: int) -> None:
        with self._lock:
            if value > self.counters[name]:
                self.counters[name] = value

    def note_error(self, counter: str, what: str, exc: BaseException) -> None:
        """Count a failure under *counter* and keep it as ``last_error``."""
        with self._lock:
            self.counters[counter] += 1
            self.last_error = {
                "at": time.time(),
                "what": what,
                "error": f"{type(exc).__name__}: {exc}"[:2000],
            }

    def record_write(self, wait: float, hold: float, items: int = 0, served: int = 0) -> None:
        """A commit: how long its writer waited for the lock and held it; *items*
        written in it (group commit: *served* of them for other processes)."""
        with self._lock:
            counters = self.counters
            counters["writes"] += 1
            self.lock_wait.add(wait)
            self.lock_hold.add(hold)
            if items:
                counters["batched_items"] += items
                if served:
                    counters["served"] += served
                if items > counters["batch_max"]:
                    counters["batch_max"] = items

    def export(self) -> dict[str, Any]:
        """The raw histograms, for merging across processes (``Histogram.from_buckets``)."""
        with self._lock:
            return {"lock_wait": self.lock_wait.export(), "lock_hold": self.lock_hold.export()}

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                **self.counters,
                "last_error": dict(self.last_error) if self.last_error else None,
                "lock_wait": self.lock_wait.snapshot(),
                "lock_hold": self.lock_hold.snapshot(),
            }


__all__ = ["Histogram", "WriteMetrics"]
