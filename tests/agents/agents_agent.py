"""An OpenAI Agents SDK agent process for tests/integrations/test_openai_agents.py: the SDK's
``Runner`` with a scripted fake model (no network) and a ``FleetstoreSession``.

    python tests/agents/agents_agent.py fleet PATH --agent N --barrier FILE --stop FILE
        [--budget S] [--min-turns K] [--pace S] [--flush S]
    python tests/agents/agents_agent.py turns PATH --session ID --first T --count K
    python tests/agents/agents_agent.py make-sqlite FILE SPEC.json

Each turn is one ``Runner.run``: the user asks, the model calls the ``add`` tool,
then replies.  The model checks what the Runner sends it: the session's whole
history so far (every earlier turn's four items, in order) plus this turn's
items, and raises otherwise, so a lost, duplicated or reordered item fails the
turn.  Every third turn's tool output is 80 KiB (above the blob threshold).

``fleet`` waits on the barrier (a shared flock the test holds exclusively),
then runs turns on session ``agent-N`` until the stop file exists and at least
*min-turns* are done, printing ``turn T STARTED ENDED`` (times) after each; then it waits up to
*flush* seconds for its spool to drain, reads its history back, and prints a
JSON summary line.  A failed turn is printed (``fail ...``) and counted; the
exit code is 1 if any turn failed or the history does not match.

``turns`` runs turns *first*.. *first+count-1* on one session and exits: run it
twice to see a history persisted by one process resumed by another.

``make-sqlite`` writes an SDK ``SQLiteSession`` file (the stdlib ``sqlite3``,
in this process only, never beside fleetstore) from a JSON spec:
``{"sessions": {ID: [item, ...]}, "runs": {ID: TURNS}, "raw": {ID: [text, ...]}}``
(``runs``: turns of the Runner; ``raw``: rows inserted as given, e.g. not JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import hashlib
import json
import os
import sys
import time
import traceback
from typing import Any

from agents.items import ModelResponse, TResponseInputItem
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from agents import Agent, Runner, function_tool, set_tracing_disabled

set_tracing_disabled(True)

BIG = 80 * 1024


def user_text(agent: str, turn: int) -> str:
    return f"{agent}: turn {turn}, add {turn} and 7"


def tool_output(agent: str, turn: int) -> str:
    total = str(turn + 7)
    if turn % 3 == 2:
        return (total + ":" + agent + ";") * (BIG // (len(agent) + len(total) + 2) + 1)
    return total


def reply_text(agent: str, turn: int) -> str:
    return f"{agent}: turn {turn} done, the sum is {turn + 7}"


def call_id(agent: str, turn: int) -> str:
    return f"call-{agent}-{turn}"


def summary(item: dict[str, Any]) -> tuple[str, ...]:
    """What identifies an item of these turns (the test compares these)."""
    kind = item.get("type", "message")
    if kind == "message" and item.get("role") == "user":
        return ("user", str(item["content"]))
    if kind == "function_call":
        return ("call", str(item["call_id"]), str(item["arguments"]))
    if kind == "function_call_output":
        out = str(item["output"])
        return ("output", str(item["call_id"]), hashlib.sha256(out.encode()).hexdigest())
    if kind == "message" and item.get("role") == "assistant":
        return ("reply", "".join(str(c.get("text", "")) for c in item["content"]))
    return ("other", json.dumps(item, sort_keys=True))


def expected(agent: str, turn: int) -> list[tuple[str, ...]]:
    """The four items turn *turn* adds, summarised."""
    out = hashlib.sha256(tool_output(agent, turn).encode()).hexdigest()
    args = json.dumps({"a": turn, "b": 7}, separators=(",", ":"))
    return [
        ("user", user_text(agent, turn)),
        ("call", call_id(agent, turn), args),
        ("output", call_id(agent, turn), out),
        ("reply", reply_text(agent, turn)),
    ]


def history(agent: str, turns: int) -> list[tuple[str, ...]]:
    return [s for t in range(turns) for s in expected(agent, t)]


class ScriptedModel(Model):
    """Two calls a turn: first the tool call, then (seeing its output) the reply.
    Each call checks that its input is exactly the history so far."""

    def __init__(self, agent: str, turn: int) -> None:
        self.agent = agent
        self.turn = turn
        self.calls = 0

    def _check(self, input: str | list[TResponseInputItem], want: list[tuple[str, ...]]) -> None:
        got = [summary(dict(i)) for i in input] if isinstance(input, list) else [("str",)]
        if got != want:
            first = next(
                (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                min(len(got), len(want)),
            )
            raise AssertionError(
                f"{self.agent} turn {self.turn} call {self.calls}: the model got {len(got)} "
                f"items, expected {len(want)}; first difference at item {first}: "
                f"{got[first : first + 1]} != {want[first : first + 1]}"
            )

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: Any,
        tools: Any,
        output_schema: Any,
        handoffs: Any,
        tracing: Any,
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: Any = None,
        **_: Any,
    ) -> ModelResponse:
        before = history(self.agent, self.turn)
        this = expected(self.agent, self.turn)
        self.calls += 1
        if self.calls == 1:
            self._check(input, [*before, this[0]])
            args = json.dumps({"a": self.turn, "b": 7}, separators=(",", ":"))
            output: list[Any] = [
                ResponseFunctionToolCall(
                    id=f"fc-{self.agent}-{self.turn}",
                    call_id=call_id(self.agent, self.turn),
                    type="function_call",
                    name="add",
                    arguments=args,
                )
            ]
        else:
            self._check(input, [*before, *this[:3]])
            text = ResponseOutputText(
                text=reply_text(self.agent, self.turn), type="output_text", annotations=[]
            )
            output = [
                ResponseOutputMessage(
                    id=f"msg-{self.agent}-{self.turn}",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[text],
                )
            ]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("these tests run without streaming")


def make_agent(agent: str, turn: int) -> Agent[Any]:
    @function_tool
    def add(a: int, b: int) -> str:
        """Add two numbers."""
        return tool_output(agent, a)

    return Agent(name=agent, instructions="add", model=ScriptedModel(agent, turn), tools=[add])


async def run_turn(session: Any, agent: str, turn: int) -> None:
    result = await Runner.run(make_agent(agent, turn), user_text(agent, turn), session=session)
    if result.final_output != reply_text(agent, turn):
        raise AssertionError(f"turn {turn}: final output {result.final_output!r}")


# -- commands --------------------------------------------------------------------------------


async def fleet(args: argparse.Namespace) -> int:
    import fleetstore
    from fleetstore.integrations.openai_agents import FleetstoreSession

    agent = f"agent-{args.agent}"
    store = fleetstore.open(args.path, write_budget=args.budget)
    session = FleetstoreSession(agent, store)
    print("ready", flush=True)
    fd = os.open(args.barrier, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.close(fd)
    turns = failures = 0
    while turns < args.min_turns or not os.path.exists(args.stop):
        started = time.time()
        try:
            await run_turn(session, agent, turns)
        except Exception as exc:
            failures += 1
            print(f"fail {turns} {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
            break
        turns += 1
        print(f"turn {turns - 1} {started:.6f} {time.time():.6f}", flush=True)
        await asyncio.sleep(args.pace)
    metrics = store.metrics()
    drained = store.flush(timeout=args.flush)
    stored = [summary(i) for i in await session.get_items()]
    ok = stored == history(agent, turns)
    session.close()
    store.close()
    out = {
        "agent": agent,
        "turns": turns,
        "failures": failures,
        "drained": drained,
        "history_ok": ok,
        "spooled": metrics["spooled"],
    }
    print(json.dumps(out), flush=True)
    return 0 if failures == 0 and ok and drained else 1


async def turns(args: argparse.Namespace) -> int:
    import fleetstore
    from fleetstore.integrations.openai_agents import FleetstoreSession

    store = fleetstore.open(args.path)
    session = FleetstoreSession(args.session, store)
    for turn in range(args.first, args.first + args.count):
        await run_turn(session, args.session, turn)
        print(f"turn {turn}", flush=True)
    items = await session.get_items()
    session.close()
    store.close()
    print(json.dumps({"items": len(items)}), flush=True)
    return 0


async def make_sqlite(args: argparse.Namespace) -> int:
    import sqlite3

    from agents import SQLiteSession

    with open(args.spec) as f:
        spec = json.load(f)
    for sid, count in spec.get("runs", {}).items():
        session = SQLiteSession(sid, args.file)
        for turn in range(count):
            await run_turn(session, sid, turn)
        session.close()
    for sid, items in spec.get("sessions", {}).items():
        session = SQLiteSession(sid, args.file)
        await session.add_items(items)
        session.close()
    if spec.get("raw"):
        SQLiteSession("_schema", args.file).close()  # the tables exist
        conn = sqlite3.connect(args.file)
        with conn:
            for sid, texts in spec["raw"].items():
                conn.execute("INSERT OR IGNORE INTO agent_sessions (session_id) VALUES (?)", (sid,))
                conn.executemany(
                    "INSERT INTO agent_messages (session_id, message_data) VALUES (?, ?)",
                    [(sid, t) for t in texts],
                )
        conn.close()
    # What the SDK itself reads back, for the test to compare with.
    out = {}
    conn = sqlite3.connect(args.file)
    names = [r[0] for r in conn.execute("SELECT session_id FROM agent_sessions")]
    conn.close()
    for sid in names:
        session = SQLiteSession(sid, args.file)
        out[sid] = await session.get_items()
        session.close()
    print(json.dumps(out), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("fleet")
    p.add_argument("path")
    p.add_argument("--agent", type=int, required=True)
    p.add_argument("--barrier", required=True)
    p.add_argument("--stop", required=True)
    p.add_argument("--budget", type=float, default=60.0)
    p.add_argument("--min-turns", type=int, default=3)
    p.add_argument("--pace", type=float, default=0.05)
    p.add_argument("--flush", type=float, default=150.0)
    p = sub.add_parser("turns")
    p.add_argument("path")
    p.add_argument("--session", required=True)
    p.add_argument("--first", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p = sub.add_parser("make-sqlite")
    p.add_argument("file")
    p.add_argument("spec")
    args = parser.parse_args()
    command = {"fleet": fleet, "turns": turns, "make-sqlite": make_sqlite}[args.command]
    return asyncio.run(command(args))


if __name__ == "__main__":
    sys.exit(main())
