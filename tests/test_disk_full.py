"""Exports on a full disk (a real tmpfs filled to a known free amount): no native crash, a failed
job naming the path and the free space, nothing published, no phantom job, and a rerun completes
once space is freed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from diskfull import fill, tmpfs, unfill
from dsfactory import Ep, make_dataset, make_subset
from export_faults import faulty_service

from eva_export.config import parse_config
from eva_export.errors import EvaError
from eva_export.export.paths import ExportPaths
from eva_export.export.runner import ExportService
from eva_export.formats.registry import FORMATS, get_exporter
from eva_export.jobs import COMPLETED, FAILED

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "fs", 16) as root:
        yield root


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def _raw(fs: Path, frames: int = 30, cameras: int = 2) -> Path:
    # flat synthetic frames: the MP4s (and so the native split) are tiny, the decoded frames are not
    return make_dataset(fs / "logs" / "demo" / "raw", [Ep(frames=frames), Ep(frames=frames, quality="red")],
                        cameras=cameras, width=64, height=48)


def _service(fs: Path, **kw: Any) -> ExportService:
    return faulty_service(parse_config({"collection": {"log_dir": str(fs / "logs")}}), recover=False, **kw)


def _nothing_published(raw: Path, fmt: str) -> None:
    paths = ExportPaths.of(raw, fmt)
    assert not paths.accepted.exists() and not paths.rejected.exists(), "a pair was published"


def test_hdf5_cli_on_a_full_disk_fails_cleanly(fs: Path) -> None:
    """Was SIGSEGV inside h5py's File.close (exit -11), 3 of 3 times."""
    raw = _raw(fs)
    fill(fs, leave=400 * 1024)  # the native split fits, the embedded frames (1.1 MB) do not
    cmd = [sys.executable, "-m", "eva_export.cli", "export", str(raw), "--format", "hdf5", "--workers", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "export failed" in proc.stderr and "free there" in proc.stderr and str(fs) in proc.stderr, proc.stderr
    _nothing_published(raw, "hdf5")
    unfill(fs)
    job = _service(fs, background=False).run(raw, "hdf5")
    assert job.state == COMPLETED, job.error


def test_hdf5_writer_never_lets_hdf5_see_a_failed_write(fs: Path) -> None:
    """The last line of defence behind the free-space check: the disk fills while HDF5 writes
    (the check is switched off in this child process) and the process still exits normally."""
    src = make_subset(fs / "native", [Ep(frames=30)], cameras=2, width=64, height=48)
    fill(fs, leave=200 * 1024)
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        import eva_export.formats.hdf5.exporter as h
        from eva_export.errors import StorageError
        h.projected_bytes = lambda meta, table: 0  # reach the write path on a disk that cannot hold it
        try:
            h.Hdf5Exporter().export(Path({str(src)!r}), Path({str(fs / 'out')!r}))
        except StorageError as exc:
            print("STORAGE", exc)
            sys.exit(3)
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 3, f"rc {proc.returncode}: {proc.stdout} {proc.stderr[-2000:]}"
    assert "No space left on device" in proc.stdout and "free there" in proc.stdout
    assert not list((fs / "out").rglob("*.partial")), "the partial episode file was left"


def test_refused_start_on_a_full_disk_leaves_no_phantom_job(fs: Path) -> None:
    raw = _raw(fs, frames=5, cameras=1)
    svc = _service(fs)
    try:
        fill(fs, leave=0)
        with pytest.raises(EvaError, match="free there"):
            svc.start(raw, "lerobot_v21")
        assert svc.jobs.unfinished() == [], "a refused request left a job queued"
        assert svc.status().queued == 0
        unfill(fs)
        job = svc.start(raw, "lerobot_v21")  # not "already has export ... queued"
        done = svc.wait(job.job_id, timeout=120)
        assert done is not None and done.state == COMPLETED, done
    finally:
        svc.close()


class _FillsDisk:
    """The registry's real exporter for a format; the disk fills just before it writes."""

    def __init__(self, fmt: str, fs: Path) -> None:
        self.inner = get_exporter(fmt)
        self.name = self.inner.name
        self.fs = fs

    def export(self, native_subset: Path, out_dir: Path, progress: Any = None) -> None:
        if not list(self.fs.glob(".filler-*")):
            fill(self.fs, leave=0)
        self.inner.export(native_subset, out_dir, progress)

    def verify(self, out_dir: Path) -> Any:
        return self.inner.verify(out_dir)


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_on_a_full_disk_fails_naming_path_and_free_space(fmt: str, fs: Path) -> None:
    raw = _raw(fs, frames=5, cameras=1)
    svc = _service(fs, background=False, exporters={fmt: lambda: _FillsDisk(fmt, fs)})
    job = svc.run(raw, fmt)
    assert job.state == FAILED, f"{fmt} completed on a full disk"
    assert "free there" in job.error and str(fs) in job.error and "needed" in job.error, job.error
    assert not job.error.startswith(("OSError", "[Errno")), job.error
    _nothing_published(raw, fmt)
    staging = ExportPaths.of(raw, fmt).staging
    assert not staging.exists() or job.staging_dir == str(staging), "staging neither removed nor recorded"
    unfill(fs)
    again = _service(fs, background=False).run(raw, fmt)
    assert again.state == COMPLETED, again.error


def test_v3_cli_without_room_for_its_job_record_answers_without_traceback(fs: Path) -> None:
    raw = _raw(fs, frames=5, cameras=1)
    fill(fs, leave=0)
    cmd = [sys.executable, "-m", "eva_export.cli", "export", str(raw), "--format", "lerobot_v3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 2 and "free there" in proc.stderr and ".jobs" in proc.stderr, proc.stderr
    unfill(fs)
    assert not list((fs / "logs" / "demo").glob("export/lerobot_v3/*"))
