"""``verify_export(dir)``: detect an export's format and run that format's verifier.

The format comes from meta/quality_split.json (dataset_format) and meta/info.json
(dataset_format, or codebase_version "v2.1" without one); the two must agree. Every
verifier compares info.json totals with the physical output, checks quality_split.json
and reads one state value, one action value and one image frame with the consumer's
reader (pyarrow + PyAV, h5py, mcap with CRC validation).
"""

from __future__ import annotations

from pathlib import Path

from ..fsutil import read_json
from ..manifest import verify_manifest
from .common.exporter import VerifyReport
from .common.meta import INFO
from .common.records import FORMAT_V21, QUALITY_SPLIT_FILE
from .registry import FORMATS, get_spec


def detect_format(root: Path) -> tuple[str | None, list[str]]:
    """The export's format, or None with the reasons it could not be decided."""
    root = Path(root)
    problems: list[str] = []
    from_info = from_split = None
    try:
        info = read_json(root / INFO)
        from_info = info.get("dataset_format")
        if from_info is None:
            from_info = FORMAT_V21 if info.get("codebase_version") == "v2.1" else None
            if from_info is None:
                problems.append(f"{INFO}: no dataset_format and codebase_version {info.get('codebase_version')!r}")
    except (OSError, ValueError) as exc:
        problems.append(f"{INFO}: unreadable ({exc})")
    try:
        from_split = read_json(root / QUALITY_SPLIT_FILE).get("dataset_format")
    except (OSError, ValueError) as exc:
        problems.append(f"{QUALITY_SPLIT_FILE}: unreadable ({exc})")
    if from_info and from_split and from_info != from_split:
        problems.append(f"{INFO} says {from_info!r} but {QUALITY_SPLIT_FILE} says {from_split!r}")
        return None, problems
    fmt = from_info or from_split
    if fmt is not None and fmt not in FORMATS:
        problems.append(f"unknown dataset_format {fmt!r}")
        return None, problems
    return fmt, problems


def verify_export(root: Path) -> VerifyReport:
    root = Path(root)
    fmt, problems = detect_format(root)
    if fmt is None:
        return VerifyReport(path=str(root), dataset_format="unknown", errors=problems or ["format not detected"])
    report = get_spec(fmt).verify(root)
    report.errors.extend(verify_manifest(root, required=False))  # sizes + SHA-256 of meta/manifest.json
    for p in problems:  # e.g. quality_split.json unreadable while info.json named the format
        if p not in report.errors:
            report.errors.append(p)
    return report
