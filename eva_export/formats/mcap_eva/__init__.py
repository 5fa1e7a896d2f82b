"""MCAP in the eva-client MessagePack profile, one file per episode: exporter, chunk writer and verifier."""
