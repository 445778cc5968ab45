"""What a worker is given: its handlers (``Handler``, or a plain function, per kind), the
exceptions a handler raises to say what to do (``RetryEffect``, ``FailEffect``), and each
kind's retry policy; the checks of a worker's settings (``ConfigError``)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleetstore import errors
from fleetstore.core.validate import MAX_WAIT, check_int, check_number
from fleetstore.domain.outbox import MAX_ATTEMPTS_LIMIT
from fleetstore.models import Effect

#: Seconds a handler may run per attempt unless told otherwise (``handler_timeout``).
DEFAULT_HANDLER_TIMEOUT = 600.0


class RetryEffect(Exception):
    """Raise in a handler to run the effect again after *delay* seconds
    (default: the worker's backoff)."""

    def __init__(self, message: str = "retry requested", delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class FailEffect(Exception):
    """Raise in a handler to fail the effect for good (``dead``, reason ``failed``)."""


@dataclass(frozen=True, slots=True)
class Handler:
    """A handler with what the store must know about its kind: whether the
    effect may run again after the worker running it was lost (killed, cut
    off past its lease) or gave up on it (*timeout*).  Not replay-safe effects
    go to ``dead`` instead.  *timeout*: seconds an attempt may run (None: the
    worker's ``handler_timeout``; ``math.inf``: no limit).

    *max_attempts*, *backoff*, *max_backoff*: the worker's retry policy for this
    kind (None: the worker's).  *max_attempts* caps the effect's own: a flaky kind
    can be given up on sooner, so its thread moves on (docs/outbox.md, "A retry
    holds its thread")."""

    fn: Callable[[Effect], Any]
    replay_safe: bool = True
    timeout: float | None = None
    max_attempts: int | None = None
    backoff: float | None = None
    max_backoff: float | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    """How a kind's failed attempts are retried: ``backoff * 2**(attempt-1)`` seconds,
    at most ``max_backoff``, ±10 %; dead after ``max_attempts`` (None: the effect's)."""

    backoff: float
    max_backoff: float
    max_attempts: int | None

    def delay(self, attempt: int) -> float:
        delay = min(self.max_backoff, self.backoff * 2.0 ** min(max(attempt - 1, 0), 64))
        return delay * random.uniform(0.9, 1.1)


def timeout_setting(value: object, what: str) -> float | None:
    """A handler timeout: None or ``math.inf`` (no limit), else 0.001 to MAX_WAIT s."""
    if value is None or (isinstance(value, float) and value == math.inf):
        return None
    return float(setting(check_number, value, what, minimum=0.001, maximum=MAX_WAIT))


def handler_of(value: object, kind: str) -> Handler:
    if isinstance(value, Handler):
        if not callable(value.fn) or not isinstance(value.replay_safe, bool):
            raise errors.ConfigError(
                f"handler for {kind!r}: fn must be callable, replay_safe a bool"
            )
        timeout_setting(value.timeout, f"the timeout of handler {kind!r}")
        policy_settings(value.max_attempts, value.backoff, value.max_backoff, f"handler {kind!r}")
        return value
    if callable(value):
        return Handler(value)
    raise errors.ConfigError(f"handler for {kind!r} is not callable: {value!r}")


def policy_settings(max_attempts: object, backoff: object, max_backoff: object, whose: str) -> None:
    """The retry settings of a worker or a handler (None: not set): ``ConfigError``."""
    if max_attempts is not None:
        setting(
            check_int,
            max_attempts,
            f"max_attempts of {whose}",
            minimum=1,
            maximum=MAX_ATTEMPTS_LIMIT,
        )
    for name, value in (("backoff", backoff), ("max_backoff", max_backoff)):
        if value is not None:
            setting(check_number, value, f"{name} of {whose}", minimum=0.0, maximum=MAX_WAIT)


def setting(check: Callable[..., Any], value: object, what: str, **limits: Any) -> Any:
    """*check* (a ``core.validate`` function) of a worker argument: ``ConfigError``."""
    try:
        return check(value, what, **limits)
    except errors.InvalidInput as exc:
        raise errors.ConfigError(str(exc)) from None


def lower(a: int | None, b: int | None) -> int | None:
    """The lower of two optional limits (None: no limit)."""
    return b if a is None else a if b is None else min(a, b)


__all__ = [
    "DEFAULT_HANDLER_TIMEOUT",
    "FailEffect",
    "Handler",
    "Policy",
    "RetryEffect",
    "handler_of",
    "lower",
    "policy_settings",
    "setting",
    "timeout_setting",
]
