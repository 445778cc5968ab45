"""The ``fleetstore stress --report FILE.html`` page: one self-contained file (inline
CSS, SVG charts drawn here, a few lines of JS; nothing fetched from the network)."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleetstore.core.units import size

_COLORS = ("#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b")
_W, _H = 640, 260
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 60, 16, 14, 36

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1340px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px}
.meta{color:#555} .pass{color:#186a1f} .fail{color:#b00020}
.verdict{font-size:18px;font-weight:600;margin:12px 0}
table{border-collapse:collapse} td,th{padding:4px 10px;border-bottom:1px solid #ddd;text-align:right}
th:first-child,td:first-child{text-align:left} thead th{background:#f3f3f3}
.charts{display:flex;flex-wrap:wrap;gap:18px} figure{margin:0}
figcaption{font-size:13px;color:#444;margin-bottom:4px}
svg text{font:11px system-ui,sans-serif;fill:#333} .legend span{margin-right:14px}
.sw{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
#js-errors{color:#b00020;white-space:pre-wrap}
"""

# Errors of the page's own script end up in the page, where a headless test can read them.
_JS = """
(function(){
  var box=document.getElementById('js-errors');
  function note(m){box.textContent+=m+'\\n';document.body.dataset.jsErrors='1';}
  window.addEventListener('error',function(e){note('error: '+e.message);});
  var orig=console.error;console.error=function(){note('console.error: '+
    Array.prototype.join.call(arguments,' '));orig.apply(console,arguments);};
  var rows=document.querySelectorAll('#compare tbody tr');
  for(var i=0;i<rows.length;i++){rows[i].addEventListener('mouseenter',function(){
    this.style.background='#fafae0';});rows[i].addEventListener('mouseleave',function(){
    this.style.background='';});}
  document.body.dataset.rendered=String(document.querySelectorAll('svg.chart').length);
})();
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 1:
        return f"{v:.1f}"
    return f"{v:.2g}"


class _Axes:
    """Maps data to the plot area; log or linear on each axis."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float, xlog: bool, ylog: bool) -> None:
        self.xlog, self.ylog = xlog, ylog
        self.x0, self.x1 = self._t(x0, xlog), self._t(x1, xlog)
        self.y0, self.y1 = self._t(y0, ylog), self._t(y1, ylog)
        if self.x1 <= self.x0:
            self.x1 = self.x0 + 1
        if self.y1 <= self.y0:
            self.y1 = self.y0 + 1

    @staticmethod
    def _t(v: float, log: bool) -> float:
        return math.log10(max(v, 1e-3)) if log else v

    def x(self, v: float) -> float:
        f = (self._t(v, self.xlog) - self.x0) / (self.x1 - self.x0)
        return _PAD_L + f * (_W - _PAD_L - _PAD_R)

    def y(self, v: float) -> float:
        f = (self._t(v, self.ylog) - self.y0) / (self.y1 - self.y0)
        return _H - _PAD_B - f * (_H - _PAD_T - _PAD_B)


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        a, b = math.floor(math.log10(max(lo, 1e-3))), math.ceil(math.log10(max(hi, 1e-3)))
        return [10.0**k for k in range(a, b + 1)]
    step = 10 ** math.floor(math.log10(max(hi - lo, 1e-9)))
    if (hi - lo) / step < 4:
        step /= 2
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _frame(ax: _Axes, xt: Sequence[float], yt: Sequence[float], xlabel: str, ylabel: str) -> str:
    out = [
        f'<rect x="{_PAD_L}" y="{_PAD_T}" width="{_W - _PAD_L - _PAD_R}" '
        f'height="{_H - _PAD_T - _PAD_B}" fill="#fff" stroke="#999"/>'
    ]
    for t in xt:
        x = ax.x(t)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_PAD_T}" y2="{_H - _PAD_B}" stroke="#eee"/>'
        )
        out.append(
            f'<text x="{x:.1f}" y="{_H - _PAD_B + 14}" text-anchor="middle">{_fmt(t)}</text>'
        )
    for t in yt:
        y = ax.y(t)
        out.append(
            f'<line x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
        )
        out.append(f'<text x="{_PAD_L - 5}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    out.append(
        f'<text x="{(_PAD_L + _W - _PAD_R) / 2}" y="{_H - 4}" '
        f'text-anchor="middle">{_e(xlabel)}</text>'
    )
    out.append(
        f'<text transform="translate(13,{(_H - _PAD_B + _PAD_T) / 2}) rotate(-90)" '
        f'text-anchor="middle">{_e(ylabel)}</text>'
    )
    return "".join(out)


def _svg(body: str, label: str) -> str:
    return (
        f'<svg class="chart" role="img" aria-label="{_e(label)}" width="{_W}" '
        f'height="{_H}" viewBox="0 0 {_W} {_H}" xmlns="http://www.w3.org/2000/svg">'
        f"{body}</svg>"
    )


def _path(points: Sequence[tuple[float, float]], color: str, title: str, dash: str = "") -> str:
    if not points:
        return ""
    d = "M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in points)
    dashed = f' stroke-dasharray="{dash}"' if dash else ""
    return (
        f'<path d="{d}" fill="none" stroke="{color}" stroke-width="1.8"{dashed}>'
        f"<title>{_e(title)}</title></path>"
    )


def latency_chart(targets: Sequence[dict[str, Any]]) -> str:
    """Distribution of turn-persistence latency: the share of turns at most x ms."""
    values = [v for t in targets for v in t["latency_quantiles_ms"] if v > 0]
    lo, hi = (min(values), max(values)) if values else (0.1, 10.0)
    ax = _Axes(lo, hi * 1.1, 0, 100, xlog=True, ylog=False)
    body = _frame(
        ax,
        _ticks(lo, hi, True),
        [0, 25, 50, 75, 90, 99],
        "turn latency (ms, log)",
        "% of turns at most",
    )
    for i, t in enumerate(targets):
        qs = t["latency_quantiles_ms"]
        pts = [(ax.x(max(v, lo)), ax.y((k + 1) / len(qs) * 100)) for k, v in enumerate(qs)]
        body += _path(
            pts, _COLORS[i % len(_COLORS)], f"{t['target']}: p99 {t['latency_ms']['p99']} ms"
        )
    return _svg(body, "turn latency distribution")


def lock_wait_chart(t: dict[str, Any], color: str, duration: float, top: float) -> str:
    """The longest single write of each quarter second, with the faults marked."""
    series = t["lock_wait_series"]
    end = max([duration, *(p[0] for p in series)]) + 0.25
    ax = _Axes(0, end, 0.01, max(top, 1.0), xlog=False, ylog=True)
    body = _frame(
        ax,
        _ticks(0, end, False),
        _ticks(0.01, top, True),
        "seconds into the run",
        "longest write (ms, log)",
    )
    for lock in t["external_locks"]:
        start = lock["locked_at"] if lock["locked_at"] is not None else lock["at"]
        stop = lock["released_at"] if lock["released_at"] is not None else start + lock["hold"]
        x0, x1 = ax.x(start), ax.x(min(stop, end))
        body += (
            f'<rect x="{x0:.1f}" y="{_PAD_T}" width="{max(x1 - x0, 1):.1f}" '
            f'height="{_H - _PAD_T - _PAD_B}" fill="#fbd5d5">'
            f"<title>outside lock {_e(lock['spec'])}</title></rect>"
        )
    for lock in t["external_locks"]:
        x = ax.x(lock["locked_at"] if lock["locked_at"] is not None else lock["at"])
        body += (
            f'<text x="{x + 3:.1f}" y="{_PAD_T + 12}" fill="#b00020">lock {_e(lock["spec"])}</text>'
        )
    for k in t["kills"]:
        x = ax.x(k["t"])
        body += (
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_PAD_T}" y2="{_PAD_T + 10}" '
            f'stroke="#000"><title>SIGKILL {_e(k["role"])} {k["index"]}</title></line>'
        )
    for m in t["maintenance"]:
        x0, x1 = ax.x(m["at"]), ax.x(min(m["ended"], end))
        body += (
            f'<rect x="{x0:.1f}" y="{_H - _PAD_B - 6}" width="{max(x1 - x0, 1):.1f}" '
            'height="6" fill="#7a7"><title>fleetstore maintain</title></rect>'
        )
    pts = [(ax.x(p[0]), ax.y(max(p[2], 0.01))) for p in series]
    body += _path(pts, color, f"{t['target']}: longest write per 0.25 s")
    return _svg(body, f"lock wait over time: {t['target']}")


def fairness_chart(t: dict[str, Any], color: str) -> str:
    """Acknowledged turns per agent process."""
    counts = [a["acknowledged"] for a in t["per_agent"]]
    top = max(counts, default=1) or 1
    n = max(len(counts), 1)
    ax = _Axes(0, n, 0, top * 1.1, xlog=False, ylog=False)
    body = _frame(ax, [], _ticks(0, top * 1.1, False), "agent process", "acknowledged turns")
    width = (_W - _PAD_L - _PAD_R) / n
    for i, c in enumerate(counts):
        y = ax.y(c)
        body += (
            f'<rect x="{_PAD_L + i * width + 1:.1f}" y="{y:.1f}" '
            f'width="{max(width - 2, 1):.1f}" height="{_H - _PAD_B - y:.1f}" '
            f'fill="{color}"><title>agent {i}: {c} turns</title></rect>'
        )
    return _svg(body, f"fairness: {t['target']}")


def effects_chart(t: dict[str, Any], color: str) -> str:
    """Effects over the run: waiting or running (enqueued, not settled) and stuck
    (running past their lease), from the outbox as the run left it."""
    series = t["outbox"]["series"]
    end = max([p[0] for p in series] or [1.0])
    open_ = [p[1] - p[2] for p in series]
    top = max([*open_, *(p[3] for p in series), 1])
    ax = _Axes(0, end, 0, top * 1.15, xlog=False, ylog=False)
    body = _frame(
        ax, _ticks(0, end, False), _ticks(0, top * 1.15, False), "seconds into the run", "effects"
    )
    body += _path(
        [(ax.x(p[0]), ax.y(o)) for p, o in zip(series, open_, strict=True)],
        color,
        f"{t['target']}: enqueued, not settled",
    )
    body += _path(
        [(ax.x(p[0]), ax.y(p[3])) for p in series],
        "#000",
        f"{t['target']}: stuck (running past the lease): {t['outbox']['stuck']}",
        dash="5,3",
    )
    return _svg(body, f"effects over time: {t['target']}")


def bytes_chart(targets: Sequence[dict[str, Any]], colors: dict[str, str]) -> str:
    """Bytes kept per acknowledged turn (after a checkpoint), per target; the dashed
    line is the turns' payload compressed."""
    kept = [t for t in targets if t.get("bytes", {}).get("per_turn")]
    kib = [t["bytes"]["per_turn"] / 1024 for t in kept]
    payload = [
        t["bytes"].get("payload_compressed", 0) / 1024 / (t["acknowledged"] or 1) for t in kept
    ]
    lo = max(min([*kib, *(p for p in payload if p > 0)] or [1.0]) / 2, 0.01)
    hi = max(kib or [1.0]) * 1.5
    n = max(len(kept), 1)
    ax = _Axes(0, n, lo, hi, xlog=False, ylog=True)
    body = _frame(ax, [], _ticks(lo, hi, True), "target", "KiB per turn (log)")
    width = (_W - _PAD_L - _PAD_R) / n
    for i, t in enumerate(kept):
        y = ax.y(kib[i])
        x = _PAD_L + i * width
        body += (
            f'<rect x="{x + 4:.1f}" y="{y:.1f}" width="{max(width - 8, 1):.1f}" '
            f'height="{_H - _PAD_B - y:.1f}" fill="{colors[t["target"]]}">'
            f"<title>{_e(t['target'])}: {t['bytes']['per_turn']:,} bytes per turn</title></rect>"
            f'<text x="{x + width / 2:.1f}" y="{_H - _PAD_B + 14}" '
            f'text-anchor="middle">{_e(t["target"])}</text>'
        )
        if payload[i] > 0:
            py = ax.y(payload[i])
            body += (
                f'<line x1="{x + 2:.1f}" x2="{x + width - 2:.1f}" y1="{py:.1f}" y2="{py:.1f}" '
                'stroke="#000" stroke-dasharray="4,3"><title>compressed payload per turn'
                "</title></line>"
            )
    return _svg(body, "bytes per turn")


_ROWS: tuple[tuple[str, str], ...] = (
    ("acknowledged turns", "acknowledged"),
    ("failed turns", "failed"),
    ("lost", "lost"),
    ("duplicated", "duplicated"),
    ("out of order", "out_of_order"),
    ("corrupt", "corrupt"),
    ("turns/s", "turns_per_s"),
)


def _table(targets: Sequence[dict[str, Any]]) -> str:
    head = "".join(f"<th>{_e(t['target'])}</th>" for t in targets)
    rows = []
    for label, key in _ROWS:
        cells = "".join(f"<td>{_e(format(t[key], ','))}</td>" for t in targets)
        rows.append(f"<tr><td>{_e(label)}</td>{cells}</tr>")
    for q in ("p50", "p99", "max"):
        cells = "".join(f"<td>{t['latency_ms'][q]:.1f} ms</td>" for t in targets)
        rows.append(f"<tr><td>turn latency {q}</td>{cells}</tr>")
    cells = "".join(
        f"<td>{t['fairness']['min']}/{t['fairness']['max']} ({t['fairness']['ratio']:.2f})</td>"
        for t in targets
    )
    rows.append(f"<tr><td>fairness min/max turns per agent</td>{cells}</tr>")
    cells = "".join(
        "<td>"
        + _e(", ".join(f"{k} {v}" for k, v in t["failures_by_type"].items()) or "-")
        + "</td>"
        for t in targets
    )
    rows.append(f"<tr><td>failures by type</td>{cells}</tr>")
    cells = "".join(f"<td>{_e(t['integrity'])}</td>" for t in targets)
    rows.append(f"<tr><td>integrity</td>{cells}</tr>")
    for label, key, unit in (
        ("effects enqueued", "enqueued", ""),
        ("effects settled", "settled", ""),
        ("effects stuck (running past the lease)", "stuck", ""),
        ("effects run more than once", "run_twice", ""),
        ("lanes blocked at the end", "lanes_blocked_at_end", ""),
        ("longest lane blocked", "lane_blocked_max_s", " s"),
        ("enqueue to settled p50", "settle_p50_ms", " ms"),
        ("enqueue to settled p99", "settle_p99_ms", " ms"),
    ):
        cells = "".join(
            f"<td>{_e(format(t['outbox'][key], ','))}{unit}</td>"
            if t.get("outbox")
            else "<td>-</td>"
            for t in targets
        )
        rows.append(f"<tr><td>{_e(label)}</td>{cells}</tr>")
    for label, when, key in (
        ("database bytes after the run", "after_run", "db"),
        ("blob bytes", "after_run", "blobs"),
        ("bytes kept after a checkpoint", "after_checkpoint", "total"),
    ):
        cells = "".join(
            f"<td>{t['bytes'][when][key]:,}</td>"
            if t.get("bytes", {}).get("files")
            else "<td>-</td>"
            for t in targets
        )
        rows.append(f"<tr><td>{_e(label)}</td>{cells}</tr>")
    cells = "".join(f"<td>{t.get('wal_peak', 0):,}</td>" for t in targets)
    rows.append(f"<tr><td>WAL bytes at most during the run</td>{cells}</tr>")
    cells = "".join(
        f"<td>{t['bytes']['per_turn']:,}</td>"
        if t.get("bytes", {}).get("per_turn")
        else "<td>-</td>"
        for t in targets
    )
    rows.append(f"<tr><td>bytes per acknowledged turn</td>{cells}</tr>")
    cells = "".join(f"<td>{_e(t.get('version', ''))}</td>" for t in targets)
    rows.append(f"<tr><td>version or modelled commit</td>{cells}</tr>")
    cells = "".join(f'<td class="{t["verdict"]}">{_e(t["verdict"].upper())}</td>' for t in targets)
    rows.append(f"<tr><td>verdict</td>{cells}</tr>")
    return (
        f'<table id="compare"><thead><tr><th></th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def render(report: dict[str, Any]) -> str:
    """The whole page for a ``fleetstore stress`` report."""
    r = report
    targets: list[dict[str, Any]] = r["targets"]
    colors = {t["target"]: _COLORS[i % len(_COLORS)] for i, t in enumerate(targets)}
    legend = "".join(
        f'<span><i class="sw" style="background:{colors[t["target"]]}"></i>{_e(t["note"])}</span>'
        for t in targets
    )
    top = max((p[2] for t in targets for p in t["lock_wait_series"]), default=1.0)
    waits = "".join(
        f"<figure><figcaption>{_e(t['target'])}</figcaption>"
        f"{lock_wait_chart(t, colors[t['target']], r['duration'], top * 1.5)}</figure>"
        for t in targets
    )
    fair = "".join(
        f"<figure><figcaption>{_e(t['target'])}</figcaption>"
        f"{fairness_chart(t, colors[t['target']])}</figure>"
        for t in targets
    )
    effects = "".join(
        f"<figure><figcaption>{_e(t['target'])}</figcaption>"
        f"{effects_chart(t, colors[t['target']])}</figure>"
        for t in targets
        if t.get("outbox")
    )
    sizes = (
        bytes_chart(targets, colors)
        if any(t.get("bytes", {}).get("per_turn") for t in targets)
        else ""
    )
    verdict_cls = "pass" if r["verdict"] == "pass" else "fail"
    verdict = (
        "PASS: fleetstore failed no turn; every acknowledged write is on disk exactly once, "
        "in order, intact"
        if r["verdict"] == "pass"
        else "FAIL: fleetstore: " + "; ".join(r["problems"])
    )
    faults = ", ".join(r["external_locks"]) or "none"
    skipped = "".join(
        f'<p class="fail">{_e(x["target"])} not run: {_e(x["reason"])}</p>'
        for x in r.get("not_run", ())
    )
    settings = (
        f"{r['agents']} agents x {r['duration']:g} s per target, think {r['think_ms']:g} ms, "
        f"tool outputs ~{size(r['output_bytes'])} ({r['large_rate']:.0%} up to "
        f"{size(r['large_bytes'])}), outside locks {faults}, kill rate "
        f"{r['kill_rate']:g}/s, maintenance {'on' if r['maintain'] else 'off'}, "
        f"{r['workers']} outbox workers, synchronous {r['synchronous']}, seed {r['seed']}"
    )
    data = json.dumps({k: v for k, v in r.items() if k != "targets"}).replace("</", "<\\/")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>fleetstore stress report</title><style>{_CSS}</style></head>
<body data-rendered="0">
<h1>fleetstore stress</h1>
<div class="meta">{_e(settings)}<br>fleetstore target: {_e(r["url"])}</div>
<div class="verdict {verdict_cls}" id="verdict">{_e(verdict)}</div>
<div id="js-errors"></div>
<h2>Comparison</h2>
{_table(targets)}
<p class="legend">{legend}</p>{skipped}
<h2>Turn-persistence latency</h2>
<p class="meta">Time spent in the target's calls during one turn (think and tool time
excluded), acknowledged turns only.</p>
<div class="charts"><figure>{latency_chart(targets)}</figure></div>
<h2>Lock wait over time</h2>
<p class="meta">The longest single write of every quarter second; red bands: outside
locks; ticks on top: SIGKILLs; green bar: maintenance.</p>
<div class="charts">{waits}</div>
<h2>Per-process fairness</h2>
<div class="charts">{fair}</div>
<h2>Effects over time</h2>
<p class="meta">Effects enqueued but not settled (waiting or running) and, dashed black,
stuck ones (running past their lease: their thread's lane is blocked), every half second.</p>
<div class="charts">{effects}</div>
<h2>Bytes per turn</h2>
<p class="meta">Database, WAL and blob bytes kept after a checkpoint, per acknowledged turn;
dashed: the turns' payload compressed (zstd).</p>
<div class="charts"><figure>{sizes}</figure></div>
<script type="application/json" id="run">{data}</script>
<script>{_JS}</script>
</body></html>
"""


def write(report: dict[str, Any], path: str) -> str:
    """Write the page to *path*; returns its absolute path."""
    target = Path(path).expanduser().resolve()
    target.write_text(render(report), encoding="utf-8")
    return str(target)


__all__ = ["render", "write"]
