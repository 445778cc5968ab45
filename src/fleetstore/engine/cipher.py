"""A SQLite file encrypted at rest: SQLite3 Multiple Ciphers (``apsw-sqlite3mc``, the
one driver), AEGIS-256 with a raw 32-byte key (no key derivation at open).

Every connection fleetstore opens on an encrypted store runs ``use_key`` before any
other statement (the engine's writer, readers and checkpointer; the read-only and
outside connections; backups).  Which key of a keyring opens a file is decided before
anything touches it (``choose_key``): a wrong key must create or change nothing, while
a connection given one on a WAL file creates its ``-wal`` and ``-shm`` (or rewrites
the ``-shm``) before its first read fails.  So the key is tried on a copy of the file's
first page, made in a private temporary file: decrypting page 1 proves the key, and
the store's own files are only read, through the same one ``pread`` that checks the
header already (a second descriptor on the file, closed, would drop this process's
SQLite locks on it: docs/design.md, "Two SQLite libraries in one process").

The first 16 bytes of an encrypted file are random where a plain one says ``SQLite
format 3``; bytes 16-23 stay plain (page size, file format, payload fractions), which
is what tells an encrypted database from any other file (``looks_encrypted``).
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
import time
from collections.abc import Callable, Sequence

import apsw

from fleetstore import errors

#: The cipher of every encrypted store (docs/secrets.md: 1.14x per small write
#: transaction, against 1.66x for sqlite3mc's default ChaCha20-Poly1305).
CIPHER = "aegis"
SQLITE_MAGIC = b"SQLite format 3\x00"
#: A page-1 copy that fails to decrypt may be a read torn by a checkpoint writing
#: page 1 meanwhile: it is read again this many times before the key is called wrong.
_ATTEMPTS = 3


def available() -> bool:
    """Whether this SQLite can encrypt (the driver is apsw-sqlite3mc)."""
    return "multipleciphers-unix" in apsw.vfs_names() or any(
        name.startswith("multipleciphers") for name in apsw.vfs_names()
    )


def use_key(conn: apsw.Connection, key: bytes) -> None:
    """Give *conn* the raw *key*: the first thing done on a new connection (sqlite3mc
    reads the cipher setting at the key).  ``EncryptionUnavailable`` if this SQLite
    cannot encrypt."""
    if conn.pragma("cipher", CIPHER) != CIPHER:
        raise errors.EncryptionUnavailable(
            "this SQLite cannot encrypt (fleetstore needs the apsw-sqlite3mc driver: "
            "pip install --force-reinstall apsw-sqlite3mc)"
        )
    if conn.pragma("key", "raw:" + key.hex()) != "ok":
        raise errors.EncryptionUnavailable("SQLite refused the encryption key")


def connect(name: str, flags: int, key: bytes | None) -> apsw.Connection:
    """``apsw.Connection(name, flags)`` with *key* given before anything else."""
    conn = apsw.Connection(name, flags=flags)
    if key is not None:
        try:
            use_key(conn, key)
        except BaseException:
            conn.close(True)
            raise
    return conn


def looks_encrypted(head: bytes) -> bool:
    """Do these first bytes of a file look like an encrypted SQLite database (random
    bytes where the magic string would be, the plain fields of bytes 16-23 right)?"""
    if len(head) < 24 or head.startswith(SQLITE_MAGIC):
        return False
    (raw_page,) = struct.unpack_from(">H", head, 16)
    page = 65536 if raw_page == 1 else raw_page
    return (
        512 <= page <= 65536
        and page & (page - 1) == 0
        and head[18] in (1, 2)
        and head[19] in (1, 2)
        and head[21:24] == b"\x40\x20\x20"
    )


def page_size(head: bytes) -> int:
    (raw_page,) = struct.unpack_from(">H", head, 16)
    return 65536 if raw_page == 1 else raw_page


def key_opens(page1: bytes, key: bytes) -> bool:
    """Does *key* decrypt this copy of a database's first page?  The copy holds page 1
    only, so with the right key reading the schema goes on to pages it lacks
    (``CorruptError``); a key that fails to decrypt page 1 is ``NotADBError`` (each
    measured with sqlite3mc 2.6, tests/engine/test_cipher.py)."""
    fd, name = tempfile.mkstemp(prefix="fleetstore-key-", suffix=".db")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(page1)
        conn = connect(
            f"file:{name}?immutable=1",
            apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI,
            key,
        )
        try:
            conn.execute("PRAGMA schema_version").fetchall()
        except apsw.NotADBError:
            return False
        except apsw.CorruptError:
            pass
        finally:
            conn.close(True)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)
    return True


def choose_key(
    path: str,
    head: bytes,
    keys: Sequence[tuple[str, bytes]],
    source: str,
    read_page: Callable[[], bytes] | None = None,
) -> bytes | None:
    """The key (of *keys*, ``(id, bytes)``, the current one first) that opens the
    database at *path* whose first bytes are *head* (page 1 whole, or at least its
    100-byte header), or None for a plain file opened without keys.  Nothing is
    written anywhere but a private temporary file.

    ``KeyMissing``: the file is encrypted and no key was given.  ``NotEncrypted``: keys
    were given and the file is plain.  ``WrongKey``: no key of the ring opens it.
    An empty file (a new store) takes the current key."""
    if not head:
        return keys[0][1] if keys else None
    if head.startswith(SQLITE_MAGIC):
        if keys:
            raise errors.NotEncrypted(
                f"{path}: the store is not encrypted, but a key was given ({source}); "
                "nothing was opened. To encrypt it: fleetstore rekey --store PATH (it "
                "writes an encrypted copy and puts it in place); to use it as it is, "
                "open it without encryption_key_file"
            )
        return None
    if not looks_encrypted(head):
        return None  # not a database: the caller says so
    if not keys:
        raise errors.KeyMissing(
            f"{path}: the store is encrypted and no key was given; nothing was opened. "
            "Name its keyring with the encryption_key_file setting "
            "(FLEETSTORE_ENCRYPTION_KEY_FILE, or fleetstore --key-file FILE)"
        )
    for attempt in range(_ATTEMPTS):
        page = head
        if read_page is not None and attempt:
            time.sleep(0.01 * attempt)
            page = read_page()
        for _key_id, key in keys:
            if key_opens(page, key):
                return key
    raise errors.WrongKey(
        f"{path}: no key of {source} ({', '.join(i for i, _ in keys)}) opens this "
        "encrypted store; nothing was opened, read or changed. Give the keyring it was "
        "encrypted with (a key dropped from the ring too early: put its line back)"
    )


def check_encrypted(path: str) -> None:
    """After a new encrypted file's first write: ``StorageError`` if it begins with
    SQLite's plain header (sqlite3mc 2.7.0 notes key setups that could leave a
    database unencrypted: this catches any such case before data is written)."""
    with open(path, "rb") as f:
        head = f.read(16)
    if head.startswith(SQLITE_MAGIC):
        raise errors.StorageError(
            f"{path}: the new store was written without encryption though a key was given; "
            "remove it and open again"
        )


__all__ = [
    "CIPHER",
    "available",
    "check_encrypted",
    "choose_key",
    "connect",
    "key_opens",
    "looks_encrypted",
    "page_size",
    "use_key",
]
