"""The table ``fleetstore stress`` prints: one column per target."""

from __future__ import annotations

from typing import Any

from fleetstore.core.render import table
from fleetstore.core.units import size as _size


def format_report(report: dict[str, Any]) -> str:
    """The table ``fleetstore stress`` prints: one column per target."""
    r = report
    targets = r["targets"]
    think = f"think {r['think_ms']:g} ms mean" if r["think_ms"] > 0 else "closed loop"
    faults = []
    if r["external_locks"]:
        faults.append("outside lock " + ", ".join(r["external_locks"]))
    if r["kill_rate"]:
        achieved = "/".join(f"{t['kill_rate_achieved']:g}" for t in targets)
        faults.append(f"SIGKILL {r['kill_rate']:g}/s (achieved {achieved}/s)")
    if r["maintain"]:
        faults.append("maintenance")
    if r["drop_every"]:
        faults.append(f"BROKEN TARGET: drops every {r['drop_every']}th write")
    rows: list[tuple[str, list[str]]] = [
        ("acknowledged turns", [f"{t['acknowledged']:,}" for t in targets]),
        ("failed turns", [f"{t['failed']:,}" for t in targets]),
        ("lost", [f"{t['lost']:,}" for t in targets]),
        ("duplicated", [f"{t['duplicated']:,}" for t in targets]),
        ("out of order", [f"{t['out_of_order']:,}" for t in targets]),
        ("corrupt", [f"{t['corrupt']:,}" for t in targets]),
        ("turns/s", [f"{t['turns_per_s']:,.1f}" for t in targets]),
        ("turn p50", [f"{t['latency_ms']['p50']:.1f} ms" for t in targets]),
        ("turn p99", [f"{t['latency_ms']['p99']:.1f} ms" for t in targets]),
        ("turn max", [f"{t['latency_ms']['max']:.1f} ms" for t in targets]),
        ("fairness min/max", [f"{t['fairness']['ratio']:.2f}" for t in targets]),
        ("integrity", [t["integrity"] for t in targets]),
        ("verdict", [t["verdict"].upper() for t in targets]),
    ]
    if any(t.get("outbox") for t in targets):
        rows += _outbox_rows(targets)
    if any(t.get("bytes", {}).get("files") for t in targets):
        rows += _bytes_rows(targets)
    main = targets[0]
    names = [t["target"] for t in targets]

    lines = [
        f"fleetstore stress: {r['agents']} agents x {r['duration']:g}s per target, {think}, "
        f"outputs ~{_size(r['output_bytes'])} ({r['large_rate']:.0%} up to "
        f"{_size(r['large_bytes'])}), seed {r['seed']}",
        f"  faults: {'; '.join(faults) or 'none'}; workers {r['workers']}; "
        f"synchronous {r['synchronous']}, write budget {r['write_budget']:g}s",
        f"  fleetstore target {r['url']}; results under {r['dir']}",
        "",
        table(["", *names], [(k, *v) for k, v in rows], right=set(names)),
        "",
    ]
    lines.append(
        "  versions: " + "; ".join(f"{t['target']} {t.get('version', '')}" for t in targets)
    )
    for t in targets[1:]:
        if t["failures_by_type"]:
            kinds = ", ".join(f"{k} {v:,}" for k, v in t["failures_by_type"].items())
            lines.append(f"  {t['target']} failures: {kinds}")
    for skipped in r.get("not_run", ()):
        lines.append(f"  {skipped['target']} not run: {_clip(skipped['reason'])}")
    if r["verdict"] == "pass":
        lines.append(
            "PASS: fleetstore failed no turn; every acknowledged write is on disk exactly "
            "once, in order, intact"
        )
    else:
        lines.append("FAIL: fleetstore: " + "; ".join(r["problems"]))
        samples = main["samples"]
        for sample in samples.get("failures", [])[:3]:
            lines.append(
                f"  agent {sample['agent']} turn {sample['turn']}: {sample['type']} after "
                f"{sample['waited']:.2f}s: {_clip(sample['message'])}"
            )
        for kind in ("lost", "duplicated", "out_of_order", "corrupt"):
            for s in samples.get(kind, [])[:3]:
                lines.append(f"  {kind}: agent {s[0]} turn {s[1]}: {' '.join(map(str, s[2:]))}")
        for c in main["crashed"][:5]:
            lines.append(f"  {c['role']} {c['index']} exit {c['exit_code']}: {c['error']}")
    return "\n".join(lines)


def _outbox_rows(targets: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    def cell(t: dict[str, Any], fmt: str, key: str) -> str:
        o = t.get("outbox")
        return "-" if not o else fmt.format(o[key])

    return [
        ("effects enqueued", [cell(t, "{:,}", "enqueued") for t in targets]),
        ("effects settled", [cell(t, "{:,}", "settled") for t in targets]),
        ("effects stuck", [cell(t, "{:,}", "stuck") for t in targets]),
        ("effects run twice", [cell(t, "{:,}", "run_twice") for t in targets]),
        ("settlements delayed", [_delayed(t) for t in targets]),
        ("lanes blocked at end", [cell(t, "{:,}", "lanes_blocked_at_end") for t in targets]),
        ("lane blocked max", [cell(t, "{:.1f} s", "lane_blocked_max_s") for t in targets]),
        ("outbox drain after run", [_drain(t) for t in targets]),
        ("enqueue-settled p50", [cell(t, "{:.1f} ms", "settle_p50_ms") for t in targets]),
        ("enqueue-settled p99", [cell(t, "{:.1f} ms", "settle_p99_ms") for t in targets]),
    ]


def _drain(t: dict[str, Any]) -> str:
    """How long the run waited, once the agents stopped, for the workers to settle the
    backlog (fleetstore's; the peers' workers are stopped with the agents)."""
    d = (t.get("outbox") or {}).get("drain")
    if not d:
        return "-"
    left = f", {d['left']:,} left" if d["left"] else ""
    return f"{d['waited_s']:.1f} s{left}"


def _delayed(t: dict[str, Any]) -> str:
    """Settlements that met a locked store: t3code's lock timeouts (each tried again
    100 ms later), fleetstore's that went to the spool."""
    o = t.get("outbox")
    if not o:
        return "-"
    w = o.get("workers", {})
    return f"{w.get('settle_busy', w.get('spooled', 0)):,}"


def _bytes_rows(targets: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    def cell(t: dict[str, Any], when: str, key: str) -> str:
        b = t.get("bytes", {})
        return _size(b[when][key]) if b.get("files") else "-"

    def per_turn(t: dict[str, Any]) -> str:
        b = t.get("bytes", {})
        return _size(b["per_turn"]) if b.get("per_turn") is not None else "-"

    def factor(t: dict[str, Any]) -> str:
        b = t.get("bytes", {})
        return f"{b['vs_compressed_payload']:.1f}x" if b.get("vs_compressed_payload") else "-"

    def largest(t: dict[str, Any]) -> str:
        top = t.get("bytes", {}).get("largest_table")
        return f"{top['name'].removeprefix('orchestration_v2_')} {top['share']:.0%}" if top else "-"

    return [
        ("database after run", [cell(t, "after_run", "db") for t in targets]),
        (
            "WAL peak in run",
            [
                _size(t.get("wal_peak", 0)) if t.get("bytes", {}).get("files") else "-"
                for t in targets
            ],
        ),
        ("blobs", [cell(t, "after_run", "blobs") for t in targets]),
        ("kept after checkpoint", [cell(t, "after_checkpoint", "total") for t in targets]),
        ("bytes per turn", [per_turn(t) for t in targets]),
        ("vs compressed payload", [factor(t) for t in targets]),
        ("largest table", [largest(t) for t in targets]),
    ]


def _clip(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
