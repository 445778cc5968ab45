"""The durable effect outbox: enqueue, claim, heartbeat, settle, sweep.

Per ``thread_key`` effects run one at a time in ``seq`` order: only a thread's
*head* (its lowest-seq effect still pending or running) can be claimed, and two
partial unique indexes (one running row, one head per thread) make anything
else impossible in the database itself, whatever a query does.  A retried
effect stays its thread's head, so a newer one can never overtake it.

A claim takes a lease and a fencing token (``fence``, raised by every claim).
Heartbeats and settlements match the token inside their transaction: a worker
whose lease was swept and handed to another gets ``LeaseLost`` and changes
nothing.  Settlements are logged operations that must land: past the write
budget they go to the spool (even with ``on_busy="raise"``) and the worker
keeps heartbeating the lease until the spool has applied them, so a lock held
from outside delays a settlement but never loses it or strands the thread.

A sweep (one guarded statement) returns expired leases to ``pending`` when the
kind is replay-safe and attempts are left, else to ``dead`` with the reason;
a dead, succeeded or cancelled head hands the thread on to its next effect.
"""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from fleetstore import errors
from fleetstore.core.ids import derived_id, is_valid_id, new_id
from fleetstore.core.validate import (
    MAX_WAIT,
    arg_id,
    arg_int,
    arg_number,
    arg_str,
    arg_time,
    check_bool,
    check_id,
    check_int,
    check_number,
    check_opt_str,
    check_str,
    check_strings,
    check_timeout,
    dump_json,
)
from fleetstore.domain.codec import (
    Prepared,
    check_encoded,
    columns,
    decode_value,
    prepare_payload,
    redact_json,
    value_payload,
    write_payload,
)
from fleetstore.domain.operations import Args, Declarations, Operation, Queries, Result, Scope
from fleetstore.domain.ports import StorePort
from fleetstore.models import Effect, EffectError, EffectState, NewEffect, Page

if TYPE_CHECKING:
    from fleetstore.engine.base import Tx

OPERATIONS = Declarations()

#: Seconds a claim's lease lasts unless renewed; workers heartbeat at a third of it.
DEFAULT_LEASE = 30.0
DEFAULT_MAX_ATTEMPTS = 5
#: Failed attempts kept per effect (the newest).
ERRORS_KEPT = 20
MAX_THREAD_KEY = 1024
MAX_KIND = 256
MAX_ERROR = 16 * 1024
#: A handler's result is kept inline: larger results belong in the store proper.
MAX_RESULT = 1024 * 1024
MAX_ATTEMPTS_LIMIT = 10_000
MAX_DELAY = MAX_WAIT
MAX_LEASE = 86400.0
MAX_CLAIM = 1000

_STATES = tuple(s.value for s in EffectState)
_OUTCOMES = ("succeeded", "retry", "dead", "cancelled", "release", "timed_out")


# -- argument checks (inside the transaction: spooled ops are checked again) ---------------------


def _replay_safe(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise errors.InvalidInput(f"replay_safe must be true, false or null, not {value!r}")
    return int(value)


def _error_text(value: object) -> str:
    """An effect error as kept: at most MAX_ERROR characters, NUL and lone surrogates
    replaced (it is often an exception's message, which may hold anything)."""
    if not isinstance(value, str):
        raise errors.InvalidInput(f"an effect error must be a string, not {type(value).__name__}")
    value = value[: MAX_ERROR + 1].replace("\x00", "\ufffd")
    value = value.encode("utf-8", "replace").decode("utf-8")
    return value if len(value) <= MAX_ERROR else value[: MAX_ERROR - 1] + "…"


def _kinds_json(kinds: Iterable[str] | None) -> str | None:
    if kinds is None:
        return None
    listed = sorted(set(check_strings(kinds, "kinds", limit=MAX_KIND)))
    return json.dumps(listed)


def _timeouts_json(timeouts: Mapping[str, float] | None) -> str | None:
    """``{kind: seconds}`` as the JSON text a claim records deadlines from (None: none)."""
    if timeouts is None:
        return None
    if not isinstance(timeouts, Mapping):
        raise errors.InvalidInput(
            f"timeouts must be a dict of kind -> seconds, not {timeouts!r:.80}"
        )
    checked = {
        check_str(kind, "a timeout's kind", limit=MAX_KIND, empty=False): check_number(
            seconds, f"the timeout of kind {kind!r}", minimum=0.001, maximum=MAX_WAIT
        )
        for kind, seconds in sorted(timeouts.items())
    }
    return json.dumps(checked) if checked else None


def _timeouts_arg(a: Args) -> str | None:
    """The ``timeouts`` argument of a claim: null or the JSON text of an object."""
    text = a.get("timeouts")
    if text is None:
        return None
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise errors.InvalidInput(f"timeouts must be the JSON text of an object, not {text!r:.80}")
    return _timeouts_json(value)


def _kinds_arg(a: Args) -> str | None:
    """The ``kinds`` argument of a claim: null or the JSON text of a list of kinds."""
    text = a.get("kinds")
    if text is None:
        return None
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    if not isinstance(value, list):
        raise errors.InvalidInput(f"kinds must be the JSON text of a list, not {text!r:.80}")
    return _kinds_json(value)


# -- operations ---------------------------------------------------------------------------------


def check_effect(a: Args) -> dict[str, Any]:
    """An effect to enqueue (``enqueue_effect``'s arguments, or one of a history
    operation's ``effects``) from outside, checked and in the form ``insert_effect``
    reads."""
    eid = arg_id(a, "id")
    return {
        "id": eid,
        "thread_key": arg_str(a, "thread_key", False, MAX_THREAD_KEY, empty=False),
        "kind": arg_str(a, "kind", False, MAX_KIND, empty=False),
        "idempotency_key": arg_str(a, "idempotency_key", True, MAX_THREAD_KEY, empty=False),
        "delay": arg_number(a, "delay", 0.0, 0.0, MAX_DELAY),
        "max_attempts": arg_int(
            a, "max_attempts", False, 1, MAX_ATTEMPTS_LIMIT, DEFAULT_MAX_ATTEMPTS
        ),
        "replay_safe": _replay_safe(a.get("replay_safe")),
        "payload": check_encoded(a.get("payload"), f"payload of effect {eid}", ("json", "bytes")),
    }


def check_effect_list(effects: object) -> list[dict[str, Any]]:
    """The ``effects`` argument of a history operation from outside, checked."""
    if not isinstance(effects, list):
        raise errors.InvalidInput("effects must be a list")
    for effect in effects:
        if not isinstance(effect, dict):
            raise errors.InvalidInput("each effect must be an object")
    return [check_effect(e) for e in effects]


def insert_effect(tx: Tx, q: Queries, a: Args, now: float) -> Result:
    """Insert one checked effect in the transaction *tx*; history operations call
    this for their ``effects`` (the transactional outbox)."""
    eid, thread, kind, key = a["id"], a["thread_key"], a["kind"], a["idempotency_key"]
    for found in (
        tx.execute(q["effect_by_key"], (key,)) if key is not None else (),
        tx.execute(q["effect_get"], (eid,)),
    ):
        if found:
            old_id, old_thread, old_kind = found[0][:3]
            if (old_thread, old_kind) != (thread, kind):
                raise errors.AlreadyExists(
                    f"effect {old_id!r} (idempotency key {key!r}) already exists "
                    f"for thread {old_thread!r}, kind {old_kind!r}"
                )
            return {"id": old_id, "duplicate": True}
    enc, body, sha, size = columns(tx, q, a["payload"], now)
    seq = tx.execute(q["effect_thread_last_seq"], (thread,))[0][0] + 1
    head = not tx.execute(q["effect_thread_has_active"], (thread,))
    tx.execute(
        q["effect_insert"],
        {
            "id": eid,
            "thread": thread,
            "seq": seq,
            "kind": kind,
            "enc": enc,
            "payload": body,
            "blob_sha": sha,
            "size": size,
            "is_head": int(head),
            "max_attempts": a["max_attempts"],
            "replay_safe": a["replay_safe"],
            "available_at": now + a["delay"],
            "key": key,
            "now": now,
        },
    )
    return {"id": eid, "seq": seq}


def _check_enqueue(a: Args) -> dict[str, Any]:
    return {**check_effect(a), "now": arg_time(a, "now")}


@OPERATIONS.declare("enqueue_effect", scope=Scope.CATALOG, check=_check_enqueue)
def enqueue_effect(tx: Tx, q: Queries, a: Args) -> Result:
    return insert_effect(tx, q, a, a["now"])


@OPERATIONS.declare(
    "claim_effects", scope=Scope.CATALOG, logged=False, single_statement=True, retry_safe=False
)
def _claim_effects(tx: Tx, q: Queries, a: Args) -> Result:
    """Not logged and never spooled: a claim whose outcome is unknown (a crash)
    is recovered by its lease expiring.  A claim run again after a COMMIT whose
    outcome was lost (PostgreSQL: ``tx.uncertain``) first looks for the effects
    it had claimed, by its ``claim_op``, so they reach the caller, not the sweep."""
    claim_op = a.get("claim_op")
    if claim_op is not None and not is_valid_id(claim_op):
        raise errors.InvalidInput(f"claim_op must be an id, not {claim_op!r}")
    if claim_op is not None and getattr(tx, "uncertain", False):
        rows = tx.execute(q["effect_claimed_by"], (claim_op,))
        if rows:
            return {"rows": rows}
    rows = tx.execute(
        q["effect_claim"],
        {
            "claim_op": claim_op,
            "owner": arg_str(a, "owner", False, 256, empty=False),
            "limit": arg_int(a, "limit", False, 1, MAX_CLAIM, 1),
            "lease": arg_number(a, "lease", DEFAULT_LEASE, 0.001, MAX_LEASE),
            "kinds": _kinds_arg(a),
            "timeouts": _timeouts_arg(a),
            "now": float(a["now"]),
        },
    )
    return {"rows": rows}


@OPERATIONS.declare("heartbeat_effect", scope=Scope.CATALOG, logged=False)
def _heartbeat_effect(tx: Tx, q: Queries, a: Args) -> Result:
    eid = arg_id(a, "id")
    fence = arg_int(a, "fence", False, 1, 2**62, 0)
    lease = arg_number(a, "lease", DEFAULT_LEASE, 0.001, MAX_LEASE)
    params = {
        "id": eid,
        "fence": fence,
        "lease": lease,
        "owner": arg_str(a, "owner", False, 256, empty=False),
        "now": float(a["now"]),
    }
    # Pending with this claim's token can only mean a sweep took it from an owner
    # that looked lost (settlements that leave an effect pending raise the token):
    # the owner is back before anyone else claimed it, so it takes it back.
    rows = tx.execute(q["effect_heartbeat"], params)
    if not rows:
        _lost(tx, q, eid, fence)
    return {"lease_expires_at": rows[0][0]}


def _lost(tx: Tx, q: Queries, eid: str, fence: int) -> NoReturn:
    """Raise ``LeaseLost`` (or ``NotFound``) saying what became of the effect."""
    rows = tx.execute(q["effect_for_settle"], (eid,))
    if not rows:
        raise errors.NotFound(f"no effect {eid!r}")
    _thread, state, current, owner, attempt, _max, _errors, _reason = rows[0]
    if state == "running":
        detail = f"it was claimed again (attempt {attempt}, token {current}) by {owner}"
    else:
        detail = f"it is {state} now"
    raise errors.LeaseLost(
        f"effect {eid}: the lease of token {fence} is lost: {detail}", eid, state
    )


def _advance_head(tx: Tx, q: Queries, thread: str) -> None:
    tx.execute(q["effect_clear_head"], (thread,))
    tx.execute(q["effect_advance_head"], (thread,))


#: Why a sweep buries an effect.  A claim's late settlement may still land on an
#: effect buried so (see ``_settle_effect``).
_SWEEP_REASONS = ("not_replay_safe", "attempts_exhausted")
#: Why a timed-out attempt buries an effect that may not run twice: its handler
#: may still be running (``outcome="timed_out"``).
TIMED_OUT = "timed_out"
_DEAD_REASONS = ("failed", "interrupted")


@OPERATIONS.declare("settle_effect", scope=Scope.CATALOG)
def _settle_effect(tx: Tx, q: Queries, a: Args) -> Result:
    """A claim's outcome, applied only while the claim's token is current.

    A sweep does not raise the token: it takes an effect from an owner that
    looked lost, not from one that is known to be.  So a settlement whose token
    still matches lands even after a sweep, as long as nobody claimed the
    effect since (claims, operator retries and cancels raise the token):
    tests/domain/test_outbox_fleet.py::test_settlement_spooled_past_its_lease_is_not_lost_to_a_sweep
    (a spooled success, delayed by an outside lock past its lease, used to be
    rejected and a replay-safe effect ran twice).

    ``timed_out``: the worker gave up on an attempt whose handler still runs (it
    cannot be stopped).  Replay-safe (as the sweep decides), the effect is retried
    after *delay* (``dead``, ``attempts_exhausted``, if it was the last attempt);
    else it is ``dead`` with reason ``timed_out``.  Either way the token is raised,
    so whatever the abandoned attempt's claim settles later raises ``LeaseLost``:
    tests/domain/test_outbox.py::test_a_timed_out_attempt_*"""
    eid = arg_id(a, "id")
    fence = arg_int(a, "fence", False, 1, 2**62, 0)
    outcome = a.get("outcome")
    if outcome not in _OUTCOMES:
        raise errors.InvalidInput(f"outcome must be one of {', '.join(_OUTCOMES)}, not {outcome!r}")
    now = float(a["now"])
    error = _error_text(a["error"]) if a.get("error") is not None else None
    result = a.get("result")
    if result is not None and (not isinstance(result, str) or len(result) > MAX_RESULT):
        raise errors.InvalidInput("result must be JSON text of at most 1 MiB")
    delay = arg_number(a, "delay", 0.0, 0.0, MAX_DELAY)
    reason = a.get("dead_reason", "failed")
    if reason not in _DEAD_REASONS:
        raise errors.InvalidInput(f"dead_reason must be one of {', '.join(_DEAD_REASONS)}")
    rows = tx.execute(q["effect_for_settle"], (eid,))
    if not rows or rows[0][2] != fence:
        _lost(tx, q, eid, fence)
    thread, current, _fence, owner, attempt, max_attempts, errs, buried = rows[0]
    swept_dead = current == "dead" and buried in _SWEEP_REASONS
    if current not in ("running", "pending") and not swept_dead:
        _lost(tx, q, eid, fence)
    if swept_dead and outcome in ("retry", "release", "timed_out"):
        # It will not run again (its kind may not run twice, or it is out of
        # attempts): the sweep's verdict stands, nothing to change (but a timed-out
        # attempt's handler may still come back: nothing of its claim may land).
        if outcome == "timed_out":
            tx.execute(q["effect_fence_raise"], (now, eid))
        return {"id": eid, "state": "dead"}
    kept = json.loads(errs)
    if error is not None:
        kept = [*kept, {"attempt": attempt, "error": error, "at": now, "owner": owner}]
        kept = kept[-ERRORS_KEPT:]
    state, dead_reason, available_at = outcome, None, now
    if outcome == "retry":
        state, available_at = "pending", now + delay
        if attempt >= max_attempts:
            state, dead_reason = "dead", "attempts_exhausted"
    elif outcome == "dead":
        dead_reason = reason
    elif outcome == "release":
        # Claimed but never started (a worker shutting down): back without
        # spending the attempt.
        state, attempt = "pending", attempt - 1
    elif outcome == "timed_out":
        if not tx.execute(q["effect_replay_safe"], (eid,))[0][0]:
            state, dead_reason = "dead", TIMED_OUT
        elif attempt >= max_attempts:
            state, dead_reason = "dead", "attempts_exhausted"
        else:
            state, available_at = "pending", now + delay
    head = state == "pending"
    tx.execute(
        q["effect_settle"],
        {
            "id": eid,
            "state": state,
            "is_head": int(head),
            "available_at": available_at,
            "result": result if state == "succeeded" else None,
            "error": error,
            "dead_reason": dead_reason,
            "errors": json.dumps(kept),
            "attempt": attempt,
            "finished_at": None if head else now,
            "now": now,
            # Pending again: a new token, so this claim's heartbeats cannot take it
            # back (a pending effect with a current token is one a sweep took).
            # Timed out: the handler may still return, and must change nothing.
            "bump": int(head or outcome == "timed_out"),
        },
    )
    if not head:
        _advance_head(tx, q, thread)
    return {"id": eid, "state": state}


@OPERATIONS.declare("sweep_effects", scope=Scope.CATALOG, logged=False)
def _sweep_effects(tx: Tx, q: Queries, a: Args) -> Result:
    swept = tx.execute(q["effect_sweep"], {"now": float(a["now"]), "kept": ERRORS_KEPT})
    for thread in sorted({thread for _id, thread, state in swept if state == "dead"}):
        _advance_head(tx, q, thread)
    return {"swept": [(eid, state) for eid, _thread, state in swept]}


@OPERATIONS.declare("retry_effect", scope=Scope.CATALOG)
def _retry_effect(tx: Tx, q: Queries, a: Args) -> Result:
    """An operator's retry: a dead or cancelled effect goes back to ``pending``
    at the end of its thread with fresh attempts; a pending one runs now."""
    eid = arg_id(a, "id")
    now = float(a["now"])
    rows = tx.execute(q["effect_for_settle"], (eid,))
    if not rows:
        raise errors.NotFound(f"no effect {eid!r}")
    thread, state = rows[0][0], rows[0][1]
    if state == "pending":
        tx.execute(q["effect_make_due"], (now, now, eid))
        return {"id": eid, "state": state}
    if state not in ("dead", "cancelled"):
        raise errors.InvalidInput(
            f"effect {eid} is {state}: only dead, cancelled or pending effects can be retried"
        )
    seq = tx.execute(q["effect_thread_last_seq"], (thread,))[0][0] + 1
    head = not tx.execute(q["effect_thread_has_active"], (thread,))
    tx.execute(q["effect_requeue"], {"id": eid, "seq": seq, "is_head": int(head), "now": now})
    return {"id": eid, "state": "pending", "seq": seq}


@OPERATIONS.declare("cancel_effect", scope=Scope.CATALOG)
def _cancel_effect(tx: Tx, q: Queries, a: Args) -> Result:
    """An operator's cancel: a pending or running effect becomes ``cancelled``
    (a worker running it gets ``LeaseLost`` at its next heartbeat)."""
    eid = arg_id(a, "id")
    now = float(a["now"])
    rows = tx.execute(q["effect_for_settle"], (eid,))
    if not rows:
        raise errors.NotFound(f"no effect {eid!r}")
    thread, state, _fence, _owner, attempt, _max, errs, _reason = rows[0]
    if state == "cancelled":
        return {"id": eid, "state": state, "duplicate": True}
    if state not in ("pending", "running"):
        raise errors.InvalidInput(f"effect {eid} is {state} already: it cannot be cancelled")
    tx.execute(
        q["effect_settle"],
        {
            "id": eid,
            "state": "cancelled",
            "is_head": 0,
            "available_at": now,
            "result": None,
            "error": "cancelled by an operator",
            "dead_reason": None,
            "errors": errs,
            "attempt": attempt,
            "finished_at": now,
            "now": now,
            # A running claim's late settlement must not land on a cancelled effect.
            "bump": 1,
        },
    )
    _advance_head(tx, q, thread)
    return {"id": eid, "state": "cancelled"}


@OPERATIONS.declare("declare_effect_kinds", scope=Scope.CATALOG, logged=False)
def _declare_effect_kinds(tx: Tx, q: Queries, a: Args) -> Result:
    kinds = a.get("kinds")
    if not isinstance(kinds, dict):
        raise errors.InvalidInput("kinds must be an object of kind -> replay_safe")
    for kind, safe in sorted(kinds.items()):
        check_str(kind, "kind", limit=MAX_KIND, empty=False)
        if not isinstance(safe, bool):
            raise errors.InvalidInput(f"replay_safe of kind {kind!r} must be true or false")
        tx.execute(q["effect_declare_kind"], (kind, int(safe), float(a["now"])))
    return {"declared": len(kinds)}


# -- reading ------------------------------------------------------------------------------------


def effect_from_row(store: StorePort, row: Sequence[Any]) -> Effect:
    (
        eid,
        thread,
        seq,
        kind,
        enc,
        payload,
        sha,
        size,
        state,
        attempt,
        max_attempts,
        safe,
        available_at,
        fence,
        owner,
        expires,
        key,
        result,
        last_error,
        dead_reason,
        errs,
        created,
        updated,
        started,
        finished,
    ) = row
    return Effect(
        id=eid,
        thread_key=thread,
        seq=seq,
        kind=kind,
        payload=decode_value(store, enc, payload, sha, size),
        state=EffectState(state),
        attempt=attempt,
        max_attempts=max_attempts,
        replay_safe=None if safe is None else bool(safe),
        available_at=available_at,
        fence=fence,
        lease_owner=owner,
        lease_expires_at=expires,
        idempotency_key=key,
        result=None if result is None else json.loads(result),
        last_error=last_error,
        dead_reason=dead_reason,
        errors=tuple(
            EffectError(int(e["attempt"]), str(e["error"]), float(e["at"]), e.get("owner"))
            for e in json.loads(errs)
        ),
        created_at=created,
        updated_at=updated,
        started_at=started,
        finished_at=finished,
    )


def _effect_args(
    thread_key: object,
    kind: object,
    key: object,
    eid: str,
    delay: object,
    max_attempts: object,
    replay_safe: object,
) -> dict[str, Any]:
    """``enqueue_effect`` arguments but its payload, every one checked (the usual
    values accepted inline: a check function per argument was most of an enqueue's
    Python calls)."""
    check_str(thread_key, "thread_key", limit=MAX_THREAD_KEY, empty=False)
    check_str(kind, "kind", limit=MAX_KIND, empty=False)
    if key is not None:
        check_str(key, "idempotency_key", limit=MAX_THREAD_KEY, empty=False)
    if delay.__class__ is not float or delay != 0.0:
        check_number(delay, "delay", minimum=0.0, maximum=MAX_DELAY)
    if max_attempts.__class__ is not int or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
        check_int(max_attempts, "max_attempts", minimum=1, maximum=MAX_ATTEMPTS_LIMIT)
    return {
        # An idempotency key names the effect: a retry of the enqueue, spooled
        # or not, carries the same id, so the caller always learns it.
        "id": derived_id("effect", key) if key is not None else eid,  # type: ignore[arg-type]
        "thread_key": thread_key,
        "kind": kind,
        "idempotency_key": key,
        "delay": delay,
        "max_attempts": max_attempts,
        "replay_safe": None if replay_safe is None else _replay_safe(replay_safe),
    }


def _prepare_effect(store: StorePort, spec: object) -> tuple[dict[str, Any], Prepared]:
    """``enqueue_effect`` arguments for *spec* (its payload still to write) with
    every check done: nothing written."""
    if not isinstance(spec, NewEffect):
        raise errors.InvalidInput(f"effects must be NewEffect values, not {type(spec).__name__}")
    check_id(spec.id, "id")
    args = _effect_args(
        spec.thread_key,
        spec.kind,
        spec.idempotency_key,
        spec.id,
        spec.delay,
        spec.max_attempts,
        spec.replay_safe,
    )
    if isinstance(spec.payload, bytes | bytearray | memoryview):
        payload = prepare_payload(store, bytes(spec.payload), "bytes")
    else:
        payload = prepare_payload(store, dump_json(spec.payload, "effect payload"), "json")
    return args, payload


class PreparedEffects:
    """Effects checked, their payloads not yet written: ``write()`` writes them (blob
    files for large payloads) and returns the ``effects`` argument (None if none)."""

    def __init__(self, store: StorePort, items: list[tuple[dict[str, Any], Prepared]]) -> None:
        self._store = store
        self._items = items

    def write(self) -> list[dict[str, Any]] | None:
        if not self._items:
            return None
        return [{**a, "payload": write_payload(self._store, p)} for a, p in self._items]


def prepare_effects(store: StorePort, effects: Sequence[NewEffect] | None) -> PreparedEffects:
    """The effects of a history write, every one checked before any payload is written."""
    if not effects:
        return PreparedEffects(store, [])
    if isinstance(effects, NewEffect | str | bytes | Mapping) or not isinstance(effects, Sequence):
        raise errors.InvalidInput("effects must be a list of NewEffect values")
    return PreparedEffects(store, [_prepare_effect(store, e) for e in effects])


def effect_args(store: StorePort, spec: NewEffect) -> dict[str, Any]:
    """``enqueue_effect`` arguments for *spec*, its payload encoded (a large one
    becomes a blob file now, before any transaction)."""
    args, payload = _prepare_effect(store, spec)
    return {**args, "payload": write_payload(store, payload)}


def effects_args(
    store: StorePort, effects: Sequence[NewEffect] | None
) -> list[dict[str, Any]] | None:
    """The ``effects`` argument of a history operation (None when there are none)."""
    return prepare_effects(store, effects).write()


# -- the API ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Swept:
    """One effect a sweep took from a lost owner: now ``pending`` or ``dead``."""

    id: str
    state: EffectState


class Effects:
    """``store.effects``: the durable outbox."""

    def __init__(self, store: StorePort) -> None:
        self._store = store

    def enqueue(
        self,
        thread_key: str,
        kind: str,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        delay: float = 0.0,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        replay_safe: bool | None = None,
    ) -> str:
        """Add an effect at the end of *thread_key*; returns its id.  *payload*:
        JSON-serialisable or bytes.  With an *idempotency_key* that was used
        before, nothing new is enqueued and the earlier effect's id is returned.
        *delay*: seconds before it may run.  *replay_safe*: may it run again
        after its worker was lost mid-run?  (None: as its kind was declared, and
        replay-safe if it never was.)  Past the write budget the enqueue waits
        in this process's spool like any write."""
        store = self._store
        op_id = new_id()
        args = _effect_args(
            thread_key, kind, idempotency_key, op_id, delay, max_attempts, replay_safe
        )
        args["payload"] = value_payload(store, payload, "effect payload")
        result = store.submit(Operation("enqueue_effect", args, op_id, True))
        return str(result["id"]) if result is not None else str(args["id"])

    def get(self, effect_id: str) -> Effect:
        """The effect *effect_id* (``NotFound`` if there is none)."""
        check_id(effect_id, "effect_id")
        self._store.check_visible(None)
        q = self._store.queries
        rows = self._store.read(lambda tx: tx.execute(q["effect_get"], (effect_id,)))
        if not rows:
            raise errors.NotFound(f"no effect {effect_id!r}")
        return effect_from_row(self._store, rows[0])

    def list(
        self,
        *,
        thread_key: str | None = None,
        state: EffectState | str | None = None,
        kind: str | None = None,
        limit: int = 100,
        after: Effect | None = None,
    ) -> Page[Effect, Effect]:
        """Effects by thread and seq, filtered: at most *limit*, in a ``Page`` whose
        ``more`` says there are more; ``after=page.next_cursor`` (the last effect)
        lists them."""
        if state is not None and (not isinstance(state, str) or str(state) not in _STATES):
            raise errors.InvalidInput(f"state must be one of {', '.join(_STATES)}, not {state!r}")
        check_int(limit, "limit", minimum=1, maximum=100_000)
        check_opt_str(thread_key, "thread_key", MAX_THREAD_KEY)
        check_opt_str(kind, "kind", MAX_KIND)
        if after is not None and (
            not isinstance(after, Effect)
            or not isinstance(after.thread_key, str)
            or not isinstance(after.seq, int)
        ):
            raise errors.InvalidInput(
                f"after must be an Effect (the last one listed), not {after!r:.80}"
            )
        if after is not None:
            check_str(after.thread_key, "after.thread_key", limit=MAX_THREAD_KEY)
            check_int(after.seq, "after.seq")
        q = self._store.queries
        params = {
            "thread": thread_key,
            "state": None if state is None else str(state),
            "kind": kind,
            "after_thread": after.thread_key if after is not None else None,
            "after_seq": after.seq if after is not None else None,
            "limit": limit + 1,  # one more: whether there is more is then known
        }
        rows = self._store.read(lambda tx: tx.execute(q["effect_list"], params))
        found = [effect_from_row(self._store, r) for r in rows[:limit]]
        more = len(rows) > limit
        return Page(found, more=more, next_cursor=found[-1] if more else None)

    def counts(self) -> dict[str, int]:
        """Effects per state (every state, zeros included), plus ``expired``:
        running effects whose lease has run out, waiting for a sweep."""
        q = self._store.queries
        now = time.time()

        def run(tx: Tx) -> dict[str, int]:
            counts = dict.fromkeys(_STATES, 0)
            counts.update({state: int(n) for state, n in tx.execute(q["effect_counts"])})
            counts["expired"] = int(tx.execute(q["effect_expired_count"], (now,))[0][0])
            return counts

        return self._store.read(run)

    def wait_for_work(self, timeout: float) -> bool:
        """Wait up to *timeout* seconds for an effect to become ready (PostgreSQL:
        a NOTIFY from the effects trigger; SQLite: just the wait).  True if woken."""
        check_timeout(timeout)
        return bool(self._store.notify_wait("fleetstore_effects", timeout))

    def next_ready(self, kinds: Iterable[str] | None = None) -> float | None:
        """When the next claimable effect (of *kinds*) becomes available: a time
        (maybe past: claim now), or None if no thread has a pending head."""
        q = self._store.queries
        params = {"kinds": _kinds_json(kinds)}
        rows = self._store.read(lambda tx: tx.execute(q["effect_next_ready"], params))
        value = rows[0][0] if rows else None
        return None if value is None else float(value)

    def active(self, kinds: Iterable[str] | None = None) -> int:
        """How many effects (of *kinds*) are pending or running."""
        q = self._store.queries
        params = {"kinds": _kinds_json(kinds)}
        return int(self._store.read(lambda tx: tx.execute(q["effect_active_count"], params))[0][0])

    def claim(
        self,
        owner: str,
        *,
        limit: int = 1,
        lease: float = DEFAULT_LEASE,
        kinds: Iterable[str] | None = None,
        timeouts: Mapping[str, float] | None = None,
    ) -> builtins.list[Claim]:
        """Claim up to *limit* ready effects (thread heads whose time has come),
        oldest first, for *owner*, each under a lease of *lease* seconds.
        *timeouts* (``{kind: seconds}``): how long the claimer lets a handler of
        each kind run; recorded as the effect's deadline, which doctor checks (the
        claimer enforces it, ``Claim.timed_out``).  Never spooled: past the write
        budget ``StoreBusy``."""
        check_str(owner, "owner", limit=256, empty=False)
        check_int(limit, "limit", minimum=1, maximum=MAX_CLAIM)
        check_number(lease, "lease", minimum=0.001, maximum=MAX_LEASE)
        op_id = new_id()
        op = Operation(
            "claim_effects",
            {
                "owner": owner,
                "limit": limit,
                "lease": lease,
                "kinds": _kinds_json(kinds),
                "timeouts": _timeouts_json(timeouts),
                "claim_op": op_id,
            },
            op_id,
            True,
        )
        result = self._store.submit(op, independent=True)
        assert result is not None  # independent operations are never spooled
        claims = []
        for row in result["rows"]:
            claims.append(Claim(self._store, effect_from_row(self._store, row), owner, lease))
        return claims

    def sweep(self) -> builtins.list[Swept]:
        """Take effects whose lease expired from their lost owners: back to
        ``pending`` (replay-safe, attempts left) or to ``dead`` with the reason."""
        op = Operation("sweep_effects", {}, new_id(), True)
        result = self._store.submit(op, independent=True)
        assert result is not None
        return [Swept(eid, EffectState(state)) for eid, state in result["swept"]]

    def retry(self, effect_id: str) -> Effect:
        """Run a dead or cancelled effect again (at the end of its thread, with
        fresh attempts), or a pending one now."""
        check_id(effect_id, "effect_id")
        self._store.submit(
            Operation("retry_effect", {"id": effect_id}, new_id(), True), spool=False
        )
        return self.get(effect_id)

    def cancel(self, effect_id: str) -> Effect:
        """Cancel a pending or running effect; its thread moves on."""
        check_id(effect_id, "effect_id")
        self._store.submit(
            Operation("cancel_effect", {"id": effect_id}, new_id(), True), spool=False
        )
        return self.get(effect_id)

    def declare(self, kinds: Mapping[str, bool]) -> None:
        """Record, per kind, whether it is safe to run again after its owner
        was lost (``{"title.generate": True, "provider.turn": False}``)."""
        if not isinstance(kinds, Mapping):
            raise errors.InvalidInput(f"kinds must be a dict of kind -> bool, not {kinds!r:.80}")
        for kind, safe in kinds.items():
            check_str(kind, "kind", limit=MAX_KIND, empty=False)
            check_bool(safe, f"replay_safe of kind {kind!r}")
        op = Operation("declare_effect_kinds", {"kinds": dict(kinds)}, new_id(), True)
        self._store.submit(op, independent=True)

    def kinds(self) -> dict[str, bool]:
        """The declared kinds and whether each is replay-safe."""
        q = self._store.queries
        rows = self._store.read(lambda tx: tx.execute(q["effect_kinds"]))
        return {kind: bool(safe) for kind, safe, _at in rows}


class Claim:
    """A claimed effect: settle it once with ``succeed``, ``retry``, ``fail``,
    ``cancel`` or ``release``.  Each applies only while this claim's token is
    current (``LeaseLost`` otherwise, nothing changed).  A settlement that meets
    a store locked past the write budget is spooled and lands later: the call
    returns False and the worker keeps the lease alive until it has landed."""

    def __init__(self, store: StorePort, effect: Effect, owner: str, lease: float) -> None:
        self._store = store
        self.effect = effect
        self.owner = owner
        self.lease = lease
        self.lease_expires_at = effect.lease_expires_at
        #: The outcome once settled (``None`` before).
        self.outcome: str | None = None

    @property
    def id(self) -> str:
        return self.effect.id

    @property
    def fence(self) -> int:
        return self.effect.fence

    def heartbeat(self, lease: float | None = None) -> float:
        """Extend the lease by *lease* (default: the claim's) seconds from now;
        returns the new expiry.  ``LeaseLost`` if the claim is no longer current."""
        if lease is not None:
            check_number(lease, "lease", minimum=0.001, maximum=MAX_LEASE)
        args = {
            "id": self.id,
            "fence": self.fence,
            "owner": self.owner,
            "lease": self.lease if lease is None else lease,
        }
        result = self._store.submit(
            Operation("heartbeat_effect", args, new_id(), True), independent=True
        )
        assert result is not None
        self.lease_expires_at = float(result["lease_expires_at"])
        return self.lease_expires_at

    def succeed(self, result: Any = None) -> bool:
        """Done: keep *result* (JSON, at most 1 MiB).  True once applied, False if
        spooled (applied in order once the store is writable again)."""
        text = (
            None if result is None else redact_json(self._store, dump_json(result, "effect result"))
        )
        if text is not None and len(text.encode("utf-8")) > MAX_RESULT:
            raise errors.InvalidInput("an effect result is kept inline: at most 1 MiB of JSON")
        return self._settle("succeeded", result=text)

    def retry(self, delay: float = 0.0, error: str = "") -> bool:
        """Failed this time: run again after *delay* seconds (``dead`` with
        ``attempts_exhausted`` if this was the last attempt)."""
        check_number(delay, "delay", minimum=0.0, maximum=MAX_DELAY)
        if error is not None and not isinstance(error, str):
            raise errors.InvalidInput(f"error must be a string, not {type(error).__name__}")
        return self._settle("retry", error=_error_text(error or "retry requested"), delay=delay)

    def fail(self, error: str, *, interrupted: bool = False) -> bool:
        """Failed for good: ``dead`` (``dead_reason`` ``failed``, or ``interrupted``
        for a run that was cut short, e.g. by a worker's hard stop); the thread moves on."""
        check_bool(interrupted, "interrupted")
        return self._settle(
            "dead", error=_error_text(error), dead_reason="interrupted" if interrupted else "failed"
        )

    def cancel(self) -> bool:
        """Not needed any more: ``cancelled``; the thread moves on."""
        return self._settle("cancelled")

    def release(self) -> bool:
        """Never started: back to ``pending`` without spending the attempt."""
        return self._settle("release")

    def timed_out(self, error: str, delay: float = 0.0) -> bool:
        """The handler ran past its time and may still be running (a thread cannot
        be stopped): a failed attempt.  A replay-safe effect runs again after
        *delay* seconds (``dead``, ``attempts_exhausted``, if this was its last
        attempt); one that may not run twice is ``dead`` (``timed_out``).  The token
        is raised either way: anything settled with this claim's token later, by
        anyone, raises ``LeaseLost`` and changes nothing."""
        check_number(delay, "delay", minimum=0.0, maximum=MAX_DELAY)
        return self._settle("timed_out", error=_error_text(error), delay=delay)

    def _late_success(self, result: Any) -> bool:
        """For a worker: the result of a handler it gave up on, offered with this
        claim's token (which the store refuses once it was raised: ``LeaseLost``).
        Never spooled: past the write budget ``StoreBusy``."""
        text = (
            None if result is None else redact_json(self._store, dump_json(result, "effect result"))
        )
        return self._settle("succeeded", must_land=False, result=text)

    def _settle(self, outcome: str, *, must_land: bool = True, **args: Any) -> bool:
        if self.outcome is not None:
            raise errors.InvalidInput(f"effect {self.id}: this claim was settled ({self.outcome})")
        op = Operation(
            "settle_effect",
            {"id": self.id, "fence": self.fence, "outcome": outcome, **args},
            new_id(),
            True,
        )
        if must_land:
            applied = self._store.submit(op, must_land=True)
        else:
            applied = self._store.submit(op, spool=False)
        self.outcome = outcome
        return applied is not None

    def __repr__(self) -> str:
        return (
            f"<Claim {self.effect.kind} {self.id} thread={self.effect.thread_key!r} "
            f"attempt={self.effect.attempt} token={self.fence}>"
        )


__all__ = [
    "DEFAULT_LEASE",
    "Claim",
    "Effects",
    "PreparedEffects",
    "Swept",
    "effects_args",
    "check_effect",
    "check_effect_list",
    "insert_effect",
    "prepare_effects",
]
