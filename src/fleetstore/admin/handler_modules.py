"""``fleetstore worker``'s handlers: the mapping of kind -> handler that MODULE:HANDLERS
names (the worker itself is fleetstore.Worker)."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Mapping


class HandlersError(ValueError):
    """MODULE:HANDLERS names no usable handlers (the message says why)."""


def load_handlers(spec: str) -> dict[str, object]:
    """The handlers *spec* names: ``MODULE:HANDLERS``, a non-empty mapping of kind ->
    handler, or a function taking no arguments that returns one.  MODULE is imported
    as ``python -m`` would import it: the current directory is on ``sys.path``.
    ``HandlersError`` if the spec is malformed, MODULE cannot be imported, or HANDLERS
    is not such a mapping; whatever else importing MODULE or calling HANDLERS raises
    goes through."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise HandlersError("write MODULE:HANDLERS, e.g. myapp.effects:HANDLERS")
    if not all(part.isidentifier() for part in module_name.split(".")):
        # (A relative or path-like name, "../x" or ".x": importlib raised a TypeError.)
        raise HandlersError(f"{module_name!r} is not a module name, e.g. myapp.effects")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the project's own modules
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise HandlersError(f"cannot import {module_name!r}: {exc}") from None
    value = getattr(module, attr, None)
    if callable(value) and not isinstance(value, Mapping):
        try:
            inspect.signature(value).bind()
        except TypeError as exc:
            raise HandlersError(f"{spec} is a function that takes arguments: {exc}") from None
        except ValueError:
            pass  # (no signature to read: a builtin; called as it is)
        value = value()  # what it raises goes through: a TypeError of its own included
    if not isinstance(value, Mapping) or not value:
        raise HandlersError(
            f"{spec} must be a non-empty mapping of kind -> handler (or a function returning one)"
        )
    return dict(value)


__all__ = ["HandlersError", "load_handlers"]
