"""The generic steps (``optimize``, ``vacuum``, ``checkpoint``), which run on any
SQLite file in WAL mode, a foreign one too (through ``OutsideFile``: nothing of ours
beside it): on one file, or on every file of a sharded store one at a time, each
step's figures summed over the files."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fleetstore import errors
from fleetstore.admin.maintain.checkpoint import checkpoint
from fleetstore.admin.maintain.config import Config
from fleetstore.admin.maintain.files import each_file, file_count
from fleetstore.admin.maintain.report import Progress, Report, Step, timed
from fleetstore.admin.maintain.vacuum import optimize, vacuum
from fleetstore.admin.maintain.writer import Writer
from fleetstore.core.units import size as _size
from fleetstore.engine.sqlite import Database
from fleetstore.files.outside import OutsideFile


def generic_steps(
    db: Database | OutsideFile, config: Config, report: Report, progress: Progress | None
) -> None:
    writer = Writer(db)
    timed(report, Step("optimize"), lambda s: optimize(writer, s, config.dry_run))
    timed(report, Step("vacuum"), lambda s: vacuum(writer, s, config.dry_run, progress))
    timed(report, Step("checkpoint"), lambda s: checkpoint(db, s, config.dry_run))


def generic_steps_each(
    store: Any, config: Config, report: Report, progress: Progress | None
) -> None:
    """The generic steps on every file of a sharded store, one file at a time, each
    step's figures summed over the files."""
    steps = {name: Step(name) for name in ("optimize", "vacuum", "checkpoint")}
    started = time.monotonic()
    for step in steps.values():
        report.steps.append(step)
    total = file_count(store)
    done = [0]

    def visit(_key: str | None, db: Database) -> None:
        writer = Writer(db)
        runs: list[tuple[str, Callable[[Step], None]]] = [
            ("optimize", lambda s: optimize(writer, s, config.dry_run)),
            ("vacuum", lambda s: vacuum(writer, s, config.dry_run, None)),
            ("checkpoint", lambda s: checkpoint(db, s, config.dry_run)),
        ]
        for name, run in runs:
            one = Step(name)
            try:
                run(one)
            except errors.FleetstoreError as exc:
                one.status = "failed"
                one.summary = f"{db.path}: {type(exc).__name__}: {exc}"
            _merge(steps[name], one)
        done[0] += 1
        if progress is not None:
            progress("files", done[0], total)

    try:
        each_file(store, visit)
    except errors.FleetstoreError as exc:
        for step in steps.values():
            step.status = "failed"
            step.summary = f"{type(exc).__name__}: {exc}"
    seconds = time.monotonic() - started
    for step in steps.values():
        step.seconds = seconds
        _sum_up(step, done[0])


def _merge(total: Step, one: Step) -> None:
    """Add one file's run of a step to the step's figures over every file."""
    total.transactions += one.transactions
    total.max_wait = max(total.max_wait, one.max_wait)
    total.max_hold = max(total.max_hold, one.max_hold)
    total.total_hold += one.total_hold
    total.last_hold = one.last_hold
    statuses = total.detail.setdefault("files_by_status", {})
    statuses[one.status] = statuses.get(one.status, 0) + 1
    for key in _SUMMED:
        value = one.detail.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            total.detail[key] = total.detail.get(key, 0) + value
    if one.name == "vacuum":
        page = int(one.detail.get("page_size", 0))
        for key in ("free", "freed"):
            pages = int(one.detail.get(f"{key}_pages", 0))
            total.detail[f"{key}_bytes"] = total.detail.get(f"{key}_bytes", 0) + pages * page
    if one.status == "failed":
        total.status = "failed"
        failures = total.detail.setdefault("failures", [])
        if len(failures) < 20:
            failures.append(one.summary)


#: Figures of a per-file step that add up over the files of a sharded store.
_SUMMED = (
    "pages",
    "free_pages",
    "freed_pages",
    "wal_frames",
    "checkpointed",
    "wal_bytes_before",
    "wal_bytes_after",
    "checkpoint_seconds",
)


def _sum_up(step: Step, files: int) -> None:
    """The summary of a step run on every file of a sharded store."""
    d = step.detail
    by = d.get("files_by_status", {})
    if step.status != "failed":
        if by.get("dry-run"):
            step.status = "dry-run"
        elif not by.get("done"):
            step.status = "nothing" if by.get("nothing") or not by else "skipped"
    if step.name == "optimize":
        text = ("would run" if step.status == "dry-run" else "ran") + " PRAGMA optimize"
    elif step.name == "vacuum":
        if step.status == "dry-run":
            text = (
                f"would return {d.get('free_pages', 0)} free pages "
                f"({_size(d.get('free_bytes', 0))})"
            )
        elif step.status == "nothing":
            text = "no free pages"
        else:
            freed = int(d.get("freed_pages", 0))
            text = f"returned {freed} pages ({_size(d.get('freed_bytes', 0))})"
        if by.get("skipped"):
            text += f"; {by['skipped']} file(s) without incremental auto-vacuum"
    else:
        wal = _size(d.get("wal_bytes_before", 0))
        if step.status == "dry-run":
            text = f"would checkpoint {wal} of WAL"
        else:
            text = f"checkpointed {wal} of WAL, {_size(d.get('wal_bytes_after', 0))} left"
    step.summary = f"{text} in {files} file(s)" + (
        f"; FAILED in {by['failed']}: {'; '.join(d.get('failures', [])[:3])}"
        if by.get("failed")
        else ""
    )


__all__ = ["generic_steps", "generic_steps_each"]
