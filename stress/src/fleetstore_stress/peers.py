"""The peers' targets of ``fleetstore stress --compare``: opencode's and zcode's SQLite
patterns (raw SQL through fleetstore_stress.patterns.plain), the OpenAI Agents SDK's
``SQLiteSession`` and LangGraph's ``SqliteSaver``.  Each replays the workload of
fleetstore_stress.agent the way that tool writes it.

The library peers use the stdlib ``sqlite3``: they run only in their own agent
processes, never beside fleetstore's apsw connections (DESIGN.md, "Two SQLite
libraries in one process"); this module never imports it itself.
"""

from __future__ import annotations

import json
import math
import operator
import time
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from fleetstore_stress.agent import Clock, Turn, _Target, ids, sha
from fleetstore_stress.growth import Streamed

OPENCODE_SCHEMA = """
CREATE TABLE session(id TEXT PRIMARY KEY, time_created INTEGER NOT NULL,
    time_updated INTEGER NOT NULL, data TEXT NOT NULL);
CREATE TABLE message(id TEXT PRIMARY KEY, session_id TEXT NOT NULL,
    time_created INTEGER NOT NULL, time_updated INTEGER NOT NULL, data TEXT NOT NULL);
CREATE INDEX message_session_idx ON message(session_id);
CREATE TABLE part(id TEXT PRIMARY KEY, message_id TEXT NOT NULL, session_id TEXT NOT NULL,
    time_created INTEGER NOT NULL, time_updated INTEGER NOT NULL, data TEXT NOT NULL);
CREATE INDEX part_message_idx ON part(message_id);
CREATE TABLE event(id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, type TEXT NOT NULL,
    time INTEGER NOT NULL, data TEXT NOT NULL);
"""
_PART_UPSERT = (
    "INSERT INTO part(id, message_id, session_id, time_created, time_updated, data) "
    "VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(id) DO UPDATE SET time_updated = excluded.time_updated, data = excluded.data"
)
_EVENT = "INSERT INTO event(session_id, type, time, data) VALUES (?, ?, ?, ?)"


def _ms() -> int:
    return int(time.time() * 1000)


class _Opencode(_Target):
    """opencode's pattern: one shared WAL file, busy_timeout 5000, and every part
    update rewriting the whole part plus an event row in a transaction of its own."""

    busy_ms = 5000
    mode = "IMMEDIATE"

    def __init__(self, cfg: dict[str, Any], agent: int) -> None:
        super().__init__(cfg, agent)
        from fleetstore_stress.patterns.plain import PlainConnection

        self.db = PlainConnection(
            cfg["url"], busy_ms=self.busy_ms, synchronous=cfg["synchronous"] or "NORMAL"
        )
        now = _ms()
        with self.db.transaction(self.mode) as tx:
            tx.execute(
                "INSERT OR IGNORE INTO session VALUES (?, ?, ?, ?)",
                (self.sid, now, now, json.dumps({"title": f"stress agent {agent}"})),
            )

    def _part(self, clock: Clock, mid: str, pid: str, part: dict[str, Any], delta: str) -> None:
        with clock(), self.db.transaction(self.mode) as tx:
            now = _ms()
            tx.execute(_PART_UPSERT, (pid, mid, self.sid, now, now, json.dumps(part)))
            # The event carries the whole part, as opencode's message.part.updated does
            # (its users' databases are mostly these rows: issues #33356, #47223).
            event = {"type": "message.part.updated", "part": part, "delta": delta}
            tx.execute(_EVENT, (self.sid, "message.part.updated", now, json.dumps(event)))

    def _message(self, clock: Clock, mid: str, info: dict[str, Any]) -> None:
        with clock(), self.db.transaction(self.mode) as tx:
            now = _ms()
            tx.execute(
                "INSERT INTO message VALUES (?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
                "time_updated = excluded.time_updated, data = excluded.data",
                (mid, self.sid, now, now, json.dumps(info)),
            )
            tx.execute(_EVENT, (self.sid, "message.updated", now, json.dumps({"id": mid})))

    def turn(self, t: Turn, clock: Clock) -> str:
        _, uid, aid = ids(self.cfg, self.agent, t.n)
        self._message(clock, uid, {"role": "user", "turn": t.n})
        self._part(clock, uid, uid + "/0", {"type": "text", "text": t.user}, t.user)
        self._message(clock, aid, {"role": "assistant", "turn": t.n})
        streamed = Streamed(self.cfg, self.agent, t)
        text = ""
        for d in streamed.deltas[:-1]:
            streamed.pause()
            text += d
            self._part(clock, aid, aid + "/0", {"type": "text", "text": text}, d)
        tool: dict[str, Any] = {"type": "tool", "tool": "bash", "state": {"status": "running"}}
        self._part(clock, aid, aid + "/1", tool, "")
        if t.tool_think:
            time.sleep(t.tool_think)
        output = t.output(self.cfg, self.agent)
        chunks = streamed.chunks(output)
        so_far = ""
        for chunk in chunks[:-1]:  # --long-replies: the running tool's output as it grows
            so_far += chunk
            tool["state"] = {"status": "running", "output": so_far}
            self._part(clock, aid, aid + "/1", tool, chunk)
            streamed.pause()
        tool["state"] = {"status": "completed", "output": output, "sha": sha(output)}
        self._part(clock, aid, aid + "/1", tool, "")
        last = streamed.deltas[-1]
        self._part(clock, aid, aid + "/2", {"type": "text", "text": last}, last)
        self._message(clock, aid, {"role": "assistant", "turn": t.n, "tokens": t.usage})
        with clock(), self.db.transaction(self.mode) as tx:
            data = json.dumps({"checkpoint": {"turn": t.n, "output": sha(output)}})
            tx.execute(
                "UPDATE session SET data = ?, time_updated = ? WHERE id = ?",
                (data, _ms(), self.sid),
            )
            tx.execute(_EVENT, (self.sid, "effect", _ms(), json.dumps({"turn": t.n})))
        return sha(output)

    def close(self) -> None:
        self.db.close()


class _Zcode(_Opencode):
    """zcode's pattern: busy timeout 10 s and deferred transactions, which read first
    and then upgrade to a write lock (SQLITE_BUSY at once if a writer got in between:
    SQLite cannot wait there without a deadlock)."""

    busy_ms = 10_000
    mode = "DEFERRED"

    def _part(self, clock: Clock, mid: str, pid: str, part: dict[str, Any], delta: str) -> None:
        with clock(), self.db.transaction(self.mode) as tx:
            tx.execute("SELECT count(*) FROM part WHERE message_id = ?", (mid,))
            now = _ms()
            tx.execute(_PART_UPSERT, (pid, mid, self.sid, now, now, json.dumps(part)))

    def _message(self, clock: Clock, mid: str, info: dict[str, Any]) -> None:
        with clock(), self.db.transaction(self.mode) as tx:
            tx.execute("SELECT count(*) FROM message WHERE session_id = ?", (self.sid,))
            now = _ms()
            tx.execute(
                "INSERT INTO message VALUES (?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
                "time_updated = excluded.time_updated, data = excluded.data",
                (mid, self.sid, now, now, json.dumps(info)),
            )


class _AgentsSDK(_Target):
    """The OpenAI Agents SDK's ``SQLiteSession`` (stdlib sqlite3), one item per step."""

    def __init__(self, cfg: dict[str, Any], agent: int) -> None:
        super().__init__(cfg, agent)
        from agents import SQLiteSession

        self.session = SQLiteSession(self.sid, cfg["url"])

    def _add(self, clock: Clock, item: dict[str, Any]) -> None:
        import asyncio

        with clock():
            asyncio.run(self.session.add_items([item]))  # type: ignore[list-item]

    def turn(self, t: Turn, clock: Clock) -> str:
        _, uid, aid = ids(self.cfg, self.agent, t.n)
        self._add(clock, {"id": uid, "role": "user", "content": t.user})
        streamed = Streamed(self.cfg, self.agent, t)
        streamed.wait_deltas()  # the reply streams in; the session keeps whole items
        call = {"type": "function_call", "call_id": aid + "/c", "name": "bash", "arguments": "{}"}
        self._add(clock, {"id": aid + "/1", **call})
        if t.tool_think:
            time.sleep(t.tool_think)
        output = t.output(self.cfg, self.agent)
        streamed.wait_chunks(output)
        self._add(clock, {"type": "function_call_output", "call_id": aid + "/c", "output": output})
        text = Streamed(self.cfg, self.agent, t).text()
        self._add(clock, {"id": aid, "role": "assistant", "content": text, "usage": t.usage})
        return sha(output)

    def close(self) -> None:
        self.session.close()


class _GraphState(TypedDict, total=False):
    # Module level: LangGraph reads the reducer from the resolved annotation.
    messages: Annotated[list[dict[str, Any]], operator.add]


class _LangGraph(_Target):
    """LangGraph's ``SqliteSaver`` (stdlib sqlite3, opened with ``from_conn_string``)
    under a small graph, one ``invoke`` per turn: the user's message in, then nodes
    model (the streamed text and a tool call), tool (runs for the tool time, returns
    the output) and reply.  The state is the thread's messages, appended to
    (``operator.add``), as a chat app keeps them; ``SqliteSaver`` writes the whole
    state in every checkpoint, one per step."""

    def __init__(self, cfg: dict[str, Any], agent: int) -> None:
        super().__init__(cfg, agent)
        import threading
        from contextlib import ExitStack

        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, StateGraph

        spans: list[tuple[float, float]] = []
        guard = threading.Lock()
        self.spans = spans
        self.guard = guard

        def timed(fn: Callable[..., Any]) -> Callable[..., Any]:
            def method(saver: Any, *args: Any, **kw: Any) -> Any:
                began = time.monotonic()
                try:
                    return fn(saver, *args, **kw)
                finally:
                    with guard:
                        spans.append((began, time.monotonic()))

            return method

        saver_cls: Any = type(
            "TimedSqliteSaver",
            (SqliteSaver,),
            {m: timed(getattr(SqliteSaver, m)) for m in ("get_tuple", "put", "put_writes")},
        )
        self.opened = ExitStack()
        self.saver = self.opened.enter_context(saver_cls.from_conn_string(cfg["url"]))
        self.turn_now: Turn | None = None

        def ids_now() -> tuple[Turn, str, str]:
            assert self.turn_now is not None
            t = self.turn_now
            _, uid, aid = ids(cfg, agent, t.n)
            return t, uid, aid

        def model(state: _GraphState) -> dict[str, Any]:
            t, _, aid = ids_now()
            call = {"id": aid + "/c", "name": "bash", "args": {"cmd": f"run {t.n}"}}
            streamed = Streamed(cfg, agent, t)
            streamed.wait_deltas()  # the node streams the reply; the state keeps it whole
            text = "".join(streamed.deltas[:-1])
            return {"messages": [{"id": aid + "/1", "role": "assistant", "content": text,
                                  "tool_calls": [call]}]}  # fmt: skip

        def tool(state: _GraphState) -> dict[str, Any]:
            t, _, aid = ids_now()
            if t.tool_think:
                time.sleep(t.tool_think)
            output = t.output(cfg, agent)
            Streamed(cfg, agent, t).wait_chunks(output)
            msg = {"id": aid + "/2", "role": "tool", "tool_call_id": aid + "/c", "content": output}
            return {"messages": [msg]}

        def reply(state: _GraphState) -> dict[str, Any]:
            t, _, aid = ids_now()
            last = Streamed(cfg, agent, t).deltas[-1]
            msg = {"id": aid, "role": "assistant", "content": last, "usage": t.usage}
            return {"messages": [msg]}

        g = StateGraph(_GraphState)
        g.add_node("model", model)
        g.add_node("tool", tool)
        g.add_node("reply", reply)
        g.add_edge(START, "model")
        g.add_edge("model", "tool")
        g.add_edge("tool", "reply")
        g.add_edge("reply", END)
        self.graph: Any = g.compile(checkpointer=self.saver)
        self.config = {"configurable": {"thread_id": self.sid}}

    def turn(self, t: Turn, clock: Clock) -> str:
        _, uid, _ = ids(self.cfg, self.agent, t.n)
        self.turn_now = t
        with self.guard:
            self.spans.clear()
        try:
            user = {"id": uid, "role": "user", "content": t.user}
            self.graph.invoke({"messages": [user]}, self.config)
        finally:
            # Checkpoints are written by a background thread while the next node
            # runs: a turn's store time is the union of the calls' intervals.
            with self.guard:
                spans = sorted(self.spans)
            reach = -math.inf
            for a, b in spans:
                if b > reach:
                    clock.total += b - max(a, reach)
                    reach = b
                clock.longest = max(clock.longest, b - a)
            clock.writes += len(spans)
        return sha(t.output(self.cfg, self.agent))

    def close(self) -> None:
        self.opened.close()


TARGETS: dict[str, Callable[[dict[str, Any], int], _Target]] = {
    "opencode": _Opencode,
    "zcode": _Zcode,
    "agents-sdk": _AgentsSDK,
    "langgraph": _LangGraph,
}


def prepare(cfg: dict[str, Any]) -> None:
    """Create a peer's schema once, before its agents start."""
    if cfg["target"] in ("opencode", "zcode"):
        from fleetstore_stress.patterns.plain import PlainConnection

        PlainConnection(cfg["url"], busy_ms=10_000, schema=OPENCODE_SCHEMA).close()
    elif cfg["target"] == "langgraph":
        from langgraph.checkpoint.sqlite import SqliteSaver

        with SqliteSaver.from_conn_string(cfg["url"]) as saver:
            saver.setup()  # its tables and WAL, once (each agent's saver would race to)
