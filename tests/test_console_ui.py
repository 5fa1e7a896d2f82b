"""The operator's page on a robot that is not ours: real nodes, real datasets, Debian's chromium.

A third-party-like dataset (no quality fields: unrated; 32-dim state and action with joint
names in info.json; 6 cameras; one episode NaN in one joint throughout), plus 1- and 8-camera
datasets, behind the same four node processes as tests/test_console.py. Each test is one thing an
operator relies on.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rosharness
from test_console import (
    WAIT_MS,
    _http,
    _wait_log,
    _wait_url,
)

from eva_export.formats.common.meta import read_meta
from eva_export.formats.common.records import Feature
from eva_export.formats.common.video import VideoSettings
from eva_export.formats.lerobot_v21.writer import DatasetWriter, make_features

pytestmark = pytest.mark.timeout(300)

DOCS_ENV = "EVA_CONSOLE_DOCS"  # a directory: console.png and report.png are copied there
PARTS = ["shoulder_pan", "shoulder_lift", "shoulder_roll", "elbow_flex", "elbow_roll", "wrist_flex",
         "wrist_roll", "wrist_yaw", "gripper", "finger_a", "finger_b", "finger_c", "hand_pitch", "hand_yaw",
         "hip_yaw", "knee"]
NAMES32 = [f"{side}_{p}" for side in ("left", "right") for p in PARTS]
FRAMES = 20
NAN_EPISODE, NAN_JOINT = 1, 5


def _image(episode: int, frame: int, cam: int) -> np.ndarray:
    """A flat colour per camera with a bar that moves with the frame (something to see in the shot)."""
    img = np.empty((48, 64, 3), np.uint8)
    img[...] = ((37 * cam) % 200 + 30, (episode * 50) % 200 + 30, (90 * cam) % 256)
    x = (frame * 3) % 60
    img[:, x:x + 4] = 240
    return img


def third_party(root: Path, episodes: int, cameras: int, dims: int = 32, nan_episode: int = -1) -> Path:
    """A v2.1 dataset as another recorder leaves it: no quality, no verdicts, named joints."""
    names = NAMES32[:dims]
    feats = {"observation.state": Feature("float32", (dims,), list(names)),
             "action": Feature("float32", (dims,), list(names))}
    for c in range(cameras):
        feats[f"observation.images.cam{c}"] = Feature.video(48, 64, 30)
    dw = DatasetWriter.open(root, fps=30, features=make_features(feats), robot_type="bimanual_humanoid",
                            settings=VideoSettings(crf=20))
    for e in range(episodes):
        w = dw.begin_episode("fold the towel")
        for f in range(FRAMES):
            s = (np.sin(f / 4 + np.arange(dims)) * (1 + np.arange(dims) / 4)).astype(np.float32)
            if e == nan_episode:
                s[NAN_JOINT] = np.nan
            w.add_frame({"observation.state": s, "action": s * 0.9},
                        {f"observation.images.cam{c}": _image(e, f, c) for c in range(cameras)})
        dw.commit(w, {})
    return root


class UiStack:
    def __init__(self, url: str, log_dir: Path) -> None:
        self.url, self.log_dir = url, log_dir

    def row(self, dataset: str, index: int) -> Any:
        return next(r for r in read_meta(self.log_dir / dataset / "raw").episodes if r.episode_index == index)


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory, rclpy_context: None) -> Iterator[UiStack]:
    root = tmp_path_factory.mktemp("console_ui")
    log_dir = root / "datasets"
    third_party(log_dir / "robot32" / "raw", episodes=4, cameras=6, nan_episode=NAN_EPISODE)
    third_party(log_dir / "eight" / "raw", episodes=1, cameras=8, dims=6)
    third_party(log_dir / "one" / "raw", episodes=3, cameras=1, dims=6)
    config = root / "config.yaml"
    config.write_text(
        f'collection:\n  log_dir: "{log_dir}"\n  fps: 30\n'
        "  tasks:\n    - {dataset_name: robot32, task: fold the towel}\n"
        "  streams:\n    state: {topic: /console_ui_test/joint_states, names: [a, b]}\n"
        "console:\n  enabled: true\n  port: 0\n")
    ns = rosharness.unique_namespace("console_ui")
    procs = {exe: rosharness.NodeProcess(exe, root / "logs", namespace=ns, params={"config_file": str(config)})
             .start() for exe in ("capture_node", "export_node", "upload_node", "console_node")}
    client = rosharness.RosClient()
    try:
        client.wait_for_services([procs["capture_node"].service("review"),
                                  procs["export_node"].service("get_job")], timeout=120, procs=list(procs.values()))
        url = _wait_url(procs["console_node"])
        _wait_log(procs["console_node"], "console peers ready")
        yield UiStack(url, log_dir)
    finally:
        client.close()
        codes = {exe: p.stop() for exe, p in procs.items()}
        assert codes["console_node"] == 0, procs["console_node"].log_tail()


def _page(browser: Any, width: int = 1366, height: int = 768) -> Any:
    ctx = browser.new_context(viewport={"width": width, "height": height})
    pg = ctx.new_page()
    pg.set_default_timeout(WAIT_MS)
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    return pg


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    pg = _page(browser)
    yield pg
    pg.context.close()


def _open_episode(page: Any, ui: UiStack, dataset: str, index: int) -> None:
    page.goto(f"{ui.url}d/{dataset}/e/{index}")
    page.wait_for_selector("#plot[data-rendered='1']")


def _docs_copy(src: Path, name: str) -> None:
    if os.environ.get(DOCS_ENV):
        shutil.copyfile(src, Path(os.environ[DOCS_ENV]) / name)


# --- keys and the note --------------------------------------------------------------------------
def test_keys_work_after_clicking_and_dragging_the_slider(ui: UiStack, page: Any) -> None:
    _open_episode(page, ui, "one", 0)
    box = page.locator("#scrub").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.click(box["x"] + box["width"] * 0.2, y)
    page.mouse.move(box["x"] + box["width"] * 0.3, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=5)
    page.mouse.up()
    frame = int(page.eval_on_selector("#scrub", "s => s.value"))
    page.keyboard.press("ArrowRight")  # one frame, not the slider's own step on top of ours
    page.wait_for_function(f"() => document.getElementById('scrub').value === '{frame + 1}'")
    page.keyboard.press("p")
    page.wait_for_selector("#review-result.ok")
    assert ui.row("one", 0).qc_verdict == "pass"
    page.locator("#scrub").click()  # and with the slider focused by a plain click
    page.keyboard.press("Space")
    page.wait_for_function("() => document.getElementById('play').textContent.startsWith('pause')")
    page.keyboard.press("Space")
    page.keyboard.press("f")
    page.wait_for_function("() => document.getElementById('verdict').textContent.startsWith('verdict: fail')")
    page.keyboard.press("c")
    page.wait_for_function("() => document.getElementById('verdict').textContent.startsWith('verdict: none')")
    assert ui.row("one", 0).qc_verdict == ""
    page.locator("#pass-btn").click()  # a clicked button does not keep the keys either
    page.wait_for_function("() => document.getElementById('verdict').textContent.startsWith('verdict: pass')")
    page.keyboard.press("j")
    page.wait_for_url(re.compile(r".*/d/one/e/1$"))
    page.wait_for_selector("#plot[data-rendered='1']")
    page.keyboard.press("k")
    page.wait_for_url(re.compile(r".*/d/one/e/0$"))
    assert page.errors == []


def test_enter_in_the_note_saves_it(ui: UiStack, page: Any) -> None:
    _open_episode(page, ui, "one", 2)
    page.click("#note")
    page.keyboard.type("cloth slipped at the end")
    assert page.inner_text("#note-state") == "unsaved"
    page.keyboard.press("Enter")
    page.wait_for_selector("#note-state[data-state='saved']")
    assert page.inner_text("#note-state") == "saved"
    row = ui.row("one", 2)
    assert (row.note, row.qc_verdict) == ("cloth slipped at the end", "")  # the note only, no verdict
    assert page.evaluate("() => document.activeElement.id") != "note"  # keys are the page's again
    page.keyboard.press("f")
    page.wait_for_function("() => document.getElementById('verdict').textContent.startsWith('verdict: fail')")
    assert ui.row("one", 2).note == "cloth slipped at the end"
    page.goto(f"{ui.url}d/one/e/2")  # reloaded: the note is there and saved
    page.wait_for_selector("#note-state[data-state='saved']")
    assert page.input_value("#note") == "cloth slipped at the end"


# --- a 32-dim robot with 6 cameras ---------------------------------------------------------------
def test_wide_robot_plot_has_names_groups_and_readable_bands(ui: UiStack, page: Any, tmp_path: Path) -> None:
    _open_episode(page, ui, "robot32", NAN_EPISODE)
    legend = page.locator("#legend .legend-item").all_inner_texts()
    assert legend == NAMES32[:8]  # the first group of 8, named from info.json
    options = page.locator("#dims option").all_inner_texts()
    assert len(options) == 5 and options[0] == "all 32 dimensions" and "right_shoulder_pan" in options[3]
    # NaN throughout one joint (state and action): a band over the whole episode, the joint not drawn
    assert int(page.eval_on_selector("#plot", "c => c.dataset.markers")) == 2
    assert int(page.eval_on_selector("#plot", "c => c.dataset.points")) == 2 * FRAMES * 7
    assert "non_finite frames 0..19" in page.inner_text("#timeline-legend")
    # the band does not wash the plot out: away from the top strip the background stays near white
    px = page.evaluate("""() => { const c = document.getElementById('plot'), g = c.getContext('2d');
        return [g.getImageData(c.width / 2, 2, 1, 1).data.slice(0, 3),
                g.getImageData(c.width / 2, c.height - 3, 1, 1).data.slice(0, 3)].map(a => [...a]); }""")
    strip, background = px
    assert strip[0] > 150 and strip[1] < 80, px
    assert min(background) >= 235, px
    box = page.locator("#plot").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    readout = page.inner_text("#cursor-readout")
    assert "left_shoulder_pan=" in readout and f"{NAMES32[NAN_JOINT]}=NaN" in readout, readout
    page.select_option("#dims", "g3")
    page.wait_for_function("() => document.getElementById('plot').dataset.dims === 'g3'")
    assert page.locator("#legend .legend-item").all_inner_texts() == NAMES32[24:32]
    page.mouse.move(box["x"] + box["width"] / 3, box["y"] + box["height"] / 2)
    assert "right_hand_pitch=" in page.inner_text("#cursor-readout")
    page.keyboard.press("p")  # the select gave the focus back
    page.wait_for_selector("#review-result.ok")
    assert ui.row("robot32", NAN_EPISODE).qc_verdict == "pass"
    page.select_option("#dims", "g0")
    page.keyboard.press("c")
    page.wait_for_function("() => document.getElementById('verdict').textContent.startsWith('verdict: none')")
    shot = tmp_path / "console.png"
    page.mouse.move(box["x"] + box["width"] * 0.4, box["y"] + box["height"] / 2)
    page.screenshot(path=str(shot))
    _docs_copy(shot, "console.png")
    assert page.errors == []


@pytest.mark.parametrize(("dataset", "cameras"), [("one", 1), ("robot32", 6), ("eight", 8)])
def test_review_bar_stays_in_view(ui: UiStack, page: Any, dataset: str, cameras: int) -> None:
    _open_episode(page, ui, dataset, 0)
    page.wait_for_function(f"() => {{ const v = [...document.querySelectorAll('video')];"
                           f" return v.length === {cameras} && v.every(x => x.readyState >= 1); }}")
    view = page.viewport_size
    for sel in ("#review", "#pass-btn", "#note", "#scrub"):
        r = page.locator(sel).bounding_box()
        assert r["y"] >= 0 and r["y"] + r["height"] <= view["height"], (sel, r, view)
    hit = page.evaluate("""() => { const b = document.getElementById('pass-btn').getBoundingClientRect();
        return document.elementFromPoint(b.x + b.width / 2, b.y + b.height / 2).id; }""")
    assert hit == "pass-btn"
    plot, bar = page.locator("#plot").bounding_box(), page.locator("#review").bounding_box()
    assert plot["y"] + 40 < bar["y"], (plot, bar)  # some of the plot is on screen above the bar
    assert page.inner_text("#quality") == "unrated"
    assert page.inner_text("#timeline-legend") == "no issues recorded for this episode"


# --- the health report ---------------------------------------------------------------------------
def test_report_counts_unrated_as_unrated_and_shows_nan(ui: UiStack, page: Any, tmp_path: Path) -> None:
    resp = page.goto(ui.url + "d/robot32/report")
    assert resp.status == 200
    assert page.inner_text("#count-unrated") == "4 unrated"
    assert (page.inner_text("#count-red"), page.inner_text("#count-green")) == ("0 red", "0 green")
    assert "unreviewed 4" in page.inner_text("#verdict-counts")
    assert page.inner_text("#count-nonfinite") == f"{2 * FRAMES} NaN/inf values in 1 episodes"
    row = page.locator("#ranges tr", has_text=NAMES32[NAN_JOINT]).first.locator("td").all_inner_texts()
    assert row[0] == "observation.state" and row[-1] == str(FRAMES), row
    assert f"episode {NAN_EPISODE}: non_finite frames 0..{FRAMES - 1}" in page.inner_text("#timeline-marks")
    # the plots are images a browser decodes on its own (what "copy image" and a paste carry)
    imgs = page.evaluate("() => [...document.querySelectorAll('img.plot')].map(i => [i.complete, i.naturalWidth])")
    assert len(imgs) >= 2 and all(ok and w > 0 for ok, w in imgs), imgs
    assert page.locator("svg").count() == 0
    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    _docs_copy(shot, "report.png")


# --- jobs, missing datasets, the busy port ------------------------------------------------------
def test_jobs_and_status_are_per_dataset(ui: UiStack, page: Any) -> None:
    page.goto(ui.url + "d/one")
    assert page.locator("#upload-btn").count() == 0  # no upload backend configured
    assert "no backend configured" in page.inner_text("#upload-off")
    page.select_option("#format", "hdf5")
    page.click("#export-btn")
    page.wait_for_selector("#job-status[data-state='completed']", timeout=120000)
    text = page.inner_text("#job-status")
    progress = re.search(r"source episodes [^,]*(, [0-9/]+ converted)?", text)
    assert progress and progress.group(0).startswith("source episodes 3/3"), text
    assert "episodes 6/6" not in text, text
    job_id = re.search(r"export (\S+) ", text).group(1)
    page.wait_for_function(f"() => document.getElementById('status').textContent.includes('{job_id}')")
    page.goto(ui.url + "d/eight")  # another dataset's pages do not show that job
    page.wait_for_function("() => document.getElementById('status').textContent.includes('export:')")
    assert job_id not in page.inner_text("#status") and page.inner_text("#job-status") == ""
    page.goto(ui.url)
    page.wait_for_function("() => document.getElementById('status').textContent.includes('export:')")
    assert job_id not in page.inner_text("#status")
    page.goto(ui.url + "d/one")  # a reload follows this dataset's job again
    page.wait_for_selector("#job-status[data-state='completed']")
    assert job_id in page.inner_text("#job-status")
    assert page.errors == []


def test_missing_dataset_has_a_clear_page(ui: UiStack, page: Any) -> None:
    for path in ("d/no_such_set", "d/no_such_set/e/0", "d/no_such_set/report"):
        resp = page.goto(ui.url + path)
        assert resp.status == 404, path
        assert "There is no dataset named" in page.inner_text("#missing")
        assert page.locator("#export-btn, #upload-btn, #format").count() == 0


def test_make_console_busy_port_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run([sys.executable, str(rosharness.REPO_ROOT / "tools" / "console.py"),
                               "--work", str(tmp_path), "--port", str(port)],
                              capture_output=True, text=True, timeout=240)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port}" in lines[0] and 'CONSOLE_ARGS="--port 0"' in lines[0], proc.stderr
    assert not (tmp_path / "logs").exists()  # refused before any node started


# --- every request gets an answer ------------------------------------------------
def _raw(ui: UiStack, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, str]:
    """One request on its own connection; a dropped connection raises (http.client), as it should."""
    m = re.match(r"http://([^/]+)/", ui.url)
    conn = http.client.HTTPConnection(m.group(1), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        conn.close()


def test_bad_input_gets_a_4xx_with_a_reason(ui: UiStack) -> None:
    token = _token_of(ui)
    post = {"Content-Type": "application/json", "X-CSRF-Token": token}
    cases = [
        (b'{"dataset": "one", "episode": %d, "verdict": "pass"}' % 2**70, "episode must be an integer"),
        (b'{"dataset": "one", "episode": Infinity, "verdict": "pass"}', "Infinity is not a JSON number"),
        (b'{"dataset": "one", "episode": 1.5, "verdict": "pass"}', "episode must be an integer"),
        (b'{"dataset": "one", "episode": 0, "verdict": "pass", "note": "\\ud800"}', "not valid UTF-8"),
        (b'{"dataset": "\\udfff", "episode": 0, "verdict": "pass"}', "not valid UTF-8"),
    ]
    before = ui.row("one", 0).to_dict()
    for body, reason in cases:
        status, reply = _raw(ui, "POST", "/api/review", body, post)
        assert status == 400 and reason in json.loads(reply)["message"], (body, status, reply)
    assert ui.row("one", 0).to_dict() == before
    video = "/media/one/videos/chunk-000/observation.images.cam0/episode_000000.mp4"
    for rng in ("bytes=0-" + "9" * 5000, "bytes=" + "1" * 5000 + "-", "bytes=-" + "7" * 5000, "x" * 5000):
        status, reply = _raw(ui, "GET", video, headers={"Range": rng})
        assert status == 416 and "Range" in reply, (rng[:20], status, reply)
    assert _raw(ui, "GET", video, headers={"Range": "bytes=0-9"})[0] == 206
    digits = "9" * 5000
    for path in (f"/d/one/e/{digits}", f"/api/episode?dataset=one&episode={digits}", "/d/one/e/99999999999"):
        status, reply = _raw(ui, "GET", path)
        assert status == 400 and "episode must be an integer in 0..2147483647" in reply, (path[:30], status)
    status, reply = _raw(ui, "GET", "/d/%ff%fe/e/0")
    assert status == 400 and "UTF-8" in reply
    assert _http("GET", ui.url + "d/one/e/0")[0] == 200


def _token_of(ui: UiStack) -> str:
    _status, html = _http("GET", ui.url + "d/one")
    m = re.search(r'name="csrf-token" content="([^"]+)"', html)
    assert m, html[:500]
    return m.group(1)
