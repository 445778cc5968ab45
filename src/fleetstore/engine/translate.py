"""Driver errors as fleetstore errors: what apsw raised, translated for the caller, the
apsw exception kept as ``__cause__`` (the caller raises ``... from exc``)."""

from __future__ import annotations

import os

import apsw

from fleetstore import errors

#: COMMIT failed while syncing: its frames may be whole in the WAL, and a crash before
#: the next write there brings them back (tests/engine/test_faults.py).
_UNCERTAIN = frozenset({apsw.SQLITE_IOERR_FSYNC, apsw.SQLITE_IOERR_DIR_FSYNC})


def translate(
    exc: apsw.Error,
    path: str,
    conn: apsw.Connection | None = None,
    commit: bool = False,
    outcome: str = "nothing of the transaction was written",
) -> errors.FleetstoreError:
    """The fleetstore error for a driver error; the caller raises it ``from exc``.
    *conn* (the connection that met it) tells a full disk from a failing one; a
    storage error's message ends with *outcome*."""
    message = f"{path}: {exc}"
    if isinstance(exc, apsw.FullError | apsw.IOError):
        return storage_error(exc, path, conn, commit, outcome)
    if isinstance(exc, apsw.ConstraintError):
        return errors.IntegrityError(message)
    if isinstance(exc, apsw.ReadOnlyError):
        return errors.ReadOnlyError(message)
    if isinstance(exc, apsw.NotADBError | apsw.CorruptError):
        return errors.CorruptStore(message)
    if isinstance(exc, apsw.BusyError | apsw.LockedError):
        return errors.StoreBusy(path, 0.0, 1, stage="statement")
    if isinstance(exc, apsw.ConnectionClosedError | apsw.CursorClosedError):
        return errors.StoreClosed(message)
    return errors.DatabaseError(message)


def storage_error(
    exc: apsw.Error, path: str, conn: apsw.Connection | None, commit: bool, outcome: str
) -> errors.StorageError:
    code = getattr(exc, "extendedresult", 0)
    if commit and code in _UNCERTAIN:
        return errors.CommitUncertain(
            f"{path}: COMMIT failed syncing the WAL ({exc}): the write may or may not be in "
            "the file; read it before writing again (an idempotent write may be repeated)"
        )
    try:
        err = conn.system_errno if conn is not None else 0
    except apsw.Error:
        err = 0
    text = str(exc) or "disk I/O error"
    # A statement or COMMIT that fails here leaves nothing of its transaction: the
    # write path rolls it back, and WAL frames count only once whole.
    if isinstance(exc, apsw.FullError) or err in errors.FULL_ERRNOS:
        reason = os.strerror(err) if err in errors.FULL_ERRNOS else "database or disk is full"
        return errors.StorageFull(f"{path}: {reason}; {outcome}")
    detail = f" ({os.strerror(err)})" if err else ""
    name = apsw.mapping_extended_result_codes.get(code, "")
    return errors.StorageError(f"{path}: {text}{detail} [{name or code}]; {outcome}")


def commit_error(
    exc: BaseException, path: str, conn: apsw.Connection
) -> errors.FleetstoreError | None:
    """The fleetstore error for a driver error COMMIT raised (None: not a driver error)."""
    return translate(exc, path, conn, commit=True) if isinstance(exc, apsw.Error) else None


def bad_params(exc: Exception, path: str) -> errors.InvalidInput:
    """What the driver raises for parameters it cannot bind (a type it does not
    know, an integer past 64 bits, text that is not UTF-8) is bad input."""
    return errors.InvalidInput(f"{path}: parameters cannot be bound: {exc}")


__all__ = ["bad_params", "commit_error", "storage_error", "translate"]
