"""The review console end to end: real nodes, a real dataset, Debian's chromium driven by Playwright.

One stack per module (capture, export, upload and console nodes as processes; one headless
browser), then one test per thing an operator or an attacker does. Needs /usr/bin/chromium
(tools/setup.sh installs it) and the playwright package; no browser download.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import rosharness
from dsfactory import Ep, make_dataset
from eva_export_interfaces.srv import GetJob, ListEpisodes, StartUpload

from eva_export.export.records import QualitySplit
from eva_export.formats.common.meta import read_meta
from eva_export.formats.common.video import VideoSettings

pytestmark = pytest.mark.timeout(300)

HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
TAKE0 = "20261205T080000-0a1b2c3d"  # episode 0's take id (as STOP returned it)
WAIT_MS = 60_000  # generous: the machine may be busy; nothing here is a speed assertion
SCREENSHOT_ENV = "EVA_CONSOLE_SCREENSHOT"  # also copy the screenshot there (docs/console.png)


class Stack:
    def __init__(self, root: Path, url: str, log_dir: Path, procs: dict[str, rosharness.NodeProcess]) -> None:
        self.root, self.url, self.log_dir, self.procs = root, url, log_dir, procs
        self.dataset = log_dir / "demo" / "raw"

    def row(self, index: int) -> Any:
        return next(r for r in read_meta(self.dataset).episodes if r.episode_index == index)


def _wait_url(proc: rosharness.NodeProcess, timeout: float = 60.0) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        m = re.search(r"console at (http://\S+/)", proc.log_text())
        if m:
            return m.group(1)
        assert proc.alive(), proc.log_tail()
        time.sleep(0.2)
    raise TimeoutError(f"console did not log its URL:\n{proc.log_tail()}")


def _wait_log(proc: rosharness.NodeProcess, text: str, timeout: float = 90.0) -> None:
    """The console node logs this once its own clients see the peers (discovery is per node)."""
    end = time.monotonic() + timeout
    while text not in proc.log_text():
        assert proc.alive() and time.monotonic() < end, proc.log_tail()
        time.sleep(0.2)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, rclpy_context: None) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("console")
    log_dir = root / "datasets"
    make_dataset(log_dir / "demo" / "raw", [
        Ep(frames=30, quality="green", extra={"take_id": TAKE0}),
        Ep(frames=40, quality="red", task=HOSTILE,
           issues=[{"code": "dropped_frames", "severity": "error", "detail": "cam0: 3/40",
                    "frames": [10, 11, 12]}],
           extra={"stream_stats": {"cam0": {"received": 37, "rate_hz": 29.1, "dropped": 3, "late": 1,
                                            "jitter_p50_ms": 1.5, "jitter_p99_ms": 9.0}}}),
        Ep(frames=20, quality="green", verdict="pass", note="fine </td><b>bold</b>"),
    ], cameras=2, width=64, height=48)
    # a camera in a codec this browser cannot play (HEVC), encoded for real
    hevc = make_dataset(log_dir / "hevc_cam" / "raw", [Ep(frames=12)], cameras=1, width=64, height=48,
                        settings=VideoSettings(codec="libx265", crf=28))
    info = json.loads((hevc / "meta/info.json").read_text())
    info["features"]["observation.images.cam0"]["info"]["video.codec"] = "hevc"
    (hevc / "meta/info.json").write_text(json.dumps(info, indent=4))
    config = root / "config.yaml"
    config.write_text(
        f'collection:\n  log_dir: "{log_dir}"\n  fps: 30\n'
        "  tasks:\n    - {dataset_name: demo, task: pick the cube}\n"
        "  streams:\n    state: {topic: /console_test/joint_states, names: [a, b]}\n"
        "console:\n  enabled: true\n  port: 0\n")
    ns = rosharness.unique_namespace("console")
    procs = {}
    for exe in ("capture_node", "export_node", "upload_node", "console_node"):
        procs[exe] = rosharness.NodeProcess(exe, root / "logs", namespace=ns,
                                            params={"config_file": str(config)}).start()
    client = rosharness.RosClient()
    try:
        client.wait_for_services([procs["capture_node"].service("list_episodes"),
                                  procs["export_node"].service("get_job"),
                                  procs["upload_node"].service("get_job")], timeout=120,
                                 procs=list(procs.values()))
        url = _wait_url(procs["console_node"])
        _wait_log(procs["console_node"], "console peers ready")
        yield Stack(root, url, log_dir, procs)
    finally:
        client.close()
        codes = {exe: p.stop() for exe, p in procs.items()}
        assert codes["console_node"] == 0, procs["console_node"].log_tail()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 1000})
    pg = ctx.new_page()
    pg.set_default_timeout(WAIT_MS)
    pg.errors = []  # type: ignore[attr-defined]
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("dialog", lambda d: (pg.errors.append(f"dialog {d.message}"), d.dismiss()))
    yield pg
    ctx.close()


def _http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _token(stack: Stack) -> str:
    _status, html = _http("GET", stack.url + "d/demo")
    m = re.search(r'name="csrf-token" content="([^"]+)"', html)
    assert m, html[:500]
    return m.group(1)


# --- the operator ------------------------------------------------------------------------------
def test_watch_an_episode_and_fail_it(stack: Stack, page: Any, tmp_path: Path) -> None:
    page.goto(stack.url)
    assert page.locator("#datasets a", has_text="demo").count() == 1
    page.click("#datasets a >> text=demo")
    page.click("#episodes a >> text=1")
    page.wait_for_selector("#plot[data-rendered='1']", timeout=WAIT_MS)
    # every camera loads, at the episode's length (40 frames at 30 fps)
    page.wait_for_function("() => { const v = [...document.querySelectorAll('video')];"
                           " return v.length === 2 && v.every(x => x.readyState >= 2); }", timeout=WAIT_MS)
    vids = page.evaluate("() => [...document.querySelectorAll('video')].map(v => [v.duration, v.videoWidth])")
    assert [round(d, 2) for d, _w in vids] == [1.33, 1.33] and {w for _d, w in vids} == {64}
    plot = page.eval_on_selector("#plot", "c => [Number(c.dataset.points), Number(c.dataset.markers)]")
    assert plot[0] == 2 * 40 * 6  # state and action, 6 joints, every frame drawn
    assert plot[1] == 1  # the drop at frames 10..12, one band
    assert "dropped_frames frames 10..12" in page.inner_text("#timeline-legend")
    # frame under the cursor: hovering the plot reads the values out and seeks the videos there
    box = page.locator("#plot").bounding_box()
    page.mouse.move(box["x"] + 50 + (box["width"] - 60) * 11 / 39, box["y"] + 100)
    readout = page.inner_text("#cursor-readout")
    assert readout.startswith("frame 11 ") and "1011.000" in readout and "[dropped_frames]" in readout
    # ...and every camera shows that frame: dsfactory paints red = 8 * frame, camera c blue = 60 * c
    pixels = page.evaluate("""async () => {
        const out = [];
        for (const v of document.querySelectorAll('video')) {
            while (v.seeking) await new Promise(r => setTimeout(r, 20));
            const c = document.createElement('canvas'); c.width = v.videoWidth; c.height = v.videoHeight;
            const g = c.getContext('2d'); g.drawImage(v, 0, 0);
            out.push([v.currentTime, ...g.getImageData(c.width / 2, c.height / 2, 1, 1).data.slice(0, 3)]);
        }
        return out; }""")
    for cam, (t, red, _green, blue) in enumerate(pixels):
        assert abs(t - 11.5 / 30) < 1e-3 and abs(red - 88) <= 6 and abs(blue - 60 * cam) <= 6, pixels
    # play to the end: the video element reaches its last frame
    page.mouse.move(1, 1)
    page.keyboard.press("Space")
    page.wait_for_selector("body[data-ended='1']", timeout=WAIT_MS)
    page.wait_for_function("() => [...document.querySelectorAll('video')].every(v => v.ended && !v.seeking)",
                           timeout=WAIT_MS)
    end = page.evaluate("() => [...document.querySelectorAll('video')].map(v => [v.ended, v.currentTime, v.duration])")
    assert all(e and abs(t - d) < 1e-3 for e, t, d in end), end
    assert page.inner_text("#frame-readout").startswith("frame 39 / 39")
    # FAIL with a note (button), then the raw row on disk says so
    page.fill("#note", "gripper slipped <b>")
    page.click("#fail-btn")
    page.wait_for_selector("#review-result.ok", timeout=WAIT_MS)
    row = stack.row(1)
    assert (row.qc_verdict, row.note, row.quality) == ("fail", "gripper slipped <b>", "red")
    assert [i.code for i in row.quality_issues] == ["dropped_frames"]  # automatic reasons stay
    assert "verdict: fail" in page.inner_text("#verdict")
    shot = tmp_path / "console.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get(SCREENSHOT_ENV):
        shutil.copyfile(shot, os.environ[SCREENSHOT_ENV])
    print(f"screenshot: {shot}")
    assert page.errors == []  # type: ignore[attr-defined]


def test_unplayable_codec_says_so(stack: Stack, page: Any) -> None:
    page.goto(stack.url + "d/hevc_cam/e/0")
    page.wait_for_selector("#plot[data-rendered='1']", timeout=WAIT_MS)
    msg = page.inner_text(".codec-msg")
    assert "cannot play hevc" in msg and "nothing is transcoded" in msg, msg
    assert page.locator("video").count() == 0
    assert int(page.eval_on_selector("#plot", "c => c.dataset.points")) == 2 * 12 * 6


def test_keyboard_review_pass(stack: Stack, page: Any) -> None:
    page.goto(stack.url + "d/demo/e/0")
    page.wait_for_selector("#plot[data-rendered='1']", timeout=WAIT_MS)
    page.keyboard.press("n")
    page.keyboard.type("looks good")
    page.keyboard.press("Escape")
    page.keyboard.press("p")
    page.wait_for_selector("#review-result.ok", timeout=WAIT_MS)
    row = stack.row(0)
    assert (row.qc_verdict, row.note) == ("pass", "looks good")
    page.keyboard.press("c")
    page.wait_for_function("() => document.getElementById('verdict').textContent.startsWith('verdict: none')",
                           timeout=WAIT_MS)
    assert stack.row(0).qc_verdict == "" and stack.row(0).note == "looks good"
    page.keyboard.press("j")
    page.wait_for_url(re.compile(r".*/d/demo/e/1$"), timeout=WAIT_MS)


def test_review_names_the_take_the_page_shows(stack: Stack, page: Any) -> None:
    """A page that shows a take lost in a crash (its index now holds the next take) is refused."""
    lost = "20261205T075900-99999999"

    def stale(route: Any) -> None:  # the page as it was loaded before the crash: the lost take
        reply = route.fetch()
        payload = reply.json()
        assert payload["episode"]["take_id"] == TAKE0  # the capture node lists the row's take id
        payload["episode"]["take_id"] = lost
        route.fulfill(response=reply, json=payload)

    before = stack.row(0).to_dict()
    page.route("**/api/episode?*", stale)
    page.goto(stack.url + "d/demo/e/0")
    page.wait_for_selector("#plot[data-rendered='1']", timeout=WAIT_MS)
    page.keyboard.press("f")
    page.wait_for_selector("#review-result.red", timeout=WAIT_MS)
    msg = page.inner_text("#review-result")
    assert f"episode 0 holds take {TAKE0}, not {lost}: take {lost} is not in this dataset" in msg, msg
    assert stack.row(0).to_dict() == before
    status, body = _http("POST", stack.url + "api/review",
                         json.dumps({"dataset": "demo", "episode": 0, "verdict": "fail", "take_id": lost}).encode(),
                         {"Content-Type": "application/json", "X-CSRF-Token": _token(stack)})
    assert status == 409 and f"holds take {TAKE0}, not {lost}" in json.loads(body)["message"], body
    assert stack.row(0).to_dict() == before
    assert page.errors == []  # type: ignore[attr-defined]


def test_episode_list_filters_and_hostile_strings(stack: Stack, page: Any) -> None:
    page.goto(stack.url + "d/demo")
    cells = page.locator("#episodes td.task").all_inner_texts()
    assert HOSTILE in cells  # shown as text, not run
    assert page.locator("#episodes td.note", has_text="fine </td><b>bold</b>").count() == 1
    assert page.evaluate("() => window.__pwned") is None
    page.click("#filter-red")
    assert [int(x) for x in page.locator("#episodes tr[data-episode]").evaluate_all(
        "rows => rows.map(r => r.dataset.episode)")] == [1]
    page.goto(stack.url + "d/demo/e/1")
    page.wait_for_selector("#plot[data-rendered='1']", timeout=WAIT_MS)
    assert page.inner_text("#task") == "task: " + HOSTILE
    assert page.evaluate("() => window.__pwned") is None and page.errors == []  # type: ignore[attr-defined]
    page.goto(stack.url + "d/demo?unreviewed=1")
    shown = page.locator("#episodes tr[data-episode]").evaluate_all("rows => rows.map(r => r.dataset.episode)")
    rows = read_meta(stack.dataset).episodes
    assert sorted(int(x) for x in shown) == [r.episode_index for r in rows if not r.qc_verdict]


def test_export_and_upload_from_the_page(stack: Stack, page: Any) -> None:
    page.goto(stack.url + "d/demo")
    page.select_option("#format", "lerobot_v21")
    page.click("#export-btn")
    page.wait_for_selector("#job-status[data-state='completed']", timeout=120000)
    text = page.inner_text("#job-status")
    assert "export" in text and "completed" in text and "episodes 3/3" in text, text
    accepted = stack.log_dir / "demo" / "export" / "lerobot_v21" / "accepted"
    split = QualitySplit.read(accepted)
    # the export node's rule, not the console's: what the verdicts on disk say right now
    rows = read_meta(stack.dataset).episodes
    assert split.source_episode_indices == [
        r.episode_index for r in rows if (r.qc_verdict or ("pass" if r.quality == "green" else "fail")) == "pass"]
    # upload: no storage configured, so the page offers none (the gate's refusal: test below)
    assert page.locator("#upload-btn").count() == 0
    assert "no backend configured" in page.inner_text("#upload-off")


def test_report_page(stack: Stack, page: Any) -> None:
    resp = page.goto(stack.url + "d/demo/report")
    assert resp.status == 200
    text = page.inner_text("body")
    assert "Red reasons by code" in text and "dropped_frames" in text and HOSTILE in text
    assert "jitter_p99_ms" in text and "cam0" in text
    assert page.evaluate("() => window.__pwned") is None


# --- the attacker ------------------------------------------------------------------------------
def test_paths_outside_the_data_roots_are_refused(stack: Stack, page: Any) -> None:
    secret = stack.root / "secret.mp4"
    secret.write_bytes(b"not for the browser")
    video_dir = stack.dataset / "videos" / "chunk-000" / "observation.images.cam0"
    (video_dir / "link.mp4").symlink_to(secret)
    good = "media/demo/videos/chunk-000/observation.images.cam0/episode_000000.mp4"
    size = (video_dir / "episode_000000.mp4").stat().st_size
    # range requests work on a real file
    req = urllib.request.Request(stack.url + good, headers={"Range": "bytes=10-109"})
    with urllib.request.urlopen(req, timeout=20) as r:
        assert r.status == 206 and r.headers["Content-Range"] == f"bytes 10-109/{size}"
        assert r.read() == (video_dir / "episode_000000.mp4").read_bytes()[10:110]
    assert _http("GET", stack.url + good, headers={"Range": f"bytes={size}-"})[0] == 416
    for bad in ("media/demo/videos/chunk-000/observation.images.cam0/link.mp4",   # symlink out
                "media/demo/..%2F..%2F..%2Fsecret.mp4",                             # encoded ..
                "media/..%2F..%2Fsecret.mp4/x.mp4",                                  # dataset name ..
                "media/demo/meta/info.json",                                         # not a video
                "d/..%2F..%2F/report"):
        status, body = _http("GET", stack.url + bad)
        assert status == 403 and "not for the browser" not in body, (bad, status, body)
    resp = page.goto(stack.url + "media/demo/videos/chunk-000/observation.images.cam0/link.mp4")
    assert resp.status == 403 and "refused" in page.inner_text("body")
    # another Host (DNS rebinding) is refused
    assert _http("GET", stack.url, headers={"Host": "attacker.example"})[0] == 403


def test_cross_origin_post_is_refused(stack: Stack, page: Any) -> None:
    before = stack.row(2).to_dict()
    body = json.dumps({"dataset": "demo", "episode": 2, "verdict": "fail", "note": "csrf"}).encode()
    # no token; a token but another origin; a form post
    assert _http("POST", stack.url + "api/review", body, {"Content-Type": "application/json"})[0] == 403
    token = _token(stack)
    status, reply = _http("POST", stack.url + "api/review", body, {
        "Content-Type": "application/json", "X-CSRF-Token": token, "Origin": "http://attacker.example"})
    assert status == 403 and "cross-origin" in reply
    # a real page on another origin (another port) posts a form at the console
    console = stack.url + "api/review"

    class Evil(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            page_html = (f'<form id=f method=post action="{console}" enctype="text/plain">'
                         '<input name=\'{"dataset":"demo","episode":2,"verdict":"fail","x":"\' value=\'"}\'>'
                         '</form><button id=go onclick="document.getElementById(\'f\').submit()">go</button>')
            data = page_html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    evil = ThreadingHTTPServer(("127.0.0.1", 0), Evil)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        page.goto(f"http://127.0.0.1:{evil.server_address[1]}/")
        with page.expect_navigation():
            page.click("#go")
        assert "refused" in page.inner_text("body")
        # and fetch() from that origin, with the JSON type a CSRF would need
        page.goto(f"http://127.0.0.1:{evil.server_address[1]}/")
        status = page.evaluate("""async (u) => {
            try { const r = await fetch(u, {method: 'POST', headers: {'Content-Type': 'application/json',
                  'X-CSRF-Token': 'guess'}, body: '{"dataset":"demo","episode":2,"verdict":"fail"}'});
                  return r.status; } catch (e) { return 'blocked: ' + e; } }""", console)
        assert status == 403 or str(status).startswith("blocked"), status
    finally:
        evil.shutdown()
        evil.server_close()
    assert stack.row(2).to_dict() == before  # nothing changed


def test_console_talks_through_services_only(stack: Stack, rclpy_context: None) -> None:
    """The rows the page shows are the capture node's answer; the upload refusal is the gate's."""
    client = rosharness.RosClient()
    try:
        cap = stack.procs["capture_node"]
        reply = client.call(ListEpisodes, cap.service("list_episodes"), ListEpisodes.Request(dataset_name="demo"))
        _s, html = _http("GET", stack.url + "d/demo")
        for e in reply.episodes:
            assert f'data-episode="{e.episode_index}"' in html
        up = stack.procs["upload_node"]
        direct = client.call(StartUpload, up.service("start"), StartUpload.Request(
            source_dir=str(stack.dataset), format="lerobot_v21",
            accepted_dir=str(stack.log_dir / "demo/export/lerobot_v21/accepted")))
        status, body = _http("POST", stack.url + "api/upload",
                             json.dumps({"dataset": "demo", "format": "lerobot_v21"}).encode(),
                             {"Content-Type": "application/json", "X-CSRF-Token": _token(stack)})
        assert status == 409 and json.loads(body)["message"] == direct.message
        job = client.call(GetJob, stack.procs["export_node"].service("get_job"), GetJob.Request())
        status, body = _http("GET", stack.url + f"api/job?kind=export&id={job.job.job_id}")
        assert status == 200 and json.loads(body)["job"]["state"] == job.job.state
    finally:
        client.close()


def test_make_console_prints_the_url_and_stops_cleanly(tmp_path: Path) -> None:
    """tools/console.py (what `make console` runs): sample dataset, four nodes, the URL, Ctrl-C."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, str(rosharness.REPO_ROOT / "tools" / "console.py"),
                             "--work", str(tmp_path), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        m = re.match(r"eva console: (http://127\.0\.0\.1:\d+/) ", line)
        assert m, line + proc.stdout.read() if proc.poll() is not None else line  # type: ignore[union-attr]
        status, body = _http("GET", m.group(1) + "d/sample")
        assert status == 200 and body.count("data-episode=") == 3
    finally:
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, rest
    logs = list((tmp_path / "logs").glob("*.log"))
    assert len(logs) == 4
