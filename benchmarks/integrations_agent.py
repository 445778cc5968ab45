"""The agent fleet of benchmarks/bench_integrations.py: N agent processes of one framework,
each persisting its turns through one store, and the check of what reached the file.

    python benchmarks/integrations_agent.py fleet FRAMEWORK STORE PATH --agents N
        --barrier FILE --out DIR --run S [--think S] [--large-share P] [--large-bytes B]
        [--seed K]
    python benchmarks/integrations_agent.py verify FRAMEWORK STORE PATH --agents N

Frameworks and stores (``own`` stores are the framework's, with its defaults):

  langgraph  sqlite        ``langgraph.checkpoint.sqlite.SqliteSaver`` (stdlib sqlite3)
             fleetstore    ``fleetstore.integrations.langgraph.FleetstoreSaver``
  agents     sqlite        ``agents.SQLiteSession`` (stdlib sqlite3, via to_thread)
             async-sqlite  ``agents.extensions.memory.AsyncSQLiteSession`` (aiosqlite)
             fleetstore    ``fleetstore.integrations.openai_agents.FleetstoreSession``
  adk        database      ``DatabaseSessionService("sqlite+aiosqlite:///PATH")``
             sqlite        ``google.adk.sessions.SqliteSessionService(PATH)``
             fleetstore    ``fleetstore.integrations.adk.FleetstoreSessionService``

A turn is what the framework does for one user message, with no network and no model:

  langgraph  ``graph.invoke({"turn": T})`` through three pure-Python nodes (think, tool,
             reply); the tool node's output is the ``note`` channel; the reply node
             appends T to the ``done`` channel (a list, ``operator.add``).
  agents     ``Runner.run(agent, "agent-K turn T", session=session)`` with a scripted
             model: a call of the ``add`` tool, then (seeing its output) a reply.
  adk        ``Runner.run_async(...)`` of a scripted ``BaseAgent`` that yields one reply
             event carrying a state delta; the Runner loads the session and appends the
             user's event and the reply.

A share of turns (``--large-share``, decided by a seeded hash of agent and turn) carries
a large tool output / reply of ``--large-bytes``.  Before each turn an agent thinks for an
exponential time (mean ``--think``).

``fleet`` imports the framework and the store once, creates the schema and every agent's
session in a short-lived child, then forks the N agent processes (real OS processes, each
opening its own store: nothing of SQLite is open in the launcher when it forks; importing
once saves N imports of several seconds each on a small machine).  Each agent prints
``ready K`` when its store is open, its graph/agent built and one warm-up turn run on a
session of its own (``warmup-K``: the first turn in a process loads modules and fills
caches; measured, that storm is not what this compares), blocks on a shared flock of
the barrier file (the benchmark holds it exclusively), then runs turns for ``--run``
seconds from that start line.  The time spent inside the store's own methods (the
persistence calls: LangGraph ``get_tuple``/``put``/``put_writes``, Agents SDK
``get_items``/``add_items``, ADK ``get_session``/``append_event``) is measured by a
subclass of the store class, per turn (the union of the calls' intervals).  A turn that raises is failed: recorded with its
error, never retried, and the agent goes on with its next turn, as a fleet agent would.
Each agent writes ``DIR/agent-K.json``: one record per turn.

``verify`` opens the store read-only-in-practice (only the framework's read calls) in a
fresh process and prints, per agent, the turns whose every item is in the file
(``complete``), those of which only some items are (``partial``), and the number of
duplicated items.  The benchmark compares that with what the agents acknowledged.

Only one SQLite library touches a file in any process: the ``own`` stores use the
standard library (or aiosqlite, which wraps it), the fleetstore ones apsw.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import fcntl
import hashlib
import json
import operator
import os
import random
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

STORES = {
    "langgraph": ("sqlite", "fleetstore"),
    "agents": ("sqlite", "async-sqlite", "fleetstore"),
    "adk": ("database", "sqlite", "fleetstore"),
}
APP = "bench"


# --------------------------------------------------------------------------- timing


class Clock:
    """The store calls of the current turn (any thread).  A turn's persistence time is
    the union of their intervals: LangGraph runs a turn's ``put`` calls in a background
    thread while the next node runs, so calls can overlap and their sum would count a
    wait on the lock several times."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[tuple[float, float]] = []

    def add(self, started: float, ended: float) -> None:
        with self._lock:
            self._spans.append((started, ended))

    def take(self) -> tuple[float, int, float]:
        """(union of the intervals, number of calls, slowest call), and start afresh."""
        with self._lock:
            spans, self._spans = sorted(self._spans), []
        union = 0.0
        reach = float("-inf")
        for a, b in spans:
            if b > reach:
                union += b - max(a, reach)
                reach = b
        return union, len(spans), max((b - a for a, b in spans), default=0.0)


CLOCK = Clock()
# A timed method that calls another timed method is counted once, at the outside.
_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("depth", default=0)


def timed(base: type, sync: tuple[str, ...] = (), coro: tuple[str, ...] = ()) -> type:
    """A subclass of *base* whose methods *sync* and *coro* add their time to CLOCK."""
    ns: dict[str, Any] = {}

    def wrap_sync(fn: Callable[..., Any]) -> Callable[..., Any]:
        def method(self: Any, *args: Any, **kw: Any) -> Any:
            token = _DEPTH.set(_DEPTH.get() + 1)
            started = time.monotonic()
            try:
                return fn(self, *args, **kw)
            finally:
                if _DEPTH.get() == 1:
                    CLOCK.add(started, time.monotonic())
                _DEPTH.reset(token)

        return method

    def wrap_coro(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def method(self: Any, *args: Any, **kw: Any) -> Any:
            token = _DEPTH.set(_DEPTH.get() + 1)
            started = time.monotonic()
            try:
                return await fn(self, *args, **kw)
            finally:
                if _DEPTH.get() == 1:
                    CLOCK.add(started, time.monotonic())
                _DEPTH.reset(token)

        return method

    for name in sync:
        ns[name] = wrap_sync(getattr(base, name))
    for name in coro:
        ns[name] = wrap_coro(getattr(base, name))
    return type("Timed" + base.__name__, (base,), ns)


def is_large(seed: int, agent: int, turn: int, share: float) -> bool:
    if turn < 0:  # the warm-up turn
        return False
    digest = hashlib.sha256(f"{seed}/{agent}/{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def payload(agent: int, turn: int, size: int) -> str:
    unit = f"{agent}:{turn};"
    return (unit * (size // len(unit) + 1))[:size]


# --------------------------------------------------------------------------- LangGraph


class LangGraph:
    name = "langgraph"

    def __init__(self, store: str, path: str) -> None:
        self.store, self.path = store, path

    def preload(self) -> None:
        import langgraph.graph

        if self.store == "sqlite":
            import langgraph.checkpoint.sqlite  # noqa: F401
        else:
            import fleetstore.integrations.langgraph  # noqa: F401

    def saver(self, clock: bool) -> Any:
        if self.store == "sqlite":
            import sqlite3

            from langgraph.checkpoint.sqlite import SqliteSaver

            cls = (
                timed(SqliteSaver, sync=("get_tuple", "put", "put_writes"))
                if clock
                else SqliteSaver
            )
            # What SqliteSaver.from_conn_string does (its documented setup).
            return cls(sqlite3.connect(self.path, check_same_thread=False))
        from fleetstore.integrations.langgraph import FleetstoreSaver

        cls = (
            timed(FleetstoreSaver, sync=("get_tuple", "put", "put_writes"))
            if clock
            else FleetstoreSaver
        )
        return cls(self.path)

    def close(self, saver: Any) -> None:
        if self.store == "sqlite":
            saver.conn.close()
        else:
            saver.close()

    def graph(self, saver: Any, agent: int, args: argparse.Namespace) -> Any:
        from langgraph.graph import END, START, StateGraph

        class State(TypedDict, total=False):
            turn: int
            note: str
            done: Annotated[list[int], operator.add]

        def think(state: State) -> dict[str, Any]:
            return {"note": f"thinking about turn {state['turn']}"}

        def tool(state: State) -> dict[str, Any]:
            t = state["turn"]
            big = is_large(args.seed, agent, t, args.large_share)
            return {"note": payload(agent, t, args.large_bytes if big else 200)}

        def reply(state: State) -> dict[str, Any]:
            return {"done": [state["turn"]]}

        g = StateGraph(State)
        g.add_node("think", think)
        g.add_node("tool", tool)
        g.add_node("reply", reply)
        g.add_edge(START, "think")
        g.add_edge("think", "tool")
        g.add_edge("tool", "reply")
        g.add_edge("reply", END)
        return g.compile(checkpointer=saver)

    def setup(self, agents: int) -> None:
        saver = self.saver(clock=False)
        if self.store == "sqlite":
            saver.setup()
        self.close(saver)

    def run_agent(self, agent: int, args: argparse.Namespace, loop: AgentLoop) -> None:
        saver = self.saver(clock=True)
        if self.store == "sqlite":
            saver.setup()  # its per-connection setup, before the start line
        graph = self.graph(saver, agent, args)
        config = {"configurable": {"thread_id": f"agent-{agent}"}}
        warm = {"configurable": {"thread_id": f"warmup-{agent}"}}
        loop.warm_up(lambda: graph.invoke({"turn": -1}, warm))
        loop.ready()
        try:
            loop.run_sync(lambda t: graph.invoke({"turn": t}, config))
        finally:
            self.close(saver)

    def verify(self, agents: int) -> list[dict[str, Any]]:
        saver = self.saver(clock=False)
        out = []
        try:
            for k in range(agents):
                config: Any = {"configurable": {"thread_id": f"agent-{k}"}}
                latest = saver.get_tuple(config)
                done = list(latest.checkpoint["channel_values"].get("done", [])) if latest else []
                # Any checkpoint with a turn's input in it: the turn began on disk.
                began = set()
                for tup in saver.list(config):
                    t = tup.checkpoint["channel_values"].get("turn")
                    if t is not None:
                        began.add(int(t))
                complete = sorted(set(done))
                out.append(
                    {
                        "agent": k,
                        "complete": complete,
                        "partial": sorted(began - set(done)),
                        "duplicates": len(done) - len(complete),
                    }
                )
        finally:
            self.close(saver)
        return out


# --------------------------------------------------------------------------- Agents SDK


class AgentsSDK:
    name = "agents"

    def __init__(self, store: str, path: str) -> None:
        self.store, self.path = store, path

    def preload(self) -> None:
        import agents

        if self.store == "async-sqlite":
            import agents.extensions.memory.async_sqlite_session  # noqa: F401
        elif self.store == "fleetstore":
            import fleetstore.integrations.openai_agents.adapter  # noqa: F401

    def session_class(self, clock: bool) -> type:
        if self.store == "sqlite":
            from agents import SQLiteSession as cls
        elif self.store == "async-sqlite":
            from agents.extensions.memory.async_sqlite_session import AsyncSQLiteSession as cls
        else:
            from fleetstore.integrations.openai_agents import FleetstoreSession as cls
        return timed(cls, coro=("get_items", "add_items")) if clock else cls

    def session(self, agent: int, clock: bool) -> Any:
        return self.session_class(clock)(f"agent-{agent}", self.path)

    async def close(self, session: Any) -> None:
        if self.store == "async-sqlite":
            await session.close()
        else:
            session.close()

    def setup(self, agents: int) -> None:
        async def go() -> None:
            s = self.session(0, clock=False)
            await s.get_items()  # creates the tables
            await self.close(s)

        asyncio.run(go())

    def make_agent(self, agent: int, turn: int, args: argparse.Namespace) -> Any:
        from agents.items import ModelResponse
        from agents.models.interface import Model
        from agents.usage import Usage
        from openai.types.responses import (
            ResponseFunctionToolCall,
            ResponseOutputMessage,
            ResponseOutputText,
        )

        from agents import Agent, function_tool

        big = is_large(args.seed, agent, turn, args.large_share)

        class Scripted(Model):
            calls = 0

            async def get_response(self, *a: Any, **kw: Any) -> ModelResponse:
                self.calls += 1
                out: list[Any]
                if self.calls == 1:
                    out = [
                        ResponseFunctionToolCall(
                            id=f"fc-{agent}-{turn}",
                            call_id=f"call-{agent}-{turn}",
                            type="function_call",
                            name="add",
                            arguments=json.dumps({"a": turn, "b": 7}),
                        )
                    ]
                else:
                    text = ResponseOutputText(
                        text=f"agent-{agent} turn {turn} done", type="output_text", annotations=[]
                    )
                    out = [
                        ResponseOutputMessage(
                            id=f"msg-{agent}-{turn}",
                            type="message",
                            role="assistant",
                            status="completed",
                            content=[text],
                        )
                    ]
                return ModelResponse(output=out, usage=Usage(), response_id=None)

            def stream_response(self, *a: Any, **kw: Any) -> Any:
                raise NotImplementedError

        @function_tool
        def add(a: int, b: int) -> str:
            """Add two numbers."""
            return payload(agent, a, args.large_bytes) if big else str(a + b)

        return Agent(name=f"agent-{agent}", instructions="add", model=Scripted(), tools=[add])

    def run_agent(self, agent: int, args: argparse.Namespace, loop: AgentLoop) -> None:
        from agents import Runner, set_tracing_disabled

        set_tracing_disabled(True)

        async def go() -> None:
            session = self.session(agent, clock=True)

            async def turn(t: int, on: Any = session) -> None:
                result = await Runner.run(
                    self.make_agent(agent, t, args), f"agent-{agent} turn {t}", session=on
                )
                if result.final_output != f"agent-{agent} turn {t} done":
                    raise AssertionError(f"final output {result.final_output!r}")

            await session.get_items()  # its connection opened before the start line
            warm = self.session_class(clock=False)(f"warmup-{agent}", self.path)
            await loop.warm_up_async(lambda: turn(-1, warm))
            await self.close(warm)
            loop.ready()

            try:
                await loop.run_async(turn)
            finally:
                await self.close(session)

        asyncio.run(go())

    def verify(self, agents: int) -> list[dict[str, Any]]:
        async def go() -> list[dict[str, Any]]:
            out = []
            for k in range(agents):
                s = self.session(k, clock=False)
                items = await s.get_items()
                await self.close(s)
                kinds: dict[int, list[str]] = {}
                for item in items:
                    i = dict(item)
                    kind = i.get("type", "message")
                    if kind == "message" and i.get("role") == "user":
                        t = int(str(i["content"]).split()[-1])
                        kinds.setdefault(t, []).append("user")
                    elif kind in ("function_call", "function_call_output"):
                        t = int(str(i["call_id"]).rsplit("-", 1)[1])
                        kinds.setdefault(t, []).append(kind)
                    elif kind == "message" and i.get("role") == "assistant":
                        text = "".join(str(c.get("text", "")) for c in i["content"])
                        kinds.setdefault(int(text.split()[2]), []).append("reply")
                want = {"user", "function_call", "function_call_output", "reply"}
                out.append(
                    {
                        "agent": k,
                        "complete": sorted(t for t, ks in kinds.items() if set(ks) == want),
                        "partial": sorted(t for t, ks in kinds.items() if set(ks) != want),
                        "duplicates": sum(len(ks) - len(set(ks)) for ks in kinds.values()),
                    }
                )
            return out

        return asyncio.run(go())


# --------------------------------------------------------------------------- ADK


class ADK:
    name = "adk"

    def __init__(self, store: str, path: str) -> None:
        self.store, self.path = store, path

    def preload(self) -> None:
        import google.adk.runners

        if self.store == "database":
            import google.adk.sessions.database_session_service
        elif self.store == "sqlite":
            import google.adk.sessions.sqlite_session_service  # noqa: F401
        else:
            import fleetstore.integrations.adk  # noqa: F401

    def service(self, clock: bool) -> Any:
        names = ("get_session", "append_event")
        if self.store == "database":
            from google.adk.sessions.database_session_service import DatabaseSessionService

            cls: type = (
                timed(DatabaseSessionService, coro=names) if clock else DatabaseSessionService
            )
            return cls(f"sqlite+aiosqlite:///{self.path}")
        if self.store == "sqlite":
            from google.adk.sessions.sqlite_session_service import SqliteSessionService

            cls = timed(SqliteSessionService, coro=names) if clock else SqliteSessionService
            return cls(self.path)
        from fleetstore.integrations.adk import FleetstoreSessionService

        cls = timed(FleetstoreSessionService, coro=names) if clock else FleetstoreSessionService
        return cls(self.path)

    async def close(self, service: Any) -> None:
        if self.store == "fleetstore":
            await service.drain(120.0)
        close = getattr(service, "close", None)
        if close is not None:
            await close()

    def setup(self, agents: int) -> None:
        async def go() -> None:
            service = self.service(clock=False)
            for k in range(agents):
                await service.create_session(
                    app_name=APP, user_id=f"user-{k}", session_id=f"session-{k}", state={}
                )
            await self.close(service)

        asyncio.run(go())

    def run_agent(self, agent: int, args: argparse.Namespace, loop: AgentLoop) -> None:
        from collections.abc import AsyncGenerator

        from google.adk.agents import BaseAgent
        from google.adk.agents.invocation_context import InvocationContext
        from google.adk.events.event import Event
        from google.adk.events.event_actions import EventActions
        from google.adk.runners import Runner
        from google.genai import types

        class Scripted(BaseAgent):
            async def _run_async_impl(self, ctx: InvocationContext) -> AsyncGenerator[Event, None]:
                said = ctx.user_content.parts[0].text if ctx.user_content else None
                t = int(str(said).split()[-1])
                big = is_large(args.seed, agent, t, args.large_share)
                text = f"reply {t}: " + payload(agent, t, args.large_bytes if big else 200)
                yield Event(
                    author=self.name,
                    invocation_id=ctx.invocation_id,
                    content=types.Content(role="model", parts=[types.Part(text=text)]),
                    actions=EventActions(state_delta={"turns": t + 1, "user:last": t}),
                )

        async def go() -> None:
            service = self.service(clock=True)
            uid, sid = f"user-{agent}", f"session-{agent}"
            await service.get_session(app_name=APP, user_id=uid, session_id=sid)
            runner = Runner(agent=Scripted(name="scripted"), app_name=APP, session_service=service)

            async def turn(t: int, on: str = sid) -> None:
                message = types.Content(
                    role="user", parts=[types.Part(text=f"agent {agent} turn {t}")]
                )
                got = 0
                async for _ in runner.run_async(user_id=uid, session_id=on, new_message=message):
                    got += 1
                if got != 1:
                    raise AssertionError(f"{got} events from the runner")

            warm = f"warmup-{agent}"
            await service.create_session(app_name=APP, user_id=uid, session_id=warm, state={})
            await loop.warm_up_async(lambda: turn(-1, warm))
            loop.ready()

            try:
                await loop.run_async(turn)
            finally:
                await runner.close()
                await self.close(service)

        asyncio.run(go())

    def verify(self, agents: int) -> list[dict[str, Any]]:
        async def go() -> list[dict[str, Any]]:
            service = self.service(clock=False)
            out = []
            for k in range(agents):
                s = await service.get_session(
                    app_name=APP, user_id=f"user-{k}", session_id=f"session-{k}"
                )
                kinds: dict[int, list[str]] = {}
                for e in s.events if s else []:
                    text = e.content.parts[0].text if e.content and e.content.parts else ""
                    text = str(text)
                    if e.author == "user":
                        kinds.setdefault(int(text.split()[-1]), []).append("user")
                    elif text.startswith("reply "):
                        kinds.setdefault(int(text.split()[1].rstrip(":")), []).append("reply")
                want = {"user", "reply"}
                out.append(
                    {
                        "agent": k,
                        "complete": sorted(t for t, ks in kinds.items() if set(ks) == want),
                        "partial": sorted(t for t, ks in kinds.items() if set(ks) != want),
                        "duplicates": sum(len(ks) - len(set(ks)) for ks in kinds.values()),
                    }
                )
            await self.close(service)
            return out

        return asyncio.run(go())


FRAMEWORKS: dict[str, type[LangGraph] | type[AgentsSDK] | type[ADK]] = {
    "langgraph": LangGraph,
    "agents": AgentsSDK,
    "adk": ADK,
}


# --------------------------------------------------------------------------- the agent loop


class AgentLoop:
    """Start line, think time, per-turn records; the same for every framework."""

    def __init__(self, agent: int, args: argparse.Namespace) -> None:
        self.agent = agent
        self.args = args
        self.rng = random.Random(f"{args.seed}/think/{agent}")
        self.turns: list[dict[str, Any]] = []
        self.start = 0.0
        self.cpu_start = 0.0

    def warm_up(self, turn: Callable[[], Any]) -> None:
        """One turn on a session of its own before the start line: a framework's first
        turn in a process loads modules and builds caches (ADK's took 16-20 s of a
        64-process start on 2 cores), which is not what the benchmark compares."""
        for _ in range(3):
            try:
                turn()
                break
            except Exception:
                traceback.print_exc()
        CLOCK.take()

    async def warm_up_async(self, turn: Callable[[], Awaitable[None]]) -> None:
        for _ in range(3):
            try:
                await turn()
                break
            except Exception:
                traceback.print_exc()
        CLOCK.take()

    def ready(self) -> None:
        os.write(1, f"ready {self.agent}\n".encode())
        fd = os.open(self.args.barrier, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        finally:
            os.close(fd)
        self.start = time.monotonic()
        self.cpu_start = time.process_time()

    def _think(self) -> bool:
        """Sleep the think time; False when the run is over."""
        time.sleep(self.rng.expovariate(1.0 / self.args.think))
        return time.monotonic() < self.start + self.args.run

    def _record(self, t: int, started: float, error: BaseException | None) -> None:
        ended = time.monotonic()
        spent, calls, slowest = CLOCK.take()
        rec: dict[str, Any] = {
            "turn": t,
            "start": started,
            "end": ended,
            "ok": error is None,
            "persist": spent,
            "calls": calls,
            "slowest_call": slowest,
            "large": is_large(self.args.seed, self.agent, t, self.args.large_share),
        }
        if error is not None:
            rec["error"] = f"{type(error).__name__}: {error}"[:300]
            if len(self.turns) < 3 or not any("trace" in r for r in self.turns):
                rec["trace"] = "".join(traceback.format_exception(error))[-3000:]
        self.turns.append(rec)

    def run_sync(self, turn: Callable[[int], Any]) -> None:
        t = 0
        while self._think():
            started = time.monotonic()
            CLOCK.take()
            try:
                turn(t)
            except Exception as exc:
                self._record(t, started, exc)
            else:
                self._record(t, started, None)
            t += 1

    async def run_async(self, turn: Callable[[int], Awaitable[None]]) -> None:
        t = 0
        while True:
            await asyncio.sleep(self.rng.expovariate(1.0 / self.args.think))
            if time.monotonic() >= self.start + self.args.run:
                break
            started = time.monotonic()
            CLOCK.take()
            try:
                await turn(t)
            except Exception as exc:
                self._record(t, started, exc)
            else:
                self._record(t, started, None)
            t += 1


def agent_main(fw: Any, agent: int, args: argparse.Namespace) -> int:
    loop = AgentLoop(agent, args)
    result: dict[str, Any] = {"agent": agent, "pid": os.getpid()}
    code = 0
    try:
        fw.run_agent(agent, args, loop)
    except BaseException as exc:
        result["crash"] = "".join(traceback.format_exception(exc))[-3000:]
        code = 1
        if not loop.start:
            os.write(1, f"crash {agent}\n".encode())
    result["start"] = loop.start
    # This process's CPU (all threads) from the start line: the benchmark subtracts the
    # fleet's CPU from the machine's to show what other processes took.
    result["cpu_s"] = time.process_time() - loop.cpu_start if loop.start else 0.0
    result["turns"] = loop.turns
    result["closed"] = time.monotonic()
    tmp = Path(args.out) / f".agent-{agent}.json"
    tmp.write_text(json.dumps(result))
    tmp.rename(Path(args.out) / f"agent-{agent}.json")
    return code


def fork_run(fn: Callable[[], int]) -> int:
    """Run *fn* in a forked child; returns its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = fn()
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return pid


def fleet(args: argparse.Namespace) -> int:
    fw = FRAMEWORKS[args.framework](args.store, args.path)
    fw.preload()
    versions = {"python": sys.version.split()[0]}
    import sqlite3

    versions["sqlite3"] = sqlite3.sqlite_version
    for mod in ("langgraph", "openai-agents", "google-adk", "langgraph-checkpoint-sqlite"):
        try:
            from importlib.metadata import version

            versions[mod] = version(mod)
        except Exception:
            pass
    print("versions " + json.dumps(versions), flush=True)

    def setup() -> int:
        fw.setup(args.agents)
        return 0

    pid = fork_run(setup)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        print("setup-failed", flush=True)
        return 1
    if threading.active_count() != 1:
        print(f"setup-failed: {threading.active_count()} threads before fork", flush=True)
        return 1
    Path(args.out).mkdir(parents=True, exist_ok=True)
    pids = [fork_run(lambda k=k: agent_main(fw, k, args)) for k in range(args.agents)]  # type: ignore[misc]
    bad = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        bad += os.waitstatus_to_exitcode(status) != 0
    print(f"done {len(pids) - bad} ok {bad} crashed", flush=True)
    return 0 if bad == 0 else 1


def verify(args: argparse.Namespace) -> int:
    fw = FRAMEWORKS[args.framework](args.store, args.path)
    if args.framework == "agents":
        from agents import set_tracing_disabled

        set_tracing_disabled(True)
    print(json.dumps(fw.verify(args.agents)), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("fleet", "verify"):
        p = sub.add_parser(name)
        p.add_argument("framework", choices=sorted(STORES))
        p.add_argument("store")
        p.add_argument("path")
        p.add_argument("--agents", type=int, required=True)
        if name == "fleet":
            p.add_argument("--barrier", required=True)
            p.add_argument("--out", required=True)
            p.add_argument("--run", type=float, required=True)
            p.add_argument("--think", type=float, default=0.5)
            p.add_argument("--large-share", type=float, default=0.03)
            p.add_argument("--large-bytes", type=int, default=2 * 1024 * 1024)
            p.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.store not in STORES[args.framework]:
        parser.error(f"{args.framework} stores: {', '.join(STORES[args.framework])}")
    return fleet(args) if args.command == "fleet" else verify(args)


if __name__ == "__main__":
    sys.exit(main())
