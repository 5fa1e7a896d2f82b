"""Server-rendered pages of the console. Every dataset string goes through ``esc``.

Pages carry no inline script (the CSP forbids it): behaviour lives in /static/console.js,
which reads what it needs from ``data-*`` attributes and the ``csrf-token`` meta tag, and
writes dataset strings with ``textContent`` only.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from typing import Any

from .data import DatasetSummary
from .report_svg import esc


def _head(title: str, csrf: str = "") -> str:
    meta = f'<meta name="csrf-token" content="{esc(csrf)}">' if csrf else ""
    return ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            f'<meta name="viewport" content="width=device-width">{meta}'
            f"<title>{esc(title)} - eva console</title>"
            '<link rel="stylesheet" href="/static/console.css">'
            '<script src="/static/console.js" defer></script></head>')


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def datasets_page(datasets: Sequence[DatasetSummary]) -> str:
    rows = []
    for d in datasets:
        if d.error:
            rows.append(f"<tr><td>{esc(d.name)}</td><td colspan=5 class=red>{esc(d.error)}</td></tr>")
            continue
        rows.append(f'<tr><td><a href="/d/{_q(d.name)}">{esc(d.name)}</a></td>'
                    f'<td class=num>{d.episodes}</td><td class=num>{d.frames}</td><td class=num>{d.fps}</td>'
                    f'<td class=num>{d.red}</td><td class=num>{d.unreviewed}</td>'
                    f'<td><a href="/d/{_q(d.name)}/report">health report</a></td></tr>')
    body = ("<table id=datasets><tr><th>dataset</th><th>episodes</th><th>frames</th><th>fps</th>"
            "<th>red</th><th>unreviewed</th><th></th></tr>" + "".join(rows) + "</table>"
            if rows else "<p class=muted>No datasets under log_dir yet.</p>")
    return (_head("datasets") + '<body data-page="datasets"><header><h1>Datasets</h1>'
            '<span id=status class=muted></span></header>' + body + "</body></html>")


def episodes_page(name: str, ok: bool, message: str, rows: Sequence[dict[str, Any]],
                  shown: Sequence[dict[str, Any]], red_only: bool, unreviewed_only: bool,
                  csrf: str, formats: Sequence[str], upload_configured: bool = False) -> str:
    q = _q(name)
    filt = []
    for key, on, label in (("red", red_only, "red only"), ("unreviewed", unreviewed_only, "unreviewed only")):
        params = {"red": "1" if red_only else "", "unreviewed": "1" if unreviewed_only else ""}
        params[key] = "" if on else "1"
        qs = urllib.parse.urlencode({k: v for k, v in params.items() if v})
        filt.append(f'<a class="filter{" on" if on else ""}" id="filter-{key}" href="/d/{q}{"?" + qs if qs else ""}">'
                    f'{"&#9745;" if on else "&#9744;"} {label}</a>')
    trs = []
    for r in shown:
        codes = ", ".join(esc(c) for c in r["quality_codes"])
        trs.append(
            f'<tr data-episode="{int(r["episode_index"])}"><td class=num>'
            f'<a href="/d/{q}/e/{int(r["episode_index"])}">{int(r["episode_index"])}</a></td>'
            f'<td class=num>{int(r["length"])}</td><td class=task>{esc(r["task"])}</td>'
            f'<td class="{esc(r["quality"])}">{esc(r["quality"] or "unrated")}</td><td>{codes}</td>'
            f'<td class="verdict {esc(r["qc_verdict"])}">{esc(r["qc_verdict"] or "-")}</td>'
            f'<td class=note>{esc(r["note"])}</td></tr>')
    table = ("<table id=episodes><tr><th>#</th><th>frames</th><th>task</th><th>quality</th><th>reasons</th>"
             "<th>verdict</th><th>note</th></tr>" + "".join(trs) + "</table>")
    if not ok:
        table = f"<p class=red>list_episodes refused: {esc(message)}</p>"
    opts = "".join(f'<option value="{esc(f)}">{esc(f)}</option>' for f in formats)
    # Upload only when a backend is configured: a button that can only be refused is noise
    upload = (' <button id=upload-btn>Upload</button>' if upload_configured
              else ' <span id=upload-off class=muted>upload: no backend configured (collection.storage)</span>')
    jobs = (f'<section id=jobs><select id=format aria-label=format>{opts}</select> '
            '<button id=export-btn>Export</button>' + upload +
            '<div id=job-status class=jobline></div><div id=job-error class=red></div></section>')
    return (_head(name, csrf) + f'<body data-page="episodes" data-dataset="{esc(name)}" '
            f'data-episodes="{len(rows)}">'
            f'<header><a href="/">datasets</a> / <h1>{esc(name)}</h1> '
            f'<a href="/d/{q}/report">health report</a><span id=status class=muted></span></header>'
            f'<p>{len(shown)} of {len(rows)} episodes shown. {" ".join(filt)}</p>'
            + jobs + table + "</body></html>")


def missing_dataset_page(name: str) -> str:
    """A dataset name with no dataset behind it: say so, offer nothing to act on."""
    return (_head(f"{name} (missing)") + '<body data-page="missing"><header><a href="/">datasets</a> / '
            f'<h1>{esc(name)}</h1></header><p id=missing class=red>There is no dataset named '
            f'&ldquo;{esc(name)}&rdquo; under log_dir (no {esc(name)}/raw/meta/info.json).</p>'
            '<p><a href="/">Back to the list of datasets</a></p></body></html>')


def episode_page(name: str, index: int, csrf: str) -> str:
    q = _q(name)
    return (_head(f"{name} episode {index}", csrf)
            + f'<body data-page="episode" data-dataset="{esc(name)}" data-episode="{int(index)}">'
            f'<header><a href="/">datasets</a> / <a href="/d/{q}">{esc(name)}</a> / '
            f'<h1>episode {int(index)}</h1> <a id=prev href="#">&larr; prev (k)</a> '
            '<a id=next href="#">next (j) &rarr;</a><span id=status class=muted></span></header>'
            '<div id=info><span id=task></span> <span id=quality></span> <span id=verdict></span>'
            '<ul id=issues></ul></div>'
            '<main id=main><div id=videos></div>'
            '<div id=plotbox><div id=plot-controls><label>show <select id=dims aria-label="dimensions">'
            '</select></label> <span id=legend></span></div>'
            '<canvas id=plot width=960 height=300></canvas><div id=cursor-readout class=muted></div>'
            '<div id=timeline-legend class=muted></div></div></main>'
            # the review bar stays at the bottom of the window whatever the number of cameras
            '<section id=review><div id=transport><button id=play>play (space)</button> '
            '<input id=scrub type=range min=0 value=0 step=1 aria-label=frame> '
            '<span id=frame-readout>frame 0</span></div>'
            '<input id=note placeholder="note (n to focus, Enter saves)" size=50> '
            '<span id=note-state class=muted></span> '
            '<button id=pass-btn>PASS (p)</button> <button id=fail-btn>FAIL (f)</button> '
            '<button id=clear-btn>CLEAR (c)</button> <span id=review-result></span>'
            '<div class=muted>Keys: space play/pause, p pass, f fail, c clear, n note (Enter saves, Esc leaves), '
            'j/k next/previous, &larr;/&rarr; one frame.</div></section></body></html>')
