"""The outbox's limits and the checks of its operations' arguments (inside the
transaction: spooled operations are checked again), apart from domain/outbox.py
(which imports them) to keep each module under 1,000 lines."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from fleetstore import errors
from fleetstore.core.validate import (
    MAX_WAIT,
    check_number,
    check_str,
    check_strings,
)
from fleetstore.domain.operations import Args
from fleetstore.models import EffectState

#: Seconds a claim's lease lasts unless renewed; workers heartbeat at a third of it.
DEFAULT_LEASE = 30.0
DEFAULT_MAX_ATTEMPTS = 5
#: Failed attempts kept per effect (the newest).
ERRORS_KEPT = 20
MAX_THREAD_KEY = 1024
MAX_KIND = 256
MAX_ERROR = 16 * 1024
#: A failed attempt's traceback is kept cut to its last 8 Ki characters: the innermost
#: frames and the exception, which say where it failed (a deep stack's outer frames
#: are the framework's).
MAX_TRACEBACK = 8 * 1024
#: A handler's result is kept inline: larger results belong in the store proper.
MAX_RESULT = 1024 * 1024
MAX_ATTEMPTS_LIMIT = 10_000
MAX_DELAY = MAX_WAIT
MAX_LEASE = 86400.0
MAX_CLAIM = 1000

_STATES = tuple(s.value for s in EffectState)
_OUTCOMES = ("succeeded", "retry", "dead", "cancelled", "release", "timed_out")


def _replay_safe(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise errors.InvalidInput(f"replay_safe must be true, false or null, not {value!r}")
    return int(value)


def _error_text(value: object, what: str = "an effect error", limit: int = MAX_ERROR) -> str:
    """An effect error as kept: at most *limit* characters, NUL and lone surrogates
    replaced (it is often an exception's message, which may hold anything)."""
    if not isinstance(value, str):
        raise errors.InvalidInput(f"{what} must be a string, not {type(value).__name__}")
    value = value[: limit + 1].replace("\x00", "\ufffd")
    value = value.encode("utf-8", "replace").decode("utf-8")
    return value if len(value) <= limit else value[: limit - 1] + "…"


def _traceback_text(value: object) -> str | None:
    """A traceback as kept: None, or its last MAX_TRACEBACK characters (the end is
    where it failed), cleaned like an error."""
    if value is None:
        return None
    if isinstance(value, str) and len(value) > MAX_TRACEBACK:
        value = "…" + value[-(MAX_TRACEBACK - 1) :]
    return _error_text(value, "a traceback", MAX_TRACEBACK)


def _kinds_json(kinds: Iterable[str] | None) -> str | None:
    if kinds is None:
        return None
    listed = sorted(set(check_strings(kinds, "kinds", limit=MAX_KIND)))
    return json.dumps(listed)


def _timeouts_json(timeouts: Mapping[str, float] | None) -> str | None:
    """``{kind: seconds}`` as the JSON text a claim records deadlines from (None: none)."""
    if timeouts is None:
        return None
    if not isinstance(timeouts, Mapping):
        raise errors.InvalidInput(
            f"timeouts must be a dict of kind -> seconds, not {timeouts!r:.80}"
        )
    checked = {
        check_str(kind, "a timeout's kind", limit=MAX_KIND, empty=False): check_number(
            seconds, f"the timeout of kind {kind!r}", minimum=0.001, maximum=MAX_WAIT
        )
        for kind, seconds in sorted(timeouts.items())
    }
    return json.dumps(checked) if checked else None


def _timeouts_arg(a: Args) -> str | None:
    """The ``timeouts`` argument of a claim: null or the JSON text of an object."""
    text = a.get("timeouts")
    if text is None:
        return None
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise errors.InvalidInput(f"timeouts must be the JSON text of an object, not {text!r:.80}")
    return _timeouts_json(value)


def _kinds_arg(a: Args) -> str | None:
    """The ``kinds`` argument of a claim: null or the JSON text of a list of kinds."""
    text = a.get("kinds")
    if text is None:
        return None
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    if not isinstance(value, list):
        raise errors.InvalidInput(f"kinds must be the JSON text of a list, not {text!r:.80}")
    return _kinds_json(value)
