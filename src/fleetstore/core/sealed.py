"""Sealed files: what fleetstore keeps beside a database (blob files, spool journals,
maintenance archives, backups, exports), encrypted and authenticated (AES-256-GCM, the
``cryptography`` package: ``pip install 'fleetstore[encryption]'``).

A sealed file starts with a header naming the key it was written with, so keys can
rotate (``fleetstore.core.keys.Keyring``: an old key still opens what it sealed)::

    magic     8  b"fssealed"
    version   1  1
    layout    1  1 = chunks (a whole file), 2 = records (an append-only journal)
    algorithm 1  1 = AES-256-GCM
    id length 1  n, 1..64
    key id    n  ASCII
    chunk     4  plaintext bytes per chunk, big-endian (records: 0)
    salt     32  random, new for every file
    commit   32  HKDF-SHA256(key, salt): proves which key sealed it

The file's own AES key is HKDF-SHA256(key, salt), so every file has a key of its own and
its nonces can be counters: no nonce is ever used twice under one key, however many
files a fleet writes.  The commitment tells a wrong key (``WrongKey``) from damage
(``SealedCorrupt``), and makes the file open under one key only.

* chunks: the plaintext in pieces of ``chunk`` bytes, each ``ciphertext || 16-byte tag``,
  nonce = the piece's index (8 bytes) and 1 for the last piece, 0 for the others (4
  bytes); the header is the associated data of every piece.  A reordered, missing,
  truncated or appended piece fails its tag.  Memory stays bounded by one piece.
* records: ``length (4 bytes) || ciphertext || tag`` per record, nonce = its index;
  records can be appended one at a time (a spool journal line each).  A last record
  cut short (a crash in the middle of an append) is reported as ``torn``, as the spool
  does for a torn last line; a whole record that fails its tag is damage.
"""

from __future__ import annotations

import hmac
import io
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from fleetstore import errors
from fleetstore.core.keys import Key, Keyring

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAGIC = b"fssealed"
VERSION = 1
CHUNKS = 1
RECORDS = 2
AES_256_GCM = 1
TAG = 16
SALT = 32
COMMIT = 32
#: Plaintext bytes per chunk unless asked otherwise: 64 KiB keeps memory small and the
#: 16-byte tag per chunk at 0.02 %.
CHUNK_SIZE = 64 * 1024
MAX_CHUNK_SIZE = 16 * 1024 * 1024
#: The largest record (a spool journal line is an operation, at most a few MiB inline).
MAX_RECORD = 256 * 1024 * 1024
_FIXED = struct.Struct(">8sBBBB")
_INFO = b"fleetstore sealed v1"


@dataclass(frozen=True, slots=True)
class Header:
    """What a sealed file's header says, and its bytes (the associated data)."""

    layout: int
    key_id: str
    chunk_size: int
    salt: bytes
    commit: bytes
    raw: bytes

    @classmethod
    def new(cls, key: Key, layout: int, chunk_size: int) -> tuple[Header, AESGCM]:
        """A header for a new file sealed with *key*, and the file's cipher."""
        salt = os.urandom(SALT)
        file_key, commit = _derive(key, salt)
        ident = key.id.encode("ascii")
        raw = (
            _FIXED.pack(MAGIC, VERSION, layout, AES_256_GCM, len(ident))
            + ident
            + struct.pack(">I", chunk_size)
            + salt
            + commit
        )
        return cls(layout, key.id, chunk_size, salt, commit, raw), _cipher(file_key)

    def cipher(self, keyring: Keyring) -> AESGCM:
        """The cipher of this file: ``KeyMissing`` if *keyring* lacks its key id,
        ``WrongKey`` if its key of that id did not seal it."""
        key = keyring.get(self.key_id)
        file_key, commit = _derive(key, self.salt)
        if not hmac.compare_digest(commit, self.commit):
            raise errors.WrongKey(
                f"key {self.key_id} of {keyring.source or 'the keyring'} (fingerprint "
                f"{key.fingerprint}) is not the key this file was sealed with: a different "
                "key was given that id; nothing was read"
            )
        return _cipher(file_key)


def read_header(src: BinaryIO, where: str = "sealed file") -> Header:
    """The header at the start of *src* (left positioned after it).  ``SealedCorrupt``
    if it is not one this version reads."""
    fixed = src.read(_FIXED.size)
    if len(fixed) < _FIXED.size or fixed[:8] != MAGIC:
        raise errors.SealedCorrupt(f"{where}: not a sealed file (no fssealed header)")
    _, version, layout, algorithm, id_len = _FIXED.unpack(fixed)
    if version != VERSION or layout not in (CHUNKS, RECORDS) or algorithm != AES_256_GCM:
        raise errors.SealedCorrupt(
            f"{where}: a sealed file of version {version}, layout {layout}, algorithm "
            f"{algorithm}, which this version of fleetstore does not read"
        )
    rest = src.read(id_len + 4 + SALT + COMMIT)
    if not 0 < id_len <= 64 or len(rest) < id_len + 4 + SALT + COMMIT:
        raise errors.SealedCorrupt(f"{where}: its header is cut short or damaged")
    try:
        key_id = rest[:id_len].decode("ascii")
    except UnicodeDecodeError:
        raise errors.SealedCorrupt(f"{where}: its header names no key id") from None
    (chunk_size,) = struct.unpack(">I", rest[id_len : id_len + 4])
    if (layout == CHUNKS) != (0 < chunk_size <= MAX_CHUNK_SIZE):
        raise errors.SealedCorrupt(f"{where}: its header gives a chunk size of {chunk_size}")
    salt = rest[id_len + 4 : id_len + 4 + SALT]
    commit = rest[id_len + 4 + SALT :]
    return Header(layout, key_id, chunk_size, salt, commit, fixed + rest)


def is_sealed(prefix: bytes) -> bool:
    """Do these first bytes of a file start a sealed file?"""
    return prefix[: len(MAGIC)] == MAGIC


# -- a whole file, in chunks ------------------------------------------------------------------


def seal_stream(
    src: BinaryIO,
    dst: BinaryIO,
    keyring: Keyring,
    *,
    chunk_size: int = CHUNK_SIZE,
) -> int:
    """Encrypt what is left of the binary file *src* with the keyring's current key into
    *dst*; the bytes written."""
    if not isinstance(chunk_size, int) or not 0 < chunk_size <= MAX_CHUNK_SIZE:
        raise errors.InvalidInput(f"chunk_size must be from 1 to {MAX_CHUNK_SIZE:,}")
    header, cipher = Header.new(keyring.current, CHUNKS, chunk_size)
    written = dst.write(header.raw) or 0
    index = 0
    pieces = _rechunk(src, chunk_size)
    current = next(pieces, b"")
    for following in pieces:
        written += dst.write(cipher.encrypt(_nonce(index, False), current, header.raw)) or 0
        index += 1
        current = following
    written += dst.write(cipher.encrypt(_nonce(index, True), current, header.raw)) or 0
    return written


def open_stream(src: BinaryIO, keyring: Keyring, where: str = "sealed file") -> Iterator[bytes]:
    """The plaintext of the sealed file *src*, chunk by chunk (each checked before it is
    given).  ``KeyMissing``, ``WrongKey`` (from the header, before anything is given) or
    ``SealedCorrupt`` (any chunk, or the end)."""
    header = read_header(src, where)
    if header.layout != CHUNKS:
        raise errors.SealedCorrupt(f"{where}: a journal of records, not a sealed file")
    cipher = header.cipher(keyring)
    return _chunks(src, header, cipher, where)


def _chunks(src: BinaryIO, header: Header, cipher: AESGCM, where: str) -> Iterator[bytes]:
    from cryptography.exceptions import InvalidTag

    size = header.chunk_size + TAG
    index = 0
    current = _read_full(src, size)
    while True:
        following = _read_full(src, size) if len(current) == size else b""
        last = not following
        if len(current) < TAG:
            raise errors.SealedCorrupt(f"{where}: cut short after {index} chunk(s)")
        try:
            yield cipher.decrypt(_nonce(index, last), current, header.raw)
        except InvalidTag:
            raise errors.SealedCorrupt(
                f"{where}: chunk {index} failed its authentication: the file was damaged, "
                "cut short, extended or changed after it was sealed"
            ) from None
        if last:
            return
        index += 1
        current = following


class SealingWriter:
    """A file-like object that seals what is written to it into *dst*, chunk by chunk
    (``seal_stream`` for a producer that writes: an export's compressed stream).
    ``close`` writes the last chunk; *dst* is left open."""

    def __init__(self, dst: BinaryIO, keyring: Keyring, *, chunk_size: int = CHUNK_SIZE) -> None:
        self._dst = dst
        self._header, self._cipher = Header.new(keyring.current, CHUNKS, chunk_size)
        self._size = chunk_size
        self._buf = bytearray()
        self._index = 0
        self._closed = False
        dst.write(self._header.raw)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._closed:
            raise ValueError("write to a closed sealed file")
        self._buf += data
        # A full chunk is sealed once more follows it: only the last is marked so.
        while len(self._buf) > self._size:
            self._emit(bytes(self._buf[: self._size]), last=False)
            del self._buf[: self._size]
        return len(data)

    def flush(self) -> None:
        """Nothing: what is buffered is less than a chunk, sealed once more comes."""

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._emit(bytes(self._buf), last=True)
            self._buf = bytearray()

    def _emit(self, piece: bytes, *, last: bool) -> None:
        self._dst.write(self._cipher.encrypt(_nonce(self._index, last), piece, self._header.raw))
        self._index += 1


class _OpenedReader(io.RawIOBase):
    """The plaintext of a sealed file, as a readable binary file (``open_reader``)."""

    def __init__(self, src: BinaryIO, chunks: Iterator[bytes]) -> None:
        self._src = src
        self._chunks = chunks
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            piece = next(self._chunks, None)
            if piece is None:
                return 0
            self._buf = piece
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def tell(self) -> int:
        """Where the sealed file is read up to (progress of a reader)."""
        return self._src.tell()


def open_reader(src: BinaryIO, keyring: Keyring, where: str = "sealed file") -> BinaryIO:
    """The plaintext of the sealed file *src* as a binary file, each chunk checked
    before any of it is given (see ``open_stream`` for the errors)."""
    chunks = open_stream(src, keyring, where)
    return cast(BinaryIO, _OpenedReader(src, chunks))


def seal(data: bytes, keyring: Keyring, *, chunk_size: int = CHUNK_SIZE) -> bytes:
    """*data* sealed with the keyring's current key."""
    import io

    out = io.BytesIO()
    seal_stream(io.BytesIO(data), out, keyring, chunk_size=chunk_size)
    return out.getvalue()


def unseal(data: bytes, keyring: Keyring, where: str = "sealed file") -> bytes:
    """The plaintext of sealed *data* (see ``open_stream`` for the errors)."""
    import io

    return b"".join(open_stream(io.BytesIO(data), keyring, where))


# -- an append-only journal of records -----------------------------------------------------


class RecordSealer:
    """Seals the records of one new journal: write ``header`` first, then each
    ``seal(record)`` as it comes (the caller appends and fsyncs)."""

    def __init__(self, keyring: Keyring) -> None:
        self._header, self._cipher = Header.new(keyring.current, RECORDS, 0)
        self._index = 0

    @property
    def header(self) -> bytes:
        return self._header.raw

    def seal(self, record: bytes) -> bytes:
        if len(record) + TAG > MAX_RECORD:
            raise errors.PayloadTooLarge(f"a record of {len(record):,} bytes is over the limit")
        sealed = self._cipher.encrypt(_nonce(self._index, False), record, self._header.raw)
        self._index += 1
        return struct.pack(">I", len(sealed)) + sealed


@dataclass(frozen=True, slots=True)
class Records:
    """A journal's records, in order, and whether its last append was cut short."""

    records: list[bytes]
    #: Bytes after the last whole record (a crash during an append): not an error.
    torn: int


def open_records(data: bytes, keyring: Keyring, where: str = "sealed journal") -> Records:
    """The records of a sealed journal.  A record cut short at the end is ``torn``;
    a whole record that fails its tag is ``SealedCorrupt``."""
    import io

    from cryptography.exceptions import InvalidTag

    src = io.BytesIO(data)
    header = read_header(src, where)
    if header.layout != RECORDS:
        raise errors.SealedCorrupt(f"{where}: a sealed file, not a journal of records")
    cipher = header.cipher(keyring)
    records: list[bytes] = []
    pos = src.tell()
    while pos < len(data):
        if pos + 4 > len(data):
            return Records(records, len(data) - pos)
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        if not TAG <= length <= MAX_RECORD:
            raise errors.SealedCorrupt(f"{where}: record {len(records)} has a bad length")
        if pos + 4 + length > len(data):
            return Records(records, len(data) - pos)
        try:
            records.append(
                cipher.decrypt(
                    _nonce(len(records), False), data[pos + 4 : pos + 4 + length], header.raw
                )
            )
        except InvalidTag:
            raise errors.SealedCorrupt(
                f"{where}: record {len(records)} failed its authentication"
            ) from None
        pos += 4 + length
    return Records(records, 0)


# -- the primitives -------------------------------------------------------------------------


def _nonce(index: int, last: bool) -> bytes:
    return struct.pack(">QI", index, 1 if last else 0)


def _derive(key: Key, salt: bytes) -> tuple[bytes, bytes]:
    """The file key and the key commitment, from the key and the file's salt."""
    _require()
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    okm = HKDF(algorithm=hashes.SHA256(), length=64, salt=salt, info=_INFO).derive(key.secret)
    return okm[:32], okm[32:]


def _cipher(file_key: bytes) -> AESGCM:
    _require()
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM(file_key)


def _require() -> None:
    """cryptography is imported on first use (a store that encrypts nothing never loads
    it); ``EncryptionUnavailable`` if it is not installed."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise errors.EncryptionUnavailable(
            "encryption needs the cryptography package: pip install 'fleetstore[encryption]'"
        ) from None


def _rechunk(src: BinaryIO, size: int) -> Iterator[bytes]:
    """*src*'s bytes in pieces of *size* (the last may be shorter; none if it is empty)."""
    while True:
        piece = _read_full(src, size)
        if piece:
            yield piece
        if len(piece) < size:
            return


def _read_full(src: BinaryIO, size: int) -> bytes:
    """*size* bytes of *src*, fewer only at its end (a pipe may give less per read)."""
    piece = src.read(size)
    while piece and len(piece) < size:
        more = src.read(size - len(piece))
        if not more:
            break
        piece += more
    return piece


__all__ = [
    "CHUNK_SIZE",
    "MAGIC",
    "Header",
    "RecordSealer",
    "Records",
    "SealingWriter",
    "is_sealed",
    "open_reader",
    "open_records",
    "open_stream",
    "read_header",
    "seal",
    "seal_stream",
    "unseal",
]
