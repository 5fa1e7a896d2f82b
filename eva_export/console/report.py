"""Per-dataset health report: one self-contained HTML file (inline SVG, no script, no network).

    eva-export report DIR [-o report.html]

DIR is a raw v2.1 dataset (the directory holding meta/). The same HTML is the console's
report page. Every string from the dataset (task names, notes, stream names, reason details)
is escaped: they are user input.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..dataset.meta import read_meta
from ..dataset.records import EpisodeRow, Quality

#: stream_stats keys shown as columns, in this order, when any episode has them.
STREAM_COLUMNS = ("rate_hz", "jitter_p50_ms", "jitter_p99_ms", "max_gap_ms", "max_gap_s", "received",
                  "dropped", "late", "max_latency_s")
VECTOR_FEATURES = ("observation.state", "action", "observation.ee_pose")

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
th{background:#eee}.red{color:#b00020;font-weight:600}.green{color:#17803d;font-weight:600}
.num{text-align:right;font-variant-numeric:tabular-nums}svg{background:#fff;border:1px solid #ddd}
.muted{color:#777}
"""


def esc(value: Any) -> str:
    """HTML-escape anything (quotes too: values also land in attributes)."""
    return html.escape(str(value), quote=True)


def _num(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return ""
    if isinstance(v, int):
        return str(v)
    return f"{v:.3f}" if math.isfinite(v) else str(v)


@dataclass(frozen=True)
class StreamSummary:
    name: str
    columns: dict[str, tuple[float, float, float]]  # key -> (min, mean, max) over episodes


def stream_summaries(rows: list[EpisodeRow]) -> tuple[list[str], list[StreamSummary]]:
    """Per stream and known stream_stats key: min, mean, max over the episodes that have it."""
    values: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        stats = row.fields_dict().get("stream_stats")
        if not isinstance(stats, dict):
            continue
        for stream, st in stats.items():
            if not isinstance(st, dict):
                continue
            per = values.setdefault(str(stream), {})
            for key in STREAM_COLUMNS:
                v = st.get(key)
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    per.setdefault(key, []).append(float(v))
    present = [k for k in STREAM_COLUMNS if any(k in per for per in values.values())]
    out = []
    for name, per in values.items():
        out.append(StreamSummary(name, {k: (min(v), sum(v) / len(v), max(v)) for k, v in per.items()}))
    return present, out


def _bars_svg(values: list[float], colours: list[str], labels: list[str], title: str,
              width: int = 720, height: int = 120) -> str:
    """A bar chart with one bar per episode; <title> children give the hover text."""
    if not values:
        return '<p class="muted">no episodes</p>'
    top = max(max(values), 1e-9)
    n = len(values)
    bw = width / n
    parts = [f'<svg width="{width}" height="{height + 20}" role="img" aria-label="{esc(title)}">']
    for i, (v, c, lab) in enumerate(zip(values, colours, labels, strict=True)):
        h = 0 if v <= 0 else max(1.0, v / top * height)
        parts.append(f'<rect x="{i * bw:.2f}" y="{height - h:.2f}" width="{max(bw - 1, 1):.2f}" '
                     f'height="{h:.2f}" fill="{c}"><title>{esc(lab)}</title></rect>')
    parts.append(f'<text x="2" y="{height + 15}" font-size="11">{esc(title)} (max {_num(top)})</text></svg>')
    return "".join(parts)


def _issue_codes(row: EpisodeRow) -> list[str]:
    return [i.code for i in row.quality_issues if i.severity == "error"]


def build_report(root: Path, title: str | None = None) -> str:
    """The report of the raw dataset at ``root`` as one HTML string."""
    meta = read_meta(root)
    rows = meta.episodes
    name = title or root.parent.name if root.name == "raw" else (title or root.name)
    red = [r for r in rows if r.quality == Quality.RED]
    codes = Counter(c for r in rows for c in _issue_codes(r))
    verdicts = Counter(r.qc_verdict or "unreviewed" for r in rows)
    out: list[str] = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>Health report: {esc(name)}</title><style>{CSS}</style></head><body>",
        f"<h1>Health report: {esc(name)}</h1>",
        f'<p>{len(rows)} episodes, {sum(r.length for r in rows)} frames at {meta.info.fps} fps; '
        f'<span class="red">{len(red)} red</span>, '
        f'<span class="green">{len(rows) - len(red)} green</span>; verdicts: '
        + ", ".join(f"{esc(k)} {v}" for k, v in sorted(verdicts.items())) + "</p>",
        f'<p class="muted">{esc(root)}</p>',
    ]
    # per-episode lengths coloured by quality
    out.append("<h2>Episodes</h2>")
    out.append(_bars_svg([float(r.length) for r in rows],
                         ["#b00020" if r.quality == Quality.RED else "#17803d" for r in rows],
                         [f"episode {r.episode_index}: {r.length} frames, {r.quality}" for r in rows],
                         "frames per episode (red = red quality)"))
    # drop and late timelines over the episodes, per stream
    out.append("<h2>Drops and late frames per episode</h2>")
    any_stream = False
    stream_stats = [r.fields_dict().get("stream_stats") for r in rows]
    stream_names = sorted({str(s) for st in stream_stats if isinstance(st, dict) for s in st})
    for stream in stream_names:
        for key, colour in (("dropped", "#b00020"), ("late", "#d08000")):
            vals = []
            for r_stats in stream_stats:
                st = (r_stats or {}).get(stream)
                v = st.get(key) if isinstance(st, dict) else None
                vals.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else -1.0)
            if all(v < 0 for v in vals):
                continue
            any_stream = True
            out.append(_bars_svg([max(v, 0.0) for v in vals], [colour] * len(vals),
                                 [f"episode {r.episode_index}: {stream} {key} "
                                  f"{'n/a' if v < 0 else int(v)}" for r, v in zip(rows, vals, strict=True)],
                                 f"{stream}: {key} per episode", height=60))
    if not any_stream:
        out.append('<p class="muted">the episode rows carry no stream_stats</p>')
    # per-stream rate and jitter
    cols, summaries = stream_summaries(rows)
    out.append("<h2>Streams (min / mean / max over episodes)</h2>")
    if summaries:
        out.append("<table><tr><th>stream</th>" + "".join(f"<th>{esc(c)}</th>" for c in cols) + "</tr>")
        for s in summaries:
            cells = []
            for c in cols:
                v = s.columns.get(c)
                cells.append(f'<td class="num">{" / ".join(_num(x) for x in v) if v else ""}</td>')
            out.append(f"<tr><td>{esc(s.name)}</td>{''.join(cells)}</tr>")
        out.append("</table>")
    else:
        out.append('<p class="muted">no stream statistics</p>')
    # state / action ranges from episodes_stats
    out.append("<h2>State and action ranges</h2>")
    out.append(_ranges_table(meta))
    # red reasons by code
    out.append("<h2>Red reasons by code</h2>")
    if codes:
        out.append("<table><tr><th>code</th><th>episodes</th></tr>" + "".join(
            f'<tr><td>{esc(c)}</td><td class="num">{n}</td></tr>' for c, n in codes.most_common()) + "</table>")
    else:
        out.append('<p class="muted">no red reasons</p>')
    # per-episode table
    out.append("<h2>Per episode</h2><table><tr><th>#</th><th>frames</th><th>task</th><th>quality</th>"
               "<th>reasons</th><th>verdict</th><th>note</th></tr>")
    for r in rows:
        reasons = "<br>".join(f"{esc(i.code)}: {esc(i.detail)}" for i in r.quality_issues)
        out.append(f'<tr><td class="num">{r.episode_index}</td><td class="num">{r.length}</td>'
                   f"<td>{esc(r.tasks[0] if r.tasks else '')}</td>"
                   f'<td class="{esc(r.quality)}">{esc(r.quality or "unrated")}</td><td>{reasons}</td>'
                   f"<td>{esc(r.qc_verdict)}</td><td>{esc(r.note)}</td></tr>")
    out.append("</table></body></html>")
    return "\n".join(out)


def _ranges_table(meta: Any) -> str:
    feats = [k for k in VECTOR_FEATURES if k in meta.info.features]
    if not feats or not meta.episodes_stats:
        return '<p class="muted">no per-episode statistics (meta/episodes_stats.jsonl)</p>'
    out = ["<table><tr><th>feature</th><th>element</th><th>min</th><th>max</th></tr>"]
    for key in feats:
        lo: list[float] | None = None
        hi: list[float] | None = None
        for st in meta.episodes_stats.values():
            s = st.stats.get(key)
            if not isinstance(s, dict):
                continue
            try:
                mn = [float(x) for x in _flat(s.get("min"))]
                mx = [float(x) for x in _flat(s.get("max"))]
            except (TypeError, ValueError):
                continue
            lo = mn if lo is None else [min(a, b) for a, b in zip(lo, mn, strict=False)]
            hi = mx if hi is None else [max(a, b) for a, b in zip(hi, mx, strict=False)]
        if lo is None or hi is None:
            continue
        names = meta.info.features[key].names
        if not isinstance(names, list) or len(names) != len(lo):
            names = [str(j) for j in range(len(lo))]
        for j, (a, b) in enumerate(zip(lo, hi, strict=False)):
            out.append(f"<tr><td>{esc(key)}</td><td>{esc(names[j])}</td>"
                       f'<td class="num">{_num(a)}</td><td class="num">{_num(b)}</td></tr>')
    out.append("</table>")
    return "".join(out)


def _flat(v: Any) -> list[Any]:
    if isinstance(v, list):
        return [x for item in v for x in _flat(item)]
    return [v]


def write_report(root: Path, output: Path) -> Path:
    from ..fsutil import atomic_write_text

    atomic_write_text(output, build_report(root))
    return output
