"""The durable effect outbox: the API (``store.effects``, ``Claim``).  The operations it
makes, and the rules they keep (per-thread order, leases and fencing, settlements that
land, sweeps, rings), are in domain/outbox_ops.py.

A claim's effect is built from the claim's own rows with what a worker needs
(``claimed_effect``: no result, no error history); ``effects.get`` reads it whole.
Settlements of one claim each are ``Claim.succeed`` and its siblings; a worker settles
its finished effects in batches (``Effects.settle_batch``: one logged operation, each
settlement checked against its own token).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetstore import errors
from fleetstore.core import telemetry
from fleetstore.core.ids import derived_id, new_id
from fleetstore.core.logs import logger
from fleetstore.core.validate import (
    check_bool,
    check_id,
    check_int,
    check_number,
    check_opt_str,
    check_str,
    check_timeout,
    dump_json,
)
from fleetstore.domain.codec import (
    Prepared,
    damaged_row,
    decode_value,
    prepare_payload,
    redact_json,
    redact_text,
    value_payload,
    write_payload,
)
from fleetstore.domain.effect_trace import carry_trace
from fleetstore.domain.operations import Delivery, Operation
from fleetstore.domain.outbox_ops import (
    CHANNEL,
    DEFAULT_LEASE,
    DEFAULT_MAX_ATTEMPTS,
    MAX_ATTEMPTS_LIMIT,
    MAX_CLAIM,
    MAX_DELAY,
    MAX_KIND,
    MAX_LEASE,
    MAX_RESULT,
    MAX_SETTLE_BATCH,
    MAX_THREAD_KEY,
    MAX_TRACEBACK,
    STATE_OF_CODE,
    error_text,
    kinds_json,
    replay_safe_arg,
    timeouts_json,
    traceback_text,
)
from fleetstore.domain.ports import StorePort
from fleetstore.models import Effect, EffectError, EffectState, NewEffect, Page

log = logger("fleetstore")

if TYPE_CHECKING:
    from fleetstore.engine.base import Tx

_STATES = tuple(s.value for s in EffectState)


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
    try:
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
                EffectError(
                    int(e["attempt"]),
                    str(e["error"]),
                    float(e["at"]),
                    e.get("owner"),
                    e.get("traceback"),
                )
                for e in json.loads(errs)
            ),
            created_at=created,
            updated_at=updated,
            started_at=started,
            finished_at=finished,
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise damaged_row("effect", eid, exc) from exc


def claimed_effect(store: StorePort, row: Sequence[Any]) -> Effect:
    """A claimed effect from its claim's row (``effect_claim``'s columns): what a
    handler and its worker need; no result and no error history (``effects.get``
    reads those), its ``last_error`` kept."""
    (
        eid,
        thread,
        seq,
        kind,
        enc,
        payload,
        sha,
        size,
        attempt,
        max_attempts,
        safe,
        available_at,
        fence,
        owner,
        expires,
        key,
        last_error,
        created,
        started,
    ) = row
    if sha is None and enc == "json" and payload.__class__ is str:
        value = json.loads(payload)  # the usual payload, decoded in place
    else:
        value = decode_value(store, enc, payload, sha, size)
    return Effect(
        eid,
        thread,
        seq,
        kind,
        value,
        EffectState.running,
        attempt,
        max_attempts,
        None if safe is None else bool(safe),
        available_at,
        fence,
        owner,
        expires,
        key,
        None,
        last_error,
        None,
        (),
        created,
        started,
        started,
        None,
    )


def claims_of(
    store: StorePort, rows: Sequence[Sequence[Any]], owner: str, lease: float
) -> builtins.list[Claim]:
    """The claims of *rows* (``effect_claim``'s columns), decoded after the claim
    committed.  An effect whose stored payload does not decode (its blob file lost or
    damaged, a row another program edited) goes ``dead`` at once with the reason: raised
    here, it failed the whole call after its claims were taken, and each later claim took
    it again when its lease ran out, with the effects claimed beside it."""
    claims: builtins.list[Claim] = []
    for row in rows:
        try:
            effect = claimed_effect(store, row)
        except (errors.CorruptStore, ValueError, TypeError) as exc:
            damaged = damaged_row("effect", row[0], exc)
            log.error("effect %s goes dead: %s", row[0], damaged)
            stand_in = claimed_effect(store, (*row[:4], "json", "null", None, 0, *row[8:]))
            with contextlib.suppress(errors.FleetstoreError):  # else swept at the lease's end
                Claim(store, stand_in, owner, lease).fail(f"{type(damaged).__name__}: {damaged}")
            continue
        claims.append(Claim(store, effect, owner, lease))
    return claims


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
        "replay_safe": None if replay_safe is None else replay_safe_arg(replay_safe),
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
    if telemetry.ACTIVE is not None:
        carry_trace(store, args)
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
        self._store.outbox_metrics.enqueued += len(self._items)
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


class Chain:
    """Settle-and-claim: what a worker asks of a batch of its settlements
    (``Effects._settle_batch``): each thread a settlement hands on to an effect that can
    run now (pending, available, of *kinds*) has it claimed for *owner* in the same
    transaction, at most *limit* of them (the worker's free slots), as ``claim_effects``
    would (*lease*; *timeouts* as their JSON text).  Afterwards ``claimed`` holds them;
    ``unknown`` says the settlement's answer was not had (spooled, or the read of its
    claims failed): the worker looks for them by ``op_id`` once it has landed
    (``Effects._chained``), or their lease runs out."""

    __slots__ = ("claimed", "kinds", "lease", "limit", "op_id", "owner", "timeouts", "unknown")

    def __init__(
        self, owner: str, limit: int, lease: float, kinds: str | None, timeouts: str | None
    ) -> None:
        self.owner = owner
        self.limit = limit
        self.lease = lease
        self.kinds = kinds
        self.timeouts = timeouts
        self.op_id: str | None = None
        self.claimed: builtins.list[Claim] = []
        self.unknown = False

    def args(self, op_id: str, until: float) -> dict[str, Any]:
        """``settle_effects``'s ``chain`` argument: claim as *op_id*, not after *until*
        (a settlement replayed from the spool after the worker stopped waiting for its
        answer claims nothing: the thread is rung for instead)."""
        return {
            "claim_op": op_id,
            "owner": self.owner,
            "limit": self.limit,
            "lease": self.lease,
            "kinds": self.kinds,
            "timeouts": self.timeouts,
            "until": until,
        }


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
        if telemetry.ACTIVE is not None:
            carry_trace(store, args)
        result = store.submit(Operation("enqueue_effect", args, op_id, True))
        store.outbox_metrics.enqueued += 1  # (under the GIL, no lock: OutboxMetrics)
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

    def wake_token(self) -> int:
        """The token of ``wait_for_work``: take it *before* looking for work, so that an
        effect that becomes claimable between the look and the wait is not missed."""
        return self._store.notify_token(CHANNEL)

    def wait_for_work(self, timeout: float, *, token: int | None = None) -> bool:
        """Wait up to *timeout* seconds for an effect to become claimable, in any
        process: enqueued, handed on by its thread's head, retried, swept (a ring
        after the commit that did it).  *token* (``wake_token``): a ring since it
        ends the wait at once.  True if woken; a wake-up is a hint, look again.
        Where nothing can be heard (no futex on this machine) it waits the timeout."""
        check_timeout(timeout)
        return bool(self._store.notify_wait(CHANNEL, timeout, token))

    def next_ready(self, kinds: Iterable[str] | None = None) -> float | None:
        """When the next claimable effect (of *kinds*) becomes available: a time
        (maybe past: claim now), or None if no thread has a pending head."""
        return self._next_ready(kinds_json(kinds))

    def _next_ready(self, kinds: str | None) -> float | None:
        """``next_ready`` with *kinds* as its JSON text (a worker makes it once)."""
        sql = self._store.queries["effect_next_ready"]
        params = {"kinds": kinds}
        rows = self._store.read(lambda tx: tx.execute(sql, params))
        value = rows[0][0] if rows else None
        return None if value is None else float(value)

    def active(self, kinds: Iterable[str] | None = None) -> int:
        """How many effects (of *kinds*) are pending or running."""
        q = self._store.queries
        params = {"kinds": kinds_json(kinds)}
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
        return self._claim(owner, limit, lease, kinds_json(kinds), timeouts_json(timeouts))

    def _claim(
        self, owner: str, limit: int, lease: float, kinds: str | None, timeouts: str | None
    ) -> builtins.list[Claim]:
        """``claim`` with its arguments checked, *kinds* and *timeouts* as their JSON
        text (a worker makes them once)."""
        store = self._store
        op_id = new_id()
        op = Operation(
            "claim_effects",
            {
                "owner": owner,
                "limit": limit,
                "lease": lease,
                "kinds": kinds,
                "timeouts": timeouts,
                "claim_op": op_id,
            },
            op_id,
            True,
        )
        result = store.submit(op, Delivery.INDEPENDENT)
        assert result is not None  # independent operations are never spooled
        claims = claims_of(store, result["rows"], owner, lease)
        if claims:
            store.outbox_metrics.record_claims(claims)
        return claims

    def _settle_batch(
        self,
        claims: Sequence[Claim],
        items: Sequence[dict[str, Any]],
        chain: Chain | None = None,
    ) -> builtins.list[str | errors.FleetstoreError] | None:
        """Settle *claims* with their *items* (``Claim._success`` and its siblings) as
        one logged operation that must land (``settle_effects``): per claim, the
        effect's new state once applied (``"applied"`` where a replay cannot tell), or
        the error that refused it alone (``LeaseLost``, ``NotFound``);
        None if the batch went to the spool (past the write budget, even with
        ``on_busy="raise"``: it lands later, and the caller keeps the leases alive).
        *chain*: settle-and-claim (``Chain``): the threads handed on to an effect that
        can run now have it claimed in the same transaction; ``chain.claimed`` holds
        those claims afterwards."""
        if not 1 <= len(items) <= MAX_SETTLE_BATCH or len(claims) != len(items):
            raise errors.InvalidInput(f"a batch settles 1 to {MAX_SETTLE_BATCH} claims")
        op_id = new_id()
        args: dict[str, Any] = {"items": list(items)}
        if chain is not None:
            chain.op_id = op_id
            args["chain"] = chain.args(op_id, time.time() + self._store.settings.write_budget)
        op = Operation("settle_effects", args, op_id, True)
        for claim, item in zip(claims, items, strict=True):
            claim.outcome = item["outcome"]
        result = self._store.submit(op, Delivery.MUST_LAND)
        # Counted by what the store answered where it did: a retry that spent the last
        # attempt is "dead" (the dead-effects alert missed it), a refused one is none.
        settled = self._store.outbox_metrics.settled
        states = None if result is None else result.get("states")
        if not isinstance(states, str) or len(states) != len(items):
            for item in items:
                settled[item["outcome"]] += 1
        if result is None:
            if chain is not None:
                chain.unknown = True  # the spool applies it: look for its claims then
            return None
        if chain is not None and result.get("chained", 1):
            # (1: a duplicate whose result was not kept may have claimed some.)
            try:
                chain.claimed = self._chained(op_id, chain.owner, chain.lease)
            except errors.FleetstoreError:
                chain.unknown = True
        if not isinstance(states, str) or len(states) != len(items):
            # A duplicate whose result was too long to keep: it was applied, each
            # settlement as its token allowed, and what became of each is not known.
            return ["applied"] * len(items)
        refused = result.get("refused") or {}
        outcome: builtins.list[str | errors.FleetstoreError] = []
        for code, item, claim in zip(states, items, claims, strict=True):
            if code == "x":
                outcome.append(errors.from_wire(refused.get(item["id"])))
                continue
            state, dead_reason = STATE_OF_CODE.get(code, ("applied", None))
            claim._answer = {"state": state, "dead_reason": dead_reason}  # (``settled``)
            settled["dead" if state == "dead" else item["outcome"]] += 1
            outcome.append(state)
        return outcome

    def _chained(self, op_id: str, owner: str, lease: float) -> builtins.list[Claim]:
        """The claims that the settlement *op_id* made for its worker (settle-and-claim)
        and that are still its: running under the token that settlement gave them."""
        store = self._store
        sql = store.queries["effect_claimed_by"]
        rows = store.read(lambda tx: tx.execute(sql, (op_id,)))
        claims = claims_of(store, rows, owner, lease)
        for claim in claims:
            claim.chained = True
        return claims

    def sweep(self) -> builtins.list[Swept]:
        """Take effects whose lease expired from their lost owners: back to
        ``pending`` (replay-safe, attempts left) or to ``dead`` with the reason."""
        op = Operation("sweep_effects", {}, new_id(), True)
        result = self._store.submit(op, Delivery.INDEPENDENT)
        assert result is not None
        swept = [Swept(eid, EffectState(state)) for eid, state in result["swept"]]
        if swept:  # (an effect a sweep buried is dead as much as one settled so)
            dead = sum(s.state is EffectState.dead for s in swept)
            self._store.outbox_metrics.settled["dead"] += dead
        return swept

    def retry(self, effect_id: str) -> Effect:
        """Run a dead or cancelled effect again (at the end of its thread, with
        fresh attempts), or a pending one now."""
        check_id(effect_id, "effect_id")
        self._store.submit(
            Operation("retry_effect", {"id": effect_id}, new_id(), True), Delivery.NOW
        )
        return self.get(effect_id)

    def cancel(self, effect_id: str) -> Effect:
        """Cancel a pending or running effect; its thread moves on."""
        check_id(effect_id, "effect_id")
        self._store.submit(
            Operation("cancel_effect", {"id": effect_id}, new_id(), True), Delivery.NOW
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
        self._store.submit(op, Delivery.INDEPENDENT)

    def kinds(self) -> dict[str, bool]:
        """The declared kinds and whether each is replay-safe."""
        q = self._store.queries
        rows = self._store.read(lambda tx: tx.execute(q["effect_kinds"]))
        return {kind: bool(safe) for kind, safe, _at in rows}


def _failure_args(traceback: object, max_attempts: object) -> dict[str, Any]:
    """A failed attempt's optional ``settle_effect`` arguments, checked (and left out
    when not given: the operation stays as small as before)."""
    args: dict[str, Any] = {}
    if traceback is not None:
        args["traceback"] = traceback_text(traceback)
    if max_attempts is not None:
        check_int(max_attempts, "max_attempts", minimum=1, maximum=MAX_ATTEMPTS_LIMIT)
        args["max_attempts"] = max_attempts
    return args


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
        #: The store's answer to the settlement (``settled``, ``dead_reason``).
        self._answer: dict[str, Any] | None = None
        #: Claimed by its predecessor's settlement (settle-and-claim): its thread had
        #: this effect waiting, and likely has more (``Completer``: no lingering).
        self.chained = False

    @property
    def id(self) -> str:
        return self.effect.id

    @property
    def fence(self) -> int:
        return self.effect.fence

    @property
    def settled(self) -> EffectState | None:
        """The state the settlement left the effect in, as the store answered (``None``
        before, and while the settlement waits in the spool): a retry on the last
        attempt is ``dead``, not ``pending``."""
        state = None if self._answer is None else self._answer.get("state")
        return EffectState(state) if state in _STATES else None

    @property
    def dead_reason(self) -> str | None:
        """Why, when ``settled`` is ``dead`` (``attempts_exhausted``, ``failed``...)."""
        return None if self._answer is None else self._answer.get("dead_reason")

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
            Operation("heartbeat_effect", args, new_id(), True), Delivery.INDEPENDENT
        )
        assert result is not None
        self.lease_expires_at = float(result["lease_expires_at"])
        return self.lease_expires_at

    def succeed(self, result: Any = None) -> bool:
        """Done: keep *result* (JSON, at most 1 MiB).  True once applied, False if
        spooled (applied in order once the store is writable again)."""
        return self._settle(self._success(result))

    def retry(
        self,
        delay: float = 0.0,
        error: str = "",
        *,
        traceback: str | None = None,
        max_attempts: int | None = None,
    ) -> bool:
        """Failed this time: run again after *delay* seconds (``dead`` with
        ``attempts_exhausted`` if this was the last attempt: the effect's
        ``max_attempts``, or *max_attempts* if lower).  *traceback* is kept with
        the error (its last 8 KiB)."""
        return self._settle(self._retry(delay, error, traceback, max_attempts))

    def fail(self, error: str, *, interrupted: bool = False, traceback: str | None = None) -> bool:
        """Failed for good: ``dead`` (``dead_reason`` ``failed``, or ``interrupted``
        for a run that was cut short, e.g. by a worker's hard stop); the thread moves
        on.  *traceback* is kept with the error (its last 8 KiB)."""
        return self._settle(self._failure(error, interrupted, traceback))

    def cancel(self) -> bool:
        """Not needed any more: ``cancelled``; the thread moves on."""
        return self._settle(self._item("cancelled"))

    def release(self) -> bool:
        """Never started: back to ``pending`` without spending the attempt."""
        return self._settle(self._item("release"))

    def timed_out(self, error: str, delay: float = 0.0, *, max_attempts: int | None = None) -> bool:
        """The handler ran past its time and may still be running (a thread cannot
        be stopped): a failed attempt.  A replay-safe effect runs again after
        *delay* seconds (``dead``, ``attempts_exhausted``, if this was its last
        attempt, as ``retry`` counts them); one that may not run twice is ``dead``
        (``timed_out``).  The token is raised either way: anything settled with this
        claim's token later, by anyone, raises ``LeaseLost`` and changes nothing."""
        return self._settle(self._timed_out(error, delay, max_attempts))

    def _late_success(self, result: Any) -> bool:
        """For a worker: the result of a handler it gave up on, offered with this
        claim's token (which the store refuses once it was raised: ``LeaseLost``).
        Never spooled: past the write budget ``StoreBusy``."""
        return self._settle(self._success(result), Delivery.NOW)

    # Each settlement as the item ``settle_one`` reads, every argument checked here
    # (the operation is trusted): ``_settle`` submits one, a worker batches them
    # (``Effects._settle_batch``).

    def _success(self, result: Any) -> dict[str, Any]:
        # Redacted here, the one entry of every settlement, one or batched (settle_effects).
        text = (
            None if result is None else redact_json(self._store, dump_json(result, "effect result"))
        )
        if text is not None and len(text) * 4 > MAX_RESULT and len(text.encode()) > MAX_RESULT:
            raise errors.InvalidInput("an effect result is kept inline: at most 1 MiB of JSON")
        return self._item("succeeded", result=text)

    def _retry(
        self,
        delay: float,
        error: str,
        traceback: str | None = None,
        max_attempts: int | None = None,
    ) -> dict[str, Any]:
        if delay.__class__ is not float or not 0.0 <= delay <= MAX_DELAY:
            check_number(delay, "delay", minimum=0.0, maximum=MAX_DELAY)
        if error is not None and not isinstance(error, str):
            raise errors.InvalidInput(f"error must be a string, not {type(error).__name__}")
        store = self._store
        return self._item(
            "retry",
            error=error_text(redact_text(store, error or "retry requested")),
            delay=delay,
            **_failure_args(redact_text(store, traceback), max_attempts),
        )

    def _failure(
        self, error: str, interrupted: bool = False, traceback: str | None = None
    ) -> dict[str, Any]:
        check_bool(interrupted, "interrupted")
        reason = "interrupted" if interrupted else "failed"
        store = self._store
        return self._item(
            "dead",
            error=error_text(redact_text(store, error)),
            dead_reason=reason,
            **_failure_args(redact_text(store, traceback), None),
        )

    def _timed_out(
        self, error: str, delay: float, max_attempts: int | None = None
    ) -> dict[str, Any]:
        check_number(delay, "delay", minimum=0.0, maximum=MAX_DELAY)
        return self._item(
            "timed_out",
            error=error_text(redact_text(self._store, error)),
            delay=delay,
            **_failure_args(None, max_attempts),
        )

    def _item(
        self,
        outcome: str,
        *,
        result: str | None = None,
        error: str | None = None,
        delay: float = 0.0,
        dead_reason: str = "failed",
        traceback: str | None = None,
        max_attempts: int | None = None,
    ) -> dict[str, Any]:
        if self.outcome is not None:
            raise errors.InvalidInput(f"effect {self.id}: this claim was settled ({self.outcome})")
        effect = self.effect
        return {
            "id": effect.id,
            "fence": effect.fence,
            "outcome": outcome,
            "result": result,
            "error": error,
            "delay": float(delay),
            "dead_reason": dead_reason,
            "traceback": traceback,
            "max_attempts": max_attempts,
        }

    def _settle(self, item: dict[str, Any], delivery: Delivery = Delivery.MUST_LAND) -> bool:
        applied = self._store.submit(Operation("settle_effect", item, new_id(), True), delivery)
        self.outcome = item["outcome"]
        self._answer = applied  # read by ``settled`` when asked: nothing on the hot path
        dead = applied is not None and applied.get("state") == "dead"
        self._store.outbox_metrics.settled["dead" if dead else item["outcome"]] += 1
        return applied is not None

    def __repr__(self) -> str:
        return (
            f"<Claim {self.effect.kind} {self.id} thread={self.effect.thread_key!r} "
            f"attempt={self.effect.attempt} token={self.fence}>"
        )


__all__ = [
    "Chain",
    "DEFAULT_LEASE",
    "DEFAULT_MAX_ATTEMPTS",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_TRACEBACK",
    "MAX_CLAIM",
    "MAX_KIND",
    "MAX_LEASE",
    "Claim",
    "Effects",
    "PreparedEffects",
    "Swept",
    "claimed_effect",
    "effect_from_row",
    "effects_args",
    "prepare_effects",
]
