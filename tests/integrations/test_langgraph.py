"""The LangGraph checkpointer (issue 7): ``fleetstore.integrations.langgraph``.

* the ``langgraph-checkpoint-conformance`` suite, every capability (the base five
  and delete_for_runs, copy_thread, prune), against ``FleetstoreSaver``;
* real graphs (pure-Python nodes, no model): interrupts, a subgraph, a value over
  the blob threshold, time travel with ``update_state``; same history as
  LangGraph's own ``InMemorySaver``; sync and async; ``DeltaChannel`` state
  survives ``prune``;
* the spool: a put past the budget returns its config, a read waits for it,
  and a journal left behind is replayed by ``fleetstore recover``;
* bad input: a typed error and nothing written;
* the fleet: 16 processes checkpoint their own threads in one store while an
  outside process holds the write lock 6.5 s (half wait it out, half spool).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import operator
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

import fleetstore
from fleetstore import errors
from fleetstore.integrations.langgraph import FleetstoreSaver
from tests.agents import script
from tests.agents.langgraph_agent import build as build_agent_graph
from tests.agents.langgraph_agent import expected_note
from tests.fix_procs import Barrier, Proc, Spawn, start_lock
from tests.fix_stores import OpenStore

LG_AGENT = script("langgraph_agent.py")
HOLD = "60"  # the lock holder's safety net; tests release it with SIGTERM


def release(lock: Proc) -> None:
    os.kill(lock.pid, signal.SIGTERM)
    lock.wait_line("released", timeout=30)
    assert lock.finish(timeout=30) == 0


def rows(saver: FleetstoreSaver, table: str) -> int:
    count: int = saver.store.read(lambda tx: tx.execute(f"SELECT count(*) FROM {table}"))[0][0]
    return count


# --- the conformance suite --------------------------------------------------------------------


def test_conformance_suite_passes_every_capability(open_store: OpenStore) -> None:
    """On each engine (SQLite, PostgreSQL): a fresh store per capability."""
    made: list[int] = []

    @checkpointer_test(name="FleetstoreSaver")
    async def factory() -> Any:
        made.append(1)
        async with FleetstoreSaver(open_store(f"conformance-{len(made)}.db")) as saver:
            yield saver

    report = asyncio.run(validate(factory))
    results = {name: (r.detected, r.passed, r.failures) for name, r in report.results.items()}
    assert set(results) == {
        "put",
        "put_writes",
        "get_tuple",
        "list",
        "delete_thread",
        "delete_for_runs",
        "copy_thread",
        "prune",
    }
    failing = {name: r for name, r in results.items() if r[:2] != (True, True)}
    assert not failing, failing
    assert report.passed_all_base()
    assert sum(r.tests_passed for r in report.results.values()) >= 80
    assert len(made) == 8  # a fresh saver (and store) per capability


# --- real graphs ------------------------------------------------------------------------------


class Chat(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    n: int
    big: str


def _step(state: Chat) -> dict[str, Any]:
    return {"log": ["a"], "n": state.get("n", 0) + 1}


def _big(state: Chat) -> dict[str, Any]:
    return {"log": ["b"], "big": "x" * 100_000}  # over the 64 KiB blob threshold


def _ask(state: Chat) -> dict[str, Any]:
    answer = interrupt("need input")
    return {"log": [f"answer:{answer}"]}


def _sub(state: Chat) -> dict[str, Any]:
    return {"log": ["sub"]}


def chat_graph(saver: Any) -> Any:
    sub = StateGraph(Chat)
    sub.add_node("inner", _sub)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", END)
    graph = StateGraph(Chat)
    graph.add_node("step", _step)
    graph.add_node("big", _big)
    graph.add_node("sub", sub.compile())
    graph.add_node("ask", _ask)
    graph.add_edge(START, "step")
    graph.add_edge("step", "big")
    graph.add_edge("big", "sub")
    graph.add_edge("sub", "ask")
    graph.add_edge("ask", END)
    return graph.compile(checkpointer=saver)


def run_chat(saver: Any) -> list[Any]:
    """Two interrupted turns, resumed, then a fork from an old checkpoint: what
    LangGraph shows of it (history, pending interrupts, the forked state)."""
    graph = chat_graph(saver)
    config: Any = {"configurable": {"thread_id": "chat"}}
    seen: list[Any] = []
    first = graph.invoke({"log": ["hi"], "n": 0}, config)
    seen.append(sorted(first))
    state = graph.get_state(config)
    seen.append((state.next, [i.value for t in state.tasks for i in t.interrupts]))
    seen.append(graph.invoke(Command(resume="yes"), config)["log"])
    graph.invoke({"log": ["again"]}, config)
    seen.append(graph.invoke(Command(resume="no"), config)["log"])
    history = list(graph.get_state_history(config))
    seen.append(
        [
            (h.values.get("log"), len(h.values.get("big", "")), h.next, h.metadata["step"])
            for h in history
        ]
    )
    seen.append([h.metadata["source"] for h in history])
    forked = graph.update_state(history[5].config, {"log": ["forked"]})
    seen.append(graph.get_state(forked).values["log"])
    seen.append(graph.get_state(config).values["log"])  # the fork is the thread's head
    return seen


def test_real_graph_history_matches_langgraphs_in_memory_saver(tmp_path: Path) -> None:
    expected = run_chat(InMemorySaver())
    with FleetstoreSaver(tmp_path / "graph.db") as saver:
        got = run_chat(saver)
        assert got == expected
        assert len(expected[4]) == 12  # 2 turns, each interrupted and resumed
        # The 100 kB channel value is a blob file, referenced by hash, not a row body.
        blob_refs = saver.store.read(
            lambda tx: tx.execute("SELECT count(*) FROM ckpt_channels WHERE blob_sha IS NOT NULL")
        )[0][0]
        assert blob_refs >= 1
        assert any((tmp_path / "graph.db.blobs").rglob("*"))
        # The subgraph checkpointed under its own namespace.
        namespaces = {
            r[0]
            for r in saver.store.read(
                lambda tx: tx.execute("SELECT DISTINCT checkpoint_ns FROM ckpt_checkpoints")
            )
        }
        assert "" in namespaces and any(ns.startswith("sub:") for ns in namespaces)


def test_async_graph_and_paged_listing(tmp_path: Path) -> None:
    async def run() -> None:
        async with FleetstoreSaver(tmp_path / "async.db") as saver:
            graph = build_agent_graph(saver)
            config: Any = {"configurable": {"thread_id": "a-1"}}
            for turn in range(15):  # 75 checkpoints: more than one page of 64
                await graph.ainvoke({"turns": [{"agent": 1, "turn": turn}]}, config)
            state = await graph.aget_state(config)
            assert state.values["count"] == 15
            assert [t["turn"] for t in state.values["turns"]] == list(range(15))
            assert state.values["note"] == expected_note(1, 14)
            history = [h async for h in graph.aget_state_history(config)]
            assert len(history) == 75
            listed = [t async for t in saver.alist(config)]
            ids = [t.config["configurable"]["checkpoint_id"] for t in listed]
            assert ids == sorted(ids, reverse=True) and len(set(ids)) == 75
            assert ids == [h.config["configurable"]["checkpoint_id"] for h in history]
            assert [t.checkpoint["id"] for t in saver.list(config)] == ids  # sync agrees
            for newer, older in itertools.pairwise(listed):
                assert newer.parent_config is not None
                assert (
                    newer.parent_config["configurable"]["checkpoint_id"]
                    == (older.config["configurable"]["checkpoint_id"])
                )
            assert listed[-1].parent_config is None
            page = [t async for t in saver.alist(config, before=listed[9].config, limit=70)]
            assert [t.checkpoint["id"] for t in page] == ids[10:75]
            inputs = [t async for t in saver.alist(config, filter={"source": "input"})]
            assert len(inputs) == 15 and all(t.metadata["source"] == "input" for t in inputs)
            everywhere = [t async for t in saver.alist(None, filter={"source": "loop"})]
            assert len(everywhere) == 60
            (third,) = [t async for t in saver.alist(None, filter={"step": 3, "source": "loop"})]
            assert third.checkpoint["id"] == ids[-5]
            await saver.adelete_thread("a-1")
            assert await saver.aget_tuple(config) is None
            assert rows(saver, "ckpt_channels") == rows(saver, "ckpt_writes") == 0

    asyncio.run(run())


def _extend(state: list[Any], writes: list[list[Any]]) -> list[Any]:
    out = list(state)
    for w in writes:
        out.extend(w)
    return out


class Items(TypedDict):
    items: Annotated[list[Any], DeltaChannel(_extend, snapshot_frequency=5)]


def _count(state: Items) -> dict[str, Any]:
    return {"items": [len(state["items"])]}


def test_prune_keep_latest_keeps_the_ancestors_a_delta_channel_is_rebuilt_from(
    tmp_path: Path,
) -> None:
    builder = StateGraph(Items)
    builder.add_node("count", _count)
    builder.add_edge(START, "count")
    builder.add_edge("count", END)
    with FleetstoreSaver(tmp_path / "delta.db") as saver:
        graph = builder.compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": "d"}}
        for _ in range(6):
            graph.invoke({"items": ["in"]}, config)
        before = graph.get_state(config).values["items"]
        head = saver.get_tuple(config)
        assert head is not None and "items" not in head.checkpoint["channel_values"]
        assert head.metadata.get("counters_since_delta_snapshot")  # rebuilt from ancestors
        total = len(list(saver.list(config)))
        saver.prune(["d"], strategy="keep_latest")
        kept = list(saver.list(config))
        # Not just the head: the chain back to the last snapshot stays, or the
        # channel would silently read back empty.
        assert 1 < len(kept) < total
        assert kept[0].checkpoint["id"] == head.checkpoint["id"]
        assert graph.get_state(config).values["items"] == before
        graph.invoke({"items": ["more"]}, config)
        assert graph.get_state(config).values["items"] == [*before, "more", len(before) + 1]
        saver.prune(["d"], strategy="delete")
        assert list(saver.list(config)) == []


def test_copy_thread_copies_whole_chains_and_the_copy_resumes(tmp_path: Path) -> None:
    with FleetstoreSaver(tmp_path / "copy.db") as saver:
        graph = build_agent_graph(saver)
        source: Any = {"configurable": {"thread_id": "src"}}
        target: Any = {"configurable": {"thread_id": "dst"}}
        for turn in range(3):
            graph.invoke({"turns": [{"agent": 7, "turn": turn}]}, source)
        saver.copy_thread("src", "dst")
        graph.invoke({"turns": [{"agent": 7, "turn": 3}]}, target)
        assert graph.get_state(target).values["count"] == 4
        assert graph.get_state(source).values["count"] == 3
        assert len(list(graph.get_state_history(target))) == 20
        with pytest.raises(errors.InvalidInput):
            saver.copy_thread("src", "src")


# --- the spool --------------------------------------------------------------------------------


def test_put_past_the_budget_returns_and_a_read_waits_for_it(tmp_path: Path, spawn: Spawn) -> None:
    path = str(tmp_path / "spool.db")
    with FleetstoreSaver(path, write_budget=0.3, read_wait=0) as saver:
        graph = build_agent_graph(saver)
        config: Any = {"configurable": {"thread_id": "s"}}
        graph.invoke({"turns": [{"agent": 0, "turn": 0}]}, config)
        lock, _ = start_lock(spawn, path, float(HOLD))
        try:
            # Locked: the whole turn's checkpoints and writes go to the spool.
            result = graph.invoke({"turns": [{"agent": 0, "turn": 1}]}, config)
            assert result["count"] == 2
            assert saver.store.metrics()["spool_pending"] >= 5
            with pytest.raises(errors.SpoolPending):
                saver.get_tuple(config)  # read_wait=0: it would miss this process's writes
            with pytest.raises(errors.SpoolPending):
                list(saver.list(None))
            assert saver.get_tuple({"configurable": {"thread_id": "other"}}) is None
        finally:
            release(lock)
        slow = FleetstoreSaver(saver.store, read_wait=60)
        state = build_agent_graph(slow).get_state(config)  # waits for the spool to drain
        assert state.values["count"] == 2
        assert len(list(slow.list(config))) == 10
        assert saver.store.metrics()["spool_pending"] == 0


@pytest.mark.slow
def test_journal_left_by_a_process_that_exited_is_replayed_by_fleetstore_recover(
    tmp_path: Path, spawn: Spawn
) -> None:
    path = str(tmp_path / "recover.db")
    config: Any = {"configurable": {"thread_id": "r"}}
    with FleetstoreSaver(path) as saver:
        build_agent_graph(saver).invoke({"turns": [{"agent": 0, "turn": 0}]}, config)
    # A process whose turn is spooled whole, and which exits (closing waits one
    # budget for the lock) with its journal left behind.
    turn = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(script('langgraph_agent.py')).parent)!r})\n"
        "from fleetstore.integrations.langgraph import FleetstoreSaver\n"
        "from langgraph_agent import build\n"
        f"with FleetstoreSaver({path!r}, write_budget=0.2) as saver:\n"
        "    out = build(saver).invoke({'turns': [{'agent': 0, 'turn': 1}]},\n"
        "                              {'configurable': {'thread_id': 'r'}})\n"
        "    print('count', out['count'], saver.store.metrics()['spool_pending'], flush=True)\n"
    )
    lock, _ = start_lock(spawn, path, float(HOLD))
    try:
        done = subprocess.run(
            [sys.executable, "-c", turn], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["count", "2", "9"]  # 1 put + 1 write a node, 5 + 4
        assert len(list(Path(path + ".spool").glob("*.jsonl"))) == 1
    finally:
        release(lock)
    # `fleetstore recover` never imported the integration: fleetstore itself must
    # register the ckpt_* operations, or the replay stops at the first one.
    done = subprocess.run(
        [sys.executable, "-m", "fleetstore", "recover", path, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["ok"], report
    assert [(j["status"], j["replayed"]) for j in report["journals"]] == [("replayed", 9)]
    with FleetstoreSaver(path) as saver:
        state = build_agent_graph(saver).get_state(config)
        assert state.values["count"] == 2
        assert state.values["note"] == expected_note(0, 1)
        assert len(list(saver.list(config))) == 10


# --- bad input --------------------------------------------------------------------------------


def test_bad_input_raises_a_typed_error_and_writes_nothing(tmp_path: Path) -> None:
    with FleetstoreSaver(tmp_path / "bad.db") as saver:
        graph = build_agent_graph(saver)
        with pytest.raises(errors.InvalidInput, match="thread_id"):
            graph.invoke({"turns": [{"agent": 0, "turn": 0}]}, {"configurable": {"x": 1}})
        with pytest.raises(errors.InvalidInput, match="thread_id"):
            saver.get_tuple({"configurable": {"checkpoint_ns": ""}})
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        checkpoint: Any = {
            "v": 4,
            "id": "1",
            "ts": "",
            "channel_values": {},
            "channel_versions": {},
            "versions_seen": {},
            "updated_channels": None,
        }
        with pytest.raises(errors.InvalidInput, match="metadata"):
            saver.put(config, checkpoint, {"step": 0, "when": object()}, {})  # type: ignore[typeddict-unknown-key]
        with pytest.raises(errors.InvalidInput, match="channel version"):
            saver.put(config, {**checkpoint, "channel_versions": {"c": [1]}}, {}, {})
        with pytest.raises(errors.InvalidInput, match="checkpoint_id"):
            saver.put_writes(config, [("c", 1)], "task")
        with pytest.raises(errors.InvalidInput, match="strategy"):
            saver.prune(["t"], strategy="everything")
        with pytest.raises(errors.InvalidInput):
            saver.prune("t")
        with pytest.raises(errors.InvalidInput):
            saver.delete_for_runs("run-1")
        with pytest.raises(errors.InvalidInput, match="filter"):
            list(saver.list(config, filter=["source"]))  # type: ignore[arg-type]
        with pytest.raises(errors.ConfigError):
            FleetstoreSaver(saver.store, read_wait=-1)
        for table in ("ckpt_checkpoints", "ckpt_channels", "ckpt_writes", "applied_ops"):
            assert rows(saver, table) == 0, table
        assert not any((tmp_path / "bad.db.blobs").rglob("*.*"))


# --- as LangGraph's own savers do (the frameworks' suites, docs/integrations.md) --------------


def _empty_checkpoint(cid: str) -> Any:
    return {
        "v": 4,
        "id": cid,
        "ts": "2024-01-01T00:00:00+00:00",
        "channel_values": {},
        "channel_versions": {},
        "versions_seen": {},
        "updated_channels": None,
    }


def _empty_id_calls(saver: Any) -> list[Any]:
    """put / get_tuple / list with ``checkpoint_id: ""``, as graphs built by some tools
    pass it: what a saver returns for each."""
    empty: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": ""}}
    first = saver.put(empty, _empty_checkpoint("1"), {"step": 0}, {})
    saver.put(first, _empty_checkpoint("2"), {"step": 1}, {})
    got = saver.get_tuple(empty)
    listed = [t.config["configurable"]["checkpoint_id"] for t in saver.list(empty)]
    return [
        first["configurable"]["checkpoint_id"],
        saver.get_tuple(first).parent_config,
        got.config["configurable"]["checkpoint_id"],
        got.parent_config["configurable"]["checkpoint_id"],
        listed,
    ]


def test_an_empty_checkpoint_id_is_no_id_as_in_sqlite_and_in_memory_savers(
    tmp_path: Path,
) -> None:
    """``checkpoint_id: ""`` raised InvalidInput from get_tuple, list and put."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    expected = _empty_id_calls(InMemorySaver())
    with SqliteSaver.from_conn_string(":memory:") as sqlite_saver:
        assert _empty_id_calls(sqlite_saver) == expected
    with FleetstoreSaver(tmp_path / "empty-id.db") as saver:
        assert _empty_id_calls(saver) == expected == ["1", None, "2", "1", ["2", "1"]]
        # As InMemorySaver (SqliteSaver lists nothing before ""): no bound.
        empty: Any = {"configurable": {"thread_id": "t", "checkpoint_id": ""}}
        assert [t.checkpoint["id"] for t in saver.list(None, before=empty)] == ["2", "1"]


def test_metadata_writes_key_is_kept_as_in_sqlite_and_in_memory_savers(tmp_path: Path) -> None:
    """The metadata key ``writes`` was dropped on put (as PostgresSaver does)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    metadata: Any = {"source": "loop", "step": 1, "writes": {"node": {"log": ["a"]}}}
    with SqliteSaver.from_conn_string(":memory:") as sqlite_saver:
        sqlite_saver.put(config, _empty_checkpoint("1"), metadata, {})
        expected = sqlite_saver.get_tuple(config).metadata
    with FleetstoreSaver(tmp_path / "writes.db") as saver:
        saver.put(config, _empty_checkpoint("1"), metadata, {})
        got = saver.get_tuple(config).metadata
        assert got == expected
        assert got["writes"] == {"node": {"log": ["a"]}}
        assert [t.metadata for t in saver.list(config, filter={"writes": metadata["writes"]})]


def test_checkpoints_module_imports_without_langgraph() -> None:
    code = (
        "import sys\n"
        "sys.modules['langgraph'] = None\n"
        "sys.modules['langchain_core'] = None\n"
        "import fleetstore, fleetstore.domain.langgraph\n"
        "from fleetstore.domain.registry import REGISTRY\n"
        "print(sorted(n for n in REGISTRY if n.startswith('ckpt_')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == str(
        sorted(
            [
                "ckpt_copy_thread",
                "ckpt_delete_runs",
                "ckpt_delete_thread",
                "ckpt_prune",
                "ckpt_put",
                "ckpt_put_writes",
            ]
        )
    )


# --- the fleet --------------------------------------------------------------------------------

FLEET = 16
#: Seconds from the start line: the outside lock is taken at LOCK_AT and held
#: LOCK_HOLD; the agents stop starting turns at RUN.
LOCK_AT, LOCK_HOLD, RUN = 3.0, 6.5, 13.0


@pytest.mark.fleet
def test_fleet_of_16_processes_checkpoints_through_an_outside_lock(
    tmp_path: Path, spawn: Spawn, barrier: Barrier
) -> None:
    path = str(tmp_path / "fleet.db")
    fleetstore.open(path).close()  # migrated once, so the lock process finds a store
    procs: list[Proc] = []
    try:
        for n in range(FLEET):
            # Even agents wait the lock out (budget 15 s > 6.5 s); odd ones spool past
            # a 1 s budget and, at their next turn, wait for their spool to drain.
            budget = ["--budget", "15"] if n % 2 == 0 else ["--budget", "1", "--read-wait", "60"]
            argv = [sys.executable, LG_AGENT, path, "--agent", str(n), "--run", str(RUN)]
            argv += ["--barrier", barrier.path, *budget, *(["--async"] if n % 4 >= 2 else [])]
            procs.append(Proc(argv, f"agent {n}"))
        # Every agent has imported LangGraph and opened the store before the start.
        for proc in procs:
            proc.wait_line("ready", timeout=240)
        started = barrier.release()
        time.sleep(max(0.0, started + LOCK_AT - time.time()))
        lock, locked_at = start_lock(spawn, path, float(HOLD))
        time.sleep(max(0.0, locked_at + LOCK_HOLD - time.time()))
        release(lock)
        summaries = {}
        for n, proc in enumerate(procs):
            rc = proc.finish(timeout=240)
            fails = [line for _, line in proc.seen if line.startswith("fail")]
            assert rc == 0 and not fails, (n, rc, fails, proc.stderr_tail())
            (line,) = [line for _, line in proc.seen if line.startswith("summary ")]
            summaries[n] = json.loads(line.removeprefix("summary "))
    finally:
        for proc in procs:
            proc.kill()

    assert all(s["failed"] == 0 and s["ok"] >= 3 for s in summaries.values()), summaries
    # The lock was met: the short-budget agents spooled, and drained before exiting.
    assert all(summaries[n]["spooled"] > 0 for n in range(1, FLEET, 2)), summaries
    assert not list(Path(path + ".spool").glob("*.jsonl"))
    with FleetstoreSaver(path) as saver:
        graph = build_agent_graph(saver)
        for n, summary in summaries.items():
            config: Any = {"configurable": {"thread_id": f"agent-{n}"}}
            turns = summary["ok"]
            history = list(graph.get_state_history(config))
            # 5 checkpoints a turn (input, then one per super-step), newest first,
            # each the child of the next: the history is whole and in order.
            assert len(history) == summary["history"] == 5 * turns, (n, summary)
            ids = [h.config["configurable"]["checkpoint_id"] for h in history]
            assert ids == sorted(ids, reverse=True)
            for newer, older in itertools.pairwise(history):
                assert newer.parent_config is not None
                assert (
                    newer.parent_config["configurable"]["checkpoint_id"]
                    == (older.config["configurable"]["checkpoint_id"])
                )
            assert [h.metadata["step"] for h in history] == list(range(5 * turns - 2, -2, -1))
            head = history[0].values
            assert head["count"] == turns
            assert head["turns"] == [{"agent": n, "turn": t} for t in range(turns)]
            assert head["note"] == expected_note(n, turns - 1)
            # Every checkpoint reads back on its own, with its pending writes.
            for h in history:
                t = saver.get_tuple(h.config)
                assert (
                    t is not None
                    and t.checkpoint["id"] == h.config["configurable"]["checkpoint_id"]
                )
        check = saver.store.read(lambda tx: tx.execute("PRAGMA integrity_check"))
        assert check == [("ok",)]


def test_a_list_filter_compares_numbers_by_value_as_langgraphs_savers_do(
    open_store: OpenStore,
) -> None:
    """``filter={"step": 1.0}`` found nothing where the metadata held 1 (the JSON types,
    integer and real, were compared): InMemorySaver and SqliteSaver find it."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    filters: list[dict[str, Any]] = [{"step": 1.0}, {"step": 1}, {"score": 2}, {"score": 2.5}]

    def found(saver: Any) -> list[list[str]]:
        for n, meta in enumerate(({"step": 1, "score": 2.0}, {"step": 2, "score": 2.5})):
            saver.put(config, _empty_checkpoint(str(n + 1)), meta, {})
        return [[t.checkpoint["id"] for t in saver.list(config, filter=f)] for f in filters]

    expected = found(InMemorySaver())
    with SqliteSaver.from_conn_string(":memory:") as sqlite_saver:
        assert found(sqlite_saver) == expected == [["1"], ["1"], ["1"], ["2"]]
    with FleetstoreSaver(open_store("filter.db")) as saver:
        assert found(saver) == expected
