"""Start the eva_export nodes: eva_capture, eva_export, eva_upload and eva_console.

eva_console always starts but serves its page only when the config's ``console.enabled`` is
true (off by default: it opens a TCP port that can change verdicts and start jobs).

    ros2 launch eva_export eva.launch.py config:=/path/to/config.yaml

Every node gets the same ``config_file`` parameter. Without ``config:=`` the installed
``share/eva_export/config/default.yaml`` is used (or the repository copy when run from source).
"""

import os
import sys

from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from launch import LaunchDescription

PACKAGE = "eva_export"

#: (executable, node name) of every node this launch file starts.
NODES = (
    ("capture_node", "eva_capture"),
    ("export_node", "eva_export"),
    ("upload_node", "eva_upload"),
    ("console_node", "eva_console"),
)


def default_config_path():
    """The installed default config; falls back to the venv prefix, then the source tree."""
    try:
        from ament_index_python.packages import get_package_share_directory

        return os.path.join(get_package_share_directory(PACKAGE), "config", "default.yaml")
    except Exception:  # noqa: BLE001 - PackageNotFoundError, no AMENT_PREFIX_PATH, no ament_index_python
        pass
    candidates = (
        os.path.join(sys.prefix, "share", PACKAGE, "config", "default.yaml"),
        os.path.join(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config", "default.yaml"
        ),
    )
    for path in candidates:
        if os.path.isfile(path):
            return path
    return candidates[-1]


def generate_launch_description():
    config = LaunchConfiguration("config")
    actions = [
        DeclareLaunchArgument(
            "config",
            default_value=default_config_path(),
            description="Path of the eva_export YAML configuration shared by all nodes",
        )
    ]
    for executable, name in NODES:
        actions.append(
            Node(
                package=PACKAGE,
                executable=executable,
                name=name,
                parameters=[{"config_file": config}],
                output="screen",
            )
        )
    return LaunchDescription(actions)
