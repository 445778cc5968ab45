"""An effect's telemetry: the fields of a lost lease's log record, and its trace
context, carried from its enqueue to its handler's span (opt-in: ``trace_effects``;
docs/telemetry.md).  Stored with the effect (``effects.trace_context``,
migration 0012) as the JSON text of its W3C ``traceparent`` and ``tracestate``."""

from __future__ import annotations

import json
from typing import Any

from fleetstore import errors
from fleetstore.core import telemetry
from fleetstore.core.validate import check_id
from fleetstore.domain.operations import Args
from fleetstore.domain.ports import StorePort

#: The largest trace context kept with an effect (a traceparent is 55 characters, a
#: tracestate at most 32 list members).
MAX_TRACE = 4096


def trace_arg(a: Args) -> dict[str, str]:
    """An effect's ``trace`` argument from outside, checked (``{}``: none): the JSON
    text of an object of ``traceparent``/``tracestate`` strings."""
    value = a.get("trace")
    if value is None:
        return {}
    try:
        fields = json.loads(value) if isinstance(value, str) and len(value) <= MAX_TRACE else None
    except ValueError:
        fields = None
    if (
        not isinstance(fields, dict)
        or not fields
        or not all(k in telemetry.TRACE_FIELDS and isinstance(v, str) for k, v in fields.items())
    ):
        raise errors.InvalidInput(
            "trace must be the JSON text of an object of traceparent and tracestate strings, "
            f"not {value!r:.80}"
        )
    return {"trace": value}


def carry_trace(store: StorePort, args: dict[str, Any]) -> None:
    """The current trace context into an effect's arguments, if the store keeps them
    (``trace_effects``) and a span is current."""
    otel = telemetry.ACTIVE
    if otel is not None and store.settings.trace_effects:
        carried = otel.carrier()
        if carried is not None:
            args["trace"] = carried


def carried_trace(store: StorePort, effect_id: str) -> str | None:
    """The trace context *effect_id* was enqueued in (its JSON), if one was carried."""
    check_id(effect_id, "effect_id")
    q = store.queries
    rows = store.read(lambda tx: tx.execute(q["effect_trace"], (effect_id,)))
    return None if not rows or rows[0][0] is None else str(rows[0][0])


def lost_fields(claim: Any, exc: errors.LeaseLost) -> dict[str, Any]:
    """The structured fields of a lease-lost log record (*claim*: a ``Claim``)."""
    return {
        "event": "lease_lost",
        "effect_id": claim.id,
        "kind": claim.effect.kind,
        "fence": claim.fence,
        "attempt": claim.effect.attempt,
        "state": exc.state,
        "owner": claim.owner,
    }


__all__ = ["MAX_TRACE", "carried_trace", "carry_trace", "lost_fields", "trace_arg"]
