"""LangGraph checkpoints in a fleetstore store: ``FleetstoreSaver``.

Before::

    from langgraph.checkpoint.sqlite import SqliteSaver
    with SqliteSaver.from_conn_string("checkpoints.db") as saver:
        graph = builder.compile(checkpointer=saver)

After::

    from fleetstore.integrations.langgraph import FleetstoreSaver
    with FleetstoreSaver("checkpoints.db") as saver:     # or FleetstoreSaver(store)
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "t-1"}})

Every process of a fleet may open the same store: checkpoint writes go
through fleetstore's write path (the writer gate, the write budget, the spool),
so none fails with "database is locked".  The saver implements the whole
``BaseCheckpointSaver`` interface, sync and async (``aput``, ``alist``...; they
run in a small thread pool of the saver's, so the event loop never waits on
the lock), including ``delete_for_runs``, ``copy_thread`` and ``prune``.

What is stored how (see ``fleetstore.domain.langgraph``): the checkpoint without
its channel values, serialised by the saver's ``serde``; each channel value
once per version, shared by the checkpoints that did not change it; pending
writes per (checkpoint, task, index); metadata as JSON, which ``list(filter=)``
compares key by key.  Values of at least ``blob_threshold`` bytes (64 KiB)
become compressed blob files written before the transaction.

Past the write budget (default 60 s) a ``put`` or ``put_writes`` is spooled
and returns normally: it lands later, in order.  A read in this process of a
thread with spooled writes waits for them (up to the write budget) before it
reads, then raises ``fleetstore.errors.SpoolPending``; so a graph resumed in
the process that ran it always sees its last checkpoint.  Other processes see
a spooled checkpoint once it lands.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import os
import random
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from types import TracebackType
from typing import Any, TypeVar

from fleetstore import errors
from fleetstore.core.extras import requires
from fleetstore.domain.langgraph import (
    ChannelValue,
    Checkpoints,
    StoredCheckpoint,
    version_key,
)
from fleetstore.integrations import adopt_store, check_threads
from fleetstore.store.aio import AsyncStore, _bridge
from fleetstore.store.facade import Store

with requires("langgraph", "fleetstore's LangGraph support"):
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol

T = TypeVar("T")

#: Threads per saver for the async methods (see ``fleetstore.store.aio``).
DEFAULT_THREADS = 4
_ASYNC_PAGE = 64


class FleetstoreSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer over a fleetstore store.

    *store*: an open ``Store`` or ``AsyncStore`` (the caller closes it), or a
    path or URL as for ``fleetstore.open`` (None: ``$FLEETSTORE_URL`` or the
    default), which the saver opens with *settings* and closes in ``close()``.
    *read_wait*: seconds a read waits for this process's spooled writes to the
    thread it reads (None: the write budget), then ``SpoolPending``.
    """

    def __init__(
        self,
        store: Store | AsyncStore | str | os.PathLike[str] | None = None,
        *,
        serde: SerializerProtocol | None = None,
        threads: int = DEFAULT_THREADS,
        read_wait: float | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(serde=serde)
        check_threads(threads)
        self.store, self._owns_store = adopt_store(store, settings, "saver")
        try:
            self.checkpoints = Checkpoints(self.store, read_wait=read_wait)
        except BaseException:
            if self._owns_store:
                self.store.close()
            raise
        self._threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    # -- the sync interface ------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``, else the newest
        of the thread's namespace), with its pending writes; None if none."""
        thread, ns = _thread(config), _ns(config)
        stored = self.checkpoints.get(thread, ns, _checkpoint_id(config))
        return None if stored is None else self._tuple(stored)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first: of ``config``'s thread (None: every thread), of
        its namespace if it names one, only its ``checkpoint_id`` if it names one;
        before ``before``'s checkpoint; whose metadata has every key of *filter*
        with an equal value; at most *limit*."""
        conf = (config or {}).get("configurable") or {}
        stored = self.checkpoints.list(
            _thread(config) if config is not None else None,
            checkpoint_ns=conf.get("checkpoint_ns"),
            checkpoint_id=_checkpoint_id(config) if config is not None else None,
            before=_checkpoint_id(before) if before is not None else None,
            filter=filter,
            limit=limit,
        )
        return (self._tuple(s) for s in stored)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store *checkpoint* as the child of ``config``'s checkpoint, with the
        values of the channels in *new_versions*; returns its config (also when
        the write was spooled: it lands later, in order)."""
        thread, ns = _thread(config), _ns(config)
        body: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = body.pop("channel_values", None) or {}
        changed = [
            ChannelValue(
                channel,
                version_key(version),
                self.serde.dumps_typed(values[channel]) if channel in values else None,
            )
            for channel, version in new_versions.items()
        ]
        self.checkpoints.put(
            thread,
            ns,
            checkpoint["id"],
            parent_id=_checkpoint_id(config),
            body=self.serde.dumps_typed(body),
            # Every key the caller gave, "writes" included, as SqliteSaver and
            # InMemorySaver keep it (get_serializable_checkpoint_metadata drops it).
            metadata=get_checkpoint_metadata(config, metadata),
            channel_versions=checkpoint["channel_versions"],
            values=changed,
        )
        return {
            "configurable": {
                "thread_id": thread,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes against ``config``'s checkpoint.  Special channels
        (error, interrupt, ...) take their fixed negative index and replace an
        earlier one; other writes are kept once per (task, index)."""
        checkpoint_id = _checkpoint_id(config)
        if checkpoint_id is None:
            raise errors.InvalidInput("put_writes: the config names no checkpoint_id")
        self.checkpoints.put_writes(
            _thread(config),
            _ns(config),
            checkpoint_id,
            task_id,
            [
                (WRITES_IDX_MAP.get(channel, idx), channel, self.serde.dumps_typed(value))
                for idx, (channel, value) in enumerate(writes)
            ],
            task_path,
        )

    def delete_thread(self, thread_id: str) -> None:
        """Remove every checkpoint and write of the thread (a missing one: no-op)."""
        self.checkpoints.delete_thread(_thread_text(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Remove the checkpoints (and their writes) made by these runs."""
        self.checkpoints.delete_runs(run_ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write (whole parent chains) to another thread."""
        self.checkpoints.copy_thread(_thread_text(source_thread_id), _thread_text(target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep the newest checkpoint of each namespace, and the
        ancestors its ``DeltaChannel`` values are rebuilt from; ``delete``: all."""
        if isinstance(thread_ids, str):
            raise errors.InvalidInput("thread_ids must be a list of thread ids")
        self.checkpoints.prune([_thread_text(t) for t in thread_ids], strategy)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """``<counter>.<random>``: increasing, and unique across branches of a
        thread, so a fork never reuses the version key of a different value."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # -- the async interface: the same calls in the saver's threads ------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._run(lambda: self.get_tuple(config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = self.list(config, filter=filter, before=before, limit=limit)
        while True:
            page = await self._run(lambda: builtins.list(islice(found, _ASYNC_PAGE)))
            for item in page:
                yield item
            if len(page) < _ASYNC_PAGE:
                return

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._run(lambda: self.put(config, checkpoint, metadata, new_versions))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._run(lambda: self.put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._run(lambda: self.delete_thread(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._run(lambda: self.delete_for_runs(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._run(lambda: self.copy_thread(source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._run(lambda: self.prune(thread_ids, strategy=strategy))

    async def _run(self, fn: Callable[[], T]) -> T:
        # A call handed to a thread runs to its end even if the awaiting task is
        # cancelled (fleetstore.store.aio): a write then lands whole or not at all.
        return await _bridge(self._pool().submit(fn))

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._closed:
                raise errors.StoreClosed("the checkpoint saver was closed")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    self._threads, thread_name_prefix="fleetstore-langgraph"
                )
            return self._executor

    # -- converting and closing ---------------------------------------------------------------

    def _tuple(self, stored: StoredCheckpoint) -> CheckpointTuple:
        loads = self.serde.loads_typed
        checkpoint = loads(stored.body)
        checkpoint["channel_values"] = {k: loads(v) for k, v in stored.values.items()}
        where = {"thread_id": stored.thread_id, "checkpoint_ns": stored.checkpoint_ns}
        return CheckpointTuple(
            config={"configurable": {**where, "checkpoint_id": stored.checkpoint_id}},
            checkpoint=checkpoint,
            metadata=stored.metadata,  # type: ignore[arg-type]
            parent_config=(
                {"configurable": {**where, "checkpoint_id": stored.parent_id}}
                if stored.parent_id
                else None
            ),
            pending_writes=[(w.task_id, w.channel, loads(w.value)) for w in stored.writes],
        )

    def close(self) -> None:
        """Wait for the async calls in flight, then close the store if the saver
        opened it.  Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            executor = self._executor
        if executor is not None:
            executor.shutdown(wait=True)
        if self._owns_store:
            self.store.close()

    async def aclose(self) -> None:
        """``close`` without blocking the event loop."""
        job: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            try:
                self.close()
            except BaseException as exc:
                job.set_exception(exc)
            else:
                job.set_result(None)

        threading.Thread(target=run, name="fleetstore-langgraph-close", daemon=True).start()
        await _bridge(job)

    def __enter__(self) -> FleetstoreSaver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> FleetstoreSaver:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<FleetstoreSaver {str(self.store.path)!r}{' closed' if self._closed else ''}>"


def _thread_text(value: object) -> str:
    # LangGraph accepts ints and UUIDs as thread ids; they are stored as text.
    if isinstance(value, str):
        return value
    if isinstance(value, int | uuid.UUID) and not isinstance(value, bool):
        return str(value)
    raise errors.InvalidInput(f"a thread_id is a string, not {type(value).__name__}")


def _thread(config: RunnableConfig) -> str:
    conf = config.get("configurable") or {}
    if conf.get("thread_id") is None:
        raise errors.InvalidInput(
            "the config names no thread_id: pass "
            '{"configurable": {"thread_id": ...}} to invoke/stream/get_state'
        )
    return _thread_text(conf["thread_id"])


def _checkpoint_id(config: RunnableConfig) -> str | None:
    """The config's ``checkpoint_id``; an empty one is none, as InMemorySaver and
    SqliteSaver take it (graphs built by some tools pass ``""``)."""
    cid = (config.get("configurable") or {}).get("checkpoint_id")
    return None if cid == "" else cid


def _ns(config: RunnableConfig) -> str:
    ns = (config.get("configurable") or {}).get("checkpoint_ns") or ""
    if not isinstance(ns, str):
        raise errors.InvalidInput(f"checkpoint_ns is a string, not {type(ns).__name__}")
    return ns


__all__ = ["DEFAULT_THREADS", "FleetstoreSaver"]
