"""The outbox contract: enqueue, per-thread order, leases and fencing, settlement, sweep,
the transactional outbox, operator actions, the in-process Worker and the CLI.

Stores come from the ``store`` / ``open_store`` fixtures (conftest.py), so the suite runs
unchanged on every engine.  The multi-process tests (kill -9, 8 workers, signals, an
outside lock) are in test_outbox_fleet.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore import (
    Effect,
    EffectState,
    FailEffect,
    Handler,
    NewEffect,
    RetryEffect,
    Store,
    Worker,
    errors,
)
from fleetstore.core.ids import new_id
from fleetstore.domain.outbox import Chain
from fleetstore.domain.outbox_ops import kinds_json, timeouts_json
from tests.fix_procs import Spawn, start_lock
from tests.fix_stores import OpenStore, read_everywhere


def rows(store: Store, sql: str = "SELECT count(*) FROM effects") -> Any:
    return store.read(lambda tx: tx.execute(sql))


def n_effects(store: Store) -> int:
    return int(rows(store)[0][0])


def claim_one(store: Store, owner: str = "w", **kw: Any) -> fleetstore.Claim:
    claims = store.effects.claim(owner, **kw)
    assert len(claims) == 1, claims
    return claims[0]


def expire(store: Store, effect_id: str) -> None:
    """Make a running effect's lease run out now (as if its worker vanished)."""
    with store.db.write() as tx:
        tx.execute("UPDATE effects SET lease_expires_at = 0 WHERE id = ?", (effect_id,))


# -- enqueue ------------------------------------------------------------------------------------


def test_enqueue_stores_payload_json_bytes_and_large_as_blob(store: Store) -> None:
    a = store.effects.enqueue("t", "k", {"x": [1, 2]})
    b = store.effects.enqueue("t", "k", b"\x00\xff")
    big = "y" * (store.settings.blob_threshold + 10)
    c = store.effects.enqueue("t", "k", {"big": big})
    assert store.effects.get(a).payload == {"x": [1, 2]}
    assert store.effects.get(b).payload == b"\x00\xff"
    assert store.effects.get(c).payload == {"big": big}
    assert rows(store, "SELECT count(*) FROM effects WHERE blob_sha IS NOT NULL")[0][0] == 1
    got = store.effects.get(a)
    assert (got.state, got.seq, got.attempt, got.max_attempts) == ("pending", 1, 0, 5)
    assert [e.seq for e in store.effects.list(thread_key="t")] == [1, 2, 3]


def test_repeated_idempotency_key_enqueues_nothing_new(store: Store) -> None:
    first = store.effects.enqueue("t", "title", {"n": 1}, idempotency_key="turn-7")
    again = store.effects.enqueue("t", "title", {"n": 2}, idempotency_key="turn-7")
    assert again == first
    assert n_effects(store) == 1
    assert store.effects.get(first).payload == {"n": 1}
    with pytest.raises(errors.AlreadyExists):
        store.effects.enqueue("other-thread", "title", idempotency_key="turn-7")
    assert n_effects(store) == 1


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("", "k"), {}),
        (("t", ""), {}),
        (("t", 7), {}),
        (("t", "k", {"x": object()}), {}),
        (("t", "k", {"x": float("nan")}), {}),
        (("t", "k"), {"delay": -1}),
        (("t", "k"), {"delay": float("inf")}),
        (("t", "k"), {"max_attempts": 0}),
        (("t", "k"), {"max_attempts": True}),
        (("t", "k"), {"replay_safe": "yes"}),
        (("t", "k"), {"idempotency_key": ""}),
        (("t" * 2000, "k"), {}),
    ],
)
def test_bad_enqueue_raises_invalid_input_and_writes_nothing(
    store: Store, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    with pytest.raises(errors.InvalidInput):
        store.effects.enqueue(*args, **kwargs)
    assert n_effects(store) == 0


def test_bad_operation_arguments_from_a_journal_are_refused_inside_the_transaction(
    store: Store,
) -> None:
    good = {
        "id": new_id(),
        "thread_key": "t",
        "kind": "k",
        "payload": {"enc": "json", "body": "1"},
    }
    for bad in (
        {**good, "payload": {"enc": "str", "body": "x"}},
        {**good, "payload": {"enc": "json", "body": "{"}},
        {**good, "id": "a/b"},
        {**good, "max_attempts": -3},
    ):
        with pytest.raises(errors.InvalidInput):
            store.apply(fleetstore.Operation("enqueue_effect", bad, new_id()))
    settle = {"id": new_id(), "fence": 1, "outcome": "explode"}
    with pytest.raises(errors.InvalidInput):
        store.apply(fleetstore.Operation("settle_effect", settle, new_id()))
    assert n_effects(store) == 0


# -- claims and per-thread order ------------------------------------------------------------------


def test_only_the_head_of_each_thread_is_claimed(store: Store) -> None:
    for thread in ("a", "b", "c"):
        for i in range(3):
            store.effects.enqueue(thread, "k", {"i": i})
    claims = store.effects.claim("w", limit=10)
    assert sorted((c.effect.thread_key, c.effect.seq) for c in claims) == [
        ("a", 1),
        ("b", 1),
        ("c", 1),
    ]
    assert all(c.effect.attempt == 1 and c.effect.state == "running" for c in claims)
    assert store.effects.claim("w2", limit=10) == []
    claims[0].succeed()
    (nxt,) = store.effects.claim("w2", limit=10)
    assert (nxt.effect.thread_key, nxt.effect.seq) == (claims[0].effect.thread_key, 2)


def test_the_database_refuses_two_running_or_two_heads_in_a_thread(store: Store) -> None:
    store.effects.enqueue("t", "k")
    store.effects.enqueue("t", "k")
    claim_one(store)
    with pytest.raises(errors.IntegrityError), store.db.write() as tx:
        tx.execute("UPDATE effects SET state = 'running', lease_owner = 'rogue' WHERE seq = 2")
    with pytest.raises(errors.IntegrityError), store.db.write() as tx:
        tx.execute("UPDATE effects SET is_head = 1 WHERE seq = 2")
    assert [e.state for e in store.effects.list()] == ["running", "pending"]


def test_kinds_filter_claims(store: Store) -> None:
    store.effects.enqueue("t1", "mail")
    store.effects.enqueue("t2", "title")
    (c,) = store.effects.claim("w", limit=5, kinds=["title"])
    assert c.effect.kind == "title"
    assert store.effects.next_ready(["title"]) is None
    assert store.effects.next_ready(["mail"]) is not None


def test_a_delayed_effect_waits_and_next_ready_says_when(store: Store) -> None:
    before = time.time()
    store.effects.enqueue("t", "k", delay=30)
    assert store.effects.claim("w") == []
    ready = store.effects.next_ready()
    assert ready is not None and before + 30 <= ready <= time.time() + 30


def test_a_retried_effect_is_not_overtaken_by_a_newer_one_of_its_thread(store: Store) -> None:
    first = store.effects.enqueue("t", "k", {"n": 1})
    store.effects.enqueue("t", "k", {"n": 2})
    claim_one(store).retry(delay=60, error="provider 429")
    assert store.effects.claim("w", limit=10) == []  # seq 2 waits behind the retry
    got = store.effects.get(first)
    assert (got.state, got.attempt, got.last_error) == ("pending", 1, "provider 429")
    assert got.errors[0].attempt == 1 and got.errors[0].owner == "w"


def test_attempts_run_out_to_dead_and_the_thread_moves_on(store: Store) -> None:
    first = store.effects.enqueue("t", "k", max_attempts=2)
    second = store.effects.enqueue("t", "k")
    claim_one(store).retry(0, "e1")
    claim_one(store).retry(0, "e2")
    dead = store.effects.get(first)
    assert (dead.state, dead.dead_reason, dead.attempt) == ("dead", "attempts_exhausted", 2)
    assert [e.error for e in dead.errors] == ["e1", "e2"]
    assert claim_one(store).id == second


def test_settlements_fail_cancel_release_succeed(store: Store) -> None:
    ids = [store.effects.enqueue(f"t{i}", "k") for i in range(4)]
    claims = {c.id: c for c in store.effects.claim("w", limit=4)}
    assert claims[ids[0]].fail("bad request") is True
    assert claims[ids[1]].cancel() is True
    assert claims[ids[2]].release() is True
    assert claims[ids[3]].succeed({"title": "Fix the flaky test"}) is True
    got = [store.effects.get(i) for i in ids]
    assert [(g.state, g.dead_reason) for g in got] == [
        ("dead", "failed"),
        ("cancelled", None),
        ("pending", None),
        ("succeeded", None),
    ]
    assert got[2].attempt == 0  # released: the attempt was not spent
    assert got[3].result == {"title": "Fix the flaky test"}
    with pytest.raises(errors.InvalidInput):
        claims[ids[3]].succeed()  # a claim settles once


def test_a_result_that_cannot_be_stored_is_refused_and_the_claim_still_holds(
    store: Store,
) -> None:
    store.effects.enqueue("t", "k")
    c = claim_one(store)
    with pytest.raises(errors.InvalidInput):
        c.succeed({"x": object()})
    with pytest.raises(errors.InvalidInput):
        c.succeed("z" * (1024 * 1024 + 1))
    assert store.effects.get(c.id).state == "running"
    assert c.succeed("ok") is True


# -- leases, fencing, sweeps ----------------------------------------------------------------------


def test_heartbeat_extends_the_lease(store: Store) -> None:
    store.effects.enqueue("t", "k")
    c = claim_one(store, lease=5)
    first = store.effects.get(c.id).lease_expires_at
    assert first is not None
    new = c.heartbeat(lease=100)
    assert new > first + 90
    assert store.effects.get(c.id).lease_expires_at == new


def test_sweep_returns_expired_replay_safe_effects_to_pending_keeping_order(
    store: Store,
) -> None:
    first = store.effects.enqueue("t", "k")
    store.effects.enqueue("t", "k")
    stale = claim_one(store, owner="lost")
    other = store.effects.enqueue("u", "k")
    live = claim_one(store, owner="alive", lease=600)
    assert live.id == other
    expire(store, stale.id)
    assert store.effects.counts()["expired"] == 1
    swept = store.effects.sweep()
    assert [(s.id, s.state) for s in swept] == [(first, EffectState.pending)]
    got = store.effects.get(first)
    assert (got.state, got.attempt) == ("pending", 1)
    assert "lost" in (got.last_error or "") and got.errors[-1].owner == "lost"
    assert store.effects.get(other).state == "running"  # an unexpired lease is left alone
    again = claim_one(store, owner="new")
    assert (again.id, again.effect.attempt, again.fence) == (first, 2, stale.fence + 1)
    assert store.effects.sweep() == []


def test_a_stale_worker_gets_lease_lost_and_the_newer_outcome_stands(store: Store) -> None:
    store.effects.enqueue("t", "k")
    stale = claim_one(store, owner="old")
    expire(store, stale.id)
    store.effects.sweep()
    fresh = claim_one(store, owner="new")
    fresh.succeed({"by": "new"})
    before = rows(store, "SELECT * FROM effects")
    for settle in (
        lambda: stale.succeed({"by": "old"}),
        lambda: stale.retry(0, "x"),
        lambda: stale.fail("x"),
        stale.cancel,
        stale.release,
        stale.heartbeat,
    ):
        with pytest.raises(errors.LeaseLost) as caught:
            settle()
        assert caught.value.effect_id == stale.id
        assert caught.value.state == "succeeded"
    assert rows(store, "SELECT * FROM effects") == before
    assert store.effects.get(stale.id).result == {"by": "new"}


def test_a_swept_owner_takes_its_effect_back_until_someone_else_claims_it(store: Store) -> None:
    first = store.effects.enqueue("t", "k")
    c = claim_one(store, owner="slow")
    expire(store, c.id)
    assert [s.state for s in store.effects.sweep()] == ["pending"]
    c.heartbeat()  # the owner was alive after all: it is running again, its lease renewed
    got = store.effects.get(first)
    assert (got.state, got.lease_owner, got.attempt) == ("running", "slow", 1)
    assert store.effects.claim("other") == []
    assert c.succeed("done") is True
    assert store.effects.get(first).result == "done"


def test_a_late_success_lands_on_an_effect_the_sweep_buried(store: Store) -> None:
    buried = store.effects.enqueue("t", "k", replay_safe=False)
    nxt = store.effects.enqueue("t", "k")
    c = claim_one(store)
    expire(store, c.id)
    store.effects.sweep()
    with pytest.raises(errors.LeaseLost):
        c.heartbeat()  # dead: not taken back (the thread has moved on)
    running = claim_one(store, owner="next")
    assert running.id == nxt
    assert c.succeed({"ok": 1}) is True  # but what it did is recorded
    got = store.effects.get(buried)
    assert (got.state, got.result, got.dead_reason) == ("succeeded", {"ok": 1}, None)
    assert store.effects.get(nxt).state == "running"  # the thread's head is untouched
    running.succeed()


def stale_copy(claim: fleetstore.Claim) -> fleetstore.Claim:
    """The claim as the abandoned attempt still holds it: its token, unsettled."""
    return fleetstore.Claim(claim._store, claim.effect, claim.owner, claim.lease)


def test_a_timed_out_attempt_runs_again_and_its_claim_settles_nothing_after(
    store: Store,
) -> None:
    eid = store.effects.enqueue("t", "k")
    nxt = store.effects.enqueue("t", "k")
    c = claim_one(store, timeouts={"k": 30, "other": 5})
    ((span,),) = rows(store, f"SELECT deadline - started_at FROM effects WHERE id = '{eid}'")
    assert span == pytest.approx(30)
    assert c.timed_out("the handler hung", delay=0) is True
    got = store.effects.get(eid)
    assert (got.state, got.attempt, got.fence, got.last_error) == (
        "pending",
        1,
        c.fence + 1,
        "the handler hung",
    )
    late = stale_copy(c)
    for settle in (late.heartbeat, lambda: late.succeed({"late": True})):
        with pytest.raises(errors.LeaseLost) as caught:
            settle()  # pending under a newer token: not taken back
        assert caught.value.state == "pending"
    again = claim_one(store)  # still its thread's head: the next effect waits
    assert (again.id, again.effect.attempt) == (eid, 2)
    ((deadline,),) = rows(store, f"SELECT deadline FROM effects WHERE id = '{eid}'")
    assert deadline is None  # claimed without timeouts: no deadline for this attempt
    with pytest.raises(errors.LeaseLost) as caught:
        stale_copy(c).succeed({"late": True})
    assert caught.value.state == "running"
    again.succeed({"by": 2})
    assert store.effects.get(eid).result == {"by": 2}
    assert claim_one(store).id == nxt


def test_a_timed_out_attempt_that_must_not_run_twice_is_buried_and_stays_so(
    store: Store,
) -> None:
    """Not replay-safe: ``dead`` (``timed_out``); on its last attempt: ``dead``
    (``attempts_exhausted``); buried by a sweep meanwhile: left so.  In each case the
    token is raised, so the late success of the abandoned handler lands nowhere (a
    late success lands on an effect a sweep buried, and on one a retry ran out of
    attempts: not after a timeout)."""
    store.effects.declare({"turn": False})
    unsafe = store.effects.enqueue("u", "turn")
    after = store.effects.enqueue("u", "k")
    spent = store.effects.enqueue("l", "k", max_attempts=1)
    swept = store.effects.enqueue("s", "turn")
    claims = {c.id: c for c in store.effects.claim("w", limit=10)}
    assert set(claims) == {unsafe, spent, swept}
    expire(store, swept)
    assert [str(s.state) for s in store.effects.sweep()] == ["dead"]
    for eid, reason in ((unsafe, "timed_out"), (spent, "attempts_exhausted"), (swept, None)):
        assert claims[eid].timed_out("hung") is True
        got = store.effects.get(eid)
        assert got.state == "dead"
        assert got.dead_reason == (reason or "not_replay_safe")
        with pytest.raises(errors.LeaseLost):
            stale_copy(claims[eid]).succeed({"late": True})
        assert store.effects.get(eid).state == "dead"
    assert claim_one(store).id == after  # the thread went on


def test_a_retry_or_release_ends_the_claim(store: Store) -> None:
    store.effects.enqueue("t", "k")
    c = claim_one(store)
    c.retry(0, "again")
    with pytest.raises(errors.LeaseLost):
        c.heartbeat()  # pending under a new token: not this claim's any more
    assert store.effects.get(c.id).state == "pending"


def test_not_replay_safe_effects_lost_mid_run_go_dead_and_the_thread_continues(
    store: Store,
) -> None:
    store.effects.declare({"provider.turn": False})
    assert store.effects.kinds() == {"provider.turn": False}
    turn = store.effects.enqueue("t", "provider.turn")
    after = store.effects.enqueue("t", "title")
    row_flag = store.effects.enqueue("u", "title", replay_safe=False)
    exhausted = store.effects.enqueue("v", "title", max_attempts=1)
    for c in store.effects.claim("w", limit=10):
        expire(store, c.id)
    result = {s.id: s.state for s in store.effects.sweep()}
    assert result == {turn: "dead", row_flag: "dead", exhausted: "dead"}
    assert store.effects.get(turn).dead_reason == "not_replay_safe"
    assert store.effects.get(row_flag).dead_reason == "not_replay_safe"
    assert store.effects.get(exhausted).dead_reason == "attempts_exhausted"
    assert "not replay-safe" in (store.effects.get(turn).last_error or "")
    assert claim_one(store).id == after  # the documented rule: the thread moves on


def test_sweeps_keep_the_last_20_errors_like_settlements(store: Store) -> None:
    eid = store.effects.enqueue("t", "k", max_attempts=30)
    for _ in range(25):
        expire(store, claim_one(store).id)
        store.effects.sweep()
    got = store.effects.get(eid)
    assert (got.state, got.attempt) == ("pending", 25)
    assert [e.attempt for e in got.errors] == list(range(6, 26))


def test_a_declared_replay_safe_kind_can_be_overridden_per_effect(store: Store) -> None:
    store.effects.declare({"k": True})
    e = store.effects.enqueue("t", "k", replay_safe=False)
    expire(store, claim_one(store).id)
    assert [(s.id, s.state) for s in store.effects.sweep()] == [(e, "dead")]


# -- operator actions -----------------------------------------------------------------------------


def test_operator_retry_requeues_a_dead_effect_at_the_end_of_its_thread(store: Store) -> None:
    dead = store.effects.enqueue("t", "k")
    claim_one(store).fail("broken")
    later = store.effects.enqueue("t", "k")
    again = store.effects.retry(dead)
    assert (again.state, again.attempt, again.seq) == ("pending", 0, 3)
    assert claim_one(store).id == later
    with pytest.raises(errors.InvalidInput):
        store.effects.retry(later)  # running
    with pytest.raises(errors.NotFound):
        store.effects.retry(new_id())


def test_operator_cancel_of_a_running_effect_fences_its_worker(store: Store) -> None:
    running = store.effects.enqueue("t", "k")
    nxt = store.effects.enqueue("t", "k")
    c = claim_one(store)
    assert store.effects.cancel(running).state == "cancelled"
    with pytest.raises(errors.LeaseLost):
        c.heartbeat()
    with pytest.raises(errors.LeaseLost):
        c.succeed()
    assert store.effects.get(running).state == "cancelled"
    assert claim_one(store).id == nxt
    done = _succeeded(store)
    with pytest.raises(errors.InvalidInput):
        store.effects.cancel(done)
    assert store.effects.get(done).state == "succeeded"


def _succeeded(store: Store) -> str:
    eid = store.effects.enqueue("done-thread", "k")
    claim_one(store, kinds=["k"]).succeed()
    return eid


def test_counts_and_list_filters_and_paging(store: Store) -> None:
    for i in range(5):
        store.effects.enqueue(f"t{i % 2}", "a" if i < 3 else "b")
    counts = store.effects.counts()
    assert counts == {
        "pending": 5,
        "running": 0,
        "succeeded": 0,
        "dead": 0,
        "cancelled": 0,
        "expired": 0,
    }
    assert len(store.effects.list(kind="b")) == 2
    page1 = store.effects.list(limit=2)
    page2 = store.effects.list(limit=2, after=page1[-1])
    page3 = store.effects.list(limit=2, after=page2[-1])
    seen = [(e.thread_key, e.seq) for e in page1 + page2 + page3]
    assert seen == sorted(seen) and len(set(seen)) == 5
    with pytest.raises(errors.InvalidInput):
        store.effects.list(state="lost")


# -- the transactional outbox ---------------------------------------------------------------------


def test_effects_commit_with_history_writes_and_not_without_them(store: Store) -> None:
    s = store.sessions.create("chat", effects=[NewEffect(s_thread := "th", "session.created")])
    m = store.messages.append(
        s.id, "user", "hello", effects=[NewEffect(s_thread, "title.generate", {"sid": s.id})]
    )
    store.state.put(s.id, "plan", {"step": 1}, effects=[NewEffect(s_thread, "plan.changed")])
    assert [e.kind for e in store.effects.list(thread_key=s_thread)] == [
        "session.created",
        "title.generate",
        "plan.changed",
    ]
    # The write fails -> its effect is not enqueued either.
    with pytest.raises(errors.NotFound):
        store.messages.append(new_id(), "user", "x", effects=[NewEffect("lost", "k")])
    with pytest.raises(errors.VersionConflict):
        store.state.put(s.id, "plan", {}, expected_version=7, effects=[NewEffect("lost", "k")])
    # A repeated write (same message id) adds no second effect.
    store.messages.append(s.id, "user", "hello", id=m.id, effects=[NewEffect(s_thread, "dup")])
    assert store.effects.list(thread_key="lost") == []
    assert n_effects(store) == 3


def test_a_stream_enqueues_its_effects_only_when_it_completes(store: Store) -> None:
    s = store.sessions.create()
    with store.messages.stream(s.id) as reply:
        reply.text("answer")
        reply.enqueue(NewEffect("t", "title.generate", {"session": s.id}))
    with pytest.raises(RuntimeError), store.messages.stream(s.id) as broken:
        broken.enqueue(NewEffect("t", "never"))
        raise RuntimeError("model crashed")
    assert [e.kind for e in store.effects.list()] == ["title.generate"]


def test_bad_effects_on_a_history_write_write_nothing(store: Store) -> None:
    s = store.sessions.create()
    with pytest.raises(errors.InvalidInput):
        store.messages.append(s.id, "user", "x", effects=NewEffect("t", "k"))  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidInput):
        store.messages.append(s.id, "user", "x", effects=[{"thread_key": "t"}])  # type: ignore[list-item]
    with pytest.raises(errors.InvalidInput):
        store.messages.append(s.id, "user", "x", effects=[NewEffect("", "k")])
    assert store.messages.list(s.id) == [] and n_effects(store) == 0


# -- batched settlements ---------------------------------------------------------------------------


def test_a_batch_settles_each_effect_and_refuses_a_lost_lease_alone(store: Store) -> None:
    """One ``settle_effects`` operation: each settlement checks its own token; the one
    whose effect an operator cancelled under it gets ``LeaseLost`` and changes nothing,
    the others land, and each thread moves on."""
    ids = [store.effects.enqueue(f"t{i}", "k", {"i": i}) for i in range(3)]
    nexts = [store.effects.enqueue(f"t{i}", "k") for i in range(3)]
    claims = sorted(store.effects.claim("w", limit=3), key=lambda c: ids.index(c.id))
    assert [c.id for c in claims] == ids
    store.effects.cancel(ids[1])
    before = rows(store, f"SELECT * FROM effects WHERE id = '{ids[1]}'")
    items = [claims[0]._success({"ok": 0}), claims[1]._success(1), claims[2]._retry(0.0, "again")]
    outcome = store.effects._settle_batch(claims, items)
    assert outcome is not None
    assert outcome[0] == "succeeded" and outcome[2] == "pending", outcome
    assert isinstance(outcome[1], errors.LeaseLost), outcome
    assert (outcome[1].effect_id, outcome[1].state) == (ids[1], "cancelled")
    assert rows(store, f"SELECT * FROM effects WHERE id = '{ids[1]}'") == before
    got = [store.effects.get(i) for i in ids]
    assert [g.state for g in got] == ["succeeded", "cancelled", "pending"]
    assert got[0].result == {"ok": 0} and got[2].last_error == "again"
    # Threads 0 and 1 moved on; thread 2's retried effect is still its head.
    claimed = {c.id for c in store.effects.claim("w", limit=10)}
    assert claimed == {nexts[0], nexts[1], ids[2]}
    with pytest.raises(errors.InvalidInput):
        claims[0]._success(2)  # each claim settles once, in a batch or alone


def test_a_batch_is_applied_once_whatever_retries_happen(store: Store) -> None:
    """Logged in applied_ops as one operation: applied again (a spool replay, a group
    commit whose outcome was lost), it is found there and changes nothing."""
    ids = [store.effects.enqueue(f"t{i}", "k") for i in range(2)]
    claims = store.effects.claim("w", limit=2)
    items = [c._retry(0.0, "once") for c in claims]
    op = fleetstore.Operation("settle_effects", {"items": items}, new_id())
    first = store.apply(op)
    assert first["states"] == "pp" and first["refused"] == {}
    after = rows(store, "SELECT * FROM effects ORDER BY id")
    again = store.apply(op)
    assert again["duplicate"] is True and again["states"] == "pp"
    assert rows(store, "SELECT * FROM effects ORDER BY id") == after
    for eid in ids:
        effect = store.effects.get(eid)
        assert (effect.state, [e.error for e in effect.errors]) == ("pending", ["once"])


def applied(store: Store, op_id: str) -> list[Any]:
    """The ``applied_ops`` rows of *op_id*: (name)."""
    return rows(store, f"SELECT name FROM applied_ops WHERE op_id = '{op_id}'")


def claim_ops(store: Store, *ids: str) -> list[Any]:
    return [rows(store, f"SELECT claim_op FROM effects WHERE id = '{i}'")[0][0] for i in ids]


def test_settle_and_claim_hands_each_thread_on_to_the_settling_worker(store: Store) -> None:
    """A batch of settlements with a ``Chain`` claims, in its own transaction, the effect
    each thread is handed on to, for the settling worker: only one that can run now
    (not a delayed one), of the worker's kinds, and no more than it has room for; the
    claim carries the settlement's operation id, logged once in applied_ops, and is an
    ordinary claim (lease, token, settled like any).  The others are left pending and
    rung for, as without a chain."""
    e = store.effects
    a1, a2 = e.enqueue("a", "k"), e.enqueue("a", "k", {"n": 2})
    d1, d2 = e.enqueue("d", "k"), e.enqueue("d", "k")
    b1, b2 = e.enqueue("b", "k"), e.enqueue("b", "other")
    c1, c2 = e.enqueue("c", "k"), e.enqueue("c", "k", delay=60)
    by_id = {c.id: c for c in e.claim("w", limit=10)}
    claims = [by_id[i] for i in (a1, b1, c1, d1)]
    chain = Chain("w2", 1, 30.0, kinds_json(["k"]), timeouts_json({"k": 60}))
    token = e.wake_token()
    outcome = e._settle_batch(claims, [c._success(None) for c in claims], chain)
    assert outcome == ["succeeded"] * 4
    (chained,) = chain.claimed
    assert chained.id == a2 and chained.chained and not chain.unknown
    assert (chained.owner, chained.effect.payload, chained.effect.attempt) == ("w2", {"n": 2}, 1)
    got = e.get(a2)
    assert (got.state, got.lease_owner, got.fence) == ("running", "w2", chained.fence)
    assert chain.op_id is not None and applied(store, chain.op_id) == [("settle_effects",)]
    assert claim_ops(store, a2) == [chain.op_id]
    assert rows(store, f"SELECT deadline - started_at FROM effects WHERE id = '{a2}'") == [(60.0,)]
    # d2 (no room left), b2 (not of its kinds), c2 (delayed): handed on, rung for.
    assert [e.get(i).state for i in (d2, b2, c2)] == ["pending"] * 3
    assert e.wait_for_work(5.0, token=token)
    assert {c.id for c in e.claim("w3", limit=10, kinds=["k", "other"])} == {d2, b2}
    assert chained.succeed({"ok": 1}) is True
    assert e.get(a2).state == "succeeded"


def test_a_replayed_settle_and_claim_is_applied_once_and_its_claims_are_found(
    store: Store,
) -> None:
    """Applied again (a spool replay, a commit whose outcome was lost), a settle-and-claim
    is found in applied_ops: it claims nothing more and changes nothing, and the claims
    it made are found by its operation id, whatever became of its answer.  One applied
    past its ``until`` (replayed from the spool after the worker stopped waiting for
    it) claims nothing: the thread is rung for, as without a chain."""
    e = store.effects
    ids = [e.enqueue("t", "k", {"i": i}) for i in range(3)]
    c = claim_one(store)
    op_id = new_id()
    chain = Chain("w", 5, 30.0, kinds_json(["k"]), None).args(op_id, time.time() + 60)
    op = fleetstore.Operation("settle_effects", {"items": [c._success(1)], "chain": chain}, op_id)
    first = store.apply(op)  # from outside: checked
    assert (first["states"], first["chained"]) == ("s", 1)
    after = rows(store, "SELECT * FROM effects ORDER BY id")
    again = store.apply(op)
    assert again["duplicate"] is True and (again["states"], again["chained"]) == ("s", 1)
    assert rows(store, "SELECT * FROM effects ORDER BY id") == after
    assert applied(store, op_id) == [("settle_effects",)]
    (found,) = e._chained(op_id, "w", 30.0)
    assert (found.id, found.fence, found.effect.attempt) == (ids[1], e.get(ids[1]).fence, 1)
    assert e.get(ids[2]).state == "pending"
    # Past its until: claims nothing, rings for the next head.
    late_id = new_id()
    late = Chain("w", 5, 30.0, None, None).args(late_id, time.time() - 1)
    token = e.wake_token()
    items = [found._success(2)]
    result = store.apply(
        fleetstore.Operation("settle_effects", {"items": items, "chain": late}, late_id)
    )
    assert (result["states"], result["chained"]) == ("s", 0)
    assert e.get(ids[2]).state == "pending" and e._chained(late_id, "w", 30.0) == []
    assert e.wait_for_work(5.0, token=token)


def test_a_worker_s_busy_lane_runs_each_next_effect_from_its_predecessor_s_settlement(
    store: Store,
) -> None:
    """A lane of effects run by one worker: the first is claimed by a claim; every
    later one by its predecessor's settlement (its claim_op is a settle_effects
    operation in applied_ops), without a claim of its own; in order, once each."""
    ids = [store.effects.enqueue("lane", "k", {"i": i}) for i in range(6)]
    ran: list[int] = []
    worker = Worker(store, {"k": lambda e: ran.append(e.payload["i"])}, until_idle=True)
    assert worker.run() == 0
    assert ran == list(range(6))
    assert worker.stats["chained"] == 5 and worker.stats["succeeded"] == 6
    ops = claim_ops(store, *ids)
    assert [applied(store, op) for op in ops[1:]] == [[("settle_effects",)]] * 5
    assert applied(store, ops[0]) == []  # a claim: not logged
    assert len(set(ops)) == 6 and [e.attempt for e in store.effects.list()] == [1] * 6


def test_bad_batches_from_outside_are_refused_whole(store: Store) -> None:
    eid = store.effects.enqueue("t", "k")
    (c,) = store.effects.claim("w")
    good = c._success(None)
    for bad in (
        {"items": []},
        {"items": "x"},
        {"items": [good, 5]},
        {"items": [{**good, "outcome": "explode"}]},
        {"items": [{**good, "fence": 0}]},
        {"items": [{**good, "result": 5}]},
        {"items": [good] * 1001},
        {"items": [good], "chain": "x"},
        {"items": [good], "chain": {"owner": "w", "until": 1.0}},
        {"items": [good], "chain": {"claim_op": new_id(), "owner": "", "until": 1.0}},
        {"items": [good], "chain": {"claim_op": new_id(), "owner": "w"}},
        {"items": [good], "chain": {"claim_op": new_id(), "owner": "w", "until": 1, "limit": 0}},
        {"items": [good], "chain": {"claim_op": 5, "owner": "w", "until": 1.0}},
    ):
        with pytest.raises(errors.InvalidInput):
            store.apply(fleetstore.Operation("settle_effects", bad, new_id()))
    assert store.effects.get(eid).state == "running"


def test_a_claimed_effect_carries_what_a_handler_needs(store: Store) -> None:
    eid = store.effects.enqueue("t", "k", {"a": [1, 2]}, idempotency_key="key-1", max_attempts=3)
    first = claim_one(store)
    first.retry(0.0, "boom")
    (c,) = store.effects.claim("w", lease=30, timeouts={"k": 60})
    e = c.effect
    stored = store.effects.get(eid)
    assert (e.id, e.thread_key, e.seq, e.kind, e.payload) == (eid, "t", 1, "k", {"a": [1, 2]})
    assert (e.state, e.attempt, e.max_attempts, e.fence) == ("running", 2, 3, stored.fence)
    assert (e.idempotency_key, e.last_error, e.lease_owner) == ("key-1", "boom", "w")
    assert e.lease_expires_at == stored.lease_expires_at and e.started_at == stored.started_at
    assert e.created_at == stored.created_at and e.available_at == stored.available_at
    # What it does not carry: the error history and the result (effects.get has them).
    assert e.errors == () and [x.error for x in stored.errors] == ["boom"]


# -- rings: an effect that becomes claimable wakes idle workers ------------------------------------


def test_what_makes_an_effect_claimable_rings_and_nothing_else_does(store: Store) -> None:
    """An idle worker sleeps until a ring: every way an effect becomes claimable rings
    (once committed: tests/engine/test_contract.py), and a write that makes nothing
    claimable does not wake every idle worker of the fleet.  (PostgreSQL's effects
    trigger also rings where an enqueue touches its thread's pending head row.)"""
    effects = store.effects
    quiet = store.dialect == "sqlite"

    def rang(action: Any) -> bool:
        token = effects.wake_token()
        action()
        return effects.wait_for_work(0.3, token=token)

    assert store.notifies
    assert rang(lambda: effects.enqueue("t", "k"))  # a new head
    behind = rang(lambda: effects.enqueue("t", "k"))
    assert not behind or not quiet  # behind its head: not claimable
    c = claim_one(store)
    assert not rang(c.heartbeat)
    assert rang(lambda: c.succeed())  # its thread's next effect is its head now
    c2 = claim_one(store)
    assert rang(lambda: c2.retry(0.0, "x"))  # pending again
    c3 = claim_one(store)
    dead = c3.id
    assert not rang(lambda: c3.fail("no"))  # the thread is done: nothing new to claim
    assert rang(lambda: effects.retry(dead))  # an operator's retry: a new head
    c4 = claim_one(store)
    expire(store, c4.id)
    assert rang(effects.sweep)  # back to pending


# -- settlement through a locked store ------------------------------------------------------------


@pytest.mark.slow
def test_a_batch_past_the_budget_is_spooled_even_with_on_busy_raise_and_lands(
    open_store: OpenStore, spawn: Spawn
) -> None:
    store = open_store(write_budget=0.5, on_busy="raise")
    ids = [store.effects.enqueue(f"t{i}", "k") for i in range(2)]
    nxt = store.effects.enqueue("t0", "k")
    claims = store.effects.claim("w", limit=2, lease=60)
    lock, _ = start_lock(spawn, store.url, 2.0)
    items = [c._success({"i": i}) for i, c in enumerate(claims)]
    assert store.effects._settle_batch(claims, items) is None  # spooled, not raised
    assert lock.finish(timeout=30) == 0
    assert store.flush(timeout=30)
    assert [store.effects.get(i).state for i in ids] == ["succeeded", "succeeded"]
    assert claim_one(store).id == nxt
    assert not any(r["in_transaction"] for r in store.db.connection_report())


@pytest.mark.slow
def test_a_settlement_past_the_budget_is_spooled_even_with_on_busy_raise_and_lands(
    open_store: OpenStore, spawn: Spawn
) -> None:
    store = open_store(write_budget=0.5, on_busy="raise")
    store.effects.enqueue("t", "k")
    nxt = store.effects.enqueue("t", "k")
    c = claim_one(store, lease=60)
    lock, _ = start_lock(spawn, store.url, 2.0)
    assert c.succeed({"ok": 1}) is False  # spooled, not dropped, not raised
    with pytest.raises(errors.TransientError):
        store.effects.enqueue("t", "k")  # an ordinary write still honours on_busy="raise"
    assert lock.finish(timeout=30) == 0
    assert store.flush(timeout=30)
    assert store.effects.get(c.id).state == "succeeded"
    assert claim_one(store).id == nxt
    assert not any(r["in_transaction"] for r in store.db.connection_report())


# -- the Worker, in process -----------------------------------------------------------------------


def test_worker_runs_sync_and_async_handlers_in_order_with_retries(store: Store) -> None:
    seen: list[tuple[str, int, int]] = []
    lock = threading.Lock()

    def sync_handler(e: Effect) -> dict[str, Any]:
        with lock:
            seen.append((e.thread_key, e.payload["i"], e.attempt))
        if e.payload["i"] == 1 and e.attempt == 1:
            raise RetryEffect("once more", delay=0)
        return {"i": e.payload["i"]}

    async def async_handler(e: Effect) -> str:
        await asyncio.sleep(0.001)
        return f"async {e.idempotency_key}"

    def failing(e: Effect) -> None:
        raise FailEffect("nope")

    def crashing(e: Effect) -> None:
        raise ValueError("bug")

    for t in range(3):
        for i in range(3):
            store.effects.enqueue(f"t{t}", "sync", {"i": i})
    a = store.effects.enqueue("ta", "async", idempotency_key="key-1")
    f = store.effects.enqueue("tf", "fail")
    x = store.effects.enqueue("tx", "crash", max_attempts=2)
    worker = Worker(
        store,
        {"sync": sync_handler, "async": async_handler, "fail": failing, "crash": crashing},
        until_idle=True,
        backoff=0.001,
        poll_interval=0.01,
    )
    assert worker.run() == fleetstore.domain.worker.EXIT_OK
    for t in range(3):
        assert [(i, att) for th, i, att in seen if th == f"t{t}"] == [
            (0, 1),
            (1, 1),
            (1, 2),
            (2, 1),
        ]
    assert store.effects.get(a).result == "async key-1"
    assert (store.effects.get(f).state, store.effects.get(f).dead_reason) == ("dead", "failed")
    crashed = store.effects.get(x)
    assert (crashed.state, crashed.dead_reason) == ("dead", "attempts_exhausted")
    assert crashed.last_error == "ValueError: bug"
    assert store.effects.counts()["succeeded"] == 10
    # 9 + 3 retries of the sync kind, 1 async, 1 fail, 2 attempts of crash
    assert worker.stats["claimed"] == 16


def test_a_handler_raising_what_is_not_an_exception_fails_its_attempt(store: Store) -> None:
    """A handler's CancelledError (a task it awaited was cancelled), SystemExit,
    KeyboardInterrupt or a bare BaseException: each left its effect running with its
    lease renewed for ever (or stopped the worker), and its thread never moved on."""

    async def inner_cancelled(e: Effect) -> None:
        task = asyncio.ensure_future(asyncio.sleep(10))
        await asyncio.sleep(0)
        task.cancel()
        await task

    def raising(exc: BaseException) -> Callable[[Effect], None]:
        def handler(e: Effect) -> None:
            raise exc

        return handler

    handlers: dict[str, Any] = {
        "cancelled": inner_cancelled,
        "exit": raising(SystemExit(7)),
        "interrupt": raising(KeyboardInterrupt()),
        "base": raising(BaseException("bare")),
        "next": lambda e: "ran",
    }
    bad = {k: store.effects.enqueue(f"t-{k}", k, max_attempts=1) for k in handlers if k != "next"}
    behind = {k: store.effects.enqueue(f"t-{k}", "next") for k in bad}
    worker = Worker(store, handlers, until_idle=True, lease=2.0, poll_interval=0.01)
    done: list[int] = []
    thread = threading.Thread(target=lambda: done.append(worker.run()), daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():
        worker.stop(hard=True)
    assert done == [fleetstore.domain.worker.EXIT_OK], (done, dict(worker.stats))
    for kind, eid in bad.items():
        e = store.effects.get(eid)
        assert (e.state, e.dead_reason) == ("dead", "attempts_exhausted"), (kind, e.state)
        assert e.last_error is not None and e.last_error.split(":")[0] in (
            "CancelledError", "SystemExit", "KeyboardInterrupt", "BaseException"
        ), e.last_error  # fmt: skip
        assert store.effects.get(behind[kind]).result == "ran", kind


def test_effects_counted_dead_are_those_the_store_left_dead(store: Store) -> None:
    """``outbox.settled["dead"]`` (``fleetstore_effects_settled_total{outcome="dead"}``,
    the dead-effects alert) counted what a settlement asked for: a retry that spent the
    last attempt, the commonest way to die, counted as a retry, and a sweep's dead as
    nothing.  The worker's ``stats["dead"]`` counts its sweeps' too."""

    def boom(e: Effect) -> None:
        raise RuntimeError("boom")

    store.effects.enqueue("t-1", "boom", max_attempts=1)
    store.effects.enqueue("t-2", "boom", max_attempts=2)
    Worker(store, {"boom": boom}, until_idle=True, backoff=0.001, poll_interval=0.01).run()
    settled = store.metrics()["outbox"]["settled"]
    assert (settled["dead"], settled["retry"]) == (2, 1), settled
    store.effects.enqueue("t-3", "one", max_attempts=1)
    (claim,) = store.effects.claim("w", kinds=["one"])
    claim.retry(0.0, "last")  # settled alone, not in a batch
    store.effects.enqueue("t-4", "once", replay_safe=False)
    store.effects.claim("lost", kinds=["once"], lease=0.05)
    time.sleep(0.2)
    swept = Worker(store, {"once": boom}, until_idle=True, poll_interval=0.01)
    swept.run()
    assert swept.stats["dead"] == 1, dict(swept.stats)
    assert store.metrics()["outbox"]["settled"]["dead"] == 4 == store.effects.counts()["dead"]


def test_worker_stop_gives_back_prefetched_claims_without_spending_an_attempt(
    store: Store,
) -> None:
    started = threading.Event()
    release = threading.Event()

    def slow(e: Effect) -> None:
        started.set()
        release.wait(30)

    ids = [store.effects.enqueue(f"t{i}", "slow") for i in range(3)]
    worker = Worker(store, {"slow": slow}, concurrency=1, prefetch=2, poll_interval=0.01)
    runner = threading.Thread(target=lambda: setattr(worker, "code", worker.run()))
    runner.start()
    assert started.wait(30)
    deadline = time.monotonic() + 30
    while worker.stats["claimed"] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop()
    release.set()
    runner.join(30)
    assert worker.code == fleetstore.domain.worker.EXIT_OK
    states = sorted((store.effects.get(i).state, store.effects.get(i).attempt) for i in ids)
    assert states == [("pending", 0), ("pending", 0), ("succeeded", 1)]
    assert worker.stats["released"] == 2


def test_worker_hard_stop_interrupts_by_replay_safety(store: Store) -> None:
    gate = threading.Event()

    def hang(e: Effect) -> None:
        gate.wait(30)

    safe = store.effects.enqueue("a", "safe")
    unsafe = store.effects.enqueue("b", "unsafe")
    worker = Worker(
        store,
        {"safe": hang, "unsafe": Handler(hang, replay_safe=False)},
        concurrency=2,
        poll_interval=0.01,
        grace=60,
    )
    runner = threading.Thread(target=lambda: setattr(worker, "code", worker.run()))
    runner.start()
    deadline = time.monotonic() + 30
    while store.effects.counts()["running"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop()
    worker.stop()  # a second stop is a hard stop
    runner.join(30)
    gate.set()
    assert worker.code == fleetstore.domain.worker.EXIT_HARD
    s, u = store.effects.get(safe), store.effects.get(unsafe)
    assert (s.state, s.attempt) == ("pending", 1)
    assert (u.state, u.dead_reason) == ("dead", "interrupted")
    assert "stopped hard" in (u.last_error or "")


def test_worker_gives_up_on_a_hung_handler_and_its_thread_goes_on(store: Store) -> None:
    """A thread that hangs is abandoned at the timeout (it runs on, holding its slot), a
    coroutine is cancelled; both attempts are settled as timed out and run again; a
    kind whose Handler says ``timeout=math.inf`` has none."""
    gate = threading.Event()

    def hang_once(e: Effect) -> dict[str, int]:
        if e.payload == "hang" and e.attempt == 1:
            gate.wait(60)
        return {"attempt": e.attempt}

    async def sleep_once(e: Effect) -> dict[str, int]:
        if e.attempt == 1:
            await asyncio.sleep(60)
        return {"attempt": e.attempt}

    def slow(e: Effect) -> str:
        time.sleep(0.6)
        return "slow"

    hung = store.effects.enqueue("a", "thread", "hang")
    after = store.effects.enqueue("a", "thread")
    cancelled = store.effects.enqueue("b", "coroutine")
    unlimited = store.effects.enqueue("c", "slow")
    worker = Worker(
        store,
        {"thread": hang_once, "coroutine": sleep_once, "slow": Handler(slow, timeout=math.inf)},
        concurrency=3,
        poll_interval=0.01,
        backoff=0.01,
        handler_timeout=0.3,
        until_idle=True,
    )
    assert worker.timeouts == {"thread": 0.3, "coroutine": 0.3}
    try:
        assert worker.run() == fleetstore.domain.worker.EXIT_OK
    finally:
        gate.set()
    for eid in (hung, cancelled):
        got = store.effects.get(eid)
        assert (got.state, got.attempt, got.result) == ("succeeded", 2, {"attempt": 2})
        (error,) = got.errors
        assert error.attempt == 1 and "timeout of 0.3s" in error.error
    assert store.effects.get(after).state == "succeeded"
    got = store.effects.get(unlimited)
    assert (got.state, got.attempt) == ("succeeded", 1)
    assert worker.stats["timed_out"] == 2 and worker.stats["succeeded"] == 4


def test_worker_rejects_bad_configuration(store: Store) -> None:
    with pytest.raises(errors.ConfigError):
        Worker(store, {})
    with pytest.raises(errors.ConfigError):
        Worker(store, {"k": 42})  # type: ignore[dict-item]
    with pytest.raises(errors.ConfigError):
        Worker(store, {"k": print}, concurrency=0)
    with pytest.raises(errors.ConfigError):
        Worker(store, {"k": print}, lease=0)
    for bad in (0, -1, "60", math.nan):
        with pytest.raises(errors.ConfigError):
            Worker(store, {"k": print}, handler_timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(errors.ConfigError):
            Worker(store, {"k": Handler(print, timeout=bad)})  # type: ignore[arg-type]
    assert Worker(store, {"k": print}, handler_timeout=None).timeouts == {}
    assert Worker(store, {"k": print}).timeouts == {"k": 600.0}


def test_a_failed_attempt_keeps_its_traceback_bounded_and_the_claim_says_what_became_of_it(
    store: Store,
) -> None:
    """Issue 25: only ``KeyError: 'missing_key'`` was kept.  A traceback is kept with its
    attempt, cut to its last 8 KiB (where it failed); a claimer's own ``max_attempts``
    gives up sooner than the effect's; ``claim.settled`` is what the store made of it."""
    from fleetstore.domain.outbox_ops import MAX_TRACEBACK

    eid = store.effects.enqueue("t", "k", max_attempts=5)
    nxt = store.effects.enqueue("t", "k")
    deep = "Traceback (most recent call last):\n" + '  File "x.py", line 1, in f\n' * 2000
    first = claim_one(store)
    assert first.retry(0, "KeyError: 'k'", traceback=deep + "KeyError: 'k'\x00\n") is True
    assert (first.settled, first.dead_reason) == ("pending", None)
    second = claim_one(store)
    assert second.retry(0, "e2", max_attempts=2) is True  # its 2nd attempt, and the last
    assert (second.settled, second.dead_reason) == ("dead", "attempts_exhausted")
    got = store.effects.get(eid)
    assert (got.state, got.dead_reason, got.attempt, got.max_attempts) == (
        "dead",
        "attempts_exhausted",
        2,
        5,
    )
    kept = got.errors[0].traceback
    assert kept is not None and len(kept) <= MAX_TRACEBACK
    assert kept.startswith("…") and kept.endswith("KeyError: 'k'\ufffd\n")  # the tail, cleaned
    assert got.errors[1].traceback is None and got.errors[1].error == "e2"
    third = claim_one(store)
    assert third.id == nxt  # the thread moved on
    assert third.fail("bad", traceback="Traceback ...\nValueError: bad\n") is True
    assert (third.settled, third.dead_reason) == ("dead", "failed")
    assert store.effects.get(nxt).errors[0].traceback == "Traceback ...\nValueError: bad\n"
    # A bad traceback or cap is refused, nothing changed: the claim still holds.
    fourth_id = store.effects.enqueue("u", "k")
    fourth = claim_one(store)
    for bad in ({"traceback": 5}, {"max_attempts": 0}, {"max_attempts": True}):
        with pytest.raises(errors.InvalidInput):
            fourth.retry(0, "e", **bad)  # type: ignore[arg-type]
    assert store.effects.get(fourth_id).state == "running" and fourth.settled is None


def test_worker_logs_each_failed_attempt_once_keeps_its_traceback_and_counts_the_dead(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """One record per failed attempt, after its settlement, with the effect's fields and
    what happens next; an unexpected exception's record carries its traceback, which is
    also kept from the handler's frame on (none of the worker's own); ``Handler``'s
    ``max_attempts`` and ``backoff`` are the kind's policy; ``stats["dead"]`` counts."""

    def lookup(e: Effect) -> None:
        return {}["missing_key"]  # type: ignore[no-any-return]

    async def coroutine(e: Effect) -> None:
        await asyncio.sleep(0)
        raise ValueError(f"async attempt {e.attempt}")

    def refuse(e: Effect) -> None:
        raise FailEffect("no such user")

    keyed = store.effects.enqueue("a", "lookup", max_attempts=2)
    capped = store.effects.enqueue("b", "coroutine")  # 5 attempts; its kind allows 1
    after = store.effects.enqueue("b", "ok")
    refused = store.effects.enqueue("c", "refuse")
    worker = Worker(
        store,
        {
            "lookup": lookup,
            "coroutine": Handler(coroutine, max_attempts=1, backoff=7.0),
            "refuse": refuse,
            "ok": lambda e: "ok",
        },
        until_idle=True,
        backoff=0.001,
        poll_interval=0.01,
    )
    assert worker.policies["coroutine"].backoff == 7.0
    assert worker.policies["lookup"].backoff == 0.001
    with caplog.at_level(logging.INFO, logger="fleetstore.worker"):
        assert worker.run() == fleetstore.domain.worker.EXIT_OK
    failures = [r for r in caplog.records if hasattr(r, "effect_id")]
    seen = sorted((r.effect_id, r.attempt, r.next) for r in failures)  # type: ignore[attr-defined]
    assert seen == sorted(
        [(keyed, 1, "retry"), (keyed, 2, "dead"), (capped, 1, "dead"), (refused, 1, "dead")]
    )
    by = {(r.effect_id, r.attempt): r for r in failures}  # type: ignore[attr-defined]
    first = by[(keyed, 1)]
    assert first.levelno == logging.WARNING and first.exc_info is not None
    assert first.error == "KeyError: 'missing_key'"  # type: ignore[attr-defined]
    assert first.where.endswith("in lookup") and first.retry_at is not None  # type: ignore[attr-defined]
    assert (first.kind, first.thread_key, first.max_attempts) == ("lookup", "a", 2)  # type: ignore[attr-defined]
    last = by[(keyed, 2)]
    assert last.levelno == logging.ERROR and last.dead_reason == "attempts_exhausted"  # type: ignore[attr-defined]
    assert by[(capped, 1)].max_attempts == 1  # type: ignore[attr-defined]
    assert by[(refused, 1)].exc_info is None  # a FailEffect is deliberate: no traceback logged
    assert "no such user" in by[(refused, 1)].getMessage()
    for eid, frame in ((keyed, "in lookup"), (capped, "in coroutine"), (refused, "in refuse")):
        for error in store.effects.get(eid).errors:
            assert error.traceback is not None and frame in error.traceback
            assert error.traceback.startswith("Traceback (most recent call last):")
            assert "domain/worker.py" not in error.traceback  # the handler's frames only
    assert store.effects.get(capped).attempt == 1  # dead at its kind's limit, not its own
    assert store.effects.get(after).state == "succeeded"  # its thread moved on
    assert (worker.stats["dead"], worker.stats["retried"], worker.stats["failed"]) == (3, 1, 1)
    for bad in ({"max_attempts": 0}, {"backoff": -1.0}, {"max_backoff": math.inf}):
        with pytest.raises(errors.ConfigError):
            Worker(store, {"k": Handler(print, **bad)})  # type: ignore[arg-type]
    with pytest.raises(errors.ConfigError):
        Worker(store, {"k": print}, max_attempts=0)


# -- the CLI --------------------------------------------------------------------------------------

FLEETSTORE = [sys.executable, "-m", "fleetstore"]


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FLEETSTORE, *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


@pytest.mark.slow
def test_cli_enqueue_worker_list_show_retry_cancel_sweep(tmp_path: Path) -> None:
    db = str(tmp_path / "c.db")
    (tmp_path / "handlers_mod.py").write_text(
        "import fleetstore\n"
        "def greet(e):\n    return {'hello': e.payload['name']}\n"
        "def boom(e):\n    raise fleetstore.FailEffect('always')\n"
        "HANDLERS = {'greet': greet, 'boom': fleetstore.Handler(boom, replay_safe=False)}\n"
    )
    first = cli("effects", "enqueue", "t1", "greet", '{"name": "ada"}', "--store", db)
    assert first.returncode == 0, first.stderr
    boom = cli("effects", "enqueue", "t2", "boom", "--store", db, "--max-attempts", "1")
    boom_id = boom.stdout.strip()
    ran = cli("worker", "handlers_mod:HANDLERS", "--store", db, "--until-idle", cwd=tmp_path)
    assert ran.returncode == 5, ran.stderr  # an effect went dead in its run
    assert "1 failed" in ran.stderr and "1 succeeded" in ran.stderr
    assert "1 effect(s) went dead in this run" in ran.stderr
    listed = cli("effects", "list", "--store", db, "--json")
    effects = {e["id"]: e for e in map(json.loads, listed.stdout.splitlines())}
    assert effects[first.stdout.strip()]["result"] == {"hello": "ada"}
    assert effects[boom_id]["state"] == "dead"
    shown = cli("effects", "show", boom_id, "--store", db)
    assert "dead_reason: failed" in shown.stdout and "always" in shown.stdout
    assert cli("effects", "retry", boom_id, "--store", db).stdout.startswith(f"{boom_id}: pending")
    assert cli("effects", "cancel", boom_id, "--store", db).returncode == 0
    assert (
        json.loads(cli("effects", "show", boom_id, "--store", db, "--json").stdout)["state"]
        == "cancelled"
    )
    # a succeeded effect cannot be cancelled: exit 1, nothing changed
    refused = cli("effects", "cancel", first.stdout.strip(), "--store", db)
    assert refused.returncode == 1 and "succeeded" in refused.stderr
    swept = cli("effects", "sweep", "--store", db, "--json")
    assert swept.returncode == 0 and swept.stdout == ""  # JSON lines: none swept, no line
    assert cli("effects", "list", "--store", db, "--state", "pending").stdout == ""


@pytest.mark.slow
def test_cli_errors_exit_nonzero(tmp_path: Path) -> None:
    db = str(tmp_path / "c.db")
    missing = cli("effects", "list", "--store", str(tmp_path / "none.db"))
    assert missing.returncode == 2 and not (tmp_path / "none.db").exists()
    assert cli("effects", "enqueue", "t", "k", "{not json", "--store", db).returncode == 2
    assert cli("effects", "enqueue", "", "k", "--store", db).returncode == 2
    assert cli("effects", "show", new_id(), "--store", db).returncode == 2
    assert cli("worker", "no_such_module:H", "--store", db).returncode == 2
    assert cli("worker", "json:dumps", "--store", db).returncode == 2  # not a mapping
    assert cli("worker", "nocolon", "--store", db).returncode == 2


def test_an_effect_whose_payload_does_not_decode_goes_dead_and_holds_up_no_claim(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A payload another program damaged: the claim that takes it returns the others,
    and the damaged one goes dead with the reason at once (raised after the claim had
    committed, it held every effect of that claim until their leases ran out, and
    each later claim took it again), so the effect behind it in its thread runs."""
    bad = store.effects.enqueue("t-1", "hook", {"n": 1})
    other = store.effects.enqueue("t-2", "hook", {"n": 2})
    behind = store.effects.enqueue("t-1", "hook", {"n": 3})

    def damage(_key: Any, db: Any) -> None:
        db.run_write(
            lambda tx: tx.execute("UPDATE effects SET payload = 'x{' WHERE id = ?", (bad,))
        )

    store.backend.each(damage)
    with caplog.at_level(logging.ERROR, logger="fleetstore"):
        first = store.effects.claim("w", kinds=["hook"], limit=10)
    assert [(c.id, c.effect.payload) for c in first] == [(other, {"n": 2})]
    assert f"effect {bad} goes dead" in caplog.text
    ((state, reason, error),) = read_everywhere(
        store, "SELECT state, dead_reason, last_error FROM effects WHERE id = ?", (bad,)
    )
    assert (state, reason) == ("dead", "failed") and "does not decode" in error, error
    with pytest.raises(errors.CorruptStore, match="does not decode"):
        store.effects.get(bad)  # read whole, it still names the damage
    assert [c.id for c in store.effects.claim("w", kinds=["hook"], limit=10)] == [behind]
