"""The quality rules, both drivers, on a fault corpus: every fault found with its frames, nothing
on the controls, the same verdicts live (the capture engine fed the samples) and offline
(``eva-export check`` on the files); ``--write`` merges into the rows, ``--sidecar`` feeds the split."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from quality_corpus import CAMS, FPS, CorpusEpisode, N, corpus, feed_live, live_config, write_corpus

from eva_export.capture.features import capture_features
from eva_export.formats.common.meta import read_info
from eva_export.formats.lerobot_v21.writer import DatasetWriter
from eva_export.quality.judge import evaluate
from eva_export.quality.offline import check_dataset
from eva_export.quality.rules import RULE_VERSION, EpisodeEvidence, Finding, VectorSeries

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[1]
#: Live stream names -> the dataset features the offline driver names.
FEATURE = {"state": "observation.state", "action": "action", **{c: f"observation.images.{c}" for c in CAMS}}
#: Codes judged on message stamps live and on the timestamp column offline (frames within a row).
STAMP_CODES = {"duplicate_timestamp", "non_monotonic_clock"}


@pytest.fixture(scope="module")
def episodes() -> list[CorpusEpisode]:
    return corpus()


@pytest.fixture(scope="module")
def offline(tmp_path_factory, episodes):
    root = write_corpus(tmp_path_factory.mktemp("corpus") / "ds", episodes)
    return root, check_dataset(root)


@pytest.fixture(scope="module")
def live(tmp_path_factory, episodes):
    base = tmp_path_factory.mktemp("live")
    col = live_config(base)
    dw = DatasetWriter.open(base / "ds", fps=FPS, features=capture_features(col), robot_type="test")
    results = [feed_live(col, dw, ep) for ep in episodes]
    del dw
    gc.collect()  # releases .writer.lock (check --write opens its own writer)
    return base / "ds", results


def _matches(found: list[tuple[str, str, list[list[int]]]], ep: CorpusEpisode) -> list[str]:
    """The expected findings of ``ep`` that ``found`` lacks (code, stream and overlapping frames)."""
    missing = []
    for e in ep.expect:
        ok = any(code == e.code and stream.startswith(e.stream)
                 and (e.first < 0 or any(a <= e.last and b >= e.first for a, b in ranges))
                 for code, stream, ranges in found)
        if not ok:
            missing.append(f"{e.code} {e.stream} {e.first}-{e.last}")
    return missing


def _offline_found(chk, i) -> list[tuple[str, str, list[list[int]]]]:
    return [(f.code, f.stream, [list(r) for r in f.ranges]) for f in chk.episodes[i].findings]


def test_offline_finds_every_fault_with_its_frames_and_nothing_on_controls(offline, episodes):
    _, chk = offline
    assert [e.episode_index for e in chk.episodes] == list(range(len(episodes)))
    for i, ep in enumerate(episodes):
        found = _offline_found(chk, i)
        if ep.kind == "control":
            assert found == [], (ep.name, found)
            assert chk.episodes[i].quality == "green"
        else:
            assert _matches(found, ep) == [], (ep.name, found)
            assert chk.episodes[i].quality == "red", ep.name
            # one fault, reported once: no other rule fires on it
            assert {c for c, _, _ in found} == {e.code for e in ep.expect}, (ep.name, found)


def _live_found(res) -> list[tuple[str, str, list[list[int]]]]:
    return [(i["code"], FEATURE.get(i.get("stream", ""), i.get("stream", "")), i.get("ranges", []))
            for i in res.issues]


def _norm(found, stamps_as_timestamp: bool) -> set[tuple[str, str, tuple[tuple[int, int], ...]]]:
    out = set()
    for code, stream, ranges in found:
        if code in STAMP_CODES and stamps_as_timestamp:
            out.add((code, "timestamp", ()))  # one per stream live, on the table offline
        else:
            base = stream.split("[")[0] if code == "video_frame_count_mismatch" else stream
            out.add((code, base, tuple(tuple(r) for r in ranges)))
    return out


def test_live_and_offline_give_the_same_verdicts(offline, live, episodes):
    _, chk = offline
    _, results = live
    for i, ep in enumerate(episodes):
        res, off = results[i], chk.episodes[i]
        live_found, off_found = _live_found(res), _offline_found(chk, i)
        if ep.name == "off_grid":  # capture's rows are on the grid by construction
            assert res.quality == "green" and live_found == [] and ep.offline_only
            continue
        assert res.quality == off.quality, (ep.name, live_found, off_found)
        if ep.name == "timestamp_gap":
            # live sees the hole on the wire (the grid holds the last values over it)
            assert {c for c, _, _ in live_found} == {"dropped_frames", "missing_stream"}, live_found
            continue
        assert _norm(live_found, True) == _norm(off_found, True), (ep.name, live_found, off_found)
        for code, _, ranges in live_found:  # stamp rules: the row the receive clock puts it in
            if code in STAMP_CODES:
                first = next(r for c, _, r in off_found if c == code)[0][0]
                assert all(abs(r[0] - first) <= 1 for r in ranges), (ep.name, ranges, first)
        if not STAMP_CODES & {c for c, _, _ in off_found}:  # the aligner never places a repeated stamp
            assert res.rows == ep.rows, (ep.name, res.rows)
    print("\n" + rule_table(episodes, chk, results))


def rule_table(episodes: list[CorpusEpisode], chk, results) -> str:
    """Per rule: faults of its class found (offline / live) and false alarms on other episodes."""
    codes = sorted({e.code for ep in episodes for e in ep.expect})
    lines = [f"{'rule':<28}{'faults':>7}{'found off':>10}{'found live':>11}{'false off':>10}{'false live':>11}"]
    for code in codes:
        target = [i for i, ep in enumerate(episodes) if any(e.code == code for e in ep.expect)]
        off = [{c for c, _, _ in _offline_found(chk, i)} for i in range(len(episodes))]
        liv = [{c for c, _, _ in _live_found(r)} for r in results]
        lines.append(f"{code:<28}{len(target):>7}{sum(code in off[i] for i in target):>10}"
                     f"{sum(code in liv[i] for i in target):>11}"
                     f"{sum(code in off[i] for i in range(len(episodes)) if i not in target):>10}"
                     f"{sum(code in liv[i] for i in range(len(episodes)) if i not in target):>11}")
    controls = [i for i, ep in enumerate(episodes) if ep.kind == "control"]
    lines.append(f"controls: {len(controls)}, flags offline "
                 f"{sum(len(chk.episodes[i].findings) for i in controls)}, live "
                 f"{sum(len(results[i].issues) for i in controls)}")
    return "\n".join(lines)


# ---- --write and the sidecar ------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "eva_export.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_check_write_keeps_live_flags_adds_offline_ones_and_takes_the_writer_lock(live, episodes):
    root, _ = live
    before = [json.loads(x) for x in (root / "meta/episodes.jsonl").read_text().splitlines()]
    holder = DatasetWriter(root, read_info(root))
    refused = _cli("check", str(root), "--write")  # another process holds .writer.lock
    assert refused.returncode == 2 and "refused" in refused.stderr, refused.stderr
    del holder
    gc.collect()  # the writer's finalizer releases the lock
    for _ in range(2):  # a rerun replaces its own issues, never piles them up
        done = _cli("check", str(root), "--write")
        assert done.returncode == 1, done.stderr  # the corpus has red episodes
    rows = [json.loads(x) for x in (root / "meta/episodes.jsonl").read_text().splitlines()]
    assert len(rows) == len(before) == len(episodes)
    for old, new, ep in zip(before, rows, episodes, strict=True):
        live_issues = [i for i in new["quality_issues"] if i.get("source") == "live"]
        assert live_issues == old["quality_issues"], ep.name  # kept verbatim
        offline_codes = sorted(i["code"] for i in new["quality_issues"] if i.get("source") == "offline")
        assert len(offline_codes) == len(set((i["code"], i.get("stream")) for i in new["quality_issues"]
                                             if i.get("source") == "offline")), ep.name
        assert new["quality_rules"] == {"version": RULE_VERSION, "sources": ["live", "offline"],
                                        "live_quality": old["quality"]}
        assert new["quality"] == ("red" if old["quality"] == "red" or any(
            i["severity"] == "error" for i in new["quality_issues"]) else "green")
        for name, st in old["stream_stats"].items():  # capture's statistics stay beside the offline ones
            assert {k: v for k, v in new["stream_stats"][name].items() if k != "offline"} == st
        assert "offline" in new["stream_stats"]["action"]
        if ep.kind == "control":
            assert new["quality"] == "green" and new["quality_issues"] == [], (ep.name, new["quality_issues"])


def test_sidecar_rates_a_foreign_dataset_for_the_split_without_touching_its_files(tmp_path, episodes):
    from eva_export.export.split import split_dataset

    picked = [ep for ep in episodes if ep.name in ("sine_mid", "ramp", "action_spike", "nan_run")]
    root = write_corpus(tmp_path / "foreign", picked)
    # a dataset recorded elsewhere: rows without any quality field
    rows = [json.loads(x) for x in (root / "meta/episodes.jsonl").read_text().splitlines()]
    for r in rows:
        del r["corpus"]
    (root / "meta/episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert split_dataset(root, tmp_path / "before").unrated == [0, 1, 2, 3]
    meta_before = (root / "meta/episodes.jsonl").read_bytes()
    out = _cli("check", str(root), "--write", "--sidecar", "--json")
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert report["rule_version"] == RULE_VERSION and report["red"] == 2 and report["green"] == 2
    assert (root / "meta/episodes.jsonl").read_bytes() == meta_before
    side = [json.loads(x) for x in (root / "meta/eva_quality.jsonl").read_text().splitlines()]
    assert [(s["episode_index"], s["quality"]) for s in side] == [(0, "green"), (1, "green"), (2, "red"), (3, "red")]
    assert side[2]["quality_issues"][0]["ranges"] == [[119, 121]]
    res = split_dataset(root, tmp_path / "after")
    assert res.unrated == [] and res.subsets["accepted"].source_indices == [0, 1]
    assert res.subsets["rejected"].source_indices == [2, 3]


def test_check_text_output_names_episode_code_and_frames(tmp_path, episodes):
    root = write_corpus(tmp_path / "ds", [ep for ep in episodes if ep.name in ("ramp", "joint_stuck")])
    out = _cli("check", str(root))
    assert out.returncode == 1, out.stderr
    assert "episode    1: red" in out.stdout and "stuck_joint" in out.stdout and "frames 100-160" in out.stdout
    assert "1 red, 1 green" in out.stdout


# ---- the kinematic rules on their own ------------------------------------------------------------
def _run(x: np.ndarray) -> list[Finding]:
    t = np.arange(x.shape[0]) / FPS
    return evaluate(EpisodeEvidence(FPS, x.shape[0], t, (VectorSeries("action", x),)))


@pytest.mark.parametrize("freq", [0.05, 0.5, 2.0, 7.5, 11.0, 14.5])
@pytest.mark.parametrize("phase", [0.0, 1.1, 2.9])
def test_sinusoids_never_trip_a_rule(freq, phase):
    t = np.arange(N) / FPS
    x = np.stack([a * np.sin(2 * np.pi * freq * t + phase + j) for j, a in enumerate((1e-3, 0.1, 1.0, 30.0))], 1)
    assert _run(x.astype(np.float32).astype(np.float64)) == []


def test_idle_start_and_end_are_warnings_and_rest_is_nothing():
    t = np.arange(N) / FPS
    x = np.stack([np.sin(2 * np.pi * 0.4 * t + j) for j in range(3)], 1)
    x[:70], x[-65:] = x[70], x[-65]
    found = _run(x)
    assert [(f.code, f.severity, f.ranges) for f in found] == [
        ("idle_start", "warning", ((0, 70),)), ("idle_end", "warning", ((N - 65, N - 1),))]
    assert _run(np.full((N, 3), 0.25)) == []


@pytest.mark.parametrize("size", [0.05, 0.3, 2.0])
def test_spike_found_at_rest_and_in_motion_by_its_own_scale(size):
    t = np.arange(N) / FPS
    moving = np.stack([0.02 * np.sin(2 * np.pi * 0.2 * t), np.zeros(N)], 1)
    for j in (0, 1):
        x = moving.copy()
        x[77, j] += size
        found = _run(x)
        assert [(f.code, f.stream) for f in found] == [("spike", f"action[{j}]")], (size, j, found)
        assert any(a <= 77 <= b for a, b in found[0].ranges)


def test_sidecar_check_keeps_a_review_written_there(tmp_path, episodes):
    """One sidecar home (formats/common/sidecar.py): a check appended after a review merges field by
    field, so the operator's verdict and the check's quality both survive."""
    from eva_export.formats.common import sidecar

    root = write_corpus(tmp_path / "ds", [ep for ep in episodes if ep.name in ("ramp", "joint_stuck")])
    sidecar.append_review(root, [1], "pass", "checked by hand")
    out = _cli("check", str(root), "--write", "--sidecar", "--json")
    assert out.returncode == 1, out.stderr
    merged = sidecar.merged(root)
    assert merged[1]["qc_verdict"] == "pass" and merged[1]["note"] == "checked by hand"
    assert merged[1]["quality"] == "red" and merged[0]["quality"] == "green"
    assert [e.written_by for e in sidecar.read_entries(root)] == ["review", "check", "check"]
