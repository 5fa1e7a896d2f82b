"""The console's ROS-free parts: `eva-export report`, the console config section, the data views."""

from __future__ import annotations

import html
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, make_dataset

from eva_export.config import parse_config
from eva_export.console import data
from eva_export.console.report import build_report
from eva_export.errors import ConfigError
from eva_export.formats.common.meta import read_meta

HOSTILE = "<script>alert(1)</script>"


def _dataset(root: Path) -> Path:
    return make_dataset(root, [
        Ep(frames=12),
        Ep(frames=15, quality="red", task=HOSTILE,
           issues=[{"code": "dropped_frames", "severity": "error", "detail": "cam0: 2/15 <b>"},
                   {"code": "frozen_camera", "severity": "error", "detail": "cam0: 15 identical"}],
           extra={"stream_stats": {"cam0": {"received": 13, "rate_hz": 28.0, "dropped": 2, "late": 3,
                                            "jitter_p50_ms": 2.0, "jitter_p99_ms": 11.5}}}),
        Ep(frames=10, quality="red", verdict="pass", note='"quoted" & <i>',
           issues=[{"code": "dropped_frames", "severity": "error", "detail": "cam0: 1/10"}],
           extra={"stream_stats": {"cam0": {"received": 9, "rate_hz": 27.0, "dropped": 1, "late": 0,
                                            "jitter_p50_ms": 1.0, "jitter_p99_ms": 4.5}}}),
    ], cameras=1, width=32, height=24)


def test_report_cli_writes_escaped_html(tmp_path: Path) -> None:
    root = _dataset(tmp_path / "demo" / "raw")
    out = tmp_path / "r.html"
    proc = subprocess.run([sys.executable, "-m", "eva_export.cli", "report", str(root), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "<script" not in text  # no script of ours, and the hostile task is escaped
    assert html.escape(HOSTILE) in text and html.escape('"quoted" & <i>') in text
    assert "cam0: 2/15 &lt;b&gt;" in text
    # red reasons by code: dropped_frames in two episodes, frozen_camera in one
    assert "<tr><td>dropped_frames</td><td class=\"num\">2</td></tr>" in text
    assert "<tr><td>frozen_camera</td><td class=\"num\">1</td></tr>" in text
    # per-stream rate and jitter (min / mean / max over the episodes that have it)
    assert "27.000 / 27.500 / 28.000" in text and "4.500 / 8.000 / 11.500" in text
    # state ranges from episodes_stats: state[j] = episode*1000 + frame + j/10
    assert '<td>observation.state</td><td>joint_0</td><td class="num">0.000</td><td class="num">2009.000</td>' in text
    assert "cam0: dropped per episode" in text and "cam0: late per episode" in text
    # default output beside the dataset, never inside it
    proc = subprocess.run([sys.executable, "-m", "eva_export.cli", "report", str(root)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and Path(proc.stdout.strip()) == tmp_path / "demo" / "raw_report.html"
    assert not list(root.rglob("*report*"))


def test_report_cli_refuses_a_non_dataset(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "eva_export.cli", "report", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "info.json is missing" in proc.stderr


def test_console_config_section() -> None:
    c = parse_config({}).console
    assert (c.enabled, c.bind, c.port) == (False, "127.0.0.1", 8765)
    c = parse_config({"console": {"enabled": True, "port": 0}}).console
    assert c.enabled and c.port == 0
    for bad, words in (({"enabeld": True}, "unknown keys"), ({"port": 70000}, "0..65535"),
                       ({"enabled": "yes"}, "true or false")):
        with pytest.raises(ConfigError, match=words):
            parse_config({"console": bad})


def test_nonfinite_frames_are_marked(tmp_path: Path) -> None:
    root = _dataset(tmp_path / "demo" / "raw")
    meta = read_meta(root)
    path = meta.data_path(0)
    table = pq.read_table(path)
    state = np.array(table.column("observation.state").to_pylist(), dtype=np.float32)
    state[4:7, 2] = np.nan
    state[9, 0] = np.inf
    col = pa.FixedSizeListArray.from_arrays(pa.array(state.reshape(-1), pa.float32()), 6)
    table = table.set_column(table.schema.get_field_index("observation.state"),
                             table.schema.field("observation.state"), col)
    pq.write_table(table, path)
    got = data.episode_series(root, meta.info, 0)
    assert got["nonfinite"] == {"observation.state": [4, 5, 6, 9]}
    assert got["series"]["observation.state"]["values"][5][2] is None
    marks = data.episode_markers(meta.episodes[0], got["nonfinite"])
    assert [(m["code"], m["from"], m["to"]) for m in marks] == [("non_finite", 4, 6), ("non_finite", 9, 9)]
    row = meta.episodes[1]
    row.quality_issues[0].extra["frames"] = [3, 4, 5, 8]
    row.quality_issues[1].extra["ranges"] = [[10, 99]]
    marks = data.episode_markers(row, {})
    assert [(m["code"], m["from"], m["to"]) for m in marks] == [
        ("dropped_frames", 3, 5), ("dropped_frames", 8, 8), ("frozen_camera", 10, 14)]


def test_files_are_confined(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    root = _dataset(log_dir / "demo" / "raw")
    (tmp_path / "secret.mp4").write_bytes(b"x")
    (root / "videos" / "out.mp4").symlink_to(tmp_path / "secret.mp4")
    rel = "videos/chunk-000/observation.images.cam0/episode_000000.mp4"
    assert data.confined_file(log_dir, "demo", rel) == (root / rel).resolve()
    for name, bad in (("demo", "videos/out.mp4"), ("demo", "../../../secret.mp4"), ("demo", "/etc/passwd"),
                      ("demo", "meta/info.json"), ("..", rel), ("demo/raw", rel)):
        with pytest.raises(data.UnsafeNameError):
            data.confined_file(log_dir, name, bad)
    # a dataset directory that is itself a symlink out of log_dir is not listed or served
    (log_dir / "escape").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    _dataset(tmp_path / "elsewhere" / "raw")
    assert [d.name for d in data.list_datasets(log_dir)] == ["demo"]
    with pytest.raises(data.OutsideRoots):
        data.confined_file(log_dir, "escape", rel)
    assert HOSTILE not in build_report(root).replace(html.escape(HOSTILE), "")


@pytest.mark.parametrize("bind", ["127.0.0.1", "::1"])
def test_console_server_binds_ipv4_and_ipv6_loopback(tmp_path: Path, bind: str) -> None:
    """The page server alone (no ROS peers needed for the datasets page) on either loopback."""
    import urllib.request

    from eva_export.console.server import ConsoleServer

    _dataset(tmp_path / "logs" / "day1" / "raw")  # log_dir/<dataset>/raw, as the capture node writes
    server = ConsoleServer(bind, 0, tmp_path / "logs", None)  # type: ignore[arg-type]  # no backend call on "/"
    server.start()
    try:
        assert server.url.startswith("http://[::1]:" if bind == "::1" else "http://127.0.0.1:")
        with urllib.request.urlopen(server.url, timeout=10) as resp:
            assert resp.status == 200 and "day1" in resp.read().decode()
    finally:
        server.stop()


def test_upload_is_offered_only_with_a_backend() -> None:
    from eva_export.console import pages

    for configured in (False, True):
        html_text = pages.episodes_page("d", True, "", [], [], False, False, "tok", ["hdf5"], configured)
        assert ("id=upload-btn" in html_text) is configured
        assert ("id=upload-off" in html_text) is not configured


def test_report_unrated_and_nonfinite_counts(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "third" / "raw", [Ep(frames=8, quality=""), Ep(frames=9, quality="")],
                        cameras=1, width=32, height=24)
    meta = read_meta(root)
    path = meta.data_path(1)
    table = pq.read_table(path)
    state = np.array(table.column("observation.state").to_pylist(), dtype=np.float32)
    state[:, 3] = np.nan
    state[2, 0] = -np.inf
    col = pa.FixedSizeListArray.from_arrays(pa.array(state.reshape(-1), pa.float32()), 6)
    pq.write_table(table.set_column(table.schema.get_field_index("observation.state"),
                                    table.schema.field("observation.state"), col), path)
    text = build_report(root)
    assert '<span id="count-red" class="red">0 red</span>' in text
    assert '<span id="count-green" class="green">0 green</span>' in text
    assert '<span id="count-unrated" class="unrated">2 unrated</span>' in text
    assert "10 NaN/inf values in 1 episodes" in text
    # joint_3 is NaN in all 9 frames of episode 1: its range is episode 0's, and the 9 are counted
    assert ('<td>observation.state</td><td>joint_3</td><td class="num">0.300</td><td class="num">7.300</td>'
            '<td class="num red">9</td>') in text
    assert "episode 1: non_finite frames 0..8" in text
    assert "<svg" not in text and text.count('<img class="plot') >= 2
