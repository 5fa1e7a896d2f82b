"""The export node's ``~/check``: the quality rules over ROS, on a real node process.

Real datasets (the fault corpus written as v2.1 through the project's writer; LeRobot 0.4.4's own
v3.0 output with a NaN run injected into its shared Parquet), real readers, real service calls.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from eva_export_interfaces.srv import CheckDataset, GetJob
from quality_corpus import corpus, write_corpus

from eva_export import faults
from eva_export.formats.common import sidecar
from eva_export.formats.common.table import to_numpy
from eva_export.quality.rules import RULE_VERSION

pytestmark = pytest.mark.timeout(300)
V30 = Path(__file__).resolve().parent / "fixtures" / "lerobot-written" / "v30"
V30_DATA = "data/chunk-000/file-000.parquet"
V30_EPISODES = "meta/episodes/chunk-000/file-000.parquet"
PICKED = ("sine_mid", "frozen_action", "held_gripper")  # control, fault, control
CALL_TIMEOUT = 120.0


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def set_nan(path: Path, column: str, rows: slice) -> None:
    table = pq.read_table(path)
    col = table.column(column)
    values = to_numpy(col).astype(np.float64)
    values[rows] = np.nan
    typ = col.type
    arr = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), typ.value_type), typ.list_size)
    pq.write_table(table.set_column(table.schema.get_field_index(column), table.schema.field(column), arr), path)


def check(ros_client, node, dataset: str, write: bool = False, sidecar_: bool = False):  # type: ignore[no-untyped-def]
    return ros_client.call(CheckDataset, node.service("check"),
                           CheckDataset.Request(dataset=dataset, write=write, sidecar=sidecar_), timeout=CALL_TIMEOUT)


def verdicts(reply) -> list[tuple[int, str, list[str]]]:  # type: ignore[no-untyped-def]
    return [(e.episode_index, e.quality, list(e.reason_codes)) for e in reply.episodes]


@pytest.fixture
def datasets(tmp_path: Path) -> dict[str, Path]:
    log_dir = tmp_path / "datasets"  # the config_file fixture's log_dir: the default data root
    eps = [e for e in corpus() if e.name in PICKED]
    assert [e.name for e in eps] == ["sine_mid", "held_gripper", "frozen_action"]
    v21 = write_corpus(log_dir / "demo" / "raw", eps)
    v30 = log_dir / "lerobot" / "v30"
    shutil.copytree(V30, v30)
    first = pq.read_table(v30 / V30_EPISODES).to_pylist()[1]["dataset_from_index"]
    set_nan(v30 / V30_DATA, "observation.state", slice(first + 3, first + 7))
    outside = tmp_path / "elsewhere" / "raw"
    shutil.copytree(v21, outside)
    return {"v21": v21, "v30": v30, "outside": outside, "log_dir": log_dir}


def test_check_through_the_node(node_factory, ros_client, config_file, datasets) -> None:
    node = node_factory("export_node", params={"config_file": str(config_file)})
    ros_client.wait_for_services([node.service("check")], procs=[node])
    v21 = datasets["v21"]
    before = digest(v21)

    # by name (<log_dir>/demo/raw): the faulty episode red with its code, the controls green
    r = check(ros_client, node, "demo")
    assert r.success, r.message
    assert r.dataset_dir == str(v21) and r.source_kind == "lerobot_v21" and r.rule_version == RULE_VERSION
    assert verdicts(r) == [(0, "green", []), (1, "green", []), (2, "red", ["frozen_signal"])]
    assert (r.red, r.green, r.written) == (1, 2, "")
    assert digest(v21) == before  # without write nothing changes

    # the same by absolute path, with write: into the rows (the offline issue marked as such)
    r = check(ros_client, node, str(v21), write=True)
    assert r.success and r.written.startswith("3 rows of "), r.message
    rows = [json.loads(x) for x in (v21 / "meta/episodes.jsonl").read_text().splitlines()]
    assert [x["quality"] for x in rows] == ["green", "green", "red"]
    assert [(i["code"], i["source"]) for i in rows[2]["quality_issues"]] == [("frozen_signal", "offline")]
    assert rows[2]["quality_rules"]["version"] == RULE_VERSION
    assert not (v21 / sidecar.SIDECAR).exists()

    # v3.0 written by LeRobot 0.4.4: the NaN episode red; write goes to the sidecar only
    v30 = datasets["v30"]
    own = digest(v30)
    r = check(ros_client, node, str(v30), write=True)
    assert r.success, r.message
    assert r.source_kind == "lerobot_v30" and verdicts(r) == [(0, "green", []), (1, "red", ["non_finite"])]
    assert r.written == f"sidecar {v30 / sidecar.SIDECAR}"
    assert {k: v for k, v in digest(v30).items() if k != sidecar.SIDECAR} == own
    assert {i: v["quality"] for i, v in sidecar.merged(v30).items()} == {0: "green", 1: "red"}
    assert node.alive, node.log_tail()


def test_check_refuses_what_is_not_inside_the_roots(node_factory, ros_client, config_file, datasets) -> None:
    node = node_factory("export_node", params={"config_file": str(config_file)})
    ros_client.wait_for_services([node.service("check")], procs=[node])
    outside, log_dir = datasets["outside"], datasets["log_dir"]
    before = digest(outside)
    link = log_dir / "escape"
    os.symlink(outside.parent, link)  # inside the root lexically, outside after the symlink
    export_tree = log_dir / "demo" / "export" / "lerobot_v21" / "accepted"
    shutil.copytree(datasets["v21"], export_tree)
    (export_tree / "meta" / "quality_split.json").write_text("{}")
    hostile = log_dir / "hostile" / "raw"  # inside the roots, its info.json pointing out
    shutil.copytree(datasets["v21"], hostile)
    info = json.loads((hostile / "meta/info.json").read_text())
    info["video_path"] = "videos/../../../../elsewhere/raw/videos/chunk-000/{video_key}/episode_{episode_index:06d}.mp4"
    (hostile / "meta/info.json").write_text(json.dumps(info))
    broken = log_dir / "broken" / "raw"  # a truncated Parquet file: named, not a crash
    shutil.copytree(datasets["v21"], broken)
    table = broken / "data/chunk-000/episode_000001.parquet"
    table.write_bytes(table.read_bytes()[:200])
    cases = [
        ("hostile", True, "video_path"),
        ("broken", True, "episode 1: cannot read "),  # the file named: checked below
        (str(outside), True, "outside the export data roots"),
        (str(link / "raw"), True, "outside the export data roots"),
        (str(log_dir / "demo" / ".." / ".." / "elsewhere" / "raw"), False, "outside the export data roots"),
        ("escape", False, "outside"),  # a name whose directory is the symlink
        ("../elsewhere", False, "must be an absolute path"),
        ("demo/raw", False, "must be an absolute path"),
        ("", False, "dataset is required"),
        ("x" * 300, False, "characters long"),
        ("/" + "y" * 300, False, "too long"),
        (str(log_dir / "missing"), False, "not a directory"),
        (str(export_tree), True, "is an export"),
    ]
    for dataset, write, why in cases:
        r = check(ros_client, node, dataset, write=write)
        assert not r.success and why in r.message, (dataset[:60], r.message)
        assert r.episodes == [] and len(r.message) <= 400
        if dataset == "broken":
            assert "broken/raw/data/chunk-000/episode_000001.parquet" in r.message, r.message
    assert digest(outside) == before and not (outside / sidecar.SIDECAR).exists()
    assert not (export_tree / sidecar.SIDECAR).exists()
    assert "quality_rules" not in (broken / "meta/episodes.jsonl").read_text()  # nothing half-written
    r = check(ros_client, node, str(export_tree))  # reading an export is fine: only writing is refused
    assert r.success and verdicts(r)[2] == (2, "red", ["frozen_signal"]), r.message
    assert node.alive, node.log_tail()


@pytest.mark.parametrize(("param", "why"), [("check_max_bytes", "MiB in 15 files, over this service's bound"),
                                           ("check_max_frames", "has 1440 video frames to decode, over")])
def test_check_over_a_bound_is_refused(node_factory, ros_client, config_file, datasets, param, why) -> None:
    node = node_factory("export_node", params={"config_file": str(config_file), param: 1000})
    ros_client.wait_for_services([node.service("check")], procs=[node])
    r = check(ros_client, node, "demo", write=True)
    assert not r.success and why in r.message and "eva-export check" in r.message, r.message
    assert "quality_rules" not in (datasets["v21"] / "meta/episodes.jsonl").read_text()  # nothing written


def test_a_running_check_leaves_the_other_services_answering(node_factory, ros_client, config_file, datasets,
                                                            tmp_path) -> None:
    hold = tmp_path / "hold"
    hold.mkdir()
    os.mkfifo(hold / "release")
    node = node_factory("export_node", params={"config_file": str(config_file)},
                        env=faults.env(check_hold=str(hold)))
    ros_client.wait_for_services([node.service("check"), node.service("get_job")], procs=[node])
    # the held call on a client of its own (another fleet tool); the others on the cached one
    client = ros_client.node.create_client(CheckDataset, node.service("check"))
    assert client.wait_for_service(timeout_sec=CALL_TIMEOUT)
    held = client.call_async(CheckDataset.Request(dataset="demo"))
    end = time.monotonic() + CALL_TIMEOUT  # wait for a condition (the hook reached), not a time
    while not (hold / "started").exists():
        assert time.monotonic() < end and node.alive, node.log_tail()
        ros_client.spin_for(0.05)
    # the held check occupies one executor thread: the job service still answers
    job = ros_client.call(GetJob, node.service("get_job"), GetJob.Request(job_id=""))
    assert not job.success and job.message == "no job yet"
    busy = check(ros_client, node, "demo")
    assert not busy.success and "another check is running" in busy.message
    assert not held.done()
    with open(hold / "release", "wb"):
        pass  # the hook's open returns: the held check goes on
    end = time.monotonic() + CALL_TIMEOUT
    while not held.done():
        assert time.monotonic() < end, node.log_tail()
        ros_client.spin_for(0.05)
    r = held.result()
    assert r.success and verdicts(r)[2] == (2, "red", ["frozen_signal"]), r.message
    again = check(ros_client, node, "demo")  # the lock is released once the first answered
    assert again.success and verdicts(again) == verdicts(r)
    ros_client.node.destroy_client(client)
