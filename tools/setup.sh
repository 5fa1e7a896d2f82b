#!/usr/bin/env bash
# The one setup path of eva_export for developers, CI and users.
#
#   tools/setup.sh          # or: make setup
#
# Creates .venv (Python 3.11) with the pinned ROS 2 kilted wheels from PyPI and the Python
# dependencies, builds the eva_export_interfaces package (../srv, ../msg) with plain cmake into
# .venv, and installs eva_export in editable mode. Idempotent: when .venv/.stamp matches the hash
# of the inputs it does nothing. Set EVA_SETUP_FORCE=1 to redo everything.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
BUILD_DIR="$ROOT/build/interfaces"
STAMP="$VENV/.stamp"
APT_PACKAGES=(openssh-server ffmpeg hdf5-tools cmake systemd chromium)  # systemd: systemd-analyze verify of the unit; chromium: the console browser tests
T_ALL=$(date +%s.%N)

log() { printf '[setup] %s\n' "$*"; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(date +%s.%N)"; }
step_start() { T_STEP=$(date +%s.%N); log "$1 ..."; }
step_end() { log "$1 done in $(elapsed "$T_STEP") s"; }

# --- inputs hash ------------------------------------------------------------------------------
inputs_hash() {
  {
    echo "python=${EVA_PYTHON:-python3.11}"
    find requirements*.txt constraints.txt srv msg interfaces setup.py setup.cfg package.xml tools/setup.sh \
      -type f ! -name '*.pyc' 2>/dev/null | LC_ALL=C sort | while read -r f; do
        printf '%s ' "$f"; sha256sum "$f" | cut -d' ' -f1
      done
  } | sha256sum | cut -d' ' -f1
}
HASH="$(inputs_hash)"
if [[ -z "${EVA_SETUP_FORCE:-}" && -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$HASH" ]]; then
  log "up to date (.venv/.stamp matches); nothing to do"
  exit 0
fi

# --- system packages --------------------------------------------------------------------------
pick_python() {
  local c
  for c in "${EVA_PYTHON:-}" python3.11 python3; do
    [[ -n "$c" ]] || continue
    if command -v "$c" >/dev/null 2>&1 &&
       "$c" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
      command -v "$c"; return 0
    fi
  done
  return 1
}

step_start "system packages"
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# Debian's python3.11 needs python3-venv for `-m venv` and python3-dev for the generated
# C extensions; pyenv/other builds already have both.
PY="$(pick_python || true)"
if [[ -n "$PY" ]]; then
  "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
  "$PY" -c 'import os, sysconfig, sys; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' ||
    missing+=(python3-dev)
else
  missing+=(python3.11 python3.11-venv python3.11-dev)
fi
if ((${#missing[@]})); then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    # another apt/dpkg (unattended upgrades on a robot) may hold the locks: wait, bounded
    python3 "$ROOT/tools/apt_lock.py" --timeout "${EVA_APT_WAIT_S:-600}" || exit 1
    log "installing with apt-get: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    mkdir -p "$ROOT/build"
    APT_WAIT=(-o "DPkg::Lock::Timeout=${EVA_APT_WAIT_S:-600}")
    { apt-get "${APT_WAIT[@]}" update -qq &&
      apt-get "${APT_WAIT[@]}" install -y -qq --no-install-recommends "${missing[@]}"; } \
      >"$ROOT/build/apt.log" 2>&1 || { tail -30 "$ROOT/build/apt.log"; log "ERROR: apt-get failed"; exit 1; }
  else
    log "WARNING: missing system packages; install them with:"
    log "  sudo apt-get install -y --no-install-recommends ${missing[*]}"
  fi
else
  log "all present: ${APT_PACKAGES[*]}"
fi
command -v cmake >/dev/null 2>&1 || { log "ERROR: cmake is required"; exit 1; }
PY="$(pick_python)" || { log "ERROR: Python 3.11 is required (set EVA_PYTHON)"; exit 1; }
step_end "system packages"

# --- virtualenv -------------------------------------------------------------------------------
step_start "virtualenv (.venv with $PY)"
if [[ -x "$VENV/bin/python" ]] &&
   ! "$VENV/bin/python" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
  log "existing .venv is not Python 3.11; recreating"
  rm -rf "$VENV"
fi
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
rm -f "$STAMP"
step_end "virtualenv"

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# pip, quiet; drops the "Location ... is ignored" noise of local index settings
pip_q() { "${PIP[@]}" install -q "$@" 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }; }

# --- interfaces: built once per set of inputs, then restored from a cache ------------------------
# The interface build (every type support of srv/ and msg/) is the longest step. Its output
# depends only on the definitions, the ROS wheels and the interpreter, so it is kept in
# $EVA_SETUP_CACHE (default ~/.cache/eva_export) under the hash of those inputs: a fresh clone
# or a redone .venv on the same machine restores it in a second. Only two installed files name
# the venv's path; a restore rewrites them.
CACHE_DIR="${EVA_SETUP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eva_export}"
interfaces_key() {
  {
    "$VENV/bin/python" -c 'import platform, sys; print(sys.version, platform.machine())'
    find srv msg interfaces requirements-ros.txt constraints.txt -type f | LC_ALL=C sort | xargs sha256sum
  } | sha256sum | cut -d' ' -f1
}
interfaces_import() { (cd / && "$VENV/bin/python" -c 'from eva_export_interfaces.srv import StartCapture') >/dev/null 2>&1; }
interfaces_restore() {
  local tar="$1"
  [[ -f "$tar" && -f "$tar.prefix" ]] || return 1
  local old; old="$(cat "$tar.prefix")"
  tar -xf "$tar" -C "$VENV" || return 1
  if [[ "$old" != "$VENV" ]]; then
    tar -tf "$tar" | (cd "$VENV" && xargs -r grep -lIF "$old" -- 2>/dev/null || true) |
      while read -r f; do sed -i "s|$old|$VENV|g" "$VENV/$f"; done
  fi
  interfaces_import
}
interfaces_build() {
  mkdir -p "$BUILD_DIR"
  if [[ -f "$BUILD_DIR/CMakeCache.txt" ]] &&
     ! grep -qx "CMAKE_INSTALL_PREFIX:PATH=$VENV" "$BUILD_DIR/CMakeCache.txt"; then
    rm -rf "$BUILD_DIR"
  fi
  AMENT_PREFIX_PATH="$VENV" cmake -S interfaces -B "$BUILD_DIR" \
    -DCMAKE_PREFIX_PATH="$VENV" -DCMAKE_INSTALL_PREFIX="$VENV" \
    -DPython3_EXECUTABLE="$VENV/bin/python" -DBUILD_TESTING=OFF \
    -DCMAKE_BUILD_TYPE=Release >"$ROOT/build/interfaces-configure.log" 2>&1 ||
    { tail -50 "$ROOT/build/interfaces-configure.log"; log "ERROR: cmake configure failed (log: build/interfaces-configure.log)"; return 1; }
  AMENT_PREFIX_PATH="$VENV" cmake --build "$BUILD_DIR" -j "$(nproc)" >"$ROOT/build/interfaces-build.log" 2>&1 ||
    { tail -50 "$ROOT/build/interfaces-build.log"; log "ERROR: interface build failed (log: build/interfaces-build.log)"; return 1; }
  cmake --install "$BUILD_DIR" >"$ROOT/build/interfaces-install.log" 2>&1 ||
    { tail -50 "$ROOT/build/interfaces-install.log"; log "ERROR: interface install failed"; return 1; }
  interfaces_import || { log "ERROR: eva_export_interfaces does not import after the build"; return 1; }
}
interfaces_save() {
  local tar="$1" tmp="$1.$$.tmp"
  mkdir -p "$CACHE_DIR"
  sed "s|^$VENV/||" "$BUILD_DIR/install_manifest.txt" | tar -cf "$tmp" -C "$VENV" -T - 2>/dev/null &&
    echo "$VENV" >"$tar.prefix" && mv -f "$tmp" "$tar" || { rm -f "$tmp"; log "(interface cache not written)"; }
}
interfaces() {  # restore or build, then cache; logs its own time (it runs beside pip)
  local t0 key tar
  t0=$(date +%s.%N); key="$(interfaces_key)"; tar="$CACHE_DIR/interfaces-$key.tar"
  if [[ -z "${EVA_SETUP_FORCE:-}" ]] && interfaces_restore "$tar"; then
    log "eva_export_interfaces restored from $tar in $(elapsed "$t0") s"
    return 0
  fi
  interfaces_build || return 1
  interfaces_save "$tar"
  log "eva_export_interfaces built in $(elapsed "$t0") s (cached: $tar)"
}

# The ROS wheels first: the interface build needs only them (and numpy), so it runs while pip
# installs everything else.
step_start "pip install the ROS wheels (requirements-ros.txt)"
pip_q -r requirements-ros.txt numpy -c constraints.txt
step_end "pip install the ROS wheels"
mkdir -p "$ROOT/build"
step_start "build eva_export_interfaces (cmake -> .venv) beside pip install requirements.txt"
interfaces &
IF_PID=$!
# constraints.txt pins every transitive dependency (tools/pins.py): a fresh clone gets what CI ran.
pip_q -r requirements-ros.txt -r requirements.txt -c constraints.txt || { kill "$IF_PID" 2>/dev/null; exit 1; }
log "pip install requirements.txt done in $(elapsed "$T_STEP") s"
wait "$IF_PID" || { log "ERROR: eva_export_interfaces"; exit 1; }
step_end "pip install and interfaces"

# --- eva_export -------------------------------------------------------------------------------
step_start "pip install -e . (eva_export)"
# setuptools 80 dropped `[develop] script_dir`, which ament_python packages (and colcon) use.
pip_q "setuptools>=68,<80" wheel -c constraints.txt
pip_q --no-build-isolation -e .
# Editable installs skip data_files: link the ament index marker, package.xml, launch and
# config into the venv prefix so ament_index / launch find them (live edits included).
SHARE="$VENV/share/eva_export"
mkdir -p "$SHARE" "$VENV/share/ament_index/resource_index/packages"
ln -sfn "$ROOT/resource/eva_export" "$VENV/share/ament_index/resource_index/packages/eva_export"
ln -sfn "$ROOT/package.xml" "$SHARE/package.xml"
ln -sfn "$ROOT/launch" "$SHARE/launch"
ln -sfn "$ROOT/config" "$SHARE/config"
# setup.cfg puts the console scripts in lib/eva_export (where `ros2 run` looks); also put
# them on the venv's PATH.
if [[ -d "$VENV/lib/eva_export" ]]; then
  for script in "$VENV"/lib/eva_export/*; do
    [[ -e "$VENV/bin/$(basename "$script")" ]] || ln -s "../lib/eva_export/$(basename "$script")" "$VENV/bin/"
  done
fi
(cd / && "$VENV/bin/python" -c 'import eva_export')
step_end "pip install -e ."

echo "$HASH" >"$STAMP"
log "ready in $(elapsed "$T_ALL") s: use .venv/bin/python (ROS env: ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST, ROS_DOMAIN_ID=<1..101>)"
