"""Quality rules (no ROS imports): one rule module for live capture and ``eva-export check``.

``rules`` / ``kinematics`` judge an episode's evidence, ``offline`` reads that evidence from a
dataset's files, ``store`` keeps the verdicts (rows or the meta/eva_quality.jsonl sidecar).
"""
