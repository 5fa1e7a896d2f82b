"""The health report's plots: standalone SVG documents, embedded as ``<img>`` data URIs.

Why images and not inline SVG: an ``<img>`` is what a browser copies with "Copy image" and what
a chat or a ticket accepts when pasted; the SVG text carries its own xmlns and no script, so the
same bytes open on their own too. Hover text is lost in an image, so every plot is followed by
its numbers in a table or a list.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from typing import TypedDict

#: One timeline mark: frames ``from``..``to`` of an episode, with the reason's code and detail.
Marker = TypedDict("Marker", {"code": str, "from": int, "to": int, "detail": str})

SVG_NS = "http://www.w3.org/2000/svg"
ISSUE_COLOUR = "#b00020"
NONFINITE_COLOUR = "#6a1b9a"


def esc(value: object) -> str:
    """HTML-escape anything (quotes too: values also land in attributes)."""
    return html.escape(str(value), quote=True)


def fmt_num(v: object) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return ""
    if isinstance(v, int):
        return str(v)
    return f"{v:.3f}" if math.isfinite(v) else str(v)


def as_img(svg: str, alt: str, cls: str = "plot") -> str:
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return f'<img class="{esc(cls)}" alt="{esc(alt)}" src="data:image/svg+xml;base64,{data}">'


def _doc(width: float, height: float, body: Sequence[str]) -> str:
    return (f'<svg xmlns="{SVG_NS}" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif">'
            f'<rect width="100%" height="100%" fill="#fff"/>{"".join(body)}</svg>')


def bars_img(values: list[float], colours: list[str], title: str, width: int = 720, height: int = 120) -> str:
    """One bar per episode, as an image."""
    if not values:
        return '<p class="muted">no episodes</p>'
    top = max(max(values), 1e-9)
    bw = width / len(values)
    parts = []
    for i, (v, c) in enumerate(zip(values, colours, strict=True)):
        h = 0 if v <= 0 else max(1.0, v / top * height)
        parts.append(f'<rect x="{i * bw:.2f}" y="{height - h:.2f}" width="{max(bw - 1, 1):.2f}" '
                     f'height="{h:.2f}" fill="{esc(c)}"/>')
    parts.append(f'<text x="2" y="{height + 15}" font-size="11">{esc(title)} (max {fmt_num(top)})</text>')
    return as_img(_doc(width, height + 20, parts), title)


def timeline_img(episodes: Sequence[tuple[int, int, list[Marker]]], width: int = 720) -> str:
    """One row per episode (index, length, marks): a grey bar as long as the episode, the marked
    frames on it (red: reasons, purple: NaN/inf), on one shared frame axis."""
    left, row_h = 60, 16
    longest = max((n for _i, n, _m in episodes), default=1) or 1
    span = width - left - 10
    parts = []
    for r, (index, length, marks) in enumerate(episodes):
        y = 6 + r * row_h
        parts.append(f'<text x="4" y="{y + 10}" font-size="11">ep {index}</text>')
        parts.append(f'<rect x="{left}" y="{y + 3}" width="{span * length / longest:.2f}" height="6" fill="#ddd"/>')
        for m in marks:
            x0 = left + span * m["from"] / longest
            w = max(2.0, span * (m["to"] - m["from"] + 1) / longest)
            colour = NONFINITE_COLOUR if m["code"] == "non_finite" else ISSUE_COLOUR
            parts.append(f'<rect x="{x0:.2f}" y="{y}" width="{w:.2f}" height="12" fill="{colour}" '
                         'fill-opacity="0.85"/>')
    height = 6 + len(episodes) * row_h + 18
    parts.append(f'<text x="{left}" y="{height - 4}" font-size="11">frame 0 .. {longest - 1} '
                 "(red: reasons with frames, purple: NaN/inf)</text>")
    return as_img(_doc(width, height, parts), "timeline of issues per episode", cls="plot timeline")
