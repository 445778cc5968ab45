"""The ``fleetstore`` command's logging: what the library logs (its loggers are
``fleetstore.*``, silent until an application configures them) goes to stderr, at
WARNING unless ``-v`` (INFO; ``-vv`` DEBUG) or ``-q`` (ERROR; ``-qq`` CRITICAL) say
otherwise, as text or as one JSON object a line (``--log-format json``) with every
structured field a record carries (``extra=``: ``event``, ``store``, ...)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

#: The attributes every ``logging.LogRecord`` has: the rest are a record's fields.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
_LEVELS = {-2: logging.CRITICAL, -1: logging.ERROR, 0: logging.WARNING, 1: logging.INFO}

#: The handler the command installed (None: logging not configured by the command).
_handler: logging.Handler | None = None
#: Whether -v or -q was given (a command may then not change the level it chose).
_chosen = False
#: The level -v/-q chose, and --log-format.
_level = logging.WARNING
_format = "text"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the record's fields,
    and the traceback of an exception if it has one."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["traceback"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False, default=str)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Whatever ``sys.stderr`` is when a record comes (click's test runner swaps it)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> Any:
        return sys.stderr


def _set_level(handler: logging.Handler, level: int) -> None:
    # The handler filters; the logger only lets through what the handler may want.
    handler.setLevel(level)
    logger = logging.getLogger("fleetstore")
    if level < logger.getEffectiveLevel():
        logger.setLevel(level)


def configure(verbose: int, quiet: int, log_format: str) -> None:
    """Send the library's log records to stderr at the level -v/-q choose."""
    global _handler, _chosen, _level, _format
    logger = logging.getLogger("fleetstore")
    if _handler is not None:
        logger.removeHandler(_handler)
    handler = _Stderr()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    _level = _LEVELS.get(max(-2, min(verbose, 2) - min(quiet, 2)), logging.DEBUG)
    _set_level(handler, _level)
    _handler, _chosen, _format = handler, bool(verbose or quiet), log_format


def take_over(handler: logging.Handler, default: int) -> None:
    """A command that shows its log its own way (the worker: a failed attempt as one
    line): *handler* on the root logger (so its handlers' own loggers are shown too),
    instead of the group's, at the level -v/-q chose, else *default*; with
    ``--log-format json`` its records are JSON objects all the same."""
    global _handler
    if _handler is not None:
        logging.getLogger("fleetstore").removeHandler(_handler)
        _handler = None
    if _format == "json":
        handler.setFormatter(JsonFormatter())
    level = _level if _chosen else default
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(min(root.level, level) if root.level else level)
    _set_level(handler, level)


def default_level(level: int) -> None:
    """A command's own default level (the worker logs what it does at INFO; recover
    reports everything itself), unless -v or -q chose one."""
    if not _chosen and _handler is not None:
        _set_level(_handler, level)


__all__ = ["JsonFormatter", "configure", "default_level", "take_over"]
