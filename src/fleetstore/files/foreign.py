"""Reading another program's SQLite file strictly read-only (an import source, a file
``fleetstore doctor`` checks), every step in one place (``fleetstore.files.inspect``
says why each is needed):

1. refuse a file this process has open (``check_not_open_here``);
2. note the file's facts, read its header, and choose how to open it without writing
   or creating anything (``choose_open_mode``);
3. read it inside one read transaction (``open_readonly``);
4. after an ``immutable=1`` read, which takes no lock, compare the file with step 2:
   a checkpoint that wrote it meanwhile may have been read half old, half new, so the
   read is refused (``FileChanged``) rather than used.

``read_foreign(path, read)`` does it all; ``ForeignFile`` splits it in two for a
caller that reports the open mode even when the read fails.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from fleetstore import errors
from fleetstore.files.inspect import (
    FileFacts,
    Header,
    InspectFailed,
    ReadOnlyDatabase,
    check_not_open_here,
    choose_open_mode,
    open_readonly,
    read_header,
)

T = TypeVar("T")


class FileChanged(errors.TransientError):
    """The file changed while it was read without locks: what was read may mix its old
    and new contents, so it was not used.  Reading it again can succeed."""

    def __init__(self, path: str, message: str | None = None) -> None:
        self.path = path
        super().__init__(
            message or f"{path}: the file changed while it was read; nothing was imported"
        )


class ForeignFile:
    """Steps 1 and 2 (on creation) of reading *path*; ``read`` does the rest.

    ``NotFound`` if there is no such file; ``PermanentError`` if this process has it
    open; ``InspectFailed`` with reason ``not-a-database`` (no SQLite header) or
    ``empty`` (0 bytes).  ``mode`` is None, and ``why`` says why, when the file cannot
    be read without creating a side file."""

    def __init__(self, path: str, key: bytes | None = None) -> None:
        if not os.path.isfile(path):
            raise errors.NotFound(f"{path}: no such file")
        self.path = path
        #: Given to every connection first (a store encrypted at rest).
        self.key = key
        # SQLite puts the -wal and -shm beside the file a symlink names.
        real = os.path.realpath(path)
        self._sides = (real + "-wal", real + "-shm")
        check_not_open_here([real, *self._sides])
        self.before = FileFacts.of(path)
        header = read_header(path)
        if header is None:
            raise InspectFailed(f"{path}: empty file (0 bytes): no SQLite header yet", "empty")
        self.header: Header = header
        if header.encrypted and key is None:
            raise errors.KeyMissing(
                f"{path}: an encrypted SQLite database, and no key was given; nothing was "
                "read (a fleetstore store's keyring: encryption_key_file, "
                "FLEETSTORE_ENCRYPTION_KEY_FILE or fleetstore --key-file)"
            )
        self.mode, self.why = choose_open_mode(
            header.wal, FileFacts.of(self._sides[0]), FileFacts.of(self._sides[1])
        )

    def read(self, read: Callable[[ReadOnlyDatabase], T], *, busy_ms: int = 2000) -> T:
        """``read(db)`` inside one read transaction, and its result.  ``InspectFailed``
        if SQLite refuses (reason ``wal-without-shm`` if ``mode`` is None);
        ``FileChanged`` if the file changed during an ``immutable`` read, whatever
        *read* returned or raised (an error it raised is the ``__cause__``)."""
        if self.mode is None:
            raise InspectFailed(
                f"{self.path}: cannot be read without writing beside it: {self.why}",
                "wal-without-shm",
            )
        try:
            with open_readonly(self.path, self.mode, busy_ms=busy_ms, key=self.key) as db:
                result = read(db)
        except Exception as exc:
            if self.changed():
                raise FileChanged(self.path) from exc
            raise
        if self.changed():
            raise FileChanged(self.path)
        return result

    def changed(self) -> bool:
        """Has the file changed since step 2, in a way that can make the read wrong?
        Only an ``immutable`` read can be: the other modes read under SQLite's locks."""
        if self.mode != "immutable":
            return False
        if not self.before.same_content_as(FileFacts.of(self.path)):
            return True
        # Size and mtime can stay the same (a page rewritten within one mtime tick): the
        # header's change counter and page count are read again too.
        try:
            return read_header(self.path) != self.header
        except (OSError, InspectFailed):
            return True


def read_foreign(
    path: str | os.PathLike[str],
    read: Callable[[ReadOnlyDatabase], T],
    *,
    busy_ms: int = 2000,
    key: bytes | None = None,
) -> T:
    """``read(db)`` on the SQLite file *path*, opened strictly read-only, and its
    result: ``ForeignFile(path, key).read(read)`` (see both for the errors)."""
    return ForeignFile(os.fspath(path), key).read(read, busy_ms=busy_ms)


__all__ = ["FileChanged", "ForeignFile", "read_foreign"]
