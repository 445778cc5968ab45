"""fleetstore's figures as an operator scrapes them: every metric's name, unit and
labels (``FIGURES``, the one table that both the OpenTelemetry instruments and
``fleetstore metrics``'s Prometheus text are made from), and the OpenTelemetry side,
through ``opentelemetry-api`` only (docs/telemetry.md).

Nothing here costs an operation anything until an application installs an
OpenTelemetry SDK.  ``opentelemetry`` is never imported by fleetstore itself: a
provider can only have been installed by a process that imported it, so ``refresh``
looks in ``sys.modules`` (run when a store is first used, then with every publish of
the figures, about once a second).  Until it finds a provider that is not the API's
own no-op or proxy, ``ACTIVE`` is None and the hot path's only cost is reading it (no
call: tests/store/test_cost.py's ceilings hold unchanged).  Once found:

* each store operation is a CLIENT span and a ``db.client.operation.duration``
  measurement (``Telemetry.operation``);
* each commit records lock wait and hold, each checkpoint its duration, each claim
  how long its effects waited, each handler its run (synchronous histograms: the API
  has no observable histogram);
* the counters and gauges are *observable* instruments whose callbacks read the
  figures the stores keep anyway (``watch``): nothing per operation.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from fleetstore.core.version import __version__

#: The Stable database client conventions' histogram and its recommended bounds.
DB_DURATION = "db.client.operation.duration"
DB_DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)
#: fleetstore's own durations: a lock wait is mostly well under a millisecond, so the
#: bounds start lower than the conventions' (the same bounds in OpenTelemetry and in
#: ``fleetstore metrics``).
BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
#: The span attribute naming the session an operation writes (never a metric label:
#: one series per session would be unbounded).
SESSION_ATTR = "fleetstore.session.id"
#: An effect's trace context, as W3C ``traceparent``/``tracestate`` in a JSON object.
TRACE_FIELDS = ("traceparent", "tracestate")


@dataclass(frozen=True, slots=True)
class Figure:
    """One metric: OpenTelemetry instrument ``fleetstore.<name>`` (unit *unit*), and
    in Prometheus ``fleetstore_<name>`` with the unit's suffix (``_seconds``,
    ``_bytes``) and, for a counter, ``_total``: what OpenTelemetry's Prometheus
    exporters make of the instrument, so one dashboard reads either."""

    name: str
    kind: str  # "counter", "gauge" or "histogram"
    unit: str  # UCUM: "s", "By", or an annotation such as "{commit}"
    help: str
    labels: tuple[str, ...] = ()
    #: Where it comes from: "process" (each process's own figures, summed over the
    #: store's processes), or "store" (read from the store's files by the reader).
    scope: str = "process"

    @property
    def otel(self) -> str:
        return "fleetstore." + self.name

    @property
    def prom(self) -> str:
        base = "fleetstore_" + self.name + {"s": "_seconds", "By": "_bytes"}.get(self.unit, "")
        return base + "_total" if self.kind == "counter" else base


#: What the engine's counters are called (``metrics()`` keys) here.
_ENGINE_COUNTERS = {
    "commits": ("writes", "{commit}", "Write transactions committed."),
    "write_errors": ("write_errors", "{transaction}", "Write transactions rolled back."),
    "busy_timeouts": (
        "busy_timeouts",
        "{write}",
        "Writes that ran out of their write budget waiting for the lock (StoreBusy; "
        "spooled, or raised with on_busy=raise).",
    ),
    "begin_busy_retries": (
        "begin_busy_retries",
        "{retry}",
        "BEGIN IMMEDIATE retries: SQLite's lock held by a program outside the gate.",
    ),
    "gate_contended": (
        "gate_contended",
        "{write}",
        "Writes that found the writer gate taken at their first try.",
    ),
    "checkpoints": ("checkpoints", "{checkpoint}", "WAL checkpoints run."),
    "checkpoint_errors": (
        "checkpoint_errors",
        "{checkpoint}",
        "Checkpoints that could not run (the WAL keeps the frames; the next one tries again).",
    ),
    "wal_restarts": ("wal_restarts", "{restart}", "Commits that found the WAL started over."),
    "post_commit_errors": (
        "post_commit_errors",
        "{error}",
        "Failures of work after a COMMIT (the commit stands).",
    ),
    "discarded_connections": (
        "discarded_connections",
        "{connection}",
        "Connections thrown away after a failed rollback.",
    ),
    "committed_operations": (
        "batched_items",
        "{operation}",
        "Operations committed by this store's processes' transactions (theirs and others'): "
        "divided by commits, the mean group-commit batch.",
    ),
    "served_operations": (
        "served",
        "{operation}",
        "Operations a process committed for another (group commit).",
    ),
    "handed_over_operations": (
        "handed_over",
        "{operation}",
        "Operations another process committed for this one (group commit).",
    ),
}
#: PostgreSQL's write retries (and SQLite's COMMIT whose outcome was unknown), by reason.
_RETRY_REASONS = {
    "serialization": "serialization_retries",
    "deadlock": "deadlock_retries",
    "connection": "connection_retries",
    "ambiguous_commit": "ambiguous_commits",
    "unique": "unique_retries",
}
#: The facade's own counters and gauges (``Store.metrics()`` keys).
_STORE_COUNTERS = {
    "spooled_operations": ("spooled", "Writes appended to a spool journal (the store was busy)."),
    "replayed_operations": ("replayed", "Spooled writes applied from this process's journal."),
    "recovered_operations": (
        "recovered",
        "Spooled writes of processes that died, applied from their journals.",
    ),
    "rejected_operations": (
        "rejected",
        "Spooled writes that can never apply, kept in rejected.jsonl.",
    ),
}
#: An effect's settlement outcomes (``Claim``: succeed, retry, fail, cancel, release,
#: timed_out).
OUTCOMES = ("succeeded", "retry", "dead", "cancelled", "release", "timed_out")
#: The states an effect can be in (models.EffectState), for the outbox's depth.
EFFECT_STATES = ("pending", "running", "succeeded", "dead", "cancelled")


@dataclass(frozen=True, slots=True)
class StoreFigures:
    """What a read of the store gives (``store/observe.store_figures``), for the
    figures of scope "store"."""

    #: Effects per state.
    states: dict[str, int]
    #: How long the oldest claimable effect has waited (0: none waits).
    oldest: float
    #: The bytes of its -wal files (SQLite).
    wal: int
    #: Owners (messages, sessions) queued for the search index, and how long the oldest
    #: has waited (0: none).
    search_queued: int = 0
    search_lag: float = 0.0


FIGURES: tuple[Figure, ...] = (
    *(Figure(name, "counter", unit, help) for name, (_k, unit, help) in _ENGINE_COUNTERS.items()),
    Figure(
        "write_retries",
        "counter",
        "{retry}",
        "Write transactions run again: PostgreSQL serialization failures, deadlocks, lost "
        "connections, unique violations; a COMMIT whose outcome was unknown.",
        ("reason",),
    ),
    Figure(
        "commit_batch_max",
        "gauge",
        "{operation}",
        "The most operations one transaction of a live process committed.",
    ),
    Figure("lock_wait", "histogram", "s", "How long each commit waited for the write lock."),
    Figure("lock_hold", "histogram", "s", "How long each commit held the write lock."),
    Figure("checkpoint_duration", "histogram", "s", "How long each WAL checkpoint took."),
    Figure(
        "operations",
        "counter",
        "{operation}",
        "Store operations (writes) submitted, by name.",
        ("operation",),
    ),
    *(Figure(name, "counter", "{operation}", help) for name, (_k, help) in _STORE_COUNTERS.items()),
    Figure(
        "spool_pending",
        "gauge",
        "{operation}",
        "Writes waiting in the live processes' spool journals: non-zero means the store "
        "was busy past the write budget and the spool is in use.",
    ),
    Figure("open_streams", "gauge", "{stream}", "Streamed replies open in live processes."),
    Figure("effects_enqueued", "counter", "{effect}", "Effects enqueued."),
    Figure("effects_claimed", "counter", "{effect}", "Effects claimed by workers."),
    Figure(
        "effects_settled",
        "counter",
        "{effect}",
        "Claims settled, by outcome as the store answered (succeeded, retry, dead, "
        "cancelled, release, timed_out; dead: every effect that went dead, swept ones "
        "included).",
        ("outcome",),
    ),
    Figure(
        "effect_wait",
        "histogram",
        "s",
        "From an effect becoming available (its enqueue, delay or retry) to its claim.",
    ),
    Figure("effect_run", "histogram", "s", "How long each effect handler ran."),
    Figure(
        "outbox_effects",
        "gauge",
        "{effect}",
        "Effects in the store, by state (read from the store).",
        ("state",),
        "store",
    ),
    Figure(
        "outbox_oldest_available_age",
        "gauge",
        "s",
        "How long the oldest claimable effect (a thread's head whose time has come) has "
        "waited; 0 when none waits (read from the store).",
        (),
        "store",
    ),
    Figure("wal_size", "gauge", "By", "The size of the store's -wal files on disk.", (), "store"),
    Figure(
        "search_queued",
        "gauge",
        "{owner}",
        "Messages and sessions written and not yet in the search index (read from the store).",
        (),
        "store",
    ),
    Figure(
        "search_lag",
        "gauge",
        "s",
        "How long the oldest entry of the search index's queue has waited; 0 when none "
        "waits (read from the store): the index's lag.",
        (),
        "store",
    ),
    Figure(
        "search_sections",
        "counter",
        "{section}",
        "Sections of text (a part, a title, metadata) written to the search index by the "
        "store's processes' indexers.",
    ),
    Figure("search_batches", "counter", "{batch}", "Search index batches written."),
    Figure(
        "search_errors",
        "counter",
        "{error}",
        "Search indexing rounds that failed (tried again later; the log says why).",
    ),
    Figure(
        "redacted",
        "counter",
        "{secret}",
        "Secrets replaced by a marker as content was written, by the rule's kind.",
        ("kind",),
    ),
    Figure(
        "processes",
        "gauge",
        "{process}",
        "Live processes publishing figures for the store.",
        (),
        "store",
    ),
)
BY_NAME: Mapping[str, Figure] = {f.name: f for f in FIGURES}

#: The raw histograms of a process's published figures (``Store.histograms()``), by
#: figure name.
HISTOGRAMS = ("lock_wait", "lock_hold", "checkpoint_duration", "effect_wait", "effect_run")

Sample = tuple[str, tuple[tuple[str, str], ...], float]


def samples(metrics: Mapping[str, Any]) -> Iterator[Sample]:
    """The counters and gauges of one process's ``Store.metrics()``: (figure name,
    labels, value).  Histograms are not here (``HISTOGRAMS``)."""

    def number(value: object) -> float:
        return (
            float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
        )

    for name, (key, _unit, _help) in _ENGINE_COUNTERS.items():
        yield name, (), number(metrics.get(key))
    for reason, key in _RETRY_REASONS.items():
        yield "write_retries", (("reason", reason),), number(metrics.get(key))
    yield "commit_batch_max", (), number(metrics.get("batch_max"))
    operations = metrics.get("operations")
    if isinstance(operations, Mapping):
        for op, n in sorted(operations.items()):
            yield "operations", (("operation", str(op)),), number(n)
    for name, (key, _help) in _STORE_COUNTERS.items():
        yield name, (), number(metrics.get(key))
    yield "spool_pending", (), number(metrics.get("spool_pending"))
    yield "open_streams", (), number(metrics.get("open_streams"))
    outbox = metrics.get("outbox")
    outbox = outbox if isinstance(outbox, Mapping) else {}
    yield "effects_enqueued", (), number(outbox.get("enqueued"))
    yield "effects_claimed", (), number(outbox.get("claimed"))
    settled = outbox.get("settled")
    settled = settled if isinstance(settled, Mapping) else {}
    for outcome in OUTCOMES:
        yield "effects_settled", (("outcome", outcome),), number(settled.get(outcome))
    for name in ("search_sections", "search_batches", "search_errors"):
        yield name, (), number(metrics.get(name))
    redacted = metrics.get("redacted")
    if isinstance(redacted, Mapping):
        for kind, n in sorted(redacted.items()):
            yield "redacted", (("kind", str(kind)),), number(n)


def store_samples(
    name: str, figures: StoreFigures
) -> Iterator[tuple[tuple[tuple[str, str], ...], float]]:
    """The series of the figure *name* of scope "store": (labels, value)."""
    if name == "outbox_effects":
        for state in EFFECT_STATES:
            yield (("state", state),), float(figures.states.get(state, 0))
    elif name == "outbox_oldest_available_age":
        yield (), figures.oldest
    elif name == "wal_size":
        yield (), float(figures.wal)
    elif name == "search_queued":
        yield (), float(figures.search_queued)
    elif name == "search_lag":
        yield (), figures.search_lag


# -- OpenTelemetry -------------------------------------------------------------------------------


class _Watched:
    """A store whose figures the observable instruments report."""

    __slots__ = ("attrs", "figures", "outbox")

    def __init__(
        self,
        attrs: dict[str, str],
        figures: Callable[[], Mapping[str, Any]],
        outbox: Callable[[], StoreFigures] | None,
    ) -> None:
        self.attrs = attrs
        self.figures = figures
        self.outbox = outbox


_watched: weakref.WeakKeyDictionary[object, _Watched] = weakref.WeakKeyDictionary()
_watched_lock = threading.Lock()


def watch(
    owner: object,
    attrs: dict[str, str],
    figures: Callable[[], Mapping[str, Any]],
    outbox: Callable[[], StoreFigures] | None = None,
) -> None:
    """Report *owner*'s figures (``figures()``: its ``metrics()``; ``outbox()``: what a
    read of the store gives, ``StoreFigures``) through
    the observable instruments, labelled *attrs*, for as long as *owner* lives."""
    with _watched_lock:
        _watched[owner] = _Watched(attrs, figures, outbox)


def unwatch(owner: object) -> None:
    with _watched_lock:
        _watched.pop(owner, None)


class Telemetry:
    """The instruments and tracer of one pair of providers (``ACTIVE`` once bound)."""

    def __init__(self, tracer_provider: Any, meter_provider: Any) -> None:
        from opentelemetry import trace

        self._trace = trace
        self.tracer = (
            tracer_provider.get_tracer("fleetstore", __version__)
            if tracer_provider is not None
            else None
        )
        self.meter = (
            meter_provider.get_meter("fleetstore", __version__)
            if meter_provider is not None
            else None
        )
        self._attrs: dict[tuple[str, str, str, str], dict[str, str]] = {}
        self._cache: dict[int, tuple[float, Mapping[str, Any]]] = {}
        self._outbox_cache: dict[int, tuple[float, StoreFigures | None]] = {}
        meter = self.meter
        self.duration: Any = None
        self.histograms: dict[str, Any] = {}
        if meter is None:
            return
        self.duration = meter.create_histogram(
            DB_DURATION,
            "s",
            "Duration of database client operations.",
            explicit_bucket_boundaries_advisory=DB_DURATION_BUCKETS,
        )
        for figure in FIGURES:
            if figure.kind == "histogram":
                self.histograms[figure.name] = meter.create_histogram(
                    figure.otel,
                    figure.unit,
                    figure.help,
                    explicit_bucket_boundaries_advisory=BUCKETS,
                )
            elif figure.kind == "counter":
                meter.create_observable_counter(
                    figure.otel, [self._observer(figure)], figure.unit, figure.help
                )
            else:
                meter.create_observable_gauge(
                    figure.otel, [self._observer(figure)], figure.unit, figure.help
                )

    # -- per operation (only while ACTIVE) ---------------------------------------------------

    def attributes(self, system: str, namespace: str, op: str, error: str = "") -> dict[str, str]:
        key = (system, namespace, op, error)
        attrs = self._attrs.get(key)
        if attrs is None:
            attrs = {"db.system.name": system, "db.namespace": namespace}
            if op:
                attrs["db.operation.name"] = op
            if error:
                attrs["error.type"] = error
            self._attrs[key] = attrs
        return attrs

    def operation(
        self,
        system: str,
        namespace: str,
        op: str,
        session_id: str | None,
        call: Callable[..., Any],
        *args: Any,
        batch: int = 0,
    ) -> Any:
        """``call(*args)``, the store operation *op*, as a CLIENT span named per the
        conventions (``{db.operation.name} {db.namespace}``) and a
        ``db.client.operation.duration`` measurement (with ``error.type``, the
        exception's class name, if it raised).  The session id goes on the span only,
        and so does *batch* (``db.operation.batch.size``: the operations one call
        carries, when two or more; a label of that many values is not a metric's)."""
        attrs = self.attributes(system, namespace, op)
        tracer = self.tracer
        if tracer is None:
            started = time.perf_counter()
            try:
                result = call(*args)
            except BaseException as exc:
                self._measure(started, system, namespace, op, exc)
                raise
            self._measure(started, system, namespace, op, None)
            return result
        with tracer.start_as_current_span(
            f"{op} {namespace}", kind=self._trace.SpanKind.CLIENT, attributes=attrs
        ) as span:
            if session_id is not None:
                span.set_attribute(SESSION_ATTR, session_id)
            if batch > 1:
                span.set_attribute("db.operation.batch.size", batch)
            started = time.perf_counter()  # within the span: never longer than it
            try:
                result = call(*args)
            except BaseException as exc:
                span.set_attribute("error.type", type(exc).__name__)
                self._measure(started, system, namespace, op, exc)
                raise
            if result is None:
                # Past the write budget: kept in the spool journal, applied later.
                span.set_attribute("fleetstore.spooled", True)
            self._measure(started, system, namespace, op, None)
            return result

    def _measure(
        self, started: float, system: str, namespace: str, op: str, exc: BaseException | None
    ) -> None:
        if self.duration is not None:
            error = type(exc).__name__ if exc is not None else ""
            self.duration.record(
                time.perf_counter() - started, self.attributes(system, namespace, op, error)
            )

    def record(self, name: str, seconds: float, system: str) -> None:
        """One sample of fleetstore's histogram *name* (``HISTOGRAMS``)."""
        hist = self.histograms.get(name)
        if hist is not None:
            attrs = self._attrs.get(("", system, name, ""))
            if attrs is None:
                attrs = self._attrs[("", system, name, "")] = (
                    {"db.system.name": system} if system else {}
                )
            hist.record(seconds, attrs)

    # -- effects -------------------------------------------------------------------------------

    def carrier(self) -> str | None:
        """The current trace context as the JSON text stored with an effect (None when
        no span is current)."""
        span = self._trace.get_current_span()
        if not span.get_span_context().is_valid:
            return None
        from opentelemetry.propagate import inject

        carrier: dict[str, str] = {}
        inject(carrier)
        kept = {k: v for k, v in carrier.items() if k in TRACE_FIELDS}
        return json.dumps(kept, separators=(",", ":")) if kept else None

    def handler_span(self, effect: Any, carried: str | None) -> Any:
        """A CONSUMER span around an effect's handler, a child of the trace it was
        enqueued in when that was carried (*carried*: the stored JSON)."""
        if self.tracer is None:
            return None
        context = None
        if carried:
            from opentelemetry.propagate import extract

            try:
                fields = json.loads(carried)
            except ValueError:
                fields = None
            if isinstance(fields, dict):
                context = extract({k: str(v) for k, v in fields.items() if k in TRACE_FIELDS})
        return self.tracer.start_as_current_span(
            f"process {effect.kind}",
            context=context,
            kind=self._trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "fleetstore",
                "messaging.operation.type": "process",
                "messaging.destination.name": effect.kind,
                "messaging.message.id": effect.id,
                "fleetstore.effect.thread_key": effect.thread_key,
                "fleetstore.effect.attempt": effect.attempt,
            },
        )

    def handler_outcome(self, how: str, value: Any) -> None:
        """On the handler's span (the current one): what the handler's run came to;
        an error status unless it succeeded."""
        span = self._trace.get_current_span()
        span.set_attribute("fleetstore.effect.outcome", how)
        if how != "succeed":
            # The worker's outcomes: retry (delay, error, exception), fail (error,
            # exception), timed_out (error).
            detail = value
            if isinstance(value, tuple):
                detail = value[1] if how == "retry" else value[0]
                if value and isinstance(value[-1], BaseException):
                    span.record_exception(value[-1])
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(detail)[:1000]))

    # -- observable figures --------------------------------------------------------------------

    def _figures_of(self, watched: _Watched) -> Mapping[str, Any]:
        # Every instrument's callback runs at each collection: one metrics() a store
        # per collection, not one per instrument.
        now = time.monotonic()
        cached = self._cache.get(id(watched))
        if cached is None or now - cached[0] > 0.5:
            try:
                cached = (now, watched.figures())
            except Exception:
                cached = (now, {})
            self._cache[id(watched)] = cached
        return cached[1]

    def _outbox_of(self, watched: _Watched) -> StoreFigures | None:
        if watched.outbox is None:
            return None
        now = time.monotonic()
        cached = self._outbox_cache.get(id(watched))
        if cached is None or now - cached[0] > 0.5:
            try:
                cached = (now, watched.outbox())
            except Exception:
                cached = (now, None)
            self._outbox_cache[id(watched)] = cached
        return cached[1]

    def _observer(self, figure: Figure) -> Callable[[Any], Iterable[Any]]:
        from opentelemetry.metrics import Observation

        def observe(_options: Any) -> Iterable[Any]:
            with _watched_lock:
                stores = list(_watched.values())
            alive = {id(w) for w in stores}
            for cache in (self._cache, self._outbox_cache):
                for key in [k for k in cache if k not in alive]:
                    cache.pop(key, None)
            found = []
            for watched in stores:
                if figure.scope == "store":
                    outbox = self._outbox_of(watched)
                    if outbox is None:
                        continue
                    for labels, value in store_samples(figure.name, outbox):
                        found.append(Observation(value, {**watched.attrs, **dict(labels)}))
                    continue
                for name, labels, value in samples(self._figures_of(watched)):
                    if name == figure.name:
                        found.append(Observation(value, {**watched.attrs, **dict(labels)}))
            return found

        return observe


#: The bound telemetry, or None: what the hot path reads (no call when None).
ACTIVE: Telemetry | None = None
_explicit = False
_bound: tuple[Any, Any] = (None, None)
_lock = threading.Lock()


def _installed() -> tuple[Any, Any]:
    """The application's tracer and meter providers, if it installed any (an SDK's,
    or any that is not the API's no-op or proxy); never imports opentelemetry."""
    tracer_provider = meter_provider = None
    trace = sys.modules.get("opentelemetry.trace")
    if trace is not None:
        found = trace.get_tracer_provider()
        if not type(found).__module__.startswith("opentelemetry.trace"):
            tracer_provider = found
    metrics = sys.modules.get("opentelemetry.metrics")
    if metrics is not None:
        found = metrics.get_meter_provider()
        if not type(found).__module__.startswith("opentelemetry.metrics"):
            meter_provider = found
    return tracer_provider, meter_provider


def refresh() -> Telemetry | None:
    """Look for installed providers (see the module's doc) and bind to them: called
    when a store is first used and by its figures' publisher."""
    global ACTIVE, _bound
    if _explicit:
        return ACTIVE
    try:
        providers = _installed()
    except Exception:
        return ACTIVE
    with _lock:
        if _explicit or providers == _bound:
            return ACTIVE
        _bound = providers
        try:
            ACTIVE = Telemetry(*providers) if providers != (None, None) else None
        except Exception as exc:  # an API too old for its advisory bucket bounds...
            ACTIVE = None
            from fleetstore.core.logs import logger

            logger().error(
                "OpenTelemetry providers found but not used: %s: %s",
                type(exc).__name__,
                exc,
                extra={"event": "telemetry_failed", "error": f"{type(exc).__name__}: {exc}"},
            )
        return ACTIVE


def bind(tracer_provider: Any = None, meter_provider: Any = None) -> Telemetry | None:
    """Use these providers (an SDK's) rather than the global ones, for tests and for an
    application that keeps its providers to itself; ``bind()`` with neither goes back
    to looking for the global ones."""
    global ACTIVE, _explicit, _bound
    with _lock:
        _explicit = tracer_provider is not None or meter_provider is not None
        _bound = (None, None)
        ACTIVE = Telemetry(tracer_provider, meter_provider) if _explicit else None
    if not _explicit:
        refresh()
    return ACTIVE


__all__ = [
    "ACTIVE",
    "BUCKETS",
    "BY_NAME",
    "DB_DURATION",
    "DB_DURATION_BUCKETS",
    "EFFECT_STATES",
    "FIGURES",
    "StoreFigures",
    "store_samples",
    "HISTOGRAMS",
    "OUTCOMES",
    "SESSION_ATTR",
    "Figure",
    "Telemetry",
    "bind",
    "refresh",
    "samples",
    "unwatch",
    "watch",
]
