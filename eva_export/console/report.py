"""Per-dataset health report: one self-contained HTML file (SVG images, no script, no network).

    eva-export report DIR [-o report.html]

DIR is a raw dataset (the directory holding meta/): LeRobot v2.1, v3.0 or v2.0, read through
the source seam (report_source.py; a foreign source's quality from its sidecar). The same HTML
is the console's report page. Every string from the dataset (task names, notes, stream names, reason details)
is escaped: they are user input.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DatasetError
from ..formats.common.records import EpisodeRow, Quality
from . import data
from .report_source import ReportSource, episode_arrays, read_report_source
from .report_svg import bars_img, esc, fmt_num, timeline_img

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
.muted{color:#777}.unrated{color:#666;font-style:italic}img.plot{display:block;margin:.3em 0}
"""


_num = fmt_num
QUALITY_COLOUR: dict[str, str] = {Quality.RED: "#b00020", Quality.GREEN: "#17803d"}
UNRATED_COLOUR = "#9e9e9e"


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


def _issue_codes(row: EpisodeRow) -> list[str]:
    return [i.code for i in row.quality_issues if i.severity == "error"]


@dataclass
class Values:
    """What the data itself says (not episodes_stats): finite ranges and non-finite counts."""

    lo: dict[str, list[float]] = field(default_factory=dict)
    hi: dict[str, list[float]] = field(default_factory=dict)
    bad: dict[str, list[int]] = field(default_factory=dict)  # per element: NaN/inf values
    bad_episodes: dict[int, int] = field(default_factory=dict)  # episode -> NaN/inf values
    nonfinite_frames: dict[int, dict[str, list[int]]] = field(default_factory=dict)
    unreadable: dict[int, str] = field(default_factory=dict)
    names: dict[str, list[str]] = field(default_factory=dict)


def scan_values(meta: ReportSource) -> Values:
    """Read every episode's vector columns once: ranges over the finite values, NaN/inf counted."""
    import numpy as np

    out = Values()
    for ep in meta.located:
        row = ep.row
        try:
            arrays = episode_arrays(meta, ep)
        except DatasetError as exc:
            out.unreadable[row.episode_index] = str(exc)
            continue
        for key, arr in arrays.items():
            finite = np.isfinite(arr)
            width = arr.shape[1]
            out.names.setdefault(key, data.element_names(meta.info, key, width))
            # non-finite values are left out of the ranges here and counted in ``bad`` instead
            lo = [float(x) for x in np.where(finite, arr, np.inf).min(axis=0, initial=np.inf)]
            hi = [float(x) for x in np.where(finite, arr, -np.inf).max(axis=0, initial=-np.inf)]
            bad = [int(x) for x in (~finite).sum(axis=0)]
            out.lo[key] = [min(a, b) for a, b in zip(out.lo.get(key, lo), lo, strict=False)]
            out.hi[key] = [max(a, b) for a, b in zip(out.hi.get(key, hi), hi, strict=False)]
            out.bad[key] = [a + b for a, b in zip(out.bad.get(key, [0] * width), bad, strict=False)]
            if sum(bad):
                out.bad_episodes[row.episode_index] = out.bad_episodes.get(row.episode_index, 0) + sum(bad)
                frames = [int(i) for i in np.nonzero((~finite).any(axis=1))[0]]
                out.nonfinite_frames.setdefault(row.episode_index, {})[key] = frames
    return out


def _quality_counts(rows: list[EpisodeRow]) -> tuple[int, int, int]:
    red = sum(1 for r in rows if r.quality == Quality.RED)
    green = sum(1 for r in rows if r.quality == Quality.GREEN)
    return red, green, len(rows) - red - green


def _summary(name: str, root: Path, meta: ReportSource, values: Values) -> list[str]:
    rows = meta.episodes
    red, green, unrated = _quality_counts(rows)
    verdicts = Counter(r.qc_verdict or "unreviewed" for r in rows)
    bad_total = sum(values.bad_episodes.values())
    nonfinite = (f'<span id="count-nonfinite" class="red">{bad_total} NaN/inf values in '
                 f"{len(values.bad_episodes)} episodes</span>" if bad_total
                 else '<span id="count-nonfinite">no NaN/inf values</span>')
    return [
        f"<h1>Health report: {esc(name)}</h1>",
        f"<p>{len(rows)} episodes, {sum(r.length for r in rows)} frames at {meta.info.fps} fps "
        f'(<span id="source-kind">{esc(meta.kind)}</span>'
        + ("" if meta.kind == "lerobot_v21" else ", quality from meta/eva_quality.jsonl") + ").</p>",
        f'<p id="quality-counts">quality: <span id="count-red" class="red">{red} red</span>, '
        f'<span id="count-green" class="green">{green} green</span>, '
        f'<span id="count-unrated" class="unrated">{unrated} unrated</span> (no quality field: '
        "nobody rated them, live or offline); "
        f'<span id="verdict-counts">verdicts: '
        + ", ".join(f"{esc(k)} {v}" for k, v in sorted(verdicts.items())) + "</span>; " + nonfinite + "</p>",
        f'<p class="muted">{esc(root)}</p>',
    ]


def _timeline(meta: ReportSource, values: Values) -> list[str]:
    """Where in each episode things went wrong: reasons with frames, and NaN/inf frames."""
    rows = meta.episodes
    per = [(r.episode_index, r.length, data.episode_markers(r, values.nonfinite_frames.get(r.episode_index, {})))
           for r in rows]
    out = ["<h2>Timeline of issues</h2>", timeline_img(per)]
    items = [f"<li>episode {i}: {esc(m['code'])} frames {m['from']}..{m['to']}: {esc(m['detail'])}</li>"
             for i, _n, marks in per for m in marks]
    unlocated = [f"<li>episode {r.episode_index}: {esc(i.code)}: {esc(i.detail)}</li>"
                 for r, (_i, _n, marks) in zip(rows, per, strict=True)
                 for i in r.quality_issues if i.code not in {m["code"] for m in marks}]
    out.append('<ul id="timeline-marks">' + "".join(items) + "</ul>" if items
               else '<p class="muted" id="timeline-marks">no issue in this dataset says which frames</p>')
    if unlocated:
        out.append("<p>Reasons that do not say which frames:</p><ul>" + "".join(unlocated) + "</ul>")
    return out


def _streams(rows: list[EpisodeRow]) -> list[str]:
    out = ["<h2>Drops and late frames per episode</h2>"]
    stream_stats = [r.fields_dict().get("stream_stats") for r in rows]
    names = sorted({str(s) for st in stream_stats if isinstance(st, dict) for s in st})
    shown = False
    for stream in names:
        for key, colour in (("dropped", "#b00020"), ("late", "#d08000")):
            vals = []
            for r_stats in stream_stats:
                st = (r_stats or {}).get(stream)
                v = st.get(key) if isinstance(st, dict) else None
                vals.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else -1.0)
            if all(v < 0 for v in vals):
                continue
            shown = True
            out.append(bars_img([max(v, 0.0) for v in vals], [colour] * len(vals), f"{stream}: {key} per episode",
                                height=60))
    if not shown:
        out.append('<p class="muted">the episode rows carry no stream_stats</p>')
    cols, summaries = stream_summaries(rows)
    out.append("<h2>Streams (min / mean / max over episodes)</h2>")
    if not summaries:
        return [*out, '<p class="muted">no stream statistics</p>']
    out.append("<table><tr><th>stream</th>" + "".join(f"<th>{esc(c)}</th>" for c in cols) + "</tr>")
    for s in summaries:
        cells = []
        for c in cols:
            v = s.columns.get(c)
            cells.append(f'<td class="num">{" / ".join(_num(x) for x in v) if v else ""}</td>')
        out.append(f"<tr><td>{esc(s.name)}</td>{''.join(cells)}</tr>")
    out.append("</table>")
    return out


def build_report(root: Path, title: str | None = None) -> str:
    """The report of the raw dataset at ``root`` as one HTML string."""
    meta = read_report_source(root)
    rows = meta.episodes
    name = title or root.parent.name if root.name == "raw" else (title or root.name)
    values = scan_values(meta)
    codes = Counter(c for r in rows for c in _issue_codes(r))
    out: list[str] = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>Health report: {esc(name)}</title><style>{CSS}</style></head><body>",
        *_summary(name, root, meta, values),
        "<h2>Episodes</h2>",
        bars_img([float(r.length) for r in rows], [QUALITY_COLOUR.get(r.quality, UNRATED_COLOUR) for r in rows],
                 "frames per episode (red, green; grey = unrated)"),
        *_timeline(meta, values),
        *_streams(rows),
        "<h2>State and action ranges (finite values; NaN/inf counted)</h2>", _ranges_table(values),
        "<h2>Red reasons by code</h2>",
    ]
    if codes:
        out.append("<table><tr><th>code</th><th>episodes</th></tr>" + "".join(
            f'<tr><td>{esc(c)}</td><td class="num">{n}</td></tr>' for c, n in codes.most_common()) + "</table>")
    else:
        out.append('<p class="muted">no red reasons</p>')
    out += _episode_table(rows, values)
    return "\n".join(out)


def _episode_table(rows: list[EpisodeRow], values: Values) -> list[str]:
    out = ["<h2>Per episode</h2><table id=\"per-episode\"><tr><th>#</th><th>frames</th><th>task</th>"
           "<th>quality</th><th>reasons</th><th>NaN/inf</th><th>verdict</th><th>note</th></tr>"]
    for r in rows:
        reasons = "<br>".join(f"{esc(i.code)}: {esc(i.detail)}" for i in r.quality_issues)
        if r.episode_index in values.unreadable:
            reasons += f'<br><span class="red">{esc(values.unreadable[r.episode_index])}</span>'
        bad = values.bad_episodes.get(r.episode_index, 0)
        out.append(f'<tr><td class="num">{r.episode_index}</td><td class="num">{r.length}</td>'
                   f"<td>{esc(r.tasks[0] if r.tasks else '')}</td>"
                   f'<td class="{esc(r.quality or "unrated")}">{esc(r.quality or "unrated")}</td><td>{reasons}</td>'
                   f'<td class="num{" red" if bad else ""}">{bad}</td>'
                   f"<td>{esc(r.qc_verdict)}</td><td>{esc(r.note)}</td></tr>")
    out.append("</table></body></html>")
    return out


def _ranges_table(values: Values) -> str:
    if not values.lo:
        return '<p class="muted">no state or action values could be read</p>'
    out = ['<table id="ranges"><tr><th>feature</th><th>element</th><th>min</th><th>max</th>'
           "<th>NaN/inf values</th></tr>"]
    for key in VECTOR_FEATURES:
        if key not in values.lo:
            continue
        for j, (a, b) in enumerate(zip(values.lo[key], values.hi[key], strict=True)):
            bad = values.bad[key][j]
            lo, hi = (_num(a), _num(b)) if math.isfinite(a) else ("no finite value", "")
            out.append(f"<tr><td>{esc(key)}</td><td>{esc(values.names[key][j])}</td>"
                       f'<td class="num">{lo}</td><td class="num">{hi}</td>'
                       f'<td class="num{" red" if bad else ""}">{bad}</td></tr>')
    out.append("</table>")
    return "".join(out)


def write_report(root: Path, output: Path) -> Path:
    from ..fsutil import atomic_write_text

    atomic_write_text(output, build_report(root))
    return output
