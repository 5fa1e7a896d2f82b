"""LeRobot v3.0: its layout, its reading as a source, and the lerobot_v3 exporter (data and video shards, episode metadata) with its verifier."""
