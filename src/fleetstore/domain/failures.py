"""A handler's failure as the worker reports it: its traceback from the handler's own
frame (kept, bounded, with the attempt) and one log record per failed attempt, saying
what the store made of it (issue 25: a handler's exception was never logged)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import traceback
from pathlib import Path

from fleetstore.domain import completer
from fleetstore.domain.codec import redacted_copy
from fleetstore.domain.handlers import FailEffect, RetryEffect
from fleetstore.domain.outbox import Claim
from fleetstore.models import EffectState

#: A failed attempt: its error text, the exception (None: a timeout, a lost thread),
#: and the delay before the next attempt.
Failed = tuple[str, BaseException | None, float]

#: The worker's own files: a handler's frames start after theirs (the thread that ran it).
_OWN_FILES = frozenset({str(Path(__file__).with_name("worker.py")), completer.__file__})


def handler_traceback(exc: BaseException | None) -> str | None:
    """*exc*'s traceback as text, from the handler's frame: the worker's own frames
    (the thread or the task that called it) say nothing about the failure."""
    if exc is None:
        return None
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def where_raised(exc: BaseException | None) -> str | None:
    """Where *exc* was raised: ``file:line in function`` of its innermost frame."""
    tb = None if exc is None else exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    path = code.co_filename
    with contextlib.suppress(ValueError):
        relative = os.path.relpath(path)
        path = relative if not relative.startswith("..") else path
    return f"{path}:{tb.tb_lineno} in {code.co_name}"


def log_failure(
    log: logging.Logger,
    claim: Claim,
    failed: Failed,
    limit: int | None,
    unrecorded: str | None = None,
) -> None:
    """Log a failed attempt once, with what the store made of it: a WARNING for
    one to run again, an ERROR for a dead effect (or an outcome not recorded);
    an unexpected exception's record carries its traceback."""
    error, exc, delay = failed
    # What the store keeps is redacted (Claim._failure); the log gets the same text and,
    # where the traceback holds what a rule finds, the redacted traceback instead of the
    # exception's own (a log file keeps a printed key as long as a database would).
    store = claim._store
    error = redacted_copy(store, error) or error
    exc_info = exc if exc is not None and not isinstance(exc, RetryEffect | FailEffect) else None
    shown = ""
    if exc_info is not None and store.redaction is not None:
        text = "".join(traceback.format_exception(type(exc_info), exc_info, exc_info.__traceback__))
        if store.redaction.screen(text) is not None:
            exc_info, shown = None, "\n" + (redacted_copy(store, text) or "").rstrip("\n")
    effect = claim.effect
    state = claim.settled
    retry_at: float | None = None
    if unrecorded is not None:
        step, then = "unknown", unrecorded
    elif state is None:
        step, then = "spooled", "its outcome waits in the spool"
    elif state is EffectState.dead:
        step, then = "dead", f"dead ({claim.dead_reason})"
    else:
        step, retry_at = "retry", time.time() + delay
        then = f"retry in {delay:.3g}s"
    where = where_raised(exc)
    fields = {
        "effect_id": effect.id,
        "kind": effect.kind,
        "thread_key": effect.thread_key,
        "attempt": effect.attempt,
        "max_attempts": limit,
        "error": error,
        "where": where,
        "next": step,
        "retry_at": retry_at,
        "dead_reason": claim.dead_reason if step == "dead" else None,
    }
    log.log(
        logging.WARNING if step in ("retry", "spooled") else logging.ERROR,
        "%s %s (thread %s) attempt %d of %d failed: %s%s; %s%s",
        effect.kind,
        effect.id,
        effect.thread_key,
        effect.attempt,
        limit,
        error,
        f" (at {where})" if where else "",
        then,
        shown,
        exc_info=exc_info,
        # Each field for a formatter, and all of them as one for a consumer
        # (fleetstore worker's lines and JSON).
        extra={**fields, "event": "effect_failed", "failure": fields},
    )


__all__ = ["Failed", "handler_traceback", "log_failure", "where_raised"]
