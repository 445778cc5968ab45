"""One exception tree for everything fleetstore raises.

Transient errors (``TransientError``) may succeed if the same call is made
again later; permanent ones (``PermanentError``) will not.  Errors raised by
the SQLite driver are kept as ``__cause__``.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass


class FleetstoreError(Exception):
    """A fleetstore operation failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(FleetstoreError, ValueError):
    """A setting has a value fleetstore cannot use."""


class MissingDependency(ConfigError, ModuleNotFoundError):
    """An optional dependency (an extra) is not installed; the message names the
    ``pip install`` that adds it.  Also a ``ModuleNotFoundError``, so code that
    falls back when an import fails keeps working."""

    def __init__(self, message: str | None = None, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class TransientError(FleetstoreError):
    """The operation failed for a reason that may pass; retrying later can succeed."""


class PermanentError(FleetstoreError):
    """The operation failed and will fail again if retried unchanged."""


#: What a process's state (``/proc/PID/stat``, field 3) means for a lock it holds: a
#: stopped holder never releases it until it is continued.
_STATES = {
    "T": "stopped: SIGSTOP or SIGTSTP, state T; `kill -CONT PID` resumes it",
    "t": "stopped by a debugger, state t",
    "D": "in uninterruptible sleep, state D: waiting on I/O",
}


def describe_state(state: str) -> str:
    """What process state *state* says about a lock holder ("" if nothing of note)."""
    return _STATES.get(state, "")


@dataclass(frozen=True, slots=True)
class LockHolder:
    """A process that /proc/locks shows holding one of the store's locks."""

    pid: int
    lock: str  # "gate" (fleetstore's writer gate) or "sqlite-write" (SQLite's write lock)
    command: str = ""
    #: Its state letter in /proc/PID/stat ("S", "R", "T"...; "" if not known).
    state: str = ""

    def __str__(self) -> str:
        who = f"pid {self.pid}" + (f" ({self.command})" if self.command else "")
        note = describe_state(self.state)
        return f"{who} holds the {self.lock} lock" + (f" ({note})" if note else "")


class StoreBusy(TransientError):
    """The write lock could not be taken within the write budget."""

    def __init__(
        self,
        path: str,
        waited: float,
        attempts: int,
        holders: Sequence[LockHolder] = (),
        stage: str = "gate",
        reason: str = "",
    ) -> None:
        self.path = path
        self.waited = waited
        self.attempts = attempts
        self.holders = tuple(holders)
        self.stage = stage
        #: What kept it waiting when that is not a lock holder (PostgreSQL: the
        #: server's or the network's last refusal); "" if none.
        self.reason = reason
        who = (
            reason or "; ".join(str(h) for h in self.holders) or "holder not visible in /proc/locks"
        )
        what = _STAGES.get(stage, stage)
        super().__init__(
            f"{path}: write lock not obtained after {waited:.2f}s "
            f"({attempts} attempt{'s' if attempts != 1 else ''}, waiting for {what}): {who}"
        )


_STAGES = {
    "gate": "the writer gate",
    "sqlite": "SQLite's write lock",
    "journal mode switch": "the file to itself, to switch it to WAL",
    "statement": "a lock inside the transaction",
    "connection": "a connection the server accepts, to a server that takes writes",
    "pool": "a connection of this process's pool",
}


class StoreClosed(PermanentError):
    """The store was closed; open it again to use it."""


class FileMoved(PermanentError):
    """The database file was renamed or removed while open (a sharded store's tree
    archived from under a process): nothing was written to it."""


class DatabaseError(PermanentError):
    """SQLite rejected a statement (bad SQL, a constraint, a read-only transaction...)."""


class IntegrityError(DatabaseError):
    """A constraint (UNIQUE, NOT NULL, FOREIGN KEY, CHECK) was violated; nothing was written."""


class ReadOnlyError(DatabaseError):
    """A write was attempted inside a read transaction; use ``db.write()``."""


class StorageError(DatabaseError):
    """The disk refused a write (an I/O error); the message says what was not written."""


class StorageFull(StorageError):
    """No space left for a write (the disk, a quota, or the file size limit); the
    message says what was not written.  It fails again until space is freed."""


class CommitUncertain(StorageError):
    """COMMIT failed while syncing the write-ahead log to disk: the transaction may be
    in the file or not (a crash now can bring it back).  Read before writing again."""


class MigrationError(PermanentError):
    """A migration could not be applied; the store is left at its previous version."""


class CorruptStore(PermanentError):
    """The database file is damaged or is not a SQLite database, or a row read back
    does not decode (edited by another program); the message names it."""


class NotAStore(PermanentError):
    """The file is not a fleetstore store (another program's SQLite file, an empty
    file, not a database at all): a command that works on an existing store wrote
    nothing to it."""


class UnsafeFile(PermanentError):
    """The database file is not a regular file, belongs to another user, or its group
    or others can read or write it: someone may have planted it to read what is
    written into it.  Nothing was opened, created or changed."""


class UnsafeSidecar(UnsafeFile):
    """A file or directory beside the store (its blob directory, spool journals, gate,
    -wal, -shm...) is a symbolic link, belongs to another user or can be written by
    others (SQLite's -wal, -shm and -journal: or read): someone may have planted it.
    Nothing was opened or replayed."""


class UnsafeKeyFile(UnsafeFile):
    """The encryption key file is not a regular file, belongs to another user, or its
    group or others can read or write it: the key may be known to someone else.  Nothing
    was opened, encrypted or decrypted; ``chmod 600`` a file that is yours."""


class EncryptionUnavailable(ConfigError):
    """Encryption was asked for and this installation cannot do it (the ``cryptography``
    package is missing: ``pip install 'fleetstore[encryption]'``)."""


class KeyMissing(PermanentError):
    """The data is encrypted and no key for it was given: no key file, or a keyring
    without the key id it was written with.  Nothing was read, written or destroyed."""


class WrongKey(PermanentError):
    """A key was given, but it is not the one the data was encrypted with.  Nothing was
    read, written or destroyed."""


class NotEncrypted(PermanentError):
    """A key was given for a store that is not encrypted.  Nothing was opened or
    changed: open it without ``encryption_key_file``, or encrypt it (``fleetstore
    rekey``)."""


class SealedCorrupt(CorruptStore):
    """An encrypted file failed its authentication with the right key (it was damaged,
    cut short, extended or changed after it was written), or is not a sealed file this
    version reads.  Nothing of it was used."""


class InvalidInput(PermanentError, ValueError):
    """An argument cannot be stored as given (wrong type, unknown part kind,
    non-JSON metadata...); nothing was written."""


class PayloadTooLarge(InvalidInput):
    """A payload is larger than ``max_payload_bytes`` allows; nothing was written."""


class NotFound(PermanentError, LookupError):
    """No such session, message or key (it never existed, or was deleted)."""


class AlreadyExists(PermanentError):
    """An id is already used by a different object; nothing was written."""


class VersionConflict(PermanentError):
    """The expected version is not the current one: someone else wrote first."""

    def __init__(
        self, message: str, expected: int | None = None, actual: int | None = None
    ) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(message)


class SpoolPending(TransientError):
    """This process has writes waiting in its spool that touch what is being
    read; the read would not see them.  Retry once the spool has drained
    (``store.flush()``)."""


class BlobCorrupt(CorruptStore):
    """A blob file is missing, unreadable, or its bytes do not match its hash."""


class InvalidArchive(PermanentError, ValueError):
    """An export file is malformed, damaged or hostile; nothing was imported."""


class LeaseLost(PermanentError):
    """A claim's lease is no longer this worker's: it expired and was swept,
    another worker holds the effect now, or an operator settled it.  Nothing
    was changed; the effect's newer outcome stands."""

    def __init__(self, message: str, effect_id: str = "", state: str | None = None) -> None:
        self.effect_id = effect_id
        self.state = state
        super().__init__(message)


#: errno values that mean "no room", whatever refused it: the disk, a quota, RLIMIT_FSIZE.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def storage_error(exc: OSError, what: str) -> StorageError:
    """The typed error for an ``OSError`` met writing a file: *what* says what was and
    was not written (the caller raises it ``from exc``)."""
    cls = StorageFull if exc.errno in FULL_ERRNOS else StorageError
    return cls(f"{what}: {exc.strerror or exc}")


# -- errors handed between processes ---------------------------------------------------------
# A write applied by another process for this one (group commit: engine/combine.py)
# comes back as its error's class name, message and arguments, and is raised here as
# the same class.


def to_wire(exc: BaseException) -> dict[str, object]:
    """*exc* as JSON-serialisable data (``from_wire`` makes it an exception again)."""
    data: dict[str, object] = {"class": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, VersionConflict):
        data["args"] = [exc.expected, exc.actual]
    elif isinstance(exc, LeaseLost):
        data["args"] = [exc.effect_id, exc.state]
    return data


def from_wire(data: object) -> FleetstoreError:
    """The fleetstore error *data* (from ``to_wire``) describes; a class this version
    does not know, or a driver's error, comes back as ``DatabaseError``."""
    if not isinstance(data, dict):
        return DatabaseError(f"an error from another process that cannot be read: {data!r:.200}")
    name, message = data.get("class"), str(data.get("message", ""))
    cls = globals().get(name) if isinstance(name, str) and name in __all__ else None
    args = data.get("args") if isinstance(data.get("args"), list) else []
    assert isinstance(args, list)
    if cls is VersionConflict and len(args) == 2:
        return VersionConflict(message, args[0], args[1])
    if cls is LeaseLost and len(args) == 2:
        return LeaseLost(message, str(args[0] or ""), args[1])
    if isinstance(cls, type) and issubclass(cls, FleetstoreError) and cls not in _STRUCTURED:
        return cls(message)
    return DatabaseError(f"{name}: {message}")


__all__ = [
    "AlreadyExists",
    "BlobCorrupt",
    "CommitUncertain",
    "ConfigError",
    "CorruptStore",
    "DatabaseError",
    "EncryptionUnavailable",
    "FileMoved",
    "FleetstoreError",
    "IntegrityError",
    "InvalidArchive",
    "InvalidInput",
    "KeyMissing",
    "LeaseLost",
    "LockHolder",
    "MigrationError",
    "MissingDependency",
    "NotAStore",
    "NotEncrypted",
    "NotFound",
    "PayloadTooLarge",
    "PermanentError",
    "ReadOnlyError",
    "SealedCorrupt",
    "SpoolPending",
    "StorageError",
    "StorageFull",
    "StoreBusy",
    "StoreClosed",
    "TransientError",
    "UnsafeFile",
    "UnsafeKeyFile",
    "UnsafeSidecar",
    "VersionConflict",
    "WrongKey",
]

# Errors whose constructor takes more than a message (rebuilt from ``args`` above, or,
# for these, not rebuilt: StoreBusy is never handed back, it is raised where it happens).
_STRUCTURED = (StoreBusy, VersionConflict, LeaseLost)
