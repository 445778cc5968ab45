"""``fleetstore rekey``: a SQLite store's files put under the keyring's current key (or
encrypted for the first time, or, with ``decrypt``, decrypted), safely.

SQLite in WAL mode cannot change a database's key in place while anyone else has the
file open (every other connection fails, and one still holding the old key would write
pages under it), so each database file is done on its own, with the store to itself:

1. the writer gate is taken (no fleetstore process commits meanwhile) and nobody else
   may have the file, its -wal, -shm or gate open (``/proc``; else ``StoreInUse``);
2. its WAL is checkpointed whole into it, and ``VACUUM INTO`` writes a new file beside
   it under the new key (a new salt, compacted), which is switched to WAL, checked
   (``quick_check``, its schema) and fsynced (``engine.cipher.copy_under_key``);
3. nobody having come meanwhile (looked at again), the old -wal and -shm are removed
   and the copy renamed over the file, atomically, the directory fsynced, and the move
   announced on the gate (a process that opened it since learns it moved: FileMoved);
4. then the sealed files (blob files, spool journals of dead processes,
   ``rejected.jsonl``) are sealed anew under the new key, each written whole and
   renamed into place.

A crash (``kill -9``) at any point leaves every database file whole under its old key or
its new one, never neither (a leftover copy is removed by the next run), and a run
again carries on: a file already under the target key is left alone.  The old key must
stay in the keyring until a run has finished: the report says, per key id, what still
needs it (0 everywhere: it may be dropped, unless backups or exports made under it are
kept).  Writes acknowledged before the run are in the copy (checkpointed first); a
process writing meanwhile waits at the gate, then spools (its journal replayed at the
next open) or gets ``FileMoved``.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import io
import os
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetstore import errors
from fleetstore.core import sealed
from fleetstore.core.crash import crash_point
from fleetstore.core.keys import Key, Keyring, write_keyring
from fleetstore.core.targets import parse_target
from fleetstore.domain.blobs import COLLECTING, fsync_dir
from fleetstore.engine import cipher
from fleetstore.engine.gate import GateTimeout, WriterGate, announce_moved, wipe_board
from fleetstore.files import processes
from fleetstore.store.backend import store_files
from fleetstore.store.spool import REJECTED, checked_body, journals, seal_text, unseal_text

_SUFFIX = ".rekey.tmp"


class StoreInUse(errors.TransientError):
    """Another process has the store open: a rekey needs it to itself (stop the fleet,
    then run it again).  Nothing was changed."""


@dataclass
class RekeyReport:
    """What a run did."""

    store: str
    #: The key id everything is now under (None: decrypted, plain).
    key: str | None
    #: Each database file: "rekeyed", "encrypted", "decrypted" or "already".
    databases: dict[str, str] = field(default_factory=dict)
    resealed: Counter[str] = field(default_factory=Counter)
    #: key id (or "plain") -> files of the store still under it after the run.
    still_under: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "key": self.key,
            "databases": self.databases,
            "resealed": dict(self.resealed),
            "still_under": dict(self.still_under),
            "seconds": round(self.seconds, 3),
        }


def rekey(
    store: str | None,
    keyring: Keyring,
    *,
    decrypt: bool = False,
    new_key: str | None = None,
    wait: float = 60.0,
) -> RekeyReport:
    """Put the SQLite store *store* (a file or a sharded directory) under *keyring*'s
    current key (see the module docstring).  *new_key*: first add a new random key of
    that id at the top of the keyring's file (it becomes the current key; the old ones
    stay).  *decrypt*: write it plain instead.  ``StoreInUse`` if another process has
    it open; ``ConfigError`` for PostgreSQL."""
    started = time.monotonic()
    kind, target = parse_target(store)
    if isinstance(target, str):
        raise errors.ConfigError(
            "rekey works on SQLite stores: a PostgreSQL store's data files are the server's "
            "to encrypt; its blob rows are sealed with the keyring's current key as they "
            "are written (docs/secrets.md)"
        )
    if new_key is not None:
        if decrypt:
            raise errors.ConfigError("--new-key and --decrypt contradict each other")
        if not keyring.source:
            raise errors.ConfigError("a keyring read from no file cannot be given a new key")
        keyring = keyring.rotated(Key.generate(new_key))
        write_keyring(keyring.source, keyring)  # first: a crash later leaves both keys
    found = store_files(kind, target)
    main = found.main
    # The shards first, the catalog last (a sharded store's main file).
    files = [*found.databases[1:], main]
    goal = None if decrypt else keyring.current
    report = RekeyReport(str(target), None if goal is None else goal.id)
    for path in files:
        report.databases[str(path)] = _rekey_file(path, keyring, goal, wait)
    _reseal_blobs(found.blobs, keyring, goal, report)
    _reseal_spool(found.spool, keyring, goal, report)
    for path in files:
        report.still_under[_key_id_of(path, keyring)] += 1
    report.seconds = time.monotonic() - started
    return report


# -- the database files ----------------------------------------------------------------------


def _key_id_of(path: Path, keyring: Keyring) -> str:
    key = cipher.key_of_file(str(path), keyring, strict=False)
    if key is None:
        return "plain"
    return next(k.id for k in keyring if k.secret == key)


def _rekey_file(path: Path, keyring: Keyring, goal: Key | None, wait: float) -> str:
    name = str(path)
    tmp = path.with_name(f".{path.name}{_SUFFIX}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # a run killed before its rename: start that file again
    old = cipher.key_of_file(name, keyring, strict=False)
    new = None if goal is None else goal.secret
    if old == new:
        return "already"
    gate = WriterGate(f"{name}.gate")
    try:
        try:
            gate.acquire(time.monotonic() + wait)
        except GateTimeout as exc:
            raise StoreInUse(
                f"{name}: its writer gate stayed taken ({exc}); nothing was changed"
            ) from None
        try:
            _alone(name)
            cipher.copy_under_key(name, str(tmp), old, new)
            crash_point("rekey-copied")
            _alone(name)
            wipe_board(f"{name}.gate")
            cipher.put_in_place(str(tmp), name)
            crash_point("rekey-renamed")
            announce_moved(f"{name}.gate")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                if tmp.exists():
                    tmp.unlink()
            raise
        finally:
            gate.release()
    finally:
        gate.close()
    if old is None:
        return "encrypted"
    return "decrypted" if new is None else "rekeyed"


def _alone(name: str) -> None:
    """``StoreInUse`` unless no other process has the file, its -wal, -shm or gate
    open or locked."""
    users = processes.users_of([name, f"{name}-wal", f"{name}-shm", f"{name}.gate"])
    others = sorted({pid for pids in users.values() for pid in pids} - {os.getpid()})
    if others:
        raise StoreInUse(
            f"{name}: in use by process(es) {', '.join(map(str, others))}: a rekey needs the "
            "store to itself (stop the fleet, then run it again); nothing was changed"
        )


# -- the sealed files --------------------------------------------------------------------------


def _reseal_blobs(directory: Path, keyring: Keyring, goal: Key | None, report: RekeyReport) -> None:
    """Every blob file under *goal* (sealed with it; plain for None), each written whole
    and renamed; blob collection waits meanwhile (its lock held)."""
    if not directory.is_dir():
        return
    fd = os.open(directory / COLLECTING, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for sub in sorted(directory.iterdir()):
            if sub.is_symlink() or not sub.is_dir() or len(sub.name) != 2:
                continue
            for blob in sorted(sub.iterdir()):
                if blob.name.startswith(".") or not blob.is_file():
                    continue
                try:
                    data = blob.read_bytes()
                except FileNotFoundError:
                    continue
                if _under(data, goal):
                    continue
                packed = sealed.unseal(data, keyring, str(blob)) if sealed.is_sealed(data) else data
                _replace(blob, packed if goal is None else sealed.seal(packed, _ring(goal)))
                report.resealed["blobs"] += 1
            fsync_dir(sub)
        for sub in sorted(directory.iterdir()):
            for blob in sorted(sub.iterdir()) if sub.is_dir() else ():
                if blob.is_file() and not blob.name.startswith("."):
                    with blob.open("rb") as f:
                        report.still_under[_id_of(f.read(128))] += 1
    finally:
        os.close(fd)


def _reseal_spool(directory: Path, keyring: Keyring, goal: Key | None, report: RekeyReport) -> None:
    """Each sealed line of the journals of dead processes and of ``rejected.jsonl``
    under *goal* (the journal's flock held while it is rewritten)."""
    files = [p for p in journals(directory)] + [directory / REJECTED]
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                report.still_under["a live process's journal"] += 1
                continue
            lines = path.read_bytes().split(b"\n")
            out, changed = [], False
            for line in lines:
                new, ids = _reseal_line(line, keyring, goal, path.name == REJECTED)
                changed |= new != line
                out.append(new)
                for i in ids:
                    report.still_under[i] += 1
            if changed:
                _replace(path, b"\n".join(out))
                report.resealed["journals"] += 1
        finally:
            os.close(fd)


def _reseal_line(
    line: bytes, keyring: Keyring, goal: Key | None, rejected: bool
) -> tuple[bytes, list[str]]:
    """A journal line (``crc json``) or a rejected record under *goal*; the key ids it
    is left under."""
    if not line:
        return line, []
    try:
        body = line if rejected else checked_body(line + b"\n")
    except errors.InvalidInput:
        # A torn last append (never acknowledged, ignored by a replay) or damage (a
        # replay stops there): left as it is (it raised a raw binascii.Error).
        return line, ["damaged"]
    if not body.startswith(b"!") and goal is None:
        return line, []
    if body.startswith(b"!"):
        try:
            data = base64.b64decode(body[1:], validate=True)
            under = sealed.read_header(io.BytesIO(data)).key_id
        except (ValueError, errors.SealedCorrupt):
            return line, ["damaged"]
        if goal is not None and under == goal.id:
            return line, [goal.id]
        text = unseal_text(body, keyring, "journal line")
    else:
        text = body
    new = text if goal is None else seal_text(text, _ring(goal))
    if rejected:
        return new, [] if goal is None else [goal.id]
    return b"%08x %s" % (zlib.crc32(new), new), [] if goal is None else [goal.id]


# -- small helpers -----------------------------------------------------------------------------


def _under(data: bytes, goal: Key | None) -> bool:
    if goal is None:
        return not sealed.is_sealed(data)
    return sealed.is_sealed(data) and sealed.read_header(io.BytesIO(data)).key_id == goal.id


def _id_of(head: bytes) -> str:
    if not sealed.is_sealed(head):
        return "plain"
    try:
        return sealed.read_header(io.BytesIO(head)).key_id
    except errors.SealedCorrupt:
        return "damaged"


def _ring(key: Key) -> Keyring:
    return Keyring((key,))


def _replace(path: Path, data: bytes) -> None:
    """*data* at *path*, written whole beside it (0600), fsynced, then renamed over it."""
    tmp = path.with_name(f".{path.name}{_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


__all__ = ["RekeyReport", "StoreInUse", "rekey"]
