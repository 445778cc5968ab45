"""``fleetstore.open_async()``: the same API as coroutines (issue 3, "async facade").

Plain pytest tests that run their own loop with ``asyncio.run``.  The outside lock
holder is a separate process (``python -m fleetstore lock``); it holds for long and is
released by SIGTERM once the test has seen what it needs, so no assertion depends on
how fast the machine is: a loop blocked by a waiting writer shows as ticks missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore import (
    AsyncStore,
    AsyncStream,
    AsyncToolCallHandle,
    Claim,
    Effects,
    InvalidInput,
    Messages,
    MessageStatus,
    NotFound,
    Part,
    Reasoning,
    Search,
    Sessions,
    State,
    Store,
    Stream,
    Text,
    ToolCall,
    ToolCallHandle,
    ToolResult,
    Usage,
    VersionConflict,
)
from fleetstore.errors import ConfigError, StoreBusy, StoreClosed
from fleetstore.store import aio
from fleetstore.store.forward import Twin
from tests.fix_procs import Proc, Spawn, start_lock
from tests.store import async_user

# The outside holder's --hold: an upper bound only.  Tests release it with SIGTERM as
# soon as they have seen enough; a loop that blocked would wait this long and then fail.
HOLD = 20.0
TICK = 0.01
# Ticks the loop must make while a write is pending: ~100 ms of a free loop; a loop
# blocked by the write makes none.
MIN_TICKS = 30


class Ticker:
    """A coroutine that records when it runs: proof the event loop is not blocked."""

    def __init__(self) -> None:
        self.ticks: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.ticks.append(time.monotonic())
            await asyncio.sleep(TICK)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def between(self, start: float, end: float) -> int:
        return sum(start < t < end for t in self.ticks)

    async def until(self, count: int, since: float, pending: asyncio.Task[Any]) -> None:
        """Wait until *count* ticks came after *since*, asserting *pending* stays pending."""
        while self.between(since, time.monotonic()) < count:
            assert not pending.done(), (
                "done before the lock was released by us: it did not wait for the lock, "
                "or it blocked the loop until the holder's --hold ran out"
            )
            await asyncio.sleep(TICK)


async def hold_lock(spawn: Spawn, path: str) -> Proc:
    proc, _ = await asyncio.to_thread(start_lock, spawn, path, HOLD)
    return proc


def release(proc: Proc) -> float:
    released = time.monotonic()
    proc.popen.send_signal(signal.SIGTERM)
    return released


async def finished(proc: Proc) -> None:
    _, line = await asyncio.to_thread(proc.wait_line, "released", 30)
    held = float(line.rsplit("after ", 1)[1].rstrip("s"))
    assert held < HOLD - 1, f"the holder ran out its --hold ({line!r}): not released by us"
    assert await asyncio.to_thread(proc.finish, 10) == 0, proc.stderr_tail()


@contextlib.contextmanager
def sync_store(path: str) -> Iterator[Store]:
    store = fleetstore.open(path)
    try:
        yield store
    finally:
        store.close()


# -- the example in the module docstring ---------------------------------------------------


def test_module_docstring_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    doc = aio.__doc__
    assert doc is not None
    code = textwrap.dedent(doc.split("::\n", 1)[1].split("\nCancellation", 1)[0])
    exec(compile(code, "fleetstore.store.aio docstring", "exec"), {"__name__": "example"})
    assert capsys.readouterr().out.splitlines() == [
        "1 user complete 'why does it flake?'",
        "2 assistant complete 'Let me run it. '",
    ]


# -- the API mirror --------------------------------------------------------------------------


def test_round_trip_through_every_part_of_the_api(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    big = os.urandom(64) * 2048  # 128 KiB: over blob_threshold, written as a blob file

    async def main() -> None:
        async with await fleetstore.open_async(path, stream_flush_interval=30) as store:
            assert isinstance(store, AsyncStore)
            s = await store.sessions.create(title="t", project="/p", metadata={"k": 1})
            assert (await store.sessions.get(s.id)) == s
            sub = await store.sessions.create(parent_id=s.id, title="sub")
            assert sub.root_id == s.id
            assert [c.id for c in await store.sessions.children(s.id)] == [sub.id]

            first = await store.messages.append(s.id, "user", "hello", usage=Usage(3, 0))
            assert first.seq == 1
            assert (await store.messages.append(s.id, "user", "hello", id=first.id)).seq == 1

            stream = store.messages.stream(s.id, model="m-1")
            assert isinstance(stream, AsyncStream)
            async with stream as reply:
                await reply.flush()  # the message row: a stream writes it with its first flush
                assert (await store.messages.get(reply.id)).status is MessageStatus.streaming
                for _ in range(100):
                    await reply.text("ab")
                await reply.reasoning("thinking")
                call = await reply.tool_call("bash", {"cmd": "ls"}, call_id="c1")
                assert isinstance(call, AsyncToolCallHandle)
                assert call.call_id == "c1" and call.call == ToolCall("bash", {"cmd": "ls"}, "c1")
                await call.result(big)
                await reply.add(Text("done"))
                reply.usage(input_tokens=10, output_tokens=4)
                assert reply.due() is not None  # the text and parts wait for the end
            # 200 deltas, the parts and the end: one transaction (the timed flush is 30 s
            # away).
            assert reply.flushes == 1

            messages = await store.messages.list(s.id)
            assert [m.seq for m in messages] == [1, 2]
            got = messages[1]
            assert got.id == reply.id and got.status is MessageStatus.complete
            assert got.parts == (
                Text("ab" * 100),
                Reasoning("thinking"),
                ToolCall("bash", {"cmd": "ls"}, "c1"),
                ToolResult("c1", big, False, "bash"),
                Text("done"),
            )
            assert got.usage is not None and got.usage.output_tokens == 4
            assert [m.id for m in await store.messages.list(s.id, last=1)] == [reply.id]
            assert (await store.sessions.usage(s.id)).input_tokens == 13

            v1 = await store.state.put(s.id, "plan", {"step": 1})
            v2 = await store.state.put(s.id, "plan", {"step": 2}, expected_version=v1.version)
            assert v2.version == 2
            current = await store.state.get(s.id, "plan")
            assert current is not None and current.value == {"step": 2}
            assert await store.state.keys(s.id) == ["plan"]
            assert await store.state.delete(s.id, "plan", expected_version=2) is True
            assert await store.state.get(s.id, "plan") is None

            fork = await store.sessions.fork(s.id, at_message_id=first.id, title="f")
            assert [m.text for m in await store.messages.list(fork.id)] == ["hello"]
            updated = await store.sessions.update(s.id, title="t2", expected_version=s.version)
            assert updated.title == "t2"
            assert (await store.sessions.archive(fork.id)).archived_at is not None
            assert {x.id for x in await store.sessions.list()} == {s.id, sub.id}
            await store.sessions.delete(sub.id)
            assert await store.flush() is True
            assert await store.recover() == []
            ops = store.metrics()["operations"]
            # Two whole messages; the stream: its explicit flush and its end.
            assert (ops["append_message"], ops["stream_write"]) == (2, 2)

        # What the coroutines wrote is what the sync API reads.
        with sync_store(path) as sync:
            assert [m.parts for m in sync.messages.list(s.id)] == [m.parts for m in messages]
            assert sync.sessions.get(s.id).title == "t2"

    asyncio.run(main())


def test_errors_propagate_with_their_types_and_nothing_is_written(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")

    async def main() -> None:
        store = await fleetstore.open_async(path)
        s = await store.sessions.create()
        with pytest.raises(NotFound):
            await store.sessions.get("missing")
        with pytest.raises(NotFound):
            await store.messages.list("missing")
        with pytest.raises(InvalidInput):
            await store.messages.append(s.id, "user", [object()])  # type: ignore[list-item]
        with pytest.raises(InvalidInput):
            await store.messages.append("no/such id", "user", "x")
        with pytest.raises(InvalidInput):
            store.messages.stream(s.id, id="bad/id")
        await store.state.put(s.id, "k", 1)
        with pytest.raises(VersionConflict):
            await store.state.put(s.id, "k", 2, expected_version=7)
        with pytest.raises(VersionConflict):
            await store.sessions.update(s.id, title="x", expected_version=99)
        async with store.messages.stream(s.id) as reply:
            with pytest.raises(InvalidInput):
                await reply.text(b"bytes")  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):
            await reply.text("after the block")

        assert [m.id for m in await store.messages.list(s.id)] == [reply.id]
        value = await store.state.get(s.id, "k")
        assert value is not None and (value.value, value.version) == (1, 1)
        assert (await store.sessions.get(s.id)).title is None

        await store.close()
        await store.close()  # idempotent
        with pytest.raises(StoreClosed):
            await store.sessions.create()
        with pytest.raises(ConfigError):
            await fleetstore.open_async(path, threads=0)
        # An open sync Store can be wrapped; the wrapper then owns (and closes) it.
        sync = fleetstore.open(path)
        with pytest.raises(ConfigError):
            AsyncStore(sync, threads=True)
        wrapped = AsyncStore(sync, threads=1)
        assert [m.id for m in await wrapped.messages.list(s.id)] == [reply.id]
        await wrapped.close()
        assert "closed" in repr(wrapped.sync)
        with pytest.raises(ConfigError):
            await fleetstore.open_async(path, on_busy="never")

    asyncio.run(main())


# Store members that are hooks between the Store and its own domain objects (the
# domain's StorePort, fleetstore/domain/ports.py), not calls for users.
STORE_INTERNALS = {
    "check_visible",
    "streams_opened",
    "streams_closed",
    "notifies",
    "spans_files",
    "notify_wait",
    "notify_token",
    "listen",
    "spool_pending",
    "finish_jobs",
    "search_files",
    "with_file",
}


def twins() -> list[type[Twin[Any]]]:
    """Every async twin class, found from the mechanism (not listed by hand)."""
    found = [cls for cls in vars(aio).values() if isinstance(cls, type) and issubclass(cls, Twin)]
    return [cls for cls in found if "sync_type" in vars(cls)]


def test_every_public_sync_member_has_its_async_form(tmp_path: Path) -> None:
    """What the forwarding needs checked: a member added to the sync API without its
    declaration in store/aio.py is missing from the async API (its parameters, types
    and docs cannot drift: they are the sync member's; a declaration naming another
    member fails at import)."""
    found = {cls.sync_type: cls for cls in twins()}
    assert set(found) >= {
        Store,
        Sessions,
        Messages,
        State,
        Effects,
        Claim,
        Stream,
        ToolCallHandle,
        Search,
    }
    for sync_cls, twin in found.items():
        public = {
            name
            for name in dir(sync_cls)
            if not name.startswith("_") and not (sync_cls is Store and name in STORE_INTERNALS)
        }
        if "__call__" in vars(sync_cls):
            public.add("__call__")
        missing = public - set(twin.forwarded)
        assert not missing, f"{twin.__name__} lacks {sorted(missing)}"
        for name, kind in twin.forwarded.items():
            member = inspect.getattr_static(twin, name)
            if kind == "attribute":
                assert isinstance(member, property)
            else:
                assert inspect.iscoroutinefunction(member) is (kind != "plain"), name
        for sync_name, async_name in (("__enter__", "__aenter__"), ("__exit__", "__aexit__")):
            if hasattr(sync_cls, sync_name):
                assert inspect.iscoroutinefunction(getattr(twin, async_name)), twin

    # The parts of a live store (and its instance attributes: Claim.owner...) have
    # theirs too, each wrapping the very sync object.
    async def main() -> None:
        async with await fleetstore.open_async(tmp_path / "s.db") as store:
            for name, value in vars(store.sync).items():
                if type(value) in found:
                    part = getattr(store, name)
                    assert type(part) is found[type(value)] and part.sync is value, name
            await store.effects.enqueue("t", "k")
            (claim,) = await store.effects.claim("w")
            stream = store.messages.stream((await store.sessions.create()).id)
            for twin in (claim, stream):
                public = {n for n in vars(twin.sync) if not n.startswith("_")}
                assert public <= set(type(twin).forwarded), type(twin)
                for name in public:
                    assert getattr(twin, name) == getattr(twin.sync, name), name
            await claim.release()

    asyncio.run(main())


def test_a_users_code_sees_the_async_types(tmp_path: Path) -> None:
    """``mypy --strict`` on a user's program (tests/store/async_user.py): each
    ``assert_type`` holds and each misuse is reported; then the program runs."""
    user = Path(async_user.__file__)
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, MYPYPATH=str(root / "src"))  # this checkout's fleetstore
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", str(user)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert asyncio.run(async_user.main(tmp_path / "s.db")) == [
        "1 user",
        "2 assistant",
        "claim succeeded",
        "read 1",
        "first hello",
    ]


def test_open_async_takes_the_parameters_of_open_plus_threads() -> None:
    params = dict(inspect.signature(fleetstore.open_async).parameters)
    threads = params.pop("threads")
    assert threads.kind is inspect.Parameter.KEYWORD_ONLY
    assert list(params.values()) == list(inspect.signature(fleetstore.open).parameters.values())


# -- the event loop never waits on the lock ------------------------------------------------


def test_event_loop_keeps_running_while_an_append_waits_for_the_lock(
    tmp_path: Path, spawn: Spawn
) -> None:
    path = str(tmp_path / "s.db")

    async def main() -> None:
        async with await fleetstore.open_async(path) as store:
            s = await store.sessions.create()
            holder = await hold_lock(spawn, path)
            ticker = Ticker()
            ticker.start()
            times: dict[str, float] = {}

            async def append() -> fleetstore.Message:
                times["start"] = time.monotonic()
                message = await store.messages.append(s.id, "user", "written after the lock")
                times["end"] = time.monotonic()
                return message

            task = asyncio.create_task(append())
            await asyncio.sleep(0)
            await ticker.until(MIN_TICKS * 2, since=times["start"], pending=task)
            released = release(holder)
            message = await task
            await ticker.stop()
            await finished(holder)

            assert times["end"] > released, "the append completed before the lock was released"
            during = ticker.between(times["start"], times["end"])
            assert during >= MIN_TICKS, f"only {during} ticks while the append waited"
            assert (await store.messages.get(message.id)).text == "written after the lock"
            assert store.metrics()["lock_wait"]["count"] >= 2

    asyncio.run(main())


def test_a_delta_that_fills_the_buffer_flushes_off_the_loop(tmp_path: Path, spawn: Spawn) -> None:
    path = str(tmp_path / "s.db")
    size = 1024

    async def main() -> None:
        # (Redaction off: it holds back a last "x", which may begin a Slack token;
        # tests/store/test_redaction.py tests what a stream holds back.)
        store = await fleetstore.open_async(path, stream_flush_bytes=size, redaction=False)
        s = await store.sessions.create()
        async with store.messages.stream(s.id) as reply:
            holder = await hold_lock(spawn, path)
            ticker = Ticker()
            ticker.start()
            # A delta that does not fill the buffer only buffers: done at once.
            await reply.text("a")
            start = time.monotonic()
            big = asyncio.create_task(reply.text("x" * size))
            await ticker.until(MIN_TICKS * 2, since=start, pending=big)
            released = release(holder)
            await big
            end = time.monotonic()
            await ticker.stop()
            await finished(holder)
            assert end > released
            assert ticker.between(start, end) >= MIN_TICKS
            # Flushed by size, before the stream ended.
            assert reply.flushes >= 1
            mid = await store.messages.get(reply.id)
            assert mid.status is MessageStatus.streaming and mid.text == "a" + "x" * size
        assert (await store.messages.get(reply.id)).status is MessageStatus.complete
        await store.close()

    asyncio.run(main())


def test_store_busy_reaches_the_awaiting_coroutine(tmp_path: Path, spawn: Spawn) -> None:
    path = str(tmp_path / "s.db")

    async def main() -> None:
        store = await fleetstore.open_async(path, write_budget=0.3, on_busy="raise")
        s = await store.sessions.create()
        holder = await hold_lock(spawn, path)
        ticker = Ticker()
        ticker.start()
        with pytest.raises(StoreBusy):
            await store.messages.append(s.id, "user", "refused")
        await ticker.stop()
        release(holder)
        await finished(holder)
        assert await store.messages.list(s.id) == []
        await store.close()

    asyncio.run(main())


# -- cancellation ----------------------------------------------------------------------------


def test_cancelled_appends_still_run_whole_even_when_queued(tmp_path: Path, spawn: Spawn) -> None:
    path = str(tmp_path / "s.db")
    big = os.urandom(64) * 4096  # 256 KiB: a blob file, then the transaction
    parts: list[Part] = [Text("before"), ToolResult("c1", big, False, "bash"), Text("after")]

    async def main() -> None:
        # One thread: the second append is still queued when it is cancelled.
        store = await fleetstore.open_async(path, threads=1)
        s = await store.sessions.create()
        holder = await hold_lock(spawn, path)
        ticker = Ticker()
        ticker.start()
        running = asyncio.create_task(store.messages.append(s.id, "tool", parts, id="m-running"))
        queued = asyncio.create_task(store.messages.append(s.id, "user", "next", id="m-queued"))
        await ticker.until(MIN_TICKS, since=time.monotonic(), pending=running)
        running.cancel()
        queued.cancel()
        for task in (running, queued):
            with pytest.raises(asyncio.CancelledError):
                await task
        release(holder)
        await finished(holder)
        await ticker.stop()
        # flush() waits for the calls started before it, cancelled ones included.
        assert await store.flush() is True
        messages = await store.messages.list(s.id)
        await store.close()
        # Each cancelled append is one operation: whole (it ran to its end), never in part.
        assert [m.id for m in messages] == ["m-running", "m-queued"]
        assert messages[0].parts == tuple(parts)
        assert messages[1].text == "next"

    asyncio.run(main())


def test_close_waits_for_a_cancelled_append(tmp_path: Path, spawn: Spawn) -> None:
    path = str(tmp_path / "s.db")
    big = os.urandom(64) * 4096
    parts: list[Part] = [Text("before"), ToolResult("c1", big, False, "bash"), Text("after")]
    session: list[str] = []

    async def main() -> None:
        # Two threads: close() runs on the free one while the append waits on the other.
        store = await fleetstore.open_async(path, threads=2)
        s = await store.sessions.create()
        session.append(s.id)
        holder = await hold_lock(spawn, path)
        ticker = Ticker()
        ticker.start()
        append = asyncio.create_task(store.messages.append(s.id, "tool", parts, id="m-1"))
        await ticker.until(MIN_TICKS, since=time.monotonic(), pending=append)
        append.cancel()
        with pytest.raises(asyncio.CancelledError):
            await append
        closing = asyncio.create_task(store.close())
        await ticker.until(MIN_TICKS, since=time.monotonic(), pending=closing)
        released = release(holder)
        await closing
        closed = time.monotonic()
        await ticker.stop()
        await finished(holder)
        assert closed > released, "close() returned while a cancelled append still waited"
        with pytest.raises(StoreClosed):
            await store.messages.list(s.id)

    asyncio.run(main())
    with sync_store(path) as sync:
        messages = sync.messages.list(session[0])
    assert [m.parts for m in messages] == [tuple(parts)]


def test_a_cancelled_stream_block_marks_its_message_error(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")

    async def main() -> None:
        store = await fleetstore.open_async(path)
        s = await store.sessions.create()
        opened = asyncio.Event()
        ids: list[str] = []

        async def agent() -> None:
            async with store.messages.stream(s.id) as reply:
                ids.append(reply.id)
                await reply.text("partial ")
                opened.set()
                await asyncio.sleep(60)

        task = asyncio.create_task(agent())
        await opened.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        message = await store.messages.get(ids[0])
        assert message.status is MessageStatus.error
        assert message.error is not None and message.error.startswith("CancelledError")
        assert message.text == "partial "
        await store.close()

    asyncio.run(main())


def test_calls_on_one_stream_keep_their_order(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    size = 4096
    big = os.urandom(4 << 20)  # incompressible: its blob takes a while to write

    async def main() -> None:
        store = await fleetstore.open_async(path, stream_flush_bytes=size)
        s = await store.sessions.create()
        async with store.messages.stream(s.id) as reply:
            # The first delta fills the buffer (a flush in a thread); the small ones
            # after it, made meanwhile by other coroutines, must not overtake it.
            await asyncio.gather(
                reply.text("x" * size),
                reply.text("b"),
                reply.tool_call("t", call_id="c"),
                reply.text("c"),
            )
            # A result's blob is written outside the sync stream's lock (Stream.add),
            # so a delta run beside it, in another thread, would land before it.
            call = await reply.tool_call("u", call_id="d")
            await asyncio.gather(call.result(big), reply.text("after"))
        message = await store.messages.get(reply.id)
        assert message.parts == (
            Text("x" * size + "b"),
            ToolCall("t", None, "c"),
            Text("c"),
            ToolCall("u", None, "d"),
            ToolResult("d", big, False, "u"),
            Text("after"),
        )
        await store.close()

    asyncio.run(main())


def fds_on(path: str) -> list[str]:
    """The files under *path* (the database, -wal, -shm, .gate) this process holds open."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(path):
                found.append(target)
    return found


def test_cancelled_open_closes_the_store_it_opened(tmp_path: Path, spawn: Spawn) -> None:
    path = str(tmp_path / "s.db")
    Path(path).touch(mode=0o600)  # an empty file: opening it must wait for the lock to migrate

    async def main() -> None:
        holder = await hold_lock(spawn, path)
        ticker = Ticker()
        ticker.start()
        opening = asyncio.create_task(fleetstore.open_async(path))
        await ticker.until(MIN_TICKS, since=time.monotonic(), pending=opening)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        release(holder)
        await finished(holder)
        await ticker.stop()

    asyncio.run(main())
    # The open ran on to its end in its thread, then what it opened was closed.
    deadline = time.monotonic() + 30
    while True:
        with fleetstore.Database.open(path) as db:
            migrated = db.schema_version > 0
        if migrated and not fds_on(path):
            break
        assert time.monotonic() < deadline, f"still open after the cancelled open: {fds_on(path)}"
        time.sleep(0.02)
