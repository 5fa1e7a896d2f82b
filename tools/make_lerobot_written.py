#!/usr/bin/env python3
"""Write the tiny reference dataset of tests/fixtures/lerobot-written/ with LeRobot's OWN API.

Run it with the python of a LeRobot venv; the release decides the layout it writes:

    /tmp/lerobot061/bin/python tools/make_lerobot_written.py tests/fixtures/lerobot-written/v30-061

``LeRobotDataset.create`` / ``add_frame`` / ``save_episode`` (and ``finalize`` where the release
has it), as a LeRobot user records: 2 episodes (20 and 15 frames), a 6-dim
``observation.state`` and ``action``, one 64x48 camera ``observation.images.cam`` at 10 fps
(LeRobot's default codec), two tasks. Frames and values are deterministic, so the files show
what the release writes, and tests/test_lerobot_layout.py compares our v3 export with them.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

JOINTS = [f"joint_{i}" for i in range(6)]
TASKS = ("pick the cube", "place the cube")
LENGTHS = (20, 15)


def features() -> dict[str, dict[str, object]]:
    vec = {"dtype": "float32", "shape": (6,), "names": JOINTS}
    cam = {"dtype": "video", "shape": (48, 64, 3), "names": ["height", "width", "channels"]}
    return {"observation.state": vec, "action": dict(vec), "observation.images.cam": cam}


def frame(episode: int, index: int, task: str) -> dict[str, object]:
    value = (episode * 100 + index + np.arange(6) / 10).astype(np.float32)
    image = np.full((48, 64, 3), (episode * 60 + index * 5) % 256, dtype=np.uint8)
    return {"observation.state": value, "action": value + np.float32(0.5), "observation.images.cam": image,
            "task": task}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    import lerobot
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    shutil.rmtree(args.out, ignore_errors=True)
    ds = LeRobotDataset.create("eva/lerobot-written", fps=10, features=features(), root=args.out,
                               robot_type="synthetic", use_videos=True)
    for ep, (length, task) in enumerate(zip(LENGTHS, TASKS, strict=True)):
        for i in range(length):
            ds.add_frame(frame(ep, i, task))
        ds.save_episode()
    if hasattr(ds, "finalize"):
        ds.finalize()
    print(f"lerobot {lerobot.__version__} wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
