"""Time-ordered ids chosen by the client (UUIDv7, RFC 9562).

The client picks every id before it writes, so a write retried after an
ambiguous failure names the same rows and commits once (DESIGN.md, promise 2).
Ids sort by creation time; within one millisecond of one process they still
increase (a 12-bit counter in ``rand_a``, reseeded each millisecond).
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
import uuid

_URL_NAMESPACE = uuid.NAMESPACE_URL.bytes
_lock = threading.Lock()
_last_ms = 0
_counter = 0


#: The random bits of ids: seeded from the OS once per process (two ``os.urandom``
#: calls per id were a tenth of the id's cost).  Uniqueness, not secrecy, is the need.
_random = random.Random(os.urandom(32))


def _after_fork_in_child() -> None:
    # Another thread of the parent may have held the lock at fork time: in the
    # child it would never be released.  And a child must not repeat its parent's
    # random bits: same millisecond, same counter, same id.
    global _lock
    _lock = threading.Lock()
    _random.seed(os.urandom(32))


os.register_at_fork(after_in_child=_after_fork_in_child)


def new_id() -> str:
    """A new UUIDv7 as text, e.g. ``'0193a4b2-7c1e-7a3f-9c2d-4b5e6f708192'``."""
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms = ms
            _counter = _random.getrandbits(10)  # room to count up
        else:
            _counter += 1
            if _counter > 0xFFF:  # 4096 ids in one ms: borrow the next millisecond
                _last_ms += 1
                _counter = 0
            ms = _last_ms
        counter = _counter
        low = _random.getrandbits(62)
    value = (ms & 0xFFFFFFFFFFFF) << 80
    value |= 0x7 << 76 | counter << 64
    value |= 0b10 << 62 | low
    h = f"{value:032x}"  # uuid.UUID(int=...) and str() of it: 3x the time
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def derived_id(namespace: str, *names: str) -> str:
    """A deterministic id for a row derived from others (a fork's copy of a
    message): the same inputs give the same id, so copying twice copies once."""
    # uuid.uuid5, without building UUID objects (the same ids: tests/core/test_ids.py).
    name = "fleetstore:" + namespace + ":" + "/".join(names)
    digest = bytearray(hashlib.sha1(_URL_NAMESPACE + name.encode("utf-8")).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def is_valid_id(value: object) -> bool:
    """Ids are short printable strings without path separators or control characters."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= 128
        and value.isprintable()
        and "/" not in value
        and "\\" not in value
    )


__all__ = ["derived_id", "is_valid_id", "new_id"]
