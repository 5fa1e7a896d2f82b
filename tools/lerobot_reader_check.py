#!/usr/bin/env python3
"""Prove with LeRobot's OWN reader that a dataset loads and returns the right frames.

Run it with the python of a LeRobot venv made by tools/lerobot_venvs.sh:

    /tmp/lerobot033/bin/python tools/lerobot_reader_check.py --version-expect v2.1 --root DIR
    /tmp/lerobot044/bin/python tools/lerobot_reader_check.py --version-expect v3.0 --root DIR

It loads ``LeRobotDataset(repo_id, root=DIR)`` offline and compares what LeRobot returns with
the dataset's files read independently (metadata with json/pyarrow, data with pyarrow, video
with our own PyAV decode), for every episode:

  schema        each Parquet column's Arrow type is the dtype/shape info.json declares (LeRobot
                casts to the declared type on load, which would hide a mismatch from "values")
  length        LeRobot's frame range of the episode == episodes metadata length == our rows
  values        every non-video feature (state, action, extra columns...) of every frame, as
                returned by LeRobot, equals our Parquet (exactly, in our dtype)
  float64 precision
                LeRobot returns float64 features (our capture_time) as float32; the error that
                costs must stay within --float64-atol (default 1e-3)
  timestamps    timestamp equals our Parquet and frame_index / fps (within 1e-4 s)
  indices       index, episode_index, frame_index, task_index and the task string at the
                sampled frames
  frames        the camera frame LeRobot decodes at the first, middle and last frame of each
                episode (``--every-frame``: all) matches our PyAV decode of the MP4 at that
                frame: mean abs diff < 3 levels in every colour channel (``--max-mean-diff``)
  source        (v3.0 with ``--source V21DIR``, or meta/quality_split.json naming a readable
                source_dir) values and frames also match the source v2.1 episode they came from

Prints a summary; exits 0 when everything passed, 1 on any mismatch, 2 when LeRobot could not
load the dataset at all (the traceback's key line is printed) or the version is not the
expected one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np
import pyarrow.parquet as pq

# --------------------------------------------------------------------------------------------
# results


@dataclass
class Check:
    name: str
    passed: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)
    worst: float = 0.0  # largest measured difference, where one is measured

    def ok(self, n: int = 1) -> None:
        self.passed += n

    def fail(self, msg: str) -> None:
        self.failed += 1
        if len(self.failures) < 20:
            self.failures.append(msg)


class Results:
    def __init__(self) -> None:
        self.checks: dict[str, Check] = {}

    def __getitem__(self, name: str) -> Check:
        if name not in self.checks:
            self.checks[name] = Check(name)
        return self.checks[name]

    @property
    def failed(self) -> int:
        return sum(c.failed for c in self.checks.values())


# --------------------------------------------------------------------------------------------
# LeRobot import (torchvision shim) and version-independent accessors


def import_lerobot() -> tuple[Any, str]:
    import importlib.metadata as md

    import torch

    # The torchvision wheel available here is a CUDA build: on CPU torch (the 0.4.4 venv) its
    # import fails with "operator torchvision::nms does not exist" unless these op schemas
    # exist. LeRobot's dataset code never calls them. A matching torchvision (the CUDA torch of
    # the 0.6.1 venv) registers them itself, and a schema defined before it aborts the process.
    if "+cpu" in torch.__version__:
        try:
            lib = torch.library.Library("torchvision", "FRAGMENT")
            lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            import_lerobot._lib = lib  # type: ignore[attr-defined]  # keep the registration alive
        except RuntimeError:
            pass  # already defined (a working torchvision build)
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset, md.version("lerobot")


def versions() -> str:
    import importlib.metadata as md

    out = []
    for p in ("lerobot", "torch", "torchvision", "torchcodec", "datasets", "av", "pyarrow"):
        try:
            out.append(f"{p} {md.version(p)}")
        except md.PackageNotFoundError:
            pass
    return ", ".join(out)


def lerobot_episode_ranges(ds: Any) -> dict[int, tuple[int, int]]:
    """Episode -> [from, to) global frame range, as LeRobot itself holds it."""
    edi = getattr(ds, "episode_data_index", None)
    if edi is not None:  # 0.3.x
        eps = sorted(ds.meta.episodes) if ds.episodes is None else list(ds.episodes)
        frm = [int(x) for x in edi["from"]]
        to = [int(x) for x in edi["to"]]
        return {ep: (frm[i], to[i]) for i, ep in enumerate(eps)}
    meta_eps = ds.meta.episodes  # 0.4.x: a datasets.Dataset, one row per episode
    return {int(e): (int(f), int(t)) for e, f, t in zip(meta_eps["episode_index"],
                                                        meta_eps["dataset_from_index"],
                                                        meta_eps["dataset_to_index"], strict=False)}


def lerobot_episode_lengths(ds: Any) -> dict[int, int]:
    eps = ds.meta.episodes
    if isinstance(eps, dict):  # 0.3.x: {episode_index: {"length": ...}}
        return {int(k): int(v["length"]) for k, v in eps.items()}
    return {int(e): int(n) for e, n in zip(eps["episode_index"], eps["length"], strict=False)}


def to_np(x: Any) -> np.ndarray:
    if hasattr(x, "numpy"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


# --------------------------------------------------------------------------------------------
# our side: metadata, Parquet and PyAV, read without LeRobot


def decode_png(data: bytes) -> np.ndarray:
    """An image stored in Parquet, decoded with PyAV (independent of LeRobot's PIL path)."""
    import av

    return av.CodecContext.create("png", "r").decode(av.Packet(data))[0].to_ndarray(format="rgb24")


class OurDataset:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.info = json.loads((root / "meta" / "info.json").read_text())
        self.version = self.info.get("codebase_version", "?")
        # v2.0 has the v2.1 file layout (only its statistics differ): read it the same way
        self.layout = "v2.1" if self.version in ("v2.1", "v2.0") else "v3.0"
        self.fps = float(self.info["fps"])
        self.features = self.info["features"]
        self.video_keys = [k for k, f in self.features.items() if f.get("dtype") == "video"]
        self.value_keys = [k for k, f in self.features.items() if f.get("dtype") not in ("video", "image")]
        # images stored in Parquet (LeRobot's use_videos=False): a column, and a camera for LeRobot
        self.image_keys = [k for k, f in self.features.items() if f.get("dtype") == "image"]
        self.tasks = self._tasks()
        self.episodes = self._episodes()  # episode_index -> row dict
        self._tables: dict[Path, Any] = {}
        self._videos: dict[Path, list[np.ndarray]] = {}

    # -- metadata
    def _tasks(self) -> dict[int, str]:
        if self.layout == "v2.1":
            rows = [json.loads(x) for x in (self.root / "meta/tasks.jsonl").read_text().splitlines() if x.strip()]
            return {int(r["task_index"]): r["task"] for r in rows}
        t = pq.read_table(self.root / "meta/tasks.parquet")
        cols = t.column_names
        task_col = "task" if "task" in cols else "__index_level_0__"
        return {int(i): str(s) for i, s in zip(t.column("task_index").to_pylist(), t.column(task_col).to_pylist(), strict=False)}

    def _episodes(self) -> dict[int, dict[str, Any]]:
        if self.layout == "v2.1":
            rows = [json.loads(x) for x in (self.root / "meta/episodes.jsonl").read_text().splitlines() if x.strip()]
        else:
            files = sorted((self.root / "meta/episodes").glob("chunk-*/file-*.parquet"))
            rows = []
            for f in files:
                rows.extend(pq.read_table(f).to_pylist())
        return {int(r["episode_index"]): r for r in sorted(rows, key=lambda r: int(r["episode_index"]))}

    # -- data
    def _table(self, path: Path) -> Any:
        if path not in self._tables:
            self._tables[path] = pq.read_table(path)
        return self._tables[path]

    def data_file(self, ep: int) -> Path:
        chunks_size = int(self.info.get("chunks_size", 1000))
        if self.layout == "v2.1":
            rel = self.info["data_path"].format(episode_chunk=ep // chunks_size, episode_index=ep)
        else:
            row = self.episodes[ep]
            rel = self.info["data_path"].format(chunk_index=int(row["data/chunk_index"]),
                                                file_index=int(row["data/file_index"]))
        return self.root / rel

    def episode_columns(self, ep: int) -> dict[str, np.ndarray]:
        """Our Parquet rows of one episode, in frame order, one array per column."""
        t = self._table(self.data_file(ep))
        epi = np.asarray(t.column("episode_index").to_numpy())
        sel = np.nonzero(epi == ep)[0]
        out: dict[str, np.ndarray] = {}
        import pyarrow as pa

        for name in t.column_names:
            col = t.column(name).take(sel).combine_chunks()
            if pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type) \
                    or pa.types.is_large_list(col.type):
                # keep the stored element type (float32 stays float32)
                out[name] = col.flatten().to_numpy(zero_copy_only=False).reshape(len(sel), -1)
            else:
                out[name] = col.to_numpy(zero_copy_only=False)
        order = np.argsort(out["frame_index"], kind="stable")
        return {k: v[order] for k, v in out.items()}

    # -- video
    def video_location(self, ep: int, key: str) -> tuple[Path, int]:
        """The MP4 holding ``key`` of episode ``ep`` and the frame number where the episode starts."""
        chunks_size = int(self.info.get("chunks_size", 1000))
        if self.layout == "v2.1":
            rel = self.info["video_path"].format(episode_chunk=ep // chunks_size, video_key=key, episode_index=ep)
            return self.root / rel, 0
        row = self.episodes[ep]
        rel = self.info["video_path"].format(video_key=key, chunk_index=int(row[f"videos/{key}/chunk_index"]),
                                             file_index=int(row[f"videos/{key}/file_index"]))
        return self.root / rel, round(float(row[f"videos/{key}/from_timestamp"]) * self.fps)

    def frames_by_count(self, ep: int, key: str) -> int:
        """v3.0: where the episode starts inside its MP4 derived from the lengths of the episodes
        stored before it in the same file (ordered by from_timestamp), not from timestamps."""
        if self.layout == "v2.1":
            return 0
        row = self.episodes[ep]
        same = [(float(r[f"videos/{key}/from_timestamp"]), e) for e, r in self.episodes.items()
                if r[f"videos/{key}/chunk_index"] == row[f"videos/{key}/chunk_index"]
                and r[f"videos/{key}/file_index"] == row[f"videos/{key}/file_index"]]
        start = 0
        for _, e in sorted(same):
            if e == ep:
                return start
            start += int(self.episodes[e]["length"])
        raise AssertionError("unreachable")

    def decode(self, path: Path) -> list[np.ndarray]:
        """Every frame of an MP4 as HxWx3 uint8 RGB, decoded with PyAV in stream order."""
        if path not in self._videos:
            import av

            frames = []
            with av.open(str(path)) as c:
                for fr in c.decode(video=0):
                    frames.append(fr.to_ndarray(format="rgb24"))
            self._videos[path] = frames
        return self._videos[path]


# --------------------------------------------------------------------------------------------
# the checks


def sample_positions(length: int, every: bool) -> list[int]:
    if every:
        return list(range(length))
    return sorted({0, length // 2, length - 1}) if length > 0 else []


def lerobot_image_to_hwc_uint8(x: Any) -> np.ndarray:
    a = to_np(x).astype(np.float32)
    if a.ndim == 3 and a.shape[0] in (1, 3):  # C,H,W float in [0, 1]
        a = np.transpose(a, (1, 2, 0))
    if a.max() <= 1.0 + 1e-6:
        a = a * 255.0
    return np.clip(np.rint(a), 0, 255).astype(np.uint8)


def mean_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference in 8-bit levels, taken per channel and the worst channel kept:
    a frame one step off can differ in one channel only, which a mean over all channels would
    dilute (8 levels in red alone is 2.7 over three channels)."""
    d = np.abs(a.astype(np.int16) - b.astype(np.int16)).reshape(-1, a.shape[-1])
    return float(d.mean(axis=0).max())


def compare_values(res: Results, label: str, ours: dict[str, np.ndarray], got: dict[str, np.ndarray],
                   keys: list[str], ep: int, atol64: float = 0.0) -> None:
    for k in keys:
        if k not in ours:
            res[f"{label}"].fail(f"episode {ep}: column {k!r} missing from our Parquet")
            continue
        if k not in got:
            res[f"{label}"].fail(f"episode {ep}: LeRobot returned no {k!r}")
            continue
        a = np.asarray(ours[k])
        b = np.asarray(got[k])
        b = b.reshape(a.shape) if b.size == a.size else b
        if a.shape != b.shape:
            res[label].fail(f"episode {ep} {k}: shape ours {a.shape} vs LeRobot {b.shape}")
        elif a.dtype == np.float64 and b.dtype != np.float64:
            # LeRobot's hf_transform_to_torch builds torch.tensor(python float) -> float32, so
            # every float64 feature comes back as float32. Judge the loss against --float64-atol.
            err = float(np.max(np.abs(a - b.astype(np.float64)))) if a.size else 0.0
            c = res["float64 precision"]
            c.worst = max(c.worst, err)
            (c.ok() if err <= atol64 else
             c.fail(f"episode {ep} {k}: LeRobot returns {b.dtype} for this float64 column; max abs error "
                    f"{err:.6g} > {atol64:g} (e.g. frame 0: ours {a[0]!r}, LeRobot {b[0]!r})"))
        elif not np.array_equal(a, b.astype(a.dtype), equal_nan=a.dtype.kind == "f"):  # NaN recorded is NaN read
            # Compared in OUR dtype: a float64 column that LeRobot hands back as float32 loses
            # precision, and that is a finding, not something to cast away.
            diff = ((a != b.astype(a.dtype)) & ~(np.isnan(a) & np.isnan(b)) if a.dtype.kind == "f"
                    else a != b.astype(a.dtype)).reshape(a.shape[0], -1)
            bad = np.nonzero(np.any(diff, axis=1))[0]
            i = int(bad[0])
            err = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            res[label].fail(f"episode {ep} {k}: {len(bad)}/{a.shape[0]} frame(s) differ (max abs error {err:.6g}); "
                            f"first at frame {i}: ours {a[i]!r} ({a.dtype}) vs LeRobot {b[i]!r} ({b.dtype})")
        else:
            res[label].ok()


ARROW_NAMES = {"float32": "float", "float64": "double", "int64": "int64", "int32": "int32", "int16": "int16",
               "int8": "int8", "uint8": "uint8", "bool": "bool", "string": "string"}


def check_schema(res: Results, ours: OurDataset) -> None:
    """Every data file's columns are exactly the non-video features, typed as declared."""
    import pyarrow as pa

    c = res["schema"]
    files = sorted({ours.data_file(ep) for ep in ours.episodes})
    for f in files:
        schema = pq.read_schema(f)
        names = set(schema.names) - {"__index_level_0__"}
        for k in ours.image_keys:
            t = schema.field(k).type if k in names else None
            if t is None or not pa.types.is_struct(t) or {t.field(i).name for i in range(t.num_fields)} != {"bytes", "path"}:
                c.fail(f"{f.relative_to(ours.root)}: image feature {k} is {t}, not struct<bytes, path>")
        names -= set(ours.image_keys)
        if names != set(ours.value_keys):
            c.fail(f"{f.relative_to(ours.root)}: columns {sorted(names)} != non-video features "
                   f"{sorted(ours.value_keys)}")
            continue
        for k in ours.value_keys:
            feat = ours.features[k]
            t = schema.field(k).type
            shape = list(feat.get("shape") or [1])
            want = ARROW_NAMES.get(feat["dtype"], feat["dtype"])
            if shape == [1]:
                good = str(t) == want
            else:
                inner = t.value_type if pa.types.is_list(t) or pa.types.is_fixed_size_list(t) else None
                good = inner is not None and str(inner) == want and len(shape) == 1 and (
                    not pa.types.is_fixed_size_list(t) or t.list_size == shape[0])
            (c.ok() if good else
             c.fail(f"{f.relative_to(ours.root)} column {k}: Arrow type {t} but info.json declares "
                    f"{feat['dtype']} {shape}"))


def run(args: argparse.Namespace) -> int:
    root = Path(args.root).resolve()
    ours = OurDataset(root)
    res = Results()
    print(f"dataset  {root}")
    print(f"reader   {versions()}  (video_backend={args.video_backend})")
    print(f"declared codebase_version {ours.version}, {len(ours.episodes)} episodes, "
          f"{ours.info.get('total_frames')} frames, cameras {ours.video_keys}")
    if ours.version != args.version_expect:
        print(f"FAIL: codebase_version is {ours.version!r}, expected {args.version_expect!r}")
        return 2

    t0 = time.monotonic()
    try:
        LeRobotDataset, lr_version = import_lerobot()
        ds = LeRobotDataset(args.repo_id or f"local/{root.name}", root=root, video_backend=args.video_backend)
    except Exception as e:  # noqa: BLE001 - report exactly what LeRobot choked on
        tb = traceback.extract_tb(e.__traceback__)
        print("FAIL: LeRobotDataset(...) raised while loading:")
        traceback.print_exc(file=sys.stdout)
        last = tb[-1] if tb else None
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"KEY LINE: {type(e).__name__}: {msg[:400]}")
        if last is not None:
            print(f"  raised at {last.filename}:{last.lineno} in {last.name}: {last.line}")
        return 2
    print(f"loaded   in {time.monotonic() - t0:.2f} s: num_episodes={ds.num_episodes} num_frames={ds.num_frames} "
          f"fps={ds.fps} camera_keys={list(ds.meta.camera_keys)}")

    # dataset-level agreement
    c = res["dataset totals"]
    for what, got, want in (("num_episodes", ds.num_episodes, len(ours.episodes)),
                            ("num_frames", ds.num_frames, int(ours.info["total_frames"])),
                            ("fps", ds.fps, ours.info["fps"]),
                            ("camera_keys", sorted(ds.meta.camera_keys),
                             sorted(ours.video_keys + ours.image_keys))):
        (c.ok() if got == want else c.fail(f"{what}: LeRobot {got!r} vs ours {want!r}"))

    check_schema(res, ours)
    ranges = lerobot_episode_ranges(ds)
    lr_lengths = lerobot_episode_lengths(ds)
    value_keys = [k for k in ours.value_keys if k not in ("timestamp",)]

    # optional source (v2.1) for exported datasets
    source: OurDataset | None = None
    source_eps: list[int] | None = None
    split_file = root / "meta" / "quality_split.json"
    if split_file.exists():
        split = json.loads(split_file.read_text())
        source_eps = [int(i) for i in split.get("source_episode_indices", [])]
        src_dir = args.source or split.get("source_dir")
        if src_dir and Path(src_dir, "meta/info.json").exists() and Path(src_dir).resolve() != root:
            source = OurDataset(Path(src_dir).resolve())
    elif args.source:
        source = OurDataset(Path(args.source).resolve())
        source_eps = sorted(source.episodes)
    if source is not None:
        if source_eps is None or len(source_eps) != len(ours.episodes):
            res["source"].fail(f"source_episode_indices {source_eps} do not map the {len(ours.episodes)} episodes")
            source = None
        else:
            print(f"source   {source.root} (episodes {source_eps})")

    for ep in sorted(ours.episodes):
        row = ours.episodes[ep]
        cols = ours.episode_columns(ep)
        n_rows = len(cols["frame_index"])
        meta_len = int(row["length"])
        # ---- length
        c = res["length"]
        if ep not in ranges:
            c.fail(f"episode {ep}: LeRobot has no frame range for it")
            continue
        frm, to = ranges[ep]
        if to - frm == meta_len == n_rows == lr_lengths.get(ep):
            c.ok()
        else:
            c.fail(f"episode {ep}: LeRobot range [{frm}, {to}) = {to - frm} frames, LeRobot length "
                   f"{lr_lengths.get(ep)}, our metadata length {meta_len}, our Parquet rows {n_rows}")
        if to - frm != n_rows:
            continue

        # ---- values and timestamps of every frame, through LeRobot's hf_dataset transform
        batch = ds.hf_dataset[frm:to]
        got = {k: np.stack([to_np(x) for x in v]) if isinstance(v, list) else to_np(v) for k, v in batch.items()}
        compare_values(res, "values", cols, got, value_keys, ep, args.float64_atol)
        c = res["timestamps"]
        ts_ours = np.asarray(cols["timestamp"], dtype=np.float64)
        ts_lr = np.asarray(got["timestamp"], dtype=np.float64).reshape(-1)
        ideal = np.asarray(cols["frame_index"], dtype=np.float64) / ours.fps
        d_ideal = float(np.max(np.abs(ts_ours - ideal))) if n_rows else 0.0
        c.worst = max(c.worst, d_ideal)
        if not np.array_equal(ts_ours.astype(np.float32), ts_lr.astype(np.float32)):
            c.fail(f"episode {ep}: LeRobot timestamps differ from our Parquet")
        elif d_ideal > 1e-4:
            c.fail(f"episode {ep}: timestamp off frame_index/fps by up to {d_ideal:.6f} s")
        else:
            c.ok()

        # ---- LeRobot __getitem__ at sampled frames: indices, task, camera frames
        src_ep = source_eps[sorted(ours.episodes).index(ep)] if source is not None and source_eps else None
        src_cols = source.episode_columns(src_ep) if source is not None and src_ep is not None else None
        if src_cols is not None:
            compare_values(res, "source values", src_cols, {k: cols[k] for k in value_keys if k in cols},
                           [k for k in value_keys if k not in ("episode_index", "index", "task_index")], ep)
        for key in ours.video_keys:
            path, start_ts = ours.video_location(ep, key)
            start_cnt = ours.frames_by_count(ep, key)
            c = res["video offsets"]
            (c.ok() if start_ts == start_cnt else
             c.fail(f"episode {ep} {key}: from_timestamp puts it at frame {start_ts} of {path.name}, "
                    f"the lengths of the episodes before it at frame {start_cnt}"))
            frames = ours.decode(path)
            need = start_cnt + n_rows
            c = res["video frame count"]
            if ours.layout == "v2.1":
                (c.ok() if len(frames) == n_rows else
                 c.fail(f"episode {ep} {key}: {path.name} has {len(frames)} frames, episode has {n_rows}"))
            else:
                (c.ok() if len(frames) >= need else
                 c.fail(f"episode {ep} {key}: {path.name} has {len(frames)} frames, episode needs {need}"))
        for pos in sample_positions(n_rows, args.every_frame):
            gi = frm + pos
            item = ds[gi]
            c = res["indices"]
            want = {"index": int(cols["index"][pos]), "episode_index": ep,
                    "frame_index": int(cols["frame_index"][pos]), "task_index": int(cols["task_index"][pos])}
            gotd = {k: int(to_np(item[k]).reshape(-1)[0]) for k in want}
            task_want = ours.tasks.get(want["task_index"])
            if gotd != want or item.get("task") != task_want or gi != want["index"]:
                c.fail(f"episode {ep} frame {pos}: LeRobot {gotd} task {item.get('task')!r} at ds[{gi}], "
                       f"ours {want} task {task_want!r}")
            else:
                c.ok()
            for key in ours.image_keys:  # PNG in our Parquet row vs the image LeRobot returns
                c = res["images"]
                ref = decode_png(cols[key][pos]["bytes"])
                lr_img = lerobot_image_to_hwc_uint8(item[key])
                if ref.shape != lr_img.shape:
                    c.fail(f"episode {ep} {key} frame {pos}: shape LeRobot {lr_img.shape} vs ours {ref.shape}")
                    continue
                d = mean_abs_diff(ref, lr_img)
                c.worst = max(c.worst, d)
                (c.ok() if d < args.max_mean_diff else
                 c.fail(f"episode {ep} {key} frame {pos}: mean abs diff {d:.2f} levels"))
            for key in ours.video_keys:
                path, _ = ours.video_location(ep, key)
                frames = ours.decode(path)
                at = ours.frames_by_count(ep, key) + int(cols["frame_index"][pos])
                lr_img = lerobot_image_to_hwc_uint8(item[key])
                c = res["frames"]
                if at >= len(frames):
                    c.fail(f"episode {ep} {key} frame {pos}: our decode of {path.name} has no frame {at}")
                    continue
                ref = frames[at]
                if ref.shape != lr_img.shape:
                    c.fail(f"episode {ep} {key} frame {pos}: shape LeRobot {lr_img.shape} vs ours {ref.shape}")
                    continue
                d = mean_abs_diff(ref, lr_img)
                c.worst = max(c.worst, d)
                if d < args.max_mean_diff:
                    c.ok()
                else:
                    c.fail(f"episode {ep} {key} frame {pos} (file frame {at} of {path.name}): "
                           f"mean abs diff {d:.2f} levels")
                if src_cols is not None and source is not None and src_ep is not None:
                    # a v3.0 source shares its MP4 between episodes: the episode starts at sstart
                    spath, sstart = source.video_location(src_ep, key)
                    sframes = source.decode(spath)
                    sc = res["source frames"]
                    if sstart + pos >= len(sframes):
                        sc.fail(f"episode {ep} {key}: source {spath} has no frame {sstart + pos}")
                        continue
                    sd = mean_abs_diff(sframes[sstart + pos], lr_img)
                    sc.worst = max(sc.worst, sd)
                    (sc.ok() if sd < args.max_mean_diff else
                     sc.fail(f"episode {ep} {key} frame {pos}: vs source episode {src_ep} mean abs diff {sd:.2f}"))

    # ---- summary
    print()
    print(f"{'check':<20} {'pass':>6} {'fail':>6}  worst")
    for c in res.checks.values():
        worst = f"{c.worst:.3g}" if c.name in ("frames", "images", "source frames", "timestamps", "float64 precision") else ""
        print(f"{c.name:<20} {c.passed:>6} {c.failed:>6}  {worst}")
    for c in res.checks.values():
        for m in c.failures:
            print(f"  FAIL {c.name}: {m}")
    verdict = "PASS" if res.failed == 0 else "FAIL"
    print(f"\n{verdict}: lerobot {lr_version} read {ours.version} dataset {root} "
          f"({len(ours.episodes)} episodes, {ds.num_frames} frames); {res.failed} failure(s)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "root": str(root), "version": ours.version, "lerobot": lr_version, "verdict": verdict,
            "checks": {c.name: {"passed": c.passed, "failed": c.failed, "worst": c.worst, "failures": c.failures}
                       for c in res.checks.values()}}, indent=2))
    return 0 if res.failed == 0 else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version-expect", required=True, choices=["v2.1", "v3.0"])
    ap.add_argument("--root", required=True, help="dataset directory (holds meta/info.json)")
    ap.add_argument("--repo-id", default=None, help="repo_id passed to LeRobotDataset (default local/<dirname>)")
    ap.add_argument("--video-backend", default="torchcodec", help="LeRobot video backend (default torchcodec)")
    ap.add_argument("--source", default=None, help="v2.1 source dataset an export came from")
    ap.add_argument("--every-frame", action="store_true", help="check every frame's image, not first/middle/last")
    ap.add_argument("--max-mean-diff", type=float, default=3.0, help="mean abs diff limit in 8-bit levels")
    ap.add_argument("--float64-atol", type=float, default=1e-3,
                    help="largest abs error allowed when LeRobot returns a float64 column as float32 "
                         "(default 1e-3, i.e. 1 ms for capture_time)")
    ap.add_argument("--json", default=None, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
