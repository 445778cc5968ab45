"""Per-process write figures: counters and log-bucketed latency histograms.

Cheap enough for the write path: one ``math.log`` and a list increment per sample.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from fleetstore.core import telemetry

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

    @property
    def count(self) -> int:
        return self._n

    @property
    def total(self) -> float:
        return self._sum

    def cumulative(self, bounds: tuple[float, ...]) -> list[int]:
        """For each of *bounds* (ascending, seconds), how many samples were at most it,
        as Prometheus's ``le`` buckets: to within a bucket's 10 % (a sample in a bucket
        that straddles a bound is counted at the next bound)."""
        out = []
        seen = 0
        index = 0
        for bound in bounds:
            while index < _BUCKETS and _BASE * _GROWTH**index <= bound * (1 + 1e-9):
                seen += self._counts[index]
                index += 1
            out.append(seen)
        return out

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

    def __init__(self, system: str = "sqlite") -> None:
        self._lock = threading.Lock()
        #: ``db.system.name``: "sqlite" or "postgresql" (OpenTelemetry's attribute).
        self.system = system
        self.counters = dict.fromkeys(self.COUNTERS, 0)
        self.lock_wait = Histogram()
        self.lock_hold = Histogram()
        self.checkpoint_duration = Histogram()
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
        # An attribute read while no OpenTelemetry SDK is installed (core/telemetry.py).
        otel = telemetry.ACTIVE
        if otel is not None:
            otel.record("lock_wait", wait, self.system)
            otel.record("lock_hold", hold, self.system)

    def record_checkpoint(self, seconds: float) -> None:
        """A checkpoint ran for *seconds*."""
        with self._lock:
            self.counters["checkpoints"] += 1
            self.checkpoint_duration.add(seconds)
        otel = telemetry.ACTIVE
        if otel is not None:
            otel.record("checkpoint_duration", seconds, self.system)

    def export(self) -> dict[str, Any]:
        """The raw histograms, for merging across processes (``Histogram.from_buckets``)."""
        with self._lock:
            return {
                "lock_wait": self.lock_wait.export(),
                "lock_hold": self.lock_hold.export(),
                "checkpoint_duration": self.checkpoint_duration.export(),
            }

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                **self.counters,
                "last_error": dict(self.last_error) if self.last_error else None,
                "lock_wait": self.lock_wait.snapshot(),
                "lock_hold": self.lock_hold.snapshot(),
            }


class OutboxMetrics:
    """What one process's outbox did: effects enqueued, claimed and settled (by
    outcome), how long claimed effects had waited and how long handlers ran."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Incremented without the lock, under the GIL (``+=`` on an int attribute runs
        #: no Python code in between): a lock here was a call per enqueue, which the
        #: cost guards of tests/store/test_cost.py count.
        self.enqueued = 0
        self.claimed = 0
        self.settled = dict.fromkeys(telemetry.OUTCOMES, 0)
        self.wait = Histogram()
        self.run = Histogram()

    def record_claims(self, claims: list[Any]) -> None:
        """*claims* made (``Claim`` values, just returned): each effect waited from
        when it became available (enqueued, its delay or retry over) to its claim (its
        ``started_at``).  Four calls a claim: every claim pays them
        (tests/store/test_cost.py)."""
        with self._lock:
            for claim in claims:
                effect = claim.effect
                self.wait.add((effect.started_at or effect.available_at) - effect.available_at)
                self.claimed += 1
        otel = telemetry.ACTIVE
        if otel is not None:
            for claim in claims:
                effect = claim.effect
                otel.record(
                    "effect_wait",
                    (effect.started_at or effect.available_at) - effect.available_at,
                    "",
                )

    def record_run(self, seconds: float) -> None:
        """A handler ran for *seconds*."""
        with self._lock:
            self.run.add(seconds)
        otel = telemetry.ACTIVE
        if otel is not None:
            otel.record("effect_run", seconds, "")

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "enqueued": self.enqueued,
                "claimed": self.claimed,
                "settled": dict(self.settled),
                "wait": self.wait.snapshot(),
                "run": self.run.snapshot(),
            }

    def export(self) -> dict[str, Any]:
        """The raw histograms (see ``WriteMetrics.export``)."""
        with self._lock:
            return {"effect_wait": self.wait.export(), "effect_run": self.run.export()}


__all__ = ["Histogram", "OutboxMetrics", "WriteMetrics"]
