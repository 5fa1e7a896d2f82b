"""eva_export: teleoperation capture to LeRobot v2.1, quality split, export and upload.

The core library (everything except ``eva_export.nodes``) imports no ROS module, so it
is usable and testable without DDS.
"""

__version__ = "0.1.0"
