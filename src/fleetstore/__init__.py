"""fleetstore: storage a whole fleet of agent processes can write at once.

``fleetstore.Database`` is the lower layer: a SQLite file that many processes
write safely, with a cross-process writer gate, a bounded lock wait and strict
connection hygiene.
"""

from fleetstore import errors
from fleetstore.engine.sqlite import Database, Migration, ReadTx, WriteTx
from fleetstore.errors import (
    ConfigError,
    FleetstoreError,
    MigrationError,
    PermanentError,
    StoreBusy,
    TransientError,
)
from fleetstore.settings import Settings, default_data_dir

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "Database",
    "FleetstoreError",
    "Migration",
    "MigrationError",
    "PermanentError",
    "ReadTx",
    "Settings",
    "StoreBusy",
    "TransientError",
    "WriteTx",
    "__version__",
    "default_data_dir",
    "errors",
]
