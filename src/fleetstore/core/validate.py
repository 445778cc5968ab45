"""Argument checks: one set of rules and limits for every operation and importer.

Operations are checked inside their transaction (they also arrive from spool
journals and export files), and the Python API checks the same arguments before
anything is written; both use these functions, so a value accepted by one path
is accepted by every other.  A bad value raises ``InvalidInput`` naming it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from fleetstore import errors
from fleetstore.core.ids import is_valid_id

Args = Mapping[str, Any]

#: One inline string (far above blob_threshold).
MAX_TEXT = 64 * 1024 * 1024
#: A message role ("user", "assistant", "tool", ...).
ROLES_MAX = 64


def arg_id(args: Args, key: str, optional: bool = False) -> Any:
    value = args.get(key)
    if value is None and optional:
        return None
    if not is_valid_id(value):
        raise errors.InvalidInput(
            f"{key} must be an id (a short string without '/'), not {value!r}"
        )
    return value


def arg_str(args: Args, key: str, optional: bool = True, limit: int = 4096) -> Any:
    value = args.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise errors.InvalidInput(f"{key} must be a string of at most {limit} characters")
    return check_text(value, key)


def check_text(value: str, what: str) -> str:
    """*value*, or ``InvalidInput`` if it cannot be stored as UTF-8 (a lone surrogate,
    which would otherwise fail deep in the driver with a bare UnicodeEncodeError)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise errors.InvalidInput(
            f"{what} is not valid Unicode text (a lone surrogate at position {exc.start})"
        ) from None
    return value


def arg_int(args: Args, key: str, optional: bool = True, minimum: int = 0) -> Any:
    value = args.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise errors.InvalidInput(f"{key} must be an integer >= {minimum}, not {value!r}")
    return value


def arg_time(args: Args, key: str) -> float:
    value = args.get(key, args["now"])
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise errors.InvalidInput(f"{key} must be a time in seconds, not {value!r}")
    return float(value)


def dump_json(value: object, what: str) -> str:
    """JSON text for *value*, or ``InvalidInput`` naming *what* could not be stored."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise errors.InvalidInput(f"{what} is not JSON-serialisable: {exc}") from None
    return check_text(text, what)


def arg_meta(args: Args, key: str = "metadata") -> str:
    value = args.get(key)
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise errors.InvalidInput(
            f"{key} must be a JSON object (a dict), not {type(value).__name__}"
        )
    return dump_json(value, key)


__all__ = [
    "MAX_TEXT",
    "ROLES_MAX",
    "arg_id",
    "arg_int",
    "arg_meta",
    "arg_str",
    "arg_time",
    "check_text",
    "dump_json",
]
