"""The ``checkpoint`` step: a WAL checkpoint, truncating the WAL when no reader
blocks it.  Generic: it runs on a foreign database too."""

from __future__ import annotations

import time

from fleetstore.admin.maintain.files import file_size
from fleetstore.admin.maintain.report import Step
from fleetstore.core.units import size as _size
from fleetstore.engine.sqlite import Database
from fleetstore.files.outside import OutsideFile


def checkpoint(db: Database | OutsideFile, step: Step, dry_run: bool) -> None:
    wal = file_size(db.path + "-wal")
    step.detail["wal_bytes_before"] = wal
    if dry_run:
        step.status = "dry-run"
        step.summary = f"would checkpoint a {_size(wal)} WAL (truncated if no reader blocks it)"
        return
    # Truncated whatever its size, but still only when every frame was copied,
    # i.e. no reader blocks it.
    started = time.monotonic()
    log, done = db.checkpoint(truncate=True)
    step.detail["checkpoint_seconds"] = time.monotonic() - started
    after = file_size(db.path + "-wal")
    step.detail.update(wal_frames=log, checkpointed=done, wal_bytes_after=after)
    if log < 0:
        step.status = "skipped"
        step.summary = "another checkpoint was running"
    elif after == 0:
        step.summary = f"WAL of {_size(wal)} checkpointed and truncated"
    else:
        blocked = " (a reader holds frames back)" if done < log else ""
        step.summary = f"{done} of {log} frames checkpointed{blocked}; WAL {_size(after)}"


__all__ = ["checkpoint"]
