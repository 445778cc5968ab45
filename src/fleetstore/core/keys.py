"""Encryption keys: the keyring file that ``encryption_key_file`` names.

A keyring holds one or more raw 256-bit keys, each under an id; the first is the current
key (everything new is encrypted with it), the others are older keys, kept so that what
they encrypted can still be read (a sealed file names its key's id; a database is tried
with each key, current first).  Rotating a key is adding a line at the top; dropping an
old line is safe once nothing encrypted with it is left (``fleetstore rekey``, later).

The file is text, one key a line, ``<id> <64 hex digits>``; blank lines and lines
starting with ``#`` are ignored::

    # fleetstore keyring: the first key is the current one
    k2026-05 3f9a...(64 hex digits)
    k2025-11 77bd...(64 hex digits)

Keys are raw bytes, not passphrases: opening a store costs no key derivation (a
passphrase through sqlite3mc's PBKDF2 cost 17 ms per connection, a raw key none:
docs/benchmarks.md).  The file must be this user's (or root's) and readable by nobody
else (``UnsafeKeyFile``), as ssh insists of a private key.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fleetstore import errors

#: Bytes of every key (AES-256, ChaCha20, AEGIS-256 all take 32).
KEY_BYTES = 32
#: The largest keyring file read (a keyring of 100 keys is under 8 KiB).
MAX_FILE_BYTES = 64 * 1024
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_HEX = re.compile(r"[0-9a-fA-F]{64}")


@dataclass(frozen=True, slots=True)
class Key:
    """One key: its id and its 32 bytes (never shown by ``repr``)."""

    id: str
    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _ID.fullmatch(self.id):
            raise errors.ConfigError(
                f"a key id is 1 to 64 letters, digits, '.', '_' or '-' (starting with a "
                f"letter or digit), not {self.id!r:.80}"
            )
        if not isinstance(self.secret, bytes) or len(self.secret) != KEY_BYTES:
            raise errors.ConfigError(f"key {self.id}: a key is {KEY_BYTES} raw bytes")

    @classmethod
    def generate(cls, key_id: str) -> Key:
        """A new random key."""
        return cls(key_id, secrets.token_bytes(KEY_BYTES))

    @property
    def fingerprint(self) -> str:
        """16 hex digits that name this key without giving anything of it away (an HMAC
        under the key): shown by tools, to tell two keys of one id apart."""
        return hmac.new(self.secret, b"fleetstore key fingerprint", hashlib.sha256).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Keyring:
    """Keys by id, the current one first."""

    keys: tuple[Key, ...]
    #: Where it was read from ("" if built in memory): named in errors.
    source: str = ""

    def __post_init__(self) -> None:
        where = self.source or "the keyring"
        if not self.keys:
            raise errors.ConfigError(f"{where}: holds no key")
        ids = [k.id for k in self.keys]
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise errors.ConfigError(f"{where}: key id(s) used twice: {', '.join(repeated)}")
        if len({k.secret for k in self.keys}) != len(self.keys):
            raise errors.ConfigError(f"{where}: the same key under two ids")

    @property
    def current(self) -> Key:
        """The key everything new is encrypted with."""
        return self.keys[0]

    def __iter__(self) -> Iterator[Key]:
        return iter(self.keys)

    def get(self, key_id: str) -> Key:
        """The key of id *key_id*; ``KeyMissing`` if this keyring has none."""
        for key in self.keys:
            if key.id == key_id:
                return key
        raise errors.KeyMissing(
            f"{self.source or 'the keyring'} has no key {key_id!r:.80} (it has "
            f"{', '.join(k.id for k in self.keys)}): the data was encrypted with a key that "
            "is not in it; add that key's line back (it may be in a backup of the key file)"
        )

    def rotated(self, new: Key) -> Keyring:
        """This keyring with *new* as its current key and every key kept as an old one."""
        return Keyring((new, *self.keys), self.source)

    def without(self, key_id: str) -> Keyring:
        """This keyring without an old key (``ConfigError`` for the current one)."""
        if key_id == self.current.id:
            raise errors.ConfigError(f"{key_id} is the current key; rotate to a new one first")
        self.get(key_id)
        return Keyring(tuple(k for k in self.keys if k.id != key_id), self.source)

    def format(self) -> str:
        """The keyring as its file's text (``parse`` reads it back)."""
        lines = ["# fleetstore keyring: the first key is the current one (docs/secrets.md)"]
        lines += [f"{k.id} {k.secret.hex()}" for k in self.keys]
        return "\n".join(lines) + "\n"

    @classmethod
    def parse(cls, text: str, source: str = "") -> Keyring:
        """A keyring from its file's text.  ``ConfigError`` names the line, never a key."""
        where = source or "the keyring"
        keys = []
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            if len(fields) != 2 or not _HEX.fullmatch(fields[1]):
                raise errors.ConfigError(
                    f"{where}, line {number}: not '<id> <64 hex digits>' (a key is "
                    f"{KEY_BYTES} random bytes, written in hex)"
                )
            keys.append(Key(fields[0], bytes.fromhex(fields[1])))
        return cls(tuple(keys), source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Keyring:
        """The keyring in the file at *path*: ``KeyMissing`` if there is no such file,
        ``UnsafeKeyFile`` if it is not a regular file that only this user (or root)
        owns and only its owner can read, ``ConfigError`` if it cannot be read as one."""
        name = os.fspath(path)
        try:
            # Symbolic links are followed (secret mounts are links), then the file
            # itself is checked, on the descriptor that is read.
            fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
        except FileNotFoundError:
            raise errors.KeyMissing(
                f"{name}: no such key file (encryption_key_file); nothing was opened"
            ) from None
        except OSError as exc:
            raise errors.ConfigError(f"{name}: cannot open the key file: {exc.strerror}") from None
        try:
            check_key_file(name, os.fstat(fd))
            data = os.read(fd, MAX_FILE_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > MAX_FILE_BYTES:
            raise errors.ConfigError(f"{name}: over {MAX_FILE_BYTES:,} bytes: not a keyring")
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError:
            raise errors.ConfigError(
                f"{name}: not a keyring (text lines '<id> <64 hex digits>'); a file of 32 raw "
                "bytes is written as one such line"
            ) from None
        return cls.parse(text, name)


def check_key_file(name: str, st: os.stat_result) -> None:
    """``UnsafeKeyFile`` unless *st* is a regular file owned by this user (or root) that
    its group and others can neither read nor write."""
    why = ""
    if not stat.S_ISREG(st.st_mode):
        why = "it is not a regular file"
    elif st.st_uid not in (os.geteuid(), 0):
        why = f"it belongs to user {st.st_uid}, not to this user ({os.geteuid()}) or root"
    elif st.st_mode & 0o077:
        why = f"its mode is {stat.S_IMODE(st.st_mode):04o}: its group or others can use it"
    if why:
        raise errors.UnsafeKeyFile(
            f"{name}: refused as the encryption key file because {why}; the key may be known "
            "to others. Make it yours alone (chmod 600) and rotate the key if others could "
            "read it; nothing was opened"
        )


def write_keyring(path: str | os.PathLike[str], keyring: Keyring) -> None:
    """Write *keyring* to *path* (mode 0600), replacing it atomically: a crash leaves the
    old file or the new one, whole.  The directory is fsynced."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.write(fd, keyring.format().encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def keyring_of(key_file: str) -> Keyring | None:
    """The keyring the ``encryption_key_file`` setting names (None for "": no
    encryption); see ``Keyring.load`` for the errors."""
    return Keyring.load(key_file) if key_file else None


__all__ = ["KEY_BYTES", "Key", "Keyring", "check_key_file", "keyring_of", "write_keyring"]
