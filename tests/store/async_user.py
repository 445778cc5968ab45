"""A user's typed code against the async API: what ``mypy --strict`` must see.

``tests/store/test_async.py::test_a_users_code_sees_the_async_types`` runs mypy on
this file and then runs ``main``.  Each ``assert_type`` fails mypy if the async API's
types drift from the sync API's (a member typed ``Any``, a ``Stream`` where an
``AsyncStream`` is returned); each ``type: ignore[...]`` in ``misuse`` must still be
needed (``--strict`` warns about unused ones), so a call mypy stopped checking fails.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, assert_type

import fleetstore
from fleetstore import (
    AsyncClaim,
    AsyncStore,
    AsyncStream,
    AsyncToolCallHandle,
    Effect,
    Message,
    Session,
    StateValue,
    ToolCall,
    Usage,
)
from fleetstore.models import Page, SearchHit, SearchStatus


async def main(path: Path) -> list[str]:
    """Every kind of member once; returns what it saw, for the test."""
    seen: list[str] = []
    async with await fleetstore.open_async(path) as store:
        assert_type(store, AsyncStore)
        assert_type(store.path, Path)
        s = assert_type(await store.sessions.create(title="t", project="/p"), Session)
        assert_type(await store.sessions.list(project="/p"), Page[Session, str])
        assert_type(await store.sessions.usage(s.id), Usage)
        m = assert_type(await store.messages.append(s.id, "user", "hello"), Message)
        assert_type(await store.messages.list(s.id, last=1), list[Message])
        async with store.messages.stream(s.id, model="m-1") as reply:
            assert_type(reply, AsyncStream)
            assert_type(reply.id, str)
            assert_type(reply.model, str | None)
            await reply.text("hi ")
            call = assert_type(await reply.tool_call("bash", {"cmd": "ls"}), AsyncToolCallHandle)
            assert_type(call.call, ToolCall)
            await call.result("ok")
            assert_type(reply.due(), float | None)
            assert_type(reply.usage(input_tokens=3), None)
        iterated = store.messages.iterate(s.id, page=10)
        assert_type(iterated, AsyncIterator[Message])
        seen += [f"{x.seq} {x.role}" async for x in iterated]
        value = await store.state.put(s.id, "k", {"v": 1})
        assert_type(value, StateValue)
        assert_type(await store.state.get(s.id, "k"), StateValue | None)
        assert_type(await store.effects.enqueue("thread", "kind", {"n": 1}), str)
        claims = assert_type(await store.effects.claim("worker", kinds=["kind"]), list[AsyncClaim])
        for claim in claims:
            assert_type(claim.effect, Effect)
            assert_type(await claim.succeed("done"), bool)
            seen.append(f"claim {claim.settled}")
        count = assert_type(await store.read(lambda tx: len(tx.execute("SELECT 1"))), int)
        seen.append(f"read {count}")
        assert_type(await store.search("hello"), Page[SearchHit, str])
        assert_type(await store.search.status(), SearchStatus)
        assert_type(store.metrics(), dict[str, Any])
        assert_type(store.histograms(), dict[str, Any])
        assert_type(await store.flush(), bool)
        seen.append(f"first {m.text}")
    return seen


async def misuse(store: AsyncStore, session: Session) -> None:
    """Never run: each line is an error mypy must report."""
    await store.messages.append(session.id, "user", "x", modle="m")  # type: ignore[call-arg]
    await store.sessions.get(5)  # type: ignore[arg-type]
    print(store.messages.append(session.id, "user", "x").seq)  # type: ignore[attr-defined]
    await store.metrics()  # type: ignore[misc]
    await store.histograms()  # type: ignore[misc]
    await store.messages.stream(session.id)  # type: ignore[misc]
    with store.messages.stream(session.id):  # type: ignore[attr-defined]
        pass
    for _ in store.messages.iterate(session.id):  # type: ignore[attr-defined]
        pass
    (await store.effects.claim("w"))[0].succeed().bit_length()  # type: ignore[attr-defined]
    print((await store.sessions.create()).no_such)  # type: ignore[attr-defined]
    await store.search("q", limt=3)  # type: ignore[call-arg]
    await store.read(lambda t: t.no_such())  # type: ignore[attr-defined]
