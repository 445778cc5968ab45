"""What an installed OpenTelemetry SDK costs a store operation (issue 27;
docs/benchmarks.md, "Telemetry with an SDK installed").

For ``state.put``, ``effects.enqueue`` and ``messages.append`` on one SQLite file: the
Python calls of one operation (counted as tests/store/test_cost.py counts them) and the
wall time per operation over N operations (the least of 3 rounds), with no SDK, with
the SDK's tracer (a batch span processor and an exporter that drops the spans, so the
export's own cost is left out) and meter (an in-memory reader), and with the meter
alone.  Run: ``python benchmarks/bench_telemetry.py [--ops 3000]``."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.store.test_cost import _least, _operations

import fleetstore
from fleetstore.core import telemetry

OPERATIONS = ("state.put", "effects.enqueue", "messages.append")


def per_op(make: Callable[[int], Callable[[], Any]], n: int) -> float:
    """Microseconds per operation, the least of 3 rounds of *n*."""
    best = float("inf")
    for round_ in range(3):
        calls = [make(round_ * n + i) for i in range(n)]
        started = time.perf_counter()
        for call in calls:
            call()
        best = min(best, (time.perf_counter() - started) / n * 1e6)
    return best


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=3000)
    args = parser.parse_args(argv)

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Dropped()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    setups = {
        "no SDK": (None, None),
        "SDK: spans and metrics": (tracer_provider, meter_provider),
        "SDK: metrics only": (None, meter_provider),
    }
    with tempfile.TemporaryDirectory() as tmp, fleetstore.open(Path(tmp) / "t.db") as store:
        ops = _operations(store)
        print(f"{'operation':<18} {'setup':<24} {'calls':>6} {'us/op':>8}")
        for setup, providers in setups.items():
            telemetry.bind(*providers)
            try:
                for name in OPERATIONS:
                    calls, _statements = _least(store, ops[name])
                    print(f"{name:<18} {setup:<24} {calls:>6} {per_op(ops[name], args.ops):>8.1f}")
            finally:
                telemetry.bind()
    tracer_provider.shutdown()
    meter_provider.shutdown()


if __name__ == "__main__":
    main()
