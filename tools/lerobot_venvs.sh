#!/usr/bin/env bash
# Creates the two virtualenvs that hold LeRobot's OWN dataset readers, used by
# tools/lerobot_reader_check.py to prove our datasets load:
#
#   /tmp/lerobot033  lerobot 0.3.3  (last release that reads codebase v2.1)
#   /tmp/lerobot044  lerobot 0.4.4  (reads codebase v3.0; newest release on Python 3.11)
#
#   tools/lerobot_venvs.sh            # both
#   tools/lerobot_venvs.sh 033        # only one of them (033 or 044)
#
# Env: LEROBOT_VENV_BASE (default /tmp), EVA_PYTHON (default python3.11), LEROBOT_VENV_FORCE=1
# to rebuild. Idempotent: a venv whose .eva_stamp matches its package list here and whose smoke
# import passes is left alone. Never put these venvs inside the repo (about 1.5 GB each).
#
# Why the install is done by hand (see shared notes "Running LeRobot's own reader"): every
# lerobot release pins torch below the only CPU build available here (torch 2.13.0, a local
# wheel); anything else pulls multi-GB CUDA builds. So torch goes first, then lerobot,
# torchvision and torchcodec WITHOUT deps, then lerobot's runtime deps by hand.
set -euo pipefail

BASE="${LEROBOT_VENV_BASE:-/tmp}"
PY="${EVA_PYTHON:-python3.11}"

TORCH="torch==2.13.0"
NODEPS=(torchvision==0.28.0 torchcodec==0.13.0)
# lerobot's runtime deps for reading datasets, kept inside each release's OWN pins (only the
# torch family has to break its pins), so the reader behaves as it does for LeRobot users.
COMMON_DEPS=("numpy<2.3" pandas pyarrow pillow "jsonlines>=4,<5" "draccus==0.10.0"
             "termcolor>=2.4,<4" "einops>=0.8,<0.9" "deepdiff>=7.0.1,<9")
DEPS_033=("datasets>=2.19,<=3.6.0" "huggingface-hub>=0.34.2,<0.36" "av>=14.2" "packaging>=24.2")
DEPS_044=("datasets>=4,<5" "huggingface-hub>=0.34.2,<0.36" "av>=15,<16" "packaging>=24.2,<26"
          "accelerate>=1.10,<2" "setuptools>=71,<81")

log() { printf '[lerobot-venvs] %s\n' "$*"; }

# The torchvision wheel is a CUDA build; on CPU torch its import fails with
# "operator torchvision::nms does not exist" unless these schemas are declared first.
SMOKE='
import torch
_lib = torch.library.Library("torchvision", "FRAGMENT")
_lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
import torchvision, torchcodec, lerobot
from lerobot.datasets.lerobot_dataset import LeRobotDataset
import importlib.metadata as md
print(" ".join(f"{p}=={md.version(p)}" for p in ("lerobot", "torch", "torchvision", "torchcodec",
      "datasets", "huggingface-hub", "av", "numpy", "pyarrow", "pandas")))
'

ensure_ffmpeg() {
  # torchcodec loads the system's libavcodec/libavformat (Debian ffmpeg).
  if ! command -v ffmpeg >/dev/null 2>&1; then
    log "installing Debian ffmpeg (torchcodec needs its shared libraries)"
    apt-get update -qq && apt-get install -y -qq ffmpeg
  fi
}

make_venv() {
  local tag="$1" ver="$2"; shift 2
  local extra=("$@")
  local venv="$BASE/lerobot$tag"
  local stamp="$venv/.eva_stamp"
  local want="$PY lerobot==$ver $TORCH ${NODEPS[*]} ${COMMON_DEPS[*]} ${extra[*]}"
  if [[ -z "${LEROBOT_VENV_FORCE:-}" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]] &&
     HF_HUB_OFFLINE=1 "$venv/bin/python" -c "$SMOKE" >/dev/null 2>&1; then
    log "$venv up to date (lerobot $ver); nothing to do"
    return 0
  fi
  local t0; t0=$(date +%s)
  rm -rf "$venv"
  log "creating $venv with $PY"
  "$PY" -m venv "$venv"
  local pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  "${pip[@]}" -U pip >/dev/null
  log "[$tag] $TORCH (CPU wheel from local disk)"
  "${pip[@]}" "$TORCH"
  log "[$tag] --no-deps lerobot==$ver ${NODEPS[*]}"
  "${pip[@]}" --no-deps "lerobot==$ver" "${NODEPS[@]}"
  log "[$tag] lerobot's runtime deps by hand: ${COMMON_DEPS[*]} ${extra[*]}"
  "${pip[@]}" "$TORCH" "${COMMON_DEPS[@]}" "${extra[@]}"
  log "[$tag] smoke import"
  HF_HUB_OFFLINE=1 "$venv/bin/python" -c "$SMOKE"
  echo "$want" > "$stamp"
  # Show dependency conflicts other than the expected ones (torch family; unneeded extras).
  "$venv/bin/python" -m pip check 2>&1 |
    grep -v -E "which is not installed|requirement (torch|torchvision|torchcodec)[<>=]" |
    sed "s/^/[lerobot-venvs] [$tag] pip check: /" || true
  log "[$tag] done in $(( $(date +%s) - t0 )) s ($(du -sh "$venv" | cut -f1))"
}

which_ones=("${@:-033 044}")
# shellcheck disable=SC2206
which_ones=(${which_ones[*]})
ensure_ffmpeg
for w in "${which_ones[@]}"; do
  case "$w" in
    033) make_venv 033 0.3.3 "${DEPS_033[@]}" ;;
    044) make_venv 044 0.4.4 "${DEPS_044[@]}" ;;
    *) echo "unknown venv '$w' (use 033 or 044)" >&2; exit 2 ;;
  esac
done
