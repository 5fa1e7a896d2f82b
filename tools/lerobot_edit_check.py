#!/usr/bin/env python3
"""Run LeRobot's own dataset editing tools on our v3 exports, then load what they wrote.

Run it with the python of a LeRobot venv (0.4.x on Python 3.11, 0.6.x on Python 3.12):

    /tmp/lerobot061/bin/python tools/lerobot_edit_check.py --out /tmp/edit A_V3_DIR [B_V3_DIR]

For the first dataset: ``delete_episodes`` (episode 0), ``split_dataset`` (half / half),
``remove_feature`` (the first camera) and, with a second dataset, ``merge_datasets`` (A + B).
These are the functions ``lerobot-edit-dataset`` calls. Each result is then opened with
``LeRobotDataset(root=...)`` and every frame is read through ``__getitem__`` (video decoded), and
its episode and frame counts are compared with what the edit should give. Prints one line per
operation; exits 0 when every operation ran and its result loaded, 1 otherwise. It never
edits its inputs (each operation writes under --out). Not part of `make test`: LeRobot is not
a dependency of the project (its venvs are gigabytes, see tools/lerobot_venvs.sh).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def load(root: Path, repo_id: str) -> Any:
    from lerobot_reader_check import import_lerobot  # the torchvision shim of the 0.4.4 venv

    dataset_cls, _version = import_lerobot()
    return dataset_cls(repo_id, root=root)


def read_all(ds: Any) -> int:
    """Every frame through LeRobot's own loader (Parquet row + decoded camera frames)."""
    for i in range(len(ds)):
        ds[i]
    return len(ds)


def counts(ds: Any) -> tuple[int, int]:
    return int(ds.meta.total_episodes), int(ds.meta.total_frames)


def check(name: str, make: Callable[[], Any], want: tuple[int, int]) -> bool:
    try:
        result = make()
        got = counts(result)
        frames = read_all(load(Path(result.root), f"eva/{name}"))  # reopened from its files
    except Exception as exc:  # noqa: BLE001 - report any failure of LeRobot's tool or loader
        line = traceback.format_exception_only(type(exc), exc)[-1].strip()
        print(f"FAIL {name}: {line}")
        return False
    ok = got == want and frames == want[1]
    print(f"{'PASS' if ok else 'FAIL'} {name}: episodes/frames {got}, want {want}; read {frames} frames")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("datasets", nargs="+", type=Path, help="one or two LeRobot v3.0 datasets (ours)")
    ap.add_argument("--out", type=Path, required=True, help="a scratch directory (emptied first)")
    args = ap.parse_args()
    load(args.datasets[0], "eva/a")  # imports LeRobot through the shim before its tools
    import lerobot
    from lerobot.datasets import dataset_tools as tools

    print(f"lerobot {lerobot.__version__}, python {sys.version.split()[0]}")
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    a = load(args.datasets[0], "eva/a")
    n_eps, n_frames = counts(a)
    lengths = [int(a.meta.episodes[i]["length"]) for i in range(n_eps)]
    print(f"input A: {n_eps} episodes, {n_frames} frames; read {read_all(a)} frames")
    cams = list(a.meta.video_keys)
    half = n_eps // 2
    results = [
        check("delete", lambda: tools.delete_episodes(a, [0], output_dir=args.out / "delete", repo_id="eva/delete"),
              (n_eps - 1, n_frames - lengths[0])),
        check("split", lambda: tools.split_dataset(a, {"first": list(range(half))}, output_dir=args.out / "split")["first"],
              (half, sum(lengths[:half]))),
    ]
    if cams:
        results.append(check("remove_feature", lambda: tools.remove_feature(
            a, cams[0], output_dir=args.out / "remove", repo_id="eva/remove"), (n_eps, n_frames)))
    if len(args.datasets) > 1:
        b = load(args.datasets[1], "eva/b")
        want = (n_eps + counts(b)[0], n_frames + counts(b)[1])
        results.append(check("merge", lambda: tools.merge_datasets([a, b], "eva/merge", output_dir=args.out / "merge"),
                             want))
    print(f"{sum(results)}/{len(results)} operations ran and their results loaded")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
