"""Hostile LeRobot v3.0 sources (paths out of the dataset, timestamps outside the video,
missing files, broken metadata) are refused naming the source file and episode, before anything
is written; the source tree stays byte-identical."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from test_sources import CAM, SHARD, V30, copy_source, service, tree_digest

from eva_export.fsutil import read_json
from eva_export.jobs import COMPLETED

# ---- hostile v3.0 sources -------------------------------------------------------------------------
EPISODES_META = "meta/episodes/chunk-000/file-000.parquet"


def edit_episodes(fn: Any) -> Any:
    def mutate(raw: Path) -> None:
        t = pq.read_table(raw / EPISODES_META)
        rows = t.to_pylist()
        fn(rows)
        pq.write_table(t.from_pylist(rows, schema=t.schema), raw / EPISODES_META)
    return mutate


def set_ep(i: int, **cols: Any) -> Any:
    return edit_episodes(lambda rows: rows[i].update({k.replace("__", "/"): v for k, v in cols.items()}))


def set_info(**kw: Any) -> Any:
    def mutate(raw: Path) -> None:
        (raw / "meta/info.json").write_text(json.dumps({**read_json(raw / "meta/info.json"), **kw}))
    return mutate


def link_out(rel: str) -> Any:
    def mutate(raw: Path) -> None:
        outside = raw.parent.parent / "outside" / Path(rel).name
        outside.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(raw / rel, outside)
        os.symlink(outside, raw / rel)
    return mutate


def remove(rel: str) -> Any:
    return lambda raw: (raw / rel).unlink()


FROM, TO = f"videos/{CAM}/from_timestamp", f"videos/{CAM}/to_timestamp"
HOSTILE = {
    "data_path_dotdot": (set_info(data_path="data/../../x/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"),
                         ("info.json", "data_path", "'..'")),
    "video_path_absolute": (set_info(video_path="/tmp/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"),
                            ("info.json", "video_path", "relative")),
    "data_symlinked_out": (link_out("data/chunk-000/file-000.parquet"), ("episode 0", "file-000.parquet", "outside")),
    "video_symlinked_out": (link_out(SHARD), ("episode 0", "file-000.mp4", "outside")),
    "episodes_meta_symlinked_out": (link_out(EPISODES_META), ("file-000.parquet", "outside")),
    "to_past_the_video": (set_ep(1, **{FROM.replace("/", "__"): 7.5, TO.replace("/", "__"): 9.0}),
                          ("episode 1", "file-000.mp4", "past the end", EPISODES_META)),
    "from_to_span_wrong": (set_ep(1, **{TO.replace("/", "__"): 3.4}), ("episode 1", "spans 14 frames", "15 rows")),
    "from_off_grid": (set_ep(1, **{FROM.replace("/", "__"): 2.03}), ("episode 1", "off the 10 fps frame grid")),
    "from_negative": (set_ep(1, **{FROM.replace("/", "__"): -1.0}), ("episode 1", "from_timestamp", "-1.0")),
    "video_missing": (remove(SHARD), ("episode 0", "camera file", "file-000.mp4", "missing")),
    "data_file_missing": (set_ep(1, data__file_index=5), ("episode 1", "file-005.parquet", "missing")),
    "data_range_wrong": (set_ep(1, dataset_from_index=19), ("episode 1", "dataset_from_index", EPISODES_META)),
    "tasks_missing": (remove("meta/tasks.parquet"), ("tasks.parquet", "missing")),
    "task_unknown": (set_ep(0, tasks=["juggle"]), ("episode 0", "juggle", "tasks.parquet")),
    "episodes_meta_missing": (remove(EPISODES_META), ("codebase_version is 'v3.0'", "meta/episodes")),
    "episode_order": (edit_episodes(lambda rows: rows.reverse()), ("episode indices", "episode 1")),
    "chunk_negative": (set_ep(0, data__chunk_index=-1), ("episode 0", "data/chunk_index", "-1")),
    "stray_file": (lambda raw: shutil.copy(raw / SHARD, raw / f"videos/{CAM}/chunk-000/file-001.mp4"),
                   ("file-001.mp4", "belong to no episode")),
    "mp4_truncated": (lambda raw: os.truncate(raw / SHARD, (raw / SHARD).stat().st_size // 2),
                      ("episode 0", "file-000.mp4", "not a complete MP4")),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_v30_source_is_refused(tmp_path: Path, name: str) -> None:
    mutate, expect = HOSTILE[name]
    src = copy_source(tmp_path, V30)
    mutate(src)
    before = tree_digest(src)
    job = service(tmp_path).run(src, "lerobot_v21")
    assert job.state != COMPLETED, f"{name} was exported"
    for want in expect:
        assert want in job.error, f"{name}: {want!r} not in {job.error!r}"
    assert tree_digest(src) == before
    assert not (tmp_path / "data" / "v30_export").exists() or not any(
        (tmp_path / "data" / "v30_export").rglob("accepted"))
