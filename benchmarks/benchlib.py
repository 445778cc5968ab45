"""Pieces the fleet benchmarks share: percentiles, pacing, machine figures, results files."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
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


def print_report(path: Path, markdown: Callable[[dict[str, Any]], str], out: Path | None) -> None:
    """``--report``: the tables of a results file, printed (and written to *out*)."""
    md = markdown(json.loads(path.read_text()))
    print(md)
    if out:
        out.write_text(md)


def save_results(
    doc: dict[str, Any], md: str, wall_s: float, json_path: Path, md_path: Path | None
) -> None:
    """Print the tables, write the figures to *json_path* (and the tables to *md_path*)."""
    print(f"\n# done in {wall_s:g} s\n\n{md}")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(no_nan(doc), indent=2) + "\n")
    print(f"# figures in {json_path}")
    if md_path:
        md_path.parent.mkdir(parents=True, exist_ok=True)
        md_path.write_text(md)


class Children:
    """Processes started with ``multiprocessing``'s spawn context, each given one end of
    a pipe (``target(*args(i), conn)``); kept for several cells, told to exit by
    ``close()`` (a ``("exit",)`` message), killed if they do not."""

    def __init__(self, n: int, target: Callable[..., Any], args: Callable[[int], tuple[Any, ...]]):
        self.ctx = ctx = mp.get_context("spawn")
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        for i in range(n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=target, args=(*args(i), child), daemon=True)
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(("exit",))
            except OSError:
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
        for c in self.conns:
            c.close()


def expect(conn: Connection, what: str, timeout: float) -> Any:
    """The payload of the child's next ``(what, payload)`` message; ``RuntimeError`` if it
    sent something else (its traceback) or nothing within *timeout*."""
    if not conn.poll(timeout):
        raise RuntimeError(f"no {what!r} from a child within {timeout:g} s")
    kind, payload = conn.recv()
    if kind != what:
        raise RuntimeError(f"a child failed (wanted {what!r}):\n{payload}")
    return payload


def fmt(x: Any, digits: int = 1) -> str:
    """A figure for a table: thousands separated, ``-`` for none or NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.{digits}f}"
