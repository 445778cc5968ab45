"""An agent of the history fleet test: ``python tests/agents/history_agent.py PATH --agent N --log FILE``.

It plays an agent program against ``fleetstore.open(PATH)``: sessions of a few turns
(a user message, a streamed assistant reply with reasoning, text and tool calls whose
outputs run from bytes to 8 MB, usage, a state put), now and then a subagent's child
session run while the parent's reply is still streaming, now and then a whole reply
appended at once.

Everything it does is written to its log (JSON lines, one ``os.write`` each): an
``intent`` record before an operation (with what the store should hold if it is
applied) and an ``ack`` record once the call has returned.  A ``kill -9`` can land
anywhere, so the checker (tests/domain/test_history_fleet.py) tolerates a torn last line and
one operation applied without its ack.

With ``--markers`` it prints ``big MID`` just before recording a tool output of 4 MB or
more and ``streaming MID`` once a reply has a durable part and is still open, so the
test can aim its kills.  Runs until ``--duration`` ends or the ``--stop`` file exists,
then closes the store and prints one JSON line with its counts.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import math
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import fleetstore
from fleetstore.core.ids import new_id

KiB = 1024
MiB = 1024 * KiB
BIG = 4 * MiB  # an output at least this large is a "big" one (markers, stats)
WORDS = (  # noqa: SIM905 (a sentence reads better than a list of words)
    "the test fails when two writers race on the lock so we retry the build after "
    "reading the log file and the stack trace shows a timeout in the fixture setup"
).split()


def value_sha(value: Any) -> str:
    """The hash of a JSON value, the same on both sides of the store."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def output_digest(output: str | bytes) -> dict[str, Any]:
    raw = output.encode("utf-8") if isinstance(output, str) else output
    return {
        "sha": hashlib.sha256(raw).hexdigest(),
        "size": len(raw),
        "type": "str" if isinstance(output, str) else "bytes",
    }


def log_uniform(rng: random.Random, low: float, high: float) -> int:
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


def output_size(rng: random.Random, big_prob: float) -> int:
    """Heavy-tailed: mostly bytes to KB, some 100 KB - 1 MB, rarely 4 - 8 MB."""
    r = rng.random()
    if r < big_prob:
        return rng.randint(BIG, 8 * MiB)
    if r < big_prob + 0.12:
        return log_uniform(rng, 100 * KiB, 1 * MiB)
    if r < big_prob + 0.30:
        return log_uniform(rng, 4 * KiB, 100 * KiB)  # crosses the 64 KiB blob threshold
    return log_uniform(rng, 1, 4 * KiB)


def make_output(rng: random.Random, call_id: str, size: int) -> str | bytes:
    """*size* bytes after a header naming the call, so no two outputs are equal (the
    blob store would store them once): a random chunk repeated, cheap at 8 MB."""
    header = f"output of {call_id}\n".encode()
    chunk = os.urandom(max(1, min(size, rng.choice((4 * KiB, 64 * KiB, 1 * MiB)))))
    if rng.random() < 0.4:  # a text output (str), e.g. a log
        text = chunk.hex()
        body = (text * (size // len(text) + 1))[:size]
        return header.decode() + body
    return header + (chunk * (size // len(chunk) + 1))[:size]


def sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))) + " "


@dataclass
class Conversation:
    """One session as this agent sees it."""

    id: str
    messages: int = 0
    state_puts: int = 0


@dataclass
class Agent:
    store: fleetstore.Store
    number: int
    rng: random.Random
    log_fd: int
    big_prob: float
    big_at: int
    markers: bool
    replies: int = 0
    counts: Counter[str] = field(default_factory=Counter)

    # -- the log ---------------------------------------------------------------------------

    def record(self, ev: str, kind: str, **fields: Any) -> None:
        line = json.dumps({"ev": ev, "kind": kind, "t": time.time(), **fields}) + "\n"
        # One write per record: a kill leaves whole records and at most a torn last one.
        os.write(self.log_fd, line.encode())
        if ev == "ack":
            self.counts[kind] += 1

    def say(self, line: str) -> None:
        if self.markers:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def think(self, mean: float = 0.005) -> None:
        time.sleep(self.rng.expovariate(1.0 / mean))

    # -- operations ------------------------------------------------------------------------

    def new_session(self, parent: Conversation | None = None) -> Conversation:
        sid = new_id()
        parent_id = None if parent is None else parent.id
        title = f"agent {self.number} " + sentence(self.rng, 2, 5).strip()
        self.record("intent", "session", sid=sid, parent=parent_id, title=title)
        self.store.sessions.create(title=title, parent_id=parent_id, id=sid, project="/fleet")
        self.record("ack", "session", sid=sid)
        return Conversation(sid)

    def user(self, conv: Conversation) -> None:
        mid = new_id()
        text = sentence(self.rng, 3, 40)
        conv.messages += 1
        self.record("intent", "user", mid=mid, sid=conv.id, index=conv.messages, text=text)
        msg = self.store.messages.append(conv.id, "user", text, id=mid)
        self.record("ack", "user", mid=mid, seq=msg.seq)

    def put_state(self, conv: Conversation) -> None:
        conv.state_puts += 1
        value: dict[str, Any] = {"turn": conv.state_puts, "messages": conv.messages}
        if self.rng.random() < 0.05:  # now and then a checkpoint large enough to be a blob
            value["notes"] = os.urandom(48 * KiB).hex()
        n = conv.state_puts
        self.record("intent", "state", sid=conv.id, n=n, sha=value_sha(value))
        put = self.store.state.put(conv.id, "progress", value)
        self.record("ack", "state", sid=conv.id, n=n, version=put.version)

    def plan_reply(self, conv: Conversation, child: str | None) -> list[dict[str, Any]]:
        """The parts a reply will have, with the tool outputs made up front."""
        parts: list[dict[str, Any]] = []
        if self.rng.random() < 0.5:
            parts.append({"kind": "reasoning", "deltas": self.deltas(2, 12)})
        parts.append({"kind": "text", "deltas": self.deltas(3, 25)})
        tools = self.rng.choice((0, 1, 1, 1, 2, 2, 3))
        forced = self.big_at == self.replies
        if child is not None or forced:
            tools = max(tools, 1 + (child is not None and forced))
        for i in range(tools):
            call_id = new_id()
            output: str | bytes
            arguments: dict[str, Any]
            if child is not None and i == 0:
                name, arguments = "task", {"session": child, "prompt": sentence(self.rng, 3, 8)}
                output = f"subagent {child} done"
            else:
                name = self.rng.choice(("bash", "read", "grep", "edit"))
                arguments = {"cmd": sentence(self.rng, 1, 6).strip(), "n": self.rng.randint(0, 99)}
                size = self.rng.randint(7 * MiB, 8 * MiB) if forced else None
                forced = False
                output = make_output(
                    self.rng, call_id, size or output_size(self.rng, self.big_prob)
                )
            parts.append({"kind": "tool_call", "name": name, "args": arguments, "call_id": call_id})
            parts.append(
                {"kind": "tool_result", "call_id": call_id, "name": name, "output": output}
            )
            parts.append({"kind": "text", "deltas": self.deltas(1, 12)})
        return parts

    def deltas(self, low: int, high: int) -> list[str]:
        return [sentence(self.rng, 1, 6) for _ in range(self.rng.randint(low, high))]

    def usage(self) -> dict[str, Any]:
        return {
            "input_tokens": self.rng.randint(100, 90_000),
            "output_tokens": self.rng.randint(10, 4_000),
            "cache_read_tokens": self.rng.randint(0, 50_000),
            "cost": round(self.rng.uniform(0, 0.5), 6),
        }

    def reply(self, conv: Conversation, subagent: bool = False) -> None:
        """A streamed reply; with *subagent*, its first tool call runs a child session."""
        self.replies += 1
        child = new_id() if subagent else None
        parts = self.plan_reply(conv, child)
        usage = self.usage()
        model = self.rng.choice(("m-small", "m-large"))
        conv.messages += 1
        stream = self.store.messages.stream(conv.id, model=model)
        mid = stream.id
        self.record(
            "intent",
            "reply",
            mid=mid,
            sid=conv.id,
            index=conv.messages,
            model=model,
            parts=[describe(p) for p in parts],
            usage=usage,
        )
        # A stream writes nothing until it flushes (docs/reference.md, Stream): what is
        # acknowledged is what a flush that returned wrote.  This agent flushes after
        # each tool part, as an agent that shows its tool calls as they happen would.
        with stream as reply:
            opened = False

            def written(upto: int) -> None:
                nonlocal opened
                reply.flush()
                if not opened:
                    self.record("ack", "open", mid=mid)
                    opened = True
                self.record("ack", "part", mid=mid, upto=upto)

            pending_call: fleetstore.ToolCallHandle | None = None
            for i, part in enumerate(parts):
                kind = part["kind"]
                if kind in ("text", "reasoning"):
                    for delta in part["deltas"]:
                        (reply.text if kind == "text" else reply.reasoning)(delta)
                        self.think(0.002)
                    continue
                if kind == "tool_call":
                    pending_call = reply.tool_call(
                        part["name"], part["args"], call_id=part["call_id"]
                    )
                    written(i)
                    self.say(f"streaming {mid}")
                    if part["name"] == "task":
                        self.subagent(part["args"]["session"], conv)
                    continue
                assert pending_call is not None
                output = part["output"]
                if len(output) >= BIG:
                    self.say(f"big {mid}")
                pending_call.result(output)
                written(i)
                self.counts["outputs"] += 1
                self.counts["output_bytes"] += len(output)
                self.counts["big_outputs"] += len(output) >= BIG
            reply.usage(**usage)
        self.record("ack", "reply", mid=mid)

    def whole_reply(self, conv: Conversation) -> None:
        """A reply appended in one operation: all its parts or none."""
        call_id = new_id()
        output = make_output(self.rng, call_id, output_size(self.rng, self.big_prob))
        text = sentence(self.rng, 5, 30)
        arguments = {"path": f"/src/{call_id}.py"}
        parts: list[fleetstore.Part] = [
            fleetstore.Text(text),
            fleetstore.ToolCall("read", arguments, call_id),
            fleetstore.ToolResult(call_id, output, False, "read"),
        ]
        planned: list[dict[str, Any]] = [
            {"kind": "text", "deltas": [text]},
            {"kind": "tool_call", "name": "read", "args": arguments, "call_id": call_id},
            {"kind": "tool_result", "call_id": call_id, "name": "read", "output": output},
        ]
        usage = self.usage()
        mid = new_id()
        conv.messages += 1
        self.record(
            "intent",
            "whole",
            mid=mid,
            sid=conv.id,
            index=conv.messages,
            model="m-small",
            parts=[describe(p) for p in planned],
            usage=usage,
        )
        msg = self.store.messages.append(
            conv.id, "assistant", parts, model="m-small", usage=usage, id=mid
        )
        self.record("ack", "whole", mid=mid, seq=msg.seq)
        self.counts["outputs"] += 1
        self.counts["output_bytes"] += len(output)

    def turn(self, conv: Conversation, nested: bool) -> None:
        self.user(conv)
        self.think()
        if self.rng.random() < 0.1:
            self.whole_reply(conv)
        else:
            self.reply(conv, subagent=not nested and self.rng.random() < 0.12)
        self.put_state(conv)
        self.counts["turns"] += 1

    def subagent(self, child_id: str, parent: Conversation) -> None:
        """A subagent's session, run while the parent's reply is still streaming."""
        self.record("intent", "session", sid=child_id, parent=parent.id, title="subagent")
        self.store.sessions.create(title="subagent", parent_id=parent.id, id=child_id)
        self.record("ack", "session", sid=child_id)
        conv = Conversation(child_id)
        for _ in range(self.rng.randint(1, 2)):
            self.turn(conv, nested=True)


def describe(part: dict[str, Any]) -> dict[str, Any]:
    """A planned part as the log records it: texts whole, outputs by hash."""
    kind = part["kind"]
    if kind in ("text", "reasoning"):
        return {"kind": kind, "text": "".join(part["deltas"])}
    if kind == "tool_call":
        return dict(part)
    return {
        "kind": kind,
        "call_id": part["call_id"],
        "name": part["name"],
        **output_digest(part["output"]),
    }


def wait_barrier(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="history_agent")
    parser.add_argument("path")
    parser.add_argument("--agent", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--stop", default=None)
    parser.add_argument("--barrier", default=None)
    parser.add_argument("--big-prob", type=float, default=0.02)
    parser.add_argument("--big-at", type=int, default=0, help="reply number with a 7-8 MB output")
    parser.add_argument("--markers", action="store_true")
    args = parser.parse_args(argv)

    # A short flush interval so that timed flushes (from the store's background
    # thread) interleave with the agent's own writes.
    store = fleetstore.open(args.path, stream_flush_interval=0.03)
    log_fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    print("ready", flush=True)
    if args.barrier:
        wait_barrier(args.barrier)
    agent = Agent(
        store=store,
        number=args.agent,
        rng=random.Random(args.seed * 1000 + args.agent),
        log_fd=log_fd,
        big_prob=args.big_prob,
        big_at=args.big_at,
        markers=args.markers,
    )
    deadline = time.monotonic() + args.duration
    while time.monotonic() < deadline and not (args.stop and os.path.exists(args.stop)):
        conv = agent.new_session()
        for _ in range(agent.rng.randint(2, 5)):
            agent.turn(conv, nested=False)
            agent.think(0.01)
    store.close()
    os.close(log_fd)
    print(json.dumps({"agent": args.agent, "pid": os.getpid(), **agent.counts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
