"""A LangGraph agent process for tests/integrations/test_langgraph.py: a small StateGraph with
pure-Python nodes (no model), checkpointed by ``FleetstoreSaver``.

    python tests/agents/langgraph_agent.py PATH --agent N --run SECONDS --barrier FILE
        [--budget S] [--read-wait S] [--async]

It imports everything, then waits on the barrier (a shared flock the test holds
exclusively), then runs turns on its own thread ``agent-N`` for *SECONDS* from
that start line: each turn is one ``invoke`` (``ainvoke`` with ``--async``) through
three nodes, every third turn carrying a value above the blob threshold.  A
failed invocation is printed (``fail ...``) and counted, never hidden.  At the
end it reads its thread's history back and prints one JSON summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import operator
import os
import sys
import time
import traceback
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from fleetstore.integrations.langgraph import FleetstoreSaver

BIG = 80 * 1024  # above the default blob_threshold (64 KiB)


class Turn(TypedDict, total=False):
    turns: Annotated[list[dict[str, Any]], operator.add]
    count: int
    note: str


def think(state: Turn) -> dict[str, Any]:
    last = state["turns"][-1]
    return {"note": f"thinking about turn {last['turn']}"}


def tool(state: Turn) -> dict[str, Any]:
    last = state["turns"][-1]
    size = BIG if last["turn"] % 3 == 0 else 100
    return {"note": (f"{last['agent']}:{last['turn']}:" * (size // 8 + 1))[:size]}


def reply(state: Turn) -> dict[str, Any]:
    return {"count": state.get("count", 0) + 1}


def build(saver: Any) -> CompiledStateGraph[Any, Any, Any, Any]:
    graph = StateGraph(Turn)
    graph.add_node("think", think)
    graph.add_node("tool", tool)
    graph.add_node("reply", reply)
    graph.add_edge(START, "think")
    graph.add_edge("think", "tool")
    graph.add_edge("tool", "reply")
    graph.add_edge("reply", END)
    return graph.compile(checkpointer=saver)


def expected_note(agent: int, turn: int) -> str:
    size = BIG if turn % 3 == 0 else 100
    return (f"{agent}:{turn}:" * (size // 8 + 1))[:size]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--agent", type=int, required=True)
    parser.add_argument("--run", type=float, required=True)
    parser.add_argument("--barrier", required=True)
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--read-wait", type=float, default=None)
    parser.add_argument("--async", dest="use_async", action="store_true")
    args = parser.parse_args()

    saver = FleetstoreSaver(args.path, write_budget=args.budget, read_wait=args.read_wait)
    graph = build(saver)
    config: Any = {"configurable": {"thread_id": f"agent-{args.agent}"}}
    print("ready", flush=True)
    fd = os.open(args.barrier, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.close(fd)
    until = time.monotonic() + args.run

    ok = failed = 0
    slowest = 0.0

    def turn_input(turn: int) -> dict[str, Any]:
        return {"turns": [{"agent": args.agent, "turn": turn}]}

    def record(started: float, error: BaseException | None) -> None:
        nonlocal ok, failed, slowest
        slowest = max(slowest, time.monotonic() - started)
        if error is None:
            ok += 1
        else:
            failed += 1
            print(f"fail turn {ok + failed}: {type(error).__name__}: {error}", flush=True)
            traceback.print_exception(error, file=sys.stderr)

    if args.use_async:

        async def run() -> int:
            while time.monotonic() < until:
                started = time.monotonic()
                try:
                    await graph.ainvoke(turn_input(ok), config)
                except Exception as exc:
                    record(started, exc)
                else:
                    record(started, None)
                await asyncio.sleep(0.02)
            return len([h async for h in graph.aget_state_history(config)])

        history = asyncio.run(run())
    else:
        while time.monotonic() < until:
            started = time.monotonic()
            try:
                graph.invoke(turn_input(ok), config)
            except Exception as exc:
                record(started, exc)
            else:
                record(started, None)
            time.sleep(0.02)
        history = len(list(graph.get_state_history(config)))

    metrics = saver.store.metrics()
    saver.close()
    summary = {
        "agent": args.agent,
        "ok": ok,
        "failed": failed,
        "history": history,
        "spooled": metrics["spooled"],
        "slowest": round(slowest, 3),
    }
    print("summary " + json.dumps(summary), flush=True)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
