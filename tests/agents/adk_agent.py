"""One agent of the ADK fleet test (tests/integrations/test_adk.py): a scripted ADK agent that keeps
its session in a fleetstore store through ``FleetstoreSessionService``.

It creates its session, prints ``ready``, waits at the barrier, then runs turns until
the ``--stop`` file exists (and at least ``--min-turns``).  A turn is what ADK's
Runner does: ``get_session`` (reload), append the user's event (state delta
``turn``), append the agent's reply (session, ``user:``, ``app:`` and ``temp:``
deltas).  After both appends returned it writes ``{"turn": N, "t": TIME}`` to its
log (one ``os.write``), and prints ``turn N`` for the first turns.  At the end it
waits for its spool to drain, closes, and prints one JSON line of counts.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import sys
import time

from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.genai import types

from fleetstore.integrations.adk import FleetstoreSessionService

APP = "fleet"


def user_id(agent: int) -> str:
    return f"user-{agent}"


def session_id(agent: int) -> str:
    return f"session-{agent}"


def question(agent: int, turn: int) -> str:
    return f"agent {agent} asks question {turn}"


def answer(agent: int, turn: int) -> str:
    return f"agent {agent} answers turn {turn}"


def wait_barrier(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def text_event(author: str, invocation: str, text: str, delta: dict[str, object]) -> Event:
    role = "user" if author == "user" else "model"
    return Event(
        author=author,
        invocation_id=invocation,
        content=types.Content(role=role, parts=[types.Part(text=text)]),
        actions=EventActions(state_delta=delta),
    )


async def run(args: argparse.Namespace) -> dict[str, object]:
    settings: dict[str, object] = {}
    if args.write_budget is not None:
        settings["write_budget"] = args.write_budget
    service = FleetstoreSessionService(args.path, **settings)
    n = args.agent
    await service.create_session(
        app_name=APP,
        user_id=user_id(n),
        session_id=session_id(n),
        state={"turns": 0, "user:agent": n},
    )
    log_fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    print("ready", flush=True)
    if args.barrier:
        wait_barrier(args.barrier)
    turn = 0
    slowest = 0.0
    while turn < args.min_turns or not os.path.exists(args.stop):
        started = time.time()
        session = await service.get_session(
            app_name=APP, user_id=user_id(n), session_id=session_id(n)
        )
        assert session is not None
        assert session.state["turns"] == turn, (session.state, turn)
        assert len(session.events) == 2 * turn, (len(session.events), turn)
        invocation = f"inv-{n}-{turn}"
        await service.append_event(
            session, text_event("user", invocation, question(n, turn), {"turn": turn})
        )
        reply = text_event(
            "assistant",
            invocation,
            answer(n, turn),
            {
                "turns": turn + 1,
                "user:last_turn": turn,
                f"app:seen_{n}": turn,
                "temp:scratch": "never stored",
            },
        )
        await service.append_event(session, reply)
        # What a turn leaves in the caller's session object, spooled or not.
        assert session.state["turns"] == turn + 1 and "temp:scratch" in session.state
        ended = time.time()
        slowest = max(slowest, ended - started)
        os.write(log_fd, (json.dumps({"turn": turn, "t": ended}) + "\n").encode())
        if turn < 3:
            print(f"turn {turn}", flush=True)
        turn += 1
        await asyncio.sleep(args.think)
    drained = await service.drain(args.drain)
    metrics = service.store.metrics()
    await service.close()
    os.close(log_fd)
    return {
        "agent": n,
        "turns": turn,
        "drained": drained,
        "spooled": metrics["spooled"],
        "slowest_turn": round(slowest, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="adk_agent")
    parser.add_argument("path")
    parser.add_argument("--agent", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--stop", required=True)
    parser.add_argument("--barrier", default=None)
    parser.add_argument("--min-turns", type=int, default=3)
    parser.add_argument("--think", type=float, default=0.1)
    parser.add_argument("--write-budget", type=float, default=None)
    parser.add_argument("--drain", type=float, default=120.0)
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    print(json.dumps(result), flush=True)
    return 0 if result["drained"] else 1


if __name__ == "__main__":
    sys.exit(main())
