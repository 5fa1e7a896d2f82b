"""A whole ``eva-export export --format lerobot_v3`` job imports only what the format uses.

On long episodes over half of a v3 job was Python start-up; the libraries of the other formats
(h5py, mcap, zarr), of the upload (paramiko) and of the cluster batch (ray) must stay unloaded
through validation, split, conversion, verification and publication. Run in a fresh interpreter,
the real job on a real dataset; ``sys.modules`` at its end is the measure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dsfactory import Ep, make_dataset

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)

NOT_FOR_V3 = ("paramiko", "h5py", "mcap", "zarr", "ray", "msgpack", "lz4", "pandas", "torch",
              "eva_export.formats.hdf5.exporter", "eva_export.formats.mcap_eva.exporter", "eva_export.formats.eva_store.exporter",
              "eva_export.export.batch", "eva_export.upload.connection", "eva_export.upload.runner",
              "eva_export.formats.eva_store.reader",
              # the quality rules run by ``check`` and the finite-runs cut: not in every export job
              "eva_export.quality.rules", "eva_export.quality.offline", "eva_export.quality.judge",
              "eva_export.export.finite_runs")

SCRIPT = """
import json, sys
from eva_export import cli
rc = cli.main(["export", sys.argv[1], "--format", "lerobot_v3"])
print(json.dumps({"rc": rc, "modules": sorted(sys.modules)}))
"""


def test_a_v3_export_job_loads_no_library_of_another_format(tmp_path: Path) -> None:
    raw = make_dataset(tmp_path / "ds" / "raw", [Ep(frames=4), Ep(frames=3, quality="red"), Ep(frames=5)])
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(raw)], cwd=ROOT, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["rc"] == 0, out.stderr
    assert (tmp_path / "ds" / "export" / "lerobot_v3" / "accepted" / "meta" / "info.json").is_file()
    loaded = set(res["modules"])
    assert {"pyarrow", "av", "eva_export.formats.lerobot_v3.exporter"} <= loaded  # the measure sees the job's imports
    unwanted = sorted(m for m in loaded for name in NOT_FOR_V3 if m == name or m.startswith(name + "."))
    assert unwanted == []
