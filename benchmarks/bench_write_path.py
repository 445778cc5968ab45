"""Write-path benchmark: what a turn costs in commits, CPU and throughput, fleetstore
against the agent tools' patterns and against raw apsw doing fleetstore's own SQL.

One invocation runs every cell; every ratio is taken between cells of the same run.
A cell is one configuration (agents x think time x ``synchronous``) and one target,
on a fresh database file.  The agents are real OS processes (multiprocessing, spawn;
the same pool of processes serves every cell, agent i is always process i), each
living its own session turn after turn exactly as ``fleetstore stress`` does
(``fleetstore_stress.agent``): ``Turn(cfg, agent, n)`` gives the work of turn n
(the same for every target: seed, texts, deltas, tool output, think times), the
agent sleeps ``Turn.think``, then lives the turn through the target, whose calls
are timed by ``Clock``; the tool time (``Turn.tool_think``) is slept inside the turn,
where the target's code sleeps it.  An agent starts no turn that would end after
the cell's window.

Targets:

  fleetstore   ``_Fleetstore``: ``fleetstore.open(path, synchronous=...)``, everything
               else default; a user message (``messages.append``) and a streamed reply
               whose end carries the turn's state checkpoint and outbox effect.
  opencode     ``_Opencode``: one transaction per part update (the whole part rewritten
               plus an event row), busy_timeout 5000, ``BEGIN IMMEDIATE``; schema made
               by ``prepare()`` as ``fleetstore stress`` does.
  zcode        ``_Zcode``: the same with deferred transactions and busy_timeout 10000.
  raw-1        raw apsw replaying fleetstore's SQL, one ``BEGIN IMMEDIATE ... COMMIT``
               per transaction fleetstore committed (one per fleetstore operation).
  raw-batched  the same statements, the transactions of 10 consecutive turns of an
               agent in one ``BEGIN IMMEDIATE ... COMMIT`` (the limit of batching).

How the raw baselines are derived.  Each agent process, once, before its first raw
cell: opens a fleetstore store on a scratch file of its own, installs an apsw
``exec_trace`` on every connection the store opens (``apsw.connection_hooks``), and
lives turns 1..14 of its own session with ``_Fleetstore`` (think 0; the stress
module's tool-time ``sleep`` is marked in the trace).  The statements the writer
connection (``store.db._writer_connection()``) executed, with their bindings, are
cut into turns and into transactions at ``BEGIN``/``COMMIT``.  Turns 1-2 are warm-up;
of turns 3-14 the most common shape (same statements in the same order) is kept
(turns whose tool output went to a blob file or flushed early differ and are
dropped).  Each binding is then classified across the kept turns:

  constant     the same in every turn (the session id, kinds, part seqs, flags)
  counter      an integer linear in the turn number (message seq 2n-1 and 2n, the
               effect's seq, the state version): computed for the replayed turn
  now          a varying float that is a wall-clock time: ``time.time()`` at replay
  id           a uuid that differs per turn (message ids, op ids, call ids, effect
               id), also inside JSON text: the user/assistant message ids become the
               replayed turn's ids from ``ids(cfg, agent, n)``, every other one a
               fresh uuid (a per-agent random prefix and n), the same within a turn
  turn number  the decimal turn number as a token in a string (the effect's
               idempotency key ``<session>/<n>``, ``{"turn": n}``): substituted
  content      anything else (texts, tool output, usage): taken from recorded turn
               n mod (turns kept), with its ids and turn numbers substituted.

Turn n of the replay thus runs fleetstore's statements, in fleetstore's order,
against a file with fleetstore's schema (made by ``fleetstore.open``; the agent's
session row is created by fleetstore before the cell, not measured).  Each raw
agent's connection: busy_timeout 5000, WAL, ``synchronous`` as the cell,
``foreign_keys=ON`` (as fleetstore's writer), SQLite's own autocheckpoint (1000
pages, inside COMMIT; fleetstore checkpoints in a thread past 4 MiB of WAL).  Every
statement's rows are read whole (as fleetstore does); one cursor is reused.

What the raw baselines do NOT include: fleetstore's Python above the SQL (argument
validation, JSON encoding of parts and payloads, id generation, the operation log's
bookkeeping in Python, stream buffering), the writer gate (flock) and the BEGIN retry
loop, blob files (compression, hashing, the file write and fsync; about 0.2 % of
turns have a tool output past blob_threshold 64 KiB), the checkpoint thread, the
spool, the published figures, and statements fleetstore runs on connections other
than its writer (reads; counted and reported as ``other_statements_per_turn``).  Their
texts and tool outputs are those of the recorded turns (12 kept, cycled), not of
turn n.  The binding construction of the replay is included (it is cheap: a list
copy and a few substitutions per statement) and so is ``Turn(cfg, agent, n)``, which
every target builds per turn for its think times (``harness_us_per_turn`` in the
JSON measures it: ``Turn()`` alone for the raw targets, plus the tool output and its
two sha256 for the others).

Per cell and target (rows: agents x think; mean over the rounds):

  turns/s        acknowledged turns completed inside the window / seconds
  CPU ms/turn    user+sys CPU of all the cell's agent processes (``time.process_time``
                 in each, all threads, from the start to the end of its loop; plus any
                 other process that had the cell's file open, see ``helpers``) / turns
                 acknowledged
  p50/p99/max    per-turn time inside the target's calls (``Clock.total``), ms
  fairness       fewest and most turns of any agent inside the window
  failed         turns whose call raised, by error class
  commits/turn   fleetstore's ``metrics()["writes"]`` (committed transactions) summed
                 over the fleet, per acknowledged turn; ``ops/commit`` =
                 ``batched_items`` / ``writes`` (operations per transaction, group
                 commit's batch), ``batch_max``, ``handed_over`` (items committed by
                 another process)
  foreign CPU %  machine CPU busy during the window (/proc/stat) minus the CPU of
                 this benchmark's processes, in % of all CPUs: other people's load
  verified       fleetstore, opencode, zcode: the stress verifier (``verify_main``) on
                 journals of the acknowledged turns: each turn's messages there exactly
                 once, in order, tool output intact, and for fleetstore the state
                 checkpoint and the outbox effect of every acknowledged turn, plus
                 integrity_check; raw: the message ids of every acknowledged turn, once

Order: per configuration the targets run back to back, in an order rotated from one
configuration to the next, and (``--rounds 2``, the default) once more in the
reverse order (ABBA), so that drift in the machine's load hits the targets alike.

    .venv/bin/python benchmarks/bench_write_path.py               # the full run
    .venv/bin/python benchmarks/bench_write_path.py --quick       # a smoke test
    .venv/bin/python benchmarks/bench_write_path.py --cells FULL:0:16,FULL:10:16 --seconds 4
    .venv/bin/python benchmarks/bench_write_path.py --report benchmarks/results/write-path-<time>.json
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from array import array
from collections import Counter
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from benchlib import (
    Children,
    fmt,
    loadavg,
    pct,
    print_report,
    proc_stat,
    save_results,
    sleep_until,
)

BENCH_DIR = Path(__file__).resolve().parent

TARGETS = ("fleetstore", "fleetstore-natural", "opencode", "zcode", "raw-1", "raw-batched")
STRESS_TARGETS = ("fleetstore", "fleetstore-natural", "opencode", "zcode")
RAW_TARGETS = ("raw-1", "raw-batched")
AGENTS = (1, 4, 16, 64)
THINKS_MS = (0.0, 10.0)
SYNCS = ("NORMAL", "FULL")
SECONDS = 3.0
ROUNDS = 2
QUICK = {"agents": (1, 4), "thinks": (0.0,), "syncs": ("NORMAL",), "seconds": 1.5, "rounds": 1}
BATCH_TURNS = 10
RAW_BUSY_MS = 5000
RECORD_WARMUP = 2
RECORD_KEEP = 12
SEED = 1
OUTPUT_BYTES = 2000
METRIC_COUNTERS = (
    "writes",
    "batched_items",
    "handed_over",
    "busy_timeouts",
    "spooled",
    "write_errors",
)


# ------------------------------------------------------------------ recording fleetstore's SQL

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# Placeholders in a templated string (literals are str, placeholders ints: slot j >= 0).
_USER, _REPLY, _TURN = -1, -2, -3
# Op kinds of a recorded or compiled turn.
_BEGIN, _COMMIT, _SLEEP, _STMT = "begin", "commit", "sleep", "stmt"
# How a compiled binding is computed for turn n.
_LIN, _NOW, _TPL = 0, 1, 2


def _params(bindings: Any) -> list[tuple[Any, Any]]:
    if bindings is None:
        return []
    if isinstance(bindings, dict):
        return list(bindings.items())
    return list(enumerate(bindings))


def _shape(bindings: Any) -> Any:
    if bindings is None:
        return None
    if isinstance(bindings, dict):
        return tuple(sorted(bindings))
    return len(bindings)


def record_turns(cfg: dict[str, Any], agent: int, turns: int) -> list[dict[str, Any]]:
    """Live turns 1..*turns* of *agent* with the stress module's ``_Fleetstore`` on
    ``cfg["url"]``, tracing every statement of the store's connections; return each
    turn's writer statements as ops (begin, stmt, commit, sleep) and how many
    statements ran on other connections."""
    import apsw

    from fleetstore_stress import agent as stress

    log: list[tuple[Any, str, Any]] = []

    def trace(cursor: Any, sql: str, bindings: Any) -> bool:
        log.append((cursor.connection, sql, bindings))
        return True

    def hook(conn: Any) -> None:
        conn.exec_trace = trace

    class _MarkedSleeps:
        """The stress module's ``time``, its tool-time sleep marked in the trace."""

        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def sleep(self, seconds: float) -> None:
            log.append((None, _SLEEP, None))
            time.sleep(seconds)

    recs = []
    apsw.connection_hooks.append(hook)
    real_time = stress.time
    try:
        target = stress._Fleetstore(cfg, agent)
        try:
            stress.time = _MarkedSleeps()  # type: ignore[assignment]
            for n in range(1, turns + 1):
                del log[:]
                target.turn(stress.Turn(cfg, agent, n), stress.Clock())
                writer = target.store.db._writer_connection()
                recs.append(_parse_turn(n, list(log), writer))
        finally:
            stress.time = real_time
            target.close()
    finally:
        apsw.connection_hooks.remove(hook)
    if not any(op[0] == _STMT for r in recs for op in r["ops"]):
        raise RuntimeError(
            "recording saw no statement on the writer connection "
            "(store.db._writer_connection()): has the write path moved elsewhere?"
        )
    return recs


def _parse_turn(n: int, entries: list[tuple[Any, str, Any]], writer: Any) -> dict[str, Any]:
    ops: list[tuple[Any, ...]] = []
    other = 0
    for conn, sql, bindings in entries:
        if conn is None:
            ops.append((_SLEEP,))
            continue
        if conn is not writer:
            other += 1
            continue
        words = sql.split(None, 2)
        head = words[0].upper().rstrip(";") if words else ""
        if head == "BEGIN":
            ops.append((_BEGIN,))
        elif head in ("COMMIT", "END"):
            ops.append((_COMMIT,))
        elif head == "ROLLBACK" and not (len(words) > 1 and words[1].upper() == "TO"):
            raise RuntimeError(f"recording: turn {n} rolled back a transaction")
        else:
            if bindings is not None and not isinstance(bindings, dict):
                bindings = tuple(bindings)
            ops.append((_STMT, sql, bindings))
    return {"n": n, "ops": ops, "other": other}


def _structure(rec: dict[str, Any]) -> tuple[Any, ...]:
    return tuple((op[0], op[1], _shape(op[2])) if op[0] == _STMT else (op[0],) for op in rec["ops"])


def _turn_pieces(text: str, turn: int) -> list[Any]:
    out: list[Any] = []
    for i, part in enumerate(re.split(rf"(?<![0-9A-Za-z]){turn}(?![0-9A-Za-z])", text)):
        if i:
            out.append(_TURN)
        if part:
            out.append(part)
    return out


def _template(text: str, slots: dict[str, int], turn: int) -> tuple[Any, ...]:
    """*text* as literals and placeholders: the per-turn uuids of *slots*, and the turn
    number where it stands as a token of its own."""
    pieces: list[Any] = []
    pos = 0
    for m in _UUID.finditer(text):
        if m.group(0) in slots:
            pieces += _turn_pieces(text[pos : m.start()], turn)
            pieces.append(slots[m.group(0)])
            pos = m.end()
    pieces += _turn_pieces(text[pos:], turn)
    return tuple(pieces)


class Template:
    """Fleetstore's SQL for one agent's turn, recorded, to be replayed for any turn n."""

    def __init__(self, cfg: dict[str, Any], agent: int, recs: list[dict[str, Any]]) -> None:
        from fleetstore_stress.agent import ids

        self.cfg = cfg
        self.agent = agent
        use = recs[RECORD_WARMUP:]
        shapes = Counter(_structure(r) for r in use)
        modal, _ = shapes.most_common(1)[0]
        kept = [r for r in use if _structure(r) == modal]
        if len(kept) < 3:
            raise RuntimeError(f"fleetstore's turns vary too much to replay: {len(shapes)} shapes")
        uuids = [
            {
                u
                for op in r["ops"]
                if op[0] == _STMT
                for _, v in _params(op[2])
                if isinstance(v, str)
                for u in _UUID.findall(v)
            }
            for r in kept
        ]
        constant = set.intersection(*uuids)
        slot_maps: list[dict[str, int]] = []
        for r in kept:
            _, uid, aid = ids(cfg, agent, r["n"])
            slots: dict[str, int] = {}
            for op in r["ops"]:
                if op[0] != _STMT:
                    continue
                for _, v in _params(op[2]):
                    if not isinstance(v, str):
                        continue
                    for u in _UUID.findall(v):
                        if u in constant or u in slots:
                            continue
                        fresh = sum(1 for s in slots.values() if s >= 0)
                        slots[u] = _USER if u == uid else _REPLY if u == aid else fresh
            slot_maps.append(slots)
        recorded_at = time.time()
        kinds: dict[tuple[int, Any], tuple[str, Any]] = {}
        tally: Counter[str] = Counter()
        for i, op in enumerate(kept[0]["ops"]):
            if op[0] != _STMT:
                continue
            for p, _ in _params(op[2]):
                values = [r["ops"][i][2][p] for r in kept]
                turns = [r["n"] for r in kept]
                kind = self._classify(values, turns, slot_maps, recorded_at)
                kinds[(i, p)] = kind
                tally[kind[0]] += 1
        self.kept_turns = [r["n"] for r in kept]
        self.slots = max((sum(1 for s in m.values() if s >= 0) for m in slot_maps), default=0)
        # Per slot a random uuid prefix; turn n's id is prefix + n (12 hex digits).
        hexes = [os.urandom(10).hex() for _ in range(self.slots)]
        self.prefixes = [f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-" for h in hexes]
        self.compiled = [self._compile(r, slot_maps[k], kinds) for k, r in enumerate(kept)]
        first = kept[0]["ops"]
        self.info = {
            "recorded_turns": len(recs),
            "warmup_turns": RECORD_WARMUP,
            "kept_turns": len(kept),
            "shapes_seen": len(shapes),
            "statements_per_turn": sum(1 for op in first if op[0] == _STMT),
            "transactions_per_turn": sum(1 for op in first if op[0] == _BEGIN),
            "sleep_in_transaction": self._sleeps_inside(first),
            "other_statements_per_turn": sum(r["other"] for r in kept) / len(kept),
            "bindings": dict(tally),
            "distinct_sql": len({op[1] for op in first if op[0] == _STMT}),
        }

    @staticmethod
    def _sleeps_inside(ops: list[tuple[Any, ...]]) -> bool:
        inside = False
        for op in ops:
            if op[0] == _BEGIN:
                inside = True
            elif op[0] == _COMMIT:
                inside = False
            elif op[0] == _SLEEP and inside:
                return True
        return False

    @staticmethod
    def _classify(
        values: list[Any], turns: list[int], slot_maps: list[dict[str, int]], recorded_at: float
    ) -> tuple[str, Any]:
        first = values[0]
        if all(type(v) is type(first) and v == first for v in values):
            return ("constant", None)
        if all(type(v) is int for v in values):
            step, rest = divmod(values[1] - values[0], turns[1] - turns[0])
            base = values[0] - step * turns[0]
            if not rest and all(v == base + step * k for v, k in zip(values, turns, strict=True)):
                return ("counter", (base, step))
        if all(type(v) is float for v in values) and all(
            abs(v - recorded_at) < 86400 for v in values
        ):
            return ("now", None)
        if all(type(v) is str for v in values):
            tpls = [_template(v, m, k) for v, m, k in zip(values, slot_maps, turns, strict=True)]
            if all(t == tpls[0] for t in tpls):
                return ("template", tpls[0])
        return ("content", None)

    def _compile(
        self,
        rec: dict[str, Any],
        slots: dict[str, int],
        kinds: dict[tuple[int, Any], tuple[str, Any]],
    ) -> list[tuple[Any, ...]]:
        """One recorded turn as ops whose bindings are a base to copy and patches."""
        out: list[tuple[Any, ...]] = []
        inside = False
        for i, op in enumerate(rec["ops"]):
            if op[0] != _STMT:
                inside = {_BEGIN: True, _COMMIT: False}.get(op[0], inside)
                out.append(op)
                continue
            _, sql, bindings = op
            base: Any = None
            if isinstance(bindings, dict):
                base = dict(bindings)
            elif bindings is not None:
                base = list(bindings)
            patches: list[tuple[Any, int, Any]] = []
            for p, value in _params(bindings):
                kind, data = kinds[(i, p)]
                if kind == "counter":
                    patches.append((p, _LIN, data))
                elif kind == "now":
                    patches.append((p, _NOW, None))
                elif kind == "template":
                    patches.append((p, _TPL, data))
                elif kind == "content" and isinstance(value, str):
                    tpl = _template(value, slots, rec["n"])
                    if any(not isinstance(x, str) for x in tpl):
                        patches.append((p, _TPL, tpl))
            stmt = (_STMT, sql, base, patches)
            # A statement outside any transaction (none today) gets one of its own.
            out += [stmt] if inside else [(_BEGIN,), stmt, (_COMMIT,)]
        return out

    def turn_ops(self, n: int) -> list[tuple[Any, ...]]:
        return self.compiled[n % len(self.compiled)]

    def context(self, n: int) -> dict[int, str]:
        from fleetstore_stress.agent import ids

        _, uid, aid = ids(self.cfg, self.agent, n)
        ctx = {_TURN: str(n), _USER: uid, _REPLY: aid}
        tail = f"{n:012x}"
        for j, prefix in enumerate(self.prefixes):
            ctx[j] = prefix + tail
        return ctx


def _bind(op: tuple[Any, ...], n: int, ctx: dict[int, str], now: float) -> Any:
    _, _, base, patches = op
    if not patches:
        return base
    b = base.copy()
    for p, kind, data in patches:
        if kind == _LIN:
            b[p] = data[0] + data[1] * n
        elif kind == _NOW:
            b[p] = now
        else:
            b[p] = "".join([x if x.__class__ is str else ctx[x] for x in data])
    return b


# ------------------------------------------------------------------ the targets in an agent


class _Stress:
    """A target of the stress module (``_Fleetstore``, ``_Opencode``, ``_Zcode``)."""

    def __init__(self, kind: str, cfg: dict[str, Any], agent: int) -> None:
        from fleetstore_stress import agent as stress
        from fleetstore_stress import peers

        cls = {"fleetstore": stress._Fleetstore, "opencode": peers._Opencode}
        cls["zcode"] = peers._Zcode
        cls["fleetstore-natural"] = stress._Fleetstore
        self.error_name = stress._error_name
        self.target = cls[kind](cfg, agent)
        self.store = getattr(self.target, "store", None)

    def turn(self, t: Any, clock: Any) -> tuple[list[tuple[int, str]], list[tuple[int, str, str]]]:
        try:
            digest = self.target.turn(t, clock)
        except Exception as exc:
            return [], [(t.n, self.error_name(exc), str(exc)[:300])]
        return [(t.n, digest)], []

    def finish(self, clock: Any) -> tuple[list[tuple[int, str]], list[tuple[int, str, str]]]:
        return [], []

    def metrics(self) -> dict[str, Any] | None:
        return self.store.metrics() if self.store is not None else None

    def close(self) -> None:
        self.target.close()


class _Raw:
    """raw-1 (batch 1: fleetstore's transactions as recorded) and raw-batched (the
    statements of *batch* turns in one transaction)."""

    def __init__(self, cfg: dict[str, Any], agent: int, template: Template, batch: int) -> None:
        import apsw

        import fleetstore
        from fleetstore_stress.agent import ids

        self.template = template
        self.batch = batch
        self.pending: list[int] = []
        sid = ids(cfg, agent)[0]
        # The session row, as _Fleetstore creates it (setup, not measured).
        with fleetstore.open(cfg["url"], synchronous=cfg["synchronous"]) as store:
            store.sessions.create(title=f"stress agent {agent}", id=sid)
        self.apsw = apsw
        self.conn = apsw.Connection(cfg["url"], flags=apsw.SQLITE_OPEN_READWRITE)
        self.conn.set_busy_timeout(RAW_BUSY_MS)
        self.conn.execute("PRAGMA journal_mode=WAL").fetchall()
        self.conn.execute(f"PRAGMA synchronous={cfg['synchronous']}")
        self.conn.execute("PRAGMA foreign_keys=ON")
        self.cur = self.conn.cursor()

    def _rollback(self) -> None:
        with contextlib.suppress(self.apsw.Error):
            if not self.conn.get_autocommit():
                self.cur.execute("ROLLBACK")

    @staticmethod
    def _spent(clock: Any, began: float, slept: float) -> None:
        spent = time.monotonic() - began - slept
        clock.total += spent
        clock.longest = max(clock.longest, spent)
        clock.writes += 1

    def turn(self, t: Any, clock: Any) -> tuple[list[tuple[int, str]], list[tuple[int, str, str]]]:
        ops = self.template.turn_ops(t.n)
        if self.batch > 1:
            for op in ops:
                if op[0] == _SLEEP:
                    time.sleep(t.tool_think)
            self.pending.append(t.n)
            if len(self.pending) < self.batch:
                return [], []
            return self._commit_batch(clock)
        cur = self.cur
        ctx = self.template.context(t.n)
        began = now = 0.0
        slept = 0.0
        try:
            for op in ops:
                kind = op[0]
                if kind == _STMT:
                    cur.execute(op[1], _bind(op, t.n, ctx, now)).fetchall()
                elif kind == _BEGIN:
                    began = time.monotonic()
                    slept = 0.0
                    now = time.time()
                    cur.execute("BEGIN IMMEDIATE")
                elif kind == _COMMIT:
                    cur.execute("COMMIT")
                    self._spent(clock, began, slept)
                else:
                    s0 = time.monotonic()
                    time.sleep(t.tool_think)
                    slept += time.monotonic() - s0
        except Exception as exc:
            self._rollback()
            return [], [(t.n, _error_name(exc), str(exc)[:300])]
        return [(t.n, "")], []

    def _commit_batch(self, clock: Any) -> tuple[list[tuple[int, str]], list[tuple[int, str, str]]]:
        turns, self.pending = self.pending, []
        if not turns:
            return [], []
        cur = self.cur
        template = self.template
        began = time.monotonic()
        now = time.time()
        try:
            cur.execute("BEGIN IMMEDIATE")
            for n in turns:
                ctx = template.context(n)
                for op in template.turn_ops(n):
                    if op[0] == _STMT:
                        cur.execute(op[1], _bind(op, n, ctx, now)).fetchall()
            cur.execute("COMMIT")
        except Exception as exc:
            self._rollback()
            name, msg = _error_name(exc), str(exc)[:300]
            return [], [(n, name, msg) for n in turns]
        self._spent(clock, began, 0.0)
        return [(n, "") for n in turns], []

    def finish(self, clock: Any) -> tuple[list[tuple[int, str]], list[tuple[int, str, str]]]:
        return self._commit_batch(clock)

    def metrics(self) -> dict[str, Any] | None:
        return None

    def close(self) -> None:
        self.conn.close()


def _error_name(exc: BaseException) -> str:
    from fleetstore_stress.agent import _error_name as name

    return name(exc)


def _harness_us(kind: str, cfg: dict[str, Any], agent: int) -> float:
    """CPU µs per turn of the workload's own making: ``Turn()`` (every target), and for
    the stress targets the tool output and its two sha256."""
    from fleetstore_stress.agent import Turn, sha

    rounds = 200
    c0 = time.process_time()
    for n in range(100_000, 100_000 + rounds):
        t = Turn(cfg, agent, n)
        if kind not in RAW_TARGETS:
            out = t.output(cfg, agent)
            sha(out)
            sha(out)
    return 1e6 * (time.process_time() - c0) / rounds


def _template_for(cell: dict[str, Any], agent: int, cache: dict[str, Any]) -> Template:
    cfg = cell["cfg"]
    key = "template"
    if key not in cache:
        # A fresh file: on one that holds these turns already, fleetstore's operations
        # would find themselves applied and write nothing.
        where = Path(cell["record_dir"]) / f"agent-{agent}"
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir(parents=True)
        scratch = where / "record.db"
        rec_cfg = {**cfg, "url": str(scratch), "think_ms": 0.0, "settings": {}}
        recs = record_turns(rec_cfg, agent, RECORD_WARMUP + RECORD_KEEP)
        cache[key] = Template(rec_cfg, agent, recs)
    template: Template = cache[key]
    return template


def _live_cell(
    index: int, cell: dict[str, Any], conn: Connection, cache: dict[str, Any]
) -> tuple[str, Any]:
    """One agent's part of one cell: open the target, report ready, wait for the
    start, live turns until the window ends, report."""
    from fleetstore_stress.agent import Clock, Turn

    kind = cell["target"]
    cfg = cell["cfg"]
    harness_key = "harness-raw" if kind in RAW_TARGETS else "harness"
    if harness_key not in cache:
        cache[harness_key] = _harness_us(kind, cfg, index)
    target: Any
    if kind in RAW_TARGETS:
        template = _template_for(cell, index, cache)
        target = _Raw(cfg, index, template, BATCH_TURNS if kind == "raw-batched" else 1)
        info = template.info
    else:
        target = _Stress(kind, cfg, index)
        info = None
    try:
        conn.send(("ready", {"pid": os.getpid(), "template": info}))
        go = conn.recv()
        if go[0] != "go":
            return ("aborted", None)
        _, start, end = go
        sleep_until(start)
        cpu0 = time.process_time()
        m0 = target.metrics()
        acked_n = array("q")
        acked_at = array("d")
        shas: list[str] = []
        lat = array("d")
        failed: list[tuple[int, str]] = []
        samples: dict[str, str] = {}

        def note(ok: list[tuple[int, str]], bad: list[tuple[int, str, str]]) -> None:
            done = time.monotonic()
            for k, digest in ok:
                acked_n.append(k)
                acked_at.append(done)
                shas.append(digest)
            for k, name, msg in bad:
                failed.append((k, name))
                samples.setdefault(name, msg)

        n = 1
        while True:
            t = Turn(cfg, index, n)
            wake = time.monotonic() + t.think
            if wake + t.tool_think >= end:
                break
            sleep_until(wake)
            clock = Clock()
            ok, bad = target.turn(t, clock)
            if not any(k == t.n for k, _, _ in bad):
                lat.append(clock.total)
            note(ok, bad)
            n += 1
        note(*target.finish(Clock()))
        cpu_s = time.process_time() - cpu0
        m1 = target.metrics()
    finally:
        target.close()
    return (
        "done",
        {
            "agent": index,
            "pid": os.getpid(),
            "acked_n": acked_n.tobytes(),
            "acked_at": acked_at.tobytes(),
            "shas": shas if kind in STRESS_TARGETS else [],
            "lat": lat.tobytes(),
            "failed": failed,
            "samples": samples,
            "lived": n - 1,
            "cpu_s": cpu_s,
            "m0": m0,
            "m1": m1,
            "harness_us": cache[harness_key],
        },
    )


def _child(index: int, conn: Connection) -> None:
    """An agent process: serves one cell per ("run", cell) message until ("exit",)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    cache: dict[str, Any] = {}
    try:
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                return
            if msg[0] == "exit":
                return
            try:
                reply = _live_cell(index, msg[1], conn, cache)
            except BaseException:
                reply = ("error", traceback.format_exc())
            conn.send(reply)
    finally:
        conn.close()


# ------------------------------------------------------------------ one cell, in the parent


def _proc_cpu(pid: int) -> float | None:
    """utime + stime of *pid* in seconds (None if it is gone)."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def _holders(path: str) -> set[int]:
    """Processes with the database (or its WAL) open."""
    names = {path, path + "-wal"}
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") in names:
                    found.add(int(entry))
                    break
            except OSError:
                continue
    return found


class _Helpers:
    """CPU of processes other than the agents (and us) that have the cell's file
    open: none today; a per-host writer process would be one, and its CPU is part of
    what fleetstore spends per turn."""

    def __init__(self, path: str, ours: set[int]) -> None:
        self.path = path
        self.ours = ours
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}

    def scan(self) -> None:
        for pid in _holders(self.path) - self.ours:
            cpu = _proc_cpu(pid)
            if cpu is not None:
                self.first.setdefault(pid, cpu)
                self.last[pid] = cpu
        for pid in list(self.last):
            cpu = _proc_cpu(pid)
            if cpu is not None:
                self.last[pid] = cpu

    @property
    def cpu_s(self) -> float:
        return sum(self.last[p] - self.first[p] for p in self.last)


def _collect(conns: list[Connection], what: str, timeout: float) -> list[tuple[str, Any]]:
    """Every child's next message (kind, payload); ("lost", None) for one that says
    nothing within *timeout*."""
    deadline = time.monotonic() + timeout
    out = []
    for c in conns:
        if c.poll(max(0.0, deadline - time.monotonic())):
            out.append(c.recv())
        else:
            out.append(("lost", f"no {what!r} within {timeout:g} s"))
    return out


def _cell_cfg(spec: dict[str, Any], url: str, run: dict[str, Any]) -> dict[str, Any]:
    """The stress module's agent configuration for one cell."""
    target = spec["target"]
    natural = target == "fleetstore-natural"  # the stress module's fleetstore, other calls
    return {
        "target": "raw" if target in RAW_TARGETS else "fleetstore" if natural else target,
        "shape": "natural" if natural else "fused",
        "url": url,
        "run_id": run["run_id"],
        "seed": run["seed"],
        "think_ms": spec["think_ms"],
        "output_bytes": run["output_bytes"],
        "large_rate": run["large_rate"],
        "large_bytes": run["large_bytes"],
        "settings": {"synchronous": spec["sync"]},
        "synchronous": spec["sync"],
        "drop_every": 0,
    }


def _prepare(cfg: dict[str, Any], target: str) -> None:
    import fleetstore
    from fleetstore_stress.child import prepare

    if target in RAW_TARGETS:
        fleetstore.open(cfg["url"], **cfg["settings"]).close()  # fleetstore's schema
    else:
        prepare(cfg)


def run_cell(fleet: Children, spec: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    n, target, seconds = spec["agents"], spec["target"], run["seconds"]
    cell_dir = Path(run["root"]) / "cells" / spec["label"]
    shutil.rmtree(cell_dir, ignore_errors=True)
    cell_dir.mkdir(parents=True)
    url = str(cell_dir / "bench.db")
    cfg = _cell_cfg(spec, url, run)
    row: dict[str, Any] = {**spec, "seconds": seconds, "problems": ""}
    _prepare(cfg, target)
    os.sync()  # earlier cells' dirty pages written back before this one starts
    row["load1_at_start"] = loadavg().split()[0]
    conns = fleet.conns[:n]
    wall0 = time.monotonic()
    cell = {"target": target, "cfg": cfg, "record_dir": str(Path(run["root"]) / "recordings")}
    for c in conns:
        c.send(("run", cell))
    ready = _collect(conns, "ready", 120 + 3.0 * n)
    bad = [p for k, p in ready if k != "ready"]
    if bad:
        for c, (k, _) in zip(conns, ready, strict=True):
            if k == "ready":
                c.send(("abort",))
        _collect([c for c, (k, _) in zip(conns, ready, strict=True) if k == "ready"], "abort", 60)
        raise RuntimeError(f"{spec['label']}: an agent failed to start:\n{bad[0]}")
    pids = {p["pid"] for _, p in ready}
    template = next((p["template"] for _, p in ready if p["template"]), None)
    start_at = time.monotonic() + 0.25
    end_at = start_at + seconds
    row["ready_s"] = start_at - wall0
    for c in conns:
        c.send(("go", start_at, end_at))
    helpers = _Helpers(url, pids | {os.getpid()})
    sleep_until(start_at)
    st0, pc0 = proc_stat(), time.process_time()
    helpers.scan()
    sleep_until(end_at)
    helpers.scan()
    done = _collect(conns, "done", seconds + 180)
    helpers.scan()
    st1, pc1 = proc_stat(), time.process_time()
    row["drain_s"] = time.monotonic() - end_at
    failures = [p for k, p in done if k != "done"]
    if failures:
        raise RuntimeError(f"{spec['label']}: an agent failed:\n{failures[0]}")
    results = [p for _, p in done]
    _summarise(row, results, end_at, helpers)
    row["template"] = template
    if st0 and st1 and st1["total"] > st0["total"]:
        total = st1["total"] - st0["total"]
        row["busy_pct"] = 100.0 * (st1["busy"] - st0["busy"]) / total
        available = total / os.sysconf("SC_CLK_TCK")
        own = row["cpu_s"] + (pc1 - pc0)
        row["foreign_pct"] = max(0.0, row["busy_pct"] - 100.0 * own / available)
    else:
        row["busy_pct"] = row["foreign_pct"] = math.nan
    v0 = time.monotonic()
    row["verify"] = _verify(target, cfg, cell_dir, results)
    row["verify_s"] = time.monotonic() - v0
    if not row["verify"]["ok"]:
        row["problems"] = row["verify"]["summary"]
    if not run["keep"]:
        shutil.rmtree(cell_dir, ignore_errors=True)
    return row


def _summarise(
    row: dict[str, Any], results: list[dict[str, Any]], end_at: float, helpers: _Helpers
) -> None:
    seconds = row["seconds"]
    per_agent: list[int] = []
    lat: list[float] = []
    acked = 0
    errors: Counter[str] = Counter()
    samples: dict[str, str] = {}
    for r in results:
        at = array("d")
        at.frombytes(r["acked_at"])
        per_agent.append(sum(1 for d in at if d <= end_at))
        acked += len(at)
        la = array("d")
        la.frombytes(r["lat"])
        lat.extend(la)
        errors.update(name for _, name in r["failed"])
        for k, v in r["samples"].items():
            samples.setdefault(k, v)
    lat.sort()
    in_window = sum(per_agent)
    agents_cpu = sum(r["cpu_s"] for r in results)
    row.update(
        turns=in_window,
        turns_per_s=in_window / seconds,
        acked=acked,
        lived=sum(r["lived"] for r in results),
        failed=sum(errors.values()),
        errors=dict(errors),
        error_samples=samples,
        agents_cpu_s=agents_cpu,
        helpers=len(helpers.last),
        helpers_cpu_s=helpers.cpu_s,
        cpu_s=agents_cpu + helpers.cpu_s,
        cpu_ms_per_turn=1000 * (agents_cpu + helpers.cpu_s) / acked if acked else math.nan,
        harness_us_per_turn=sum(r["harness_us"] for r in results) / len(results),
        p50_ms=1000 * pct(lat, 50),
        p99_ms=1000 * pct(lat, 99),
        max_ms=1000 * lat[-1] if lat else math.nan,
        fair_min=min(per_agent),
        fair_max=max(per_agent),
    )
    m = [(r["m0"], r["m1"]) for r in results if r["m0"] is not None and r["m1"] is not None]
    if m:
        engine: dict[str, Any] = {}
        for key in METRIC_COUNTERS:
            engine[key] = sum(_num(b.get(key, 0)) - _num(a.get(key, 0)) for a, b in m)
        engine["batch_max"] = max(_num(b.get("batch_max", 0)) for _, b in m)
        row["engine"] = engine
        row["writes_per_turn"] = engine["writes"] / acked if acked else math.nan
        row["commits_per_turn"] = engine["writes"] / acked if acked else math.nan
        row["ops_per_commit"] = (
            engine["batched_items"] / engine["writes"] if engine["writes"] else math.nan
        )


def _num(value: Any) -> float:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _verify(
    target: str, cfg: dict[str, Any], cell_dir: Path, results: list[dict[str, Any]]
) -> dict[str, Any]:
    """Every acknowledged turn in the file exactly once (see the module docstring)."""
    import json

    from fleetstore_stress.agent import ids
    from fleetstore_stress.verify import verify_main

    if target in STRESS_TARGETS:
        journals = []
        for r in results:
            acked = array("q")
            acked.frombytes(r["acked_n"])
            entries = [(k, {"n": k, "sha": s}) for k, s in zip(acked, r["shas"], strict=True)]
            entries += [(k, {"n": k, "fail": name}) for k, name in r["failed"]]
            path = cell_dir / f"agent-{r['agent']}.jsonl"
            path.write_text("".join(json.dumps(e) + "\n" for _, e in sorted(entries)))
            journals.append(str(path))
        report = verify_main({**cfg, "journals": journals})
        keys = ["lost", "duplicated", "out_of_order", "corrupt"]
        if cfg["target"] == "fleetstore":
            keys += ["state_behind", "stuck_effects", "index_problems"]
        problems = {k: report[k] for k in keys if report.get(k)}
        if report.get("integrity", "ok") != "ok":
            problems["integrity"] = report["integrity"]
        return {
            "ok": not problems,
            "acked_turns": report["acked_turns"],
            "problems": problems,
            "summary": ", ".join(f"{k} {v}" for k, v in problems.items()),
            "effects": report.get("effects"),
            "samples": report.get("samples") if problems else None,
        }
    import apsw

    lost = extra = lost_effects = 0
    con = apsw.Connection(cfg["url"], flags=apsw.SQLITE_OPEN_READONLY)
    try:
        for r in results:
            acked = array("q")
            acked.frombytes(r["acked_n"])
            agent = r["agent"]
            sid = ids(cfg, agent)[0]
            want = {m for k in acked for m in ids(cfg, agent, k)[1:]}
            rows = con.execute("SELECT id FROM messages WHERE session_id = ?", (sid,)).fetchall()
            have = {str(x[0]) for x in rows}
            lost += len(want - have)
            extra += len(have - want)
            rows = con.execute("SELECT payload FROM effects WHERE thread_key = ?", (sid,))
            turns = {json.loads(p)["turn"] for (p,) in rows.fetchall()}
            lost_effects += sum(1 for k in acked if k not in turns)
        integrity = str(con.execute("PRAGMA quick_check").fetchall()[0][0])
    finally:
        con.close()
    problems: dict[str, Any] = {}
    if lost:
        problems["lost"] = lost
    if lost_effects:
        problems["lost_effects"] = lost_effects
    if integrity != "ok":
        problems["integrity"] = integrity
    return {
        "ok": not problems,
        "acked_turns": sum(len(r["acked_n"]) // 8 for r in results),
        "problems": problems,
        "summary": ", ".join(f"{k} {v}" for k, v in problems.items()),
        "unacked_messages": extra,
    }


# ------------------------------------------------------------------ the plan


def _label(sync: str, think: float, agents: int, target: str, rnd: int) -> str:
    return f"{sync}-think{think:g}-n{agents}-{target}-r{rnd}"


def plan(
    configs: list[tuple[str, float, int]], targets: list[str], rounds: int
) -> list[dict[str, Any]]:
    """Cells in run order: per configuration every target back to back, the order
    rotated from one configuration to the next, and reversed in odd rounds (ABBA)."""
    out = []
    for ci, (sync, think, agents) in enumerate(configs):
        shift = ci % len(targets)
        order = targets[shift:] + targets[:shift]
        for rnd in range(rounds):
            for target in order if rnd % 2 == 0 else order[::-1]:
                out.append(
                    {
                        "sync": sync,
                        "think_ms": think,
                        "agents": agents,
                        "target": target,
                        "round": rnd,
                        "label": _label(sync, think, agents, target, rnd),
                    }
                )
    return out


# ------------------------------------------------------------------ report

_MEAN_KEYS = (
    "turns_per_s",
    "cpu_ms_per_turn",
    "p50_ms",
    "p99_ms",
    "max_ms",
    "fair_min",
    "fair_max",
    "foreign_pct",
    "busy_pct",
    "commits_per_turn",
    "writes_per_turn",
    "ops_per_commit",
    "harness_us_per_turn",
)


def _mean(values: list[Any]) -> float:
    vals = [v for v in values if isinstance(v, int | float) and not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def aggregate(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (sync, think, agents, target): the mean over its rounds."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["sync"], c["think_ms"], c["agents"], c["target"]), []).append(c)
    rows = []
    for (sync, think, agents, target), runs in groups.items():
        row: dict[str, Any] = {
            "sync": sync,
            "think_ms": think,
            "agents": agents,
            "target": target,
            "rounds": len(runs),
        }
        for key in _MEAN_KEYS:
            row[key] = _mean([r.get(key) for r in runs])
        row["turns_per_s_rounds"] = [r["turns_per_s"] for r in runs]
        row["failed"] = sum(r["failed"] for r in runs)
        errors: Counter[str] = Counter()
        for r in runs:
            errors.update(r["errors"])
        row["errors"] = dict(errors)
        row["foreign_pct_max"] = max((r.get("foreign_pct", math.nan) for r in runs), default=0)
        row["verified"] = all(r["verify"]["ok"] for r in runs)
        row["problems"] = "; ".join(r["problems"] for r in runs if r["problems"])
        engines = [r["engine"] for r in runs if r.get("engine")]
        if engines:
            row["batch_max"] = max(e["batch_max"] for e in engines)
            row["handed_over"] = sum(e["handed_over"] for e in engines)
            row["batched_items"] = sum(e["batched_items"] for e in engines)
            row["commits"] = sum(e["writes"] for e in engines)
        rows.append(row)
    return rows


def _find(rows: list[dict[str, Any]], sync: str, think: float, agents: int, target: str) -> Any:
    for r in rows:
        if (r["sync"], r["think_ms"], r["agents"], r["target"]) == (sync, think, agents, target):
            return r
    return None


def _ratio(a: Any, b: Any, key: str) -> float:
    if a is None or b is None:
        return math.nan
    x, y = a.get(key, math.nan), b.get(key, math.nan)
    if not y or math.isnan(x) or math.isnan(y):
        return math.nan
    return float(x / y)


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ratios the targets are stated in, each between cells of this run."""
    out: list[dict[str, Any]] = []
    order = {s: i for i, s in enumerate(SYNCS)}
    configs = sorted(
        {(r["sync"], r["think_ms"], r["agents"]) for r in rows},
        key=lambda c: (order.get(c[0], 9), c[1], c[2]),
    )

    def add(name: str, sync: str, think: float, agents: Any, value: float) -> None:
        out.append(
            {"ratio": name, "sync": sync, "think_ms": think, "agents": agents, "value": value}
        )

    for sync, think, agents in configs:
        fs = _find(rows, sync, think, agents, "fleetstore")
        natural = _find(rows, sync, think, agents, "fleetstore-natural")
        for other in ("opencode", "zcode"):
            peer = _find(rows, sync, think, agents, other)
            add(
                f"fleetstore / {other} turns/s",
                sync,
                think,
                agents,
                _ratio(fs, peer, "turns_per_s"),
            )
            add(
                f"fleetstore-natural / {other} turns/s",
                sync,
                think,
                agents,
                _ratio(natural, peer, "turns_per_s"),
            )
        add(
            "fleetstore-natural / fleetstore CPU per turn",
            sync,
            think,
            agents,
            _ratio(natural, fs, "cpu_ms_per_turn"),
        )
        for raw in ("raw-batched", "raw-1"):
            base = _find(rows, sync, think, agents, raw)
            add(
                f"fleetstore / {raw} CPU per turn",
                sync,
                think,
                agents,
                _ratio(fs, base, "cpu_ms_per_turn"),
            )
            net = math.nan
            if fs and base:
                a = fs["cpu_ms_per_turn"] - fs["harness_us_per_turn"] / 1000
                b = base["cpu_ms_per_turn"] - base["harness_us_per_turn"] / 1000
                net = a / b if b > 0 else math.nan
            add(f"fleetstore / {raw} CPU per turn, net of Turn()", sync, think, agents, net)
    for sync, think in dict.fromkeys((s, t) for s, t, _ in configs):
        for hi, lo in ((16, 1), (64, 16)):
            a = _find(rows, sync, think, hi, "fleetstore")
            b = _find(rows, sync, think, lo, "fleetstore")
            if a and b:
                add(
                    f"fleetstore {hi} agents / {lo} agents turns/s",
                    sync,
                    think,
                    f"{hi}/{lo}",
                    _ratio(a, b, "turns_per_s"),
                )
    return out


def _r(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"


def _find_ratio(rs: list[dict[str, Any]], name: str, sync: str, think: float, agents: Any) -> float:
    for r in rs:
        if (r["ratio"], r["sync"], r["think_ms"], r["agents"]) == (name, sync, think, agents):
            return float(r["value"]) if r["value"] is not None else math.nan
    return math.nan


def _failed(rows: list[dict[str, Any]]) -> str:
    parts = []
    for r in rows:
        if r and r["failed"]:
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["errors"].items()))
            parts.append(f"{r['target']} {r['failed']} ({kinds})")
    return "; ".join(parts) or "0"


def _noise(rows: list[dict[str, Any]], seconds: float) -> str:
    """The spread of turns/s between the rounds of a cell (cells of >= 100 turns in
    every round: zcode's near-zero counts would say nothing)."""
    spreads = []
    for r in rows:
        v = r.get("turns_per_s_rounds") or []
        if len(v) >= 2 and min(v) * seconds >= 100:
            spreads.append(((max(v) - min(v)) / _mean(v), r))
    if not spreads:
        return "one round (or too few turns): no repeat to judge it by"
    spreads.sort(key=lambda x: x[0])
    worst, w = spreads[-1]
    fs = sorted(x for x, r in spreads if r["target"] == "fleetstore")
    return (
        f"between the rounds of a cell, turns/s differed by a median "
        f"{100 * spreads[len(spreads) // 2][0]:.0f} % (fleetstore's cells: "
        + (f"{100 * fs[len(fs) // 2]:.0f} %" if fs else "-")
        + f"; worst {100 * worst:.0f} %, {w['target']} {w['sync']} think {w['think_ms']:g} "
        f"ms, {w['agents']} agents)"
    )


def markdown(doc: dict[str, Any]) -> str:
    info, run, rows = doc["info"], doc["run"], doc["rows"]
    rs = doc["ratios"]
    tpl = doc.get("raw_template") or {}
    lines = [
        f"Run {info['date']} on {info['machine']}; git {info['git_head']}, sources "
        f"{info['sources_sha256']} ({info['fleetstore_path']}); load average at start "
        f"{info['loadavg_at_start']}, at end {info.get('loadavg_at_end', '?')}; "
        f"wall {info.get('wall_s', '?')} s.",
        f"Command: `{info['command']}`",
        "",
        f"{run['seconds']:g} s per cell, {run['rounds']} round(s) per configuration (targets "
        f"back to back, ABBA); turns of `fleetstore_stress.agent.Turn`: seed "
        f"{run['seed']}, tool outputs log-normal around {run['output_bytes']} B "
        f"(large_rate {run['large_rate']:g}); think and tool time exponential with the "
        "cell's mean (so N agents offer at most N / (2 x think) turns/s). Noise: "
        f"{_noise(rows, run['seconds'])}.",
    ]
    if tpl:
        lines += [
            "",
            f"Raw baselines: fleetstore's writer SQL recorded per agent, "
            f"{tpl.get('statements_per_turn')} statements in "
            f"{tpl.get('transactions_per_turn')} transactions per turn "
            f"({tpl.get('distinct_sql')} distinct; {tpl.get('kept_turns')} of "
            f"{tpl.get('recorded_turns') - tpl.get('warmup_turns')} recorded turns kept, "
            f"{tpl.get('shapes_seen')} shape(s) seen; bindings "
            + ", ".join(f"{k} {v}" for k, v in sorted(tpl.get("bindings", {}).items()))
            + f"; {tpl.get('other_statements_per_turn'):g} statements per turn on other "
            "connections, not replayed). raw-batched commits 10 turns per transaction.",
        ]
    for sync in [s for s in SYNCS if any(r["sync"] == s for r in rows)]:
        configs = sorted({(r["think_ms"], r["agents"]) for r in rows if r["sync"] == sync})
        lines += [
            "",
            f"### synchronous {sync}",
            "",
            "| agents | think ms | fleetstore turns/s | CPU ms/turn | opencode turns/s "
            "| CPU ms/turn | zcode turns/s | CPU ms/turn | raw-1 turns/s | CPU ms/turn "
            "| raw-batched turns/s | CPU ms/turn | fs p50 ms | fs p99 ms | fs max ms "
            "| fs fairness min/max | fs commits/turn | fs ops/commit (max) | fs handed over "
            "| failed turns | foreign CPU % | verified |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
            "|---:|---:|---:|---:|---|---:|---|",
        ]
        for think, agents in configs:
            cells = {t: _find(rows, sync, think, agents, t) for t in TARGETS}
            fs = cells["fleetstore"] or {}
            figures = []
            for t in TARGETS:
                c = cells[t] or {}
                figures += [fmt(c.get("turns_per_s"), 0), fmt(c.get("cpu_ms_per_turn"), 3)]
            present = [c for c in cells.values() if c]
            batch = "-"
            if fs and fs.get("commits"):
                batch = f"{fmt(fs['ops_per_commit'], 2)} ({fs.get('batch_max', 0):g})"
            fair = f"{fs['fair_min']:.0f}/{fs['fair_max']:.0f}" if fs else "-"
            bad = [f"{c['target']}: {c['problems']}" for c in present if not c["verified"]]
            foreign = max((c["foreign_pct_max"] for c in present), default=math.nan)
            lines.append(
                f"| {agents} | {think:g} | "
                + " | ".join(figures)
                + f" | {fmt(fs.get('p50_ms'), 2)} | {fmt(fs.get('p99_ms'), 1)} "
                f"| {fmt(fs.get('max_ms'), 1)} | {fair} | {fmt(fs.get('commits_per_turn'), 2)} "
                f"| {batch} | {fs.get('handed_over', 0) if fs else '-'} | {_failed(present)} "
                f"| {fmt(foreign, 0)} | {'yes' if not bad else 'NO: ' + '; '.join(bad)} |"
            )
        lines += [
            "",
            "| agents | think ms | fleetstore / opencode turns/s | fleetstore / zcode turns/s "
            "| fleetstore / raw-batched CPU per turn (net of Turn()) "
            "| fleetstore / raw-1 CPU per turn (net of Turn()) |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for think, agents in configs:

            def q(name: str, sync: str = sync, think: float = think, agents: int = agents) -> str:
                return _r(_find_ratio(rs, name, sync, think, agents))

            lines.append(
                f"| {agents} | {think:g} | {q('fleetstore / opencode turns/s')} "
                f"| {q('fleetstore / zcode turns/s')} "
                f"| {q('fleetstore / raw-batched CPU per turn')} "
                f"({q('fleetstore / raw-batched CPU per turn, net of Turn()')}) "
                f"| {q('fleetstore / raw-1 CPU per turn')} "
                f"({q('fleetstore / raw-1 CPU per turn, net of Turn()')}) |"
            )
    lines += ["", "Scaling and the FULL ratios (fleetstore turns/s, this run):", ""]
    lines += ["| ratio | synchronous | think ms | value |", "|---|---|---:|---:|"]
    for r in rs:
        if r["ratio"].startswith("fleetstore 16") or r["ratio"].startswith("fleetstore 64"):
            lines.append(f"| {r['ratio']} | {r['sync']} | {r['think_ms']:g} | {_r(r['value'])} |")
    for r in rs:
        if (
            r["ratio"] == "fleetstore / opencode turns/s"
            and r["sync"] == "FULL"
            and r["agents"] == 16
        ):
            lines.append(
                f"| FULL, 16 agents: fleetstore / opencode turns/s | FULL | {r['think_ms']:g} "
                f"| {_r(r['value'])} |"
            )
    if doc.get("aborted"):
        lines += ["", f"**The run stopped early**: {doc['aborted']}"]
    samples = {}
    for c in doc["cells"]:
        for k, v in (c.get("error_samples") or {}).items():
            samples.setdefault((c["target"], k), v)
    if samples:
        lines += ["", "Failed turns, first message per target and class:", ""]
        lines += [f"* {t} {k}: {v}" for (t, k), v in sorted(samples.items())]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ main


def _git_head() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(BENCH_DIR), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = subprocess.run(
            ["git", "-C", str(BENCH_DIR), "status", "--porcelain", "--", "../src"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() + (" (src modified)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def machine_info() -> dict[str, Any]:
    import apsw

    import fleetstore

    src = Path(fleetstore.__file__).resolve().parent
    digest = hashlib.sha256()
    for f in sorted(src.rglob("*")):
        if f.suffix in (".py", ".sql"):
            digest.update(f.read_bytes())
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": (
            f"{os.cpu_count()} CPUs ({platform.machine()}), Linux {platform.release()}, "
            f"Python {platform.python_version()}, apsw {apsw.apsw_version()}, "
            f"SQLite {apsw.sqlite_lib_version()}"
        ),
        "nproc": os.cpu_count(),
        "git_head": _git_head(),
        "sources_sha256": digest.hexdigest()[:12],
        "fleetstore_path": str(src),
        "fleetstore_env": {k: v for k, v in os.environ.items() if k.startswith("FLEETSTORE_")},
        "loadavg_at_start": loadavg(),
        "command": " ".join([".venv/bin/python", "benchmarks/bench_write_path.py", *sys.argv[1:]]),
    }


def _csv(kind: Any, text: str) -> list[Any]:
    return [kind(x.strip()) for x in text.split(",") if x.strip()]


def _configs(args: argparse.Namespace, ap: argparse.ArgumentParser) -> list[tuple[str, float, int]]:
    if args.cells:
        out = []
        for item in _csv(str, args.cells):
            try:
                sync, think, agents = item.split(":")
                out.append((sync.upper(), float(think), int(agents)))
            except ValueError:
                ap.error(f"--cells: {item!r} is not SYNC:THINK_MS:AGENTS (e.g. FULL:10:16)")
        return out
    agents = (
        _csv(int, args.agents) if args.agents else list(QUICK["agents"] if args.quick else AGENTS)
    )
    thinks = (
        _csv(float, args.think)
        if args.think
        else list(QUICK["thinks"] if args.quick else THINKS_MS)
    )
    syncs = (
        _csv(str.upper, args.sync) if args.sync else list(QUICK["syncs"] if args.quick else SYNCS)
    )
    return [(s, t, n) for s in syncs for t in thinks for n in agents]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="agents 1,4, closed loop, NORMAL, 1.5 s")
    ap.add_argument("--agents", help="agent counts, comma-separated (1,4,16,64)")
    ap.add_argument("--think", help="mean think times in ms, comma-separated (0,10)")
    ap.add_argument("--sync", help="synchronous modes, comma-separated (NORMAL,FULL)")
    ap.add_argument(
        "--cells",
        help="configurations SYNC:THINK_MS:AGENTS, comma-separated, instead of "
        "--agents/--think/--sync (e.g. FULL:0:16,FULL:10:16)",
    )
    ap.add_argument("--targets", default=",".join(TARGETS), help="subset of " + ",".join(TARGETS))
    ap.add_argument("--seconds", type=float, help=f"measured seconds per cell ({SECONDS:g})")
    ap.add_argument("--rounds", type=int, help=f"runs of each cell, ABBA ({ROUNDS})")
    ap.add_argument("--seed", type=int, default=SEED, help="the turns' seed")
    ap.add_argument("--output-bytes", type=int, default=OUTPUT_BYTES, help="median tool output")
    ap.add_argument("--large-rate", type=float, default=0.0, help="share of large outputs (0)")
    ap.add_argument("--large-bytes", type=int, default=8 * 1024 * 1024, help="their largest size")
    ap.add_argument("--json", type=Path, help="default benchmarks/results/write-path-<time>.json")
    ap.add_argument("--markdown", type=Path, help="write the tables here too")
    ap.add_argument("--workdir", type=Path, help="where the databases go")
    ap.add_argument("--keep", action="store_true", help="keep the databases")
    ap.add_argument("--report", type=Path, help="run nothing: print the tables of a --json file")
    args = ap.parse_args(argv)
    if args.report:
        print_report(args.report, markdown, args.markdown)
        return 0
    targets = _csv(str, args.targets)
    for t in targets:
        if t not in TARGETS:
            ap.error(f"unknown target {t!r}; known: {', '.join(TARGETS)}")
    configs = _configs(args, ap)
    for sync, think, agents in configs:
        if sync not in SYNCS or think < 0 or agents < 1:
            ap.error(f"cannot run {sync}:{think:g}:{agents}")
    seconds = args.seconds or (QUICK["seconds"] if args.quick else SECONDS)
    rounds = args.rounds or (QUICK["rounds"] if args.quick else ROUNDS)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = args.workdir or BENCH_DIR / "results" / f"write-path-{stamp}"
    run = {
        "seconds": seconds,
        "rounds": rounds,
        "seed": args.seed,
        "run_id": f"bench-{stamp}",
        "output_bytes": args.output_bytes,
        "large_rate": args.large_rate,
        "large_bytes": args.large_bytes,
        "root": str(root),
        "keep": args.keep,
        "targets": targets,
        "configs": [list(c) for c in configs],
        "batch_turns": BATCH_TURNS,
    }
    info = machine_info()
    todo = plan(configs, targets, rounds)
    most = max(n for _, _, n in configs)
    print(f"# {info['machine']}\n# fleetstore from {info['fleetstore_path']}", flush=True)
    print(
        f"# {len(todo)} cells x {seconds:g} s, {most} agent processes, files under {root}; "
        f"load {info['loadavg_at_start']}",
        flush=True,
    )
    doc: dict[str, Any] = {"info": info, "run": run, "cells": []}
    t0 = time.monotonic()
    fleet = Children(most, _child, lambda i: (i,))
    try:
        for i, spec in enumerate(todo, 1):
            if doc.get("aborted"):
                break
            print(f"[{i}/{len(todo)}] {spec['label']:<36}", end="", flush=True)
            try:
                row = run_cell(fleet, spec, run)
            except (Exception, KeyboardInterrupt) as exc:
                # What ran so far is saved; the processes may be mid-cell: stop here.
                doc["aborted"] = f"{spec['label']}: {exc}"
                print(f"\nABORTED: {doc['aborted']}", flush=True)
                continue
            doc["cells"].append(row)
            if row.get("template") and "raw_template" not in doc:
                doc["raw_template"] = row["template"]
            extra = ""
            if row.get("engine"):
                extra = f"  commits/turn {fmt(row['commits_per_turn'], 2)}"
            print(
                f" {fmt(row['turns_per_s'], 0):>7} turns/s  cpu {fmt(row['cpu_ms_per_turn'], 3)} "
                f"ms/turn  p99 {fmt(row['p99_ms'], 1)} ms  fair {row['fair_min']}/"
                f"{row['fair_max']}  failed {row['failed']}{extra}  foreign "
                f"{fmt(row['foreign_pct'], 0)} %  (ready {row['ready_s']:.1f} s, verify "
                f"{row['verify_s']:.1f} s)"
                + (f"\n    WARNING: {row['problems']}" if row["problems"] else ""),
                flush=True,
            )
    finally:
        fleet.close()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    info["loadavg_at_end"] = loadavg()
    info["wall_s"] = round(time.monotonic() - t0, 1)
    doc["rows"] = aggregate(doc["cells"])
    doc["ratios"] = ratios(doc["rows"])
    md = markdown(doc)
    out = args.json or BENCH_DIR / "results" / f"write-path-{stamp}.json"
    save_results(doc, md, info["wall_s"], out, args.markdown)
    return 1 if doc.get("aborted") or any(c["problems"] for c in doc["cells"]) else 0


if __name__ == "__main__":
    sys.exit(main())
