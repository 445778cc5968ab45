"""What a run of ``fleetstore maintain`` did: a ``Step`` per step (its status, summary,
figures and the cost of its writes), the ``Report`` of them all, and its text and JSON."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetstore import errors
from fleetstore.core.render import table

#: ``progress(stage, done, total)``.
Progress = Callable[[str, int, int], None]


@dataclass(slots=True)
class Step:
    """What one step did (or, in a dry run, would do), and what its writes cost."""

    name: str
    status: str = "done"  # done | nothing | skipped | dry-run | failed
    summary: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    transactions: int = 0
    max_wait: float = 0.0
    max_hold: float = 0.0
    total_hold: float = 0.0
    last_hold: float = 0.0
    seconds: float = 0.0

    def record(self, wait: float, hold: float) -> None:
        self.last_hold = hold
        self.transactions += 1
        self.max_wait = max(self.max_wait, wait)
        self.max_hold = max(self.max_hold, hold)
        self.total_hold += hold

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class Report:
    path: str
    kind: str  # "fleetstore" or "foreign"
    dry_run: bool
    steps: list[Step] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.status != "failed" for s in self.steps)

    @property
    def max_hold(self) -> float:
        return max((s.max_hold for s in self.steps), default=0.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "dry_run": self.dry_run,
            "ok": self.ok,
            "max_hold": self.max_hold,
            "steps": [s.to_json() for s in self.steps],
        }


def timed(report: Report, step: Step, fn: Callable[[Step], None]) -> None:
    started = time.monotonic()
    report.steps.append(step)
    try:
        fn(step)
    except errors.FleetstoreError as exc:
        step.status = "failed"
        step.summary = (
            step.summary + "; " if step.summary else ""
        ) + f"{type(exc).__name__}: {exc}"
    finally:
        step.seconds = time.monotonic() - started


def format_report(report: Report) -> str:
    kind = "fleetstore store" if report.kind == "fleetstore" else "foreign database"
    lines = [f"fleetstore maintain: {report.path} ({kind}){' (dry run)' if report.dry_run else ''}"]
    rows = [
        (
            s.name,
            ("FAILED " if s.status == "failed" else "") + s.summary,
            f"{s.transactions} tx, max hold {s.max_hold * 1000:.1f} ms, "
            f"max wait {s.max_wait * 1000:.1f} ms"
            if s.transactions
            else "",
        )
        for s in report.steps
    ]
    lines.append(table(("step", "what it did", "its writes"), rows))
    if not report.dry_run:
        lines.append(
            f"  longest lock hold of a maintenance transaction: {report.max_hold * 1000:.1f} ms"
        )
    return "\n".join(lines)


__all__ = ["Progress", "Report", "Step", "format_report", "timed"]
