"""A process of the telemetry tests (tests/core/test_telemetry*.py, tests/cli/test_metrics.py).

``write PATH N STAY``: open the store (figures published every 0.1 s), put N state
values, enqueue one effect, print ``wrote``, wait STAY seconds (it may be killed
meanwhile), close, print ``closed``.

``spool PATH SESSION``: with the store locked from outside, write with a short budget
(the write spools), print ``spooled``, then SIGKILL itself: its journal stays behind.

``global PATH``: write once with no SDK, then install the SDK's global providers (an
in-memory span exporter), write again once the store's publisher had time to find
them, print the spans as JSON: an SDK installed after a store was opened is found.

``cost``: print, as JSON, whether ``import fleetstore`` and a store's writes loaded
``opentelemetry`` and bound telemetry, first with no SDK, then with the API imported
but no provider installed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def write(path: str, n: int, stay: float) -> None:
    import fleetstore

    store = fleetstore.open(path, publish_interval=0.1)
    session = store.sessions.create(title="telemetry")
    for i in range(n):
        store.state.put(session.id, "turn", {"i": i})
    store.effects.enqueue(session.id, "title.generate", {"n": n})
    time.sleep(0.3)  # published at least once
    print("wrote", flush=True)
    time.sleep(stay)
    store.close()
    print("closed", flush=True)


def spool(path: str, session_id: str) -> None:
    import fleetstore

    store = fleetstore.open(path, write_budget=0.2, publish_interval=0)
    store.state.put(session_id, "k", {"v": 1})
    print("spooled" if store.spool_pending() else "applied", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def global_sdk(path: str) -> None:
    import fleetstore

    store = fleetstore.open(path, publish_interval=0.1)
    session = store.sessions.create(title="before")
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    time.sleep(0.5)  # a few publishes: each looks for installed providers
    store.state.put(session.id, "k", {"after": True})
    store.close()
    spans = [
        {"name": s.name, "kind": s.kind.name, "attributes": dict(s.attributes or {})}
        for s in exporter.get_finished_spans()
    ]
    print(json.dumps(spans), flush=True)


def cost(path: str) -> None:
    import fleetstore
    from fleetstore.core import telemetry

    seen = {"after_import": "opentelemetry" in sys.modules}
    with fleetstore.open(path, publish_interval=0.05) as store:
        session = store.sessions.create(title="cost")
        store.state.put(session.id, "k", {"v": 1})
        time.sleep(0.2)
        seen["after_writes"] = "opentelemetry" in sys.modules
        seen["bound_without_sdk"] = telemetry.ACTIVE is not None
        import opentelemetry.metrics
        import opentelemetry.trace  # noqa: F401  (the API alone: its proxies, no SDK)

        store.state.put(session.id, "k", {"v": 2})
        time.sleep(0.2)
        seen["bound_with_the_api_alone"] = telemetry.ACTIVE is not None
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    if mode == "write":
        write(rest[0], int(rest[1]), float(rest[2]))
    elif mode == "spool":
        spool(rest[0], rest[1])
    elif mode == "global":
        global_sdk(rest[0])
    elif mode == "cost":
        cost(rest[0])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
