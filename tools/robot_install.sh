#!/usr/bin/env bash
# Install eva_export on a robot with ROS 2: system dependencies (rosdep), the pip-only Python
# dependencies at their pinned versions, and a colcon build of eva_export_interfaces and
# eva_export into a workspace.
#
#   source /opt/ros/kilted/setup.bash
#   mkdir -p ~/eva_ws/src && git clone <this repository> ~/eva_ws/src/eva_export
#   ~/eva_ws/src/eva_export/tools/robot_install.sh ~/eva_ws
#   source ~/eva_ws/install/setup.bash
#   ros2 launch eva_export eva.launch.py config:=/etc/eva_export/robot.yaml
#
# Python environment: inside an active virtualenv ($VIRTUAL_ENV) that one is used. Otherwise
# <workspace>/venv is created with --system-site-packages (it sees the ROS and apt packages;
# pip installs only what requirements-robot.txt adds), because Ubuntu 24.04's Python refuses
# `pip install` outside a venv (PEP 668). colcon runs with that interpreter, so the installed
# node scripts use it too and `ros2 run` / `ros2 launch` need nothing more.
#
# Environment: EVA_SKIP_ROSDEP=1 skips the rosdep step (for machines where the apt packages
# of package.xml are already installed, or a venv-based ROS such as tests/test_colcon_install.py).
# Extra arguments after the workspace go to `colcon build` (e.g. --symlink-install).
set -euo pipefail

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WS="$(mkdir -p "${1:-$PWD}" && cd "${1:-$PWD}" && pwd)"
shift || true

log() { printf '[robot_install] %s\n' "$*"; }
die() { log "ERROR: $*"; exit 1; }

[[ -n "${AMENT_PREFIX_PATH:-}" ]] ||
  die "no ROS 2 environment: run 'source /opt/ros/<distro>/setup.bash' first"
[[ "$SRC" != "$WS" ]] || die "the workspace must not be the source tree (use e.g. ~/eva_ws with the clone in ~/eva_ws/src)"

# --- Python environment ------------------------------------------------------------------------
if [[ -n "${VIRTUAL_ENV:-}" ]]; then
  PY="$VIRTUAL_ENV/bin/python"
  log "using the active virtualenv $VIRTUAL_ENV"
else
  if [[ ! -x "$WS/venv/bin/python" ]]; then
    log "creating $WS/venv (--system-site-packages: ROS and apt packages stay visible)"
    python3 -m venv --system-site-packages "$WS/venv" ||
      die "python3 -m venv failed (apt install python3-venv)"
  fi
  touch "$WS/venv/COLCON_IGNORE"
  PY="$WS/venv/bin/python"
fi
"$PY" -c 'import rclpy' 2>/dev/null ||
  die "$PY cannot import rclpy: source the ROS 2 setup.bash of this distribution first"
"$PY" -c 'import colcon_core' 2>/dev/null ||
  die "colcon is not importable by $PY (apt install python3-colcon-common-extensions)"

# --- system dependencies (package.xml keys) ----------------------------------------------------
if [[ -n "${EVA_SKIP_ROSDEP:-}" ]]; then
  log "EVA_SKIP_ROSDEP set: not running rosdep"
else
  command -v rosdep >/dev/null 2>&1 ||
    die "rosdep not found (apt install python3-rosdep; sudo rosdep init; rosdep update), or set EVA_SKIP_ROSDEP=1"
  log "rosdep install (apt packages of package.xml)"
  rosdep install -y --ignore-src --rosdistro "${ROS_DISTRO:?ROS_DISTRO is not set}" \
    --from-paths "$SRC" "$SRC/interfaces"
fi

# --- pip-only dependencies (no rosdep key), pinned ---------------------------------------------
log "pip install -r requirements-robot.txt"
"$PY" -m pip install --disable-pip-version-check -q -r "$SRC/requirements-robot.txt"

# --- build ---------------------------------------------------------------------------------------
log "colcon build in $WS"
cd "$WS"
"$PY" -m colcon build --base-paths "$SRC" "$SRC/interfaces" \
  --cmake-args -DBUILD_TESTING=OFF -DPython3_EXECUTABLE="$PY" \
  "$@"

# --- check: the installed nodes import (all Python dependencies present) ------------------------
log "checking the install"
(
  cd /
  set +u  # setup.bash files read unset variables
  # shellcheck disable=SC1091
  source "$WS/install/setup.bash"
  "$PY" -c 'import eva_export_interfaces.srv, eva_export.nodes.capture_node, eva_export.nodes.export_node, eva_export.nodes.upload_node'
) || die "the installed nodes do not import (see the error above)"
log "done: source $WS/install/setup.bash; ros2 launch eva_export eva.launch.py config:=<your config.yaml>"
