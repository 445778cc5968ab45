"""What the OpenAI Agents SDK's own tests found (docs/integrations-openai-agents.md,
"Where it differs"): ``FleetstoreSession`` against the SDK's compaction and
encryption wrappers, and the error classes the SDK documents.

* compaction (``OpenAIResponsesCompactionSession``) uses fleetstore's hooks: the
  replacement is one operation, one transaction, refused if the session changed
  since it was read, so an item appended meanwhile, by this process or another, is
  kept; rows the compaction cannot read stay;
* ``EncryptedSession`` (fleetstore's subclass) authenticates before it pops;
* a closed session, a non-JSON item and unknown ``session_settings`` raise classes
  that are both fleetstore's and the SDK's (``RuntimeError``, ``TypeError``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import AsyncMock, MagicMock

import pytest
from agents.extensions.memory.encrypt_session import EncryptedSession as SdkEncryptedSession
from agents.memory import OpenAIResponsesCompactionSession
from agents.testing import ScriptedModel
from cryptography.fernet import InvalidToken
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

import fleetstore
from agents import Agent, RunConfig, Runner, set_tracing_disabled
from fleetstore import errors
from fleetstore.domain import openai_agents as agents_ops
from fleetstore.integrations.openai_agents import (
    CompactionConflict,
    FleetstoreSession,
    InvalidItem,
    InvalidSessionSettings,
    SessionClosed,
)
from fleetstore.integrations.openai_agents.encrypted import EncryptedSession
from tests.agents import script
from tests.fix_procs import Barrier, Proc
from tests.fix_stores import OpenStore

set_tracing_disabled(True)

APPENDER = script("agents_compaction_agent.py")


def reply(text: str = "done") -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=f"msg_{text}",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(text=text, type="output_text", annotations=[])],
    )


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def compact_client(compact: Any) -> Any:
    client = MagicMock()
    client.responses.compact = AsyncMock(side_effect=compact)
    return client


# -- errors the SDK documents ----------------------------------------------------------------


def test_errors_are_the_sdks_classes_too(tmp_path: Path) -> None:
    """A closed session raised StoreClosed (the SDK: RuntimeError), a non-JSON item
    InvalidInput (TypeError), unknown session_settings ConfigError (TypeError)."""

    async def go() -> None:
        with fleetstore.open(tmp_path / "errors.db") as store:
            session = FleetstoreSession("s", store)
            with pytest.raises(TypeError) as item:
                await session.add_items([{"role": "user", "content": object()}])  # type: ignore[list-item]
            assert isinstance(item.value, InvalidItem)
            assert isinstance(item.value, errors.InvalidInput)
            assert agents_ops.stored_message_ids(store, "s") == []
            session.close()
            for call in (session.add_items([]), session.get_items(), session.pop_item()):
                with pytest.raises(RuntimeError, match="is closed") as closed:
                    await call
                assert isinstance(closed.value, SessionClosed)
                assert isinstance(closed.value, errors.StoreClosed)
            with pytest.raises(TypeError, match="Unknown session settings: limitt") as bad:
                FleetstoreSession("s", store, session_settings={"limitt": 1})
            assert isinstance(bad.value, InvalidSessionSettings)
            assert isinstance(bad.value, errors.ConfigError)

    asyncio.run(go())


# -- compaction ------------------------------------------------------------------------------


def test_an_item_appended_while_compacting_is_kept(open_store: OpenStore) -> None:
    """As the SDK's ``test_new_backend_write_invalidates_snapshot``: another writer
    (another store object, as another process) appends while the compaction request
    is out; the compaction must not replace history that no longer ends where it read.
    On each engine."""
    store, other_store = open_store("race.db"), open_store("race.db")

    async def go() -> list[Any]:
        backend = FleetstoreSession("s", store)
        other = FleetstoreSession("s", other_store)
        original = [user(str(i)) for i in range(4)]
        await backend.add_items(original)
        newer = user("concurrent backend append")

        async def compact(**kwargs: Any) -> Any:
            await other.add_items([newer])
            return SimpleNamespace(output=[])

        session = OpenAIResponsesCompactionSession(
            "s",
            backend,
            client=compact_client(compact),
            compaction_mode="input",
            should_trigger_compaction=lambda _: True,
        )
        await Runner.run(
            Agent(name="worker", model=ScriptedModel(steps=[[reply()]])),
            "continue",
            session=session,
            run_config=RunConfig(session_settings={"limit": 1}),
        )
        got = await backend.get_items(limit=100)
        assert got == [
            *original,
            user("continue"),
            reply().model_dump(exclude_unset=True),
            newer,
        ]
        # A manual compaction (the whole history) refuses as well, and says so.
        manual = OpenAIResponsesCompactionSession(
            "s", backend, client=compact_client(compact), compaction_mode="input"
        )
        with pytest.raises(CompactionConflict):
            await manual.run_compaction({"force": True})
        assert await backend.get_items() == [*got, newer]
        # So does one through an EncryptedSession (the SDK would clear, then add).
        await backend.clear_session()
        encrypted = EncryptedSession("s", backend, encryption_key="synthetic-key")
        await encrypted.add_items(original)
        manual = OpenAIResponsesCompactionSession(
            "s", encrypted, client=compact_client(compact), compaction_mode="input"
        )
        with pytest.raises(CompactionConflict):
            await manual.run_compaction({"force": True})
        assert await encrypted.get_items() == original
        assert (await backend.get_items())[-1] == newer
        backend.close()
        other.close()
        return got

    asyncio.run(go())


def test_rows_the_compaction_cannot_read_are_retained(tmp_path: Path) -> None:
    """As the SDK's ``test_unverifiable_rows_inside_snapshot_are_retained``: an item
    encrypted under another key stays, with everything before it."""

    async def go() -> None:
        with fleetstore.open(tmp_path / "keys.db") as store:
            backend = FleetstoreSession("s", store)
            client = compact_client(lambda **kw: SimpleNamespace(output=[]))
            session = OpenAIResponsesCompactionSession(
                "s",
                SdkEncryptedSession("s", backend, encryption_key="synthetic-key"),
                client=client,
                should_trigger_compaction=lambda _: True,
            )
            await session.add_items([user("earlier visible history")])
            other = SdkEncryptedSession("s", backend, encryption_key="other-synthetic-key")
            await other.add_items([user("retained under another key")])
            retained = await backend.get_items(limit=100)
            await Runner.run(
                Agent(name="worker", model=ScriptedModel(steps=[[reply()]])),
                "continue",
                session=session,
            )
            client.responses.compact.assert_awaited_once()
            assert client.responses.compact.call_args.kwargs["input"] == [
                user("continue"),
                reply().model_dump(exclude_unset=True),
            ]
            assert await backend.get_items(limit=100) == retained
            backend.close()

    asyncio.run(go())


def test_encrypted_pop_of_an_item_it_cannot_authenticate_removes_nothing(
    tmp_path: Path,
) -> None:
    """The SDK's EncryptedSession authenticates inside the pop only over its own
    SQLiteSession; over another session it pops, then drops what it cannot read."""

    async def go() -> None:
        with fleetstore.open(tmp_path / "pop.db") as store:
            backend = FleetstoreSession("s", store)
            mine = EncryptedSession("s", backend, encryption_key="synthetic-key")
            other = EncryptedSession("s", backend, encryption_key="other-synthetic-key")
            await mine.add_items([user("mine")])
            await other.add_items([user("someone else's")])
            stored = await backend.get_items()
            with pytest.raises(InvalidToken):
                await mine.pop_item()
            assert await backend.get_items() == stored  # nothing removed
            assert await other.pop_item() == user("someone else's")
            assert await mine.pop_item() == user("mine")
            assert await mine.pop_item() is None
            # What the SDK's own class does over fleetstore (why the subclass exists).
            await other.add_items([user("lost")])
            sdk = SdkEncryptedSession("s", backend, encryption_key="synthetic-key")
            assert await sdk.pop_item() is None
            assert await backend.get_items() == []
            backend.close()

    asyncio.run(go())


def _covered(items: list[Any]) -> list[str]:
    """The user texts a history holds, its compaction summaries opened (each fake
    summary lists the texts it replaced)."""
    out: list[str] = []
    for item in items:
        if item.get("type") == "compaction":
            out.extend(json.loads(item["encrypted_content"]))
        elif item.get("role") == "user" and isinstance(item.get("content"), str):
            out.append(item["content"])
    return out


@pytest.mark.fleet
@pytest.mark.timeout(180)
def test_appends_of_other_processes_racing_compactions_are_never_lost(tmp_path: Path) -> None:
    """Four processes append to one SDK session while this one compacts it over and
    over, manually (the whole history) and through the Runner (a suffix): every
    appended item is afterwards in the history exactly once, raw or inside the
    summary of a compaction that read it."""
    path = str(tmp_path / "fleet.db")
    fleetstore.open(path).close()
    appenders, count = 4, 40
    barrier = Barrier(tmp_path / "start.barrier")
    procs = [
        Proc(
            [
                sys.executable,
                APPENDER,
                path,
                "--session",
                "shared",
                "--tag",
                f"p{k}",
                "--count",
                str(count),
                "--barrier",
                barrier.path,
            ],
            f"appender {k}",
        )
        for k in range(appenders)
    ]
    numbers = itertools.count()
    replaced = {"manual": 0, "refused": 0, "runner": 0}

    async def compact(**kwargs: Any) -> Any:
        await asyncio.sleep(0.03)  # the request is out: the others append meanwhile
        summary = {
            "type": "compaction",
            "id": f"cmp_{next(numbers)}",
            "encrypted_content": json.dumps(_covered(kwargs["input"])),
        }
        return SimpleNamespace(output=[summary])

    async def go() -> list[Any]:
        with fleetstore.open(path) as store:
            backend = FleetstoreSession("shared", store)
            manual = OpenAIResponsesCompactionSession(
                "shared", backend, client=compact_client(compact), compaction_mode="input"
            )
            auto = OpenAIResponsesCompactionSession(
                "shared",
                backend,
                client=compact_client(compact),
                compaction_mode="input",
                should_trigger_compaction=lambda _: True,
            )
            agent = Agent(name="worker", model=ScriptedModel(steps=[[reply()]] * 1000))
            barrier.release()
            turn = 0
            while any(p.popen.poll() is None for p in procs) or turn < 4:
                try:
                    await manual.run_compaction({"force": True})
                    replaced["manual"] += 1
                except CompactionConflict:
                    replaced["refused"] += 1
                before = await backend.get_items()
                await Runner.run(agent, f"turn-{turn}", session=auto)
                after = await backend.get_items()
                replaced["runner"] += any(
                    i.get("type") == "compaction" and i not in before for i in after
                )
                turn += 1
            items = await backend.get_items()
            backend.close()
            return [items, turn]

    try:
        items, turns = asyncio.run(go())
        for p in procs:
            assert p.finish(timeout=60) == 0, p.stderr_tail()
    finally:
        barrier.close()
        for p in procs:
            p.kill()
    expected = sorted(
        [f"p{k}-{i}" for k in range(appenders) for i in range(count)]
        + [f"turn-{t}" for t in range(turns)]
    )
    assert sorted(_covered(items)) == expected
    assert replaced["manual"] >= 1, replaced
    assert replaced["runner"] >= 1, replaced


def test_encrypted_pop_over_a_subclass_that_overrides_pop_item_uses_its_pop(
    tmp_path: Path,
) -> None:
    """As the SDK's EncryptedSession over a SQLiteSession subclass: its own pop runs."""

    class CountingSession(FleetstoreSession):
        pops = 0

        async def pop_item(self) -> Any:
            self.pops += 1
            return await super().pop_item()

    async def go() -> None:
        with fleetstore.open(tmp_path / "subclass.db") as store:
            backend = CountingSession("s", store)
            session = EncryptedSession("s", backend, encryption_key="synthetic-key")
            await session.add_items([user("saved")])
            assert await session.pop_item() == user("saved")
            assert backend.pops == 1
            backend.close()

    asyncio.run(go())
