"""MCAP for robotics viewers (Foxglove, Lichtblick, Rerun): the ``mcap_foxglove`` format.

``layout`` holds the file's records (topics, schemas, the JointState encoding), ``cameras`` the
camera messages, ``exporter`` the exporter and ``verify`` its verifier, which reads every message
back through the viewers' own decoder libraries (mcap-protobuf-support, mcap-ros2-support).
"""
