"""The store as coroutines: ``fleetstore.open_async()``.

The same API as ``fleetstore.open()`` (same method names and parameters), with
every call that may touch the database or the disk awaited.  The event loop
never waits on the writer gate, on SQLite or on fsync: those calls run in a
small thread pool owned by the ``AsyncStore``.

Example (runnable as it stands)::

    import asyncio
    import os
    import tempfile

    import fleetstore


    async def main(path: str) -> None:
        async with await fleetstore.open_async(path) as store:
            s = await store.sessions.create(title="fix flaky test")
            await store.messages.append(s.id, "user", "why does it flake?")
            async with store.messages.stream(s.id, model="m-1") as reply:
                await reply.text("Let me run it. ")
                call = await reply.tool_call("bash", {"cmd": "pytest -x"})
                await call.result("1 failed")
                reply.usage(input_tokens=12, output_tokens=5)
            for m in await store.messages.list(s.id):
                print(m.seq, m.role, m.status.value, repr(m.text))


    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(os.path.join(tmp, "demo.db")))

Cancellation: a call already handed to a thread is one operation, applied in one
transaction, and it runs to its end even if the awaiting coroutine is cancelled:
the write then happens (or fails) whole, but its result is not observed.  Such a
write may land after writes made later; ``await store.flush()`` first waits for
every call started before it, and ``close()`` waits for all of them.

Concurrent calls from several coroutines have no defined order among
themselves, as with threads; calls awaited one after the other land in order,
and so do the calls on one stream, whoever makes them.

Each member below names the sync member it forwards (``store/forward.py``): its
parameters, return type and docstring are that member's, for ``help()`` and for
type checkers alike.  What is written here by hand is only what differs: how calls
run (the pool, a stream's order, waiting for calls in flight) and what a result
becomes (a ``Stream`` an ``AsyncStream``, an iterator an async iterator).
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

from fleetstore import errors
from fleetstore.domain.history import Messages, Stream, ToolCallHandle
from fleetstore.domain.outbox import Claim, Effects
from fleetstore.domain.search import Search
from fleetstore.domain.sessions import Sessions
from fleetstore.domain.state import State
from fleetstore.models import Message
from fleetstore.store.facade import Store
from fleetstore.store.facade import open as _open_sync
from fleetstore.store.forward import Twin, attribute, coroutine, implements, plain

T = TypeVar("T")
S = TypeVar("S")
_Job = concurrent.futures.Future[Any]

#: Threads per AsyncStore.  Writes queue on the writer gate whatever the number;
#: more threads let reads and blob compression run beside a waiting writer.
#: A pool of its own, not ``asyncio.to_thread``: a writer may wait the whole
#: write budget for the lock, and a few of them would fill the loop's default
#: executor, which getaddrinfo and every library's to_thread share; and close()
#: must wait for exactly this store's calls.
DEFAULT_THREADS = 4


def _bridge(job: concurrent.futures.Future[T]) -> asyncio.Future[T]:
    """An asyncio future settled by *job*; cancelling it never cancels *job*
    (unlike ``asyncio.wrap_future``, which cancels a job still queued)."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[T] = loop.create_future()

    def settle() -> None:
        if waiter.cancelled():
            return  # the caller was cancelled: the outcome is not observed
        exc = job.exception()
        if exc is not None:
            waiter.set_exception(exc)
        else:
            waiter.set_result(job.result())

    def done(_: concurrent.futures.Future[T]) -> None:
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:
            pass  # the loop is closed: nobody waits for this outcome any more

    job.add_done_callback(done)
    return waiter


#: The most threads an AsyncStore's pool may have.
MAX_THREADS = 1024


def _check_threads(threads: object) -> int:
    if not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= MAX_THREADS:
        raise errors.ConfigError(
            f"threads must be an integer from 1 to {MAX_THREADS}, not {threads!r:.80}"
        )
    return threads


class AsyncStore(Twin[Store]):
    """An open store whose calls are coroutines; see the module docstring.
    ``sync`` is the underlying ``Store``, which this object owns."""

    sessions: AsyncSessions
    messages: AsyncMessages
    state: AsyncState
    effects: AsyncEffects
    search: AsyncSearch

    def __init__(self, store: Store, *, threads: int = DEFAULT_THREADS) -> None:
        """Wrap an open *store*; ``close()`` then closes it."""
        executor = ThreadPoolExecutor(_check_threads(threads), thread_name_prefix="fleetstore-aio")
        self._setup(store, executor)

    def _setup(self, store: Store, executor: ThreadPoolExecutor) -> None:
        self.sync = store
        self._executor = executor
        self._inflight: set[_Job] = set()
        self._inflight_lock = threading.Lock()  # jobs leave the set from worker threads
        self._close_job: concurrent.futures.Future[None] | None = None
        self.sessions = AsyncSessions(self, store.sessions)
        self.messages = AsyncMessages(self, store.messages)
        self.state = AsyncState(self, store.state)
        self.effects = AsyncEffects(self, store.effects)
        self.search = AsyncSearch(self, store.search)

    path = attribute(Store, lambda s: s.path)
    settings = attribute(Store, lambda s: s.settings)

    # -- running calls in the pool ---------------------------------------------------------

    def _submit(
        self, fn: Callable[[], T], after: Sequence[_Job] = ()
    ) -> concurrent.futures.Future[T]:
        """Queue *fn* (it starts once the jobs *after* are done); tracked until it ends."""
        if self._close_job is not None:
            raise errors.StoreClosed(f"{self.sync.path}: the store was closed")

        def job() -> T:
            # Jobs in *after* were queued earlier, so they have started already:
            # waiting on them here cannot deadlock the bounded pool.
            if after:
                concurrent.futures.wait(after)
            return fn()

        future = self._executor.submit(job)
        with self._inflight_lock:
            self._inflight.add(future)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, job: _Job) -> None:
        with self._inflight_lock:
            self._inflight.discard(job)

    def _pending(self) -> builtins.list[_Job]:
        with self._inflight_lock:
            return [job for job in self._inflight if not job.done()]

    def _run(self, fn: Callable[[], T], after: Sequence[_Job] = ()) -> asyncio.Future[T]:
        # Queued when called, not when first awaited: a call made is a call that runs.
        return _bridge(self._submit(fn, after))

    # -- the Store's own calls -------------------------------------------------------------

    submit = coroutine(Store.submit)
    apply = coroutine(Store.apply)
    read = coroutine(Store.read)
    read_first = coroutine(Store.read_first)
    sync_catalog = coroutine(Store.sync_catalog)
    recover = coroutine(Store.recover)
    metrics = plain(Store.metrics)
    histograms = plain(Store.histograms)

    @implements(Store.flush)
    async def flush(self, *args: Any, **kwargs: Any) -> bool:
        """Async: first waits for the calls started before this one, cancelled ones
        included."""
        return await self._run(lambda: self.sync.flush(*args, **kwargs), after=self._pending())

    # Its parameters named (not *args): a misnamed one must fail here, at the call,
    # not in the thread after the pool was marked closed.
    @implements(Store.close)
    async def close(self, timeout: float | None = None) -> None:
        """Async: waits for every call in flight (cancelled ones included) first.
        Idempotent; new calls raise ``StoreClosed``."""
        if self._close_job is None:
            pending = self._pending()
            self._close_job = self._executor.submit(self._close_in_thread, pending, timeout)
        await _bridge(self._close_job)

    def _close_in_thread(self, pending: Sequence[_Job], timeout: float | None) -> None:
        concurrent.futures.wait(pending)
        try:
            self.sync.close(timeout)
        finally:
            self._executor.shutdown(wait=False)

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        closed = " closed" if self._close_job is not None else ""
        return f"<fleetstore.AsyncStore {str(self.sync.path)!r}{closed}>"


class _Part(Twin[S]):
    """A part of an ``AsyncStore`` (``store.sessions``...): its calls run in the
    store's pool."""

    def __init__(self, owner: AsyncStore, sync: S) -> None:
        self._owner = owner
        self.sync = sync

    def _run(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        return self._owner._run(fn)


class AsyncSessions(_Part[Sessions]):
    """``store.sessions`` as coroutines; see ``fleetstore.Sessions``."""

    create = coroutine(Sessions.create)
    get = coroutine(Sessions.get)
    list = coroutine(Sessions.list)
    children = coroutine(Sessions.children)
    update = coroutine(Sessions.update)
    fork = coroutine(Sessions.fork)
    archive = coroutine(Sessions.archive)
    delete = coroutine(Sessions.delete)
    usage = coroutine(Sessions.usage)


class AsyncMessages(_Part[Messages]):
    """``store.messages`` as coroutines; see ``fleetstore.Messages``.  Blob files are
    written in the pool's threads too; ``stream()`` and ``iterate()`` are not
    coroutines (an async context manager, an async iterator)."""

    def _as_stream(self, stream: Stream) -> AsyncStream:
        """Async: not a coroutine; used as ``async with store.messages.stream(...) as
        reply`` (an ``AsyncStream``): nothing is written until the block is entered."""
        return AsyncStream(self._owner, stream)

    async def _pages(self, messages: Iterator[Message]) -> AsyncIterator[Message]:
        """Async: an async iterator (``async for m in ...``); each page, and each
        message's blobs, read in the pool.  Arguments are checked at the call."""
        end = object()
        while True:
            found = await self._run(lambda: next(messages, end))
            if found is end:
                return
            assert isinstance(found, Message)
            yield found

    append = coroutine(Messages.append)
    stream = plain(Messages.stream, then=_as_stream)
    get = coroutine(Messages.get)
    list = coroutine(Messages.list)
    iterate = plain(Messages.iterate, then=_pages)


class AsyncToolCallHandle(Twin[ToolCallHandle]):
    """Returned by ``await reply.tool_call(...)``: ``await call.result(output)``."""

    def __init__(self, stream: AsyncStream, handle: ToolCallHandle) -> None:
        self._stream = stream
        self.sync = handle

    def _run(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        return self._stream._run(fn)

    call = attribute(ToolCallHandle, lambda h: h.call)
    call_id = attribute(ToolCallHandle, lambda h: h.call_id)
    result = coroutine(ToolCallHandle.result)


class AsyncStream(Twin[Stream]):
    """A message being written, as coroutines; see ``fleetstore.Stream``.

    A text or reasoning delta that does not fill the buffer stays on the loop (a
    list append); one that triggers a size flush, and every other call, runs in
    a worker thread.  Calls on one stream keep their order: each waits for the
    previous one, even one whose caller was cancelled.  ``due()`` and ``usage()``
    do no I/O, so they are not coroutines (usage is kept until the message
    completes)."""

    def __init__(self, owner: AsyncStore, stream: Stream) -> None:
        self._owner = owner
        self.sync = stream
        self._last: _Job | None = None  # this stream's latest job in the pool

    id = attribute(Stream, lambda s: s.id)
    session_id = attribute(Stream, lambda s: s.session_id)
    role = attribute(Stream, lambda s: s.role)
    model = attribute(Stream, lambda s: s.model)
    flushes = attribute(Stream, lambda s: s.flushes)

    def _busy(self) -> bool:
        return self._last is not None and not self._last.done()

    def _run(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Queue *fn* behind this stream's previous job; queued at once, not on await."""
        after = (self._last,) if self._last is not None and self._busy() else ()
        job = self._owner._submit(fn, after)
        self._last = job
        return _bridge(job)

    async def __aenter__(self) -> AsyncStream:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Queued before the first await, so even a second cancellation arriving
        # here cannot leave the message `streaming`.
        await self._run(lambda: self.sync.__exit__(exc_type, exc, tb))

    def _as_handle(self, handle: ToolCallHandle) -> AsyncToolCallHandle:
        """Async: ``await call.result(output)`` records the output."""
        return AsyncToolCallHandle(self, handle)

    open = coroutine(Stream.open)
    flush = coroutine(Stream.flush)
    tool_call = coroutine(Stream.tool_call, then=_as_handle)
    add = coroutine(Stream.add)
    enqueue = coroutine(Stream.enqueue)
    put_state = coroutine(Stream.put_state)
    finish = coroutine(Stream.finish)
    due = plain(Stream.due)
    usage = plain(Stream.usage)

    @implements(Stream.text)
    async def text(self, delta: str) -> None:
        """Async: a delta that does not fill the buffer is appended on the loop."""
        await self._delta(self.sync.text, delta)

    @implements(Stream.reasoning)
    async def reasoning(self, delta: str) -> None:
        """Async: a delta that does not fill the buffer is appended on the loop."""
        await self._delta(self.sync.reasoning, delta)

    async def _delta(self, write: Callable[[str], None], delta: str) -> None:
        # Stream._pending_bytes only shrinks behind our back (a timed flush in
        # the store's background thread), so if this delta does not reach
        # stream_flush_bytes now, write() cannot flush on the loop.
        if not self._busy() and (
            not isinstance(delta, str)  # write() raises InvalidInput, having done nothing
            or self.sync._pending_bytes + len(delta) < self._owner.settings.stream_flush_bytes
        ):
            write(delta)
            return
        await self._run(lambda: write(delta))


class AsyncState(_Part[State]):
    """``store.state`` as coroutines; see ``fleetstore.State``."""

    get = coroutine(State.get)
    put = coroutine(State.put)
    delete = coroutine(State.delete)
    keys = coroutine(State.keys)


class AsyncEffects(_Part[Effects]):
    """``store.effects`` as coroutines; see ``fleetstore.domain.outbox.Effects``.  For a
    worker loop see ``fleetstore.Worker``, which runs async handlers itself.  The
    claims ``claim()`` returns are ``AsyncClaim``s, whose settlements are awaited."""

    def _as_claims(self, claims: builtins.list[Claim]) -> builtins.list[AsyncClaim]:
        """Async: ``AsyncClaim``s, whose settlements are awaited."""
        return [AsyncClaim(self._owner, c) for c in claims]

    enqueue = coroutine(Effects.enqueue)
    get = coroutine(Effects.get)
    list = coroutine(Effects.list)
    counts = coroutine(Effects.counts)
    wake_token = coroutine(Effects.wake_token)
    wait_for_work = coroutine(Effects.wait_for_work)
    next_ready = coroutine(Effects.next_ready)
    active = coroutine(Effects.active)
    claim = coroutine(Effects.claim, then=_as_claims)
    sweep = coroutine(Effects.sweep)
    retry = coroutine(Effects.retry)
    cancel = coroutine(Effects.cancel)
    declare = coroutine(Effects.declare)
    kinds = coroutine(Effects.kinds)


class AsyncClaim(_Part[Claim]):
    """A ``Claim`` whose calls are coroutines.  A settlement handed to a thread
    runs to its end even if the awaiting coroutine is cancelled."""

    effect = attribute(Claim, lambda c: c.effect)
    owner = attribute(Claim, lambda c: c.owner)
    lease = attribute(Claim, lambda c: c.lease)
    lease_expires_at = attribute(Claim, lambda c: c.lease_expires_at)
    outcome = attribute(Claim, lambda c: c.outcome)
    chained = attribute(Claim, lambda c: c.chained)
    id = attribute(Claim, lambda c: c.id)
    fence = attribute(Claim, lambda c: c.fence)
    settled = attribute(Claim, lambda c: c.settled)
    dead_reason = attribute(Claim, lambda c: c.dead_reason)

    heartbeat = coroutine(Claim.heartbeat)
    succeed = coroutine(Claim.succeed)
    retry = coroutine(Claim.retry)
    fail = coroutine(Claim.fail)
    cancel = coroutine(Claim.cancel)
    release = coroutine(Claim.release)
    timed_out = coroutine(Claim.timed_out)

    def __repr__(self) -> str:
        return f"<AsyncClaim {self.sync!r}>"


class AsyncSearch(_Part[Search]):
    """``store.search`` as coroutines; see ``fleetstore.domain.search.Search``.
    ``catch_up``'s *progress* and *stop* are called from the pool's thread."""

    __call__ = coroutine(Search.__call__)
    status = coroutine(Search.status)
    catch_up = coroutine(Search.catch_up)


def _abandon(executor: ThreadPoolExecutor, job: concurrent.futures.Future[Store]) -> None:
    """``open_async`` was cancelled: close the store the open still produced."""
    if not job.cancelled() and job.exception() is None:
        executor.submit(job.result().close)
    executor.shutdown(wait=False)


async def open_async(
    url_or_path: str | os.PathLike[str] | None = None,
    *,
    threads: int = DEFAULT_THREADS,
    **settings: Any,
) -> AsyncStore:
    """``fleetstore.open`` run in a worker thread (opening may wait for the gate,
    migrate, and replay dead processes' journals); *threads* sizes the pool."""
    executor = ThreadPoolExecutor(_check_threads(threads), thread_name_prefix="fleetstore-aio")
    job = executor.submit(_open_sync, url_or_path, **settings)
    try:
        store = await _bridge(job)
    except asyncio.CancelledError:
        job.add_done_callback(lambda done: _abandon(executor, done))
        raise
    except BaseException:
        executor.shutdown(wait=False)
        raise
    async_store = AsyncStore.__new__(AsyncStore)
    async_store._setup(store, executor)
    return async_store


__all__ = [
    "DEFAULT_THREADS",
    "AsyncClaim",
    "AsyncEffects",
    "AsyncMessages",
    "AsyncSearch",
    "AsyncSessions",
    "AsyncState",
    "AsyncStore",
    "AsyncStream",
    "AsyncToolCallHandle",
    "open_async",
]
