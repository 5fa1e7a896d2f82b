"""Export formats: one module per on-disk format, each with its writer and verifier."""
