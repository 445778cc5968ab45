"""What one operation costs, counted rather than timed (issue 24): Python calls (every
function call the profiler sees, Python's and the C functions Python calls) and SQL
statements, per public write, against ceilings close to what the code does now.  A
count does not depend on the machine's load, so a change that adds work to an
operation fails here and has to raise its ceiling on purpose (with a reason in its
commit).  The time these counts stand for is measured in benchmarks/bench_ops.py.

The ceilings are for the single-file SQLite store, the common case; each is the least
count of a few runs (a run now and then also starts a checkpoint thread or a timer)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore import Store

#: Settlements in the batch of "a batched settlement" (its ceilings are per effect).
BATCH = 16
#: operation: (Python calls, SQL statements, BEGIN and COMMIT included).
CEILINGS = {
    "state.put": (100, 7),
    "effects.enqueue": (100, 8),
    "messages.append": (125, 10),
    "a streamed reply": (370, 15),  # 352 before parts' names were screened for secrets
    "effects.claim": (110, 3),
    "a settlement": (90, 7),
    # Per effect, rounded up (447 calls for 16: 27.9), with a call of slack: a run's
    # total varies by a call or two, and floored it read 28 against 27 in one CI run.
    "a batched settlement": (29, 4),
}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with fleetstore.open(tmp_path / "cost.db") as s:
        yield s


def _count(store: Store, fn: Callable[[], Any]) -> tuple[int, int]:
    """(calls, statements) of one ``fn()``."""
    calls = 0
    statements = 0

    def trace(cursor: Any, sql: str, bindings: Any) -> bool:
        nonlocal statements
        statements += 1
        return True

    mine = trace.__code__

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "c_call" or (event == "call" and frame.f_code is not mine):
            calls += 1

    writer = store.db._writer  # type: ignore[attr-defined]
    assert writer is not None
    writer.exec_trace = trace
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
        writer.exec_trace = None
    return calls, statements


def _least(
    store: Store, make: Callable[[int], Callable[[], Any]], runs: int = 5
) -> tuple[int, int]:
    make(-1)()  # warm: connections, the board slot, caches
    counts = [_count(store, make(i)) for i in range(runs)]
    harness = _count(store, lambda: None)[0]  # the lambda and the profiler's own calls
    return min(c for c, _ in counts) - harness, min(s for _, s in counts)


def _operations(store: Store) -> dict[str, Callable[[int], Callable[[], Any]]]:
    s = store.sessions.create(title="cost")
    claimed: list[Any] = []

    def put(i: int) -> Callable[[], Any]:
        return lambda: store.state.put(s.id, "checkpoint", {"turn": i, "messages": 12})

    def enqueue(i: int) -> Callable[[], Any]:
        return lambda: store.effects.enqueue(s.id, "title.generate", {"turn": i})

    def append(i: int) -> Callable[[], Any]:
        return lambda: store.messages.append(s.id, "user", f"question {i}")

    def reply(i: int) -> Callable[[], Any]:
        def run() -> None:
            with store.messages.stream(s.id, model="m-1") as r:
                r.text("Let me ")
                r.text("look.")
                call = r.tool_call("bash", {"cmd": f"ls {i}"})
                call.result("a.txt\nb.txt\n")
                r.usage(input_tokens=120, output_tokens=31)

        return run

    def claim(i: int) -> Callable[[], Any]:
        store.effects.enqueue(f"claims-{i}", "k", {"i": i})
        return lambda: claimed.extend(store.effects.claim("worker", limit=1, kinds=["k"]))

    def settle(i: int) -> Callable[[], Any]:
        store.effects.enqueue(f"settles-{i}", "s", {"i": i})
        (c,) = store.effects.claim("worker", limit=1, kinds=["s"])
        return lambda: c.succeed({"ok": i})

    def settle_batch(i: int) -> Callable[[], Any]:
        # A worker's flush (domain/completer.py): BATCH settlements in one operation.
        for n in range(BATCH):
            store.effects.enqueue(f"batch-{i}-{n}", "b", {"n": n})
        claims = store.effects.claim("worker", limit=BATCH, kinds=["b"])
        assert len(claims) == BATCH
        return lambda: store.effects._settle_batch(claims, [c._success(1) for c in claims])

    return {
        "state.put": put,
        "effects.enqueue": enqueue,
        "messages.append": append,
        "a streamed reply": reply,
        "effects.claim": claim,
        "a settlement": settle,
        "a batched settlement": settle_batch,
    }


@pytest.mark.parametrize("operation", list(CEILINGS))
def test_an_operation_costs_no_more_than_its_ceiling(store: Store, operation: str) -> None:
    calls, statements = _least(store, _operations(store)[operation])
    if operation == "a batched settlement":
        calls, statements = -(-calls // BATCH), -(-statements // BATCH)  # per effect
    most_calls, most_statements = CEILINGS[operation]
    assert statements <= most_statements, (operation, statements)
    assert calls <= most_calls, (operation, calls)
    # Close to the ceiling, or the ceiling hides a regression of its own size.
    assert calls > most_calls * 0.8, f"{operation}: {calls} calls; lower its ceiling"
