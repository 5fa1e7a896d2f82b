"""The main job end to end: `tools/demo.py` (what `make demo` runs), with short episodes.

Runs the demo as its own process, then checks its summary against the files on disk: the raw
dataset, every export's quality markers and totals, and the uploaded tree on the SFTP remote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eva_export.export.records import QualitySplit
from eva_export.formats.common.meta import read_meta
from eva_export.formats.registry import format_names
from eva_export.fsutil import read_json, tree_size

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("demo")
    env = dict(os.environ)  # conftest set the loopback discovery range and this run's domain id
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "demo.py"), "--out", str(out),
                           "--seconds", "1.5", "--width", "160", "--height", "120"],
                          env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "eva_export demo summary" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    summary["_stdout"] = proc.stdout
    return summary


def test_summary_matches_raw_dataset(demo: dict) -> None:
    meta = read_meta(Path(demo["source_dir"]))
    assert [e.episode_index for e in meta.episodes] == [e["episode_index"] for e in demo["episodes"]]
    on_disk = {e.episode_index: e for e in meta.episodes}
    for e in demo["episodes"]:
        row = on_disk[e["episode_index"]]
        assert row.length == e["length"] and row.quality == e["quality"] and row.qc_verdict == e["qc_verdict"]
    # the cancelled and the zero-frame takes wrote nothing: 4 good/faulty takes were saved
    labels = {t["label"]: t for t in demo["takes"]}
    assert labels["cancelled"]["cancelled"] and labels["zero_frames"]["episode_index"] == -1
    assert len(meta.episodes) == 4
    fault = on_disk[labels["fault_nan"]["episode_index"]]
    assert fault.quality == "red" and "non_finite" in {i.code for i in fault.quality_issues}
    assert fault.qc_verdict == "pass" and fault.note
    failed_green = on_disk[labels["good_2"]["episode_index"]]
    assert failed_green.quality == "green" and failed_green.qc_verdict == "fail"


def test_exports_match_summary(demo: dict) -> None:
    labels = {t["label"]: t["episode_index"] for t in demo["takes"] if "episode_index" in t}
    want_accepted = sorted([labels["good_1"], labels["fault_nan"], labels["good_3"]])
    want_rejected = [labels["good_2"]]
    assert set(demo["exports"]) == set(format_names())  # all five, eva_store included
    for fmt, e in demo["exports"].items():
        for subset, want in (("accepted", want_accepted), ("rejected", want_rejected)):
            d = Path(e[f"{subset}_dir"])
            q = QualitySplit.read(d)
            assert q.subset == subset and q.dataset_format == fmt
            # the passed NaN take is exported as its finite runs: one episode per run
            assert sorted(set(q.source_episode_indices)) == want
            assert Path(q.source_dir).resolve() == Path(demo["source_dir"]).resolve()
            info = read_json(d / "meta" / "info.json")
            assert info["total_episodes"] == e[f"{subset}_episodes"] == len(q.source_episode_indices) >= len(want)
            assert info["total_frames"] == e[f"{subset}_frames"]
            assert e["verified"][subset]["ok"]
        assert Path(e["accepted_dir"]).parent.name == fmt


def test_viewer_export_opens_in_rerun(demo: dict, tmp_path: Path) -> None:
    """The mcap_foxglove export through Rerun's own converter: both cameras as video, state and
    action as one named series per joint, values and frame counts those of the raw episodes."""
    import pyarrow.parquet as pq
    from test_formats_mcap_viewer import check_rerun

    accepted = Path(demo["exports"]["mcap_foxglove"]["accepted_dir"])
    names = read_json(accepted / "meta" / "info.json")["features"]["observation.state"]["names"]
    raw = read_meta(Path(demo["source_dir"]))
    rows = [json.loads(line) for line in (accepted / "meta/episodes.jsonl").read_text().splitlines()]
    for new, src in enumerate(QualitySplit.read(accepted).source_episode_indices):
        table = pq.read_table(raw.data_path(src))
        if "finite_run" in rows[new]:  # a finite run of a passed NaN take: its own frames of the raw take
            run = rows[new]["finite_run"]
            table = table.slice(run["from_frame"], run["to_frame"] - run["from_frame"])
        check_rerun(accepted / f"data/chunk-000/episode_{new:06d}.mcap", tmp_path, table,
                    {f"observation.images.{c}": "VideoStream:sample" for c in ("front", "wrist")},
                    {"observation.state": names, "action": names})
    assert "look at one : rerun " in demo["_stdout"]


def test_upload_matches_accepted_v3(demo: dict) -> None:
    up = demo["upload"]
    remote = Path(up["remote_path"])  # the SFTP remote is a directory on this machine
    assert remote.is_dir() and remote.parent.name == "remote"
    local = Path(demo["exports"]["lerobot_v3"]["accepted_dir"])
    assert tree_size(remote) == tree_size(local) == (up["files"], up["bytes"])
    assert QualitySplit.read(remote).subset == "accepted"
    assert not [p for p in remote.parent.iterdir() if ".staging" in p.name]
    assert str(remote) in demo["_stdout"]


def _demo_module():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("eva_demo", ROOT / "tools" / "demo.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_demo_checked_its_own_scenario(demo: dict) -> None:
    assert demo["scenario_errors"] == []
    assert "scenario met" in demo["_stdout"]


def test_demo_fails_when_the_scenario_is_not_met(demo: dict, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A good take that came out red (as on an overloaded machine) and an export that lost an
    episode: the demo names both and exits 1 instead of printing 'verified'."""
    import copy

    mod = _demo_module()
    bad = copy.deepcopy({k: v for k, v in demo.items() if k != "_stdout"})
    good_1 = next(t["episode_index"] for t in bad["takes"] if t["label"] == "good_1")
    for e in bad["episodes"]:
        if e["episode_index"] == good_1:
            e["quality"], e["quality_codes"] = "red", ["missing_stream"]
    bad["exports"]["eva_store"]["accepted_episodes"] = 2
    errors = mod.scenario_errors(bad)
    assert any(f"good_1: episode {good_1} is red, expected green (issues: missing_stream)" in e for e in errors)
    assert any(e.startswith("eva_store: accepted has 2 episodes") for e in errors)
    assert len(errors) == 2
    bad["out"] = str(tmp_path)
    monkeypatch.setattr(mod, "run", lambda args: copy.deepcopy(bad))
    assert mod.main(["--out", str(tmp_path)]) == 1
    assert "did NOT go as its scenario says" in capsys.readouterr().err


def test_demo_keeps_the_users_domain_id() -> None:
    import rosharness

    env = {"ROS_DOMAIN_ID": "112"}
    assert rosharness.configure_ros_env(env, keep_user_domain=True) == 112 and env["ROS_DOMAIN_ID"] == "112"
    env = {"ROS_DOMAIN_ID": "112", "EVA_TEST_DOMAIN_ID": "7"}
    assert rosharness.configure_ros_env(env, keep_user_domain=True) == 7
    env = {"ROS_DOMAIN_ID": "112"}  # the tests always take their own (1..101)
    assert 1 <= rosharness.configure_ros_env(env) <= 101


def test_demo_ran_in_the_domain_it_was_given(demo: dict) -> None:
    # conftest set this run's ROS_DOMAIN_ID; the demo process kept it instead of its own
    assert demo["ros_domain_id"] == os.environ["ROS_DOMAIN_ID"]
