"""Export sources: one module per dataset kind (see base.py and docs/sources.md)."""
