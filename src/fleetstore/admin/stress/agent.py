"""The processes of ``fleetstore stress``: one agent, one outbox worker, or the
verification of one target, each run as ``python -m fleetstore.admin.stress.agent
--agent|--worker|--verify CONFIG_JSON``.

The workload is a function of (seed, agent, turn): every target replays the same
turns.  A turn is a user message, a streamed assistant reply with a tool call whose
output size is heavy-tailed (bytes to megabytes), usage, a state checkpoint and an
outbox effect.  An agent appends one JSON line per turn to its journal once the turn
is acknowledged (every write of it returned) or failed; a restarted agent (after
``--kill-rate``'s SIGKILL) reads it and goes on after the interrupted turn.  Ids are
derived from (run, agent, turn), so the verifier knows what must be there.

Each target runs in its own process tree: the Agents SDK's ``SQLiteSession`` and
LangGraph's ``SqliteSaver`` use the stdlib ``sqlite3``, which must never share a
process with fleetstore's apsw connections (DESIGN.md, "Two SQLite libraries in one
process"); this module never imports it itself (tests/test_layers.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import operator
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

from fleetstore.core.ids import derived_id

TARGETS = ("fleetstore", "opencode", "zcode", "agents-sdk", "langgraph")
# Share of large outputs (--large-rate) are log-uniform between these; the others are
# log-normal around --output-bytes, capped so they stay "small".
_LARGE_MIN = 1 << 20
_SMALL_CAP = 256 * 1024
EFFECT_KIND = "stress.notify"


# --------------------------------------------------------------------------- workload


class Turn:
    """What agent *agent* does in turn *n*; the same for every target."""

    __slots__ = ("deltas", "n", "output_size", "think", "tool_think", "usage", "user")

    def __init__(self, cfg: dict[str, Any], agent: int, n: int) -> None:
        rng = random.Random(f"{cfg['seed']}/{agent}/{n}")
        self.n = n
        think = cfg["think_ms"] / 1000.0
        self.think = rng.expovariate(1.0 / think) if think > 0 else 0.0
        self.tool_think = rng.expovariate(1.0 / think) if think > 0 else 0.0
        self.user = f"turn {n} of agent {agent}: " + "please look at this " * rng.randint(1, 20)
        self.deltas = [
            "".join(rng.choices("abcdefghij klmnop ", k=rng.randint(8, 60)))
            for _ in range(rng.randint(3, 12))
        ]
        large = cfg["large_bytes"]
        if cfg["large_rate"] > 0 and rng.random() < cfg["large_rate"] and large > 0:
            low = min(_LARGE_MIN, large)
            self.output_size = int(math.exp(rng.uniform(math.log(low), math.log(large))))
        else:
            median = max(1, cfg["output_bytes"])
            size = rng.lognormvariate(math.log(median), 1.2)
            self.output_size = max(1, min(_SMALL_CAP, int(size)))
        self.usage = {
            "input_tokens": rng.randint(100, 20_000),
            "output_tokens": rng.randint(5, 800),
        }

    def output(self, cfg: dict[str, Any], agent: int) -> str:
        # Hex text: compresses like tool output does (about 2:1), cheap to make.
        rng = random.Random(f"{cfg['seed']}/{agent}/{self.n}/out")
        return rng.randbytes((self.output_size + 1) // 2).hex()[: self.output_size]


@functools.lru_cache(maxsize=256)
def _session_id(run_id: str, target: str, agent: int) -> str:
    return derived_id(f"stress/{run_id}/{target}", str(agent), "session")


def ids(cfg: dict[str, Any], agent: int, n: int | None = None) -> tuple[str, str, str]:
    """(session, user message, assistant message) ids of agent *agent*'s turn *n*.

    Message ids ascend with the turn, as the tools' own do (fleetstore's UUIDv7,
    opencode's ``Identifier.ascending``): random ids (uuid5, as here before) put
    every insert on a random page of every index, which doubled the pages a
    turn's commit writes for every target and is not what either tool does."""
    sid = _session_id(cfg["run_id"], cfg["target"], agent)
    if n is None:
        return sid, "", ""
    hx = sid.replace("-", "")  # UUID-shaped, as benchmarks/bench_write_path.py expects
    head, tail = f"{n:08x}-{agent % 0x10000:04x}", f"{hx[:3]}-{hx[3:7]}-{hx[7:19]}"
    return sid, f"{head}-a{tail}", f"{head}-b{tail}"


def sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


class Clock:
    """Time spent inside the target's calls during one turn (think time excluded)."""

    __slots__ = ("longest", "total", "writes")

    def __init__(self) -> None:
        self.total = self.longest = 0.0
        self.writes = 0

    @contextmanager
    def __call__(self) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            spent = time.monotonic() - began
            self.total += spent
            self.longest = max(self.longest, spent)
            self.writes += 1


# --------------------------------------------------------------------------- targets


class _Target:
    def __init__(self, cfg: dict[str, Any], agent: int) -> None:
        self.cfg = cfg
        self.agent = agent
        self.sid = ids(cfg, agent)[0]

    def turn(self, t: Turn, clock: Clock) -> str:
        """Write turn *t*; returns the sha256 of the tool output as written."""
        raise NotImplementedError

    def figures(self) -> dict[str, Any] | None:
        """The engine's write figures so far (fleetstore only)."""
        return None

    def close(self) -> None:
        pass


class _Fleetstore(_Target):
    def __init__(self, cfg: dict[str, Any], agent: int) -> None:
        super().__init__(cfg, agent)
        import fleetstore

        self.store = fleetstore.open(cfg["url"], **cfg["settings"])
        self.drop_every: int = cfg.get("drop_every") or 0
        self.counted = 0
        with contextlib_suppress_exists():
            self.store.sessions.create(title=f"stress agent {agent}", id=self.sid)

    def _dropped(self) -> bool:
        # --drop-every: a deliberately broken target that acknowledges a write it
        # never made, so the run can prove its verifier sees the loss.
        self.counted += 1
        return bool(self.drop_every) and self.counted % self.drop_every == 0

    def turn(self, t: Turn, clock: Clock) -> str:
        """A user message (one transaction) and the reply, whose end commits with the
        turn's state checkpoint and its outbox effect (one transaction when the reply
        is produced within a flush window)."""
        from fleetstore.models import NewEffect

        _, uid, aid = ids(self.cfg, self.agent, t.n)
        store = self.store
        if not self._dropped():
            with clock():
                store.messages.append(self.sid, "user", t.user, id=uid)
        output = t.output(self.cfg, self.agent)
        with clock():
            stream = store.messages.stream(self.sid, "assistant", model="stress", id=aid)
            reply = stream.__enter__()
        try:
            for d in t.deltas[:-1]:
                with clock():
                    reply.text(d)
            with clock():
                call = reply.tool_call("bash", {"cmd": f"run {t.n}"})
            if t.tool_think:
                time.sleep(t.tool_think)
            with clock():
                call.result(output)
            with clock():
                reply.text(t.deltas[-1])
                reply.usage(
                    input_tokens=t.usage["input_tokens"], output_tokens=t.usage["output_tokens"]
                )
                # --drop-every: a broken target that says it saved what it did not.
                if not self._dropped():
                    reply.put_state("checkpoint", {"turn": t.n, "output": sha(output)})
                if not self._dropped():
                    reply.enqueue(
                        NewEffect(
                            self.sid,
                            EFFECT_KIND,
                            {"turn": t.n},
                            idempotency_key=f"{self.sid}/{t.n}",
                        )
                    )
        except BaseException as exc:
            stream.__exit__(type(exc), exc, exc.__traceback__)
            raise
        with clock():
            stream.__exit__(None, None, None)
        return sha(output)

    def figures(self) -> dict[str, Any] | None:
        return store_figures(self.store)

    def close(self) -> None:
        self.store.close()


def store_figures(store: Any) -> dict[str, Any]:
    """A fleetstore's write counters and raw lock histograms in this process (every
    file of a sharded store: they share one set of figures)."""
    m = store.metrics()
    return {
        "writes": int(m.get("writes", 0)),
        "busy_timeouts": int(m.get("busy_timeouts", 0)),
        "spooled": int(m.get("spooled", 0)),
        "histograms": store.db.histograms(),
    }


@contextmanager
def contextlib_suppress_exists() -> Iterator[None]:
    from fleetstore import errors

    try:
        yield
    except errors.AlreadyExists:
        pass  # a restarted agent: its session is there


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
        from fleetstore.engine.peers import PlainConnection

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
            event = {"type": "message.part.updated", "partID": pid, "delta": delta}
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
        text = ""
        for d in t.deltas[:-1]:
            text += d
            self._part(clock, aid, aid + "/0", {"type": "text", "text": text}, d)
        tool: dict[str, Any] = {"type": "tool", "tool": "bash", "state": {"status": "running"}}
        self._part(clock, aid, aid + "/1", tool, "")
        if t.tool_think:
            time.sleep(t.tool_think)
        output = t.output(self.cfg, self.agent)
        tool["state"] = {"status": "completed", "output": output, "sha": sha(output)}
        self._part(clock, aid, aid + "/1", tool, "")
        self._part(clock, aid, aid + "/2", {"type": "text", "text": t.deltas[-1]}, t.deltas[-1])
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
        call = {"type": "function_call", "call_id": aid + "/c", "name": "bash", "arguments": "{}"}
        self._add(clock, {"id": aid + "/1", **call})
        if t.tool_think:
            time.sleep(t.tool_think)
        output = t.output(self.cfg, self.agent)
        self._add(clock, {"type": "function_call_output", "call_id": aid + "/c", "output": output})
        text = "".join(t.deltas)
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
            text = "".join(t.deltas[:-1])
            return {"messages": [{"id": aid + "/1", "role": "assistant", "content": text,
                                  "tool_calls": [call]}]}  # fmt: skip

        def tool(state: _GraphState) -> dict[str, Any]:
            t, _, aid = ids_now()
            if t.tool_think:
                time.sleep(t.tool_think)
            output = t.output(cfg, agent)
            msg = {"id": aid + "/2", "role": "tool", "tool_call_id": aid + "/c", "content": output}
            return {"messages": [msg]}

        def reply(state: _GraphState) -> dict[str, Any]:
            t, _, aid = ids_now()
            msg = {"id": aid, "role": "assistant", "content": t.deltas[-1], "usage": t.usage}
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


_KINDS: dict[str, Callable[[dict[str, Any], int], _Target]] = {
    "fleetstore": _Fleetstore,
    "opencode": _Opencode,
    "zcode": _Zcode,
    "agents-sdk": _AgentsSDK,
    "langgraph": _LangGraph,
}


def prepare(cfg: dict[str, Any]) -> None:
    """Create the target's schema once, before the agents start."""
    if cfg["target"] in ("opencode", "zcode"):
        from fleetstore.engine.peers import PlainConnection

        PlainConnection(cfg["url"], busy_ms=10_000, schema=OPENCODE_SCHEMA).close()
    elif cfg["target"] == "fleetstore":
        import fleetstore

        fleetstore.open(cfg["url"], **cfg["settings"]).close()
    elif cfg["target"] == "langgraph":
        from langgraph.checkpoint.sqlite import SqliteSaver

        with SqliteSaver.from_conn_string(cfg["url"]) as saver:
            saver.setup()  # its tables and WAL, once (each agent's saver would race to)


# ----------------------------------------------------------------------------- agent


def read_journal(path: Path) -> list[dict[str, Any]]:
    """The lines of an agent's journal; a line cut by SIGKILL is skipped."""
    lines = []
    try:
        text = path.read_text()
    except OSError:
        return []
    for line in text.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue
    return lines


def _error_name(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__.startswith("fleetstore"):
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def agent_main(cfg: dict[str, Any]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when agents stop
    agent: int = cfg["agent"]
    journal_path = Path(cfg["journal"])
    past = read_journal(journal_path)
    # A restarted agent skips the turn it was killed in: it may be half written.
    first = max((int(e["n"]) for e in past), default=0) + (2 if past or cfg["restart"] else 1)
    target = _KINDS[cfg["target"]](cfg, agent)
    print("ready", flush=True)
    line = sys.stdin.readline().split()
    if len(line) != 3 or line[0] != "start":
        return 1
    start, end = float(line[1]), float(line[2])
    with open(journal_path, "a") as journal:
        if journal.tell() and not journal_path.read_bytes().endswith(b"\n"):
            journal.write("\n")
        if cfg["restart"]:
            journal.write(json.dumps({"n": first - 1, "killed": True}) + "\n")
            journal.flush()
        _sleep_until(start)
        cpu_began = time.process_time()
        before = target.figures()
        n = first
        parent = os.getppid()
        while os.getppid() == parent:
            t = Turn(cfg, agent, n)
            wake = time.monotonic() + t.think
            if wake + t.tool_think >= end:
                break
            _sleep_until(wake)
            clock = Clock()
            began = time.monotonic()
            entry: dict[str, Any] = {"n": n}
            try:
                entry["sha"] = target.turn(t, clock)
            except Exception as exc:
                entry["fail"] = _error_name(exc)
                entry["msg"] = str(exc)[:300]
            entry.update(
                t=round(time.monotonic() - start, 4),
                began=round(began - start, 4),
                lat=round(clock.total, 6),
                w=round(clock.longest, 6),
                size=t.output_size,
            )
            journal.write(json.dumps(entry) + "\n")
            journal.flush()
            n += 1
    _write_figures(cfg, "agent", agent, time.process_time() - cpu_began, before, target.figures())
    target.close()
    return 0


def figures_path(journal: str | Path) -> Path:
    """Where the processes of a target append their figures (one JSON line per
    process that finished its run; a process killed by --kill-rate writes none)."""
    return Path(journal).with_name("figures.jsonl")


def _write_figures(
    cfg: dict[str, Any],
    role: str,
    index: int,
    cpu_s: float,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> None:
    """This process's CPU time over the run and, on fleetstore, its engine's write
    figures (lock wait and hold histograms, counters) accrued over the run."""
    line: dict[str, Any] = {"role": role, "index": index, "pid": os.getpid(), "cpu_s": cpu_s}
    if before is not None and after is not None:
        line["writes"] = after["writes"] - before["writes"]
        line["busy_timeouts"] = after["busy_timeouts"] - before["busy_timeouts"]
        line["spooled"] = after["spooled"] - before["spooled"]
        line["histograms"] = after["histograms"]
        line["histograms_before"] = before["histograms"]
    path = figures_path(cfg["journal"]) if "journal" in cfg else Path(cfg["figures"])
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def worker_main(cfg: dict[str, Any]) -> int:
    import fleetstore

    def notify(effect: fleetstore.Effect) -> dict[str, Any]:
        return {"turn": effect.payload["turn"]}

    with fleetstore.open(cfg["url"], **cfg["settings"]) as store:
        worker = fleetstore.Worker(store, {EFFECT_KIND: notify}, concurrency=2, lease=5.0)
        before, cpu_began = store_figures(store), time.process_time()
        print("ready", flush=True)
        code = worker.run()
        if "figures" in cfg:
            cpu = time.process_time() - cpu_began
            _write_figures(cfg, "worker", cfg.get("worker", 0), cpu, before, store_figures(store))
        return code


def _sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        time.sleep(delay)


# ---------------------------------------------------------------------------- verify


class _Check:
    def __init__(self) -> None:
        self.acked = 0
        self.lost: list[list[Any]] = []
        self.duplicated: list[list[Any]] = []
        self.out_of_order: list[list[Any]] = []
        self.corrupt: list[list[Any]] = []
        self.counts: Counter[str] = Counter()

    def add(self, kind: str, sample: list[Any]) -> None:
        self.counts[kind] += 1
        bucket = getattr(self, kind)
        if len(bucket) < 10:
            bucket.append(sample)


def _acked(journal: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in journal if "sha" in e]


def _check_sequence(
    check: _Check, agent: int, expected: list[tuple[str, int]], stored: list[str]
) -> dict[str, int]:
    """*expected*: (id, turn) in acknowledgement order; *stored*: ids in stored order.
    Each must be there exactly once, in the same order; returns id -> position."""
    positions: dict[str, list[int]] = {}
    for i, mid in enumerate(stored):
        positions.setdefault(mid, []).append(i)
    last = -1
    found: dict[str, int] = {}
    for mid, n in expected:
        at = positions.get(mid, [])
        if not at:
            check.add("lost", [agent, n, mid])
            continue
        if len(at) > 1:
            check.add("duplicated", [agent, n, mid, len(at)])
        if at[0] < last:
            check.add("out_of_order", [agent, n, mid])
        last = at[0]
        found[mid] = at[0]
    return found


def verify_main(cfg: dict[str, Any]) -> dict[str, Any]:
    check = _Check()
    journals = {a: read_journal(Path(p)) for a, p in enumerate(cfg["journals"])}
    extra: dict[str, Any] = {}
    kind = cfg["target"]
    if kind == "fleetstore":
        extra = _verify_fleetstore(cfg, journals, check)
    elif kind in ("opencode", "zcode"):
        extra = _verify_opencode(cfg, journals, check)
    elif kind == "agents-sdk":
        extra = _verify_agents_sdk(cfg, journals, check)
    elif kind == "langgraph":
        extra = _verify_langgraph(cfg, journals, check)
    index_samples = extra.pop("samples_index", [])
    return {
        "acked_turns": sum(len(_acked(j)) for j in journals.values()),
        "lost": check.counts["lost"],
        "duplicated": check.counts["duplicated"],
        "out_of_order": check.counts["out_of_order"],
        "corrupt": check.counts["corrupt"],
        "samples": {
            "lost": check.lost,
            "duplicated": check.duplicated,
            "out_of_order": check.out_of_order,
            "corrupt": check.corrupt,
            "index": index_samples,
        },
        **extra,
    }


def _verify_fleetstore(
    cfg: dict[str, Any], journals: dict[int, list[dict[str, Any]]], check: _Check
) -> dict[str, Any]:
    import fleetstore
    from fleetstore import ToolResult

    effects: Counter[str] = Counter()
    stuck: list[str] = []
    state_behind = 0
    with fleetstore.open(cfg["url"], **cfg["settings"]) as store:
        for agent, journal in journals.items():
            acked = _acked(journal)
            sid = ids(cfg, agent)[0]
            if not journal:
                continue
            try:
                messages = store.messages.list(sid)
            except fleetstore.NotFound:
                messages = []
            by_id = {m.id: m for m in messages}
            expected: list[tuple[str, int]] = []
            for e in acked:
                _, uid, aid = ids(cfg, agent, e["n"])
                expected += [(uid, e["n"]), (aid, e["n"])]
            _check_sequence(check, agent, expected, [m.id for m in messages])
            for e in acked:
                m = by_id.get(ids(cfg, agent, e["n"])[2])
                if m is None:
                    continue
                outputs = [p.output for p in m.parts if isinstance(p, ToolResult)]
                if m.status != "complete" or [sha(o) for o in outputs] != [e["sha"]]:
                    check.add("corrupt", [agent, e["n"], m.id, str(m.status)])
            if acked:
                value = store.state.get(sid, "checkpoint")
                if value is None or int(value.value["turn"]) < int(acked[-1]["n"]):
                    state_behind += 1
                    check.add("lost", [agent, acked[-1]["n"], "state checkpoint"])
            listed = store.effects.list(thread_key=sid, limit=100_000)
            turns = {int(e.payload["turn"]) for e in listed}
            for e in acked:
                if int(e["n"]) not in turns:
                    check.add("lost", [agent, e["n"], "effect"])
        now = time.time()
        after = None
        while True:
            page = store.effects.list(limit=10_000, after=after)
            for ef in page:
                effects[ef.state.value] += 1
                expires = ef.lease_expires_at
                if ef.state.value == "running" and expires is not None and expires < now:
                    stuck.append(ef.id)
            if len(page) < 10_000:
                break
            after = page[-1]
        integrity, files = _integrity(store)
        index = _index_problems(store)
    return {
        "effects": dict(effects),
        "stuck_effects": len(stuck),
        "state_behind": state_behind,
        "integrity": integrity,
        "layout": store.layout,
        "files": files,
        "index_problems": len(index),
        "samples_index": index[:10],
    }


def _integrity(store: Any) -> tuple[str, int]:
    """``integrity_check`` of every SQLite file of the store (a sharded store: the
    catalog and each shard), "ok" or the first problems named by file; and the
    number of files checked."""
    if store.dialect != "sqlite":
        return "ok", 0
    found: list[str] = []
    files = 0

    def check(key: str | None, db: Any) -> None:
        nonlocal files
        files += 1
        rows = [str(r[0]) for r in db.read(lambda tx: tx.execute("PRAGMA integrity_check"))]
        if rows != ["ok"]:
            found.extend(f"{key or 'catalog'}: {r}" if store.router else r for r in rows)

    if store.router is not None:
        store.router.each(check)
    else:
        check(None, store.db)
    return ("; ".join(found[:10]) if found else "ok"), files


def _index_problems(store: Any) -> list[str]:
    """A sharded store: where the catalog's index and the shards disagree (a session
    in a shard but not indexed there, indexed but not in its shard, a shard file the
    index names that is missing) and catalog+shard writes left unfinished."""
    router = store.router
    if router is None:
        return []
    q = store.queries
    catalog = router.catalog
    problems: list[str] = []
    indexed = {str(r[0]) for r in catalog.read(lambda tx: tx.execute(q["shard_list"]))}
    on_disk = set(router.shards.keys())

    def compare(key: str | None, db: Any) -> None:
        if key is None:
            return
        held = {str(r[0]) for r in db.read(lambda tx: tx.execute(q["shard_session_rows"]))}
        rows = catalog.read(lambda tx: tx.execute(q["shard_index_ids"], (key,)))
        listed = {str(r[0]) for r in rows}
        problems.extend(f"{key}: session {sid} not in the index" for sid in sorted(held - listed))
        problems.extend(f"{key}: indexed session {sid} missing" for sid in sorted(listed - held))

    router.each(compare)
    problems.extend(f"{key}: shard file missing" for key in sorted(indexed - on_disk))
    intents = router.catalog.read(lambda tx: tx.execute(q["shard_intents"]))
    problems.extend(f"{r[1]}: intent {r[0]} unfinished" for r in intents)
    return problems


def _verify_opencode(
    cfg: dict[str, Any], journals: dict[int, list[dict[str, Any]]], check: _Check
) -> dict[str, Any]:
    from fleetstore.engine.peers import PlainConnection

    with PlainConnection(cfg["url"], busy_ms=30_000, readonly=True) as db:
        for agent, journal in journals.items():
            acked = _acked(journal)
            if not acked:
                continue
            sid = ids(cfg, agent)[0]
            rows = db.execute(
                "SELECT id FROM message WHERE session_id = ? ORDER BY time_created, rowid", (sid,)
            )
            expected: list[tuple[str, int]] = []
            for e in acked:
                _, uid, aid = ids(cfg, agent, e["n"])
                expected += [(uid, e["n"]), (aid, e["n"])]
            _check_sequence(check, agent, expected, [str(r[0]) for r in rows])
            for e in acked:
                aid = ids(cfg, agent, e["n"])[2]
                part = db.execute("SELECT data FROM part WHERE id = ?", (aid + "/1",))
                output = json.loads(part[0][0])["state"].get("output") if part else None
                if output is None or sha(output) != e["sha"]:
                    check.add("corrupt", [agent, e["n"], aid])
        integrity = "; ".join(db.integrity()[:10])
    return {"integrity": integrity}


def _verify_agents_sdk(
    cfg: dict[str, Any], journals: dict[int, list[dict[str, Any]]], check: _Check
) -> dict[str, Any]:
    import asyncio

    from agents import SQLiteSession

    for agent, journal in journals.items():
        acked = _acked(journal)
        if not acked:
            continue
        session = SQLiteSession(ids(cfg, agent)[0], cfg["url"])
        items: list[Any] = asyncio.run(session.get_items())
        session.close()
        stored = [str(i.get("id", "")) for i in items if isinstance(i, dict)]
        outputs = {
            str(i.get("call_id")): str(i.get("output"))
            for i in items
            if isinstance(i, dict) and i.get("type") == "function_call_output"
        }
        _check_turns(cfg, check, agent, acked, stored, outputs)
    return {}


def _check_turns(
    cfg: dict[str, Any],
    check: _Check,
    agent: int,
    acked: list[dict[str, Any]],
    stored: list[str],
    outputs: dict[str, str],
) -> None:
    """A framework peer's turns: each acknowledged turn's user and assistant items in
    order (*stored*: the item ids as the framework keeps them), its tool output intact."""
    expected: list[tuple[str, int]] = []
    for e in acked:
        _, uid, aid = ids(cfg, agent, e["n"])
        expected += [(uid, e["n"]), (aid, e["n"])]
        out = outputs.get(aid + "/c")
        if out is None or sha(out) != e["sha"]:
            check.add("corrupt", [agent, e["n"], aid])
    _check_sequence(check, agent, expected, stored)


def _verify_langgraph(
    cfg: dict[str, Any], journals: dict[int, list[dict[str, Any]]], check: _Check
) -> dict[str, Any]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    with SqliteSaver.from_conn_string(cfg["url"]) as saver:
        for agent, journal in journals.items():
            acked = _acked(journal)
            if not acked:
                continue
            latest = saver.get_tuple({"configurable": {"thread_id": ids(cfg, agent)[0]}})
            items: list[Any] = (
                list(latest.checkpoint["channel_values"].get("messages", [])) if latest else []
            )
            stored = [str(i.get("id", "")) for i in items if isinstance(i, dict)]
            outputs = {
                str(i.get("tool_call_id")): str(i.get("content"))
                for i in items
                if isinstance(i, dict) and i.get("role") == "tool"
            }
            _check_turns(cfg, check, agent, acked, stored, outputs)
        rows = saver.conn.execute("PRAGMA integrity_check").fetchall()
        integrity = "; ".join(str(r[0]) for r in rows[:10])
    return {"integrity": integrity}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("--agent", "--worker", "--verify"):
        print(
            "usage: python -m fleetstore.admin.stress.agent --agent|--worker|--verify CONFIG_JSON",
            file=sys.stderr,
        )
        return 2
    cfg: dict[str, Any] = json.loads(argv[1])
    if argv[0] == "--agent":
        return agent_main(cfg)
    if argv[0] == "--worker":
        return worker_main(cfg)
    if cfg.get("prepare"):
        prepare(cfg)
        print(json.dumps({"prepared": True}))
        return 0
    print(json.dumps(verify_main(cfg)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
