#!/usr/bin/env python3
"""Benchmark a merged export (export/merge.py) against exporting the same sources one by one.

    PYTHONPATH=. python bench/bench_merge.py [--episodes N] [--frames F] [--format lerobot_v3]

Three raw datasets ("robots", tests/dsfactory.py: 2 cameras 320x240 H.264 at 30 fps) of N
episodes x F frames; times, with 1 worker: the three single-source export jobs in a row, the
one merged job of all three (validate, split, convert, verify, publish), and its rerun after a
fault at ``verified`` (every unit reused). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from dsfactory import Ep, make_dataset  # noqa: E402

from eva_export.config import parse_config  # noqa: E402
from eva_export.export import faults  # noqa: E402
from eva_export.export.runner import ExportService  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--format", default="lerobot_v3")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_merge_") as tmp:
        root = Path(tmp)
        tasks = ["pick the cube", "place the cube", "wipe the table"]
        sources = [make_dataset(root / f"robot{r}" / "raw",
                                [Ep(args.frames, task=tasks[(r + i) % 3]) for i in range(args.episodes)],
                                width=320, height=240) for r in range(3)]
        cfg = parse_config({"collection": {"log_dir": str(root)}, "export": {"workers": 1}})
        svc = ExportService(cfg, background=False, recover=False)
        t0 = time.perf_counter()
        for s in sources:
            assert svc.run(s, args.format).state == "completed"
        singles = time.perf_counter() - t0
        t0 = time.perf_counter()
        job = svc.run(sources, args.format, "fleet")
        merged = time.perf_counter() - t0
        assert job.state == "completed", job.error
        with faults.injected(faults.FaultPlan(fail_at="verified")):
            broken = ExportService(cfg, background=False, recover=False)
        broken.run(sources, args.format, "fleet")
        t0 = time.perf_counter()
        again = svc.run(sources, args.format, "fleet")
        rerun = time.perf_counter() - t0
        assert again.reused_episodes == 3 * args.episodes
    n = 3 * args.episodes
    print(f"| {args.format}: 3 sources x {args.episodes} episodes x {args.frames} frames | "
          f"3 single exports {singles:.2f} s | merged {merged:.2f} s ({n} episodes, {n * args.frames} frames) | "
          f"rerun after a fault at verified {rerun:.2f} s ({again.reused_episodes} units reused) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
