#!/usr/bin/env python3
"""Optional heavy check: load our LeRobot v3.0 export with LeRobot 0.4.4's own LeRobotDataset.

Two steps, two interpreters (LeRobot must not be a dependency of eva_export):

1. In the project's environment, build a dsfactory dataset and export it to v3::

       PYTHONPATH=.:tests python tools/lerobot_check.py make /tmp/eva_v3

   (small shards are forced so the reader has to follow the locator across files).

2. In a separate LeRobot 0.4.4 venv (Python 3.11; see /work/shared/notes/formats.md,
   "Running LeRobot's own reader")::

       python3.11 -m venv /tmp/venv_lerobot
       /tmp/venv_lerobot/bin/pip install torch==2.13.0
       /tmp/venv_lerobot/bin/pip install --no-deps lerobot==0.4.4 torchvision==0.28.0 torchcodec==0.13.0
       /tmp/venv_lerobot/bin/pip install "numpy<2.3" datasets huggingface-hub av pandas pyarrow pillow \\
           jsonlines packaging draccus==0.10.0 termcolor einops deepdiff accelerate
       HF_HUB_OFFLINE=1 /tmp/venv_lerobot/bin/python tools/lerobot_check.py check /tmp/eva_v3

   ``check`` loads the dataset with ``LeRobotDataset(repo_id, root=DIR)`` (torchcodec video
   backend) and compares, for every episode, the first, a middle and the last frame: state,
   action, task string, episode/frame indices and camera colours (dsfactory encodes the frame
   number in red and the episode in green). Exit status 0 when everything matches.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = [12, 20, 7, 15]
TASKS = ["pick the cube", "place the cube", "pick the cube", "stack the cubes"]


def make(out: Path) -> int:
    import shutil
    import tempfile

    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from dsfactory import Ep, make_dataset

    from eva_export.export.records import QualitySplit
    from eva_export.formats.lerobot_v3 import LeRobotV3Exporter
    from eva_export.formats.verify import verify_export

    with tempfile.TemporaryDirectory() as tmp:
        src = make_dataset(Path(tmp) / "raw", [Ep(frames=n, task=t, note=f"ep{i}")
                                               for i, (n, t) in enumerate(zip(LENGTHS, TASKS))])
        QualitySplit(str(src), "accepted", "lerobot_v21", list(range(len(LENGTHS))), episode_count=len(LENGTHS),
                     frame_count=sum(LENGTHS)).write(src)
        if out.exists():
            shutil.rmtree(out)
        biggest = max(p.stat().st_size for p in (src / "videos").rglob("*.mp4"))
        LeRobotV3Exporter(data_files_size_in_mb=2500 / 2**20,
                          video_files_size_in_mb=2.5 * biggest / 2**20).export(src, out)
    report = verify_export(out)
    print("\n".join(report.checks + report.errors))
    return 0 if report.ok else 1


def _torchvision_workaround() -> None:
    """The torchvision wheel is a CUDA build: declare its two op schemas before importing it."""
    import torch

    lib = torch.library.Library("torchvision", "FRAGMENT")
    for schema in ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
                   "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"):
        try:
            lib.define(schema)
        except RuntimeError:
            pass
    _torchvision_workaround.lib = lib  # type: ignore[attr-defined]  # keep the library alive


def check(root: Path) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _torchvision_workaround()
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    info = json.loads((root / "meta/info.json").read_text())
    ds = LeRobotDataset("local/eva_v3_check", root=root, video_backend="torchcodec")
    problems: list[str] = []
    if len(ds) != info["total_frames"] or ds.num_episodes != info["total_episodes"]:
        problems.append(f"len {len(ds)} / episodes {ds.num_episodes}, info.json {info['total_frames']} / "
                        f"{info['total_episodes']}")
    cams = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    start = 0
    checked = 0
    for ep, n in enumerate(LENGTHS if len(ds) == sum(LENGTHS) else []):
        for i in sorted({0, n // 2, n - 1}):
            item = ds[start + i]
            state = item["observation.state"].numpy()
            want = (ep * 1000 + i + np.arange(6) / 10).astype(np.float32)
            if not np.array_equal(state, want) or not np.array_equal(item["action"].numpy(), -want):
                problems.append(f"episode {ep} frame {i}: state {state} != {want}")
            if int(item["episode_index"]) != ep or int(item["frame_index"]) != i:
                problems.append(f"episode {ep} frame {i}: indices {int(item['episode_index'])}/{int(item['frame_index'])}")
            if item["task"] != TASKS[ep]:
                problems.append(f"episode {ep}: task {item['task']!r} != {TASKS[ep]!r}")
            for c, key in enumerate(cams):
                img = item[key].numpy()  # (3, H, W) float in [0, 1]
                rgb = img.reshape(3, -1).mean(1) * 255
                want_rgb = np.array([(i * 8) % 256, (ep * 40) % 256, 60 * c])
                if np.any(np.abs(rgb - want_rgb) > 5):
                    problems.append(f"episode {ep} frame {i} {key}: colour {rgb.round(1)} != {want_rgb}")
            checked += 1
        start += n
    print(f"LeRobotDataset: {len(ds)} frames, {ds.num_episodes} episodes, {len(cams)} cameras; "
          f"{checked} frames compared")
    for p in problems:
        print("MISMATCH", p)
    print("OK" if not problems else f"{len(problems)} problem(s)")
    return 0 if not problems and checked else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=["make", "check"])
    ap.add_argument("dir", type=Path)
    args = ap.parse_args()
    return make(args.dir) if args.step == "make" else check(args.dir)


if __name__ == "__main__":
    raise SystemExit(main())
