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
    "eva_export.faults",
    "eva_export.export.request",
    "eva_export.formats.common.exporter",
    "eva_export.formats.eva_store.exporter",
    "eva_export.formats.eva_store.verify",
    "eva_export.formats.hdf5.exporter",
    "eva_export.formats.lerobot_v3.exporter",
    "eva_export.formats.lerobot_v3.video",
    "eva_export.formats.lerobot_v3.probe",
    "eva_export.formats.lerobot_v3.timing",
    "eva_export.formats.lerobot_v3.tables",
    "eva_export.formats.lerobot_v3.verify",
    "eva_export.formats.common.provenance",
    "eva_export.formats.lerobot_v21.exporter",
    "eva_export.formats.mcap_eva.exporter",
    "eva_export.formats.mcap_eva.chunks",
    "eva_export.formats.mcap_viewer",
    "eva_export.formats.mcap_viewer.layout",
    "eva_export.formats.mcap_viewer.cameras",
    "eva_export.formats.mcap_viewer.exporter",
    "eva_export.formats.mcap_viewer.verify",
    "eva_export.formats.mcap_viewer.readback",
    "eva_export.formats.mcap_viewer.record",
    "eva_export.formats.hdf5.frames",
    "eva_export.formats.common.written",
    "eva_export.formats.registry",
    "eva_export.formats.verify",
    "eva_export.formats.common.card",
    "eva_export.formats.common.nonfinite",
    "eva_export.formats.common.train_checks",
    "eva_export.jobs",
    "eva_export.jobstore",
    "eva_export.jsonbound",
    "eva_export.nodes.common",
    "eva_export.nodes.export_node",
    "eva_export.nodes.upload_node",
    "eva_export.nodes.intake",
    "eva_export",
    "eva_export.capture",
    "eva_export.formats.common",
    "eva_export.formats.common.mcap_summary",
    "eva_export.formats.common.options",
    "eva_export.formats.eva_store.options",
    "eva_export.formats.lerobot_v21.options",
    "eva_export.formats.lerobot_v3.options",
    "eva_export.formats.hdf5.options",
    "eva_export.formats.mcap_eva.options",
    "eva_export.formats.mcap_viewer.options",
    "eva_export.formats.hdf5",
    "eva_export.formats.lerobot_v20",
    "eva_export.formats.lerobot_v21",
    "eva_export.formats.lerobot_v3",
    "eva_export.formats.mcap_eva",
    "eva_export.formats.rosbag2",
    "eva_export.export",
    "eva_export.formats",
    "eva_export.nodes",
    "eva_export.quality",
    "eva_export.upload",
    "eva_export.formats.lerobot_v3.layout",
    "eva_export.quality.judge",
    "eva_export.formats.sources",
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
    "eva_export.formats.common.records",
    "eva_export.formats.common.info_record",
    "eva_export.formats.common.commits",
    "eva_export.formats.common.meta",
    "eva_export.formats.common.stats",
    "eva_export.formats.common.table",
    "eva_export.formats.common.video",
    "eva_export.formats.lerobot_v21.video_copy",
    "eva_export.formats.lerobot_v21.writer",
    "eva_export.formats.lerobot_v21.promises",
    "eva_export.formats.lerobot_v21.episode_writer",
    "eva_export.manifest",
    "eva_export.export.records",
    "eva_export.formats.eva_store",
    "eva_export.formats.eva_store.codecs",
    "eva_export.formats.eva_store.reader",
    "eva_export.formats.eva_store.records",
    "eva_export.formats.common.checks",
    "eva_export.formats.lerobot_v21.episode_files",
    "eva_export.formats.lerobot_v21.episode_stats",
    "eva_export.formats.common.images",
    "eva_export.formats.lerobot_v21.subset",
    "eva_export.formats.common.source",
    "eva_export.formats.common.cut",
    "eva_export.formats.common.sidecar",
    "eva_export.formats.lerobot_v21.source",
    "eva_export.formats.lerobot_v20.source",
    "eva_export.formats.lerobot_v3.source",
    "eva_export.formats.lerobot_v3.meta",
    "eva_export.formats.lerobot_v21.validate",
    "eva_export.formats.common.episode_list",
    "eva_export.formats.common.stats_index",
    "eva_export.formats.common.source_rules",
    "eva_export.formats.lerobot_v21.validate_media",
    "eva_export.formats.common.mp4_index",
    "eva_export.formats.common.mp4_sps",
    "eva_export.formats.common.video_facts",
    "eva_export.formats.common.facts_index",
    "eva_export.formats.lerobot_v21.validate_tables",
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
    "eva_export.pool_worker",
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
    "eva_export.formats.rosbag2.reader",
    "eva_export.formats.rosbag2.cdr",
    "eva_export.capture.video_feed",
    "eva_export.formats.rosbag2.files",
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
