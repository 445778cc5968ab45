"""``fleetstore stats`` and ``sessions list`` know what the framework adapters keep
(issue 28: ``stats`` said "0 sessions" of a 2.5 MB LangGraph store, and Agents SDK
sessions were listed with no title and no SDK id).  The stores are written by the real
adapters (``FleetstoreSaver`` running a graph, ``FleetstoreSession``,
``FleetstoreSessionService``) and the outbox, then read by the CLI in its own process.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

import fleetstore
from fleetstore.admin.stats import langgraph_threads, store_stats
from fleetstore.integrations.adk import FleetstoreSessionService
from fleetstore.integrations.langgraph import FleetstoreSaver
from fleetstore.integrations.openai_agents import FleetstoreSession
from tests.fix_stores import OpenStore


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetstore", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
    )


class Chat(TypedDict):
    log: Annotated[list[str], operator.add]


def run_graph(saver: FleetstoreSaver, thread: str, turns: int) -> None:
    """A two-node LangGraph graph, *turns* invocations on *thread*."""
    graph = StateGraph(Chat)
    graph.add_node("think", lambda s: {"log": ["thought " * 50]})
    graph.add_node("answer", lambda s: {"log": ["answer " * 50]})
    graph.add_edge(START, "think")
    graph.add_edge("think", "answer")
    graph.add_edge("answer", END)
    app = graph.compile(checkpointer=saver)
    for i in range(turns):
        app.invoke({"log": [f"question {i}"]}, {"configurable": {"thread_id": thread}})


def langgraph_store(path: Path) -> None:
    with FleetstoreSaver(path) as saver:
        run_graph(saver, "support-42", 3)
        run_graph(saver, "billing-7", 1)


def mixed_store(path: Path) -> dict[str, Any]:
    """The three adapters and the outbox in one store, plus a session of our own API."""
    with fleetstore.open(path) as store:
        with FleetstoreSaver(store) as saver:
            run_graph(saver, "graph-thread", 2)

        async def sdk_and_adk() -> str:
            async with FleetstoreSession("conv/1", store) as session:
                await session.add_items(
                    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
                )
            async with FleetstoreSession("conv/2", store) as session:
                await session.add_items([{"role": "user", "content": "again"}])
            svc = FleetstoreSessionService(store)
            from google.adk.events import Event
            from google.genai import types

            s = await svc.create_session(app_name="helpdesk", user_id="ann", session_id="t-1")
            await svc.create_session(app_name="helpdesk", user_id="bob", session_id="t-2")
            await svc.append_event(
                s,
                Event(
                    author="user",
                    invocation_id="inv",
                    content=types.Content(role="user", parts=[types.Part(text="help")]),
                ),
            )
            await svc.close()
            return s.id

        adk_sid = asyncio.run(sdk_and_adk())
        own = store.sessions.create(title="plain")
        store.messages.append(own.id, "user", "hello")
        store.effects.enqueue("th", "notify", {"n": 1})
        store.effects.enqueue("th", "notify", {"n": 2})
        done = store.effects.enqueue("other", "notify", {"n": 3})
        store.effects.cancel(done)
    return {"own": own.id, "adk": adk_sid}


def test_stats_of_a_langgraph_store_shows_its_threads_and_checkpoints(tmp_path: Path) -> None:
    path = tmp_path / "graphs.db"
    langgraph_store(path)
    done = cli("stats", "--store", str(path), "--json")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["counts"]["sessions"] == 0  # threads are not sessions
    lg = figures["frameworks"]["langgraph"]
    with fleetstore.open(path) as store:
        checkpoints, threads = store.read(
            lambda tx: tx.execute(
                "SELECT count(*), count(DISTINCT thread_id) FROM ckpt_checkpoints"
            )[0]
        )
        per_thread = dict(
            store.read(
                lambda tx: tx.execute(
                    "SELECT thread_id, count(*) FROM ckpt_checkpoints GROUP BY thread_id"
                )
            )
        )
    assert lg["threads"] == threads == 2 and lg["checkpoints"] == checkpoints > 0
    assert lg["channel_values"] > 0 and lg["payload_bytes"] > 0
    listed = {t["thread_id"]: t for t in figures["langgraph_threads"]}
    assert {k: v["checkpoints"] for k, v in listed.items()} == per_thread
    assert listed["support-42"]["payload_bytes"] > listed["billing-7"]["payload_bytes"]

    text = cli("stats", "--store", str(path))
    assert "LangGraph: 2 thread(s)" in text.stdout and "support-42" in text.stdout

    # sessions list says where the threads are, and --threads lists them.
    empty = cli("sessions", "list", "--store", str(path))
    assert empty.stdout == "" and "--threads lists them" in empty.stderr
    threads_out = cli("sessions", "list", "--threads", "--json", "--store", str(path))
    rows = [json.loads(line) for line in threads_out.stdout.splitlines()]
    assert [r["thread_id"] for r in rows] == ["billing-7", "support-42"]  # latest first
    assert rows[1]["checkpoints"] == per_thread["support-42"]
    one = cli("sessions", "list", "--threads", "--limit", "1", "--store", str(path))
    header, *listed_rows = one.stdout.splitlines()  # a table (core/render.py), plain when piped
    assert header.split()[0] == "THREAD" and len(listed_rows) == 1
    assert listed_rows[0].startswith("billing-7") and "--all lists every one" in one.stderr
    mixed = cli("sessions", "list", "--threads", "--roots", "--store", str(path))
    assert mixed.returncode == 2 and "--threads" in mixed.stderr


def test_stats_and_sessions_list_name_sdk_and_adk_sessions_and_count_the_outbox(
    tmp_path: Path,
) -> None:
    path = tmp_path / "mixed.db"
    ids = mixed_store(path)
    done = cli("stats", "--store", str(path), "--json")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    fw = figures["frameworks"]
    assert fw["openai_agents"] == {"sessions": 2, "items": 3}
    assert fw["adk"] == {"apps": 1, "users": 2, "sessions": 2, "events": 1}
    assert fw["langgraph"]["threads"] == 1
    by_state = figures["outbox"]["by_state"]
    assert by_state["pending"] == 2 and by_state["cancelled"] == 1
    assert figures["outbox"]["total"] == 3
    text = cli("stats", "--store", str(path)).stdout
    assert "OpenAI Agents SDK: 2 session(s), 3 item(s)" in text
    assert "ADK: 1 app(s), 2 user(s), 2 session(s), 1 event(s)" in text
    assert "outbox: 3 effect(s): pending 2" in text

    listed = cli("sessions", "list", "--json", "--store", str(path))
    assert listed.returncode == 0, listed.stderr
    rows = {r["id"]: r for r in map(json.loads, listed.stdout.splitlines())}
    known = sorted(
        json.dumps(r["known_as"], sort_keys=True) for r in rows.values() if r["known_as"]
    )
    assert known == sorted(
        json.dumps(k, sort_keys=True)
        for k in (
            {"framework": "openai-agents", "session_id": "conv/1"},
            {"framework": "openai-agents", "session_id": "conv/2"},
            {"framework": "adk", "app_name": "helpdesk", "user_id": "ann", "session_id": "t-1"},
            {"framework": "adk", "app_name": "helpdesk", "user_id": "bob", "session_id": "t-2"},
        )
    )
    assert rows[ids["own"]]["known_as"] is None and rows[ids["own"]]["title"] == "plain"
    text = cli("sessions", "list", "--store", str(path)).stdout
    assert "openai-agents:conv/1" in text and "adk:helpdesk/ann/t-1" in text


def test_the_framework_figures_on_every_engine(open_store: OpenStore) -> None:
    """The same figures from one file, a sharded store (the frameworks' rows in the
    catalog, SDK sessions in their shards) and PostgreSQL."""
    store = open_store("fw.db")
    with FleetstoreSaver(store) as saver:
        run_graph(saver, "t", 2)

    async def sdk() -> None:
        async with FleetstoreSession("s", store) as session:
            await session.add_items([{"role": "user", "content": "x"}])

    asyncio.run(sdk())
    store.effects.enqueue("th", "k", {})
    figures = store_stats(store, 5)
    assert figures["frameworks"]["langgraph"]["threads"] == 1
    assert figures["frameworks"]["langgraph"]["checkpoints"] > 0
    assert figures["frameworks"]["openai_agents"] == {"sessions": 1, "items": 1}
    assert figures["outbox"]["by_state"]["pending"] == 1
    [thread] = langgraph_threads(store)
    assert thread["thread_id"] == "t" and thread["payload_bytes"] > 0
    assert thread["checkpoints"] == figures["frameworks"]["langgraph"]["checkpoints"]
