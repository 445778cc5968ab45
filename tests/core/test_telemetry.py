"""OpenTelemetry with the real SDK (issue 27): its in-memory span exporter and metric
reader, bound with ``telemetry.bind`` (the SDK's global providers can be set once per
process; test_telemetry_cost.py checks the global ones are found, in a process of its
own).  What an operator's collector would receive: CLIENT spans named per the database
conventions, ``db.client.operation.duration`` with their bucket bounds, fleetstore's
own instruments, the session id on spans and never on a metric, and an effect's
handler span in the trace it was enqueued in when that is asked for."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import fleetstore
from fleetstore import errors
from fleetstore.core import telemetry


class Otel:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def spans(self, prefix: str = "") -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name.startswith(prefix)]

    def metrics(self) -> dict[str, Any]:
        """Every metric collected now, by name."""
        data = self.reader.get_metrics_data()
        found: dict[str, Any] = {}
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found[metric.name] = metric
        return found


@pytest.fixture
def otel() -> Iterator[Otel]:
    o = Otel()
    telemetry.bind(o.tracer_provider, o.meter_provider)
    try:
        yield o
    finally:
        telemetry.bind()
        o.tracer_provider.shutdown()
        o.meter_provider.shutdown()


def points(metric: Any) -> list[Any]:
    return list(metric.data.data_points)


def test_each_operation_is_a_client_span_and_a_duration_measurement(
    otel: Otel, tmp_path: Path
) -> None:
    path = tmp_path / "otel.db"
    with fleetstore.open(path) as store:
        session = store.sessions.create(title="t")
        store.state.put(session.id, "checkpoint", {"turn": 1})
        store.messages.append(session.id, "user", "hello")

    (put,) = otel.spans("put_state")
    assert put.name == f"put_state {path}"
    assert put.kind is trace.SpanKind.CLIENT
    attrs = dict(put.attributes or {})
    assert attrs["db.system.name"] == "sqlite"
    assert attrs["db.operation.name"] == "put_state"
    assert attrs["db.namespace"] == str(path)
    assert attrs[telemetry.SESSION_ATTR] == session.id
    (append,) = otel.spans("append_message")
    assert dict(append.attributes or {})[telemetry.SESSION_ATTR] == session.id

    duration = otel.metrics()[telemetry.DB_DURATION]
    assert duration.unit == "s"
    by_op = {p.attributes["db.operation.name"]: p for p in points(duration)}
    assert {"create_session", "put_state", "append_message"} <= set(by_op)
    for point in by_op.values():
        assert tuple(point.explicit_bounds) == telemetry.DB_DURATION_BUCKETS
        assert point.count == 1
        assert "error.type" not in point.attributes
        assert point.attributes["db.system.name"] == "sqlite"
    # The span and the measurement cover the same call (the conventions: the metric
    # SHOULD be the span's duration): the span, which begins first and ends last, is
    # at least as long.
    span_seconds = (put.end_time - put.start_time) / 1e9  # type: ignore[operator]
    assert 0 < by_op["put_state"].sum <= span_seconds


def test_a_failed_operation_has_error_type_on_its_span_and_measurement(
    otel: Otel, tmp_path: Path
) -> None:
    with fleetstore.open(tmp_path / "otel.db") as store:
        session = store.sessions.create(title="t")
        store.state.put(session.id, "k", {"v": 1})
        with pytest.raises(errors.VersionConflict):
            store.state.put(session.id, "k", {"v": 2}, expected_version=7)

    failed = [s for s in otel.spans("put_state") if s.status.status_code is trace.StatusCode.ERROR]
    assert len(failed) == 1
    assert dict(failed[0].attributes or {})["error.type"] == "VersionConflict"
    duration = otel.metrics()[telemetry.DB_DURATION]
    errored = [p for p in points(duration) if "error.type" in p.attributes]
    assert [(p.attributes["error.type"], p.count) for p in errored] == [("VersionConflict", 1)]


def test_the_session_id_is_on_spans_only_never_a_metric_label(otel: Otel, tmp_path: Path) -> None:
    with fleetstore.open(tmp_path / "otel.db") as store:
        ids = [store.sessions.create(title=f"s{i}").id for i in range(3)]
        for sid in ids:
            store.state.put(sid, "k", {"v": 1})
            store.messages.append(sid, "user", "hi")
        metrics = otel.metrics()
    assert {dict(s.attributes or {}).get(telemetry.SESSION_ATTR) for s in otel.spans("put")} == set(
        ids
    )
    for metric in metrics.values():
        for point in points(metric):
            assert not set(ids) & {str(v) for v in point.attributes.values()}, metric.name
            assert telemetry.SESSION_ATTR not in point.attributes, metric.name


def test_fleetstore_s_own_instruments_report_the_store_s_figures(
    otel: Otel, tmp_path: Path
) -> None:
    # No indexer thread: its writes, between the two readings, made them differ.
    with fleetstore.open(tmp_path / "otel.db", search_index=False) as store:
        session = store.sessions.create(title="t")
        for i in range(5):
            store.state.put(session.id, "k", {"i": i})
        for i in range(3):
            store.effects.enqueue(f"thread-{i}", "mail", {"i": i})
        claim = store.effects.claim("w1", kinds=["mail"])[0]
        claim.succeed({"ok": True})
        figures = store.metrics()
        metrics = otel.metrics()

    def value(name: str, **labels: str) -> float:
        found = [
            p.value
            for p in points(metrics["fleetstore." + name])
            if all(p.attributes.get(k) == v for k, v in labels.items())
        ]
        assert len(found) == 1, (name, labels, found)
        return float(found[0])

    assert value("commits") == figures["writes"]
    assert value("operations", operation="put_state") == 5
    assert value("effects_enqueued") == 3
    assert value("effects_claimed") == 1
    assert value("effects_settled", outcome="succeeded") == 1
    assert value("outbox_effects", state="pending") == 2
    assert value("outbox_effects", state="succeeded") == 1
    assert value("outbox_oldest_available_age") >= 0
    wait = metrics["fleetstore.lock_wait"]
    assert wait.unit == "s"
    (point,) = points(wait)
    assert point.count == figures["writes"]
    assert tuple(point.explicit_bounds) == telemetry.BUCKETS
    (waited,) = points(metrics["fleetstore.effect_wait"])
    assert waited.count == 1
    # Every instrument is a documented figure, named as FIGURES says.
    own = {n for n in metrics if n.startswith("fleetstore.")}
    assert own <= {f.otel for f in telemetry.FIGURES}


def test_a_spooled_write_is_marked_on_its_span_and_logged_once_with_its_fields(
    otel: Otel, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with fleetstore.open(tmp_path / "otel.db", write_budget=0.2) as store:
        session = store.sessions.create(title="t")
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with store.db.write():
                held.set()
                release.wait(10)

        holder = threading.Thread(target=hold)
        holder.start()
        assert held.wait(10)
        try:
            with caplog.at_level(logging.WARNING, logger="fleetstore"):
                store.state.put(session.id, "k", {"v": 1})
        finally:
            release.set()
            holder.join()
        assert store.flush(10)

    spooled = [r for r in caplog.records if getattr(r, "event", None) == "spooled"]
    assert len(spooled) == 1
    record = spooled[0]
    assert record.operation == "put_state"  # type: ignore[attr-defined]
    assert record.store == str(tmp_path / "otel.db")  # type: ignore[attr-defined]
    assert record.spool_pending == 1  # type: ignore[attr-defined]
    assert "StoreBusy" in record.error  # type: ignore[attr-defined]
    (span,) = otel.spans("put_state")
    assert dict(span.attributes or {})["fleetstore.spooled"] is True


def test_a_batch_of_settlements_has_its_size_on_its_span_only(otel: Otel, tmp_path: Path) -> None:
    with fleetstore.open(tmp_path / "otel.db") as store:
        for n in range(4):
            store.effects.enqueue(f"thread-{n}", "notify", {})
        claims = store.effects.claim("worker", limit=4)
        assert len(claims) == 4
        first, rest = claims[0], claims[1:]
        assert first.succeed({"ok": True})
        store.effects._settle_batch(rest, [c._success(1) for c in rest])
        metrics = otel.metrics()
    (batch,) = otel.spans("settle_effects ")
    assert dict(batch.attributes or {})["db.operation.batch.size"] == 3
    (single,) = otel.spans("settle_effect ")
    assert "db.operation.batch.size" not in dict(single.attributes or {})
    for point in points(metrics[telemetry.DB_DURATION]):
        assert "db.operation.batch.size" not in point.attributes


def test_an_effect_that_failed_is_logged_once_with_its_fields_and_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def handler(effect: fleetstore.Effect) -> None:
        raise ValueError("the mail server said no")

    with fleetstore.open(tmp_path / "failed.db") as store:
        eid = store.effects.enqueue("thread", "notify", {}, max_attempts=1)
        worker = fleetstore.Worker(store, {"notify": handler}, until_idle=True, poll_interval=0.01)
        with caplog.at_level(logging.WARNING, logger="fleetstore"):
            worker.run()
    failed = [r for r in caplog.records if getattr(r, "event", None) == "effect_failed"]
    assert len(failed) == 1, [r.getMessage() for r in caplog.records]
    record = failed[0]
    assert record.levelno == logging.ERROR  # its last attempt: dead
    assert record.effect_id == eid and record.kind == "notify"  # type: ignore[attr-defined]
    assert record.attempt == 1 and record.next == "dead"  # type: ignore[attr-defined]
    assert record.error == "ValueError: the mail server said no"  # type: ignore[attr-defined]
    assert record.exc_info is not None and record.exc_info[0] is ValueError


@pytest.mark.parametrize("carried", [True, False])
def test_an_effect_s_handler_span_joins_the_trace_it_was_enqueued_in_when_asked(
    otel: Otel, tmp_path: Path, carried: bool
) -> None:
    tracer = otel.tracer_provider.get_tracer("the application")
    ran: list[Any] = []

    def handler(effect: fleetstore.Effect) -> None:
        # The handler's own spans are children of its span (contextvars follow it
        # into the handler's thread).
        with tracer.start_as_current_span("inside the handler"):
            ran.append(effect.id)

    with fleetstore.open(tmp_path / "otel.db", trace_effects=carried) as store:
        with tracer.start_as_current_span("a turn") as turn:
            eid = store.effects.enqueue("thread", "notify", {"to": "ops"})
        worker = fleetstore.Worker(store, {"notify": handler}, until_idle=True, poll_interval=0.01)
        assert worker.run() == 0
    assert ran == [eid]

    (span,) = otel.spans("process notify")
    assert span.kind is trace.SpanKind.CONSUMER
    attrs = dict(span.attributes or {})
    assert attrs["messaging.message.id"] == eid
    assert attrs["fleetstore.effect.outcome"] == "succeed"
    (inner,) = otel.spans("inside the handler")
    assert inner.parent is not None and inner.parent.span_id == span.context.span_id
    turn_context = turn.get_span_context()
    if carried:
        assert span.context.trace_id == turn_context.trace_id
        assert span.parent is not None and span.parent.span_id == turn_context.span_id
    else:
        assert span.context.trace_id != turn_context.trace_id
        assert span.parent is None


def test_a_handler_that_fails_has_an_error_status_and_its_run_is_measured(
    otel: Otel, tmp_path: Path
) -> None:
    def handler(effect: fleetstore.Effect) -> None:
        time.sleep(0.02)
        raise fleetstore.FailEffect("no such recipient")

    with fleetstore.open(tmp_path / "otel.db") as store:
        store.effects.enqueue("thread", "notify", {})
        worker = fleetstore.Worker(store, {"notify": handler}, until_idle=True, poll_interval=0.01)
        worker.run()
        figures = store.metrics()["outbox"]
        metrics = otel.metrics()
    (span,) = otel.spans("process notify")
    assert span.status.status_code is trace.StatusCode.ERROR
    assert "no such recipient" in (span.status.description or "")
    assert figures["settled"]["dead"] == 1 and figures["run"]["count"] == 1
    (run,) = points(metrics["fleetstore.effect_run"])
    assert run.count == 1 and run.sum >= 0.02


def test_a_bad_trace_argument_from_outside_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    with fleetstore.open(tmp_path / "otel.db") as store:
        for bad in ("not json", '{"baggage": "x"}', '{"traceparent": 5}', "{}", "x" * 5000):
            op = fleetstore.Operation(
                "enqueue_effect",
                {
                    "id": "01890000-0000-7000-8000-0000000000aa",
                    "thread_key": "t",
                    "kind": "k",
                    "trace": bad,
                    "payload": {"enc": "json", "body": "{}", "size": 2},
                    "now": 1.0,
                },
                "01890000-0000-7000-8000-0000000000ab",
            )
            with pytest.raises(errors.InvalidInput, match="trace"):
                store.submit(op)
        assert store.effects.counts()["pending"] == 0
        # A good one is kept with the effect.
        good = '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
        op.args["trace"] = good
        store.submit(op)
        from fleetstore.domain.effect_trace import carried_trace

        assert carried_trace(store, "01890000-0000-7000-8000-0000000000aa") == good


def test_docs_telemetry_lists_every_metric_with_its_unit_and_labels() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "telemetry.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `fleetstore_")]
    for figure in telemetry.FIGURES:
        (row,) = [r for r in rows if r.startswith(f"| `{figure.prom}` |")]
        assert f"`{figure.otel}`" in row and f"`{figure.unit}`" in row, row
        for label in figure.labels:
            assert f"`{label}`" in row, row
    assert f"`{telemetry.DB_DURATION}`" in text
