"""The outbox's operations, as applied inside the write transaction: enqueue, claim,
heartbeat, settle (one, or a batch), sweep, an operator's retry and cancel, kinds
declared.  The API that makes them is domain/outbox.py.

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
from outside delays a settlement but never loses it or strands the thread.  A
batch of settlements (``settle_effects``) is one logged operation: each one checks
its own token, and one that lost its lease is refused alone (``LeaseLost`` for that
effect in the result) while the others land.

A sweep (one guarded statement) returns expired leases to ``pending`` when the
kind is replay-safe and attempts are left, else to ``dead`` with the reason;
a dead, succeeded or cancelled head hands the thread on to its next effect.

Every operation that makes an effect claimable (a new head, a head handed on to a
pending effect, an effect pending again, a sweep, an operator's retry) rings
``CHANNEL`` (``tx.notify``): idle workers in every process wake once it commits
(engine/notify.py) instead of polling.

Arguments are checked once, where they come in: the API builds these operations
``trusted``, in the form the apply functions read; an operation from outside (a spool
journal, another process's group-commit post) is checked by its declaration's
``check`` (``registry.decode``), and apply functions trust what they get.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from fleetstore import errors
from fleetstore.core.ids import is_valid_id
from fleetstore.core.validate import (
    MAX_WAIT,
    arg_id,
    arg_int,
    arg_number,
    arg_str,
    arg_time,
    arg_when,
    check_number,
    check_str,
    check_strings,
)
from fleetstore.domain.codec import check_encoded, columns
from fleetstore.domain.effect_trace import trace_arg
from fleetstore.domain.operations import Args, Declarations, Queries, Result, Scope

if TYPE_CHECKING:
    from fleetstore.engine.base import Tx

OPERATIONS = Declarations()

#: The channel rung where an effect becomes claimable (``Effects.wait_for_work``).
CHANNEL = "fleetstore_effects"
#: Seconds a claim's lease lasts unless renewed; workers heartbeat at a third of it.
DEFAULT_LEASE = 30.0
DEFAULT_MAX_ATTEMPTS = 5
#: Failed attempts kept per effect (the newest).
ERRORS_KEPT = 20
MAX_THREAD_KEY = 1024
MAX_KIND = 256
MAX_ERROR = 16 * 1024
#: A failed attempt's traceback is kept cut to its last 8 Ki characters: the innermost
#: frames and the exception, which say where it failed (a deep stack's outer frames
#: are the framework's).
MAX_TRACEBACK = 8 * 1024
#: A handler's result is kept inline: larger results belong in the store proper.
MAX_RESULT = 1024 * 1024
MAX_ATTEMPTS_LIMIT = 10_000
MAX_DELAY = MAX_WAIT
MAX_LEASE = 86400.0
MAX_CLAIM = 1000
#: Most settlements in one ``settle_effects``.
MAX_SETTLE_BATCH = 1000

OUTCOMES = ("succeeded", "retry", "dead", "cancelled", "release", "timed_out")
DEAD_REASONS = ("failed", "interrupted")
#: Why a sweep buries an effect.  A claim's late settlement may still land on an
#: effect buried so (see ``settle_one``).
_SWEEP_REASONS = ("not_replay_safe", "attempts_exhausted")
#: Why a timed-out attempt buries an effect that may not run twice: its handler
#: may still be running (``outcome="timed_out"``).
TIMED_OUT = "timed_out"
#: A settlement's new state (and a dead one's reason) in a batch's result, one
#: character each ("x": refused; "d": dead for a reason not listed).
_STATE_CODES = {
    ("succeeded", None): "s",
    ("pending", None): "p",
    ("cancelled", None): "c",
    ("dead", None): "d",
    ("dead", "failed"): "f",
    ("dead", "interrupted"): "i",
    ("dead", "attempts_exhausted"): "a",
    ("dead", "not_replay_safe"): "n",
    ("dead", TIMED_OUT): "t",
}
STATE_OF_CODE = {code: pair for pair, code in _STATE_CODES.items()}


# -- argument checks ----------------------------------------------------------------------------


def replay_safe_arg(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise errors.InvalidInput(f"replay_safe must be true, false or null, not {value!r}")
    return int(value)


def error_text(value: object, what: str = "an effect error", limit: int = MAX_ERROR) -> str:
    """An effect error as kept: at most *limit* characters, NUL and lone surrogates
    replaced (it is often an exception's message, which may hold anything)."""
    if not isinstance(value, str):
        raise errors.InvalidInput(f"{what} must be a string, not {type(value).__name__}")
    value = value[: limit + 1].replace("\x00", "\ufffd")
    value = value.encode("utf-8", "replace").decode("utf-8")
    return value if len(value) <= limit else value[: limit - 1] + "…"


def traceback_text(value: object) -> str | None:
    """A traceback as kept: None, or its last MAX_TRACEBACK characters (the end is
    where it failed), cleaned like an error."""
    if value is None:
        return None
    if isinstance(value, str) and len(value) > MAX_TRACEBACK:
        value = "…" + value[-(MAX_TRACEBACK - 1) :]
    return error_text(value, "a traceback", MAX_TRACEBACK)


def kinds_json(kinds: Iterable[str] | None) -> str | None:
    if kinds is None:
        return None
    listed = sorted(set(check_strings(kinds, "kinds", limit=MAX_KIND)))
    return json.dumps(listed)


def timeouts_json(timeouts: Mapping[str, float] | None) -> str | None:
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


def _json_arg(a: Args, key: str, shape: type) -> Any:
    text = a.get(key)
    if text is None:
        return None
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    if not isinstance(value, shape):
        what = "an object" if shape is dict else "a list"
        raise errors.InvalidInput(f"{key} must be the JSON text of {what}, not {text!r:.80}")
    return value


# -- enqueue ------------------------------------------------------------------------------------


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
        "replay_safe": replay_safe_arg(a.get("replay_safe")),
        "payload": check_encoded(a.get("payload"), f"payload of effect {eid}", ("json", "bytes")),
        **trace_arg(a),
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
    if "trace" in a:
        tx.execute(q["effect_set_trace"], (a["trace"], eid))
    if head:
        tx.notify(CHANNEL)
    return {"id": eid, "seq": seq}


def _check_enqueue(a: Args) -> dict[str, Any]:
    return {**check_effect(a), "now": arg_time(a, "now")}


@OPERATIONS.declare("enqueue_effect", scope=Scope.CATALOG, check=_check_enqueue)
def enqueue_effect(tx: Tx, q: Queries, a: Args) -> Result:
    return insert_effect(tx, q, a, a["now"])


# -- claims and leases --------------------------------------------------------------------------


def _check_claim(a: Args) -> dict[str, Any]:
    claim_op = a.get("claim_op")
    if claim_op is not None and not is_valid_id(claim_op):
        raise errors.InvalidInput(f"claim_op must be an id, not {claim_op!r}")
    kinds = _json_arg(a, "kinds", list)
    timeouts = _json_arg(a, "timeouts", dict)
    return {
        "claim_op": claim_op,
        "owner": arg_str(a, "owner", False, 256, empty=False),
        "limit": arg_int(a, "limit", False, 1, MAX_CLAIM, 1),
        "lease": arg_number(a, "lease", DEFAULT_LEASE, 0.001, MAX_LEASE),
        "kinds": None if kinds is None else kinds_json(kinds),
        "timeouts": None if timeouts is None else timeouts_json(timeouts),
        "now": arg_time(a, "now"),
    }


@OPERATIONS.declare(
    "claim_effects",
    scope=Scope.CATALOG,
    logged=False,
    single_statement=True,
    retry_safe=False,
    check=_check_claim,
)
def _claim_effects(tx: Tx, q: Queries, a: Args) -> Result:
    """Not logged and never spooled: a claim whose outcome is unknown (a crash)
    is recovered by its lease expiring.  A claim run again after a COMMIT whose
    outcome was lost (PostgreSQL: ``tx.uncertain``) first looks for the effects
    it had claimed, by its ``claim_op``, so they reach the caller, not the sweep.
    Its rows: what a worker needs of a claimed effect (``outbox.claimed_effect``)."""
    claim_op = a["claim_op"]
    if claim_op is not None and tx.uncertain:
        rows = tx.execute(q["effect_claimed_by"], (claim_op,))
        if rows:
            return {"rows": rows}
    return {"rows": tx.execute(q["effect_claim"], a)}  # type: ignore[arg-type]


def _check_heartbeat(a: Args) -> dict[str, Any]:
    return {
        "id": arg_id(a, "id"),
        "fence": arg_int(a, "fence", False, 1, 2**62, 0),
        "lease": arg_number(a, "lease", DEFAULT_LEASE, 0.001, MAX_LEASE),
        "owner": arg_str(a, "owner", False, 256, empty=False),
        "now": arg_time(a, "now"),
    }


@OPERATIONS.declare("heartbeat_effect", scope=Scope.CATALOG, logged=False, check=_check_heartbeat)
def _heartbeat_effect(tx: Tx, q: Queries, a: Args) -> Result:
    # Pending with this claim's token can only mean a sweep took it from an owner
    # that looked lost (settlements that leave an effect pending raise the token):
    # the owner is back before anyone else claimed it, so it takes it back.
    rows = tx.execute(q["effect_heartbeat"], a)  # type: ignore[arg-type]
    if not rows:
        _lost(tx.execute(q["effect_for_settle"], (a["id"],)), a["id"], a["fence"])
    return {"lease_expires_at": rows[0][0]}


def _lost(rows: list[tuple[Any, ...]], eid: str, fence: int) -> NoReturn:
    """Raise ``LeaseLost`` (or ``NotFound``) saying what became of the effect, from its
    ``effect_for_settle`` *rows*."""
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
    """The thread's next active effect becomes its head; a pending one rings."""
    tx.execute(q["effect_clear_head"], (thread,))
    made = tx.execute(q["effect_advance_head"], (thread,))
    if made and made[0][0] == "pending":
        tx.notify(CHANNEL)


# -- settlements --------------------------------------------------------------------------------


def check_settlement(a: Args) -> dict[str, Any]:
    """One settlement from outside (``settle_effect``'s arguments, or an item of
    ``settle_effects``), checked and in the form ``settle_one`` reads: every key."""
    outcome = a.get("outcome")
    if outcome not in OUTCOMES:
        raise errors.InvalidInput(f"outcome must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
    result = a.get("result")
    if result is not None and (not isinstance(result, str) or len(result) > MAX_RESULT):
        raise errors.InvalidInput("result must be JSON text of at most 1 MiB")
    reason = a.get("dead_reason")
    if reason is None:
        reason = "failed"
    elif reason not in DEAD_REASONS:
        raise errors.InvalidInput(f"dead_reason must be one of {', '.join(DEAD_REASONS)}")
    return {
        "id": arg_id(a, "id"),
        "fence": arg_int(a, "fence", False, 1, 2**62, 0),
        "outcome": outcome,
        "result": result,
        "error": error_text(a["error"]) if a.get("error") is not None else None,
        "delay": arg_number(a, "delay", 0.0, 0.0, MAX_DELAY),
        "dead_reason": reason,
        "traceback": traceback_text(a.get("traceback")),
        # The claimer's own limit on attempts (a worker's, or its handler's for the
        # kind): it may give up sooner than the effect allows, never later.
        "max_attempts": arg_int(a, "max_attempts", True, 1, MAX_ATTEMPTS_LIMIT),
    }


def settle_one(
    tx: Tx, q: Queries, a: Args, now: float, chain: dict[str, Any] | None = None
) -> tuple[str, str | None]:
    """A claim's outcome, applied only while the claim's token is current; the
    effect's new state and, if dead, why.  Raises ``LeaseLost`` (or ``NotFound``) before it writes
    anything, so an item of a batch that raises leaves nothing.

    A sweep does not raise the token: it takes an effect from an owner that
    looked lost, not from one that is known to be.  So a settlement whose token
    still matches lands even after a sweep, as long as nobody claimed the
    effect since (claims, operator retries and cancels raise the token):
    tests/domain/test_outbox_fleet.py::test_settlement_spooled_past_its_lease_is_not_lost_to_a_sweep
    (a spooled success, delayed by an outside lock past its lease, used to be
    rejected and a replay-safe effect ran twice).

    *chain* (settle-and-claim, ``settle_effects``): the thread's next head, if this
    settlement hands the thread on to one that can run now, is claimed for the settling
    worker in this transaction (``_claim_next``) instead of being rung for.

    ``timed_out``: the worker gave up on an attempt whose handler still runs (it
    cannot be stopped).  Replay-safe (as the sweep decides), the effect is retried
    after *delay* (``dead``, ``attempts_exhausted``, if it was the last attempt);
    else it is ``dead`` with reason ``timed_out``.  Either way the token is raised,
    so whatever the abandoned attempt's claim settles later raises ``LeaseLost``:
    tests/domain/test_outbox.py::test_a_timed_out_attempt_*"""
    eid, fence, outcome = a["id"], a["fence"], a["outcome"]
    rows = tx.execute(q["effect_for_settle"], (eid,))
    if not rows or rows[0][2] != fence:
        _lost(rows, eid, fence)
    thread, current, _fence, owner, attempt, max_attempts, errs, buried = rows[0]
    swept_dead = current == "dead" and buried in _SWEEP_REASONS
    if current not in ("running", "pending") and not swept_dead:
        _lost(rows, eid, fence)
    if swept_dead and outcome in ("retry", "release", "timed_out"):
        # It will not run again (its kind may not run twice, or it is out of
        # attempts): the sweep's verdict stands, nothing to change (but a timed-out
        # attempt's handler may still come back: nothing of its claim may land).
        if outcome == "timed_out":
            tx.execute(q["effect_fence_raise"], (now, eid))
        return "dead", buried
    error = a["error"]
    if error is not None:
        kept = json.loads(errs)
        entry = {"attempt": attempt, "error": error, "at": now, "owner": owner}
        if a["traceback"] is not None:
            entry["traceback"] = a["traceback"]
        kept.append(entry)
        errs = json.dumps(kept[-ERRORS_KEPT:])
    cap = a["max_attempts"]
    if cap is not None and cap < max_attempts:
        max_attempts = cap
    state: str = outcome
    dead_reason, available_at = None, now
    if outcome == "retry":
        state, available_at = "pending", now + a["delay"]
        if attempt >= max_attempts:
            state, dead_reason = "dead", "attempts_exhausted"
    elif outcome == "dead":
        dead_reason = a["dead_reason"]
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
            state, available_at = "pending", now + a["delay"]
    head = state == "pending"
    tx.execute(
        q["effect_settle"],
        {
            "id": eid,
            "state": state,
            "is_head": int(head),
            "available_at": available_at,
            "result": a["result"] if state == "succeeded" else None,
            "error": error,
            "dead_reason": dead_reason,
            "errors": errs,
            "attempt": attempt,
            "finished_at": None if head else now,
            "now": now,
            # Pending again: a new token, so this claim's heartbeats cannot take it
            # back (a pending effect with a current token is one a sweep took).
            # Timed out: the handler may still return, and must change nothing.
            "bump": int(head or outcome == "timed_out"),
        },
    )
    if head:
        tx.notify(CHANNEL)  # claimable again (at available_at)
    elif swept_dead:
        # The sweep handed the thread on already: whoever is its head now stays so.
        _advance_head(tx, q, thread)
    else:
        # It was its thread's head (a running effect is; a pending one with its claim's
        # token is one a sweep gave back, head again): the head flag went with the
        # settlement above, so only the next head is to be set.
        made = tx.execute(q["effect_advance_head"], (thread,))
        if made and made[0][0] == "pending" and not _claim_next(tx, q, chain, made[0][1], now):
            tx.notify(CHANNEL)
    return state, dead_reason


def _claim_next(tx: Tx, q: Queries, chain: dict[str, Any] | None, eid: str, now: float) -> bool:
    """Settle-and-claim: claim *eid*, the head a settlement just handed its thread on
    to, for the settling worker (*chain*: its claim's arguments, ``_check_chain``), if
    the worker has room left, the settlement is applied before ``until`` (not replayed
    from a spool long after: nobody would start the claim) and the effect is available
    now and of its kinds; whether it was claimed.  The claim carries the settlement's
    operation id (``claim_op``), so the worker finds what it took, whatever became of
    the answer (``Effects._settle_batch``).  A lane's next effect then starts when its
    predecessor's settlement commits, without a claim of its own to wait for the write
    lock: tests/domain/test_outbox.py::test_settle_and_claim_*"""
    if chain is None or chain["left"] <= 0 or now > chain["until"]:
        return False
    claim = {
        "id": eid,
        "owner": chain["owner"],
        "lease": chain["lease"],
        "kinds": chain["kinds"],
        "timeouts": chain["timeouts"],
        "claim_op": chain["claim_op"],
        "now": now,
    }
    if not tx.execute(q["effect_claim_next"], claim):
        return False
    chain["left"] -= 1
    return True


def _check_settle(a: Args) -> dict[str, Any]:
    return {**check_settlement(a), "now": arg_time(a, "now")}


@OPERATIONS.declare("settle_effect", scope=Scope.CATALOG, check=_check_settle)
def _settle_effect(tx: Tx, q: Queries, a: Args) -> Result:
    state, dead_reason = settle_one(tx, q, a, a["now"])
    return {"id": a["id"], "state": state, "dead_reason": dead_reason}


def _check_settles(a: Args) -> dict[str, Any]:
    items = a.get("items")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_SETTLE_BATCH:
        raise errors.InvalidInput(
            f"items must be a list of 1 to {MAX_SETTLE_BATCH} settlements, not {items!r:.80}"
        )
    for item in items:
        if not isinstance(item, dict):
            raise errors.InvalidInput(f"each settlement must be an object, not {item!r:.80}")
    chain = a.get("chain")
    if chain is not None:
        if not isinstance(chain, dict):
            raise errors.InvalidInput(f"chain must be an object, not {chain!r:.80}")
        chain = _check_chain(chain)
    return {
        "items": [check_settlement(i) for i in items],
        "chain": chain,
        "now": arg_time(a, "now"),
    }


def _check_chain(a: Args) -> dict[str, Any]:
    """``settle_effects``'s ``chain`` from outside: the settling worker's claim
    (``_check_claim``'s arguments, its ``claim_op`` the settlement's id), and ``until``,
    the time past which the settlement claims nothing."""
    if a.get("claim_op") is None:
        raise errors.InvalidInput("a chain's claim_op must be an id")
    claim = _check_claim({**a, "now": 0.0})
    return {
        "claim_op": claim["claim_op"],
        "owner": claim["owner"],
        "limit": claim["limit"],
        "lease": claim["lease"],
        "kinds": claim["kinds"],
        "timeouts": claim["timeouts"],
        "until": arg_when(a, "until"),
    }


@OPERATIONS.declare("settle_effects", scope=Scope.CATALOG, check=_check_settles)
def _settle_effects(tx: Tx, q: Queries, a: Args) -> Result:
    """A worker's finished effects, settled in one transaction and logged as one
    operation (applied once, whatever retries happen).  Each checks its own token:
    one whose lease is lost is refused alone, before it wrote anything, and the
    others land.  The result: ``states``, one character per item, the new state and a
    dead one's reason (``STATE_OF_CODE``; ``x``: refused), and ``refused``, each
    refused id's error (``errors.to_wire``): short, so that a replay finds it whole.

    With ``chain`` (settle-and-claim): each thread a settlement hands on to an effect
    that can run now has it claimed for the settling worker, up to ``limit`` of them
    (``_claim_next``), and ``chained`` says how many; the worker reads them by
    ``claim_op`` (the claims are found so after a replay too: the result keeps no rows)."""
    now = a["now"]
    codes = []
    refused: dict[str, Any] = {}
    chain = a.get("chain")
    if chain is not None:
        chain = {**chain, "left": chain["limit"]}
    for item in a["items"]:
        try:
            state, dead_reason = settle_one(tx, q, item, now, chain)
        except (errors.LeaseLost, errors.NotFound) as exc:
            codes.append("x")
            refused[item["id"]] = errors.to_wire(exc)
            continue
        codes.append(_STATE_CODES.get((state, dead_reason)) or _STATE_CODES[(state, None)])
    if chain is None:
        return {"states": "".join(codes), "refused": refused}
    return {"states": "".join(codes), "refused": refused, "chained": chain["limit"] - chain["left"]}


# -- sweeps and operators -----------------------------------------------------------------------


@OPERATIONS.declare("sweep_effects", scope=Scope.CATALOG, logged=False)
def _sweep_effects(tx: Tx, q: Queries, a: Args) -> Result:
    swept = tx.execute(q["effect_sweep"], {"now": float(a["now"]), "kept": ERRORS_KEPT})
    for thread in sorted({thread for _id, thread, state in swept if state == "dead"}):
        _advance_head(tx, q, thread)
    if any(state == "pending" for _id, _thread, state in swept):
        tx.notify(CHANNEL)
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
        tx.notify(CHANNEL)
        return {"id": eid, "state": state}
    if state not in ("dead", "cancelled"):
        raise errors.InvalidInput(
            f"effect {eid} is {state}: only dead, cancelled or pending effects can be retried"
        )
    seq = tx.execute(q["effect_thread_last_seq"], (thread,))[0][0] + 1
    head = not tx.execute(q["effect_thread_has_active"], (thread,))
    tx.execute(q["effect_requeue"], {"id": eid, "seq": seq, "is_head": int(head), "now": now})
    if head:
        tx.notify(CHANNEL)
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


__all__ = [
    "CHANNEL",
    "DEFAULT_LEASE",
    "DEFAULT_MAX_ATTEMPTS",
    "MAX_CLAIM",
    "MAX_KIND",
    "MAX_LEASE",
    "MAX_SETTLE_BATCH",
    "OPERATIONS",
    "STATE_OF_CODE",
    "check_effect",
    "check_effect_list",
    "check_settlement",
    "insert_effect",
    "settle_one",
]
