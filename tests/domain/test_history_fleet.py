"""The history fleet test (issue 3, "Tests"): 16 real agent processes write session
history into one store while some of them are killed with ``kill -9``.

Each agent (tests/agents/history_agent.py) runs multi-turn sessions: user messages, streamed
replies with reasoning, text and tool calls whose outputs run from bytes to 8 MB, usage,
a state put per turn, subagent sessions, whole replies appended at once.  It logs an
``intent`` before each operation and an ``ack`` after the call returned.  Six agents are
killed: two just as they record an 8 MB tool output, two while a reply is streaming,
two at random moments.  Afterwards, from a fresh ``fleetstore.open``:

* every acknowledged session, message, part and state version is there exactly once,
  messages in acknowledgement order per session; acknowledged replies are ``complete``
  with exactly the planned parts and usage;
* what was not acknowledged is absent, or a reply left ``streaming`` holding a prefix
  of its planned parts, or (the one operation in flight) whole: nothing half applied,
  nothing nobody asked for, at most one unacknowledged operation per killed agent and
  none for the others;
* every tool output reads back with its logged hash and size; every blob file
  verifies and every blob a row names exists; ``integrity_check`` is ok;
* the survivors carried on after the kills and exited 0; the victims died of SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore import Message, Reasoning, Text, ToolCall, ToolResult
from fleetstore.store.spool import journals
from tests.agents import script
from tests.agents.history_agent import BIG, output_digest, value_sha
from tests.fix_procs import Barrier, Proc
from tests.fix_stores import read_everywhere

AGENT = script("history_agent.py")
FLEET = 16
#: agent number -> how it dies: "big" (on its first 4-8 MB output), "stream" (inside a
#: reply that has a durable part), "random" (at a random moment).
VICTIMS = {3: "big", 8: "big", 5: "stream", 12: "stream", 7: "random", 14: "random"}
#: Survivors that surely record an acknowledged 7-8 MB output (at their 2nd reply).
SURE_BIG = (0, 10)
RUN = 16.0  # seconds the fleet writes, at least


@dataclass
class AgentLog:
    """An agent's log file, parsed: what it meant to write and what was acknowledged."""

    agent: int
    killed: bool
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    acked_sessions: set[str] = field(default_factory=set)
    messages: dict[str, dict[str, Any]] = field(default_factory=dict)
    acks: dict[str, set[str]] = field(default_factory=dict)
    upto: dict[str, int] = field(default_factory=dict)
    states: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    state_acked: dict[str, int] = field(default_factory=dict)
    reply_ack_times: list[float] = field(default_factory=list)
    ack_counts: Counter[str] = field(default_factory=Counter)
    torn: bool = False


def read_log(path: Path, agent: int, killed: bool) -> AgentLog:
    log = AgentLog(agent, killed)
    lines = path.read_bytes().split(b"\n")
    for i, raw in enumerate(lines):
        if not raw:
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            # Only the very last record of a killed agent may be torn.
            assert killed and i == len(lines) - 1, f"agent {agent}: bad log line {i}: {raw[:200]!r}"
            log.torn = True
            continue
        ev, kind = rec["ev"], rec["kind"]
        if ev == "intent":
            if kind == "session":
                log.sessions[rec["sid"]] = rec
            elif kind == "state":
                log.states.setdefault(rec["sid"], {})[rec["n"]] = rec
            else:
                log.messages[rec["mid"]] = rec
                log.acks[rec["mid"]] = set()
            continue
        log.ack_counts[kind] += 1
        if kind == "session":
            log.acked_sessions.add(rec["sid"])
        elif kind == "state":
            assert rec["n"] == log.state_acked.get(rec["sid"], 0) + 1
            assert rec["version"] in (None, rec["n"]), f"agent {agent}: state ack {rec}"
            log.state_acked[rec["sid"]] = rec["n"]
        elif kind == "part":
            log.upto[rec["mid"]] = rec["upto"]
        else:
            log.acks[rec["mid"]].add(kind)
            if kind in ("user", "whole"):
                assert rec["seq"] in (None, log.messages[rec["mid"]]["index"]), rec
            if kind in ("reply", "whole"):
                log.reply_ack_times.append(rec["t"])
    return log


# -- comparing what is stored with what was planned ------------------------------------------


def part_matches(stored: object, planned: dict[str, Any], *, whole: bool) -> bool:
    """*stored* is the *planned* part; with ``whole=False`` a streamed text part may
    hold only a (non-empty) prefix of its planned text."""
    kind = planned["kind"]
    if kind in ("text", "reasoning"):
        cls = Text if kind == "text" else Reasoning
        if not isinstance(stored, cls):
            return False
        if whole:
            return bool(stored.text == planned["text"])
        return bool(stored.text) and str(planned["text"]).startswith(stored.text)
    if kind == "tool_call":
        return (
            isinstance(stored, ToolCall)
            and stored.name == planned["name"]
            and stored.arguments == planned["args"]
            and stored.call_id == planned["call_id"]
        )
    assert kind == "tool_result", planned
    return (
        isinstance(stored, ToolResult)
        and stored.call_id == planned["call_id"]
        and stored.name == planned["name"]
        and not stored.is_error
        and output_digest(stored.output)
        == {"sha": planned["sha"], "size": planned["size"], "type": planned["type"]}
    )


def usage_matches(message: Message, planned: dict[str, Any]) -> bool:
    u = message.usage
    return u is not None and all(getattr(u, k) == v for k, v in planned.items())


@dataclass
class Tally:
    """What the check saw, for the report and for assertions on the run itself."""

    sessions: int = 0
    subagent_sessions: int = 0
    messages: int = 0
    parts: int = 0
    outputs: int = 0
    output_bytes: int = 0
    blob_outputs: int = 0
    big_outputs: int = 0
    left_streaming: int = 0
    blob_files: int = 0
    unacked_applied: Counter[int] = field(default_factory=Counter)

    def counts(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "unacked_applied"}


def check_message(
    m: Message, intent: dict[str, Any], log: AgentLog, tally: Tally, threshold: int
) -> None:
    where = f"agent {log.agent} message {m.id} (seq {m.seq}, {intent['kind']}, {m.status})"
    acks = log.acks[m.id]
    tally.messages += 1
    tally.parts += len(m.parts)
    if intent["kind"] == "user":
        assert (m.role, m.status, m.parts, m.usage) == (
            "user",
            "complete",
            (Text(intent["text"]),),
            None,
        ), where
        tally.unacked_applied[log.agent] += "user" not in acks
        return
    planned = intent["parts"]
    assert m.role == "assistant" and m.model == intent["model"], where
    if m.status == "complete":
        # Complete means whole: every planned part, exactly, and the usage.
        assert len(m.parts) == len(planned), f"{where}: {len(m.parts)} of {len(planned)} parts"
        for i, (part, plan) in enumerate(zip(m.parts, planned, strict=True)):
            assert part_matches(part, plan, whole=True), f"{where}: part {i} {plan['kind']}"
        assert usage_matches(m, intent["usage"]), f"{where}: usage {m.usage} != {intent['usage']}"
        done = "whole" if intent["kind"] == "whole" else "reply"
        # (A complete reply's "reply" ack covers its message row: a stream writes it
        # with its first flush, which for a reply without tool parts is its end.)
        tally.unacked_applied[log.agent] += done not in acks
    else:
        assert m.status == "streaming", f"{where}: no reply of this fleet raises"
        assert intent["kind"] == "reply", where
        assert log.killed, f"{where}: a survivor left a reply unfinished"
        assert "reply" not in acks, f"{where}: acknowledged as finished"
        assert m.usage is None, where
        acked = log.upto.get(m.id, -1)
        assert len(m.parts) > acked, f"{where}: acknowledged part {acked} missing"
        assert len(m.parts) <= len(planned), where
        for i, part in enumerate(m.parts):
            # Only the last stored part can be a text cut short by the kill.
            whole = i <= acked or i < len(m.parts) - 1
            assert part_matches(part, planned[i], whole=whole), f"{where}: part {i}"
        tool_parts = [
            i for i, p in enumerate(planned[: len(m.parts)]) if p["kind"].startswith("tool")
        ]
        # What flushes wrote past the last acknowledged one is one write in flight: the
        # store's timed flushes (every 30 ms here) write a stream's buffered parts
        # without telling the agent, so a tool result flushed by the timer and the next
        # call's own flush, cut by the kill, are both there and neither acknowledged.
        tally.unacked_applied[log.agent] += "open" not in acks or any(i > acked for i in tool_parts)
        tally.left_streaming += 1
    for part in m.parts:
        if isinstance(part, ToolResult):
            size = output_digest(part.output)["size"]
            tally.outputs += 1
            tally.output_bytes += size
            tally.blob_outputs += size >= threshold
            tally.big_outputs += size >= BIG


def check_store(path: str, logs: list[AgentLog]) -> Tally:
    """Everything the fleet acknowledged, from a fresh open, and nothing half applied."""
    session_owner = {sid: log for log in logs for sid in log.sessions}
    message_owner = {mid: log for log in logs for mid in log.messages}
    tally = Tally()
    store = fleetstore.open(path)
    try:
        threshold = store.settings.blob_threshold
        if store.dialect == "sqlite":  # PostgreSQL enforces its constraints as it writes

            def intact(key: str | None, db: Any) -> None:  # every file of a sharded store
                where = key or "the catalog"
                assert db.read(lambda tx: tx.execute("PRAGMA integrity_check")) == [("ok",)], where
                assert db.read(lambda tx: tx.execute("PRAGMA foreign_key_check")) == [], where

            if store.router is not None:
                store.router.each(intact)
            else:
                intact(None, store.db)

        sessions = store.sessions.list(include_archived=True, limit=1_000_000)
        stored_sessions = {s.id: s for s in sessions}
        assert len(stored_sessions) == len(sessions)
        for each in logs:
            lost = each.acked_sessions - set(stored_sessions)
            assert not lost, f"agent {each.agent}: acknowledged sessions missing: {sorted(lost)}"
        for s in sessions:
            log = session_owner.get(s.id)
            assert log is not None, f"session {s.id} was never created by an agent"
            intent = log.sessions[s.id]
            assert (s.parent_id, s.title) == (intent["parent"], intent["title"]), s
            if s.parent_id is None:
                assert s.root_id == s.id, s
            else:
                assert s.root_id == stored_sessions[s.parent_id].root_id, s
                tally.subagent_sessions += 1
            tally.sessions += 1
            tally.unacked_applied[log.agent] += s.id not in log.acked_sessions

            messages = store.messages.list(s.id)
            assert [m.seq for m in messages] == list(range(1, len(messages) + 1)), (
                f"session {s.id}: seqs {[m.seq for m in messages]}"
            )
            for m in messages:
                assert message_owner.get(m.id) is log, f"message {m.id} nobody wrote in {s.id}"
                intent = log.messages[m.id]
                # seq order is the order the agent made (and acknowledged) them.
                assert (intent["sid"], intent["index"]) == (s.id, m.seq), (intent, m.seq)
                check_message(m, intent, log, tally, threshold)
            stored_ids = {m.id for m in messages}
            for mid, intent in log.messages.items():
                if intent["sid"] == s.id and log.acks[mid]:
                    assert mid in stored_ids, f"agent {log.agent}: acknowledged {mid} missing"

            planned_states = log.states.get(s.id, {})
            acked = log.state_acked.get(s.id, 0)
            value = store.state.get(s.id, "progress")
            version = 0 if value is None else value.version
            assert version == acked or (log.killed and version == acked + 1), (
                f"agent {log.agent} session {s.id}: state version {version}, acknowledged {acked}"
            )
            tally.unacked_applied[log.agent] += version == acked + 1
            if value is not None:
                assert version in planned_states, (s.id, version)
                assert value_sha(value.value) == planned_states[version]["sha"], (s.id, version)

        counted = [
            read_everywhere(store, "SELECT count(*) FROM messages")[0][0],
            read_everywhere(store, "SELECT count(*) FROM parts")[0][0],
        ]
        assert counted == [tally.messages, tally.parts], "rows outside the listed sessions"
        for log in logs:
            allowed = 1 if log.killed else 0
            n = tally.unacked_applied[log.agent]
            assert n <= allowed, f"agent {log.agent}: {n} operations applied but unacknowledged"

        # Blobs: every file verifies; every blob a row names is there.
        files = set(store.blobs)
        bad = [sha for sha in files if not store.blobs.verify(sha)]
        assert not bad, f"blob files that do not verify: {bad}"
        named = read_everywhere(
            store,
            "SELECT blob_sha FROM parts WHERE blob_sha IS NOT NULL "
            "UNION SELECT blob_sha FROM state WHERE blob_sha IS NOT NULL "
            "UNION SELECT sha256 FROM blobs",
        )
        missing = {sha for (sha,) in named} - files
        assert not missing, f"blobs named by rows but absent: {sorted(missing)}"
        tally.blob_files = len(files)
    finally:
        store.close()
    return tally


def run_clean_fleet(
    url: str, procs: list[Proc], barrier: Barrier, tmp_path: Path, agents: int, run: float
) -> list[AgentLog]:
    """*agents* history agents on the store at *url* for *run* seconds, nobody killed
    (two of them with a 7-8 MB tool output in their first reply): every process exits
    0, and each one's count of returned calls matches its log.  Returns the logs."""
    stop = tmp_path / "stop"
    logs = [tmp_path / f"agent-{i}.log" for i in range(agents)]
    for i in range(agents):
        args = ["--agent", str(i), "--log", str(logs[i]), "--seed", "7", "--big-prob", "0.002"]
        args += ["--barrier", barrier.path, "--stop", str(stop), "--duration", "600"]
        if i < 2:
            args += ["--big-at", "1"]
        procs.append(Proc([sys.executable, AGENT, url, *args], name=f"agent {i}"))
    for p in procs:
        p.wait_line("ready", timeout=120)
    t0 = barrier.release()
    time.sleep(max(0.0, t0 + run - time.time()))
    stop.touch()
    summaries: list[dict[str, Any]] = []
    for p in procs:
        rc = p.finish(timeout=120)
        assert rc == 0, (p.name, rc, p.stderr_tail())
        summaries.append(json.loads(p.last_line()))
    parsed = [read_log(logs[i], i, killed=False) for i in range(agents)]
    for log, counts in zip(parsed, summaries, strict=True):
        # Each agent's own count of returned calls matches its log: the log is what it did.
        for kind in ("session", "user", "open", "reply", "whole", "state"):
            assert log.ack_counts[kind] == counts.get(kind, 0), (log.agent, kind)
        assert log.reply_ack_times, f"agent {log.agent} finished no reply"
    return parsed


def inflight_big_output(log: AgentLog, blobs: Path) -> str | None:
    """Where a victim's 4-8 MB output that it was recording when killed got to:
    "blob" (the file was written), "tmp" (a temporary file left), "none"."""
    for mid, intent in log.messages.items():
        if intent["kind"] != "reply" or "reply" in log.acks[mid]:
            continue
        upto = log.upto.get(mid, -1)
        for i, part in enumerate(intent["parts"]):
            if i > upto and part["kind"] == "tool_result" and part["size"] >= BIG:
                sha = part["sha"]
                if (blobs / sha[:2] / sha).exists():
                    return "blob"
                return "tmp" if list(blobs.glob(f"{sha[:2]}/.{sha}.*.tmp")) else "none"
    return None


# -- the fleet -------------------------------------------------------------------------------


def replied_since(log: Path, since: float) -> bool:
    for raw in log.read_bytes().splitlines():
        if raw.startswith(b'{"ev": "ack", "kind": "reply"') or raw.startswith(
            b'{"ev": "ack", "kind": "whole"'
        ):
            with contextlib.suppress(ValueError):
                if json.loads(raw)["t"] > since:
                    return True
    return False


def killer(proc: Proc, how: str, t0: float, rng: random.Random, out: dict[str, Any]) -> None:
    """Kill *proc* with SIGKILL at the moment *how* names; record when, or the failure."""
    try:
        if how == "random":
            time.sleep(max(0.0, t0 + rng.uniform(2.0, 10.0) - time.time()))
        else:
            prefix = "big" if how == "big" else "streaming"
            # A stream victim is killed in a reply some seconds in, not in its first one.
            not_before = t0 + (rng.uniform(2.0, 6.0) if how == "stream" else 0.0)
            time.sleep(max(0.0, not_before - time.time()))
            while True:
                at, line = proc.wait_line(prefix, timeout=90)
                if at >= not_before:
                    break
            out["line"] = line
            # Somewhere in the rest of the reply; for "big", hashing, compressing or
            # writing the blob file, or just after.
            time.sleep(rng.uniform(0.0, 0.03 if how == "stream" else 0.015))
        os.kill(proc.pid, signal.SIGKILL)
        out["at"] = time.time()
    except BaseException as exc:  # reported by the test thread
        out["error"] = exc


@pytest.mark.fleet
@pytest.mark.timeout(280)
def test_history_fleet_kill9_keeps_every_acknowledged_operation(
    procs: list[Proc], barrier: Barrier, tmp_path: Path
) -> None:
    seed = int(os.environ.get("HISTORY_FLEET_SEED", "0")) or random.randrange(1, 1_000_000)
    rng = random.Random(seed)
    print(f"history fleet: seed {seed} (HISTORY_FLEET_SEED={seed} to run it again)")
    path = str(tmp_path / "history.db")
    fleetstore.open(path).close()  # the schema exists before the fleet starts
    stop = tmp_path / "stop"
    logs = [tmp_path / f"agent-{i}.log" for i in range(FLEET)]
    for i in range(FLEET):
        args = ["--agent", str(i), "--log", str(logs[i]), "--seed", str(seed)]
        args += ["--barrier", barrier.path, "--stop", str(stop), "--duration", "150"]
        how = VICTIMS.get(i)
        if how is not None:
            args.append("--markers")
        if how == "big":
            args += ["--big-at", "3"]
        if i in SURE_BIG:
            args += ["--big-at", "2"]
        procs.append(Proc([sys.executable, AGENT, path, *args], name=f"agent {i}"))
    for p in procs:
        p.wait_line("ready", timeout=90)
    t0 = barrier.release()

    kills: dict[int, dict[str, Any]] = {i: {} for i in VICTIMS}
    threads = [
        threading.Thread(
            target=killer, args=(procs[i], how, t0, random.Random(rng.random()), kills[i])
        )
        for i, how in VICTIMS.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for i, k in kills.items():
        if "error" in k:
            raise AssertionError(f"killing agent {i} ({VICTIMS[i]}): {k['error']}")
        assert "at" in k, f"agent {i} was not killed"
    last_kill = max(k["at"] for k in kills.values())
    # Run on until every survivor has finished a reply after the last kill (and RUN).
    waiting = [i for i in range(FLEET) if i not in VICTIMS]
    give_up = time.monotonic() + 120
    while waiting and time.monotonic() < give_up:
        time.sleep(0.5)
        waiting = [i for i in waiting if not replied_since(logs[i], last_kill)]
    time.sleep(max(0.0, t0 + RUN - time.time()))
    stop.touch()

    summaries: dict[int, dict[str, Any]] = {}
    for i, p in enumerate(procs):
        rc = p.finish(timeout=120)
        if i in VICTIMS:
            assert rc == -signal.SIGKILL, f"{p.name} rc={rc}: {p.stderr_tail()}"
        else:
            assert rc == 0, f"{p.name} rc={rc}: {p.stderr_tail()}"
            summaries[i] = json.loads(p.last_line())
    t_done = time.time()

    parsed = [read_log(logs[i], i, i in VICTIMS) for i in range(FLEET)]
    for log in parsed:
        # A victim may die in its first reply (a big output can come at any reply).
        assert log.reply_ack_times or (log.killed and log.ack_counts["open"]), (
            f"agent {log.agent} acknowledged no reply"
        )
        if not log.killed:
            # The survivor's own count matches its log: the log is what it did.
            counts = summaries[log.agent]
            for kind in ("session", "user", "open", "reply", "whole", "state"):
                assert log.ack_counts[kind] == counts.get(kind, 0), (log.agent, kind)
            # ...and it carried on after the last kill, without restarting.
            after = sum(t > last_kill for t in log.reply_ack_times)
            assert after > 0, f"agent {log.agent} finished no reply after the kills"

    spooled = journals(path + ".spool")
    tally = check_store(path, parsed)

    assert tally.left_streaming >= 1, "no kill landed inside a streamed reply"
    assert tally.big_outputs >= len(SURE_BIG), tally
    assert tally.blob_outputs > tally.big_outputs, tally
    assert tally.subagent_sessions >= 1, tally

    blobs_dir = Path(path + ".blobs")
    report = {
        "seed": seed,
        "run_s": round(t_done - t0, 1),
        "check_s": round(time.time() - t_done, 1),
        "acks": sum(sum(log.ack_counts.values()) for log in parsed),
        "kills": {i: (VICTIMS[i], round(k["at"] - t0, 2)) for i, k in kills.items()},
        "torn_logs": sum(log.torn for log in parsed),
        "unacked_applied": dict(tally.unacked_applied),
        "journals_left": len(spooled),
        "blob_tmp_left": len(list(blobs_dir.glob("*/.*.tmp"))),
        "inflight_big": {
            log.agent: inflight_big_output(log, blobs_dir) for log in parsed if log.killed
        },
        **tally.counts(),
    }
    print("history fleet:", json.dumps(report))
