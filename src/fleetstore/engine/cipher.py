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
import urllib.parse
from collections.abc import Callable
from typing import Any

import apsw

from fleetstore import errors
from fleetstore.core.keys import Keyring

#: The cipher of every encrypted store (docs/secrets.md: 1.14x per small write
#: transaction, against 1.66x for sqlite3mc's default ChaCha20-Poly1305).
CIPHER = "aegis"
#: The first bytes of a plain SQLite file, and the header's length (sqlite.org/fileformat.html,
#: 1.3): the engine's open and doctor's probes (``fleetstore.files.inspect``) read them.
SQLITE_MAGIC = b"SQLite format 3\x00"
HEADER_BYTES = 100
#: A page-1 copy that fails to decrypt may be a read torn by a checkpoint writing
#: page 1 meanwhile: it is read again this many times before the key is called wrong.
_ATTEMPTS = 3


def board_cipher(key: bytes) -> Any:
    """The AEAD (AES-256-GCM, its key derived from *key*) sealing the group-commit
    board's requests and results in the gate file: they hold what the operations
    write (test_redaction.py's encrypted fleet found it there in the clear)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.hashes import SHA256
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return AESGCM(HKDF(SHA256(), 32, salt=None, info=b"fleetstore gate board").derive(key))


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
    keyring: Keyring | None,
    read_page: Callable[[], bytes] | None = None,
) -> bytes | None:
    """The key (of *keyring*, the current one first) that opens the
    database at *path* whose first bytes are *head* (page 1 whole, or at least its
    100-byte header), or None for a plain file opened without keys.  Nothing is
    written anywhere but a private temporary file.

    ``KeyMissing``: the file is encrypted and no key was given.  ``NotEncrypted``: keys
    were given and the file is plain.  ``WrongKey``: no key of the ring opens it.
    An empty file (a new store) takes the current key."""
    keys = [] if keyring is None else [(k.id, k.secret) for k in keyring]
    source = keyring.source if keyring is not None else ""
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


def key_of_file(path: str, keyring: Keyring | None, *, strict: bool = True) -> bytes | None:
    """``choose_key`` for an existing file read without writing (the read-only and
    outside connections, backups): its page 1 read with a plain ``pread``.  A file
    that is missing or empty: None (nothing to decrypt).  Not *strict* (doctor, scan:
    any program's file), a plain file is read without a key whatever the ring."""

    def page() -> bytes:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return b""
        try:
            head = os.pread(fd, HEADER_BYTES, 0)
            return os.pread(fd, page_size(head), 0) if looks_encrypted(head) else head
        finally:
            os.close(fd)

    head = page()
    if not head or (not strict and not looks_encrypted(head)):
        return None
    return choose_key(path, head, keyring, page)


def copy_under_key(
    source: str, dest: str, key: bytes | None, new_key: bytes | None, *, busy_ms: int = 60_000
) -> None:
    """Write the database *source* (opened with *key*; its WAL checkpointed into it
    first, whole: ``StoreBusy`` if a reader keeps that from happening) to the new
    file *dest* under *new_key* (None: plain), with ``VACUUM INTO`` (changing the key
    of a database in WAL mode in place is not supported: every other connection to
    the file would fail, and one still holding the old key would write pages under
    it).  *dest* is then switched to WAL, checked (``quick_check``, its schema), and
    fsynced.  *source* is not changed but for the checkpoint."""
    flags = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_URI | apsw.SQLITE_OPEN_NOFOLLOW
    target = f"file:{urllib.parse.quote(dest, safe='/')}?" + (
        f"cipher={CIPHER}&key=raw:{new_key.hex()}" if new_key is not None else "key="
    )
    # Made 0600 first (VACUUM INTO would make it by the umask): sessions carry secrets.
    os.close(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    conn = connect(source, flags, key)
    try:
        conn.setbusytimeout(busy_ms)
        busy, log, done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()[0]
        if busy or log != done:
            raise errors.StoreBusy(source, 0.0, 1, stage="a checkpoint of the whole WAL")
        schema = conn.execute("SELECT count(*) FROM sqlite_schema").fetchall()[0][0]
        conn.execute("VACUUM INTO ?", (target,))
    finally:
        conn.close()
    copy = connect(dest, apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_NOFOLLOW, new_key)
    try:
        if str(copy.execute("PRAGMA journal_mode=WAL").fetchall()[0][0]).lower() != "wal":
            raise errors.StorageError(f"{dest}: the copy could not be switched to WAL")
        found = [str(r[0]) for r in copy.execute("PRAGMA quick_check")]
        copied = copy.execute("SELECT count(*) FROM sqlite_schema").fetchall()[0][0]
        if found != ["ok"] or copied != schema:
            raise errors.CorruptStore(f"{dest}: the copy does not check out: {found[:3]}")
    finally:
        copy.close()
    fd = os.open(dest, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def put_in_place(copy: str, path: str) -> None:
    """Rename the checked *copy* (``copy_under_key``) over the database *path*, whose
    WAL must be empty (checkpointed whole) and which nobody may be using: its -wal and
    -shm are removed first (frames of the old file must never be read as the new
    one's), then the rename, atomic, and the directory fsynced.  A crash anywhere
    leaves the old file (its WAL empty) or the new one, whole."""
    wal = path + "-wal"
    with contextlib.suppress(FileNotFoundError):
        if os.path.getsize(wal):
            raise errors.StoreBusy(path, 0.0, 1, stage="its WAL is not empty")
    for side in (wal, path + "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(side)
    os.replace(copy, path)
    fd = os.open(
        os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    )
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    "HEADER_BYTES",
    "SQLITE_MAGIC",
    "available",
    "check_encrypted",
    "choose_key",
    "connect",
    "copy_under_key",
    "put_in_place",
    "key_of_file",
    "key_opens",
    "looks_encrypted",
    "page_size",
    "use_key",
]
