"""`mypy --strict` runs clean on the typed modules listed here.

MODULES is the list checked, one module per line; add a module once it passes. The mypy
settings (imports followed silently, third-party packages without types) are in pyproject.toml.
The generated eva_export_interfaces package has no type information, so the node modules'
imports of it carry ``# type: ignore[import-untyped]``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(600)

MODULES = [
    # format registry, job engine, job nodes
    "eva_export.export.runner",
    "eva_export.export.request",
    "eva_export.formats.base",
    "eva_export.formats.eva_store",
    "eva_export.formats.eva_store_verify",
    "eva_export.formats.hdf5",
    "eva_export.formats.lerobot_v3",
    "eva_export.formats.v3_video",
    "eva_export.formats.v3_probe",
    "eva_export.formats.v3_timing",
    "eva_export.formats.lerobot_v3_tables",
    "eva_export.formats.v3_verify",
    "eva_export.formats.provenance",
    "eva_export.formats.lerobot_v21",
    "eva_export.formats.mcap_eva",
    "eva_export.formats.mcap_chunks",
    "eva_export.formats.mcap_viewer",
    "eva_export.formats.mcap_viewer.layout",
    "eva_export.formats.mcap_viewer.cameras",
    "eva_export.formats.mcap_viewer.writer",
    "eva_export.formats.mcap_viewer.verify",
    "eva_export.formats.mcap_viewer.readback",
    "eva_export.formats.mcap_viewer.record",
    "eva_export.formats.hdf5_frames",
    "eva_export.formats.written",
    "eva_export.formats.registry",
    "eva_export.formats.verify",
    "eva_export.formats.card",
    "eva_export.formats.nonfinite",
    "eva_export.formats.train_checks",
    "eva_export.jobs",
    "eva_export.jobstore",
    "eva_export.jsonbound",
    "eva_export.nodes.common",
    "eva_export.nodes.export_node",
    "eva_export.nodes.upload_node",
    "eva_export.nodes.intake",
    "eva_export",
    "eva_export.capture",
    "eva_export.dataset",
    "eva_export.export",
    "eva_export.formats",
    "eva_export.nodes",
    "eva_export.quality",
    "eva_export.sources",
    "eva_export.upload",
    "eva_export.formats.v3_layout",
    "eva_export.quality.judge",
    "eva_export.sources.registry",
    "eva_export.nodes.capture_node",
    "eva_export.nodes.console_node",
    "eva_export.nodes.ros_convert",
    "eva_export.nodes.teleop_sim",
    "eva_export.upload.cli",
    "eva_export.upload.gate",
    "eva_export.upload.runner",
    # records, dataset, store, format toolkit
    "eva_export.confine",
    "eva_export.fsutil",
    "eva_export.dataset.records",
    "eva_export.dataset.info_record",
    "eva_export.dataset.commits",
    "eva_export.dataset.meta",
    "eva_export.dataset.stats",
    "eva_export.dataset.table",
    "eva_export.dataset.video",
    "eva_export.dataset.video_copy",
    "eva_export.dataset.writer",
    "eva_export.dataset.promises",
    "eva_export.dataset.episode_writer",
    "eva_export.manifest",
    "eva_export.export.records",
    "eva_export.store",
    "eva_export.store.codecs",
    "eva_export.store.reader",
    "eva_export.store.records",
    "eva_export.formats.checks",
    "eva_export.formats.episode_files",
    "eva_export.formats.episode_stats",
    "eva_export.formats.images",
    "eva_export.formats.source",
    "eva_export.sources.base",
    "eva_export.sources.cut",
    "eva_export.sources.sidecar",
    "eva_export.sources.lerobot_v21",
    "eva_export.sources.lerobot_v20",
    "eva_export.sources.lerobot_v30",
    "eva_export.sources.v30_meta",
    "eva_export.dataset.validate",
    "eva_export.dataset.episode_list",
    "eva_export.dataset.stats_index",
    "eva_export.dataset.source_rules",
    "eva_export.dataset.validate_media",
    "eva_export.dataset.mp4_index",
    "eva_export.dataset.mp4_sps",
    "eva_export.dataset.video_facts",
    "eva_export.dataset.facts_index",
    "eva_export.dataset.validate_tables",
    "eva_export.config",
    "eva_export.sftp_settings",
    "eva_export.errors",
    "eva_export.cli",
    "eva_export.export.split",
    "eva_export.export.plan_list",
    "eva_export.export.build",
    "eva_export.export.units",
    "eva_export.export.finite_runs",
    "eva_export.export.v3_direct",
    "eva_export.export.v3_writer",
    "eva_export.export.v3_episodes",
    "eva_export.export.v3_records",
    "eva_export.export.v3_feed",
    "eva_export.export.assemble",
    "eva_export.export.batch",
    "eva_export.pool",
    "eva_export.export.publish",
    "eva_export.export.paths",
    "eva_export.export.merge",
    "eva_export.export.clean",
    "eva_export.capture.align",
    "eva_export.capture.align_types",
    "eva_export.capture.clock",
    "eva_export.capture.track",
    "eva_export.capture.checks",
    "eva_export.capture.stream",
    "eva_export.capture.episode",
    "eva_export.capture.recorder",
    "eva_export.capture.results",
    "eva_export.capture.save_worker",
    "eva_export.capture.ingest_jobs",
    "eva_export.capture.writer_cache",
    "eva_export.capture.ingest",
    "eva_export.capture.bagreader",
    "eva_export.capture.bagcdr",
    "eva_export.capture.video_feed",
    "eva_export.capture.bagfiles",
    "eva_export.capture.room",
    "eva_export.capture.intake",
    "eva_export.capture.features",
    # quality rules and their offline driver
    "eva_export.quality.rules",
    "eva_export.quality.kinematics",
    "eva_export.quality.offline",
    "eva_export.quality.store",
    "eva_export.quality.cli",
    "eva_export.quality.service",
    "eva_export.upload.backends",
    "eva_export.export.faults",
    "eva_export.upload.sftp",
    "eva_export.upload.job",
    "eva_export.upload.connection",
    "eva_export.upload.transfer",
    "eva_export.upload.bulk_openssh",
    "eva_export.upload.remotefs",
    "eva_export.upload.remotelock",
    "eva_export.upload.remote",
    "eva_export.upload.limiter",
    "eva_export.upload.snapshot",
    # web console
    "eva_export.console",
    "eva_export.console.data",
    "eva_export.console.pages",
    "eva_export.console.report",
    "eva_export.console.report_source",
    "eva_export.console.server",
    "eva_export.console.httpio",
    "eva_export.console.status",
    "eva_export.console.report_svg",
]


def test_mypy_strict() -> None:
    args = [sys.executable, "-m", "mypy", "--strict", "--config-file", str(ROOT / "pyproject.toml")]
    for module in MODULES:
        args += ["-m", module]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=550)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_module_is_checked() -> None:
    """A new module cannot escape --strict: every file under eva_export/ is in MODULES."""
    pkg = ROOT / "eva_export"
    found = set()
    for path in pkg.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    assert sorted(found - set(MODULES)) == []
