"""What happened to a target's effects (the targets with an outbox: fleetstore and
t3code), from the outbox rows as the run left them: how many were enqueued and
settled, which are stuck (``running`` past their lease), how long a thread's lane
stayed blocked, and the time from enqueue to settlement."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_BUCKET = 0.5  # seconds per point of the effects-over-time series
SETTLED = ("succeeded", "dead", "failed", "cancelled")


@dataclass(frozen=True, slots=True)
class Row:
    """One effect: its thread, its place in the thread's lane (enqueue order), wall
    times (``created``, ``claimed`` by its latest claim, ``finished``) and lease."""

    thread: str
    order: int
    state: str
    created: float
    claimed: float | None
    finished: float | None
    lease_expires: float | None


def _percentile(ordered: Sequence[float], q: float) -> float:
    if not ordered:
        return 0.0
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarize(rows: Iterable[Row], *, now: float, start: float) -> dict[str, object]:
    """*now*: when the rows were read (the end of the run); *start*: the run's start
    (wall clock).  A lane is blocked while a later effect of its thread waits for an
    earlier one to settle: from the later one's enqueue to the earlier one's
    settlement, or to *now* if it never settled.  A lane is still blocked at the end
    when its first unsettled effect is ``running`` and later ones wait behind it."""
    by_thread: dict[str, list[Row]] = {}
    states: Counter[str] = Counter()
    for r in rows:
        by_thread.setdefault(r.thread, []).append(r)
        states[r.state] += 1
    stuck: list[Row] = []
    waits: list[float] = []
    blocked_max = 0.0
    blocked_at_end = 0
    for lane in by_thread.values():
        lane.sort(key=lambda r: r.order)
        unsettled = [r for r in lane if r.state not in SETTLED]
        blocked_at_end += len(unsettled) > 1 and unsettled[0].state == "running"
        unsettled_until = -math.inf  # when the lane's effects so far have all settled
        for r in lane:
            if r.state == "running" and r.lease_expires is not None and r.lease_expires < now:
                stuck.append(r)
            if unsettled_until > r.created:
                blocked_max = max(blocked_max, min(unsettled_until, now) - r.created)
            done = r.finished if r.state in SETTLED and r.finished is not None else math.inf
            unsettled_until = max(unsettled_until, done)
            if r.state in SETTLED and r.finished is not None:
                waits.append(max(0.0, r.finished - r.created))
    waits.sort()
    settled = sum(states[s] for s in SETTLED)
    return {
        "enqueued": sum(states.values()),
        "settled": settled,
        "by_state": dict(states),
        "stuck": len(stuck),
        "lanes_blocked_at_end": blocked_at_end,
        "lane_blocked_max_s": round(blocked_max, 3),
        "settle_p50_ms": round(_percentile(waits, 0.5) * 1000, 1),
        "settle_p99_ms": round(_percentile(waits, 0.99) * 1000, 1),
        "series": _series(by_thread, stuck, now=now, start=start),
    }


def _series(
    by_thread: dict[str, list[Row]], stuck: list[Row], *, now: float, start: float
) -> list[list[float]]:
    """``[t, enqueued so far, settled so far, stuck]`` every half second of the run;
    an effect counts as stuck from its lease's expiry on."""
    rows = [r for lane in by_thread.values() for r in lane]
    end = max(0.0, now - start)
    points = []
    steps = int(end / _BUCKET) + 1
    created = sorted(r.created - start for r in rows)
    finished = sorted(r.finished - start for r in rows if r.finished is not None)
    expiries = sorted((r.lease_expires or now) - start for r in stuck)
    ci = fi = si = 0
    for k in range(steps + 1):
        t = min(k * _BUCKET, end)
        while ci < len(created) and created[ci] <= t:
            ci += 1
        while fi < len(finished) and finished[fi] <= t:
            fi += 1
        while si < len(expiries) and expiries[si] <= t:
            si += 1
        points.append([round(t, 3), ci, fi, si])
    return points
