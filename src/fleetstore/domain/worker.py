"""The worker: claims effects, keeps their leases alive, runs their handlers.

``Worker(store, handlers).run()`` claims ready effects of the kinds it has
handlers for, runs each handler (a plain function in a thread, or a coroutine
function on the worker's event loop), heartbeats every lease at a third of its
length, and settles the outcome: the return value -> ``succeeded``;
``RetryEffect`` or any other exception -> ``pending`` again after a backoff
(``dead`` once attempts are spent); ``FailEffect`` -> ``dead``.

Failures are seen: each failed attempt is logged once, after its settlement, through
the ``fleetstore.worker`` logger, with what the store made of it (``next``: retry at
a time, or dead) and the effect's fields in ``extra`` (``effect_id``, ``kind``,
``thread_key``, ``attempt``...); an unexpected exception's record carries its
traceback.  The traceback is also kept with the attempt in the effect's ``errors``
(``EffectError.traceback``, its last 8 KiB), and ``stats["dead"]`` counts the effects
this worker's settlements and sweeps left dead (``--until-idle`` exits 5 on it).
tests/domain/test_outbox_fleet.py::test_a_failing_handler_*

Handler timeouts: an attempt may run ``handler_timeout`` seconds (per kind:
``Handler(timeout=...)``; 10 minutes by default).  Past it the worker stops
waiting for it, settles the attempt as timed out (``Claim.timed_out``: retried by
the usual policy if the kind is replay-safe, else ``dead``), which raises the
fencing token, so nothing the abandoned attempt settles later lands.  Python
cannot stop a thread: the handler's thread runs on (a coroutine is cancelled) and
keeps its slot until it returns, when its outcome is offered to the store and
refused (``LeaseLost``).  So at most ``concurrency`` handler threads exist, hung or
not; a worker whose every slot is held by a hung handler stops and ``run`` returns
``EXIT_HUNG``: only a new process frees them.
tests/domain/test_outbox_fleet.py::test_a_hung_handler_*

Claims and settlements: an idle worker sleeps until a ring of ``fleetstore_effects``
(an effect became claimable in any process: engine/notify.py), the next effect's
``available_at``, or ``poll_interval`` (the fallback); it claims up to ``batch`` ready
heads in one transaction, and settles finished effects in batches
(domain/completer.py).  A batch of settlements also claims, in its own transaction, the
next effect of each thread it hands on, as far as the worker has room
(settle-and-claim, ``_chain``): a busy lane's next effect starts when its
predecessor's settlement commits, without a claim of its own waiting for the write
lock (docs/outbox.md, "A busy lane").

Shutdown: the first SIGINT/SIGTERM (or ``stop()``) stops claiming, gives
claimed-but-not-started effects back without spending an attempt and lets the
running ones finish within ``grace`` seconds; a second signal (or the grace
running out) stops hard: the effects still running are settled as interrupted
(replay-safe ones go back to ``pending``, the others to ``dead``) and ``run``
returns ``EXIT_HARD``.  Settlements are never cancelled: they run in their own
threads, shielded, and one that meets a locked store lands through the spool
while the worker keeps its lease alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import os
import random
import signal
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fleetstore import errors
from fleetstore.core import telemetry
from fleetstore.core.logs import logger
from fleetstore.core.validate import (
    MAX_WAIT,
    check_bool,
    check_int,
    check_number,
    check_str,
)
from fleetstore.domain.completer import Completer, HandlerThreads, Landed, Wake, done_within
from fleetstore.domain.effect_trace import carried_trace, lost_fields
from fleetstore.domain.failures import Failed, handler_traceback, log_failure
from fleetstore.domain.handlers import (
    DEFAULT_HANDLER_TIMEOUT,
    FailEffect,
    Handler,
    Policy,
    RetryEffect,
    handler_of,
    lower,
    setting,
    timeout_setting,
)
from fleetstore.domain.outbox import (
    DEFAULT_LEASE,
    MAX_ATTEMPTS_LIMIT,
    MAX_CLAIM,
    MAX_KIND,
    MAX_LEASE,
    Chain,
    Claim,
    Effects,
)
from fleetstore.domain.outbox_ops import CHANNEL, kinds_json, timeouts_json
from fleetstore.domain.ports import StorePort
from fleetstore.models import Effect, EffectState

log = logger("fleetstore.worker")

#: ``run()``'s result: stopped after its running effects finished (or idle).
EXIT_OK = 0
#: ``run()``'s result: stopped hard, effects were interrupted.
EXIT_HARD = 3
#: ``run()``'s result: every handler slot was held by a handler that ran past its
#: timeout and had not returned (a thread cannot be stopped): restart the process.
EXIT_HUNG = 4


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident() % 100000}"


class _Job:
    __slots__ = ("buried", "claim", "interrupted", "ran", "since", "started", "task")

    def __init__(self, claim: Claim) -> None:
        self.claim = claim
        self.started = False
        #: When its handler started (monotonic).
        self.since = 0.0
        #: Its handler returned (or was given up on): its slot is free, its settlement
        #: on its way (the job stays until it has landed, its lease kept alive).
        self.ran = False
        self.interrupted = False
        #: A sweep buried the effect while it ran (its lease ran out): no more
        #: heartbeats, but its outcome may still land (``settle_effect``).
        self.buried = False
        self.task: asyncio.Task[None] | None = None


class _Abandoned:
    """A handler the worker stopped waiting for (timed out, or its claim was lost)
    that has not returned: it keeps its slot until it does."""

    __slots__ = ("claim", "since")

    def __init__(self, claim: Claim) -> None:
        self.claim = claim
        self.since = time.monotonic()


#: The idle worker's fallback look, on a store that rings (``store.notifies``) and one
#: that cannot (no futex): a ring wakes it at once, so the look only covers writers
#: that do not ring (SQL of your own, an older fleetstore).
POLL_RINGING = 1.0
POLL_SILENT = 0.1
#: Most effects claimed in one transaction, and most settlements in one.
DEFAULT_BATCH = 64
#: How long a finished effect waits for others to settle with it (while handlers run).
DEFAULT_SETTLE_DELAY = 0.002
#: Effects are claimed ahead of a free slot as long as the slots would start them within
#: about this long (``Worker._ahead``).
AHEAD = 0.005


def _in_context(context: contextvars.Context, fn: Callable[[Effect], Any], effect: Effect) -> Any:
    return context.run(fn, effect)


class Worker:
    """Runs effect handlers for *store*.  *handlers*: ``{kind: fn or Handler}``;
    a function receives the ``Effect`` (with ``attempt`` and ``idempotency_key``)
    and returns a JSON-serialisable result (or None)."""

    def __init__(
        self,
        store: StorePort,
        handlers: Mapping[str, Callable[[Effect], Any] | Handler],
        *,
        concurrency: int = 4,
        lease: float = DEFAULT_LEASE,
        grace: float = 30.0,
        poll_interval: float | None = None,
        sweep_interval: float | None = None,
        prefetch: int = 0,
        batch: int = DEFAULT_BATCH,
        settle_delay: float = DEFAULT_SETTLE_DELAY,
        backoff: float = 1.0,
        max_backoff: float = 300.0,
        max_attempts: int | None = None,
        owner: str | None = None,
        until_idle: bool = False,
        handler_timeout: float | None = DEFAULT_HANDLER_TIMEOUT,
    ) -> None:
        if not all(hasattr(store, a) for a in ("submit", "read", "queries", "notifies")):
            raise errors.ConfigError(f"store must be an open Store, not {store!r:.80}")
        if not isinstance(handlers, Mapping):
            raise errors.ConfigError(
                f"handlers must be a dict of kind -> function, not {handlers!r:.80}"
            )
        if not handlers:
            raise errors.ConfigError("a worker needs at least one handler")
        for kind in handlers:
            setting(check_str, kind, "a handler's kind", limit=MAX_KIND, empty=False)
        setting(check_int, concurrency, "concurrency", minimum=1, maximum=MAX_CLAIM)
        setting(check_int, prefetch, "prefetch", minimum=0, maximum=MAX_CLAIM - concurrency)
        setting(check_number, lease, "lease", minimum=0.001, maximum=MAX_LEASE)
        setting(check_int, batch, "batch", minimum=1, maximum=MAX_CLAIM)
        setting(check_number, settle_delay, "settle_delay", minimum=0.0, maximum=1.0)
        for name, value in (
            ("grace", grace),
            ("poll_interval", POLL_SILENT if poll_interval is None else poll_interval),
            ("backoff", backoff),
            ("max_backoff", max_backoff),
            ("sweep_interval", 0.0 if sweep_interval is None else sweep_interval),
        ):
            setting(check_number, value, name, minimum=0.0, maximum=MAX_WAIT)
        if max_attempts is not None:
            setting(check_int, max_attempts, "max_attempts", minimum=1, maximum=MAX_ATTEMPTS_LIMIT)
        if owner is not None:
            setting(check_str, owner, "owner", limit=256, empty=False)
        setting(check_bool, until_idle, "until_idle")
        self.store = store
        self._effects = Effects(store)
        self.handlers = {kind: handler_of(fn, kind) for kind, fn in handlers.items()}
        self.handler_timeout = timeout_setting(handler_timeout, "handler_timeout")
        #: Each kind's timeout, for the kinds that have one.
        self.timeouts: dict[str, float] = {}
        for kind, h in self.handlers.items():
            seconds = self.handler_timeout if h.timeout is None else timeout_setting(h.timeout, "")
            if seconds is not None:
                self.timeouts[kind] = seconds
        # Only kinds given as Handler say anything about replay safety.
        self._declared = {k: h.replay_safe for k, h in handlers.items() if isinstance(h, Handler)}
        self.concurrency = concurrency
        self.lease = float(lease)
        self.grace = float(grace)
        #: Whether rings wake the idle worker (else it polls, jittered).
        self.rings = bool(store.notifies)
        if poll_interval is None:
            poll_interval = POLL_RINGING if self.rings else POLL_SILENT
        self.poll_interval = max(float(poll_interval), 0.001)
        self.batch = batch
        self.settle_delay = float(settle_delay)
        self.sweep_interval = self.lease / 2 if sweep_interval is None else float(sweep_interval)
        self.prefetch = prefetch
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        #: At most this many attempts of any effect (None: each effect's own).
        self.max_attempts = max_attempts
        #: Each kind's retry policy: its Handler's settings, else the worker's.
        self.policies = {
            kind: Policy(
                float(self.backoff if h.backoff is None else h.backoff),
                float(self.max_backoff if h.max_backoff is None else h.max_backoff),
                lower(h.max_attempts, max_attempts),
            )
            for kind, h in self.handlers.items()
        }
        self.owner = owner or default_owner()
        self.until_idle = until_idle
        #: Counts: claimed (chained: of them, those a settlement claimed), succeeded,
        #: retried (failed attempts to run again), failed
        #: (attempts failed for good: FailEffect, a result that cannot be stored),
        #: dead (effects this worker's settlements left dead, whatever the reason),
        #: cancelled, released, lost, interrupted, spooled (settlements that went to
        #: the spool), timed_out (attempts given up on), late (abandoned handlers that
        #: returned).
        self.stats: Counter[str] = Counter()
        self._stop_requested = 0  # 0 running, 1 graceful, 2 hard
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: Wake | None = None
        self._jobs: dict[str, _Job] = {}
        self._queued: deque[_Job] = deque()
        self._settling: dict[str, Claim] = {}
        self._abandoned: set[_Abandoned] = set()
        self._late: set[asyncio.Future[None]] = set()
        self._hung = False
        #: Handlers running now (a slot each; an abandoned one's is in ``_abandoned``).
        self._busy = 0
        #: Rings of ``fleetstore_effects`` heard (the idle wait's token).
        self._rings = 0
        #: The handlers' recent run time, seconds (a moving average; 0: none ran yet).
        self._run_time = 0.0
        self._threads = HandlerThreads()
        self._completer: Completer | None = None
        self._kinds_json = kinds_json(sorted(self.handlers))
        self._timeouts_json = timeouts_json(self.timeouts)
        #: Slots held for the claims a flush's settle-and-claim may bring: the claim loop
        #: leaves them (a look under way may still claim some of them: its claims then
        #: wait in ``_queued`` for a slot, like those claimed ahead).
        self._chaining = 0
        #: Settlements whose claims (settle-and-claim) are not known yet: spooled, or
        #: their read failed; looked for by operation id once the spool has applied them.
        self._unknown_chains: list[str] = []

    # -- control ----------------------------------------------------------------------------

    def stop(self, hard: bool = False) -> None:
        """Stop claiming; *hard*: interrupt what runs.  Thread-safe; a second
        call without *hard* is taken as hard, like a second signal."""
        setting(check_bool, hard, "hard")
        level = 2 if hard or self._stop_requested else 1
        self._stop_requested = max(self._stop_requested, level)
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(wake.set)

    def run(self) -> int:
        """Run until stopped (or idle, with ``until_idle``); ``EXIT_OK`` or ``EXIT_HARD``.

        In the main thread SIGINT and SIGTERM stop the worker (the second one hard)
        for the whole call, the event loop's start and teardown included, and the
        handlers found are put back at the end: a signal there used to fall to
        Python's default handler, ``KeyboardInterrupt``, and ``fleetstore worker``
        under ``timeout -s INT`` (which signals twice: the child and its group)
        printed ``Aborted!`` and exited 1 in 1 run of 3
        (tests/cli/test_worker_signals.py)."""
        with self._signals_stop():
            return asyncio.run(self.run_async())

    @contextlib.contextmanager
    def _signals_stop(self) -> Iterator[None]:
        """SIGINT/SIGTERM -> ``_on_signal`` while the block runs (main thread only),
        then the handlers that were there before."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, lambda signum, _frame: self._on_signal(signum))
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def run_async(self) -> int:
        loop = asyncio.get_running_loop()
        self._loop, self._wake = loop, Wake(loop)
        # Threads for store calls, apart from the handlers': a settlement or
        # heartbeat waiting out a lock must never wait for a handler's thread.
        self._store_pool = ThreadPoolExecutor(
            self.concurrency + self.prefetch + 2, thread_name_prefix="fleetstore-store"
        )
        previous = {int(sig): signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        installed = self._install_signals(loop)
        self._threads = HandlerThreads()
        completer = self._completer = Completer(
            self._effects,
            self._call,
            self.batch,
            self.settle_delay,
            lambda: self._busy > 0,
            lambda: bool(self._queued),
            self._chain,
            self._chained,
        )
        completing = asyncio.create_task(completer.run())
        unlisten: Callable[[], None] = lambda: None  # noqa: E731
        try:
            if self.rings:
                # Before the first look: a ring from here on is heard (engine/notify.py).
                unlisten = await self._call(self.store.listen, CHANNEL, self._ring_heard)
            if self._declared:
                await self._call(self._effects.declare, self._declared)
            beat = asyncio.create_task(self._heartbeats())
            try:
                await self._claim_loop()
                code = await self._drain()
            finally:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat
            await completer.close()
            await completing
            await self._finish_settling()
            if self._late:
                await asyncio.gather(*self._late, return_exceptions=True)
            return EXIT_HUNG if self._hung and code == EXIT_OK else code
        finally:
            unlisten()
            if not completing.done():
                completing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await completing
            self._threads.close()
            for sig in installed:
                # remove_signal_handler sets Python's default (SIGINT: KeyboardInterrupt);
                # put back what was there (run()'s handler, or the caller's).
                loop.remove_signal_handler(sig)
                if previous[sig] is not None:
                    signal.signal(sig, previous[sig])
            self._store_pool.shutdown(wait=True)
            self._loop = self._wake = None
            self._completer = None

    def _ring_heard(self) -> None:
        """A ring of ``fleetstore_effects`` (in the store's listener thread)."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(self._rung)

    def _rung(self) -> None:
        self._rings += 1
        if self._wake is not None:
            self._wake.set()

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> list[int]:
        if threading.current_thread() is not threading.main_thread():
            return []
        installed: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError):
                continue
            installed.append(sig)
        return installed

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self._stop_requested:
            log.warning("%s again: stopping hard", name)
            self.stop(hard=True)
        else:
            log.warning(
                "%s: no new claims; waiting up to %.0fs for %d running effect(s) "
                "(again to stop hard)",
                name,
                self.grace,
                sum(j.started for j in self._jobs.values()),
            )
            self.stop()

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """*fn(*args)* in a store thread; never cancelled half-way (shielded)."""
        loop = asyncio.get_running_loop()
        return await asyncio.shield(loop.run_in_executor(self._store_pool, fn, *args))

    async def _sleep(self, seconds: float) -> None:
        assert self._wake is not None
        await self._wake.wait(seconds)
        self._wake.clear()

    # -- claiming ----------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        kinds = sorted(self.handlers)
        next_sweep = 0.0
        more = False  # the last claim took all it asked for: more may be ready
        while not self._stop_requested:
            if len(self._abandoned) >= self.concurrency:
                self._hung = True
                log.error(
                    "every handler slot (%d) is held by a handler the worker gave up on (past "
                    "its timeout, or its lease lost) that has not returned: stopping; restart "
                    "the process to free them",
                    self.concurrency,
                )
                return
            now = time.monotonic()
            if now >= next_sweep:
                next_sweep = now + self.sweep_interval
                await self._maybe_sweep()
            self._start_queued()
            capacity = self.concurrency + self._ahead()
            free = capacity - len(self._queued) - self._busy - len(self._abandoned) - self._chaining
            if free <= 0 or (self._queued and free * 2 < min(capacity, self.batch)):
                # Full, or claimed effects still wait to start: claim once half of it is
                # free (claims of a few effects each cost a transaction a few effects).
                await self._sleep(self.poll_interval)  # a handler's end wakes it
                continue
            token = self._rings  # before the look: a ring after it ends the wait below
            limit = min(free, self.batch)
            try:
                claims, ready = await self._call(self._look, limit, more)
            except errors.TransientError as exc:
                log.info("claim deferred: %s", exc)
                await self._sleep(self.poll_interval)
                continue
            except errors.FleetstoreError as exc:
                log.error("claim failed: %s", exc)
                await self._sleep(self.poll_interval)
                continue
            for claim in claims:
                job = _Job(claim)
                self._jobs[claim.id] = job
                self._queued.append(job)
            self.stats["claimed"] += len(claims)
            self._start_queued()
            more = len(claims) == limit
            if more:
                continue
            if ready is None:
                # Idle only when nothing of its kinds is left anywhere: a thread
                # whose head runs in another worker still has work to come.
                if self.until_idle and not self._jobs:
                    active = await self._call(self._effects.active, kinds)
                    if not active:
                        return
                wait = self._idle_wait()
            else:
                wait = ready - time.time()
                if wait <= 0:
                    if claims:
                        continue  # more came while it claimed
                    # Another worker took it first: look again soon, not in a tight loop.
                    wait = random.uniform(0.002, 0.01)
            await self._idle(token, min(wait, self.poll_interval, next_sweep - time.monotonic()))

    def _look(self, limit: int, more: bool) -> tuple[list[Claim], float | None]:
        """In a store thread: claim up to *limit* ready effects if there are any (a read
        first, which takes no lock, unless the last claim was full: *more*); then when
        the next one is due (None: none pending; past: claim again now)."""
        effects = self._effects
        if not more:
            ready = effects._next_ready(self._kinds_json)
            if ready is None or ready > time.time():
                return [], ready
        claims = effects._claim(
            self.owner, limit, self.lease, self._kinds_json, self._timeouts_json
        )
        if len(claims) == limit:
            return claims, time.time()
        return claims, effects._next_ready(self._kinds_json)

    async def _idle(self, token: int, seconds: float) -> None:
        """Wait for work, at most *seconds*: a ring since *token* (an effect became
        claimable in some process: engine/notify.py), a handler's end, a stop."""
        if self._rings != token:
            return  # rung while it looked: look again
        await self._sleep(seconds)

    def _idle_wait(self) -> float:
        """The fallback look when nothing is pending: ``poll_interval`` where rings wake
        the worker; else with jitter.  Without it, idle workers fall into step with
        the effects they ran (each looks again right after its last one), so with
        steady arrivals every worker looks just after an arrival and the next effect
        waits most of an interval: bench_outbox measured p50 38 ms at 8 workers and
        20 effects/s with a fixed 100 ms interval, 8-10 ms with jitter.  Between half
        and all of it, so that ``poll_interval`` stays the longest an idle worker waits."""
        if self.rings:
            return self.poll_interval
        return self.poll_interval * random.uniform(0.5, 1.0)

    async def _maybe_sweep(self) -> None:
        try:
            counts = await self._call(self._effects.counts)
            if counts["expired"]:
                swept = await self._call(self._effects.sweep)
                self.stats["dead"] += sum(s.state is EffectState.dead for s in swept)
                if swept:
                    log.warning(
                        "swept %d effect(s) of lost workers: %s",
                        len(swept),
                        ", ".join(f"{s.id} -> {s.state}" for s in swept[:10]),
                    )
        except errors.FleetstoreError as exc:
            log.info("sweep deferred: %s", exc)

    def _start_queued(self) -> None:
        # A handler given up on and still running holds its slot: at most
        # `concurrency` handler threads, hung or not.
        while self._queued and self._busy + len(self._abandoned) < self.concurrency:
            job = self._queued.popleft()
            job.started = True
            job.since = time.monotonic()
            self._busy += 1
            task = job.task = asyncio.create_task(self._run_job(job))
            # (Also when the task is cancelled before it began: a hard stop.)
            task.add_done_callback(functools.partial(self._task_ended, job))

    def _chain(self) -> Chain | None:
        """A flush's settle-and-claim (domain/completer.py): the threads its settlements
        hand on to an effect that can run now have it claimed for this worker in the same
        transaction, as many as it has room for (as a claim would take), so that a busy
        lane's next effect starts without a claim transaction of its own.  None: no room,
        or stopping."""
        if self._stop_requested or self._hung:
            return None
        room = (
            self.concurrency + self._ahead() - len(self._queued) - self._busy - len(self._abandoned)
        )
        if room <= 0:
            return None
        room = min(room, self.batch)
        self._chaining = room
        return Chain(self.owner, room, self.lease, self._kinds_json, self._timeouts_json)

    def _chained(self, chain: Chain) -> None:
        """A flush's settle-and-claim came back: its claims are this worker's jobs."""
        self._chaining = 0
        if chain.unknown and chain.op_id is not None:
            self._unknown_chains.append(chain.op_id)
        if chain.claimed:
            self._adopt(chain.claimed)

    def _adopt(self, claims: list[Claim]) -> None:
        """Claims made for this worker (settle-and-claim) become its jobs: started at
        once if a slot is free; given back (no attempt spent) if it is stopping."""
        self.stats["claimed"] += len(claims)
        self.stats["chained"] += len(claims)
        for claim in claims:
            job = _Job(claim)
            self._jobs[claim.id] = job
            if not self._stop_requested:
                self._queued.append(job)
                continue
            # Queued with the completer now, in the flush that brought it: a completer
            # closing meanwhile flushes it before it ends.
            assert self._completer is not None
            landing = self._completer.add(claim, claim._item("release"))
            release = asyncio.ensure_future(self._given_back(job, landing))
            self._late.add(release)
            release.add_done_callback(self._late.discard)
        self._start_queued()
        if self._wake is not None:
            self._wake.set()

    async def _given_back(self, job: _Job, landing: asyncio.Future[Landed]) -> None:
        try:
            if await landing:
                self.stats["released"] += 1
        except errors.FleetstoreError as exc:
            log.warning("%s %s not given back: %s", job.claim.effect.kind, job.claim.id, exc)
        finally:
            self._jobs.pop(job.claim.id, None)

    async def _look_for_chains(self) -> None:
        """The claims of settlements whose answer was not had (``_unknown_chains``),
        once the spool has applied them: this worker's jobs (or given back)."""
        if not self._unknown_chains or self.store.spool_pending():
            return
        op_ids, self._unknown_chains = self._unknown_chains, []
        for op_id in op_ids:
            try:
                claims = await self._call(self._effects._chained, op_id, self.owner, self.lease)
            except errors.FleetstoreError as exc:
                log.info("looking for the claims of settlement %s deferred: %s", op_id, exc)
                self._unknown_chains.append(op_id)
                continue
            if not self._stop_requested:
                self._adopt(claims)
                continue
            for claim in claims:  # (the completer may have closed: each given back alone)
                try:
                    await self._call(claim.release)
                    self.stats["released"] += 1
                except errors.FleetstoreError as exc:
                    log.warning("%s %s not given back: %s", claim.effect.kind, claim.id, exc)

    def _task_ended(self, job: _Job, _task: asyncio.Task[None]) -> None:
        self._ran(job)

    def _ran(self, job: _Job) -> None:
        """*job*'s handler returned, or was given up on (then its thread holds a slot of
        ``_abandoned``): its slot is free while its settlement lands."""
        if not job.ran:
            job.ran = True
            self._busy -= 1
            if job.started:
                took = time.monotonic() - job.since
                self._run_time += (took - self._run_time) * 0.2
            if self._wake is not None:
                self._wake.set()

    def _ahead(self) -> int:
        """How many effects to claim ahead of a free slot: what the slots would start
        within ``AHEAD`` seconds at the handlers' recent run time (at least
        ``prefetch``, at most ``batch``).  A backlog of quick effects is then claimed
        and settled in batches; a worker of slow handlers keeps none waiting that
        another worker could start now."""
        run_time = self._run_time
        ahead = int(self.concurrency * AHEAD / run_time) if run_time > 0 else 0
        return max(self.prefetch, min(ahead, self.batch))

    # -- running a handler --------------------------------------------------------------------

    async def _run_job(self, job: _Job) -> None:
        otel = telemetry.ACTIVE
        if otel is None:
            return await self._run_handler(job)
        carried = None  # the trace it was enqueued in, if carried (trace_effects)
        if self.store.settings.trace_effects:
            with contextlib.suppress(errors.FleetstoreError):
                carried = await self._call(carried_trace, self.store, job.claim.id)
        with otel.handler_span(job.claim.effect, carried) or contextlib.nullcontext():
            await self._run_handler(job)

    async def _run_handler(self, job: _Job) -> None:
        claim = job.claim
        handler = self.handlers[claim.effect.kind]
        loop = asyncio.get_running_loop()
        timeout = self.timeouts.get(claim.effect.kind)
        inner: asyncio.Future[Any]
        started = time.monotonic()
        if inspect.iscoroutinefunction(handler.fn):
            inner = asyncio.ensure_future(handler.fn(claim.effect))
        else:
            fn = handler.fn
            if telemetry.ACTIVE is not None:
                # The handler's span goes with it into its thread (a thread starts
                # with a context of its own): its spans are the span's children.
                fn = functools.partial(_in_context, contextvars.copy_context(), fn)
            inner = self._threads.run(loop, fn, claim.effect)
        outcome: tuple[str, Any]
        try:
            done = await done_within(inner, timeout)
            self.store.outbox_metrics.record_run(time.monotonic() - started)
            if not done:
                self._abandon(claim, inner)  # (before its slot is counted free)
            self._ran(job)
            if not done:
                self.stats["timed_out"] += 1
                why = f"the handler ran past its timeout of {timeout:g}s (worker {self.owner}); "
                if isinstance(inner, asyncio.Task):
                    outcome = ("timed_out", why + "it was cancelled")
                else:
                    outcome = ("timed_out", why + "it was abandoned and may still be running")
            else:
                result = inner.result()
                if inspect.isawaitable(result):
                    result = await result
                outcome = ("succeed", result)
        except asyncio.CancelledError as exc:
            me = asyncio.current_task()
            if inner.done() and me is not None and not me.cancelling():
                # The handler's own: a task it awaited was cancelled.  Re-raised as
                # the worker's, it left the effect running, its lease renewed, for ever.
                outcome = ("retry", (None, f"{type(exc).__name__}: {exc}", exc))
            else:
                if not inner.done():
                    self._abandon(claim, inner)
                if not job.interrupted:
                    raise
                return  # a hard stop settles it
        except RetryEffect as exc:
            outcome = ("retry", (exc.delay, str(exc), exc))
        except FailEffect as exc:
            outcome = ("fail", (str(exc) or "failed", exc))
        except BaseException as exc:  # SystemExit too: it stopped the worker, effect running
            outcome = ("retry", (None, f"{type(exc).__name__}: {exc}", exc))
        if job.interrupted:
            return
        if telemetry.ACTIVE is not None:
            telemetry.ACTIVE.handler_outcome(outcome[0], outcome[1])
        await self._settle(job, *outcome)
        if self._wake is not None:
            self._wake.set()

    def _abandon(self, claim: Claim, inner: asyncio.Future[Any]) -> None:
        """Stop waiting for a handler: a coroutine is cancelled; a thread cannot be,
        and holds its slot until it returns (``_returned``)."""
        entry = _Abandoned(claim)
        self._abandoned.add(entry)
        if isinstance(inner, asyncio.Task):
            inner.cancel()
        inner.add_done_callback(lambda done: self._returned(entry, done))

    def _returned(self, entry: _Abandoned, done: asyncio.Future[Any]) -> None:
        """An abandoned handler came back: its slot is free; its outcome is offered to
        the store with its claim's token, which the timeout (or a newer claim)
        raised, so the store refuses it (``LeaseLost``) and the newer outcome stands."""
        self._abandoned.discard(entry)
        if self._wake is not None:
            self._wake.set()
        if done.cancelled():
            return  # a coroutine, stopped as asked
        claim = entry.claim
        self.stats["late"] += 1
        log.warning(
            "%s %s: the abandoned handler of attempt %d returned %.1fs later",
            claim.effect.kind,
            claim.id,
            claim.effect.attempt,
            time.monotonic() - entry.since,
        )
        if done.exception() is not None:
            return
        late = asyncio.ensure_future(self._offer_late(claim, done.result()))
        self._late.add(late)
        late.add_done_callback(self._late.discard)

    async def _offer_late(self, claim: Claim, result: Any) -> None:
        stale = Claim(self.store, claim.effect, claim.owner, claim.lease)
        try:
            applied = await self._call(stale._late_success, result)
        except errors.LeaseLost as exc:
            self.stats["lost"] += 1
            log.warning("%s %s: its late outcome is refused: %s", claim.effect.kind, claim.id, exc)
            return
        except errors.FleetstoreError as exc:
            log.warning(
                "%s %s: its late outcome was not offered: %s", claim.effect.kind, claim.id, exc
            )
            return
        if applied:  # never: the token was raised when the worker gave up on it
            log.error("%s %s: a late outcome was applied", claim.effect.kind, claim.id)

    async def _land(self, claim: Claim, item: dict[str, Any]) -> Landed:
        """*claim*'s settlement *item*, settled with others (domain/completer.py): the
        effect's new state once applied, None if spooled; raises what refused it.
        Queued, it lands whatever becomes of the caller."""
        assert self._completer is not None
        # (Not shielded: cancelling the wait cancels the future, not the flush it is in.)
        return await self._completer.add(claim, item)

    async def _settle(self, job: _Job, how: str, value: Any) -> None:
        claim = job.claim
        policy = self.policies[claim.effect.kind]
        #: A failed attempt: (its error, the exception, the retry's delay).
        failed: tuple[str, BaseException | None, float] | None = None
        try:
            try:
                if how == "succeed":
                    try:
                        applied = await self._land(claim, claim._success(value))
                        if applied:
                            self.stats["succeeded"] += 1
                    except errors.InvalidInput as exc:
                        failed = (f"result not storable: {exc}", None, 0.0)
                        applied = await self._land(claim, claim._failure(failed[0]))
                        self.stats["failed"] += 1
                elif how == "retry":
                    delay, error, raised = value
                    delay = policy.delay(claim.effect.attempt) if delay is None else delay
                    failed = (error, raised, delay)
                    applied = await self._land(
                        claim,
                        claim._retry(delay, error, handler_traceback(raised), policy.max_attempts),
                    )
                elif how == "fail":
                    error, raised = value
                    failed = (error, raised, 0.0)
                    applied = await self._land(
                        claim, claim._failure(error, traceback=handler_traceback(raised))
                    )
                    self.stats["failed"] += 1
                elif how == "release":
                    applied = await self._land(claim, claim._item("release"))
                    self.stats["released"] += 1
                elif how == "timed_out":
                    delay = policy.delay(claim.effect.attempt)
                    failed = (value, None, delay)
                    applied = await self._land(
                        claim, claim._timed_out(value, delay, policy.max_attempts)
                    )
                elif value:  # interrupted, replay-safe
                    applied = await self._land(claim, claim._retry(0.0, how))
                    self.stats["interrupted"] += 1
                else:
                    applied = await self._land(claim, claim._failure(how, interrupted=True))
                    self.stats["interrupted"] += 1
            except errors.LeaseLost as exc:
                self.stats["lost"] += 1
                if failed is not None:
                    # (The failure's own record says the lease was lost: logged once.)
                    self._failed(claim, failed, f"not recorded: {exc}")
                else:
                    log.warning("%s: %s", claim.effect.kind, exc, extra=lost_fields(claim, exc))
                return
            except errors.FleetstoreError as exc:
                # The settlement could neither be written nor spooled (disk full):
                # the lease runs out and a sweep hands the effect on.
                log.error("settling %s %s failed: %s", claim.effect.kind, claim.id, exc)
                if failed is not None:
                    self._failed(claim, failed, "not recorded: the lease runs out")
                return
            if claim.settled is EffectState.dead:
                self.stats["dead"] += 1
            elif how == "retry":
                self.stats["retried"] += 1
            if failed is not None:
                self._failed(claim, failed)
            if not applied:
                self.stats["spooled"] += 1
                self._settling[claim.id] = claim
                log.warning(
                    "store busy: the outcome of %s %s waits in the spool; "
                    "its lease is kept alive until it lands",
                    claim.effect.kind,
                    claim.id,
                )
        finally:
            self._jobs.pop(claim.id, None)

    def _failed(self, claim: Claim, failed: Failed, unrecorded: str | None = None) -> None:
        limit = lower(claim.effect.max_attempts, self.policies[claim.effect.kind].max_attempts)
        log_failure(log, claim, failed, limit, unrecorded)

    # -- leases -------------------------------------------------------------------------------

    async def _heartbeats(self) -> None:
        interval = max(self.lease / 3, 0.01)
        while True:
            await asyncio.sleep(interval)
            await self._beat_once()

    async def _beat_once(self) -> None:
        if self._settling and not self.store.spool_pending():
            self._settling.clear()  # every spooled settlement has been applied (or rejected)
        await self._look_for_chains()
        claims = [j.claim for j in self._jobs.values() if not j.buried]
        claims += list(self._settling.values())
        results = await asyncio.gather(
            *(self._call(c.heartbeat) for c in claims), return_exceptions=True
        )
        for claim, result in zip(claims, results, strict=True):
            if not isinstance(result, errors.LeaseLost):
                if isinstance(result, BaseException):
                    log.info("heartbeat of %s deferred: %s", claim.id, result)
                continue
            if self._settling.pop(claim.id, None) is not None:
                continue  # its spooled settlement landed
            job = self._jobs.get(claim.id)
            if job is None or claim.outcome is not None:
                continue
            if result.state == "dead":
                # A sweep buried it while this worker could not reach the store;
                # nobody else will run it, and its outcome may still land.
                job.buried = True
                log.warning(
                    "%s %s: %s; its outcome is still recorded", claim.effect.kind, claim.id, result
                )
                continue
            self.stats["lost"] += 1
            log.warning(
                "%s %s: %s", claim.effect.kind, claim.id, result, extra=lost_fields(claim, result)
            )
            job.interrupted = True
            self._jobs.pop(claim.id, None)
            if job.task is not None:
                job.task.cancel()  # a coroutine stops; a thread runs on, its outcome dropped
            elif job in self._queued:
                self._queued.remove(job)

    # -- stopping -----------------------------------------------------------------------------

    async def _drain(self) -> int:
        """Give queued claims back, wait for running ones (``grace``), then stop hard."""
        queued, self._queued = list(self._queued), deque()
        await asyncio.gather(*(self._settle(job, "release", None) for job in queued))
        deadline = time.monotonic() + self.grace
        while self._jobs and self._stop_requested < 2:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("grace of %.0fs over: stopping hard", self.grace)
                break
            await self._sleep(min(remaining, 0.1))
        if not self._jobs:
            return EXIT_OK
        # (Those whose outcome is known already are landing: the completer's last
        # flush waits for them.)
        jobs = [j for j in self._jobs.values() if j.claim.outcome is None]
        for job in jobs:
            job.interrupted = True
            if job.task is not None:
                job.task.cancel()
        await asyncio.gather(
            *(
                self._settle(job, "the worker stopped hard while it ran", self._replay_safe(job))
                for job in jobs
            )
        )
        return EXIT_HARD

    def _replay_safe(self, job: _Job) -> bool:
        effect = job.claim.effect
        if effect.replay_safe is not None:
            return effect.replay_safe
        return self.handlers[effect.kind].replay_safe

    async def _finish_settling(self) -> None:
        """Keep spooled settlements' leases alive until they land (bounded by the
        write budget: past it they stay in the journal for the next open)."""
        if not self._settling and not self._unknown_chains:
            return
        deadline = time.monotonic() + self.store.settings.write_budget
        while (self._settling or self._unknown_chains) and time.monotonic() < deadline:
            if not self.store.spool_pending():
                self._settling.clear()
                await self._look_for_chains()  # (stopping: given back)
                break
            await self._beat_once()
            await asyncio.sleep(min(self.lease / 3, 0.5))


__all__ = [
    "DEFAULT_HANDLER_TIMEOUT",
    "EXIT_HARD",
    "EXIT_HUNG",
    "EXIT_OK",
    "FailEffect",
    "Handler",
    "RetryEffect",
    "Worker",
]
