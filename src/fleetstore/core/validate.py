"""Argument checks: one set of rules and limits for every operation and importer.

Operations are checked inside their transaction (they also arrive from spool
journals and export files), and the Python API checks the same arguments before
anything is written; both use these functions, so a value accepted by one path is
accepted by every other and stored by either engine.  A bad value raises
``InvalidInput`` naming it; a check never lets a raw ``TypeError``,
``OverflowError`` or ``UnicodeEncodeError`` out.

``check_*`` take a value and what to call it; ``arg_*`` take an operation's
arguments and a key (the key names the value in the message).

The limits bound what one row holds inline, so that the largest record an export
writes (a session's row, a message's row with one part) stays well under the
export's line limit (64 MiB): docs/reference.md, "Limits".
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

from fleetstore import errors
from fleetstore.core.ids import is_valid_id

Args = Mapping[str, Any]

#: The largest integer either engine stores (SQLite INTEGER, PostgreSQL BIGINT).
INT_MAX = 2**63 - 1
#: One streamed chunk's text, in characters (a longer delta is stored as more chunks).
MAX_TEXT = 64 * 1024 * 1024
#: A short string argument (a title, a project, a tool's name...), unless said otherwise.
MAX_SHORT = 4096
#: A message role ("user", "assistant", "tool", ...).
ROLES_MAX = 64
#: A message's model name, a file part's mime type.
MAX_MODEL = 256
#: A message's error text (characters).
MAX_ERROR_TEXT = 64 * 1024
#: The longest wait or delay an argument may ask for (seconds): 366 days.
MAX_WAIT = 366 * 86400.0
#: A state value's key and namespace (the framework adapters keep their keys there too).
STATE_KEY_MAX = 1024
STATE_NAMESPACE_MAX = 256
#: The JSON text (UTF-8 bytes) of a session's or a message's metadata.
MAX_METADATA = 1024 * 1024
#: The JSON text of a part's meta (a tool's name and call id, a file's name and type).
MAX_PART_META = 64 * 1024
#: An inline payload's bytes (``blob_threshold`` is at most this; larger ones are blobs).
MAX_INLINE = 64 * 1024 * 1024


def _show(value: object) -> str:
    return repr(value) if not isinstance(value, str | bytes) else repr(value[:80])


def check_text(value: str, what: str) -> str:
    """*value*, or ``InvalidInput`` if it cannot be stored as UTF-8 (a lone surrogate,
    which would otherwise fail deep in the driver with a bare UnicodeEncodeError)."""
    if value.isascii():  # O(1) in CPython: most text is, and encoding it copies it
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise errors.InvalidInput(
            f"{what} is not valid Unicode text (a lone surrogate at position {exc.start})"
        ) from None
    return value


def check_id(value: object, what: str) -> str:
    """An id: a non-empty string of at most 128 characters without '/' or control
    characters (``core/ids.is_valid_id``)."""
    if not is_valid_id(value):
        raise errors.InvalidInput(
            f"{what} must be an id (a short string without '/'), not {_show(value)}"
        )
    return value  # type: ignore[return-value]


def check_opt_id(value: object, what: str) -> str | None:
    """An id, or None."""
    return None if value is None else check_id(value, what)


def check_str(value: object, what: str, *, limit: int = MAX_SHORT, empty: bool = True) -> str:
    """A string of at most *limit* characters (and not empty unless *empty*), valid
    UTF-8 without NUL: it goes to a text column, and PostgreSQL text cannot hold
    U+0000 (refused on every engine, so that both store the same values)."""
    if not isinstance(value, str) or len(value) > limit or (not empty and not value):
        size = f"{'a non-empty' if not empty else 'a'} string of at most {limit} characters"
        raise errors.InvalidInput(f"{what} must be {size}, not {_show(value)}")
    if "\x00" in value:
        raise errors.InvalidInput(f"{what} must not contain NUL (U+0000), not {_show(value)}")
    return value if value.isascii() else check_text(value, what)


def check_opt_str(value: object, what: str, limit: int = MAX_SHORT) -> str | None:
    """A string of at most *limit* characters, or None."""
    return None if value is None else check_str(value, what, limit=limit)


def check_int(value: object, what: str, *, minimum: int = 0, maximum: int = INT_MAX) -> int:
    """An integer (not a bool) from *minimum* to *maximum* (at most 2**63-1)."""
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not minimum <= value <= min(maximum, INT_MAX)
    ):
        top = "2**63-1" if maximum >= INT_MAX else str(maximum)
        raise errors.InvalidInput(
            f"{what} must be an integer from {minimum} to {top}, not {_show(value)}"
        )
    return value


def _finite(value: object) -> float | None:
    """*value* as a finite float, or None (not a number, a bool, NaN, infinite, or an
    integer too large for a float, on which ``math.isfinite`` raises OverflowError)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def check_number(
    value: object, what: str, *, minimum: float = -math.inf, maximum: float = math.inf
) -> float:
    """A finite number (int or float, not a bool) from *minimum* to *maximum*."""
    number = _finite(value)
    if number is None or not minimum <= number <= maximum:
        span = "" if math.isinf(minimum) and math.isinf(maximum) else f" in [{minimum}, {maximum}]"
        raise errors.InvalidInput(f"{what} must be a finite number{span}, not {_show(value)}")
    return number


def check_opt_number(value: object, what: str, *, minimum: float, maximum: float) -> float | None:
    """A finite number from *minimum* to *maximum*, or None."""
    return None if value is None else check_number(value, what, minimum=minimum, maximum=maximum)


def check_timeout(value: object, what: str = "timeout") -> float:
    """Seconds to wait: a finite number from 0 to ``MAX_WAIT``."""
    return check_number(value, what, minimum=0.0, maximum=MAX_WAIT)


def check_opt_timeout(value: object, what: str = "timeout") -> float | None:
    return None if value is None else check_timeout(value, what)


def check_time(value: object, what: str) -> float:
    """A time in seconds since the epoch (any finite number)."""
    number = _finite(value)
    if number is None:
        raise errors.InvalidInput(f"{what} must be a time in seconds, not {_show(value)}")
    return number


def check_bool(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise errors.InvalidInput(f"{what} must be true or false, not {_show(value)}")
    return value


def check_object(value: object, what: str) -> dict[str, Any]:
    """A JSON object (a dict with string keys)."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise errors.InvalidInput(
            f"{what} must be a JSON object (a dict with string keys), not {type(value).__name__}"
        )
    return value


def check_mapping(value: object, what: str) -> dict[str, Any]:
    """A JSON object given as any mapping with string keys, as a dict."""
    if not isinstance(value, Mapping):
        raise errors.InvalidInput(f"{what} must be a dict, not {type(value).__name__}")
    return check_object(dict(value), what)


def object_json(value: object, what: str, limit: int = MAX_METADATA) -> str:
    """The JSON text of a JSON object value (``check_object``, then ``dump_json``),
    at most *limit* bytes."""
    return dump_json(check_object(value, what), what, limit)


# One encoder: json.dumps with any option builds a new JSONEncoder per call, which was
# a tenth of the JSON cost of a turn (profile in docs/design.md, "Group commit").
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
# ... and its C function called directly: JSONEncoder.encode and .iterencode are two
# Python frames per value, three times a write (issue 24).  With cycle detection, as
# JSONEncoder's: a value that holds itself is refused, not a recursion.
_C_ENCODE = (
    json.encoder.c_make_encoder(  # type: ignore[attr-defined]
        {}, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
    if json.encoder.c_make_encoder is not None  # type: ignore[attr-defined]
    else None
)


def to_json(value: object) -> str:
    """JSON text for *value*, compact (``TypeError``/``ValueError`` if it is not JSON)."""
    if _C_ENCODE is None:
        return _ENCODER.encode(value)
    return "".join(_C_ENCODE(value, 0))


def dump_json(value: object, what: str, limit: int | None = None) -> str:
    """JSON text for *value* (at most *limit* bytes of UTF-8, if given), or
    ``InvalidInput`` naming *what* could not be stored."""
    try:
        text = to_json(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise errors.InvalidInput(f"{what} is not JSON-serialisable: {exc}") from None
    if not text.isascii():
        check_text(text, what)
    return text if limit is None else check_size(text, what, limit)


def check_size(text: str, what: str, limit: int) -> str:
    """*text* (JSON text, already valid), or ``InvalidInput`` if its UTF-8 is over
    *limit* bytes."""
    if len(text) > limit or len(text.encode("utf-8")) > limit:
        raise errors.InvalidInput(
            f"{what} is {len(text.encode('utf-8')):,} bytes of JSON, over its limit of {limit:,}"
        )
    return text


def check_strings(
    value: object, what: str, *, limit: int = MAX_SHORT, empty: bool = False
) -> list[str]:
    """An iterable of strings (a list, tuple, set...), never a bare string or bytes
    (which would be iterated character by character) nor a mapping."""
    if value.__class__ not in (list, tuple) and (
        isinstance(value, str | bytes | bytearray | memoryview | Mapping)
        or not isinstance(value, Iterable)
    ):  # (a list or tuple, the usual, first: the ABC checks were 16 calls of a claim's)
        raise errors.InvalidInput(
            f"{what} must be a list of strings, not {type(value).__name__} {_show(value)}"
        )
    return [check_str(item, f"an item of {what}", limit=limit, empty=empty) for item in value]


def check_path(value: object, what: str = "path") -> str:
    """A file system path (str or os.PathLike of str) without NUL, as text;
    ``ConfigError`` otherwise."""
    try:
        text = os.fspath(value)  # type: ignore[call-overload]
    except TypeError:
        raise errors.ConfigError(f"{what} must be a path, not {type(value).__name__}") from None
    if not isinstance(text, str):
        raise errors.ConfigError(f"{what} must be a text path, not {type(text).__name__}")
    if "\x00" in text:
        raise errors.ConfigError(f"{what} must not contain NUL: {text!r:.80}")
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise errors.ConfigError(f"{what} is not a valid path: {text!r:.80}") from None
    return text


# -- an operation's arguments ---------------------------------------------------------------


def arg_id(args: Args, key: str, optional: bool = False) -> Any:
    value = args.get(key)
    if value is None and optional:
        return None
    return check_id(value, key)


def arg_str(
    args: Args, key: str, optional: bool = True, limit: int = MAX_SHORT, empty: bool = True
) -> Any:
    value = args.get(key)
    if value is None and optional:
        return None
    return check_str(value, key, limit=limit, empty=empty)


def arg_int(
    args: Args,
    key: str,
    optional: bool = True,
    minimum: int = 0,
    maximum: int = INT_MAX,
    default: int | None = None,
) -> Any:
    value = args.get(key, default)
    if value is None and optional:
        return None
    return check_int(value, key, minimum=minimum, maximum=maximum)


def arg_number(args: Args, key: str, default: float, minimum: float, maximum: float) -> float:
    return check_number(args.get(key, default), key, minimum=minimum, maximum=maximum)


def arg_time(args: Args, key: str) -> float:
    """*key*'s time, by default the operation's ``now``."""
    return check_time(args.get(key, args["now"]), key)


def arg_when(args: Args, key: str, optional: bool = False) -> Any:
    """A time argument with no default."""
    value = args.get(key)
    if value is None and optional:
        return None
    return check_time(value, key)


def arg_meta(args: Args, key: str = "metadata", limit: int = MAX_METADATA) -> str:
    """A JSON object argument (None: ``{}``) as the JSON text to store, at most
    *limit* bytes."""
    value = args.get(key)
    return object_json({} if value is None else value, key, limit)


__all__ = [
    "INT_MAX",
    "MAX_ERROR_TEXT",
    "MAX_INLINE",
    "MAX_METADATA",
    "MAX_MODEL",
    "MAX_PART_META",
    "MAX_SHORT",
    "MAX_TEXT",
    "MAX_WAIT",
    "ROLES_MAX",
    "STATE_KEY_MAX",
    "STATE_NAMESPACE_MAX",
    "arg_id",
    "arg_int",
    "arg_meta",
    "arg_number",
    "arg_str",
    "arg_time",
    "arg_when",
    "check_bool",
    "check_id",
    "check_int",
    "check_mapping",
    "check_number",
    "check_object",
    "check_opt_id",
    "check_opt_number",
    "check_opt_str",
    "check_opt_timeout",
    "check_path",
    "check_size",
    "check_str",
    "check_strings",
    "check_text",
    "check_time",
    "check_timeout",
    "dump_json",
    "to_json",
    "object_json",
]
