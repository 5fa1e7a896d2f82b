#!/usr/bin/env python3
"""Train a few steps with LeRobot's OWN trainer on a LeRobot v3.0 dataset: pass = finite loss.

Loading is not training: a subset whose stats.json holds one NaN loads in every reader, and
every sample the trainer normalises is then NaN. This runs ``lerobot-train`` (CPU, no
downloads, no pretrained weights) from a LeRobot venv made by tools/lerobot_venvs.sh:

    python3 tools/lerobot_train_check.py --venv /tmp/lerobot044 --root DIR [--root DIR2 ...]
    python3 tools/lerobot_train_check.py --venv /tmp/lerobot061 --root DIR --policies act diffusion

Policies (``--policies``, default all three):

  act            a small ACT (64-wide, one encoder and one decoder layer, chunk 4), LeRobot's
                 default normalisation (MEAN_STD)
  act_quantiles  the same ACT with state and action normalised by quantiles (q01/q99), as pi0.5
                 does; it raises without q01/q99 in stats.json
  diffusion      a small diffusion policy (UNet widths 32/64, horizon 8)

Each runs ``--steps`` optimizer steps (default 3, batch 2) and reads the ``loss:`` LeRobot
logs each step. Prints one line per (dataset, policy); exits 0 when every loss of every run is
finite, 1 when a loss is NaN/inf, 2 when the trainer failed (its last lines are printed).
Stays out of ``make test``: torch is large. Needs only the standard library here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The torchvision wheel of the 0.3/0.4 venvs is a CUDA build: on CPU torch its import fails unless
# the two op schemas LeRobot never calls are declared first (as tools/lerobot_reader_check.py does).
BOOT = """
import sys, torch
if torch.__version__.endswith("+cpu"):  # beside a CUDA torchvision; a matching pair imports as it is
    _lib = torch.library.Library("torchvision", "FRAGMENT")
    _lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
from lerobot.scripts.lerobot_train import main
sys.argv = ["lerobot-train", *sys.argv[1:]]
sys.exit(main())
"""

SMALL_ACT = ["--policy.type=act", "--policy.dim_model=64", "--policy.n_encoder_layers=1",
             "--policy.n_decoder_layers=1", "--policy.chunk_size=4", "--policy.n_action_steps=4",
             "--policy.dim_feedforward=128", "--policy.n_heads=2"]
POLICIES = {
    "act": SMALL_ACT,
    "act_quantiles": [*SMALL_ACT, '--policy.normalization_mapping={"VISUAL": "MEAN_STD", "STATE": "QUANTILES", '
                                  '"ACTION": "QUANTILES"}'],
    "diffusion": ["--policy.type=diffusion", "--policy.down_dims=[32,64]", "--policy.horizon=8",
                  "--policy.n_action_steps=4", "--policy.n_obs_steps=2", "--policy.crop_shape=null",
                  "--policy.diffusion_step_embed_dim=32", "--policy.spatial_softmax_num_keypoints=8"],
}
LOSS = re.compile(r"\bloss:(\S+)")


@dataclass
class Run:
    root: str
    policy: str
    lerobot: str
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    returncode: int = 0
    tail: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if self.losses and not all(math.isfinite(x) for x in self.losses):
            return "NAN_LOSS"
        if self.returncode != 0 or not self.losses:
            return "TRAINER_FAILED"
        return "PASS"


def lerobot_version(python: Path) -> str:
    out = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('lerobot'))"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def train(python: Path, version: str, root: Path, policy: str, steps: int, timeout: float) -> Run:
    run = Run(str(root), policy, version)
    with tempfile.TemporaryDirectory(prefix="eva-train-") as tmp:
        args = [f"--dataset.repo_id=local/{root.name}", f"--dataset.root={root}",
                "--dataset.video_backend=torchcodec", "--policy.device=cpu", "--policy.push_to_hub=false",
                "--policy.pretrained_backbone_weights=null", f"--steps={steps}", "--batch_size=2",
                "--num_workers=0", "--log_freq=1", "--save_checkpoint=false", "--wandb.enable=false",
                f"--output_dir={Path(tmp) / 'out'}", "--seed=1000", *POLICIES[policy]]
        if version.startswith("0.4."):
            args.append("--eval_freq=0")  # 0.6 refuses the flag (no eval without an env there)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled",
               "HF_LEROBOT_HOME": str(Path(tmp) / "home")}
        t0 = time.monotonic()
        try:
            proc = subprocess.run([str(python), "-c", BOOT, *args], capture_output=True, text=True,
                                  timeout=timeout, env=env)
            out, run.returncode = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            run.returncode = -9
        run.seconds = round(time.monotonic() - t0, 1)
    for m in LOSS.finditer(out):
        try:
            run.losses.append(float(m.group(1)))
        except ValueError:
            run.losses.append(math.nan)
    if run.verdict != "PASS":
        run.tail = [ln for ln in out.splitlines() if ln.strip()][-12:]
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", required=True, type=Path, help="a LeRobot venv (tools/lerobot_venvs.sh)")
    ap.add_argument("--root", required=True, type=Path, action="append", help="a LeRobot v3.0 dataset (repeatable)")
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per training run")
    ap.add_argument("--json", type=Path, help="write every run's result here")
    args = ap.parse_args(argv)
    python = args.venv / "bin" / "python"
    version = lerobot_version(python)
    runs = []
    for root in args.root:
        for policy in args.policies:
            r = train(python, version, root.resolve(), policy, args.steps, args.timeout)
            runs.append(r)
            losses = ", ".join(f"{x:.4g}" for x in r.losses) or "none"
            print(f"[lerobot {version}] {r.verdict:<14} {policy:<13} {r.seconds:>6.1f} s  loss: {losses}  {root}")
            for ln in r.tail:
                print(f"    | {ln[-200:]}")
            sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "verdict": r.verdict} for r in runs], indent=2))
    if any(r.verdict == "TRAINER_FAILED" for r in runs):
        return 2
    return 1 if any(r.verdict == "NAN_LOSS" for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
