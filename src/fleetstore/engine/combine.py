"""Group commit by *combining in the gate*: the process that holds the writer gate also
applies the writes that waiting processes handed it, commits them all at once, hands
each its result and wakes each waiter.  No extra process; a lone writer takes the gate
at once and pays a glance at the slot states.  (docs/design.md, "Group commit": why
this design and not a per-host writer, and what each measured.)

The board: the gate file (engine/gate.py) past its first 64 bytes::

    [64, 64 + 4 * SLOTS)         one u32 *state* per slot, also the futex its owner
                                 sleeps on (contiguous: one read scans them all)
    slot i at BOARD_OFFSET + i * SLOT_BYTES:
        owner u64, ticket u64, count u32, length u32, tag u32, result length u32,
        then the request (the items, framed), overwritten by the results

A process takes a slot, and gives it back, only while it holds the gate (the gate is
the board's mutex), writing its *owner* word (pid << 32 | an instance number); a slot
whose owner process is gone is taken again.  Slot states::

    FREE 0, DONE 4, RETRY 6      the owner may write the slot and post it
    POSTED 1, KICK_A 3, KICK_B 5  (odd) posted: only the gate holder changes it, or the
                                 owner while it holds the gate itself
    TAKEN 2                      a gate holder is applying it; seen by a later holder,
                                 its taker died: an orphan

So no compare-and-swap is needed anywhere.  The protocol:

* submit: the threads of one process combine first (one leader carries their items);
  then ``LOCK_NB`` on the gate.  Got it: serve.  Else post the items (only items that
  may run in another process: ``Item.payload()`` is not None), try the gate once
  more, and sleep on the board's bell word with the slot's bit (FUTEX_WAIT_BITSET; at
  most 50 ms a nap, then the gate is tried).
* serve (gate held): withdraw the own post; ``BEGIN IMMEDIATE`` (waiting out outside
  locks, as every write does); mark every posted slot of our own tag TAKEN (and take
  orphans); read the clock; apply the own items, then each taken one, each in its own
  SAVEPOINT when there is more than one (an item that raises is rolled back alone and
  its error handed back; the rest commit); items whose deadline has passed are not
  applied; COMMIT; write the results; DONE; after the gate's release, one
  FUTEX_WAKE_BITSET for all of them (the bell changed first).  Nobody hears of its
  item before the COMMIT that holds it.  More rounds while items are posted, within
  ``_MAX_ROUNDS`` and ``_MAX_HOLD``; past them, or for slots of another tag (another
  version of the code), one waiter is *kicked* (its state toggled between KICK_A and
  KICK_B under the gate) and rung, and takes over.
* a waiter's deadline: a holder reads the clock only after marking TAKEN; so an owner
  that reads the clock past a deadline and *then* still sees its slot posted knows no
  holder will apply that item, and raises ``StoreBusy`` at once (never applied later).
* a holder killed (before, during or after COMMIT, or before waking anyone): the
  kernel drops its gate lock, its TAKEN slots are orphans, their owners notice within
  a nap; the next holder applies the orphans again (idempotent: a logged operation
  finds its ``applied_ops`` row and returns the result recorded there), or an owner
  that gets the gate first withdraws its own and applies them itself.  A batch whose
  COMMIT failed hands RETRY back: each owner applies its items alone.

Memory order: x86 keeps stores in order and loads in order; its one reordering
(store then load) and everything on weakly ordered CPUs is covered by a barrier
between writing the data and the state word, and between marking TAKEN and reading
the clock: ``FUTEX_WAKE`` on an unused word (the kernel's wake path is a full barrier).
tests/engine/test_group_commit.py kills the holder at each of these points.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import struct
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Protocol

from fleetstore import errors
from fleetstore.engine.base import Applier, Item, Tx
from fleetstore.engine.gate import (
    BOARD_OFFSET,
    BOARD_SLOTS,
    GATE_FILE_BYTES,
    SLOT_BYTES,
    WriterGate,
    _Timespec,
    futex_wait_bits,
    futex_wake,
    futex_wake_bits,
)

FREE, POSTED, TAKEN, KICK_A, DONE, KICK_B, RETRY = 0, 1, 2, 3, 4, 5, 6
_STATES_AT = 64
_SLOT_HEAD = struct.Struct("<QQIIII")  # owner, ticket, count, length, tag, result length
_HEAD = 32
_CAP = SLOT_BYTES - _HEAD
_ITEM = struct.Struct("<dI")  # deadline, length
_RESULT = struct.Struct("<BI")  # kind, length
_OK, _ERROR, _EXPIRED, _UNKNOWN = 0, 1, 2, 3
#: A waiter tries the gate itself at least this often (a holder killed never wakes it).
_MAX_NAP = 0.05
#: A holder serves at most this many rounds, for at most this long, past its own items.
_MAX_ROUNDS = 3
_MAX_HOLD = 0.005
#: Most items applied in one transaction.
_MAX_BATCH = 256
_WEAK_ORDER = platform.machine() not in ("x86_64", "AMD64", "i686")
_POSTED_BYTES = bytes(1 if s in (POSTED, KICK_A, KICK_B) else 0 for s in range(256))
_ACTIVE_BYTES = bytes(1 if s in (POSTED, TAKEN, KICK_A, KICK_B) else 0 for s in range(256))
#: Test hook: makes the process SIGKILL itself at that point of serving others' items.
CRASH_ENV = "FLEETSTORE_TEST_CRASH_COMBINE"

_instances = 0
_instances_lock = threading.Lock()


def _owner_alive(owner: int) -> bool:
    pid = owner >> 32
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True  # another instance of this process: it frees its slot at close
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Board:
    """The slots in one gate file's mapping, as this process sees them."""

    def __init__(self, gate: WriterGate) -> None:
        mm = gate.mapping
        assert mm is not None and len(mm) >= GATE_FILE_BYTES
        self._mm = mm
        self.states = (ctypes.c_uint32 * BOARD_SLOTS).from_buffer(mm, _STATES_AT)
        self._barrier_word = ctypes.c_uint32.from_buffer(mm, 8)
        self._barrier_addr = ctypes.c_void_p(ctypes.addressof(self._barrier_word))
        #: Every waiter sleeps on this one word, with its slot's bit (slot mod 32), so a
        #: holder wakes all it served with one FUTEX_WAKE_BITSET: a wake per waiter cost
        #: ~0.4 ms of the waker's time at 16 agents (each woken one preempted it).
        self.bell = ctypes.c_uint32.from_buffer(mm, 12)
        self.bell_addr = ctypes.c_void_p(ctypes.addressof(self.bell))
        self._rung = int.from_bytes(os.urandom(4), "little")
        global _instances
        with _instances_lock:
            _instances += 1
            self.owner = (os.getpid() << 32) | (_instances & 0xFFFFFFFF)
        self.slot = -1
        self.ticket = 0
        gate.board = self

    def detach(self) -> None:
        """Drop the views of the mapping (before the gate unmaps it)."""
        del self.states, self._barrier_word, self.bell
        self.slot = -1

    def ring(self, bits: int) -> None:
        """Wake the waiters of *bits* (their states already changed)."""
        # A value of our own, not an increment of the shared one (see gate._ring).
        self._rung = (self._rung + 1) & 0xFFFFFFFF
        self.bell.value = self._rung
        futex_wake_bits(self.bell_addr, bits)

    @staticmethod
    def bit(i: int) -> int:
        return 1 << (i & 31)

    # -- ownership (gate held) ---------------------------------------------------------------

    def claim(self) -> bool:
        """Take a free slot (or one whose owner is gone) for this instance."""
        if self.slot >= 0:
            return True
        for i in range(BOARD_SLOTS):
            owner = self._owner_of(i)
            if owner == 0 or not _owner_alive(owner):
                if owner != 0 and self.states[i] not in (FREE, DONE, RETRY):
                    continue  # posted by a process that died: left for a holder to clear
                struct.pack_into("<Q", self._mm, self._at(i), self.owner)
                self.states[i] = FREE
                self.slot = i
                return True
        return False

    def release_slot(self) -> None:
        if self.slot >= 0 and self._owner_of(self.slot) == self.owner:
            struct.pack_into("<Q", self._mm, self._at(self.slot), 0)
        self.slot = -1

    def _owner_of(self, i: int) -> int:
        return int(struct.unpack_from("<Q", self._mm, self._at(i))[0])

    @staticmethod
    def _at(i: int) -> int:
        return BOARD_OFFSET + i * SLOT_BYTES

    # -- states -----------------------------------------------------------------------------

    def barrier(self) -> None:
        """Store-store / load-load order: free on x86 (each access is its own C call)."""
        if _WEAK_ORDER:
            self.full_barrier()

    def full_barrier(self) -> None:
        futex_wake(self._barrier_addr, 1)

    def _low(self) -> bytes:
        # The low byte of every state word (states are < 256), in one C-level copy.
        return bytes(self._mm[_STATES_AT : _STATES_AT + 4 * BOARD_SLOTS : 4])

    def posted(self) -> int:
        """A slot posted by another instance, or -1."""
        marks = self._low().translate(_POSTED_BYTES)
        i = marks.find(1)
        if i == self.slot and i >= 0:
            i = marks.find(1, i + 1)
        return i

    def active(self) -> list[tuple[int, int]]:
        """(slot, state) of every posted or TAKEN slot but ours."""
        low = self._low()
        marks = low.translate(_ACTIVE_BYTES)
        found = []
        i = marks.find(1)
        while i >= 0:
            if i != self.slot:
                found.append((i, low[i]))
            i = marks.find(1, i + 1)
        return found

    # -- requests and results ---------------------------------------------------------------

    def post(self, request: bytes, count: int, tag: int) -> int:
        self.ticket += 1
        at = self._at(self.slot)
        struct.pack_into("<QIII", self._mm, at + 8, self.ticket, count, len(request), tag)
        self._mm[at + _HEAD : at + _HEAD + len(request)] = request
        self.barrier()
        self.states[self.slot] = POSTED
        return self.ticket

    def request(self, i: int) -> tuple[int, int, bytes]:
        """(ticket, tag, request) of slot *i*."""
        at = self._at(i)
        _owner, ticket, _count, length, tag, _r = _SLOT_HEAD.unpack_from(self._mm, at)
        if length > _CAP:
            raise errors.DatabaseError(f"group commit: slot {i} holds a bad length")
        return ticket, tag, bytes(self._mm[at + _HEAD : at + _HEAD + length])

    def put_results(self, i: int, data: bytes) -> bool:
        if len(data) > _CAP:
            return False
        at = self._at(i)
        self._mm[at + _HEAD : at + _HEAD + len(data)] = data
        struct.pack_into("<I", self._mm, at + 28, len(data))
        return True

    def results(self) -> tuple[int, bytes]:
        at = self._at(self.slot)
        ticket = struct.unpack_from("<Q", self._mm, at + 8)[0]
        length = min(struct.unpack_from("<I", self._mm, at + 28)[0], _CAP)
        return int(ticket), bytes(self._mm[at + _HEAD : at + _HEAD + length])


def encode_request(items: Sequence[tuple[float, bytes]]) -> bytes:
    return b"".join([struct.pack("<I", len(items)), *(_ITEM.pack(d, len(p)) + p for d, p in items)])


def decode_request(data: bytes) -> list[tuple[float, bytes]]:
    (count,) = struct.unpack_from("<I", data)
    at, out = 4, []
    for _ in range(count):
        deadline, length = _ITEM.unpack_from(data, at)
        at += _ITEM.size
        out.append((deadline, data[at : at + length]))
        at += length
    return out


def encode_results(results: Sequence[tuple[int, bytes]]) -> bytes:
    return b"".join(
        [struct.pack("<I", len(results)), *(_RESULT.pack(k, len(b)) + b for k, b in results)]
    )


def decode_results(data: bytes) -> list[tuple[int, bytes]]:
    (count,) = struct.unpack_from("<I", data)
    at, out = 4, []
    for _ in range(count):
        kind, length = _RESULT.unpack_from(data, at)
        at += _RESULT.size
        out.append((kind, data[at : at + length]))
        at += length
    return out


def tag_of(text: str) -> int:
    """The board's short form of an applier's tag (which code may apply an item)."""
    return zlib.crc32(text.encode("utf-8")) or 1


# -- the requests of one process --------------------------------------------------------------

_PENDING = object()


class Request:
    """One ``submit`` call: an item, its deadline, and (once known) its outcome."""

    __slots__ = ("deadline", "error", "event", "index", "item", "payload", "result", "unknown")

    def __init__(self, item: Item, deadline: float) -> None:
        self.item = item
        self.deadline = deadline
        self.payload: bytes | None = None
        self.result: object = _PENDING
        self.error: BaseException | None = None
        self.event: threading.Event | None = None
        self.index = 0
        #: Handed to a holder that died, or whose COMMIT failed: it may or may not be
        #: in the file; applied again (idempotent) it will be found there.
        self.unknown = False

    @property
    def done(self) -> bool:
        return self.error is not None or self.result is not _PENDING

    def succeed(self, value: object) -> None:
        self.result = value

    def fail(self, exc: BaseException) -> None:
        self.error = exc

    def outcome(self) -> object:
        if self.error is not None:
            raise self.error
        return self.result


class Host(Protocol):
    """What the combiner needs of its database (engine/sqlite.py, ``Database``)."""

    path: str
    _gate: WriterGate

    def _acquire_gate(self, started: float, deadline: float) -> None: ...

    def _open_write(self, started: float, deadline: float) -> Tx:
        """BEGIN IMMEDIATE within *deadline*, the gate held (``StoreBusy`` past it)."""
        ...

    def _end_write(self, tx: Tx, commit: bool) -> None:
        """COMMIT (or roll back) the transaction of ``_open_write``."""
        ...

    def _in_transaction(self) -> bool: ...

    def _committed(self, started: float, acquired: float, items: int, served: int) -> None: ...

    def _handed_over(self) -> None: ...

    def _background_error(self, what: str, exc: BaseException) -> None:
        """Log and count a failure that changes no write's outcome."""
        ...


def _bound(applier: Applier, payload: bytes) -> Callable[[Tx], object]:
    return lambda tx: applier(tx, payload)


class _Broken(Exception):
    """The transaction itself is lost (a savepoint could not be rolled back)."""


def _crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), 9)


class Combiner:
    """Group commit for one ``Database`` in one process (see the module doc)."""

    def __init__(self, db: Host, applier: Applier | None, tag: str, budget: float) -> None:
        self._db = db
        self._applier = applier
        self._tag = tag_of(tag)
        self._budget = budget
        self._lock = threading.Lock()
        self._queue: list[Request] = []
        self._leading = False
        self._board: Board | None = None
        self._spec = _Timespec(0, 0)
        self._kicked = -1
        self._to_wake: list[int] = []

    def board(self) -> Board | None:
        """The board of the gate file, when group commit across processes can work:
        an applier (this process can apply others' items) and a mapped gate file."""
        if self._board is None and self._applier is not None and self._db._gate.mapping:
            self._board = Board(self._db._gate)
        return self._board

    def close(self) -> None:
        if self._board is not None:
            self._board.release_slot()

    def hand_off(self) -> None:
        """The gate held by a write that serves nobody (a ``with db.write()`` block):
        before its release, kick one posted waiter, so that it does not nap."""
        board = self._board
        if board is not None:
            nxt = board.posted()
            if nxt >= 0:
                self._kick(nxt)

    def woken(self) -> None:
        """After the release that followed ``hand_off``."""
        self._wake()

    # -- this process's threads ---------------------------------------------------------------

    def submit(self, item: Item, started: float) -> object:
        req = Request(item, started + self._budget)
        with self._lock:
            self._queue.append(req)
            lead = not self._leading
            if lead:
                self._leading = True
            else:
                req.event = threading.Event()
        if not lead:
            assert req.event is not None
            req.event.wait()
            lead = not req.done  # woken without an outcome: lead now
        if lead:
            self._lead(started)
        return req.outcome()

    def _lead(self, started: float) -> None:
        with self._lock:
            batch, self._queue = self._queue, []
        try:
            self._run(batch, started)
        except Exception as exc:
            if all(r.done for r in batch):
                # Every outcome was known (committed, or failed alone) when this came:
                # handing results back, waking, releasing.  It changes none of them.
                self._db._background_error("group commit hand-back", exc)
            else:
                for r in batch:
                    if not r.done:
                        r.fail(exc)
                raise
        except BaseException as exc:
            for r in batch:
                if not r.done:
                    r.fail(exc)
            raise
        finally:
            for r in batch:
                if not r.done:
                    r.fail(errors.DatabaseError(f"{self._db.path}: a write was left unresolved"))
                if r.event is not None:
                    r.event.set()
            with self._lock:
                if self._queue:
                    nxt = self._queue[0].event
                    assert nxt is not None
                    nxt.set()  # it has no outcome yet: it leads
                else:
                    self._leading = False

    # -- across processes -----------------------------------------------------------------------

    def _run(self, reqs: list[Request], started: float) -> None:
        gate = self._db._gate
        for i, r in enumerate(reqs):
            r.index = i
        if gate.try_acquire():
            return self._serve(reqs, None, started)
        board = self.board()
        if board is None or board.slot < 0 or board.states[board.slot] not in (FREE, DONE, RETRY):
            return self._classic(reqs, started)
        payloads = [r.item.payload() for r in reqs]
        if any(p is None for p in payloads):
            return self._classic(reqs, started)
        request = encode_request(
            [(r.deadline, p) for r, p in zip(reqs, payloads, strict=True) if p]
        )
        if len(request) > _CAP:
            return self._classic(reqs, started)
        ticket = board.post(request, len(reqs), self._tag)
        if gate.try_acquire():
            return self._serve(reqs, ticket, started)
        self._wait(reqs, ticket, started)

    def _classic(self, reqs: list[Request], started: float) -> None:
        """Wait for the gate itself (its doorbell), as every write did before."""
        deadline = max(r.deadline for r in reqs)
        try:
            self._db._acquire_gate(started, deadline)
        except errors.StoreBusy as busy:
            for r in reqs:
                r.fail(busy)
            return
        self._serve(reqs, None, started)

    def _wait(self, reqs: list[Request], ticket: int, started: float) -> None:
        board = self._board
        assert board is not None
        me = board.slot
        pending = reqs
        first = True  # _run has just tried the gate
        while True:
            seen = board.bell.value  # before the state: a ring after it ends the wait
            state = board.states[me]
            if state == DONE:
                board.barrier()
                self._take_results(pending, ticket)
                rest = [r for r in pending if not r.done]
                return self._classic(rest, started) if rest else None
            if state == RETRY:
                for r in pending:
                    r.unknown = True
                return self._again(pending)
            if not first and self._db._gate.try_acquire():
                return self._serve(pending, ticket, started)
            first = False
            if state == TAKEN:
                nap = _MAX_NAP
            else:
                now = time.monotonic()  # the clock first, then the state (module doc)
                if board.states[me] & 1:
                    for r in pending:
                        if r.deadline <= now:
                            r.fail(self._busy(started, "posted, never taken"))
                    pending = [r for r in pending if not r.done]
                    if not pending:
                        return  # the slot stays posted; the next holder expires it
                nap = min(min(r.deadline for r in pending) - now, _MAX_NAP)
            futex_wait_bits(board.bell_addr, seen, board.bit(me), max(nap, 0.0002), self._spec)

    def _again(self, reqs: list[Request]) -> None:
        """Apply items whose first holder died or failed its COMMIT: they may be in the
        file already; applied again, they are found there.  With a fresh budget, so
        that the caller learns the outcome rather than a StoreBusy that may be false."""
        now = time.monotonic()
        for r in reqs:
            r.deadline = max(r.deadline, now + self._budget)
        self._classic(reqs, now)

    def _take_results(self, reqs: list[Request], ticket: int) -> None:
        board = self._board
        assert board is not None
        got, data = board.results()
        if got != ticket:
            for r in reqs:
                r.unknown = True
            return
        outcomes = decode_results(data)
        for r in reqs:
            if r.done:
                continue
            kind, body = outcomes[r.index]
            if kind == _OK:
                r.succeed(r.item.result(body))
                self._db._handed_over()
            elif kind == _ERROR:
                r.fail(errors.from_wire(json.loads(body)))
            elif kind == _EXPIRED:
                r.fail(self._busy(time.monotonic() - self._budget, "posted past its deadline"))
            else:
                r.unknown = True

    def _busy(self, started: float, why: str) -> errors.StoreBusy:
        busy = errors.StoreBusy(self._db.path, time.monotonic() - started, 1, stage="gate")
        busy.add_note(f"group commit: {why}; not applied")
        return busy

    # -- the gate held ----------------------------------------------------------------------------

    def _serve(self, own: list[Request], ticket: int | None, started: float) -> None:
        gate = self._db._gate
        board = self.board()
        held = True
        try:
            if board is not None:
                if board.slot < 0:
                    board.claim()
                elif ticket is not None:
                    state = board.states[board.slot]
                    if state == DONE:
                        board.barrier()
                        self._take_results(own, ticket)
                    elif state in (TAKEN, RETRY):
                        for r in own:  # our holder died or failed: apply them again
                            r.unknown = True
                if board.slot >= 0 and board.states[board.slot] not in (FREE, DONE, RETRY):
                    board.states[board.slot] = FREE  # withdraw our post (or a stale one)
            own = [r for r in own if not r.done]
            rounds, since = 0, time.monotonic()
            while True:
                self._round(own, started)
                own = []
                rounds += 1
                if board is None:
                    break
                nxt = board.posted()
                more = rounds < _MAX_ROUNDS and time.monotonic() - since < _MAX_HOLD
                if nxt >= 0 and more and self._ours(nxt):
                    continue
                if nxt >= 0:
                    self._kick(nxt)
                break
            held = False
            gate.release()
            self._wake()
            if board is not None and board.posted() >= 0 and gate.try_acquire():
                # Posted after our last look, by a process whose own try found us still
                # holding the gate: serve it now rather than let it nap.
                held = True
                nxt = board.posted()
                if nxt >= 0 and self._ours(nxt):
                    self._round([], time.monotonic())
                nxt = board.posted()
                if nxt >= 0:
                    self._kick(nxt)
        finally:
            if held:
                gate.release()
            self._wake()

    def _ours(self, i: int) -> bool:
        board = self._board
        assert board is not None
        return board.request(i)[1] == self._tag

    def _kick(self, i: int) -> None:
        """Gate held: make waiter *i* take the gate after our release (its state
        changes: it knows it was kicked, not served)."""
        board = self._board
        assert board is not None
        board.states[i] = KICK_B if board.states[i] == KICK_A else KICK_A
        self._kicked = i

    def _wake(self) -> None:
        board = self._board
        if board is None:
            return
        bits = 0
        for i in self._to_wake:
            bits |= board.bit(i)
        self._to_wake.clear()
        if self._kicked >= 0:
            bits |= board.bit(self._kicked)
            self._kicked = -1
        if bits:
            board.ring(bits)

    def _round(self, own: list[Request], started: float) -> None:
        """One transaction: our items and every posted one we may apply."""
        db, board = self._db, self._board
        deadline = max((r.deadline for r in own), default=time.monotonic() + self._budget)
        try:
            tx = db._open_write(started, deadline)
        except errors.FleetstoreError as exc:
            for r in own:
                r.fail(exc)
            return
        acquired = time.monotonic()
        taken: list[tuple[int, list[tuple[float, bytes]]]] = []
        if board is not None and self._applier is not None:
            room = _MAX_BATCH - len(own)
            for i, state in board.active():
                if room <= 0:
                    break
                _ticket, tag, request = board.request(i)
                if tag != self._tag:
                    continue  # another version's: its owner applies it itself (kicked)
                if state != TAKEN:
                    board.states[i] = TAKEN
                items = decode_request(request)
                taken.append((i, items))
                room -= len(items)
            if taken:
                board.full_barrier()
        now = time.monotonic()
        count = len(own) + sum(len(items) for _, items in taken)
        several = count > 1
        results: list[list[tuple[int, bytes]]] = []
        try:
            for r in own:
                try:
                    r.succeed(self._each(tx, several, r.item.run))
                except _Broken:
                    raise
                except Exception as exc:
                    r.fail(exc)
            applier = self._applier
            for _i, items in taken:
                out: list[tuple[int, bytes]] = []
                for item_deadline, payload in items:
                    if item_deadline <= now:
                        out.append((_EXPIRED, b""))
                        continue
                    assert applier is not None
                    try:
                        value = self._each(tx, several, _bound(applier, payload))
                        assert isinstance(value, bytes)
                        out.append((_OK, value))
                    except _Broken:
                        raise
                    except Exception as exc:
                        out.append((_ERROR, json.dumps(errors.to_wire(exc)).encode()))
                results.append(out)
            if taken:
                _crash_point("before-commit")
            if not several and any(r.error is not None for r in own):
                # One item, no savepoint: it failed, so nothing of it may commit.
                db._end_write(tx, commit=False)
                return
            db._end_write(tx, commit=True)
        except BaseException as exc:
            if db._in_transaction():
                db._end_write(tx, commit=False)
            for r in own:
                r.result = _PENDING
                r.error = (
                    exc
                    if isinstance(exc, errors.FleetstoreError)
                    else errors.DatabaseError(f"{db.path}: the transaction failed: {exc}")
                )
            if board is not None:
                for i, _items in taken:
                    board.states[i] = RETRY
                    self._to_wake.append(i)
            if not isinstance(exc, Exception | _Broken):
                raise
            return
        if taken:
            _crash_point("after-commit")
        assert board is not None or not taken
        for (i, _items), out in zip(taken, results, strict=True):
            assert board is not None
            try:
                handed = board.put_results(i, encode_results(out))
            except Exception as exc:  # committed all the same: its owner applies it again
                db._background_error("group commit hand-back", exc)
                handed = False
            if handed:
                board.barrier()
                board.states[i] = DONE
            else:
                board.states[i] = RETRY  # results too large for the slot: apply it yourself
            self._to_wake.append(i)
        if taken:
            _crash_point("after-results")
        db._committed(started, acquired, count, count - len(own))

    def _each(self, tx: Tx, several: bool, fn: Callable[[Tx], object]) -> object:
        """``fn(tx)`` alone in a savepoint when the transaction carries several items:
        an item that raises is rolled back alone (the others commit)."""
        if not several:
            return fn(tx)
        tx.execute("SAVEPOINT fleetstore_item")
        try:
            value = fn(tx)
        except Exception:
            try:
                tx.execute("ROLLBACK TO fleetstore_item")
                tx.execute("RELEASE fleetstore_item")
            except Exception as exc:
                raise _Broken(str(exc)) from exc
            if not self._db._in_transaction():
                raise _Broken("the transaction was rolled back") from None
            raise
        tx.execute("RELEASE fleetstore_item")
        return value


__all__ = [
    "CRASH_ENV",
    "Board",
    "Combiner",
    "Request",
    "decode_request",
    "decode_results",
    "encode_request",
    "encode_results",
    "tag_of",
]
