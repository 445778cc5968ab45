"""The OpenAI Agents SDK session (issue 7): ``fleetstore.integrations.openai_agents``
and the ``openai-agents-sqlite`` importer.

The SDK's ``Runner`` drives a scripted fake model (tests/agents/agents_agent.py, no
network); its ``SQLiteSession`` is the reference the semantics are compared with.
Real processes, real files, a real outside lock (``fleetstore lock``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from agents.memory import Session as SessionProtocol

import fleetstore
from agents import Agent, Runner, SQLiteSession, set_tracing_disabled
from fleetstore import errors
from fleetstore.domain import openai_agents as agents_ops
from fleetstore.integrations.openai_agents import (
    FleetstoreSession,
    alist_sessions,
    list_sessions,
)
from fleetstore.integrations.openai_agents.importer import (
    ImportSummary,
    import_sqlite,
    imported_id,
    item_hash,
)
from fleetstore.store.spool import journals
from tests.agents import script
from tests.agents.agents_agent import history, make_agent, run_turn, summary, user_text
from tests.fix_procs import Barrier, Proc, Spawn, start_lock
from tests.fix_stores import OpenStore

set_tracing_disabled(True)

AGENT = script("agents_agent.py")
FLEET = 16


def items(n: int, tag: str = "i") -> list[dict[str, Any]]:
    """*n* items of the shapes the Runner writes."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            out.append({"role": "user", "content": f"{tag} {i} ✓"})
        elif kind == 1:
            out.append(
                {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"}
            )
        else:
            out.append({"type": "function_call_output", "call_id": f"c{i - 1}", "output": "x"})
    return out


def rows(store: fleetstore.Store) -> list[tuple[Any, ...]]:
    """Every history row of the store, for "changed nothing" comparisons."""
    return store.read(
        lambda tx: tx.execute(
            "SELECT 's', id, metadata, created_at, updated_at, version FROM sessions "
            "UNION ALL SELECT 'm', id, session_id, seq, role, metadata FROM messages "
            "UNION ALL SELECT 'p', message_id, seq, kind, enc, coalesce(blob_sha, body) "
            "FROM parts ORDER BY 1, 2, 3"
        )
    )


def release(lock: Proc) -> float:
    """End ``fleetstore lock`` early (SIGTERM releases the lock); when it said so."""
    os.kill(lock.pid, signal.SIGTERM)
    at, _ = lock.wait_line("released", timeout=30)
    assert lock.finish(timeout=30) == 0
    return at


# -- the Session protocol --------------------------------------------------------------------


def test_session_behaves_like_the_sdks_sqlite_session(open_store: OpenStore) -> None:
    async def script(session: Any) -> list[Any]:
        seen: list[Any] = [await session.get_items(), await session.pop_item()]
        await session.add_items(items(5))
        await session.add_items([])
        await session.add_items(items(2, "more"))
        seen += [await session.get_items(), await session.get_items(3)]
        seen += [await session.get_items(0), await session.get_items(-1)]
        seen += [await session.pop_item(), await session.pop_item(), await session.get_items(2)]
        await session.clear_session()
        seen += [await session.get_items(), await session.pop_item()]
        await session.add_items(items(1, "after"))
        seen.append(await session.get_items())
        return seen

    async def main() -> None:
        reference = SQLiteSession("s")  # in memory: no file beside the store
        with open_store() as store:
            ours = FleetstoreSession("s", store)
            assert isinstance(ours, SessionProtocol)
            assert await script(ours) == await script(reference)
            # The session settings' limit is get_items' default, as in the SDK.
            limited = FleetstoreSession("s", store, session_settings={"limit": 1})
            assert await limited.get_items() == items(1, "after")
            assert await limited.get_items(5) == items(1, "after")
            ours.close()
            limited.close()
        reference.close()

    asyncio.run(main())


def test_items_are_messages_of_one_session_per_sdk_session(tmp_path: Path) -> None:
    big = {"type": "function_call_output", "call_id": "c", "output": "y" * 200_000}
    batch = [{"role": "user", "content": "hi"}, big, {"role": "assistant", "content": "ok"}]

    async def main() -> None:
        with fleetstore.open(tmp_path / "m.db") as store:
            async with FleetstoreSession("conv/1 é", store) as session:
                await session.add_items(batch)
                assert await session.get_items() == batch
            s = store.sessions.get(agents_ops.session_key("conv/1 é"))
            assert s.metadata == {"openai_agents": {"session_id": "conv/1 é"}}
            messages = store.messages.list(s.id)
            assert [(m.seq, m.role) for m in messages] == [
                (1, "user"),
                (2, "tool"),
                (3, "assistant"),
            ]
            assert messages[0].text == "hi"  # a plain user message reads as text
            assert json.loads(messages[1].text) == big
            # An item above the blob threshold is a blob file, not an inline body.
            shas = store.read(
                lambda tx: tx.execute(
                    "SELECT blob_sha FROM parts WHERE message_id = ?", (messages[1].id,)
                )
            )
            assert shas[0][0] is not None and store.blobs.verify(shas[0][0])

    asyncio.run(main())


def test_bad_input_raises_a_typed_error_and_writes_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        with fleetstore.open(tmp_path / "bad.db") as store:
            session = FleetstoreSession("s", store)
            await session.add_items(items(2))
            before = rows(store)
            bad_batches: list[Any] = [
                [*items(2), "not a dict"],
                [*items(2), {"type": "x", "data": {1, 2}}],  # a set: not JSON
                [{"role": "user", "content": "\ud800"}],  # a lone surrogate
                [{"type": "x", "v": float("nan")}],
                {"role": "user", "content": "a dict, not a list"},
                [{1: "a key that is not a string"}],
            ]
            for batch in bad_batches:
                with pytest.raises(errors.InvalidInput):
                    await session.add_items(batch)
            with pytest.raises(errors.InvalidInput):
                await session.get_items("3")  # type: ignore[arg-type]
            for bad_id in ("", 42, "x" * 2000):
                with pytest.raises(errors.InvalidInput):
                    FleetstoreSession(bad_id, store)  # type: ignore[arg-type]
            with pytest.raises(errors.ConfigError):
                FleetstoreSession("s", store, write_budget=1)
            for bad_settings in ({"limit": "many"}, {"nope": 1}, 5):
                with pytest.raises(errors.ConfigError):
                    FleetstoreSession("s", store, session_settings=bad_settings)  # type: ignore[arg-type]
            for cursor in ("nope", "1.5", "nan/abc", "1.5/a/b"):
                with pytest.raises(errors.InvalidInput):
                    list_sessions(store, cursor=cursor)
            with pytest.raises(errors.InvalidInput):
                list_sessions(store, limit=0)
            assert rows(store) == before
            assert await session.get_items() == items(2)
            assert not list(Path(str(store.path) + ".blobs").rglob("*.tmp"))
            session.close()

    asyncio.run(main())


def test_list_sessions_pages_newest_first(tmp_path: Path) -> None:
    async def main() -> None:
        store = await fleetstore.open_async(tmp_path / "list.db")
        try:
            for n in range(7):
                session = FleetstoreSession(f"user-{n}", store)
                await session.add_items(items(n + 1))
                session.close()
            await store.sessions.create(title="not an agents session")
            seen: list[agents_ops.AgentSession] = []
            cursor = None
            pages = 0
            while True:
                page = await alist_sessions(store, limit=3, cursor=cursor)
                assert page == list_sessions(store.sync, limit=3, cursor=cursor)
                seen += page.sessions
                pages += 1
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
            assert pages == 3
            assert [s.session_id for s in seen] == [f"user-{n}" for n in reversed(range(7))]
            assert [s.items for s in seen] == [n + 1 for n in reversed(range(7))]
            assert all(s.fleetstore_id == agents_ops.session_key(s.session_id) for s in seen)
        finally:
            await store.close()

    asyncio.run(main())


def test_concurrent_pops_from_two_stores_pop_each_item_once(open_store: OpenStore) -> None:
    batch = items(30)

    async def main() -> None:
        with open_store("pop.db") as one, open_store("pop.db") as two:
            await FleetstoreSession("s", one).add_items(batch)
            a, b = FleetstoreSession("s", one), FleetstoreSession("s", two)

            async def drain(session: FleetstoreSession) -> list[Any]:
                popped = []
                while (item := await session.pop_item()) is not None:
                    popped.append(item)
                return popped

            got_a, got_b = await asyncio.gather(drain(a), drain(b))
            everything = sorted(map(item_hash, got_a + got_b))
            assert everything == sorted(map(item_hash, batch))
            # Each popper saw the items in reverse order.
            for got in (got_a, got_b):
                order = [batch.index(i) for i in got]
                assert order == sorted(order, reverse=True)
            assert await a.get_items() == []

    asyncio.run(main())


# -- the Runner ------------------------------------------------------------------------------


@pytest.mark.slow
def test_runner_history_persists_and_a_new_process_resumes_it(tmp_path: Path) -> None:
    path = str(tmp_path / "resume.db")
    for first, count in ((0, 3), (3, 2)):
        # The scripted model fails the turn unless its input is the whole history so far.
        argv = ["turns", path, "--session", "conv", "--first", str(first), "--count", str(count)]
        done = subprocess.run(
            [sys.executable, AGENT, *argv],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout.splitlines()[-1]) == {"items": 4 * (first + count)}
    with fleetstore.open(path) as store:
        stored = agents_ops.get_items(store, "conv")
        assert [summary(i) for i in stored] == history("conv", 5)

    # In this process too: the Runner reads the history through get_items(limit).
    async def main() -> None:
        with fleetstore.open(path) as store:
            session = FleetstoreSession("conv", store, session_settings={"limit": 400})
            await run_turn(session, "conv", 5)
            assert [summary(i) for i in await session.get_items()] == history("conv", 6)
            session.close()

    asyncio.run(main())


# -- cancellation, the lock, the spool -------------------------------------------------------


def test_cancelled_add_items_waiting_for_the_lock_lands_whole(tmp_path: Path, spawn: Spawn) -> None:
    path = str(tmp_path / "cancel.db")
    fleetstore.open(path).close()
    batch = items(5)

    async def main() -> None:
        with fleetstore.open(path, write_budget=120) as store:
            session = FleetstoreSession("s", store)
            lock, _ = start_lock(spawn, path, 600)
            try:
                task = asyncio.ensure_future(session.add_items(batch))
                await asyncio.sleep(0.5)  # it is waiting for the lock now
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                # Cancelled, not yet landed: nothing of it is there.
                assert agents_ops.stored_message_ids(store, "s") == []
            finally:
                release(lock)
            # The session's next call runs after the cancelled write, which landed whole.
            assert await session.get_items() == batch
            session.close()

    asyncio.run(main())


def test_cancelled_add_items_that_runs_out_of_budget_writes_nothing(
    tmp_path: Path, spawn: Spawn
) -> None:
    path = str(tmp_path / "cancel-raise.db")
    fleetstore.open(path).close()

    async def main() -> None:
        with fleetstore.open(path, write_budget=1.0, on_busy="raise") as store:
            session = FleetstoreSession("s", store)
            await session.add_items(items(1))
            lock, _ = start_lock(spawn, path, 600)
            try:
                task = asyncio.ensure_future(session.add_items(items(4, "lost")))
                await asyncio.sleep(0.3)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                # Not cancelled when awaited here: the write ran out of budget, whole.
                with pytest.raises(errors.StoreBusy):
                    await session.add_items(items(2, "busy"))
            finally:
                release(lock)
            assert await session.get_items() == items(1)
            session.close()

    asyncio.run(main())


def test_spooled_writes_read_back_at_once_and_land_once(tmp_path: Path, spawn: Spawn) -> None:
    path = str(tmp_path / "spool.db")
    fleetstore.open(path).close()

    async def main() -> None:
        with fleetstore.open(path, write_budget=0.3) as store:
            session = FleetstoreSession("s", store, read_wait=0)
            other = FleetstoreSession("other", store)
            await session.add_items(items(2, "a"))
            lock, _ = start_lock(spawn, path, 600)
            try:
                await session.add_items(items(3, "b"))  # past the budget: spooled
                assert store.metrics()["spool_pending"] == 1
                await session.add_items(items(1, "c"))  # queued behind it
                want = items(2, "a") + items(3, "b") + items(1, "c")
                assert await session.get_items() == want
                assert await session.get_items(2) == want[-2:]
                # pop is conditional: never spooled; nothing is removed.
                with pytest.raises(errors.SpoolPending):
                    await session.pop_item()
                await session.clear_session()
                await session.add_items(items(2, "d"))
                assert await session.get_items() == items(2, "d")
                assert await other.get_items() == []
                # Another store (as another process would) sees what landed only.
                with fleetstore.open(path) as outside:
                    assert agents_ops.get_items(outside, "s") == items(2, "a")
            finally:
                release(lock)
            assert store.flush(timeout=60)
            assert await session.get_items() == items(2, "d")
            assert await session.pop_item() == items(2, "d")[-1]
            session.close()
            other.close()
        with fleetstore.open(path) as fresh:
            assert agents_ops.get_items(fresh, "s") == items(1, "d")
            assert not journals(path + ".spool")

    asyncio.run(main())


@pytest.mark.slow
def test_journal_left_by_a_process_that_exited_is_replayed_by_fleetstore_recover(
    tmp_path: Path, spawn: Spawn
) -> None:
    path = str(tmp_path / "recover.db")
    fleetstore.open(path).close()
    # A process whose turn is spooled whole, and which exits (closing waits one
    # budget for the lock) with its journal left behind.
    turn = (
        "import asyncio, sys\n"
        f"sys.path.insert(0, {str(Path(script('agents_agent.py')).parent)!r})\n"
        "import fleetstore\n"
        "from fleetstore.integrations.openai_agents import FleetstoreSession\n"
        "from agents_agent import run_turn\n"
        f"store = fleetstore.open({path!r}, write_budget=0.2)\n"
        "asyncio.run(run_turn(FleetstoreSession('r', store), 'r', 0))\n"
        "print('pending', store.metrics()['spool_pending'], flush=True)\n"
        "store.close()\n"
    )
    lock, _ = start_lock(spawn, path, 600)
    try:
        done = subprocess.run(
            [sys.executable, "-c", turn], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["pending", "3"]  # the turn's three add_items
        assert len(journals(path + ".spool")) == 1
    finally:
        release(lock)
    # `fleetstore recover` never imports the integration: fleetstore itself must
    # register the agt_* operations, or the replay stops at the first one.
    done = subprocess.run(
        [sys.executable, "-m", "fleetstore", "recover", path, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["ok"], report
    assert [(j["status"], j["replayed"]) for j in report["journals"]] == [("replayed", 3)]
    with fleetstore.open(path) as store:
        assert [summary(i) for i in agents_ops.get_items(store, "r")] == history("r", 1)


# -- the importer ----------------------------------------------------------------------------


def make_sqlite(tmp_path: Path, file: Path, spec: dict[str, Any]) -> dict[str, list[Any]]:
    """An SDK SQLiteSession file, written by the SDK in another process (the stdlib
    sqlite3 never runs beside fleetstore); returns what the SDK reads back from it."""
    spec_file = tmp_path / f"spec-{time.monotonic_ns()}.json"
    spec_file.write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, AGENT, "make-sqlite", str(file), str(spec_file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, list[Any]] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.slow
def test_import_brings_every_session_in_verified_and_twice_changes_nothing(
    tmp_path: Path,
) -> None:
    sdk = tmp_path / "sdk.db"
    big = {"type": "function_call_output", "call_id": "c", "output": "z" * 150_000}
    spec = {
        "runs": {"runner": 3},
        "sessions": {"plain": [*items(7), big], "uni/code ✓": items(2, "ü")},
    }
    expected = make_sqlite(tmp_path, sdk, spec)
    assert len(expected["runner"]) == 12
    with fleetstore.open(tmp_path / "store.db") as store:
        result = import_sqlite(store, sdk)
        assert result == ImportSummary(3, 22, 22, 0, 22)
        for sid, want in expected.items():
            assert agents_ops.get_items(store, sid) == want
        names = {s.session_id for s in list_sessions(store).sessions}
        assert names == set(expected)
        before = rows(store)
        again = import_sqlite(store, sdk)
        assert again == ImportSummary(3, 22, 0, 22, 22)
        assert rows(store) == before

        # The SDK file grows; only the new rows are imported, after the old ones.
        grown = make_sqlite(tmp_path, sdk, {"sessions": {"plain": items(2, "new")}})
        assert import_sqlite(store, sdk) == ImportSummary(3, 24, 2, 22, 24)
        assert agents_ops.get_items(store, "plain") == grown["plain"]

        # Items the adapter added after the import do not block a re-import.
        asyncio.run(FleetstoreSession("plain", store).add_items(items(1, "later")))
        assert import_sqlite(store, sdk).inserted == 0
        # The Runner resumes an imported history.
        session = FleetstoreSession("runner", store)
        asyncio.run(run_turn(session, "runner", 3))
        assert [summary(i) for i in agents_ops.get_items(store, "runner")] == history("runner", 4)


@pytest.mark.slow
def test_import_of_a_bad_file_is_refused_whole(tmp_path: Path) -> None:
    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("hello\n" * 100)
    empty = tmp_path / "empty.db"
    empty.touch()
    corrupt_row = tmp_path / "corrupt.db"
    make_sqlite(
        tmp_path,
        corrupt_row,
        {"sessions": {"good": items(3)}, "raw": {"bad": ['{"role": "user"', "[1, 2]"]}},
    )
    with fleetstore.open(tmp_path / "store.db") as store:
        before = rows(store)
        for path, error in (
            (not_sqlite, errors.InvalidArchive),
            (empty, errors.InvalidArchive),
            (corrupt_row, errors.InvalidArchive),
            (tmp_path / "missing.db", errors.NotFound),
            (store.path, errors.InvalidInput),
        ):
            with pytest.raises(error):
                import_sqlite(store, path)
            assert rows(store) == before, path
        # Not the SDK's tables.
        with pytest.raises(errors.InvalidArchive):
            import_sqlite(store, corrupt_row, messages_table="other_messages")
        with pytest.raises(errors.InvalidInput):
            import_sqlite(store, corrupt_row, messages_table="x; DROP TABLE y")
        assert rows(store) == before
        # As the SDK's own reads do, invalid rows can be skipped on request.
        result = import_sqlite(store, corrupt_row, skip_invalid=True)
        assert (result.items, len(result.skipped_rows)) == (3, 2)
        assert agents_ops.get_items(store, "good") == items(3)
        assert store.sessions.get(agents_ops.session_key("bad")) is not None


def test_import_into_a_session_holding_other_items_conflicts(tmp_path: Path) -> None:
    sdk = tmp_path / "sdk.db"
    make_sqlite(tmp_path, sdk, {"sessions": {"a": items(2), "b": items(3)}})
    with fleetstore.open(tmp_path / "store.db") as store:
        asyncio.run(FleetstoreSession("b", store).add_items(items(1, "mine")))
        before = rows(store)
        with pytest.raises(errors.AlreadyExists):
            import_sqlite(store, sdk)
        assert rows(store) == before  # session "a" was not imported either
        assert imported_id("a", 1) != imported_id("b", 1)


@pytest.mark.slow
def test_cli_import_from_openai_agents_sqlite(tmp_path: Path) -> None:
    sdk = tmp_path / "sdk.db"
    expected = make_sqlite(tmp_path, sdk, {"sessions": {"s": items(4)}})
    store = str(tmp_path / "cli.db")
    # The installed console script, as a user runs it.
    script = str(Path(sys.executable).with_name("fleetstore"))
    cli = [script, "import", "--from", "openai-agents-sqlite"]
    done = subprocess.run(
        [*cli, str(sdk), "--store", store], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "1 sessions, 4 items: 4 new" in done.stdout
    with fleetstore.open(store) as opened:
        assert agents_ops.get_items(opened, "s") == expected["s"]
    bad = tmp_path / "bad.db"
    bad.write_text("not sqlite")
    done = subprocess.run(
        [*cli, str(bad), "--store", store], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and "not an Agents SDK SQLiteSession database" in done.stderr


def test_integration_modules_import_without_loading_the_sdk_where_not_needed() -> None:
    code = (
        "import sys\n"
        "import fleetstore.domain.openai_agents\n"
        "import fleetstore.integrations.openai_agents.reader\n"
        "import fleetstore.integrations.openai_agents.importer\n"
        "import fleetstore.integrations.openai_agents.importer\n"  # its path before issue 26
        "assert 'agents' not in sys.modules, 'the SDK was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# -- the fleet -------------------------------------------------------------------------------


def run_fleet(
    tmp_path: Path, spawn: Spawn, barrier: Barrier, hold: float, budget: float
) -> tuple[dict[int, dict[str, Any]], list[Proc], float, float]:
    """16 agents run turns while ``fleetstore lock`` holds the lock *hold* seconds;
    returns their summaries, the processes, and when the lock was taken and released."""
    path = str(tmp_path / "fleet.db")
    fleetstore.open(path).close()  # migrated, so the lock process finds a store
    stop = tmp_path / "stop"
    procs: list[Proc] = []
    for n in range(FLEET):
        argv = [sys.executable, AGENT, "fleet", path, "--agent", str(n)]
        argv += ["--barrier", barrier.path, "--stop", str(stop), "--budget", str(budget)]
        argv += ["--pace", "0.25", "--min-turns", "3", "--flush", str(hold + 120)]
        procs.append(Proc(argv, f"agent {n}"))
    try:
        for proc in procs:
            proc.wait_line("ready", timeout=240)
        barrier.release()
        for proc in procs:  # every agent is running turns before the lock is taken
            proc.wait_line("turn 0 ", timeout=120)
        lock, locked_at = start_lock(spawn, path, hold)
        if hold < budget:
            # The lock is waited out: every agent finishes a turn after it is released.
            released_at, _ = lock.wait_line("released", timeout=hold + 60)
            for proc in procs:
                while turn_time(proc.wait_line("turn", timeout=120)[1])[0] <= released_at:
                    pass
        else:
            # Turns go on through the spool: every agent runs two while it is held.
            for proc in procs:
                held = 0
                while held < 2:
                    held += turn_time(proc.wait_line("turn", timeout=120)[1])[0] > locked_at
            stop.touch()
            released_at, _ = lock.wait_line("released", timeout=hold + 60)
        stop.touch()
        assert lock.finish(timeout=30) == 0
        summaries = {}
        for n, proc in enumerate(procs):
            rc = proc.finish(timeout=hold + 180)
            fails = [line for _, line in proc.seen if line.startswith("fail")]
            assert rc == 0 and not fails, (n, rc, fails, proc.stderr_tail())
            summaries[n] = json.loads(proc.last_line())
    finally:
        for proc in procs:
            proc.kill()
    check_fleet_store(path, summaries)
    turns = sorted(s["turns"] for s in summaries.values())
    spooled = sum(s["spooled"] for s in summaries.values())
    print(f"openai-agents fleet: hold {hold}s budget {budget}s turns {turns} spooled {spooled}")
    return summaries, procs, locked_at, released_at


def check_fleet_store(path: str, summaries: dict[int, dict[str, Any]]) -> None:
    """From a fresh open: every turn of every agent, each item once, in order."""
    assert not journals(path + ".spool")
    with fleetstore.open(path) as store:
        assert store.read(lambda tx: tx.execute("PRAGMA integrity_check")) == [("ok",)]
        total = 0
        for n, s in summaries.items():
            agent = f"agent-{n}"
            assert s["failures"] == 0 and s["history_ok"] and s["drained"], s
            stored = agents_ops.get_items(store, agent)
            assert [summary(i) for i in stored] == history(agent, s["turns"]), agent
            total += len(stored)
        counted = store.read(lambda tx: tx.execute("SELECT count(*) FROM messages"))
        assert counted == [(total,)]  # nothing else was written
        assert list_sessions(store, limit=100).sessions[0].items > 0


def turn_time(line: str) -> tuple[float, float]:
    """When the turn of a ``turn T STARTED ENDED`` line started and ended."""
    _, _, started, ended = line.split()
    return float(started), float(ended)


def turn_times(proc: Proc) -> list[tuple[float, float]]:
    return [turn_time(line) for _, line in proc.seen if line.startswith("turn ")]


@pytest.mark.fleet
@pytest.mark.timeout(400)
def test_fleet_of_16_runners_waits_out_a_6_5_s_outside_lock(
    tmp_path: Path, spawn: Spawn, barrier: Barrier
) -> None:
    summaries, procs, locked_at, released_at = run_fleet(tmp_path, spawn, barrier, 6.5, 60.0)
    # The lock was waited out within the budget: nothing was spooled.
    assert all(s["spooled"] == 0 for s in summaries.values()), summaries
    for proc in procs:
        times = turn_times(proc)
        assert any(end < locked_at for _, end in times), (proc.name, times, locked_at)
        assert any(start > released_at for start, _ in times), (proc.name, times, released_at)


@pytest.mark.fleet
@pytest.mark.timeout(500)
def test_fleet_of_16_runners_goes_on_through_the_spool_past_a_70_s_outside_lock(
    tmp_path: Path, spawn: Spawn, barrier: Barrier
) -> None:
    summaries, procs, locked_at, released_at = run_fleet(tmp_path, spawn, barrier, 70.0, 5.0)
    # Every agent spooled, and finished turns while the lock was held: it read its
    # own spooled items back and went on, and they all landed, once, in order.
    assert all(s["spooled"] > 0 for s in summaries.values()), summaries
    for proc in procs:
        held = [t for t in turn_times(proc) if locked_at < t[0] and t[1] < released_at]
        assert len(held) >= 2, (proc.name, turn_times(proc), locked_at, released_at)


def test_many_sessions_of_one_async_store_run_turns_concurrently(
    tmp_path: Path,
) -> None:
    # Many sessions of one store in one event loop, as a server would run them.
    async def main() -> None:
        store = await fleetstore.open_async(tmp_path / "loop.db")
        try:
            sessions = [FleetstoreSession(f"u{n}", store) for n in range(6)]

            async def turns(session: FleetstoreSession) -> None:
                for turn in range(2):
                    agent: Agent[Any] = make_agent(session.session_id, turn)
                    result = await Runner.run(
                        agent, user_text(session.session_id, turn), session=session
                    )
                    assert result.final_output

            await asyncio.gather(*(turns(s) for s in sessions))
            for s in sessions:
                got = [summary(i) for i in await s.get_items()]
                assert got == history(s.session_id, 2)
                s.close()
        finally:
            await store.close()

    asyncio.run(main())
