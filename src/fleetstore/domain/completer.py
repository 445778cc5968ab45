"""What a worker (domain/worker.py) does with each effect besides claiming it: runs its
handler in a thread kept for the next one (``HandlerThreads``), waits for it within its
timeout (``done_within``), and settles it in a batch with others that finished about
then (``Completer``); and the worker's wake-up (``Wake``).

A settlement was a transaction of its own, a logged operation through the gate, per
effect: with the claim's, two commits and a dozen thread hops an effect, 1.3-1.7 ms of
a worker's CPU in benchmarks/bench_outbox.py, and a worker that settled about 800
effects a second.  The completer takes the outcomes of the effects that finish while
one flush is under way, or within ``delay`` of the first (while other handlers still
run), up to ``batch`` of them, and settles them as ONE ``settle_effects`` operation:
one transaction, logged once in ``applied_ops``, each settlement checked against its
own fencing token (one whose lease is lost is refused alone, ``LeaseLost``, the others
land).  It must land like a single settlement: past the write budget it is spooled
(even with ``on_busy="raise"``), and the worker keeps the leases alive until it has
landed.  (River's completer does the same for PostgreSQL: up to thousands a flush.)

A flush also claims the next effect of each thread its settlements hand on, for this
worker, in the same transaction (settle-and-claim: ``Worker._chain``, ``Chain``); the
claims come back with the flush.  A busy lane's settlement (a claim made so, the worker
with nothing else waiting to start) does not wait ``delay`` for others: its lane's next
effect waits for it.  (Two flushes under way at once for such a lane, the second
waiting for the lock beside the first, measured no better in fleetstore stress.)
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from fleetstore.domain.outbox import Chain, Claim, Effects
from fleetstore.models import Effect

#: A settlement's outcome as the completer hands it back: the effect's new state
#: (truthy), or None when the batch went to the spool.
Landed = str | None


class Completer:
    """Settlements batched (see the module doc).  ``add`` queues one and returns the
    future of its outcome; ``run`` (a task of the worker's loop) flushes them; ``close``
    flushes what is left and ends ``run``."""

    def __init__(
        self,
        effects: Effects,
        call: Callable[..., Awaitable[Any]],
        batch: int,
        delay: float,
        busy: Callable[[], bool],
        waiting: Callable[[], bool] = lambda: False,
        chain: Callable[[], Chain | None] = lambda: None,
        chained: Callable[[Chain], None] = lambda chain: None,
    ) -> None:
        self._effects = effects
        self._call = call
        self._batch = batch
        self._delay = delay
        #: Whether handlers still run (then more outcomes may come within ``delay``).
        self._busy = busy
        #: Whether claimed effects wait for a slot (then a flush's lingering delays none).
        self._waiting = waiting
        #: Settle-and-claim: the worker's claim for a flush (None: no room), and where
        #: the flush hands it back, its claims made (before the settlements' futures
        #: resolve: a stopping worker waits for its jobs, and sees those too).
        self._chain = chain
        self._chained = chained
        self._queue: list[tuple[Claim, dict[str, Any], asyncio.Future[Landed]]] = []
        self._kick = asyncio.Event()
        self._closing = False
        #: Figures: flushes made, and settlements they carried.
        self.flushes = 0
        self.settled = 0

    def add(self, claim: Claim, item: dict[str, Any]) -> asyncio.Future[Landed]:
        """Queue *claim*'s settlement *item* (``Claim._success`` and its siblings)."""
        future: asyncio.Future[Landed] = asyncio.get_running_loop().create_future()
        # Retrieved here too: a waiter cancelled meanwhile (a hard stop) must not leave
        # "exception never retrieved" behind.
        future.add_done_callback(_retrieved)
        claim.outcome = item["outcome"]  # settled: heartbeats that find it lost ignore it
        self._queue.append((claim, item, future))
        if len(self._queue) == 1 or len(self._queue) >= self._batch:
            self._kick.set()
        return future

    async def run(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            if not self._queue:
                if self._closing:
                    return
                continue
            if (
                len(self._queue) < self._batch
                and self._delay > 0
                and not self._closing
                and self._busy()
                and (self._waiting() or not any(c.chained for c, _i, _f in self._queue))
            ):
                # Others still run: let those finishing about now join this flush.  Not
                # when a lane is busy (a claim its predecessor's settlement made) and the
                # worker has nothing else to start: the lane's next effect likely waits
                # for this settlement to claim it.
                await asyncio.sleep(self._delay)
            taken, self._queue = self._queue[: self._batch], self._queue[self._batch :]
            await self._flush(taken)
            if self._queue or self._closing:
                self._kick.set()

    async def _flush(
        self, taken: list[tuple[Claim, dict[str, Any], asyncio.Future[Landed]]]
    ) -> None:
        claims = [c for c, _i, _f in taken]
        items = [i for _c, i, _f in taken]
        chain = self._chain()
        try:
            outcomes = await self._call(self._effects._settle_batch, claims, items, chain)
        except Exception as exc:
            # Neither written nor spooled (a full disk): each claim's lease runs out
            # and a sweep hands the effect on.
            if chain is not None:
                self._chained(chain)
            for _c, _i, future in taken:
                if not future.done():
                    future.set_exception(exc)
            return
        if chain is not None:
            self._chained(chain)
        self.flushes += 1
        self.settled += len(taken)
        for k, (_c, _i, future) in enumerate(taken):
            if future.done():
                continue
            outcome = None if outcomes is None else outcomes[k]
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    async def close(self) -> None:
        """Flush everything queued, then return (``run`` ends)."""
        self._closing = True
        self._kick.set()


class Wake:
    """``asyncio.Event`` with a timeout of its own: the loop's own thread sets it (or
    ``call_soon_threadsafe``); ``asyncio.wait_for`` made a task per wait, and the claim
    loop waits once per effect or so."""

    __slots__ = ("_loop", "_set", "_waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._set = False
        self._waiters: list[asyncio.Future[None]] = []

    def set(self) -> None:
        self._set = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self, seconds: float) -> None:
        """Until set (now or later) or *seconds* pass."""
        if self._set:
            return
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append(waiter)
        timer = self._loop.call_later(max(seconds, 0.0), _resolve_none, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            if waiter in self._waiters:
                self._waiters.remove(waiter)


def _resolve_none(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def done_within(inner: asyncio.Future[Any], seconds: float | None) -> bool:
    """Wait for *inner* to be done, at most *seconds* (None: no limit); whether it is
    (``asyncio.wait`` with one future, without its tasks and sets)."""
    if inner.done():
        return True
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    inner.add_done_callback(wake)
    timer = None if seconds is None else waiter.get_loop().call_later(seconds, wake)
    try:
        await waiter
    finally:
        if timer is not None:
            timer.cancel()
        inner.remove_done_callback(wake)
    return inner.done()


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class HandlerThreads:
    """Plain handlers run in daemon threads that are kept for the next handler (a
    thread started per effect cost about 0.1 ms of CPU an effect).  Daemon threads,
    not a pool's: after a hard stop a handler that does not return must not keep the
    process from exiting (a pool's threads are joined at exit), nor hold a slot a
    later effect waits for; a thread whose handler hangs is simply never handed
    another one.  tests/domain/test_outbox_fleet.py::test_sigterm_twice_*"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = 0
        self._closed = False
        self._tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        #: Outcomes not yet handed to the loop, and whether a hand-over is on its way:
        #: handlers that end together wake the loop once (each wake-up is a write to
        #: the loop's pipe and a pass of its select).
        self._done: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        self._handing = False

    def run(
        self, loop: asyncio.AbstractEventLoop, fn: Callable[[Effect], Any], effect: Effect
    ) -> asyncio.Future[Any]:
        """``fn(effect)`` in a handler thread; its outcome as a future of *loop*."""
        future: asyncio.Future[Any] = loop.create_future()
        task = (loop, fn, effect, future)
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._tasks.put(task)
                return future
        threading.Thread(
            target=self._serve, args=(task,), name="fleetstore-handler", daemon=True
        ).start()
        return future

    def _serve(self, task: Any) -> None:
        while task is not None:
            loop, fn, effect, future = task
            task = None
            value: Any = None
            exc: BaseException | None = None
            try:
                value = fn(effect)
            except BaseException as error:
                exc = error
            with self._lock:
                self._done.append((future, value, exc))
                handing, self._handing = self._handing, True
            if not handing:
                with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                    loop.call_soon_threadsafe(self._hand_over)
            del loop, fn, effect, future, value, exc
            with self._lock:
                if self._closed:
                    return
                self._idle += 1
            task = self._tasks.get()

    def _hand_over(self) -> None:
        """In the loop: the outcomes of the handlers that ended since the last time."""
        with self._lock:
            done, self._done = self._done, []
            self._handing = False
        for future, value, exc in done:
            _resolve(future, value, exc)

    def close(self) -> None:
        """End the idle threads (a busy one ends when its handler returns)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._tasks.put(None)


def _resolve(future: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)


__all__ = ["Completer", "HandlerThreads", "Landed", "Wake", "done_within"]
