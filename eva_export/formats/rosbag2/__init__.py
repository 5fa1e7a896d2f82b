"""rosbag2 MCAP bags, read for ingest: files and episode cuts, the message stream, CDR of images and joint states."""
