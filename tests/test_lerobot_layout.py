"""Our v3 export against what LeRobot 0.4.4 and 0.6.1 write themselves, field by field.

The references are tiny datasets recorded with each release's own API
(tests/fixtures/lerobot-written/v30: 0.4.4; v30-061: 0.6.1, tools/make_lerobot_written.py).
Every difference between our layout and theirs is listed below with its reason; the test
computes the differences and requires them to be exactly that list, so a new one (ours or a
regenerated reference) fails until it is understood and documented here and in the README.
Both releases read our exports (tools/lerobot_reader_check.py, by hand: LeRobot is not a
dependency).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, make_subset

from eva_export.formats.lerobot_v3.exporter import LeRobotV3Exporter

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "lerobot-written"
CAM_REF, CAM_OURS = "observation.images.cam", "observation.images.cam0"
INDEX_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")

# The contract's additions, the same against both releases.
OURS_ONLY = {
    "info key dataset_format": "the contract names the format in info.json (0.6.1 warns 'Unknown fields', reads on)",
    "feature capture_time": "the capture's receive time of each row (a float64 feature of our recordings)",
    "episode column quality": "the automatic check's verdict, kept in the episode metadata",
    "episode column quality_issues": "the reasons of a red episode",
    "file README.md": "the dataset card (LeRobot writes it only when pushing to the hub)",
    "file meta/quality_split.json": "the quality split marker of the contract",
    "file meta/episodes.jsonl": "the v2.1 metadata the contract keeps in a v3 export (ignored by LeRobot)",
    "file meta/tasks.jsonl": "the same",
    "file meta/episodes_stats.jsonl": "the same",
}
# What 0.6.1 writes and our export (which follows 0.4.4 there) does not; 0.6.1 reads ours.
RELEASE_ONLY = {
    "v30": {},
    "v30-061": {
        "camera info video.is_depth_map vs is_depth_map": "0.6.1 moved the key out of the video.* group; "
        "we keep 0.4.4's name, which 0.4.4 needs and 0.6.1 still reads",
        "camera info video.crf, video.extra_options, video.fast_decode, video.g, video.preset, "
        "video.video_backend": "0.6.1 records its own encoder's settings; a stream-copied export did not "
        "encode, so it has none to record",
        "episode stats of index columns min/max int64 vs double": "0.6.1 writes the min/max of integer "
        "index columns as double; we keep the column's own dtype, as 0.4.4 does (both read either)",
    },
}


def our_export(tmp_path: Path) -> Path:
    src = make_subset(tmp_path / "src", [Ep(frames=8, task="pick the cube"), Ep(frames=6, task="place the cube")],
                      "accepted", cameras=1)
    out = tmp_path / "out"
    LeRobotV3Exporter().export(src, out)
    return out


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)).replace(CAM_OURS, CAM_REF) for p in root.rglob("*") if p.is_file()}


def differences(ours: Path, ref: Path) -> set[str]:
    """Each way our export differs from the reference, named as in the tables above."""
    diff: set[str] = set()
    oi, ri = (json.loads((d / "meta/info.json").read_text()) for d in (ours, ref))
    diff |= {f"info key {k}" for k in set(oi) ^ set(ri)}
    diff |= {f"info {k}" for k in ri if k in oi and k not in ("features", "total_episodes", "total_frames",
                                                                "total_tasks", "fps", "robot_type", "splits")
             and oi[k] != ri[k]}
    of, rf = oi["features"], ri["features"]
    diff |= {f"feature {k}" for k in set(of) ^ set(rf) if k not in (CAM_OURS, CAM_REF)}
    for k in ("observation.state", "action", *INDEX_FEATURES):
        if (of[k]["dtype"], of[k]["shape"]) != (rf[k]["dtype"], rf[k]["shape"]):
            diff.add(f"feature {k} dtype/shape")
    oc, rc = of[CAM_OURS], rf[CAM_REF]
    if {k: oc[k] for k in ("dtype", "shape", "names")} != {k: rc[k] for k in ("dtype", "shape", "names")}:
        diff.add("camera feature block")
    extra = sorted(set(rc["info"]) - set(oc["info"]) - {"is_depth_map"})
    if "is_depth_map" in rc["info"] and "video.is_depth_map" in oc["info"]:
        diff.add("camera info video.is_depth_map vs is_depth_map")
    if extra:
        diff.add("camera info " + ", ".join(extra))
    if set(oc["info"]) - set(rc["info"]) - {"video.is_depth_map"}:
        diff.add("camera info keys only ours")
    diff |= episode_columns(ours, ref) | data_columns(ours, ref)
    diff |= {f"file {f}" for f in files(ours) ^ files(ref)}
    return diff


def episode_columns(ours: Path, ref: Path) -> set[str]:
    rel = "meta/episodes/chunk-000/file-000.parquet"
    os_, rs = pq.read_schema(ours / rel), pq.read_schema(ref / rel)
    names = {n.replace(CAM_OURS, CAM_REF): n for n in os_.names}
    diff = {f"episode column {n}" for n in set(names) - set(rs.names)
            if not n.startswith("stats/capture_time/")}  # capture_time's stats come with the feature
    diff |= {f"episode column {n} missing" for n in set(rs.names) - set(names)}
    index_types = set()
    for f in rs:
        if f.name in names and os_.field(names[f.name]).type != f.type:
            feature = f.name.split("/")[1] if f.name.startswith("stats/") else ""
            if feature in INDEX_FEATURES and f.name.endswith(("/min", "/max")):
                index_types.add(f"{os_.field(names[f.name]).type.value_type} vs {f.type.value_type}")
            else:
                diff.add(f"episode column {f.name} type")
    diff |= {f"episode stats of index columns min/max {t}" for t in index_types}
    return diff


def data_columns(ours: Path, ref: Path) -> set[str]:
    rel = "data/chunk-000/file-000.parquet"
    od, rd = pq.read_schema(ours / rel), pq.read_schema(ref / rel)
    diff = {f"data column {n} missing" for n in set(rd.names) - set(od.names)}
    diff |= {f"data column {f.name} type" for f in rd if f.name in od.names and od.field(f.name).type != f.type}
    return diff | {f"feature {n}" for n in set(od.names) - set(rd.names) if n != "capture_time"}


@pytest.mark.parametrize("release", sorted(RELEASE_ONLY))
def test_every_difference_from_lerobots_own_layout_is_a_documented_one(tmp_path: Path, release: str) -> None:
    ref = FIXTURES / release
    assert json.loads((ref / "meta/info.json").read_text())["codebase_version"] == "v3.0"
    got = differences(our_export(tmp_path), ref)
    want = set(OURS_ONLY) | set(RELEASE_ONLY[release])
    assert got == want, {"undocumented": sorted(got - want), "documented but gone": sorted(want - got)}


def test_the_comparison_sees_a_difference_we_did_not_document(tmp_path: Path) -> None:
    """The comparison itself can fail: a dropped Parquet column and a changed key are caught."""
    out = our_export(tmp_path)
    info = json.loads((out / "meta/info.json").read_text())
    info["chunks_size"] = 7
    (out / "meta/info.json").write_text(json.dumps(info))
    table = pq.read_table(out / "data/chunk-000/file-000.parquet")
    pq.write_table(table.drop_columns(["frame_index"]), out / "data/chunk-000/file-000.parquet")
    got = differences(out, FIXTURES / "v30")
    assert {"info chunks_size", "data column frame_index missing"} <= got - set(OURS_ONLY)
