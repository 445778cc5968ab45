"""fleetstore: storage a whole fleet of agent processes can write at once.

``fleetstore.open()`` gives a ``Store``: sessions, messages (streamed or whole),
versioned state, blobs, the spool and the effect outbox (``store.effects``, run by
``fleetstore.Worker``); ``await fleetstore.open_async()`` gives the same API as
coroutines.  ``fleetstore.Database`` is the lower
layer: a SQLite file that many processes write safely, with a cross-process
writer gate, a bounded lock wait and strict connection hygiene.

Importing the package is cheap: its errors and version are loaded at once, every
other public name when first used (PEP 562 ``__getattr__``), so the ``fleetstore``
command starts without loading the engine, apsw or zstandard it may not need
(tests/cli/test_startup.py).  ``_LAZY`` says where each name lives; the
``TYPE_CHECKING`` imports say the same to type checkers, and
tests/cli/test_startup.py keeps the two equal.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fleetstore import errors
from fleetstore.core.version import __version__
from fleetstore.errors import (
    AlreadyExists,
    ConfigError,
    FleetstoreError,
    InvalidInput,
    LeaseLost,
    MigrationError,
    NotFound,
    PayloadTooLarge,
    PermanentError,
    SpoolPending,
    StoreBusy,
    TransientError,
    VersionConflict,
)

if TYPE_CHECKING:
    from fleetstore.core.settings import Settings, default_data_dir
    from fleetstore.domain.history import Messages, Stream, ToolCallHandle
    from fleetstore.domain.operations import Delivery, Operation
    from fleetstore.domain.outbox import Claim, Effects, Swept
    from fleetstore.domain.search import Search
    from fleetstore.domain.sessions import Sessions
    from fleetstore.domain.state import State
    from fleetstore.domain.worker import FailEffect, Handler, RetryEffect, Worker
    from fleetstore.engine.sqlite import Database, Migration, ReadTx, WriteTx
    from fleetstore.models import (
        Effect,
        EffectError,
        EffectState,
        File,
        Message,
        MessageStatus,
        NewEffect,
        Page,
        Part,
        Reasoning,
        SearchHit,
        SearchStatus,
        Session,
        SessionStatus,
        StateValue,
        Text,
        ToolCall,
        ToolResult,
        Usage,
    )
    from fleetstore.store.aio import (
        AsyncClaim,
        AsyncEffects,
        AsyncMessages,
        AsyncSearch,
        AsyncSessions,
        AsyncState,
        AsyncStore,
        AsyncStream,
        AsyncToolCallHandle,
        open_async,
    )
    from fleetstore.store.facade import Store, open

#: Every public name not loaded at import: the module it lives in.
_LAZY: dict[str, str] = {
    "Settings": "fleetstore.core.settings",
    "default_data_dir": "fleetstore.core.settings",
    "Messages": "fleetstore.domain.history",
    "Sessions": "fleetstore.domain.sessions",
    "Stream": "fleetstore.domain.history",
    "ToolCallHandle": "fleetstore.domain.history",
    "Delivery": "fleetstore.domain.operations",
    "Operation": "fleetstore.domain.operations",
    "Claim": "fleetstore.domain.outbox",
    "Effects": "fleetstore.domain.outbox",
    "Swept": "fleetstore.domain.outbox",
    "Search": "fleetstore.domain.search",
    "State": "fleetstore.domain.state",
    "FailEffect": "fleetstore.domain.worker",
    "Handler": "fleetstore.domain.worker",
    "RetryEffect": "fleetstore.domain.worker",
    "Worker": "fleetstore.domain.worker",
    "Database": "fleetstore.engine.sqlite",
    "Migration": "fleetstore.engine.sqlite",
    "ReadTx": "fleetstore.engine.sqlite",
    "WriteTx": "fleetstore.engine.sqlite",
    "Effect": "fleetstore.models",
    "EffectError": "fleetstore.models",
    "EffectState": "fleetstore.models",
    "File": "fleetstore.models",
    "Message": "fleetstore.models",
    "MessageStatus": "fleetstore.models",
    "NewEffect": "fleetstore.models",
    "Page": "fleetstore.models",
    "Part": "fleetstore.models",
    "Reasoning": "fleetstore.models",
    "SearchHit": "fleetstore.models",
    "SearchStatus": "fleetstore.models",
    "Session": "fleetstore.models",
    "SessionStatus": "fleetstore.models",
    "StateValue": "fleetstore.models",
    "Text": "fleetstore.models",
    "ToolCall": "fleetstore.models",
    "ToolResult": "fleetstore.models",
    "Usage": "fleetstore.models",
    "AsyncClaim": "fleetstore.store.aio",
    "AsyncEffects": "fleetstore.store.aio",
    "AsyncMessages": "fleetstore.store.aio",
    "AsyncSearch": "fleetstore.store.aio",
    "AsyncSessions": "fleetstore.store.aio",
    "AsyncState": "fleetstore.store.aio",
    "AsyncStore": "fleetstore.store.aio",
    "AsyncStream": "fleetstore.store.aio",
    "AsyncToolCallHandle": "fleetstore.store.aio",
    "open_async": "fleetstore.store.aio",
    "Store": "fleetstore.store.facade",
    "open": "fleetstore.store.facade",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fleetstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "AlreadyExists",
    "AsyncClaim",
    "AsyncEffects",
    "AsyncMessages",
    "AsyncSearch",
    "AsyncSessions",
    "AsyncState",
    "AsyncStore",
    "AsyncStream",
    "AsyncToolCallHandle",
    "Claim",
    "ConfigError",
    "Database",
    "Delivery",
    "Effect",
    "EffectError",
    "EffectState",
    "Effects",
    "FailEffect",
    "File",
    "FleetstoreError",
    "Handler",
    "InvalidInput",
    "LeaseLost",
    "Message",
    "MessageStatus",
    "Messages",
    "Migration",
    "MigrationError",
    "NewEffect",
    "NotFound",
    "Page",
    "Operation",
    "Part",
    "PayloadTooLarge",
    "PermanentError",
    "ReadTx",
    "Reasoning",
    "RetryEffect",
    "Search",
    "SearchHit",
    "SearchStatus",
    "Session",
    "SessionStatus",
    "Sessions",
    "Settings",
    "SpoolPending",
    "State",
    "StateValue",
    "Store",
    "StoreBusy",
    "Stream",
    "Swept",
    "Text",
    "ToolCall",
    "ToolCallHandle",
    "ToolResult",
    "TransientError",
    "Usage",
    "VersionConflict",
    "Worker",
    "WriteTx",
    "__version__",
    "default_data_dir",
    "errors",
    "open",
    "open_async",
]
