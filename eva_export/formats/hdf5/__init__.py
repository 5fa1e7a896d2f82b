"""HDF5, one file per episode with the images inside: exporter, frame writer and verifier."""
