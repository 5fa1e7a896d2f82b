"""tools/lerobot_train_check.py's verdicts, with a stand-in trainer (LeRobot's own is run by hand:
torch is large): finite losses pass, one NaN loss fails, a trainer that dies is named."""

from __future__ import annotations

import importlib.util
import json
import stat
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tool():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("lerobot_train_check", ROOT / "tools" / "lerobot_train_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def fake_venv(tmp_path: Path, losses: str, rc: int = 0) -> Path:
    """A venv whose python answers the version query and logs ``losses`` as lerobot-train does."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    args = tmp_path / "args.txt"
    py.write_text(f"""#!/bin/sh
case "$2" in *importlib.metadata*) echo 0.4.4; exit 0;; esac
shift 2
printf '%s\\n' "$@" > {args}
for l in {losses}; do echo "INFO ot_train.py:435 step:1 smpl:2 loss:$l grdn:1.0 lr:1.0e-05" >&2; done
exit {rc}
""")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return venv


@pytest.mark.parametrize(("losses", "rc", "code", "verdict"), [
    ("1.5 1.25 1.0", 0, 0, "PASS"), ("1.5 nan 1.0", 0, 1, "NAN_LOSS"), ("inf", 0, 1, "NAN_LOSS"),
    ("1.5", 3, 2, "TRAINER_FAILED"), ("", 0, 2, "TRAINER_FAILED")])
def test_verdicts(tmp_path: Path, losses: str, rc: int, code: int, verdict: str) -> None:
    venv = fake_venv(tmp_path, losses, rc)
    out = tmp_path / "r.json"
    assert tool().main(["--venv", str(venv), "--root", str(tmp_path / "ds"), "--policies", "act_quantiles",
                        "--json", str(out)]) == code
    run = json.loads(out.read_text())[0]
    assert run["verdict"] == verdict and run["policy"] == "act_quantiles" and run["lerobot"] == "0.4.4"
    args = (tmp_path / "args.txt").read_text().splitlines()
    assert f"--dataset.root={(tmp_path / 'ds').resolve()}" in args and "--policy.device=cpu" in args
    assert "--eval_freq=0" in args and "--policy.pretrained_backbone_weights=null" in args  # 0.4: no downloads
    assert any('"STATE": "QUANTILES"' in a for a in args)
