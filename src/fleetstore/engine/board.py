"""The group-commit board: where a process waiting for the writer gate posts its items
for the gate holder, and where the holder hands back their results.  This module is
the board's layout and protocol steps only: no futex, no clock, no SQL.
``engine/combine.py`` drives it; ``tests/engine/test_board_model.py`` explores it in
memory, with processes killed and stopped between any two of its writes.

The gate file past its first 64 bytes (engine/gate.py owns those; this module uses
word 16, the count of slots ever quarantined)::

    [64, 64 + 4 * SLOTS)   one u32 *state* per slot (contiguous: one read scans them)
    slot i at BOARD_OFFSET + i * SLOT_BYTES:
      [0, 64)              header: owner u64, ticket u64, count u32, request length
                           u32, tag u32, request crc u32, durability u32, note u32,
                           decided ticket u64, result ticket u64, result length u32,
                           result crc u32
      [64, 320)            the holder's decision per item (1: in its COMMIT)
      [320, 48 KiB)        the request: the items, framed, never overwritten
      [48 KiB, 64 KiB)     the results, framed

The request and the results have areas of their own, so a holder killed after writing
results leaves the request whole for the next holder (issue 23, cause 3: results used
to overwrite the request, and the next holder decoded results as items).  Both carry a
CRC-32 and their ticket, and every field is checked before use: a slot that does not
decode is *quarantined* (state ``BAD``, counted in word 16, shown by doctor), never
applied, and its owner applies its items itself (cause 4: one malformed slot left the
holder inside its transaction, and every new process wedged on it).

A slot is taken and given back only by a process holding the gate (the gate is the
board's mutex), so no compare-and-swap is needed.  States::

    FREE 0, DONE 4, RETRY 6, BAD 12    the owner's: it may write the slot and post it
    POSTED 1, KICK_A 3, KICK_B 5       (odd) posted, waiting for a holder
    TAKEN 2                            a holder has it and is applying its items
    DECIDING 8                         the holder is reading the clock to decide which
                                       items go into its COMMIT
    COMMITTING 10                      decided (the decisions are written): COMMIT next

*The deadline rule.*  A holder includes an item in its COMMIT only if the item's
deadline is later than a clock reading it takes *after* publishing ``DECIDING`` (with a
barrier between).  So an owner that reads the clock past an item's deadline and *then*
still sees its slot posted or ``TAKEN`` knows that item is not and will never be
written, and raises ``StoreBusy`` at once: the budget is honoured in every state but the
short decide-and-commit window, where the owner waits a grace period, then reports the
outcome unknown (``CommitUncertain``).  A holder stopped mid-batch (SIGSTOP, a
debugger) used to hold its waiters past their budget without limit (cause 2).

*Orphans.*  A holder killed leaves its slots ``TAKEN``, ``DECIDING`` (nothing of them
committed: COMMIT comes after every slot is ``COMMITTING``) or ``COMMITTING`` (its
decisions say which items may be committed; those are applied again, which finds them
if they are there, and the others are not applied).  The next holder, or the owner
once it holds the gate, deals with them by these rules.
"""

from __future__ import annotations

import ctypes
import math
import os
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fleetstore.core import liveness
from fleetstore.engine.gate import (
    BOARD_OFFSET,
    BOARD_SLOTS,
    GATE_FILE_BYTES,
    QUARANTINED_AT,
    SLOT_BYTES,
    STATES_AT,
)

#: Raised in the board's tag: a process with another layout never reads our slots.
LAYOUT = 2

FREE, POSTED, TAKEN, KICK_A, DONE, KICK_B, RETRY = 0, 1, 2, 3, 4, 5, 6
DECIDING, COMMITTING, BAD = 8, 10, 12
STATE_NAMES = {
    FREE: "free",
    POSTED: "posted",
    TAKEN: "taken",
    KICK_A: "posted",
    DONE: "done",
    KICK_B: "posted",
    RETRY: "retry",
    DECIDING: "deciding",
    COMMITTING: "committing",
    BAD: "quarantined",
}
#: States in which the owner may write its slot.
OWNERS = frozenset({FREE, DONE, RETRY, BAD})
#: States of a slot a holder is working on (seen by a later holder: its holder died).
IN_FLIGHT = frozenset({TAKEN, DECIDING, COMMITTING})

_HEAD = struct.Struct("<QQIIIIIIQQII")
HEAD_BYTES = _HEAD.size  # 64
DECISIONS_AT = HEAD_BYTES
MAX_ITEMS = 256
REQUEST_AT = DECISIONS_AT + MAX_ITEMS
RESULTS_AT = 48 * 1024
REQUEST_CAP = RESULTS_AT - REQUEST_AT
RESULTS_CAP = SLOT_BYTES - RESULTS_AT
#: What sealing adds to a request or results (an encrypted store's: nonce and tag).
SEAL_BYTES = 12 + 16
_COUNT = struct.Struct("<I")
_ITEM = struct.Struct("<dI")  # deadline, length
_RESULT = struct.Struct("<BI")  # kind, length
#: Result kinds: applied; failed alone (its error); not applied (its deadline had
#: passed, or the disk was full: see ``NOTE_FULL``).
OK, ERROR, EXPIRED = 0, 1, 2
#: A holder gave the slot back because the disk was full (its owner's error past the
#: budget is then ``StorageFull``, not ``StoreBusy``).
NOTE_FULL = 1

_POSTED_BYTES = bytes(1 if s in (POSTED, KICK_A, KICK_B) else 0 for s in range(256))
_ACTIVE_BYTES = bytes(
    1 if s in (POSTED, KICK_A, KICK_B, TAKEN, DECIDING, COMMITTING) else 0 for s in range(256)
)


class BadSlot(Exception):
    """A slot's contents do not decode: it is quarantined, never applied."""


def tag_of(text: str) -> int:
    """The board's short form of an applier's tag (which code may apply an item), with
    the board's layout in it."""
    return zlib.crc32(f"board/{LAYOUT}/{text}".encode()) or 1


def encode_request(items: Sequence[tuple[float, bytes]]) -> bytes:
    return b"".join([_COUNT.pack(len(items)), *(_ITEM.pack(d, len(p)) + p for d, p in items)])


def decode_request(data: bytes, count: int) -> list[tuple[float, bytes]]:
    """The items of a request, every length and deadline checked (``BadSlot``)."""
    try:
        (n,) = _COUNT.unpack_from(data)
        if n != count or not 0 < n <= MAX_ITEMS:
            raise BadSlot(f"{n} items where the header says {count}")
        at, out = _COUNT.size, []
        for _ in range(n):
            deadline, length = _ITEM.unpack_from(data, at)
            at += _ITEM.size
            if not math.isfinite(deadline) or at + length > len(data):
                raise BadSlot("an item runs past the request")
            out.append((deadline, data[at : at + length]))
            at += length
    except struct.error as exc:
        raise BadSlot(f"a truncated request: {exc}") from None
    if at != len(data):
        raise BadSlot("bytes past the last item")
    return out


def encode_results(results: Sequence[tuple[int, bytes]]) -> bytes:
    return b"".join([_COUNT.pack(len(results)), *(_RESULT.pack(k, len(b)) + b for k, b in results)])


def decode_results(data: bytes, count: int) -> list[tuple[int, bytes]] | None:
    """The results of *count* items, or None if they do not decode."""
    try:
        (n,) = _COUNT.unpack_from(data)
        if n != count:
            return None
        at, out = _COUNT.size, []
        for _ in range(n):
            kind, length = _RESULT.unpack_from(data, at)
            at += _RESULT.size
            if kind not in (OK, ERROR, EXPIRED) or at + length > len(data):
                return None
            out.append((kind, data[at : at + length]))
            at += length
    except struct.error:
        return None
    return out if at == len(data) else None


@dataclass(slots=True)
class Taken:
    """A slot a holder took, and its items."""

    slot: int
    ticket: int
    level: int
    items: list[tuple[float, bytes]]


#: A slot's owner word: the PID in the high 32 bits (as in every version), and in the
#: low 32, with bit 31 set, the low ``START_BITS`` bits of the process's start time
#: (core/liveness.py: a reused PID is not taken for the owner) above a 12-bit instance
#: number.  Bit 31 clear: the word of an older version (an instance number only), whose
#: owner is alive while its PID runs.
STARTED = 1 << 31
START_BITS = 19
_INSTANCE_BITS = 12


def owner_word(pid: int, start: int | None, instance: int) -> int:
    """The owner word of instance number *instance* of process *pid* started at *start*
    (None: not known, recorded as an older version's word)."""
    if start is None:
        return (pid << 32) | (instance & 0x7FFFFFFF)
    low = (start & ((1 << START_BITS) - 1)) << _INSTANCE_BITS
    return (pid << 32) | STARTED | low | (instance & ((1 << _INSTANCE_BITS) - 1))


def owner_alive(owner: int) -> bool:
    """Whether the process of a slot's *owner* word still runs (same process: yes, an
    instance frees its slot when it closes)."""
    pid = owner >> 32
    if pid == os.getpid():
        return True
    if not owner & STARTED:
        return liveness.alive(pid)
    start = (owner >> _INSTANCE_BITS) & ((1 << START_BITS) - 1)
    return liveness.alive(pid, start, bits=START_BITS)


class Board:
    """The slots of one gate file, as one instance (one ``Database`` of one process)
    sees them.  Every write to the shared memory goes through ``_store``/``set_state``,
    which the model test intercepts to kill or stop a process between two writes."""

    def __init__(
        self,
        mm: Any,
        owner: int,
        allocate: Callable[[int, int], bool],
        barrier: Callable[[], None],
    ) -> None:
        assert len(mm) >= GATE_FILE_BYTES
        self._mm = mm
        self.states = (ctypes.c_uint32 * BOARD_SLOTS).from_buffer(mm, STATES_AT)
        self.owner = owner
        self.slot = -1
        self.ticket = 0
        self._allocate = allocate
        self.full_barrier = barrier
        #: An encrypted store's AEAD (``cipher.board_cipher``): requests and results
        #: are sealed in the gate file, which is on disk like the database.
        self.aead: Any = None

    def detach(self) -> None:
        """Drop the views of the mapping (before it is unmapped)."""
        del self.states
        self.slot = -1

    # -- writes (the only ones) --------------------------------------------------------------

    def set_state(self, i: int, state: int) -> None:
        self.states[i] = state

    def _store(self, at: int, data: bytes) -> None:
        self._mm[at : at + len(data)] = data

    def _store_head(self, i: int, fmt: str, rel: int, *values: int) -> None:
        self._store(self._at(i) + rel, struct.pack(fmt, *values))

    def _seal(self, data: bytes) -> bytes:
        if self.aead is None:
            return data
        nonce = os.urandom(12)
        return nonce + bytes(self.aead.encrypt(nonce, data, None))

    def _unseal(self, data: bytes) -> bytes | None:
        if self.aead is None:
            return data
        try:
            return bytes(self.aead.decrypt(data[:12], data[12:], None))
        except Exception:  # InvalidTag, or too short: not ours to apply
            return None

    # -- reads -------------------------------------------------------------------------------

    def state(self, i: int) -> int:
        return int(self.states[i])

    @staticmethod
    def _at(i: int) -> int:
        return BOARD_OFFSET + i * SLOT_BYTES

    def head(self, i: int) -> tuple[int, ...]:
        """owner, ticket, count, request length, tag, request crc, durability, note,
        decided ticket, result ticket, result length, result crc."""
        return _HEAD.unpack_from(self._mm, self._at(i))

    def _low(self) -> bytes:
        # The low byte of every state word, in one C-level copy (states are < 256; a
        # state word of any other value is no state of ours and is left alone).
        return bytes(self._mm[STATES_AT : STATES_AT + 4 * BOARD_SLOTS : 4])

    def posted(self) -> int:
        """A slot posted by another instance, or -1."""
        marks: bytes = self._mm[STATES_AT : STATES_AT + 4 * BOARD_SLOTS : 4].translate(
            _POSTED_BYTES
        )
        i = marks.find(1)
        if i == self.slot and i >= 0:
            i = marks.find(1, i + 1)
        return i if i < 0 or self.states[i] < 256 else -1

    def quiet(self) -> bool:
        """Nothing posted or in flight but (maybe) ours: a lone write need not look."""
        marks: bytes = self._mm[STATES_AT : STATES_AT + 4 * BOARD_SLOTS : 4].translate(
            _ACTIVE_BYTES
        )
        i = marks.find(1)
        return i < 0 or (i == self.slot and marks.find(1, i + 1) < 0)

    def active(self) -> list[int]:
        """Every posted or in-flight slot but ours (in-flight: an orphan)."""
        marks = self._low().translate(_ACTIVE_BYTES)
        found = []
        i = marks.find(1)
        while i >= 0:
            if i != self.slot and self.states[i] < 256:
                found.append(i)
            i = marks.find(1, i + 1)
        return found

    def tag(self, i: int) -> int:
        return int(struct.unpack_from("<I", self._mm, self._at(i) + 24)[0])

    def level(self, i: int) -> int:
        return int(struct.unpack_from("<I", self._mm, self._at(i) + 32)[0])

    def note(self, i: int) -> int:
        return int(struct.unpack_from("<I", self._mm, self._at(i) + 36)[0])

    def quarantined(self) -> int:
        return int(struct.unpack_from("<I", self._mm, QUARANTINED_AT)[0])

    # -- the owner's side --------------------------------------------------------------------

    def claim(self, alive: Callable[[int], bool] = owner_alive) -> bool:
        """Gate held: take a free slot (or one whose owner is gone) for this instance,
        its pages allocated first (a write to a sparse page of a full file system is a
        SIGBUS, not an error: cause 6)."""
        if self.slot >= 0:
            return True
        for i in range(BOARD_SLOTS):
            # Allocated before it is even read: on tmpfs reading a hole of a shared
            # mapping allocates a page too (a SIGBUS on a full one, seen).
            if not self._allocate(self._at(i), SLOT_BYTES):
                continue
            owner = self.head(i)[0]
            if owner != 0 and alive(owner):
                continue
            if owner != 0 and self.state(i) not in OWNERS and self.state(i) < 256:
                continue  # posted or in flight for a process that died: a holder clears it
            self._store_head(i, "<Q", 0, self.owner)
            self.set_state(i, FREE)
            self.slot = i
            return True
        return False

    def release_slot(self) -> None:
        """Give our slot up (closing).  One a holder is working on stays ours until this
        process ends: its holder still writes its results there."""
        i = self.slot
        if i >= 0 and self.head(i)[0] == self.owner and self.state(i) in OWNERS:
            self._store_head(i, "<Q", 0, 0)
        self.slot = -1

    def can_post(self) -> bool:
        return self.slot >= 0 and self.state(self.slot) in OWNERS

    def post(self, request: bytes, count: int, tag: int, level: int) -> int:
        """Post *request* (``encode_request``) in our slot; returns its ticket."""
        self.ticket += 1
        at = self._at(self.slot)
        request = self._seal(request)
        self._store(at + REQUEST_AT, request)
        self._store(
            at + 8,
            struct.pack(
                "<QIIIIII", self.ticket, count, len(request), tag, zlib.crc32(request), level, 0
            ),
        )
        self.full_barrier_if_weak()
        self.set_state(self.slot, POSTED)
        return self.ticket

    def withdraw(self) -> None:
        """Gate held: our slot is ours again, whatever state it was left in."""
        if self.slot >= 0 and self.state(self.slot) != FREE:
            self.set_state(self.slot, FREE)

    def results(self, ticket: int, count: int) -> list[tuple[int, bytes]] | None:
        """The results of our post *ticket* (state DONE), or None if they are not for it
        or do not decode."""
        at = self._at(self.slot)
        head = self.head(self.slot)
        res_ticket, length, crc = head[9], head[10], head[11]
        if res_ticket != ticket or length > RESULTS_CAP:
            return None
        data = bytes(self._mm[at + RESULTS_AT : at + RESULTS_AT + length])
        opened = self._unseal(data) if zlib.crc32(data) == crc else None
        return None if opened is None else decode_results(opened, count)

    def decisions(self, i: int, ticket: int, count: int) -> list[bool] | None:
        """Which items of slot *i*'s post *ticket* its holder put in its COMMIT (None:
        it had not decided)."""
        if self.head(i)[8] != ticket or not 0 < count <= MAX_ITEMS:
            return None
        at = self._at(i) + DECISIONS_AT
        return [b == 1 for b in self._mm[at : at + count]]

    # -- the holder's side (gate held) -------------------------------------------------------

    def request(self, i: int) -> tuple[int, list[tuple[float, bytes]]]:
        """(ticket, items) of slot *i*, every field checked (``BadSlot``)."""
        _owner, ticket, count, length, _tag, crc, level, *_ = self.head(i)
        if not 0 < count <= MAX_ITEMS or length > REQUEST_CAP or level > 3:
            raise BadSlot(f"a header out of range (count {count}, length {length})")
        at = self._at(i) + REQUEST_AT
        data = bytes(self._mm[at : at + length])
        if zlib.crc32(data) != crc:
            raise BadSlot("its request does not match its checksum")
        opened = self._unseal(data)
        if opened is None:
            raise BadSlot("its request does not open with the store's key")
        return ticket, decode_request(opened, count)

    def max_level(self, tag: int) -> int:
        """The highest durability asked for by a slot of *tag* now posted or orphaned
        (-1: none)."""
        best = -1
        for i in self.active():
            if self.tag(i) == tag:
                best = max(best, min(self.level(i), 3))
        return best

    def take(self, tag: int, level: int, room: int) -> tuple[list[Taken], list[int]]:
        """Mark every posted slot of *tag* whose durability is at most *level* ``TAKEN``
        (and orphans an earlier holder died with before deciding), up to *room* items.
        Returns what was taken and the slots to wake: those quarantined (they do not
        decode) and orphans that had been decided (``COMMITTING``: some items may be in
        the file; handed back as ``RETRY``, for their owner to apply again, where they
        are found if they are there; applied here, a failure of this COMMIT would tell
        the owner they are not: the model test found both)."""
        taken: list[Taken] = []
        woken: list[int] = []
        for i in self.active():
            if room <= 0:
                break
            state = self.state(i)
            if self.tag(i) != tag:
                continue  # another version's: its owner applies it itself (kicked)
            if state == COMMITTING:
                self.set_state(i, RETRY)
                woken.append(i)
                continue
            try:
                ticket, items = self.request(i)
                slot_level = self.level(i)
            except BadSlot:
                self.quarantine(i)
                woken.append(i)
                continue
            if slot_level > level:
                continue  # asks for more durability than this COMMIT gives: kicked
            if state != TAKEN:
                self.set_state(i, TAKEN)
            taken.append(Taken(i, ticket, slot_level, items))
            room -= len(items)
        return taken, woken

    def quarantine(self, i: int) -> None:
        self.set_state(i, BAD)
        self._store(QUARANTINED_AT, struct.pack("<I", (self.quarantined() + 1) & 0xFFFFFFFF))

    def deciding(self, taken: Sequence[Taken]) -> None:
        for t in taken:
            self.set_state(t.slot, DECIDING)

    def decide(self, t: Taken, included: Sequence[bool]) -> None:
        at = self._at(t.slot)
        self._store(at + DECISIONS_AT, bytes(1 if x else 0 for x in included))
        self._store_head(t.slot, "<Q", 40, t.ticket)
        self.full_barrier_if_weak()
        self.set_state(t.slot, COMMITTING)

    def put_results(self, t: Taken, results: Sequence[tuple[int, bytes]]) -> bool:
        """Write *t*'s results in their own area (False: they do not fit)."""
        data = self._seal(encode_results(results))
        if len(data) > RESULTS_CAP:
            return False
        at = self._at(t.slot)
        self._store(at + RESULTS_AT, data)
        self._store_head(t.slot, "<QII", 48, t.ticket, len(data), zlib.crc32(data))
        return True

    def mark_done(self, t: Taken) -> None:
        self.full_barrier_if_weak()
        self.set_state(t.slot, DONE)

    def untake(self, t: Taken, note: int = 0) -> None:
        """Nothing of *t* was committed: posted again, for the next holder."""
        self._store_head(t.slot, "<I", 36, note)
        self.set_state(t.slot, POSTED)

    def kick(self, i: int) -> None:
        """Make posted waiter *i* take the gate after our release (its state changes, so
        it knows it was kicked, not served)."""
        self.set_state(i, KICK_B if self.state(i) == KICK_A else KICK_A)

    # -- memory order ------------------------------------------------------------------------

    #: x86 keeps stores in order and loads in order; elsewhere a full barrier separates
    #: data from the state word that publishes it.
    weak_order = False

    def full_barrier_if_weak(self) -> None:
        if self.weak_order:
            self.full_barrier()


@dataclass(frozen=True, slots=True)
class SlotReport:
    slot: int
    state: str
    pid: int
    items: int
    tag: int


def read_board(gate_path: str) -> tuple[int, list[SlotReport]] | None:
    """What the board of *gate_path* holds, read without mapping or changing it:
    (slots ever quarantined, every slot not free).  None: no board there."""
    try:
        fd = os.open(gate_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size < GATE_FILE_BYTES:
            return None
        head = os.pread(fd, STATES_AT + 4 * BOARD_SLOTS, 0)
        (quarantined,) = struct.unpack_from("<I", head, QUARANTINED_AT)
        states = struct.unpack_from(f"<{BOARD_SLOTS}I", head, STATES_AT)
        slots = []
        for i, state in enumerate(states):
            raw = os.pread(fd, HEAD_BYTES, BOARD_OFFSET + i * SLOT_BYTES)
            owner, _ticket, count, _length, tag, *_ = _HEAD.unpack(raw)
            if state == FREE and owner == 0:
                continue
            name = STATE_NAMES.get(state, f"unknown ({state})")
            slots.append(SlotReport(i, name, owner >> 32, count, tag))
        return quarantined, slots
    finally:
        os.close(fd)


__all__ = [
    "BAD",
    "COMMITTING",
    "DECIDING",
    "DONE",
    "ERROR",
    "EXPIRED",
    "FREE",
    "IN_FLIGHT",
    "KICK_A",
    "KICK_B",
    "NOTE_FULL",
    "OK",
    "OWNERS",
    "POSTED",
    "RETRY",
    "TAKEN",
    "BadSlot",
    "Board",
    "SlotReport",
    "Taken",
    "decode_request",
    "decode_results",
    "encode_request",
    "encode_results",
    "owner_alive",
    "owner_word",
    "read_board",
    "tag_of",
]
