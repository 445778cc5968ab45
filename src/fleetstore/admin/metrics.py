"""``fleetstore metrics``: a whole store's figures, as Prometheus's text exposition or
as JSON, printed or served on ``/metrics`` (docs/telemetry.md).

The figures come from where fleetstore keeps them already: each process using the
store publishes its own about once a second (``<db>.procs/<pid>.json``,
store/procstats.py), the processes that closed it (or died and were cleared by
``fleetstore maintain``) were folded into ``<db>.procs/retired.json``, and what the
store holds now (effects per state, the age of the oldest available effect, the WAL's
size) is read from it.  Counters and histograms are the sum over all of them, so a
process that exits takes nothing away (Prometheus would read a falling counter as a
reset and count every other process's total again); gauges are over the live
processes.  Names, units and labels are ``core/telemetry.FIGURES``'s, the same as the
OpenTelemetry instruments'.

The text format (0.0.4) is written here rather than with ``prometheus_client``: the
command then needs nothing beyond fleetstore's own dependencies, and the format is a
few lines per family.  The tests read it with ``prometheus_client``'s parser and have
a real Prometheus server scrape it.
"""

from __future__ import annotations

import http.server
import json
import math
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetstore.core import telemetry
from fleetstore.core.metrics import Histogram
from fleetstore.core.telemetry import BUCKETS, FIGURES, Figure, StoreFigures, store_samples
from fleetstore.store.procstats import is_folded, procs_dir, read_published, read_retired

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(slots=True)
class Family:
    """One metric's series: (labels, value) pairs, or a histogram per label set."""

    figure: Figure
    values: dict[tuple[tuple[str, str], ...], float] = field(default_factory=dict)
    histogram: Histogram | None = None


@dataclass(slots=True)
class Figures:
    """A store's figures at one moment."""

    store: str
    at: float
    families: dict[str, Family]
    #: Why the store itself could not be read (its outbox and WAL figures are missing).
    error: str | None = None


def gather(store: str, base: Path | str, read_store: Callable[[], StoreFigures] | None) -> Figures:
    """The figures of the store whose files are at *base* (its file, a sharded store's
    catalog, a PostgreSQL store's local base), named *store* in the output."""
    families = {f.name: Family(f) for f in FIGURES}
    for name in telemetry.HISTOGRAMS:
        families[name].histogram = Histogram()
    # The processes' files first, then the retired totals: a process that closes in
    # between is folded before its file goes, so it is in one or the other, never in
    # both or neither (store/procstats.py, fold).
    published = read_published(base)
    retired = read_retired(procs_dir(base))
    for name, series in retired["counters"].items():
        family = families.get(name)
        if family is None or not isinstance(series, dict):
            continue
        for label, value in series.items():
            try:
                key = tuple((str(k), str(v)) for k, v in json.loads(label))
                family.values[key] = family.values.get(key, 0.0) + float(value)
            except (ValueError, TypeError):
                continue
    for name in telemetry.HISTOGRAMS:
        data = retired["histograms"].get(name)
        hist = families[name].histogram
        if isinstance(data, dict) and hist is not None:
            hist.merge_export(data)
    live = 0
    for proc in published:
        if is_folded(retired, proc):
            continue
        live += proc.alive
        metrics = proc.record.get("metrics")
        for name, labels, value in telemetry.samples(metrics if isinstance(metrics, dict) else {}):
            family = families[name]
            kind = family.figure.kind
            if kind == "counter":
                family.values[labels] = family.values.get(labels, 0.0) + value
            elif proc.alive and name == "commit_batch_max":
                family.values[labels] = max(family.values.get(labels, 0.0), value)
            elif proc.alive:
                family.values[labels] = family.values.get(labels, 0.0) + value
        for name in telemetry.HISTOGRAMS:
            hist = families[name].histogram
            if hist is not None:
                hist.merge_export(proc.record.get("histograms", {}).get(name, {}) or {})
    # Every series there can be, zeros included (rate() needs a first sample).
    for name, labels, _value in telemetry.samples({}):
        families[name].values.setdefault(labels, 0.0)
    families["processes"].values[()] = float(live)
    error = None
    if read_store is not None:
        try:
            read = read_store()
        except Exception as exc:  # the store busy, gone, a server down: say so, go on
            error = f"{type(exc).__name__}: {exc}"
        else:
            for figure in FIGURES:
                if figure.scope == "store":
                    for labels, value in store_samples(figure.name, read):
                        families[figure.name].values[labels] = value
    return Figures(store, time.time(), families, error)


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _escape(value: str) -> str:
    """A label value as the text format quotes it: backslash, quote, newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    parts = [f'{k}="{_escape(v)}"' for k, v in labels]
    return "{" + ",".join(parts) + "}" if parts else ""


def prometheus(figures: Figures) -> str:
    """The figures as Prometheus's text exposition format (0.0.4)."""
    lines = []
    if figures.error is not None:
        lines.append(f"# fleetstore: the store could not be read: {figures.error}")
    for family in figures.families.values():
        f = family.figure
        hist = family.histogram
        if hist is None and not family.values:
            continue
        name = f.prom
        lines.append(f"# HELP {name} " + f.help.replace("\\", "\\\\"))
        lines.append(f"# TYPE {name} {f.kind}")
        if hist is not None:
            for bound, n in zip(BUCKETS, hist.cumulative(BUCKETS), strict=True):
                lines.append(f'{name}_bucket{{le="{_number(bound)}"}} {n}')
            lines.append(f'{name}_bucket{{le="+Inf"}} {hist.count}')
            lines.append(f"{name}_sum {_number(hist.total)}")
            lines.append(f"{name}_count {hist.count}")
            continue
        for labels, value in sorted(family.values.items()):
            lines.append(f"{name}{_labels(labels)} {_number(value)}")
    return "\n".join(lines) + "\n"


def as_json(figures: Figures) -> dict[str, Any]:
    """The same figures as one JSON object: ``metrics`` maps each Prometheus name to
    its type, unit, help and samples (a histogram's: its ``le`` buckets, sum, count)."""
    out: dict[str, Any] = {}
    for family in figures.families.values():
        f = family.figure
        hist = family.histogram
        if hist is None and not family.values:
            continue
        samples: list[dict[str, Any]]
        if hist is not None:
            buckets = {
                _number(b): n for b, n in zip(BUCKETS, hist.cumulative(BUCKETS), strict=True)
            }
            buckets["+Inf"] = hist.count
            samples = [{"labels": {}, "buckets": buckets, "sum": hist.total, "count": hist.count}]
        else:
            samples = [
                {"labels": dict(labels), "value": value}
                for labels, value in sorted(family.values.items())
            ]
        out[f.prom] = {"type": f.kind, "unit": f.unit, "help": f.help, "samples": samples}
    return {"store": figures.store, "at": figures.at, "error": figures.error, "metrics": out}


class _Handler(http.server.BaseHTTPRequestHandler):
    render: Callable[[], str]

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404, "fleetstore serves /metrics")
            return
        try:
            body = self.render().encode("utf-8")
        except Exception as exc:
            self.send_error(500, f"{type(exc).__name__}: {exc}"[:200])
            return
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a line per scrape would drown stderr


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A scraper that went before its answer (Prometheus at its scrape timeout)
        # printed a traceback on stderr.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Server6(_Server):
    address_family = socket.AF_INET6


def server(host: str, port: int, render: Callable[[], str]) -> http.server.ThreadingHTTPServer:
    """An HTTP server (not yet serving) answering ``GET /metrics`` with ``render()``,
    made afresh for every scrape; *host* may be an IPv6 address."""
    handler = type("MetricsHandler", (_Handler,), {"render": staticmethod(render)})
    return (_Server6 if ":" in host else _Server)((host, port), handler)


def serve_in_thread(httpd: http.server.ThreadingHTTPServer) -> threading.Thread:
    """Serve *httpd* from a daemon thread (tests; ``serve_forever`` otherwise)."""
    thread = threading.Thread(target=httpd.serve_forever, name="fleetstore-metrics", daemon=True)
    thread.start()
    return thread


__all__ = [
    "CONTENT_TYPE",
    "Family",
    "Figures",
    "as_json",
    "gather",
    "prometheus",
    "server",
    "serve_in_thread",
]
