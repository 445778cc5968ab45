"""What ``fleetstore maintain`` is asked to do: the ``Config``, its checks, and the
ages it is given in (``30d``, ``12h``...)."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from fleetstore import errors

#: The shortest applied_ops horizon accepted: far beyond any retry of an ambiguous write.
MIN_OPS_AGE = 3600.0
#: Default applied_ops horizon.
DEFAULT_OPS_AGE = 30 * 86400.0

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)?\s*$", re.IGNORECASE)
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_age(text: str) -> float:
    """Seconds in an age such as ``30d``, ``12h``, ``90m``, ``45s`` or ``2w``
    (a bare number is seconds).  ``InvalidInput`` otherwise."""
    match = _AGE.match(text)
    if not match:
        raise errors.InvalidInput(
            f"not an age: {text!r} (write a number and a unit: 30d, 12h, 90m, 45s, 2w)"
        )
    seconds = float(match[1]) * _UNITS[(match[2] or "").lower()]
    if not math.isfinite(seconds):
        raise errors.InvalidInput(f"not an age: {text!r}")
    return seconds


def format_age(seconds: float) -> str:
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True, slots=True)
class Config:
    """What ``maintain`` is asked to do.  Ages are in seconds."""

    path: str | None  # None: $FLEETSTORE_URL, else the default store
    dry_run: bool = False
    yes: bool = False
    archive_older_than: float | None = None
    archive_to: str | None = None
    delete_older_than: float | None = None
    #: None: applied_ops are not pruned.
    ops_older_than: float | None = DEFAULT_OPS_AGE
    #: None: max(10 min, 3 x write_budget).
    blob_grace: float | None = None
    #: Settings for the store (``Settings`` fields), e.g. write_budget.
    settings: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if (self.archive_older_than is None) != (self.archive_to is None):
            raise errors.InvalidInput("an archive needs both an age and a file")
        for name in ("archive_older_than", "delete_older_than", "blob_grace"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise errors.InvalidInput(f"{name} must be a finite age >= 0, not {value!r}")
        if self.ops_older_than is not None and not self.ops_older_than >= MIN_OPS_AGE:
            raise errors.InvalidInput(
                f"ops_older_than must be at least {format_age(MIN_OPS_AGE)} (operations may "
                "be retried for as long as a write budget after they were applied)"
            )
        if self.delete_older_than is not None and not (self.yes or self.dry_run):
            raise errors.InvalidInput(
                "--delete-older-than deletes sessions without archiving them: "
                "add --yes (or see what it would do with --dry-run)"
            )
        if self.archive_to is not None and os.path.lexists(self.archive_to) and not self.dry_run:
            raise errors.InvalidInput(
                f"{self.archive_to} exists: an archive is never overwritten; choose a new name"
            )


class NotConfirmed(errors.PermanentError):
    """A foreign database is maintained only when confirmed (``--yes``)."""


__all__ = ["DEFAULT_OPS_AGE", "MIN_OPS_AGE", "Config", "NotConfirmed", "format_age", "parse_age"]
