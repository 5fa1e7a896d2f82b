"""Build small, real LeRobot v2.1 datasets with the project's own writer, for tests and benches.

Values are deterministic so a reader can check them: state[j] = episode*1000 + frame + j/10,
action = -state, and each camera frame is a flat colour whose red channel encodes the frame
number and green channel the source episode (H.264 keeps flat colours within a few levels).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eva_export.formats.common.records import Feature
from eva_export.formats.common.video import VideoEncoder, VideoSettings
from eva_export.formats.lerobot_v21.writer import DatasetWriter, make_features

JOINTS = [f"joint_{i}" for i in range(6)]


@dataclass
class Ep:
    frames: int = 30
    quality: str = "green"
    issues: list[dict[str, Any]] = field(default_factory=list)
    verdict: str = ""
    note: str | None = None
    task: str = "pick the cube"
    extra: dict[str, Any] = field(default_factory=dict)


def features(cameras: int = 2, width: int = 64, height: int = 48, fps: int = 30) -> dict[str, Feature]:
    feats: dict[str, Feature] = {
        "observation.state": Feature("float32", (6,), list(JOINTS)),
        "action": Feature("float32", (6,), list(JOINTS)),
        "capture_time": Feature("float64", (1,), None),
    }
    for c in range(cameras):
        feats[f"observation.images.cam{c}"] = Feature.video(height, width, fps)
    return make_features(feats)


def state_value(episode: int, frame: int) -> np.ndarray:
    return (episode * 1000 + frame + np.arange(6) / 10).astype(np.float32)


def image(episode: int, frame: int, cam: int, width: int, height: int) -> np.ndarray:
    img = np.empty((height, width, 3), np.uint8)
    img[..., 0] = (frame * 8) % 256
    img[..., 1] = (episode * 40) % 256
    img[..., 2] = 60 * cam
    return img


def make_dataset(root: Path, episodes: list[Ep], cameras: int = 2, width: int = 64, height: int = 48,
                 fps: int = 30, settings: VideoSettings = VideoSettings(crf=10)) -> Path:
    """Write a v2.1 dataset (or append to it) and return its root."""
    dw = DatasetWriter.open(root, fps=fps, features=features(cameras, width, height, fps),
                            robot_type="test", settings=settings)
    for ep in episodes:
        src = dw.next_episode_index
        w = dw.begin_episode(ep.task)
        for f in range(ep.frames):
            s = state_value(src, f)
            w.add_frame({"observation.state": s, "action": -s, "capture_time": 1000.0 + f / fps},
                        {f"observation.images.cam{c}": image(src, f, c, width, height) for c in range(cameras)})
        w.finish()
        extra: dict[str, Any] = {"quality": ep.quality, "quality_issues": list(ep.issues)}
        extra.update(ep.extra)
        row = dw.commit(w, extra)
        if row is not None and (ep.verdict or ep.note is not None):
            dw.review(row.episode_index, ep.verdict, ep.note)
    return Path(root)


def make_subset(root: Path, episodes: list[Ep], subset: str = "accepted", **kw: Any) -> Path:
    """A v2.1 dataset shaped like a staged quality-split subset: with its meta/quality_split.json."""
    from eva_export.export.records import QualitySplit
    from eva_export.formats.common.meta import read_meta

    make_dataset(root, episodes, **kw)
    meta = read_meta(root)
    QualitySplit(str(root), subset, "lerobot_v21", [e.episode_index for e in meta.episodes],
                 episode_count=len(meta.episodes), frame_count=sum(e.length for e in meta.episodes)).write(root)
    return root


def replace_video(root: Path, key: str, episode: int, frames: int, width: int = 64, height: int = 48,
                  fps: int = 30, settings: VideoSettings = VideoSettings(crf=10)) -> None:
    """Re-encode one episode's camera MP4 with another frame count or size (fault injection)."""
    path = root / f"videos/chunk-000/{key}/episode_{episode:06d}.mp4"
    path.unlink()
    with VideoEncoder(path, width, height, fps, settings) as enc:
        for i in range(frames):
            enc.add(image(episode, i, int(key[-1]), width, height))


def complete_stats(root: Path) -> None:
    """Rewrite a dataset's episodes_stats.jsonl and stats.json with every statistic a trainer
    needs (quantiles included), computed from its tables and frames: what the quality split
    writes, for a dataset handed straight to an exporter."""
    import json

    import pyarrow.parquet as pq

    from eva_export.formats.common import stats as S
    from eva_export.formats.common.images import iter_table_images
    from eva_export.formats.common.meta import read_meta
    from eva_export.formats.common.table import to_numpy
    from eva_export.formats.common.video import iter_frames

    meta = read_meta(root)
    rows = []
    for ep in meta.episodes:
        table = pq.read_table(meta.data_path(ep.episode_index))
        st: dict[str, Any] = {}
        for k, f in meta.info.features.items():
            if f.dtype == "video" or (k in table.column_names and f.is_visual):
                img = S.ImageStats()
                frames = (iter_frames(meta.video_path(k, ep.episode_index)) if f.dtype == "video"
                          else iter_table_images(table, k, k))
                for frame in frames:
                    img.add(frame)
                st[k] = img.to_dict()
            elif k in table.column_names and f.dtype != "string":
                st[k] = S.column_stats(to_numpy(table.column(k)))
        rows.append({"episode_index": ep.episode_index, "stats": st})
    (root / "meta/episodes_stats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "meta/stats.json").write_text(json.dumps(S.aggregate(r["stats"] for r in rows)))


def without_keys(value: Any, keys: set[str]) -> Any:
    """A decoded JSON value with the members named ``keys`` dropped at every depth (the values
    that differ between two runs of one export: job ids, times)."""
    if isinstance(value, dict):
        return {k: without_keys(x, keys) for k, x in value.items() if k not in keys}
    if isinstance(value, list):
        return [without_keys(x, keys) for x in value]
    return value
