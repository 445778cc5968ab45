"""Pieces both fleet benchmarks use: percentiles, pacing, machine figures, JSON."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any


def pct(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list; NaN when empty."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def proc_stat() -> dict[str, int] | None:
    """Busy and total CPU ticks (all CPUs) and context switches since boot."""
    try:
        text = Path("/proc/stat").read_text()
    except OSError:
        return None
    out = {"busy": 0, "total": 0, "ctxt": 0}
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(x) for x in fields[1:]]
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
            out["total"] = sum(ticks[:8])
            out["busy"] = out["total"] - idle
        elif fields and fields[0] == "ctxt":
            out["ctxt"] = int(fields[1])
    return out


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def no_nan(value: Any) -> Any:
    """NaN (an empty sample) as JSON null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: no_nan(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [no_nan(v) for v in value]
    return value
