"""The quality marker written into every exported subset: meta/quality_split.json.

The record lives with the other on-disk records in eva_export.formats.common.records (formats/ and
upload/ read it too); this module re-exports it for the export package and older imports.
"""

from __future__ import annotations

from ..formats.common.records import ACCEPTED, QUALITY_SPLIT_FILE, REJECTED, SPLIT_RULE, QualitySplit, Subset

__all__ = ["ACCEPTED", "QUALITY_SPLIT_FILE", "REJECTED", "SPLIT_RULE", "QualitySplit", "Subset"]
