"""The read-back of ``fleetstore stress``: every target's store against its agents'
journals (run in a process of its own, ``python -m fleetstore_stress.agent
--verify``): every acknowledged turn present exactly once, in order, intact; the
state checkpoint and the effect there; ``integrity_check`` of every file."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from fleetstore_stress.agent import ids, read_journal, sha
from fleetstore_stress.effects import Row, summarize
from fleetstore_stress.growth import run_twice


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
    elif kind == "t3code":
        extra = _verify_t3code(cfg, journals, check)
    elif kind in ("opencode", "zcode"):
        extra = _verify_opencode(cfg, journals, check)
    elif kind == "agents-sdk":
        extra = _verify_agents_sdk(cfg, journals, check)
    elif kind == "langgraph":
        extra = _verify_langgraph(cfg, journals, check)
    index_samples = extra.pop("samples_index", [])
    if extra.get("outbox"):
        executions, twice = run_twice(cfg)
        extra["outbox"].update(executions=executions, run_twice=twice)
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
        rows: list[Row] = []
        while True:
            page = store.effects.list(limit=10_000, after=after)
            for ef in page:
                effects[ef.state.value] += 1
                expires = ef.lease_expires_at
                if ef.state.value == "running" and expires is not None and expires < now:
                    stuck.append(ef.id)
                rows.append(
                    Row(
                        ef.thread_key,
                        ef.seq or 0,
                        ef.state.value,
                        ef.created_at,
                        ef.started_at,
                        ef.finished_at,
                        expires,
                    )
                )
            if len(page) < 10_000:
                break
            after = page[-1]
        integrity, files = _integrity(store)
        index = _index_problems(store)
    return {
        "effects": dict(effects),
        "outbox": summarize(rows, now=now, start=float(cfg.get("start_wall", now))),
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
    from fleetstore_stress.patterns.plain import PlainConnection

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


def _verify_t3code(
    cfg: dict[str, Any], journals: dict[int, list[dict[str, Any]]], check: _Check
) -> dict[str, Any]:
    from fleetstore_stress.patterns.plain import PlainConnection
    from fleetstore_stress.patterns.t3code_outbox import LEASE_MS, parse_iso

    with PlainConnection(cfg["url"], busy_ms=30_000, readonly=True) as db:
        effect_ids = {
            str(r[0]) for r in db.execute("SELECT effect_id FROM orchestration_v2_effect_outbox")
        }
        for agent, journal in journals.items():
            acked = _acked(journal)
            if not acked:
                continue
            sid = ids(cfg, agent)[0]
            rows = db.execute(
                "SELECT message_id FROM orchestration_v2_projection_messages WHERE thread_id = ? "
                "ORDER BY created_at, rowid",
                (sid,),
            )
            expected: list[tuple[str, int]] = []
            for e in acked:
                _, uid, aid = ids(cfg, agent, e["n"])
                expected += [(uid, e["n"]), (aid, e["n"])]
            _check_sequence(check, agent, expected, [str(r[0]) for r in rows])
            for e in acked:
                aid = ids(cfg, agent, e["n"])[2]
                item = db.execute(
                    "SELECT status, payload_json FROM orchestration_v2_projection_turn_items "
                    "WHERE turn_item_id = ?",
                    (aid + "/tool",),
                )
                output = json.loads(item[0][1]).get("output") if item else None
                if output is None or item[0][0] != "completed" or sha(output) != e["sha"]:
                    check.add("corrupt", [agent, e["n"], aid])
                if f"{sid}/run/{e['n']}/checkpoint.capture" not in effect_ids:
                    check.add("lost", [agent, e["n"], "effect"])
        now = time.time()
        outbox_rows: list[Row] = []
        states: Counter[str] = Counter()
        for effect in db.execute(
            "SELECT thread_id, rowid, status, created_at, lease_expires_at, completed_at "
            "FROM orchestration_v2_effect_outbox"
        ):
            states[str(effect[2])] += 1
            expires = parse_iso(str(effect[4])) if effect[4] else None
            outbox_rows.append(
                Row(
                    str(effect[0]),
                    int(effect[1]),
                    str(effect[2]),
                    parse_iso(str(effect[3])),
                    expires - LEASE_MS / 1000 if expires is not None else None,
                    parse_iso(str(effect[5])) if effect[5] else None,
                    expires,
                )
            )
        outbox = summarize(outbox_rows, now=now, start=float(cfg.get("start_wall", now)))
        integrity = "; ".join(db.integrity()[:10])
    return {"integrity": integrity, "effects": dict(states), "outbox": outbox}


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
