"""A merged set goes through the same upload gate as a single-source export, to a real sshd."""

from __future__ import annotations

import dataclasses
import filecmp
from pathlib import Path

import pytest
from merge_helpers import robots

from eva_export.config import parse_config
from eva_export.errors import UploadRefused
from eva_export.export.runner import ExportService
from eva_export.jobs import COMPLETED
from eva_export.upload import UploadService


def test_the_current_merged_accepted_set_is_uploaded_and_renamed_into_place(tmp_path: Path, server) -> None:
    log = tmp_path / "log"
    sources = robots(log)
    remote = tmp_path / "remote" / "datasets"
    remote.mkdir(parents=True)
    cfg = parse_config({"collection": {"log_dir": str(log),
                                       "storage": {"sftp": dataclasses.asdict(server.sftp_settings(str(remote)))}},
                        "export": {"workers": 1, "jobs_dir": str(tmp_path / "jobs" / "export")},
                        "upload": {"jobs_dir": str(tmp_path / "jobs" / "upload")}})
    job = ExportService(cfg, background=False, recover=False).run(sources, "lerobot_v3", "fleet")
    assert job.state == COMPLETED, job.error
    home, accepted = log / "fleet", Path(job.accepted_dir)
    service = UploadService(cfg)
    try:
        with pytest.raises(UploadRefused):  # the gate still refuses the rejected side of a merged pair
            service.start(str(home), "lerobot_v3", job.rejected_dir)
        up = service.start(str(home), "lerobot_v3", str(accepted))
        final = service.wait(up.job_id, 120)
    finally:
        service.close()
    assert final is not None and final.state == COMPLETED, final
    assert final.remote_path == str(remote / "fleet_lerobot_v3_accepted")
    mine = sorted(str(p.relative_to(accepted)) for p in accepted.rglob("*"))
    theirs = sorted(str(p.relative_to(final.remote_path)) for p in Path(final.remote_path).rglob("*"))
    assert mine == theirs
    assert all(filecmp.cmp(accepted / r, Path(final.remote_path) / r, shallow=False)
               for r in mine if (accepted / r).is_file())
    assert [p.name for p in remote.iterdir()] == ["fleet_lerobot_v3_accepted"]  # no staging left behind
