"""fleetstore: storage a whole fleet of agent processes can write at once.

``fleetstore.open()`` gives a ``Store``: sessions, messages (streamed or whole),
versioned state, blobs, the spool and the effect outbox (``store.effects``, run by
``fleetstore.Worker``); ``await fleetstore.open_async()`` gives the same API as
coroutines.  ``fleetstore.Database`` is the lower
layer: a SQLite file that many processes write safely, with a cross-process
writer gate, a bounded lock wait and strict connection hygiene.
"""

from fleetstore import errors
from fleetstore.core.settings import Settings, default_data_dir
from fleetstore.core.version import __version__
from fleetstore.domain.history import Messages, Sessions, Stream, ToolCallHandle
from fleetstore.domain.operations import Operation
from fleetstore.domain.outbox import Claim, Effects, Swept
from fleetstore.domain.state import State
from fleetstore.domain.worker import FailEffect, Handler, RetryEffect, Worker
from fleetstore.engine.sqlite import Database, Migration, ReadTx, WriteTx
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
from fleetstore.models import (
    Effect,
    EffectError,
    EffectState,
    File,
    Message,
    MessageStatus,
    NewEffect,
    Part,
    Reasoning,
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
    AsyncSessions,
    AsyncState,
    AsyncStore,
    AsyncStream,
    AsyncToolCallHandle,
    open_async,
)
from fleetstore.store.facade import Store, open

__all__ = [
    "AlreadyExists",
    "AsyncClaim",
    "AsyncEffects",
    "AsyncMessages",
    "AsyncSessions",
    "AsyncState",
    "AsyncStore",
    "AsyncStream",
    "AsyncToolCallHandle",
    "Claim",
    "ConfigError",
    "Database",
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
    "Operation",
    "Part",
    "PayloadTooLarge",
    "PermanentError",
    "ReadTx",
    "Reasoning",
    "RetryEffect",
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
