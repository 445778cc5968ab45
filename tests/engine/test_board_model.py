"""The group-commit board protocol (engine/board.py, engine/combine.py), explored in
memory by hypothesis: four simulated processes in this one process, each a real
``Database`` on one file (separate gate descriptors, so their ``flock``s exclude each
other; separate mappings of one gate file, so their boards are shared memory), a clock
of the test's own, and a board whose every write the test can intercept.  A holder can
be killed, or stopped while others look at their slots and time passes, between any
two of its writes to the board; slots can be damaged; processes die and new ones come.

What must hold whatever the schedule (issue 23, causes 1-4):

* a caller told its item was written finds it written; told it failed (its own
  error, ``StoreBusy``, ``StorageFull``), never finds it, even after every holder has
  finished; ``CommitUncertain`` may be either; nothing is written twice;
* an item that raises leaves nothing, alone or in a batch;
* a waiter's deadline is honoured: once the clock is past it (and the grace during a
  COMMIT), one look at its slot resolves every request it waits for;
* no process is left inside a transaction or holding the gate between steps, and after
  any damage to the board every live process can still write;
* a slot is quarantined only where the board was damaged.

The real processes, with real SIGKILL and SIGSTOP, are tests/engine/test_group_commit.py.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetstore import errors
from fleetstore.engine import board as bd
from fleetstore.engine.combine import GRACE, Combiner, Request, _Waiting
from fleetstore.engine.sqlite import Database
from tests.agents.combine_agent import SCHEMA, TAG, KeyItem, applier

BUDGET = 2.0
PROCESSES = 4


class Killed(BaseException):
    """This simulated process was killed here (not an Exception: nothing handles it)."""


class Violation(BaseException):
    """A promise broken, found while a holder is stopped: a BaseException, so that the
    holder's own error handling (which it runs through) cannot swallow it."""


class Clock:
    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


class Fuse:
    """What happens at a holder's nth write to the board from now: a kill, or a stop
    during which *stopped* runs."""

    def __init__(self, kind: str, after: int, stopped: Callable[[], None]) -> None:
        self.kind, self.left, self.stopped = kind, after, stopped

    def burn(self) -> None:
        self.left -= 1
        if self.left == 0:
            if self.kind == "kill":
                raise Killed()
            self.stopped()


class ModelBoard(bd.Board):
    """A board whose writes the model sees: dropped once its process is dead."""

    sim: Sim

    def set_state(self, i: int, state: int) -> None:
        if self._write():
            super().set_state(i, state)

    def _store(self, at: int, data: bytes) -> None:
        if self._write():
            super()._store(at, data)

    def _write(self) -> bool:
        sim = self.sim
        if sim.dead:
            return False
        if sim.fuse is not None:
            fuse = sim.fuse
            try:
                fuse.burn()
            except Killed:
                sim.dead = True
                raise
        return True


@dataclass
class Sim:
    """One simulated process."""

    n: int
    db: Database
    dead: bool = False
    fuse: Fuse | None = None
    waiting: _Waiting | None = None
    #: The next COMMIT of this process fails: "uncertain" (it committed, then its sync
    #: failed: CommitUncertain) or "failed" (rolled back: StorageError).
    commit_fault: str | None = None
    posted: list[Request] = field(default_factory=list)

    @property
    def combiner(self) -> Combiner:
        return self.db._combiner


@dataclass
class Asked:
    key: str
    req: Request
    sim: Sim


@dataclass
class Model:
    path: Path
    clock: Clock = field(default_factory=Clock)
    sims: list[Sim] = field(default_factory=list)
    asked: list[Asked] = field(default_factory=list)
    keys: itertools.count[int] = field(default_factory=itertools.count)
    damaged: bool = False
    instances: dict[int, Sim] = field(default_factory=dict)

    def start(self, n: int) -> Sim:
        db = Database.open(self.path, migrations=SCHEMA, write_budget=BUDGET)
        db.serve(TAG, applier)
        sim = Sim(n, db)
        combiner = db._combiner
        combiner.board_class = type("B", (ModelBoard,), {"sim": sim})
        combiner.clock = self.clock
        combiner.alive = self.alive
        db._acquire_gate = self._acquirer(sim)  # type: ignore[method-assign]
        db._end_write = self._ender(sim, db._end_write)  # type: ignore[method-assign]
        board = combiner.board()
        assert board is not None
        self.instances[board.owner] = sim
        return sim

    def alive(self, owner: int) -> bool:
        sim = self.instances.get(owner)
        return sim is not None and not sim.dead

    def _acquirer(self, sim: Sim) -> Callable[[float, float], None]:
        """A wait for the gate, in one thread: take it if it is free; else the holder
        is stopped in this thread, and the wait lasts the whole budget."""

        def acquire(started: float, deadline: float) -> None:
            if sim.db._gate.try_acquire():
                return
            self.clock.now = max(self.clock.now, deadline)
            raise errors.StoreBusy(str(self.path), deadline - started, 1)

        return acquire

    @staticmethod
    def _ender(sim: Sim, end: Callable[[Any, bool], None]) -> Callable[[Any, bool], None]:
        def end_write(tx: Any, commit: bool) -> None:
            fault, sim.commit_fault = sim.commit_fault, None
            if not commit or fault is None:
                return end(tx, commit)
            if fault == "uncertain":
                end(tx, True)
                raise errors.CommitUncertain("injected: COMMIT's WAL sync failed")
            end(tx, False)
            raise errors.StorageError("injected: COMMIT's WAL write failed")

        return end_write

    def item(self, sim: Sim, kind: str) -> tuple[str, Request]:
        key = f"{kind}{next(self.keys)}-p{sim.n}"
        req = Request(KeyItem(key, sim.n), self.clock.now + BUDGET)
        self.asked.append(Asked(key, req, sim))
        return key, req

    # -- steps ------------------------------------------------------------------------------

    def serve(
        self, sim: Sim, kinds: list[str], fuse: tuple[str, int] | None, fault: str | None = None
    ) -> None:
        """*sim* takes the gate (if free) and commits its own items and the board's."""
        if sim.dead or sim.waiting is not None:
            return
        sim.commit_fault = fault
        reqs = [self.item(sim, k)[1] for k in kinds]
        # _run, as submit's leader runs it: the gate is free between steps, so it serves
        # (and tries again what a failed COMMIT left unknown).
        self._guarded(sim, fuse, lambda: sim.combiner._run(reqs, self.clock.now))

    def post(self, sim: Sim, kinds: list[str]) -> None:
        if sim.dead or sim.waiting is not None:
            return
        board = sim.combiner.board()
        assert board is not None
        if not board.can_post():
            return
        reqs = [self.item(sim, k)[1] for k in kinds]
        sim.waiting = sim.combiner._post(reqs, self.clock.now)
        assert sim.waiting is not None
        sim.posted = reqs

    def look(
        self,
        sim: Sim,
        fuse: tuple[str, int] | None = None,
        fault: str | None = None,
        holder: Sim | None = None,
    ) -> None:
        """One look of a waiter at its slot (it may take the gate and serve)."""
        w = sim.waiting
        if sim.dead or w is None:
            return
        sim.commit_fault = fault
        board = sim.combiner.board()
        assert board is not None
        state = board.state(board.slot)
        open_before = [r for r in w.pending if not r.done]

        def step() -> None:
            if sim.combiner._wait_step(w) is None:
                sim.waiting = None
                # What _run does after its wait: apply again what is left unknown.
                left = [r for r in sim.posted if not r.done]
                if left:
                    sim.combiner._run(left, w.started)

        self._guarded(sim, fuse, step)
        if holder is not None and (state & 1 or state == bd.TAKEN):
            # Posted or taken by a holder that is stopped: the deadline rule gives a
            # definite answer (not written), never "unknown".
            for r in open_before:
                assert not isinstance(r.error, errors.CommitUncertain), (state, r.error)

    def _guarded(self, sim: Sim, fuse: tuple[str, int] | None, fn: Callable[[], None]) -> None:
        if fuse is not None:
            sim.fuse = Fuse(fuse[0], fuse[1], lambda: self.stopped(sim))
        try:
            fn()
        except Killed:
            self.kill(sim)
        finally:
            sim.fuse = None
            sim.commit_fault = None

    def stopped(self, holder: Sim) -> None:
        """*holder* is stopped mid-batch: time passes, every waiter looks, and one look
        past a deadline (and the grace) resolves what it waits for, whatever the state
        the stopped holder left its slot in."""
        holder.fuse = None
        self.clock.now += BUDGET + GRACE + 0.1
        try:
            for sim in self.sims:
                if sim is not holder:
                    self.look(sim, holder=holder)
            for a in self.asked:
                if a.sim is not holder and not a.sim.dead:
                    assert a.req.done or a.req.deadline + GRACE > self.clock.now, (
                        f"{a.key} still waits past its budget while the holder is stopped"
                    )
        except AssertionError as exc:
            raise Violation(str(exc)) from exc

    def kill(self, sim: Sim) -> None:
        sim.dead = True
        sim.waiting = None
        sim.db.close()  # its descriptor closed (the flock goes), its connections too

    def tick(self, seconds: float) -> None:
        self.clock.now += seconds

    def damage(self, slot: int, what: str, data: bytes) -> None:
        """Damage a slot in use, as a bug or a process of another build would."""
        live = next((s for s in self.sims if not s.dead), None)
        if live is None:
            return
        board = live.combiner.board()
        assert board is not None
        if slot < 0:  # the slot of process -slot - 1
            owner = self.sims[-slot - 1]
            if owner.dead:
                return
            own = owner.combiner.board()
            assert own is not None
            slot = own.slot
        if board.state(slot) not in (bd.POSTED, bd.KICK_A, bd.KICK_B):
            return
        at = bd.BOARD_OFFSET + slot * bd.SLOT_BYTES
        if what == "header":
            at += 16
        elif what == "request":
            at += bd.REQUEST_AT
        else:
            at += bd.RESULTS_AT
        board._mm[at : at + len(data)] = data
        self.damaged = True

    # -- what must hold ---------------------------------------------------------------------

    def check_between_steps(self) -> None:
        for sim in self.sims:
            if sim.dead:
                continue
            assert not sim.db._in_transaction(), f"p{sim.n} left inside a transaction"
            gate = sim.db._gate
            assert gate.try_acquire(), f"the gate is held after p{sim.n}'s step"
            gate.release()

    def settle(self) -> None:
        """Past every deadline and grace: one look resolves every waiter."""
        self.clock.now += BUDGET + GRACE + 1
        for sim in self.sims:
            self.look(sim)
        for sim in self.sims:
            assert sim.dead or sim.waiting is None, f"p{sim.n} still waits past its budget"
        for a in self.asked:
            if not a.sim.dead:
                assert a.req.done, f"{a.key} unresolved past its budget"
        # Every live process can still write (nothing wedged).
        for sim in self.sims:
            if not sim.dead:
                key, req = self.item(sim, "after")
                assert sim.db._gate.try_acquire()
                sim.combiner._serve([req], None, self.clock.now)
                assert req.done and req.error is None, (key, req.error)

    def check_outcomes(self) -> None:
        conn = apsw.Connection(str(self.path), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            stored = [k for (k,) in conn.execute("SELECT k FROM t")]
        finally:
            conn.close()
        assert len(stored) == len(set(stored))
        written = set(stored)
        for a in self.asked:
            if a.key.startswith(("bad", "half")):
                assert a.key not in written, f"{a.key} raised, yet it is stored"
            if a.sim.dead and not a.req.done:
                continue  # its caller died: either outcome is fine
            if a.req.error is None and a.req.done:
                assert a.key in written, f"{a.key}: told it was written, not found"
            elif isinstance(a.req.error, errors.CommitUncertain):
                pass
            elif a.req.done:
                assert a.key not in written, f"{a.key}: told {a.req.error!r}, yet written"
        quarantined = max(
            (s.combiner.board().quarantined() for s in self.sims if not s.dead),  # type: ignore[union-attr]
            default=0,
        )
        if not self.damaged:
            assert quarantined == 0, "a slot quarantined without any damage"

    def close(self) -> None:
        for sim in self.sims:
            if not sim.dead:
                sim.db.close()


KINDS = st.sampled_from(["k", "k", "k", "bad", "half"])
FUSE = st.one_of(
    st.none(),
    st.tuples(st.just("stop"), st.integers(min_value=1, max_value=3)),
    st.tuples(st.just("stop"), st.integers(min_value=1, max_value=24)),
    st.tuples(st.just("kill"), st.integers(min_value=1, max_value=24)),
)
PROC = st.integers(min_value=0, max_value=PROCESSES - 1)
#: Most schedules: some processes post, then one takes the gate (maybe killed or
#: stopped at some write), then everyone looks.
BATCH = st.tuples(
    st.just("batch"),
    PROC,
    st.lists(st.tuples(PROC, st.lists(KINDS, min_size=1, max_size=3)), min_size=1, max_size=3),
    st.lists(KINDS, max_size=2),
    FUSE,
    st.sampled_from([None, None, None, None, "uncertain", "failed"]),
    st.one_of(
        st.none(),
        st.none(),
        st.tuples(PROC, st.sampled_from(["header", "request"]), st.binary(min_size=1, max_size=8)),
    ),
)
STEP = st.one_of(
    BATCH,
    BATCH,
    BATCH,
    st.tuples(st.just("serve"), PROC, st.lists(KINDS, max_size=2), FUSE),
    st.tuples(st.just("post"), PROC, st.lists(KINDS, min_size=1, max_size=3)),
    st.tuples(st.just("post"), PROC, st.lists(KINDS, min_size=1, max_size=3)),
    st.tuples(st.just("look"), PROC, FUSE),
    st.tuples(st.just("tick"), st.sampled_from([0.01, 0.5, BUDGET, BUDGET + GRACE + 0.05])),
    st.tuples(st.just("kill"), PROC),
    st.tuples(st.just("restart"), PROC),
    st.tuples(
        st.just("damage"),
        st.integers(min_value=0, max_value=PROCESSES + 2),
        st.sampled_from(["header", "request", "results"]),
        st.binary(min_size=1, max_size=8),
    ),
)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(steps=st.lists(STEP, min_size=5, max_size=40))
def test_the_board_keeps_its_promises_under_any_schedule(
    tmp_path_factory: Any, steps: list[tuple[Any, ...]]
) -> None:
    path = tmp_path_factory.mktemp("board") / "m.db"
    model = Model(path)
    try:
        for n in range(PROCESSES):
            sim = model.start(n)
            model.sims.append(sim)
            model.serve(sim, ["k"], None)  # each owns a slot, as a process that wrote has
        for step in steps:
            kind = step[0]
            if kind == "batch":
                for n in {step[1], *(p for p, _ in step[2])}:
                    if model.sims[n].dead:  # a process that died is started again
                        model.sims[n] = model.start(n)
                        model.serve(model.sims[n], [], None)
                for poster, kinds in step[2]:
                    model.post(model.sims[poster], list(kinds))
                if step[6] is not None:
                    model.damage(-step[6][0] - 1, step[6][1], step[6][2])
                holder = model.sims[step[1]]
                if holder.waiting is not None:  # it posted: its look takes the gate
                    model.look(holder, step[4], step[5])
                else:
                    model.serve(holder, list(step[3]), step[4], step[5])
                for sim in model.sims:
                    model.look(sim)
            elif kind == "serve":
                model.serve(model.sims[step[1]], list(step[2]), step[3])
            elif kind == "post":
                model.post(model.sims[step[1]], list(step[2]))
            elif kind == "look":
                model.look(model.sims[step[1]], step[2])
            elif kind == "tick":
                model.tick(step[1])
            elif kind == "kill":
                sim = model.sims[step[1]]
                if not sim.dead:
                    model.kill(sim)
            elif kind == "restart":
                sim = model.sims[step[1]]
                if sim.dead:
                    model.sims[step[1]] = model.start(step[1])
                    model.serve(model.sims[step[1]], [], None)
            else:
                model.damage(step[1], step[2], step[3])
            model.check_between_steps()
        model.settle()
        model.check_between_steps()
        model.check_outcomes()
    finally:
        model.close()
