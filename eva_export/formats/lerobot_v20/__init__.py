"""LeRobot v2.0, read as a source (its per-episode layout validated by the v2.1 rules)."""
