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
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from fleetstore import errors
from fleetstore.core.settings import Settings
from fleetstore.domain.history import ITERATE_PAGE, Messages, Sessions, Stream, ToolCallHandle
from fleetstore.domain.operations import Delivery, Operation
from fleetstore.domain.outbox import DEFAULT_LEASE, DEFAULT_MAX_ATTEMPTS, Claim, Effects, Swept
from fleetstore.domain.search import DEFAULT_LIMIT, Search
from fleetstore.domain.state import State
from fleetstore.engine.base import Tx
from fleetstore.models import (
    Effect,
    EffectState,
    Message,
    NewEffect,
    Page,
    Part,
    SearchHit,
    SearchStatus,
    Session,
    StateValue,
    ToolCall,
    Usage,
)
from fleetstore.store.facade import Store
from fleetstore.store.facade import open as _open_sync
from fleetstore.store.spool import Recovered

T = TypeVar("T")
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


class AsyncStore:
    """An open store whose calls are coroutines; see the module docstring.
    ``sync`` is the underlying ``Store``, which this object owns."""

    sync: Store
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

    @property
    def path(self) -> Path:
        return self.sync.path

    @property
    def settings(self) -> Settings:
        return self.sync.settings

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

    async def submit(
        self, op: Operation, delivery: Delivery = Delivery.SPOOLABLE
    ) -> dict[str, Any] | None:
        """``Store.submit``: apply *op* (None if it went to the spool)."""
        return await self._run(lambda: self.sync.submit(op, delivery))

    async def apply(self, op: Operation) -> dict[str, Any]:
        """``Store.apply``: apply *op* now (``StoreBusy`` past the budget)."""
        return await self._run(lambda: self.sync.apply(op))

    async def read(self, fn: Callable[[Tx], T], *, session_id: str | None = None) -> T:
        """``Store.read``: ``fn(tx)`` in a read transaction, run in a worker thread (a
        sharded store: in *session_id*'s file, else its catalog)."""
        return await self._run(lambda: self.sync.read(fn, session_id=session_id))

    async def read_first(self, fn: Callable[[Tx], list[T]]) -> list[T]:
        """``Store.read_first``: a lookup by an id that does not name its session."""
        return await self._run(lambda: self.sync.read_first(fn))

    async def sync_catalog(self, timeout: float | None = None) -> bool:
        """``Store.sync_catalog``: a sharded store's sessions index brought up to date."""
        return await self._run(lambda: self.sync.sync_catalog(timeout))

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait for the calls started before this one (cancelled ones included),
        then ``Store.flush``: stream text written, the spool drained."""
        return await self._run(lambda: self.sync.flush(timeout), after=self._pending())

    async def recover(self) -> list[Recovered]:
        """``Store.recover``: replay the journals of processes that died."""
        return await self._run(self.sync.recover)

    def metrics(self) -> dict[str, Any]:
        """``Store.metrics`` (in-memory figures: no I/O, so not a coroutine)."""
        return self.sync.metrics()

    def histograms(self) -> dict[str, Any]:
        """``Store.histograms`` (in-memory figures: no I/O, so not a coroutine)."""
        return self.sync.histograms()

    async def close(self, timeout: float | None = None) -> None:
        """Wait for every call in flight (cancelled ones included), then
        ``Store.close``.  Idempotent; new calls raise ``StoreClosed``."""
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


class AsyncSessions:
    """``store.sessions`` as coroutines; see ``fleetstore.Sessions``."""

    def __init__(self, owner: AsyncStore, sessions: Sessions) -> None:
        self._owner = owner
        self.sync = sessions

    async def create(
        self,
        title: str | None = None,
        *,
        project: str | None = None,
        parent_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        id: str | None = None,
        effects: Sequence[NewEffect] = (),
    ) -> Session:
        """``Sessions.create``."""
        return await self._owner._run(
            lambda: self.sync.create(
                title,
                project=project,
                parent_id=parent_id,
                metadata=metadata,
                id=id,
                effects=effects,
            )
        )

    async def get(self, session_id: str) -> Session:
        """``Sessions.get``."""
        return await self._owner._run(lambda: self.sync.get(session_id))

    async def list(
        self,
        *,
        project: str | None = None,
        parent_id: str | None = None,
        root_id: str | None = None,
        include_archived: bool = False,
        limit: int = 100,
        before: str | None = None,
    ) -> Page[Session, str]:
        """``Sessions.list``."""
        return await self._owner._run(
            lambda: self.sync.list(
                project=project,
                parent_id=parent_id,
                root_id=root_id,
                include_archived=include_archived,
                limit=limit,
                before=before,
            )
        )

    async def children(self, session_id: str) -> builtins.list[Session]:
        """``Sessions.children``."""
        return await self._owner._run(lambda: self.sync.children(session_id))

    async def update(
        self,
        session_id: str,
        *,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        expected_version: int | None = None,
        effects: Sequence[NewEffect] = (),
    ) -> Session:
        """``Sessions.update``."""
        return await self._owner._run(
            lambda: self.sync.update(
                session_id,
                title=title,
                metadata=metadata,
                expected_version=expected_version,
                effects=effects,
            )
        )

    async def fork(
        self,
        session_id: str,
        *,
        at_message_id: str | None = None,
        title: str | None = None,
        id: str | None = None,
    ) -> Session:
        """``Sessions.fork``."""
        return await self._owner._run(
            lambda: self.sync.fork(session_id, at_message_id=at_message_id, title=title, id=id)
        )

    async def archive(self, session_id: str, archived: bool = True) -> Session:
        """``Sessions.archive``."""
        return await self._owner._run(lambda: self.sync.archive(session_id, archived))

    async def delete(self, session_id: str) -> None:
        """``Sessions.delete``."""
        await self._owner._run(lambda: self.sync.delete(session_id))

    async def usage(self, session_id: str) -> Usage:
        """``Sessions.usage``."""
        return await self._owner._run(lambda: self.sync.usage(session_id))


class AsyncMessages:
    """``store.messages`` as coroutines; see ``fleetstore.Messages``."""

    def __init__(self, owner: AsyncStore, messages: Messages) -> None:
        self._owner = owner
        self.sync = messages

    async def append(
        self,
        session_id: str,
        role: str,
        parts: Sequence[Part] | str = (),
        *,
        model: str | None = None,
        usage: Usage | Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        id: str | None = None,
        effects: Sequence[NewEffect] = (),
    ) -> Message:
        """``Messages.append`` (blob files are written in the worker thread too)."""
        return await self._owner._run(
            lambda: self.sync.append(
                session_id,
                role,
                parts,
                model=model,
                usage=usage,
                metadata=metadata,
                id=id,
                effects=effects,
            )
        )

    def stream(
        self,
        session_id: str,
        role: str = "assistant",
        *,
        model: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        id: str | None = None,
    ) -> AsyncStream:
        """``Messages.stream``, used as ``async with store.messages.stream(...) as reply``.
        Not a coroutine: nothing is written until the block is entered."""
        stream = self.sync.stream(session_id, role, model=model, metadata=metadata, id=id)
        return AsyncStream(self._owner, stream)

    async def get(self, message_id: str) -> Message:
        """``Messages.get``."""
        return await self._owner._run(lambda: self.sync.get(message_id))

    async def list(
        self,
        session_id: str,
        *,
        after: int = 0,
        limit: int | None = None,
        last: int | None = None,
    ) -> builtins.list[Message]:
        """``Messages.list``."""
        return await self._owner._run(
            lambda: self.sync.list(session_id, after=after, limit=limit, last=last)
        )

    def iterate(
        self, session_id: str, *, after: int = 0, page: int = ITERATE_PAGE
    ) -> AsyncIterator[Message]:
        """``Messages.iterate`` as an async iterator (``async for m in ...``): each
        page, and each message's blobs, read in the worker thread.  Arguments are
        checked at the call, as the sync method's are."""
        return self._pages(self.sync.iterate(session_id, after=after, page=page))

    async def _pages(self, messages: Iterator[Message]) -> AsyncIterator[Message]:
        end = object()
        while True:
            found = await self._owner._run(lambda: next(messages, end))
            if found is end:
                return
            assert isinstance(found, Message)
            yield found


class AsyncToolCallHandle:
    """Returned by ``await reply.tool_call(...)``: ``await call.result(output)``."""

    def __init__(self, stream: AsyncStream, handle: ToolCallHandle) -> None:
        self._stream = stream
        self.sync = handle

    @property
    def call(self) -> ToolCall:
        return self.sync.call

    @property
    def call_id(self) -> str:
        return self.sync.call_id

    async def result(self, output: str | bytes, *, is_error: bool = False) -> None:
        """``ToolCallHandle.result``."""
        await self._stream._chain(lambda: self.sync.result(output, is_error=is_error))


class AsyncStream:
    """A message being written, as coroutines; see ``fleetstore.Stream``.

    A text or reasoning delta that does not fill the buffer stays on the loop (a
    list append); one that triggers a size flush, and every other call, runs in
    a worker thread.  Calls on one stream keep their order: each waits for the
    previous one, even one whose caller was cancelled."""

    def __init__(self, owner: AsyncStore, stream: Stream) -> None:
        self._owner = owner
        self.sync = stream
        self._last: _Job | None = None  # this stream's latest job in the pool

    @property
    def id(self) -> str:
        return self.sync.id

    @property
    def session_id(self) -> str:
        return self.sync.session_id

    @property
    def role(self) -> str:
        return self.sync.role

    @property
    def model(self) -> str | None:
        return self.sync.model

    @property
    def flushes(self) -> int:
        """Transactions that appended this stream's text so far."""
        return self.sync.flushes

    def _busy(self) -> bool:
        return self._last is not None and not self._last.done()

    def _chain(self, fn: Callable[[], T]) -> asyncio.Future[T]:
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
        await self._chain(lambda: self.sync.__exit__(exc_type, exc, tb))

    async def open(self) -> None:
        """``Stream.open``: store the message as ``streaming``."""
        await self._chain(self.sync.open)

    async def text(self, delta: str) -> None:
        """``Stream.text``: append text (coalesced)."""
        await self._delta(self.sync.text, delta)

    async def reasoning(self, delta: str) -> None:
        """``Stream.reasoning``: append reasoning text."""
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
        await self._chain(lambda: write(delta))

    def due(self) -> float | None:
        """``Stream.due`` (no I/O, so not a coroutine)."""
        return self.sync.due()

    async def flush(self) -> None:
        """``Stream.flush``: write the pending deltas now."""
        await self._chain(self.sync.flush)

    async def tool_call(
        self, name: str, arguments: Any = None, *, call_id: str | None = None
    ) -> AsyncToolCallHandle:
        """``Stream.tool_call``; ``await handle.result(output)`` records the output."""
        handle = await self._chain(lambda: self.sync.tool_call(name, arguments, call_id=call_id))
        return AsyncToolCallHandle(self, handle)

    async def add(self, part: Part) -> None:
        """``Stream.add``: a whole part after what was streamed."""
        await self._chain(lambda: self.sync.add(part))

    def usage(self, usage: Usage | None = None, **tokens: Any) -> None:
        """``Stream.usage`` (kept until the message completes: not a coroutine)."""
        self.sync.usage(usage, **tokens)

    async def enqueue(self, effect: NewEffect) -> None:
        """``Stream.enqueue``: an effect committed with the message's completion."""
        await self._chain(lambda: self.sync.enqueue(effect))

    async def put_state(self, key: str, value: Any, *, namespace: str = "default") -> None:
        """See ``Stream.put_state``: committed with the reply's end."""
        await self._chain(lambda: self.sync.put_state(key, value, namespace=namespace))

    async def finish(self, error: str | None = None) -> None:
        """``Stream.finish``: flush and mark the message complete (or error)."""
        await self._chain(lambda: self.sync.finish(error))


class AsyncState:
    """``store.state`` as coroutines; see ``fleetstore.State``."""

    def __init__(self, owner: AsyncStore, state: State) -> None:
        self._owner = owner
        self.sync = state

    async def get(
        self, session_id: str, key: str, *, namespace: str = "default"
    ) -> StateValue | None:
        """``State.get``."""
        return await self._owner._run(lambda: self.sync.get(session_id, key, namespace=namespace))

    async def put(
        self,
        session_id: str,
        key: str,
        value: Any,
        *,
        namespace: str = "default",
        expected_version: int | None = None,
        effects: Sequence[NewEffect] = (),
    ) -> StateValue:
        """``State.put``."""
        return await self._owner._run(
            lambda: self.sync.put(
                session_id,
                key,
                value,
                namespace=namespace,
                expected_version=expected_version,
                effects=effects,
            )
        )

    async def delete(
        self,
        session_id: str,
        key: str,
        *,
        namespace: str = "default",
        expected_version: int | None = None,
        effects: Sequence[NewEffect] = (),
    ) -> bool:
        """``State.delete``."""
        return await self._owner._run(
            lambda: self.sync.delete(
                session_id,
                key,
                namespace=namespace,
                expected_version=expected_version,
                effects=effects,
            )
        )

    async def keys(self, session_id: str, *, namespace: str = "default") -> list[str]:
        """``State.keys``."""
        return await self._owner._run(lambda: self.sync.keys(session_id, namespace=namespace))


class AsyncEffects:
    """``store.effects`` as coroutines; see ``fleetstore.domain.outbox.Effects``.  For a
    worker loop see ``fleetstore.Worker``, which runs async handlers itself."""

    def __init__(self, owner: AsyncStore, effects: Effects) -> None:
        self._owner = owner
        self.sync = effects

    async def enqueue(
        self,
        thread_key: str,
        kind: str,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        delay: float = 0.0,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        replay_safe: bool | None = None,
    ) -> str:
        """``Effects.enqueue``."""
        return await self._owner._run(
            lambda: self.sync.enqueue(
                thread_key,
                kind,
                payload,
                idempotency_key=idempotency_key,
                delay=delay,
                max_attempts=max_attempts,
                replay_safe=replay_safe,
            )
        )

    async def get(self, effect_id: str) -> Effect:
        """``Effects.get``."""
        return await self._owner._run(lambda: self.sync.get(effect_id))

    async def list(
        self,
        *,
        thread_key: str | None = None,
        state: EffectState | str | None = None,
        kind: str | None = None,
        limit: int = 100,
        after: Effect | None = None,
    ) -> Page[Effect, Effect]:
        """``Effects.list``."""
        return await self._owner._run(
            lambda: self.sync.list(
                thread_key=thread_key, state=state, kind=kind, limit=limit, after=after
            )
        )

    async def counts(self) -> dict[str, int]:
        """``Effects.counts``."""
        return await self._owner._run(self.sync.counts)

    async def wake_token(self) -> int:
        """``Effects.wake_token``."""
        return await self._owner._run(self.sync.wake_token)

    async def wait_for_work(self, timeout: float, *, token: int | None = None) -> bool:
        """``Effects.wait_for_work``."""
        return await self._owner._run(lambda: self.sync.wait_for_work(timeout, token=token))

    async def next_ready(self, kinds: Iterable[str] | None = None) -> float | None:
        """``Effects.next_ready``."""
        return await self._owner._run(lambda: self.sync.next_ready(kinds))

    async def active(self, kinds: Iterable[str] | None = None) -> int:
        """``Effects.active``."""
        return await self._owner._run(lambda: self.sync.active(kinds))

    async def claim(
        self,
        owner: str,
        *,
        limit: int = 1,
        lease: float = DEFAULT_LEASE,
        kinds: Iterable[str] | None = None,
        timeouts: Mapping[str, float] | None = None,
    ) -> builtins.list[AsyncClaim]:
        """``Effects.claim``; the claims' settlements are coroutines too."""
        claims = await self._owner._run(
            lambda: self.sync.claim(owner, limit=limit, lease=lease, kinds=kinds, timeouts=timeouts)
        )
        return [AsyncClaim(self._owner, c) for c in claims]

    async def sweep(self) -> builtins.list[Swept]:
        """``Effects.sweep``."""
        return await self._owner._run(self.sync.sweep)

    async def retry(self, effect_id: str) -> Effect:
        """``Effects.retry``."""
        return await self._owner._run(lambda: self.sync.retry(effect_id))

    async def cancel(self, effect_id: str) -> Effect:
        """``Effects.cancel``."""
        return await self._owner._run(lambda: self.sync.cancel(effect_id))

    async def declare(self, kinds: Mapping[str, bool]) -> None:
        """``Effects.declare``."""
        await self._owner._run(lambda: self.sync.declare(kinds))

    async def kinds(self) -> dict[str, bool]:
        """``Effects.kinds``."""
        return await self._owner._run(self.sync.kinds)


class AsyncClaim:
    """A ``Claim`` whose calls are coroutines.  A settlement handed to a thread
    runs to its end even if the awaiting coroutine is cancelled."""

    def __init__(self, owner: AsyncStore, claim: Claim) -> None:
        self._owner = owner
        self.sync = claim

    @property
    def effect(self) -> Effect:
        return self.sync.effect

    @property
    def id(self) -> str:
        return self.sync.id

    @property
    def fence(self) -> int:
        return self.sync.fence

    @property
    def settled(self) -> EffectState | None:
        return self.sync.settled

    @property
    def dead_reason(self) -> str | None:
        return self.sync.dead_reason

    async def heartbeat(self, lease: float | None = None) -> float:
        """``Claim.heartbeat``."""
        return await self._owner._run(lambda: self.sync.heartbeat(lease))

    async def succeed(self, result: Any = None) -> bool:
        """``Claim.succeed``."""
        return await self._owner._run(lambda: self.sync.succeed(result))

    async def retry(
        self,
        delay: float = 0.0,
        error: str = "",
        *,
        traceback: str | None = None,
        max_attempts: int | None = None,
    ) -> bool:
        """``Claim.retry``."""
        return await self._owner._run(
            lambda: self.sync.retry(delay, error, traceback=traceback, max_attempts=max_attempts)
        )

    async def fail(
        self, error: str, *, interrupted: bool = False, traceback: str | None = None
    ) -> bool:
        """``Claim.fail``."""
        return await self._owner._run(
            lambda: self.sync.fail(error, interrupted=interrupted, traceback=traceback)
        )

    async def cancel(self) -> bool:
        """``Claim.cancel``."""
        return await self._owner._run(self.sync.cancel)

    async def release(self) -> bool:
        """``Claim.release``."""
        return await self._owner._run(self.sync.release)

    async def timed_out(
        self, error: str, delay: float = 0.0, *, max_attempts: int | None = None
    ) -> bool:
        """``Claim.timed_out``."""
        return await self._owner._run(
            lambda: self.sync.timed_out(error, delay, max_attempts=max_attempts)
        )

    def __repr__(self) -> str:
        return f"<AsyncClaim {self.sync!r}>"


def _abandon(executor: ThreadPoolExecutor, job: concurrent.futures.Future[Store]) -> None:
    """``open_async`` was cancelled: close the store the open still produced."""
    if not job.cancelled() and job.exception() is None:
        executor.submit(job.result().close)
    executor.shutdown(wait=False)


class AsyncSearch:
    """``store.search`` as coroutines; see ``fleetstore.domain.search.Search``."""

    def __init__(self, owner: AsyncStore, search: Search) -> None:
        self._owner = owner
        self.sync = search

    async def __call__(
        self,
        query: str,
        *,
        match: str = "words",
        order: str = "newest",
        project: str | None = None,
        session_id: str | None = None,
        root_id: str | None = None,
        roles: Iterable[str] | None = None,
        kinds: Iterable[str] | None = None,
        since: float | None = None,
        until: float | None = None,
        include_archived: bool = False,
        limit: int = DEFAULT_LIMIT,
        cursor: str | None = None,
    ) -> Page[SearchHit, str]:
        """``Search.__call__``: a page of hits."""
        return await self._owner._run(
            lambda: self.sync(
                query,
                match=match,
                order=order,
                project=project,
                session_id=session_id,
                root_id=root_id,
                roles=roles,
                kinds=kinds,
                since=since,
                until=until,
                include_archived=include_archived,
                limit=limit,
                cursor=cursor,
            )
        )

    async def status(self) -> SearchStatus:
        """``Search.status``."""
        return await self._owner._run(self.sync.status)

    async def catch_up(
        self,
        *,
        progress: Callable[[int, int], None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> int:
        """``Search.catch_up`` (*progress* and *stop* are called from the pool's thread)."""
        return await self._owner._run(lambda: self.sync.catch_up(progress=progress, stop=stop))


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
