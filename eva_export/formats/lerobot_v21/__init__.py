"""LeRobot v2.1, the native layout: the crash-safe capture writer, source validation and reading, the staged split subsets every other exporter reads, and the lerobot_v21 exporter."""
