# shellcheck shell=bash
# The virtualenv's stand-in for /opt/ros/<distro>/setup.bash: makes a venv with the ROS 2 PyPI
# wheels (tools/setup.sh) look like a ROS 2 install to colcon, CMake, ament and the nodes.
#
#   source tools/venv_ros_setup.bash [VENV]      # VENV defaults to <repo>/.venv
#   tools/robot_install.sh <workspace>           # then the robot steps run unchanged
#
# Used by tests/test_colcon_install.py to run tools/robot_install.sh the way a robot runs it
# after `source /opt/ros/kilted/setup.bash`. Not needed on a real ROS 2 install.
#
# Why the library path is set here: the wheels' ros_wheels_bootstrapper re-executes Python with
# LD_LIBRARY_PATH built from a set (its order changes from run to run), so with a workspace
# overlay on top of the venv the dynamic loader could pick a package's libraries from either
# prefix. Setting the path once here, with the bootstrapper marked done, gives the overlay order
# every ROS setup file gives: later `source install/setup.bash` puts the workspace first.

_eva_venv="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv}"
_eva_venv="$(cd "$_eva_venv" && pwd)"
if [[ ! -x "$_eva_venv/bin/python" ]]; then
  echo "venv_ros_setup.bash: no Python at $_eva_venv/bin/python" >&2
  return 1 2>/dev/null || exit 1
fi
_eva_site="$("$_eva_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
_eva_ld="$_eva_venv/lib"
for _eva_d in "$_eva_site"/ros_*.libs; do
  [[ -d "$_eva_d" ]] && _eva_ld="$_eva_ld:$_eva_d"
done
export VIRTUAL_ENV="$_eva_venv"
export PATH="$_eva_venv/bin:$PATH"
export AMENT_PREFIX_PATH="$_eva_venv${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
export CMAKE_PREFIX_PATH="$_eva_venv${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export LD_LIBRARY_PATH="$_eva_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export _ROS_WHEELS_BOOTSTRAP_COMPLETE=1
export ROS_DISTRO="${ROS_DISTRO:-kilted}"
export ROS_VERSION=2 ROS_PYTHON_VERSION=3
unset _eva_venv _eva_site _eva_ld _eva_d
