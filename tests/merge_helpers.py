"""Helpers of tests/test_export_merge.py: three robots' raw datasets, each format's own reader
returning the episodes with their provenance, and the source kinds a v2.1 dataset converts to."""

from __future__ import annotations

import glob
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import h5py
import msgpack
import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
from dsfactory import Ep, make_dataset

from eva_export.config import Config, parse_config
from eva_export.export.records import QualitySplit
from eva_export.formats.common.meta import read_meta
from eva_export.formats.common.records import Feature
from eva_export.formats.common.table import to_numpy
from eva_export.formats.eva_store import open_store
from eva_export.formats.lerobot_v21.writer import DatasetWriter, make_features

PICK, PLACE, WIPE = "pick the cube", "place the cube", "wipe the table"


def robots(root: Path) -> list[Path]:
    """Three robots' days: r2 lists its tasks in another order than r1 (remapping), r2:2 is red
    but passed by an operator, r3:0 green but failed."""
    r1 = make_dataset(root / "r1" / "raw", [Ep(20, task=PICK, extra={"day": "2026-11-01"}),
                                             Ep(21, "red", task=PLACE, extra={"day": "2026-11-01"}),
                                             Ep(22, task=PICK, extra={"day": "2026-11-01"})])
    r2 = make_dataset(root / "r2" / "raw", [Ep(23, task=PLACE, extra={"day": "2026-11-02"}),
                                             Ep(24, task=WIPE, extra={"day": "2026-11-02"}),
                                             Ep(25, "red", verdict="pass", task=PICK, extra={"day": "2026-11-02"})])
    r3 = make_dataset(root / "r3" / "raw", [Ep(26, task=WIPE, verdict="fail", extra={"day": "2026-11-03"}),
                                             Ep(27, task=PICK, extra={"day": "2026-11-03"})])
    return [r1, r2, r3]


ACCEPTED = [(0, 0), (0, 2), (1, 0), (1, 1), (1, 2), (2, 1)]  # (robot, source episode), in output order
REJECTED = [(0, 1), (2, 0)]


def config(root: Path) -> Config:
    return parse_config({"collection": {"log_dir": str(root)}, "export": {"workers": 1}})


@dataclass(frozen=True)
class SourceEp:
    dataset: str
    index: int
    task: str
    state: np.ndarray
    length: int


def source_episode(src: Path, index: int) -> SourceEp:
    meta = read_meta(src)
    table = pq.read_table(meta.data_path(index))
    task = meta.task_text[int(to_numpy(table.column("task_index"))[0])]
    return SourceEp(str(src.resolve()), index, task, to_numpy(table.column("observation.state")), table.num_rows)


@dataclass(frozen=True)
class ReadEp:
    """One output episode as its format's reader gives it back."""

    dataset: str
    index: int
    task: str
    state: np.ndarray


def read_v21(d: Path) -> list[ReadEp]:
    meta = read_meta(d)
    out = []
    for row in meta.episodes:
        i = row.episode_index
        table = pq.read_table(d / meta.info.data_file(i))
        assert to_numpy(table.column("episode_index")).tolist() == [i] * row.length
        with av.open(str(d / meta.info.video_file("observation.images.cam0", i))) as c:
            assert sum(1 for _ in c.decode(video=0)) == row.length  # PyAV: every frame there
        task = meta.task_text[int(to_numpy(table.column("task_index"))[0])]
        out.append(ReadEp(row.extra["source_dataset"], row.extra["source_episode_index"], task,
                          to_numpy(table.column("observation.state"))))
    return out


def read_v3(d: Path) -> list[ReadEp]:
    eps = pq.read_table(sorted(glob.glob(str(d / "meta/episodes/*/*.parquet")))).to_pylist()
    t = pq.read_table(d / "meta/tasks.parquet").to_pydict()
    text = dict(zip(t["task_index"], t["task"], strict=True))
    out = []
    for e in eps:
        data = pq.read_table(d / f"data/chunk-{e['data/chunk_index']:03d}/file-{e['data/file_index']:03d}.parquet")
        rows = data.filter(pc.equal(data.column("episode_index"), e["episode_index"]))
        assert to_numpy(rows.column("index")).tolist() == list(range(e["dataset_from_index"], e["dataset_to_index"]))
        task = text[int(to_numpy(rows.column("task_index"))[0])]
        out.append(ReadEp(e["source_dataset"], e["source_episode_index"], task,
                          to_numpy(rows.column("observation.state"))))
    frames = 0
    cam = read_meta(d).info.video_keys[0]
    for f in sorted(glob.glob(str(d / f"videos/{cam}/*/*.mp4"))):
        with av.open(f) as c:
            frames += sum(1 for _ in c.decode(video=0))
    assert frames == sum(len(e.state) for e in out)
    return out


def _h5_items(group: Any) -> dict[str, Any]:
    items = {}
    for item in group.values():
        value = item["value"][()]
        kind = item.attrs["kind"]
        if kind == "string":
            value = value.decode() if isinstance(value, bytes) else str(value)
        elif kind == "msgpack":
            value = msgpack.unpackb(bytes(np.asarray(value).tobytes()), raw=False)
        items[item.attrs["key"]] = value
    return items


def read_hdf5(d: Path) -> list[ReadEp]:
    tasks = [json.loads(line)["task"] for line in (d / "meta/tasks.jsonl").read_text().splitlines()]
    out = []
    for f in sorted(glob.glob(str(d / "data/*/*.hdf5"))):
        with h5py.File(f, "r") as h:
            meta, cols = _h5_items(h["metadata"]), _h5_items(h["columns"])
        out.append(ReadEp(meta["source_dataset"], int(meta["source_episode_index"]),
                          tasks[int(np.asarray(cols["task_index"]).reshape(-1)[0])], np.asarray(cols["observation.state"])))
    return out


def read_mcap(d: Path) -> list[ReadEp]:
    from mcap.reader import make_reader

    tasks = [json.loads(line)["task"] for line in (d / "meta/tasks.jsonl").read_text().splitlines()]
    out = []
    for f in sorted(glob.glob(str(d / "data/*/*.mcap"))):
        with open(f, "rb") as fh:
            msgs = [m.data for _, c, m in make_reader(fh, validate_crcs=True).iter_messages() if c.topic == "episode"]
        payload = msgpack.unpackb(msgs[0], raw=False)
        meta, cols = payload["metadata"], payload["columns"]
        out.append(ReadEp(meta["source_dataset"], meta["source_episode_index"], tasks[int(cols["task_index"][0])],
                          np.asarray(cols["observation.state"], np.float32)))
    return out


def read_store(d: Path) -> list[ReadEp]:
    rows = [json.loads(line) for line in (d / "meta/episodes.jsonl").read_text().splitlines()]
    store = open_store(d)
    out = []
    for ep in store.episodes:
        samples = list(store.episode(ep))
        out.append(ReadEp(rows[ep]["source_dataset"], rows[ep]["source_episode_index"], samples[0]["task"],
                          np.stack([s["observation.state"] for s in samples])))
    return out


READERS = {"lerobot_v21": read_v21, "lerobot_v3": read_v3, "hdf5": read_hdf5, "mcap": read_mcap,
           "eva_store": read_store}


def check_against_sources(got: list[ReadEp], sources: list[Path], want: list[tuple[int, int]]) -> None:
    assert [(e.dataset, e.index) for e in got] == [(str(sources[r].resolve()), i) for r, i in want]
    for e, (r, i) in zip(got, want, strict=True):
        src = source_episode(sources[r], i)
        assert e.task == src.task
        np.testing.assert_allclose(e.state, src.state, rtol=0, atol=1e-6)


def write_custom(root: Path, state_dim: int) -> Path:
    """A raw dataset like dsfactory's but with a ``state_dim``-wide observation.state."""
    names = [f"joint_{i}" for i in range(state_dim)]
    feats = make_features({"observation.state": Feature("float32", (state_dim,), names),
                           "action": Feature("float32", (6,), [f"joint_{i}" for i in range(6)]),
                           "capture_time": Feature("float64", (1,), None),
                           "observation.images.cam0": Feature.video(48, 64, 30),
                           "observation.images.cam1": Feature.video(48, 64, 30)})
    dw = DatasetWriter.open(root, fps=30, features=feats, robot_type="test")
    w = dw.begin_episode(PICK)
    for f in range(20):
        w.add_frame({"observation.state": np.full(state_dim, f, np.float32), "action": np.zeros(6, np.float32),
                     "capture_time": 1000.0 + f / 30},
                    {f"observation.images.cam{c}": np.full((48, 64, 3), 8 * f, np.uint8) for c in range(2)})
    w.finish()
    dw.commit(w, {"quality": "green", "quality_issues": []})
    return root


def as_v20(v21: Path, dst: Path) -> Path:
    """The dataset as an older LeRobot's v2.0 (no per-episode statistics, no quality fields)."""
    shutil.copytree(v21, dst)
    (dst / "meta/episodes_stats.jsonl").unlink()
    info = json.loads((dst / "meta/info.json").read_text())
    (dst / "meta/info.json").write_text(json.dumps({**info, "codebase_version": "v2.0"}))
    rows = [json.loads(x) for x in (dst / "meta/episodes.jsonl").read_text().splitlines()]
    (dst / "meta/episodes.jsonl").write_text(
        "".join(json.dumps({k: r[k] for k in ("episode_index", "tasks", "length")}) + "\n" for r in rows))
    return dst


def as_v30(v21: Path, dst: Path) -> Path:
    """The dataset as LeRobot 0.4.x's v3.0 (shared Parquet and MP4 files), without our extras."""
    from eva_export.formats.lerobot_v3.exporter import LeRobotV3Exporter

    meta = read_meta(v21)
    QualitySplit(str(v21), "accepted", "lerobot_v21", [e.episode_index for e in meta.episodes]).write(v21)
    LeRobotV3Exporter().export(v21, dst)
    (v21 / "meta/quality_split.json").unlink()
    for name in ("quality_split.json", "episodes.jsonl", "tasks.jsonl", "episodes_stats.jsonl", "README.md"):
        (dst / "meta" / name).unlink(missing_ok=True)
    (dst / "README.md").unlink(missing_ok=True)
    eps = dst / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(eps)
    keep = ("episode_index", "tasks", "length", "data/", "dataset_", "videos/", "stats/", "meta/episodes/")
    pq.write_table(table.select([c for c in table.column_names if c.startswith(keep)]), eps)
    return dst
