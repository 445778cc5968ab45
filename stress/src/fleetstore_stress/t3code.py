"""The ``t3code`` target of ``fleetstore stress --compare``: every agent process is a
t3code server (fleetstore_stress.patterns.t3code_outbox: its one connection behind one permit,
its outbox and its effect worker) writing turns as t3code's orchestration does:
events with their projections, the turn's effect enqueued in the transaction that
completes it.  What was read and what was guessed: docs/benchmarks.md, "The t3code
target"."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from fleetstore_stress.agent import Clock, Turn, _Target, ids, sha
from fleetstore_stress.growth import Streamed, effect_time, note_stats, ran
from fleetstore_stress.patterns.t3code_outbox import (
    ENQUEUE,
    OUTBOX_SCHEMA,
    Claimed,
    EffectWorker,
    ServerDb,
    iso,
)

EFFECT_TYPE = "checkpoint.capture"  # replay-safe: a booting server requeues it
FLUSH_MS = 40.0  # ProviderTextDeltaCoalescer's flushIntervalMs in the ingestion
STOP_GRACE = 5.0

SCHEMA = (
    """
CREATE TABLE orchestration_v2_events (
    sequence INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,
    command_id TEXT,
    thread_id TEXT NOT NULL,
    run_id TEXT,
    event_type TEXT NOT NULL,
    occurred_at TEXT NOT NULL,
    payload_json TEXT NOT NULL);
CREATE INDEX orchestration_v2_events_thread_sequence_idx
    ON orchestration_v2_events(thread_id, sequence);
CREATE TABLE orchestration_v2_command_receipts (
    command_id TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    command_type TEXT NOT NULL,
    accepted_at TEXT NOT NULL,
    result_sequence INTEGER NOT NULL,
    status TEXT NOT NULL,
    error TEXT);
CREATE TABLE orchestration_v2_projection_threads (
    thread_id TEXT PRIMARY KEY,
    project_id TEXT NOT NULL,
    title TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    payload_json TEXT NOT NULL);
CREATE TABLE orchestration_v2_projection_messages (
    message_id TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    run_id TEXT,
    role TEXT NOT NULL,
    streaming INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    payload_json TEXT NOT NULL);
CREATE INDEX orchestration_v2_projection_messages_thread_created_idx
    ON orchestration_v2_projection_messages(thread_id, created_at, message_id);
CREATE TABLE orchestration_v2_projection_turn_items (
    turn_item_id TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    run_id TEXT,
    ordinal INTEGER NOT NULL,
    type TEXT NOT NULL,
    status TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    payload_json TEXT NOT NULL);
CREATE TABLE orchestration_v2_projection_metadata (
    projection_name TEXT PRIMARY KEY,
    schema_version INTEGER NOT NULL,
    last_sequence INTEGER NOT NULL,
    updated_at TEXT NOT NULL);
"""
    + OUTBOX_SCHEMA
)

_EVENT = (
    "INSERT INTO orchestration_v2_events(event_id, command_id, thread_id, run_id, event_type, "
    "occurred_at, payload_json) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_MESSAGE = (
    "INSERT INTO orchestration_v2_projection_messages VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(message_id) DO UPDATE SET streaming = excluded.streaming, "
    "updated_at = excluded.updated_at, payload_json = excluded.payload_json"
)
_ITEM = (
    "INSERT INTO orchestration_v2_projection_turn_items VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(turn_item_id) DO UPDATE SET status = excluded.status, "
    "updated_at = excluded.updated_at, payload_json = excluded.payload_json"
)
_PROJECTED = (
    "INSERT INTO orchestration_v2_projection_metadata VALUES ('orchestration-v2', 1, ?, ?) "
    "ON CONFLICT(projection_name) DO UPDATE SET last_sequence = excluded.last_sequence, "
    "updated_at = excluded.updated_at"
)


def prepare(cfg: dict[str, Any]) -> None:
    ServerDb(cfg["url"], schema=SCHEMA).close()


class T3code(_Target):
    """One t3code server: boots (its reconciliation first), runs its effect worker,
    and writes each turn as commands and provider events."""

    def __init__(self, cfg: dict[str, Any], agent: int) -> None:
        super().__init__(cfg, agent)
        self.db = ServerDb(cfg["url"], synchronous=cfg["synchronous"] or "NORMAL")
        self.hang = bool(cfg.get("hang_worker")) and agent == 0
        self.worker = EffectWorker(self.db, self._execute, owner=f"orchestration-v2:{os.getpid()}")
        self.worker.reconcile_after_process_loss()
        now = iso()
        with self.db.transaction() as tx:
            tx.execute(
                "INSERT OR IGNORE INTO orchestration_v2_projection_threads "
                "VALUES (?, 'stress', ?, ?, ?, '{}')",
                (self.sid, f"stress agent {agent}", now, now),
            )
        self.worker.start()

    def _execute(self, claim: Claimed) -> None:
        if self.hang:
            self.hang = False
            threading.Event().wait()  # --hang-worker: this execution never returns
        ran(self.cfg, claim.effect_id)
        turn = int(json.loads(claim.payload)["turn"])
        time.sleep(effect_time(self.cfg, claim.thread_id, turn))

    def _events(self, tx: Any, command: str | None, run: str, events: list[tuple[str, Any]]) -> int:
        now = iso()
        sequence = 0
        for kind, payload in events:
            tx.execute(
                _EVENT,
                (
                    f"{run}/{kind}/{time.time_ns()}",
                    command,
                    self.sid,
                    run,
                    kind,
                    now,
                    json.dumps(payload),
                ),
            )
            sequence = int(tx.execute("SELECT last_insert_rowid()")[0][0])
        tx.execute(_PROJECTED, (sequence, now))
        return sequence

    def _command(self, clock: Clock, command: str, kind: str, run: str, body: Any) -> None:
        """A client command (EventSink.commitCommand): its receipt read first (a
        retried command is deduplicated by it), then events, projections and the
        receipt, in one deferred transaction."""
        with clock(), self.db.transaction() as tx:
            if tx.execute(
                "SELECT 1 FROM orchestration_v2_command_receipts WHERE command_id = ?", (command,)
            ):
                return
            sequence = body(tx, command)
            tx.execute(
                "INSERT INTO orchestration_v2_command_receipts VALUES (?, ?, ?, ?, ?, 'accepted', "
                "NULL)",
                (command, self.sid, kind, iso(), sequence),
            )

    def _ingest(self, clock: Clock, run: str, events: list[tuple[str, Any]], apply: Any) -> None:
        """Provider runtime events: appended with their projections, a transaction each."""
        with clock(), self.db.transaction() as tx:
            self._events(tx, None, run, events)
            apply(tx, iso())

    def turn(self, t: Turn, clock: Clock) -> str:
        _, uid, aid = ids(self.cfg, self.agent, t.n)
        run = f"{self.sid}/run/{t.n}"
        streamed = Streamed(self.cfg, self.agent, t)
        user = {"text": t.user, "turn": t.n}

        def start(tx: Any, command: str) -> int:
            now = iso()
            tx.execute(_MESSAGE, (uid, self.sid, run, "user", 0, now, now, json.dumps(user)))
            return self._events(tx, command, run, [("thread.turn-start-requested", user)])

        self._command(clock, f"{uid}/start", "thread.turn.start", run, start)
        created = iso()
        text = pending = ""
        flushed = time.monotonic()

        def flush_text(streaming: int) -> None:
            nonlocal pending, flushed
            delta, pending, flushed = pending, "", time.monotonic()
            message = json.dumps({"text": text})  # the whole message, rewritten each flush

            def apply(tx: Any, now: str) -> None:
                tx.execute(
                    _MESSAGE, (aid, self.sid, run, "assistant", streaming, created, now, message)
                )

            self._ingest(clock, run, [("content.delta", {"itemId": aid, "delta": delta})], apply)

        for d in streamed.deltas[:-1]:
            streamed.pause()
            text += d
            pending += d
            if (time.monotonic() - flushed) * 1000 >= FLUSH_MS:
                flush_text(1)
        if pending:
            flush_text(1)
        item = f"{aid}/tool"

        def item_state(status: str, payload: dict[str, Any]) -> Any:
            body = json.dumps(payload)
            return lambda tx, now: tx.execute(
                _ITEM, (item, self.sid, run, 1, "command_execution", status, now, body)
            )

        started = {"itemId": item, "command": f"run {t.n}"}
        self._ingest(clock, run, [("item.started", started)], item_state("running", started))
        if t.tool_think:
            time.sleep(t.tool_think)
        output = t.output(self.cfg, self.agent)
        so_far = ""
        for chunk in streamed.chunks(output)[:-1]:
            so_far += chunk
            event = ("content.delta", {"itemId": item, "stream": "command_output", "delta": chunk})
            self._ingest(clock, run, [event], item_state("running", {**started, "output": so_far}))
            streamed.pause()
        done = {**started, "output": output, "exitCode": 0}
        self._ingest(clock, run, [("item.completed", done)], item_state("completed", done))
        text += streamed.deltas[-1]
        pending = streamed.deltas[-1]
        flush_text(1)
        checkpoint = {"checkpoint": {"turn": t.n, "output": sha(output)}}

        def complete(tx: Any, command: str) -> int:
            now = iso()
            final = json.dumps({"text": text, "usage": t.usage})
            tx.execute(_MESSAGE, (aid, self.sid, run, "assistant", 0, created, now, final))
            tx.execute(
                "UPDATE orchestration_v2_projection_threads SET updated_at = ?, payload_json = ? "
                "WHERE thread_id = ?",
                (now, json.dumps(checkpoint), self.sid),
            )
            sequence = self._events(tx, command, run, [("turn.completed", {"usage": t.usage})])
            effect = json.dumps({"type": EFFECT_TYPE, "turn": t.n})
            tx.execute(
                ENQUEUE,
                (f"{run}/{EFFECT_TYPE}", command, self.sid, EFFECT_TYPE, effect, now, now, now),
            )
            return sequence

        self._command(clock, f"{aid}/complete", "thread.turn.complete", run, complete)
        self.worker.notify()  # post-commit, in this process only
        return sha(output)

    def figures(self) -> dict[str, Any] | None:
        return None

    def close(self) -> None:
        # A server that stops leaves what its worker has not settled ``running``.
        self.worker.stop(STOP_GRACE)
        note_stats(self.cfg, "server", dict(self.worker.stats))
        self.db.close()
