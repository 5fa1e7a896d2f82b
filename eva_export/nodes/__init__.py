"""ROS 2 nodes of eva_export: thin rclpy wrappers that declare parameters, create services
and topics, and hand the work to the core library (which imports no ROS module).

Run one with ``ros2 run eva_export capture_node`` (ROS install) or
``python -m eva_export.nodes.capture_node --ros-args -p config_file:=cfg.yaml`` (venv).
"""
