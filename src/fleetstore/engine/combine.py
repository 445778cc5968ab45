"""Group commit by *combining in the gate*: the process that holds the writer gate also
applies the writes that waiting processes posted on the board (engine/board.py),
commits them all at once, hands each its result and wakes each waiter.  No extra
process; a lone writer takes the gate at once and pays a glance at the slot states.
(docs/design.md, "Group commit": why this design and not a per-host writer, and what
each measured.)

* submit: the threads of one process combine first (one leader carries their items;
  each follower waits no longer than its own deadline); then ``LOCK_NB`` on the gate.
  Got it: serve.  Else post the items (only items that may run in another process:
  ``Item.payload()`` is not None), try the gate once more, and sleep on the bell word
  with the slot's bit (FUTEX_WAIT_BITSET; at most 50 ms a nap, then the gate is tried).
* serve (gate held): deal with our own slot (results, or an orphan: board.py);
  ``BEGIN IMMEDIATE`` (waiting out outside locks, as every write does; at the
  durability the most demanding item asks for); take every posted slot of our tag;
  apply our items, then theirs, each in a savepoint unless the transaction carries
  just one item of our own (an item that raises is rolled back alone and its error
  handed back); publish DECIDING, read the clock, leave out every item past its
  deadline, write the decisions, COMMITTING; COMMIT; write the results; DONE; after the
  gate's release, one FUTEX_WAKE_BITSET for every waiter served.  Nobody hears of its
  item before the COMMIT that holds it.  More rounds while items are posted, within
  ``_MAX_ROUNDS`` and ``_MAX_HOLD``; past them, or for slots of another tag or of more
  durability, one waiter is *kicked* and takes over.
* a waiter's deadline (board.py, "the deadline rule"): past it, an item posted or
  ``TAKEN`` is never applied and its caller gets ``StoreBusy`` at once; during the
  decide-and-commit window it waits ``_GRACE`` more, then ``CommitUncertain``.
* a full disk: the round is rolled back, the slots it took are posted again, and every
  item waits for space within its deadline, then raises ``StorageFull``.
* a COMMIT whose outcome is unknown (its WAL sync failed) hands RETRY back: each owner
  applies its items again (idempotent: found if they are there).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from fleetstore import errors
from fleetstore.core import liveness
from fleetstore.core.crash import crash_point
from fleetstore.engine import board as bd
from fleetstore.engine import cipher
from fleetstore.engine.base import Applier, Item, Tx
from fleetstore.engine.board import Board, Taken
from fleetstore.engine.gate import (
    BARRIER_AT,
    BELL_AT,
    GATE_FILE_BYTES,
    WriterGate,
    _Timespec,
    futex_wait_bits,
    futex_wake,
    futex_wake_bits,
)

#: A waiter tries the gate itself at least this often (a holder killed never wakes it).
_MAX_NAP = 0.05
#: How long past its deadline a waiter whose item is being committed waits for the
#: outcome before it reports it unknown (a COMMIT takes milliseconds, an fsync under
#: FULL tens of them; a holder stopped there may take for ever).
GRACE = 0.25
#: A holder serves at most this many rounds, for at most this long, past its own items.
_MAX_ROUNDS = 3
_MAX_HOLD = 0.005
#: Most items applied in one transaction.
_MAX_BATCH = 256
#: A write that met a full disk tries again after this long, doubling up to the cap.
_FULL_PAUSE, _FULL_PAUSE_MAX = 0.005, 0.25
_WEAK_ORDER = platform.machine() not in ("x86_64", "AMD64", "i686")

_instances = 0
_instances_lock = threading.Lock()

_PENDING = object()
#: What an operation itself raises (its arguments, its rows); anything else is the
#: transaction's (the lock, the disk, a closed store, a bug).
_ITEM_ERRORS = (
    errors.InvalidInput,
    errors.NotFound,
    errors.AlreadyExists,
    errors.VersionConflict,
    errors.LeaseLost,
    errors.IntegrityError,
    errors.BlobCorrupt,
)


class Request:
    """One ``submit`` call: an item, its deadline, and (once known) its outcome."""

    __slots__ = ("deadline", "error", "event", "full", "index", "item", "lead", "result", "unknown")

    def __init__(self, item: Item, deadline: float) -> None:
        self.item = item
        self.deadline = deadline
        self.result: object = _PENDING
        self.error: BaseException | None = None
        #: Set for a thread that waits for this process's leader (None: the leader's own).
        self.event: threading.Event | None = None
        #: Asked by the leader before it to lead the next batch.
        self.lead = False
        self.index = 0
        #: Handed to a holder that died after deciding, or whose COMMIT failed syncing:
        #: it may be in the file; applied again (idempotent) it is found there.  Such a
        #: request that cannot be applied again in time fails ``CommitUncertain``.
        self.unknown = False
        #: The disk was full when it was last tried: tried again within its deadline.
        self.full: errors.StorageFull | None = None

    @property
    def done(self) -> bool:
        return self.error is not None or self.result is not _PENDING

    def succeed(self, value: object) -> None:
        self.result = value

    def fail(self, exc: BaseException) -> None:
        if self.unknown and not isinstance(exc, (*_ITEM_ERRORS, errors.CommitUncertain)):
            # An earlier attempt may have committed it: "not written" would be false.
            # (An error of the operation itself is definite: applied again, one that had
            # been written is found there, and raises nothing.)
            uncertain = errors.CommitUncertain(
                f"the write may be in the file or not: an earlier attempt's outcome is "
                f"unknown, and trying again failed: {exc}"
            )
            uncertain.__cause__ = exc
            exc = uncertain
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

    def _open_write(self, started: float, deadline: float, level: int = -1) -> Tx:
        """BEGIN IMMEDIATE within *deadline*, the gate held (``StoreBusy`` past it), at
        durability *level* (-1: the connection's own)."""
        ...

    def _end_write(self, tx: Tx, commit: bool) -> None:
        """COMMIT (or roll back) the transaction of ``_open_write``."""
        ...

    def _in_transaction(self) -> bool: ...

    def _committed(self, started: float, acquired: float, items: int, served: int) -> None: ...

    def _after_commit(self, wait: float, hold: float, items: int = 0, served: int = 0) -> None: ...

    def _handed_over(self) -> None: ...

    def _count(self, name: str) -> None: ...

    def _background_error(self, what: str, exc: BaseException) -> None:
        """Log and count a failure that changes no write's outcome."""
        ...


def _bound(applier: Applier, payload: bytes) -> Callable[[Tx], object]:
    return lambda tx: applier(tx, payload)


class _Broken(Exception):
    """The transaction itself is lost (a savepoint could not be rolled back)."""


class _Full(Exception):
    """The disk is full: the whole round is rolled back and tried again later."""

    def __init__(self, error: errors.StorageFull) -> None:
        super().__init__(str(error))
        self.error = error


class _Waiting:
    """A leader's post on the board, while it waits."""

    __slots__ = ("count", "pending", "started", "ticket", "tried")

    def __init__(self, pending: list[Request], ticket: int, started: float) -> None:
        self.pending = pending
        self.count = len(pending)  # items posted (a request's index is its place)
        self.ticket = ticket
        self.started = started
        self.tried = True  # _post has just tried the gate


class Combiner:
    """Group commit for one ``Database`` in one process (see the module doc)."""

    #: The board's class (the model test's records every write it makes).
    board_class: type[Board] = Board

    def __init__(
        self, db: Host, applier: Applier | None, tag: str, budget: float, level: int = 1
    ) -> None:
        self._db = db
        self._applier = applier
        self._tag = bd.tag_of(tag)
        self._budget = budget
        #: This process's durability (synchronous: 0 OFF .. 3 EXTRA): posted with its
        #: items, so that a holder commits them at least that durably (cause 5).
        self._level = level
        self._lock = threading.Lock()
        self._queue: list[Request] = []
        self._leading = False
        self._board: Board | None = None
        self._spec = _Timespec(0, 0)
        self._kicked = -1
        self._to_wake: list[int] = []
        self.clock: Callable[[], float] = time.monotonic
        #: Whether the owner word of a slot names a live process (the model's own).
        self.alive: Callable[[int], bool] = bd.owner_alive

    def board(self) -> Board | None:
        """The board of the gate file, when group commit across processes can work:
        an applier (this process can apply others' items) and a mapped gate file."""
        if self._board is None and self._applier is not None:
            gate = self._db._gate
            mm = gate.mapping
            if mm is None or len(mm) < GATE_FILE_BYTES:
                return None
            global _instances
            with _instances_lock:
                _instances += 1
                owner = bd.owner_word(os.getpid(), liveness.start_time(os.getpid()), _instances)
            self._barrier_word = ctypes.c_uint32.from_buffer(mm, BARRIER_AT)
            self._barrier_addr = ctypes.c_void_p(ctypes.addressof(self._barrier_word))
            #: Every waiter sleeps on this one word, with its slot's bit (slot mod 32),
            #: so a holder wakes all it served with one FUTEX_WAKE_BITSET: a wake per
            #: waiter cost ~0.4 ms of the waker's time at 16 agents.
            self.bell = ctypes.c_uint32.from_buffer(mm, BELL_AT)
            self.bell_addr = ctypes.c_void_p(ctypes.addressof(self.bell))
            self._rung = int.from_bytes(os.urandom(4), "little")
            board = self.board_class(mm, owner, gate.allocate, self._full_barrier)
            board.weak_order = _WEAK_ORDER
            key = getattr(self._db, "_key", None)
            board.aead = None if key is None else cipher.board_cipher(key)
            self._board = board
            gate.board = self
        return self._board

    def detach(self) -> None:
        """Drop the views of the mapping (the gate unmaps it)."""
        if self._board is not None:
            self._board.detach()
            del self._barrier_word, self.bell
            self._board = None

    def _full_barrier(self) -> None:
        # The kernel's wake path is a full barrier: store-load order on x86, and every
        # order on weakly ordered CPUs.
        futex_wake(self._barrier_addr, 1)

    def _ring(self, bits: int) -> None:
        # A value of our own, not an increment of the shared one (see gate._ring).
        self._rung = (self._rung + 1) & 0xFFFFFFFF
        self.bell.value = self._rung
        futex_wake_bits(self.bell_addr, bits)

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
        with self._lock:
            alone = not self._leading
            if alone:
                self._leading = True
        if alone:
            # Nobody of this process queued: the straight path, if the gate is free and
            # nothing is posted (issue 24: group commit's round machinery cost a lone
            # writer about 115 Python calls a write, for nothing).
            try:
                value = self._alone(item, started)
            except BaseException:
                self._lead_next()
                raise
            if value is not _PENDING:
                with self._lock:
                    if self._queue:
                        nxt = self._queue[0]
                        nxt.lead = True
                        self._resolve(nxt)
                    else:
                        self._leading = False
                return value
        req = Request(item, started + self._budget)
        with self._lock:
            self._queue.append(req)
            lead = alone
            if not lead:
                req.event = threading.Event()
        if not lead and not self._follow(req):
            return req.outcome()
        self._lead(started)
        return req.outcome()

    def _lead_next(self) -> None:
        """This thread led; the next queued thread leads now (or nobody does)."""
        with self._lock:
            if self._queue:
                nxt = self._queue[0]
                nxt.lead = True
                self._resolve(nxt)
            else:
                self._leading = False

    def _alone(self, item: Item, started: float) -> object:
        """*item* written in place, when the gate is free and the board quiet: one
        transaction, nothing of the round's machinery.  ``_PENDING`` when it must go
        the way of a batch instead (the gate taken, a slot posted, a full disk, a
        COMMIT whose outcome is unknown): nothing of it is then written."""
        db = self._db
        gate = db._gate
        board = self._board
        if board is None or board.slot < 0 or not gate.try_acquire():
            return _PENDING
        if not board.quiet():
            gate.release()
            return _PENDING
        try:
            tx = db._open_write(started, started + self._budget)
        except errors.StorageFull:
            gate.release()
            return _PENDING
        except BaseException:
            gate.release()
            raise
        acquired = self.clock()
        try:
            value = item.run(tx)
        except errors.StorageFull:
            db._end_write(tx, commit=False)
            gate.release()
            return _PENDING
        except BaseException:
            db._end_write(tx, commit=False)
            gate.release()
            raise
        try:
            db._end_write(tx, commit=True)
        except (errors.StorageFull, errors.CommitUncertain) as exc:
            gate.release()
            if isinstance(exc, errors.CommitUncertain):
                if item.payload() is None:
                    raise  # not safe to apply again: the caller decides
                db._count("ambiguous_commits")
            return _PENDING  # applied again as a batch: found, or written
        except BaseException:
            gate.release()
            raise
        gate.release()
        if board.posted() >= 0:
            self._late_posts()
        db._after_commit(acquired - started, self.clock() - acquired, 1, 0)
        return value

    def _late_posts(self) -> None:
        """Someone posted while we held the gate (its own try found it taken): serve
        it now rather than let it nap."""
        board = self._board
        assert board is not None
        if self._db._gate.try_acquire():
            try:
                nxt = board.posted()
                if nxt >= 0 and board.tag(nxt) == self._tag:
                    self._round([], self.clock())
                nxt = board.posted()
                if nxt >= 0:
                    self._kick(nxt)
            finally:
                self._db._gate.release()
                self._wake()

    def _follow(self, req: Request) -> bool:
        """Wait for the leader to carry *req*, no longer than its deadline; True if it
        is to lead the next batch itself."""
        event = req.event
        assert event is not None
        while True:
            if event.wait(max(req.deadline + GRACE - self.clock(), 0.0)):
                return not req.done
            with self._lock:
                if req.done:
                    return False
                if req.lead:
                    return True
                if req in self._queue:
                    # No leader has taken it: nothing of it is written.
                    self._queue.remove(req)
                    req.fail(self._busy(req.deadline - self._budget, "queued in this process"))
                    return False
                # A leader carries it, past its deadline: what became of it is unknown.
                req.fail(
                    errors.CommitUncertain(
                        f"{self._db.path}: the write's outcome is not known within its budget: "
                        "this process's thread that carries it has not finished"
                    )
                )
                return False

    def _resolve(self, req: Request) -> None:
        """Wake the thread of *req*, now that its outcome is known."""
        if req.event is not None:
            req.event.set()

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
                with self._lock:
                    for r in batch:
                        if not r.done:
                            r.fail(exc)
                raise
        except BaseException as exc:
            with self._lock:
                for r in batch:
                    if not r.done:
                        r.fail(exc)
            raise
        finally:
            with self._lock:
                for r in batch:
                    if not r.done:
                        r.fail(
                            errors.DatabaseError(f"{self._db.path}: a write was left unresolved")
                        )
                    self._resolve(r)
                if self._queue:
                    nxt = self._queue[0]
                    nxt.lead = True
                    self._resolve(nxt)  # it has no outcome yet: it leads
                else:
                    self._leading = False

    # -- across processes -----------------------------------------------------------------------

    def _run(self, reqs: list[Request], started: float) -> None:
        pending = reqs
        pause, tries = _FULL_PAUSE, 0
        while True:
            self._attempt(pending, started)
            pending = [r for r in pending if not r.done]
            if not pending:
                return
            # Left to try again: the disk was full (wait for space), or an attempt's
            # outcome is unknown (apply again: found if it is there); within each deadline.
            now = self.clock()
            for r in pending:
                if r.full is None and not r.unknown:
                    r.fail(errors.DatabaseError(f"{self._db.path}: a write was left unresolved"))
                elif r.deadline <= now:
                    r.fail(
                        r.full
                        or errors.CommitUncertain(
                            f"{self._db.path}: the write may be in the file or not: its "
                            f"COMMIT's outcome stayed unknown for {now - started:.2f}s, the "
                            "whole write budget (an idempotent write may be repeated)"
                        )
                    )
                if r.done:
                    self._resolve(r)
            pending = [r for r in pending if not r.done]
            if not pending:
                return
            if tries or any(r.full is not None for r in pending):
                time.sleep(min(pause, max(min(r.deadline for r in pending) - now, 0.0)))
                pause = min(pause * 2, _FULL_PAUSE_MAX)
            tries += 1
            for r in pending:
                r.full = None

    def _attempt(self, reqs: list[Request], started: float) -> None:
        reqs = [r for r in reqs if not r.done]  # (a follower may have given up)
        if not reqs:
            return
        gate = self._db._gate
        if gate.try_acquire():
            return self._serve(reqs, None, started)
        waiting = self._post(reqs, started)
        if waiting is None:
            return self._classic(reqs, started)
        if gate.try_acquire():
            return self._serve(reqs, waiting, started)
        self._wait(waiting)

    def _post(self, reqs: list[Request], started: float) -> _Waiting | None:
        """Post *reqs* on our slot (None: they cannot be posted; wait for the gate)."""
        board = self.board()
        if board is None or not board.can_post() or len(reqs) > bd.MAX_ITEMS:
            return None
        for i, r in enumerate(reqs):
            r.index = i
        payloads = [r.item.payload() for r in reqs]
        if any(p is None for p in payloads):
            return None
        request = bd.encode_request(
            [(r.deadline, p) for r, p in zip(reqs, payloads, strict=True) if p is not None]
        )
        if len(request) + bd.SEAL_BYTES > bd.REQUEST_CAP:
            return None
        ticket = board.post(request, len(reqs), self._tag, self._level)
        return _Waiting(list(reqs), ticket, started)

    def _classic(self, reqs: list[Request], started: float) -> None:
        """Wait for the gate itself (its doorbell), as every write did before, each
        request no longer than its own deadline."""
        pending = [r for r in reqs if not r.done]
        while pending:
            deadline = min(r.deadline for r in pending)
            try:
                self._db._acquire_gate(started, deadline)
            except errors.StoreBusy as busy:
                now = self.clock()
                for r in pending:
                    if r.deadline <= now:
                        r.fail(busy)
                        self._resolve(r)
                pending = [r for r in pending if not r.done]
                continue
            return self._serve(pending, None, started)

    def _wait(self, w: _Waiting) -> None:
        board = self._board
        assert board is not None
        bit = 1 << (board.slot & 31)
        while True:
            seen = self.bell.value  # before the state: a ring after it ends the wait
            nap = self._wait_step(w)
            if nap is None:
                return
            futex_wait_bits(self.bell_addr, seen, bit, nap, self._spec)

    def _wait_step(self, w: _Waiting) -> float | None:
        """One look at our slot while waiting: None once every request of *w* is
        resolved (or handed on), else how long to nap."""
        board = self._board
        assert board is not None
        now = self.clock()  # the clock first, then the state (the deadline rule)
        board.full_barrier_if_weak()
        state = board.state(board.slot)
        if state == bd.DONE:
            board.full_barrier_if_weak()
            rest = self._take_results(w)
            if rest:
                self._classic(rest, w.started)
            return None
        if state == bd.RETRY:
            for r in w.pending:
                r.unknown = True
            self._classic(w.pending, w.started)
            return None
        if state == bd.BAD:
            # Quarantined by a holder that could not decode it: never applied.
            self._classic(w.pending, w.started)
            return None
        if not w.tried and self._db._gate.try_acquire():
            self._serve(w.pending, w, w.started)
            return None
        w.tried = False
        if state & 1 or state == bd.TAKEN:
            for r in w.pending:
                if r.deadline <= now:
                    # Past its deadline, posted or taken: no holder will apply it.
                    if board.note(board.slot) == bd.NOTE_FULL:
                        r.fail(self._full(w.started))
                    else:
                        r.fail(self._busy(w.started, "posted, not applied in time"))
                    self._resolve(r)
            until = [r.deadline for r in w.pending if not r.done]
        else:  # DECIDING, COMMITTING: its COMMIT is under way
            for r in w.pending:
                if r.deadline + GRACE <= now:
                    r.fail(
                        errors.CommitUncertain(
                            f"{self._db.path}: the write's outcome is not known within its "
                            "budget: the process committing it (the gate holder) has not "
                            "finished"
                        )
                    )
                    self._resolve(r)
            until = [r.deadline + GRACE for r in w.pending if not r.done]
        w.pending = [r for r in w.pending if not r.done]
        if not w.pending:
            return None  # the slot stays posted or taken: the next holder deals with it
        return max(min(min(until) - now, _MAX_NAP), 0.0002)

    def _take_results(self, w: _Waiting) -> list[Request]:
        """Resolve *w*'s requests from our slot's results; those left to apply again."""
        board = self._board
        assert board is not None
        reqs = w.pending
        outcomes = board.results(w.ticket, w.count)
        if outcomes is None:
            # Not the results of this post: the post was taken by a holder that died
            # and its orphan resolved by another, or the slot was damaged.  Applied
            # again, what is in the file is found there.
            for r in reqs:
                r.unknown = True
            return reqs
        for r in reqs:
            kind, body = outcomes[r.index]
            if kind == bd.OK:
                r.succeed(r.item.result(body))
                self._db._handed_over()
            elif kind == bd.ERROR:
                r.fail(errors.from_wire(json.loads(body)))
            elif board.note(board.slot) == bd.NOTE_FULL:
                r.fail(self._full(r.deadline - self._budget))
            else:
                r.fail(self._busy(r.deadline - self._budget, "posted, not applied in time"))
            self._resolve(r)
        return []

    def _busy(self, started: float, why: str) -> errors.StoreBusy:
        busy = errors.StoreBusy(self._db.path, self.clock() - started, 1, stage="gate")
        busy.add_note(f"group commit: {why}; not applied")
        return busy

    def _full(self, started: float) -> errors.StorageFull:
        return errors.StorageFull(
            f"{self._db.path}: the disk stayed full for {self.clock() - started:.2f}s, the "
            "whole write budget; nothing was written"
        )

    # -- the gate held ----------------------------------------------------------------------------

    def _serve(self, own: list[Request], waiting: _Waiting | None, started: float) -> None:
        gate = self._db._gate
        board = self.board()
        held = True
        try:
            if board is not None:
                if board.slot < 0 and board.claim(self.alive):
                    self._db._gate.sleeper = board.slot
                elif waiting is not None:
                    self._reclaim(board, waiting)
                board.withdraw()
            own = [r for r in own if not r.done]
            rounds, since = 0, self.clock()
            while True:
                self._round(own, started)
                own = []
                rounds += 1
                if board is None:
                    break
                nxt = board.posted()
                more = rounds < _MAX_ROUNDS and self.clock() - since < _MAX_HOLD
                if nxt >= 0 and more and board.tag(nxt) == self._tag:
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
                if nxt >= 0 and board.tag(nxt) == self._tag:
                    self._round([], self.clock())
                nxt = board.posted()
                if nxt >= 0:
                    self._kick(nxt)
        finally:
            if held:
                gate.release()
            self._wake()

    def _reclaim(self, board: Board, w: _Waiting) -> None:
        """Gate held, our post still on our slot: what became of it (its requests left
        unresolved are applied in our own round)."""
        state = board.state(board.slot)
        own = w.pending
        if state == bd.DONE:
            board.full_barrier_if_weak()
            self._take_results(w)
        elif state == bd.RETRY:
            for r in own:
                r.unknown = True
        elif state == bd.COMMITTING:
            # Its holder died after deciding: what it left out is not in the file; what
            # it kept may be.
            kept = board.decisions(board.slot, w.ticket, w.count)
            for r in own:
                if kept is None or kept[r.index]:
                    r.unknown = True
                else:
                    r.fail(self._busy(r.deadline - self._budget, "left out, past its deadline"))
                    self._resolve(r)
        # Posted, TAKEN, DECIDING, quarantined: nothing of it was committed.

    def _kick(self, i: int) -> None:
        """Gate held: make waiter *i* take the gate after our release."""
        board = self._board
        assert board is not None
        board.kick(i)
        self._kicked = i

    def _wake(self) -> None:
        board = self._board
        if board is None:
            return
        bits = 0
        for i in self._to_wake:
            bits |= 1 << (i & 31)
        self._to_wake.clear()
        if self._kicked >= 0:
            bits |= 1 << (self._kicked & 31)
            self._kicked = -1
        if bits:
            self._ring(bits)

    def _round(self, own: list[Request], started: float) -> None:
        """One transaction: our items and every posted one we may apply."""
        db, board = self._db, self._board
        level = self._level
        if board is not None and self._applier is not None:
            level = max(level, board.max_level(self._tag))
        while True:
            deadline = min((r.deadline for r in own), default=self.clock() + self._budget)
            try:
                tx = db._open_write(started, deadline, level if level != self._level else -1)
                break
            except errors.StorageFull as exc:
                for r in own:
                    r.full = exc
                return
            except errors.FleetstoreError as exc:
                now = self.clock()
                for r in own:
                    if r.deadline <= now or not isinstance(exc, errors.StoreBusy):
                        r.fail(exc)
                        self._resolve(r)
                own = [r for r in own if not r.done]
                if not own:
                    return
        acquired = self.clock()
        taken: list[Taken] = []
        results: list[list[tuple[int, bytes]]] = []
        count, ended = len(own), False
        try:
            # Everything after BEGIN is inside this try: a failure anywhere ends the
            # transaction (cause 4: an unguarded decode of the board left the holder
            # inside BEGIN IMMEDIATE, holding SQLite's lock, and the fleet with it).
            if board is not None and self._applier is not None:
                taken, woken = board.take(self._tag, level, _MAX_BATCH - len(own))
                self._to_wake.extend(woken)
                if taken:
                    board.full_barrier()
            count += sum(len(t.items) for t in taken)
            # A savepoint per item unless the transaction is one item of our own: an
            # item that raises must leave nothing (cause 1: a lone item taken from
            # another process ran without one, and its half committed).
            savepoints = count > 1 or bool(taken)
            for r in own:
                try:
                    r.succeed(self._each(tx, savepoints, r.item.run))
                except (_Broken, _Full):
                    raise
                except errors.StorageFull as exc:
                    raise _Full(exc) from exc
                except Exception as exc:
                    r.fail(exc)
            if taken:
                results = self._apply_taken(tx, taken)
                crash_point("before-commit")
            ended = True
            if not savepoints and any(r.error is not None for r in own):
                # One item, no savepoint: it failed, so nothing of it may commit.
                db._end_write(tx, commit=False)
                self._resolve_all(own)
                return
            db._end_write(tx, commit=True)
        except BaseException as exc:
            if not ended:
                db._end_write(tx, commit=False)
            self._round_failed(own, taken, exc)
            if not isinstance(exc, Exception):
                raise
            return
        if taken:
            crash_point("after-commit")
        self._resolve_all(own)
        assert board is not None or not taken
        for t, out in zip(taken, results, strict=True):
            assert board is not None
            try:
                if board.put_results(t, out):
                    crash_point("mid-results")
                    board.mark_done(t)
                else:  # too large for the slot: its owner applies it again (found there)
                    board.set_state(t.slot, bd.RETRY)
            except Exception as exc:  # committed all the same: its owner applies it again
                db._background_error("group commit hand-back", exc)
                board.set_state(t.slot, bd.RETRY)
            self._to_wake.append(t.slot)
        if taken:
            crash_point("after-results")
        db._committed(started, acquired, count, count - len(own))

    def _apply_taken(self, tx: Tx, taken: list[Taken]) -> list[list[tuple[int, bytes]]]:
        """Apply the items taken from other processes, then decide (the deadline rule):
        returns each slot's results, the decisions written and every slot COMMITTING."""
        board = self._board
        assert board is not None and self._applier is not None
        tx.execute("SAVEPOINT fleetstore_taken")
        results = self._apply_items(tx, taken, self.clock())
        board.deciding(taken)
        board.full_barrier()
        now = self.clock()
        late = any(
            kind != bd.EXPIRED and deadline <= now
            for t, out in zip(taken, results, strict=True)
            for (deadline, _p), (kind, _b) in zip(t.items, out, strict=True)
        )
        if late:
            # An item's deadline passed while the batch was applied (a holder stopped,
            # or preempted): its owner may already have reported it not written.  Apply
            # again without it; the decisions follow this clock reading.
            tx.execute("ROLLBACK TO fleetstore_taken")
            results = self._apply_items(tx, taken, now)
        tx.execute("RELEASE fleetstore_taken")
        for t, out in zip(taken, results, strict=True):
            board.decide(t, [kind != bd.EXPIRED for kind, _b in out])
        board.full_barrier_if_weak()
        return results

    def _apply_items(self, tx: Tx, taken: list[Taken], now: float) -> list[list[tuple[int, bytes]]]:
        applier = self._applier
        assert applier is not None
        results = []
        for t in taken:
            out: list[tuple[int, bytes]] = []
            for deadline, payload in t.items:
                if deadline <= now:
                    out.append((bd.EXPIRED, b""))
                    continue
                try:
                    value = self._each(tx, True, _bound(applier, payload))
                    assert isinstance(value, bytes)
                    out.append((bd.OK, value))
                except (_Broken, _Full):
                    raise
                except errors.StorageFull as exc:
                    raise _Full(exc) from exc
                except Exception as exc:
                    out.append((bd.ERROR, json.dumps(errors.to_wire(exc)).encode()))
            results.append(out)
        return results

    def _round_failed(self, own: list[Request], taken: list[Taken], exc: BaseException) -> None:
        """The round's transaction was rolled back (or its COMMIT's outcome is unknown):
        what each of its items learns."""
        board = self._board
        for r in own:
            r.result = _PENDING
            r.error = None
        full = exc.error if isinstance(exc, _Full) else exc
        if isinstance(full, errors.StorageFull):
            for r in own:
                r.full = full  # not written: tried again, within its deadline
            for t in taken:
                assert board is not None
                board.untake(t, bd.NOTE_FULL)
                self._to_wake.append(t.slot)
            return
        uncertain = isinstance(exc, errors.CommitUncertain)
        error = (
            exc
            if isinstance(exc, errors.FleetstoreError)
            else errors.DatabaseError(f"{self._db.path}: the transaction failed: {exc}")
        )
        if uncertain:
            self._db._count("ambiguous_commits")
        for r in own:
            if uncertain and r.item.payload() is not None:
                # May run again: applied once more by _run, found if its COMMIT got there.
                r.unknown = True
            else:
                r.fail(error)
                self._resolve(r)
        for t in taken:
            assert board is not None
            if uncertain:
                board.set_state(t.slot, bd.RETRY)
            else:
                # Rolled back: nothing of it is in the file; each item gets the error.
                wire = json.dumps(errors.to_wire(error)).encode()
                if board.put_results(t, [(bd.ERROR, wire)] * len(t.items)):
                    board.mark_done(t)
                else:
                    board.untake(t)
            self._to_wake.append(t.slot)

    def _resolve_all(self, reqs: Sequence[Request]) -> None:
        for r in reqs:
            if r.done:
                self._resolve(r)

    def _each(self, tx: Tx, savepoint: bool, fn: Callable[[Tx], object]) -> object:
        """``fn(tx)``, alone in a savepoint when the transaction carries anything else:
        an item that raises is rolled back alone (the others commit)."""
        if not savepoint:
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


__all__ = ["GRACE", "Combiner", "Request"]
