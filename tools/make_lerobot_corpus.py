#!/usr/bin/env python3
"""Write the corpus of tiny LeRobot v2.1 datasets with LeRobot 0.3.3's OWN recorder.

Run it with the lerobot 0.3.3 venv (tools/lerobot_venvs.sh 033), not the project's venv:

    HF_HUB_OFFLINE=1 /tmp/lerobot033/bin/python tools/make_lerobot_corpus.py tests/fixtures/lerobot-corpus

Every dataset is made by ``LeRobotDataset.create`` / ``add_frame`` / ``save_episode``, as a
LeRobot user records one. Only two things are changed afterwards, and only where a dataset's
purpose needs it: the video codec (LeRobot's encoder asked for H.264 instead of its default AV1)
and quality fields written into meta/episodes.jsonl the way the capture node writes them
(quality, quality_issues). Frames are deterministic (seeded), so a rerun gives the same tables.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Spec:
    name: str
    episodes: tuple[int, ...]  # frames per episode
    fps: int = 10
    cameras: int = 1
    width: int = 64
    height: int = 48
    use_videos: bool = True  # False: images stored in Parquet (dtype "image")
    vcodec: str = "libsvtav1"  # LeRobot's default; "a,b" = one codec per episode (mixed codecs)
    quality: tuple[str, ...] = ()  # per episode; () leaves LeRobot's rows untouched (unrated)
    state_dim: int = 6
    tasks: tuple[str, ...] = ("pick the cube", "place the cube")
    extra: dict[str, int] = field(default_factory=dict)  # extra float features name -> dim


SPECS = (
    Spec("av1-1cam-unrated", (12, 10)),
    Spec("h264-1cam-green", (12, 15), fps=15, width=96, height=72, vcodec="h264", quality=("green", "green")),
    Spec("av1-3cam-mixed", (10, 12, 11), fps=30, cameras=3, quality=("green", "red", "yellow")),
    Spec("av1-red", (10, 10), quality=("red", "red")),
    Spec("images-parquet-mixed", (10, 12), use_videos=False, quality=("green", "red")),
    Spec("images-parquet-unrated-2cam", (8, 9), fps=15, cameras=2, width=32, height=24, use_videos=False),
    Spec("hevc-av1-mixed-codecs", (10, 11), fps=25, width=80, height=60, vcodec="hevc,libsvtav1",
         quality=("green", "green")),
    Spec("h264-one-episode-green", (14,), vcodec="h264", quality=("green",), state_dim=14,
         extra={"observation.effort": 14}),
)


def features(spec: Spec) -> dict[str, dict]:
    names = [f"joint_{i}" for i in range(spec.state_dim)]
    feats: dict[str, dict] = {
        "observation.state": {"dtype": "float32", "shape": (spec.state_dim,), "names": names},
        "action": {"dtype": "float32", "shape": (spec.state_dim,), "names": names},
    }
    for name, dim in spec.extra.items():
        feats[name] = {"dtype": "float32", "shape": (dim,), "names": [f"{name}_{i}" for i in range(dim)]}
    for c in range(spec.cameras):
        feats[f"observation.images.cam{c}"] = {
            "dtype": "video" if spec.use_videos else "image",
            "shape": (spec.height, spec.width, 3), "names": ["height", "width", "channels"]}
    return feats


def frame_image(rng: np.random.Generator, ep: int, i: int, cam: int, spec: Spec) -> np.ndarray:
    """A moving gradient plus a little noise: compressible, different per frame and camera."""
    y, x = np.mgrid[0:spec.height, 0:spec.width]
    img = np.stack([(x * 4 + i * 8 + cam * 40) % 256, (y * 4 + ep * 50) % 256,
                    np.full_like(x, (i * 20 + cam * 70) % 256)], axis=-1)
    img = img + rng.integers(0, 8, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def write_quality(root: Path, quality: tuple[str, ...]) -> None:
    """Quality fields as the capture node writes them into meta/episodes.jsonl."""
    path = root / "meta/episodes.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row, q in zip(rows, quality, strict=True):
        row["quality"] = q
        row["quality_issues"] = [] if q == "green" else [
            {"code": "dropped_frames", "severity": "error" if q == "red" else "warning",
             "detail": "synthetic: set by make_lerobot_corpus.py"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _declare_torchvision_ops() -> None:
    """The torchvision wheel here is a CUDA build: on CPU torch its import fails unless these two
    op schemas exist (see tools/lerobot_venvs.sh). LeRobot never calls them."""
    import torch

    lib = torch.library.Library("torchvision", "FRAGMENT")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _declare_torchvision_ops.lib = lib  # type: ignore[attr-defined]  # keep the fragment alive


def make(spec: Spec, out: Path) -> None:
    from lerobot.datasets import lerobot_dataset, video_utils
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = out / spec.name
    if root.exists():
        shutil.rmtree(root)
    codecs = spec.vcodec.split(",")
    ds = LeRobotDataset.create(repo_id=f"eva/{spec.name}", fps=spec.fps, root=root, robot_type="synthetic",
                               features=features(spec), use_videos=spec.use_videos, image_writer_threads=0)
    rng = np.random.default_rng(len(spec.name))
    for ep, n in enumerate(spec.episodes):
        # LeRobot's own encoder, asked for another codec (its default is libsvtav1).
        lerobot_dataset.encode_video_frames = functools.partial(video_utils.encode_video_frames,
                                                                vcodec=codecs[ep % len(codecs)])
        for i in range(n):
            frame: dict[str, object] = {
                "observation.state": rng.standard_normal(spec.state_dim).astype(np.float32),
                "action": rng.standard_normal(spec.state_dim).astype(np.float32),
            }
            for name, dim in spec.extra.items():
                frame[name] = rng.standard_normal(dim).astype(np.float32)
            for c in range(spec.cameras):
                frame[f"observation.images.cam{c}"] = frame_image(rng, ep, i, c, spec)
            ds.add_frame(frame, task=spec.tasks[ep % len(spec.tasks)])
        ds.save_episode()
    # LeRobot leaves the PNGs it encoded (or embedded) under images/; a user would delete them.
    shutil.rmtree(root / "images", ignore_errors=True)
    if spec.quality:
        write_quality(root, spec.quality)
    print(f"{spec.name}: {len(spec.episodes)} episodes, {sum(spec.episodes)} frames, "
          f"{sum(f.stat().st_size for f in root.rglob('*') if f.is_file()) // 1024} KiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", nargs="*", help="names of the datasets to (re)make")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    _declare_torchvision_ops()
    for spec in SPECS:
        if not args.only or spec.name in args.only:
            make(spec, args.out)


if __name__ == "__main__":
    main()
