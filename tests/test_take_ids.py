"""A take's id (STOP's reply, take.json, its episodes.jsonl row, .lost_takes.jsonl): a review that
names it lands on that take or is refused with the reason, never on the take that got its index
after a crash. The dataset writer through its real files (one camera, real H.264), the CLI as a
process and the exports read back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import msgpack
import numpy as np
import pyarrow.parquet as pq
import pytest
from dsfactory import features, state_value
from mcap.reader import make_reader

from eva_export.config import parse_config
from eva_export.errors import DatasetError, EvaError
from eva_export.export.runner import ExportService
from eva_export.formats.common.meta import read_meta
from eva_export.formats.common.records import EpisodeRow
from eva_export.formats.hdf5.exporter import read_group
from eva_export.formats.lerobot_v21.episode_writer import EpisodeWriter
from eva_export.formats.lerobot_v21.promises import LOST, TAKE
from eva_export.formats.lerobot_v21.writer import DatasetWriter
from eva_export.jobs import COMPLETED

FPS = 30
GREEN = {"quality": "green", "quality_issues": []}


def open_writer(root: Path) -> DatasetWriter:
    return DatasetWriter.open(root, fps=FPS, features=features(cameras=1), robot_type="test")


def staged(dw: DatasetWriter, frames: int) -> EpisodeWriter:
    w = dw.begin_episode("pick the cube")
    for f in range(frames):
        s = state_value(0, f)
        w.add_frame({"observation.state": s, "action": -s, "capture_time": 1000.0 + f / FPS},
                    {"observation.images.cam0": np.full((48, 64, 3), f * 8 % 256, np.uint8)})
    return w


def stopped(dw: DatasetWriter, frames: int) -> tuple[EpisodeWriter, int, str]:
    """A take as STOP leaves it: its index promised, its id (the staging name) in take.json."""
    w = staged(dw, frames)
    index = dw.reserve_index(w)
    record = json.loads((w.staging / TAKE).read_text())
    assert record == {"episode_index": index, "take_id": w.staging.name}
    return w, index, w.staging.name


@pytest.fixture
def crashed(tmp_path: Path) -> tuple[Path, str, str, str]:
    """Episode 0 saved, take A promised episode 1 and lost in a crash, take B saved as episode 1."""
    root = tmp_path / "logs" / "pick" / "raw"
    dw = open_writer(root)
    w0, i0, id0 = stopped(dw, 10)
    assert dw.commit(w0, GREEN) is not None and i0 == 0
    _, i_lost, id_lost = stopped(dw, 12)  # never saved: the process "ends" with it staged
    assert i_lost == 1
    del dw, w0
    dw = open_writer(root)  # the restart: recovery reports the promised take lost
    assert any(f"episode 1 (take {id_lost}) was promised but lost" in d for d in dw.recovered), dw.recovered
    w_new, i_new, id_new = stopped(dw, 14)
    assert i_new == 1 and id_new != id_lost
    row = dw.commit(w_new, GREEN)
    assert row is not None and (row.episode_index, row.take_id) == (1, id_new)
    return root, id0, id_lost, id_new


def test_rows_and_lost_records_keep_the_take_id(crashed):
    root, id0, id_lost, id_new = crashed
    rows = [json.loads(line) for line in (root / "meta" / "episodes.jsonl").read_text().splitlines()]
    assert [(r["episode_index"], r["take_id"], r["length"]) for r in rows] == [(0, id0, 10), (1, id_new, 14)]
    lost = [json.loads(line) for line in (root / LOST).read_text().splitlines()]
    assert [(d["episode_index"], d["take_id"]) for d in lost] == [(1, id_lost)]
    assert "process ended" in lost[0]["reason"]
    assert [e.take_id for e in read_meta(root).episodes] == [id0, id_new]
    # the typed field round-trips; one of another type is refused by the strict row parser
    assert EpisodeRow.from_dict(rows[1]).to_dict() == rows[1]
    with pytest.raises(ValueError, match="take_id"):
        EpisodeRow.from_dict({**rows[1], "take_id": 7})


def test_review_by_take_id_lands_only_on_that_take(crashed):
    root, id0, id_lost, id_new = crashed
    dw = open_writer(root)
    before = [e.to_dict() for e in dw.episodes]
    with pytest.raises(DatasetError) as exc:
        dw.review(1, "fail", "for the lost take", id_lost)
    msg = str(exc.value)
    assert f"episode 1 holds take {id_new}, not {id_lost}: take {id_lost} was lost: the process ended" in msg, msg
    with pytest.raises(DatasetError, match=f"episode 0 holds take {id0}, not {id_new}: take {id_new} is not in"):
        dw.review(0, "fail", None, id_new)  # a live take's id at another index: refused too
    with pytest.raises(DatasetError, match=f"episode 5 is not listed, not {id_lost}: take {id_lost} was lost"):
        dw.review(5, "fail", None, id_lost)
    with pytest.raises(EvaError, match="take id"):
        dw.review(1, "fail", None, "../../etc/passwd")  # echoed in replies: a take id's shape only
    assert [e.to_dict() for e in dw.episodes] == before
    assert [json.loads(line) for line in (root / "meta" / "episodes.jsonl").read_text().splitlines()] == before
    row = dw.review(1, "pass", "the new take", id_new)
    assert (row.episode_index, row.take_id, row.qc_verdict, row.note) == (1, id_new, "pass", "the new take")
    assert dw.review(0, "fail", None).qc_verdict == "fail"  # no take id: by index, as before


def test_review_of_a_queued_take_by_id_says_it_is_being_saved(tmp_path):
    dw = open_writer(tmp_path / "raw")
    w0, _, id0 = stopped(dw, 8)
    assert dw.commit(w0) is not None
    _, index, queued = stopped(dw, 9)
    with pytest.raises(DatasetError, match=f"episode {index} is not listed, not {queued}: take {queued} is still "
                                           f"being saved"):
        dw.review(index, "pass", None, queued)
    with pytest.raises(DatasetError, match=f"episode 0 holds take {id0}, not {queued}: take {queued} is still"):
        dw.review(0, "pass", None, queued)


def test_cli_review_with_take_id(crashed):
    root, _, id_lost, id_new = crashed

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "eva_export.cli", "review", str(root), "--verdict", "fail",
                               *args], capture_output=True, text=True, timeout=120)

    r = cli("--episodes", "1", "--take-id", id_lost)
    assert r.returncode == 2 and f"episode 1 holds take {id_new}, not {id_lost}: take {id_lost} was lost" in r.stderr
    r = cli("--episodes", "0-1", "--take-id", id_new)
    assert r.returncode == 2 and "--take-id names one take" in r.stderr, r.stderr
    assert [e.qc_verdict for e in read_meta(root).episodes] == ["", ""]
    r = cli("--episodes", "1", "--take-id", id_new)
    assert r.returncode == 0, r.stderr
    assert [e.qc_verdict for e in read_meta(root).episodes] == ["", "fail"]


def exported_rows(accepted: Path, fmt: str) -> list[dict[str, Any]]:
    """The episode rows as each format's consumer reads them."""
    if fmt == "lerobot_v3":
        return pq.read_table(accepted / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
    if fmt == "lerobot_v21":
        return [json.loads(line) for line in (accepted / "meta" / "episodes.jsonl").read_text().splitlines()]
    out = []
    for path in sorted((accepted / "data" / "chunk-000").glob(f"episode_*.{fmt}")):
        if fmt == "hdf5":
            with h5py.File(path, "r") as f:
                out.append(read_group(f["metadata"]))
        else:
            with open(path, "rb") as fh:
                out += [msgpack.unpackb(m.data, raw=False)["metadata"]
                        for _, c, m in make_reader(fh).iter_messages() if c.topic == "episode"]
    return out


@pytest.mark.parametrize("fmt", ["lerobot_v21", "lerobot_v3", "hdf5", "mcap"])
def test_exports_carry_the_take_id(crashed, fmt):
    root, id0, _, id_new = crashed
    svc = ExportService(parse_config({"collection": {"log_dir": str(root.parent.parent)}}))
    try:
        job = svc.wait(svc.start(root, fmt).job_id, timeout=120)
    finally:
        svc.close()
    assert job is not None and job.state == COMPLETED, job
    rows = exported_rows(Path(job.accepted_dir), fmt)
    assert [(r["episode_index"], r["take_id"]) for r in rows] == [(0, id0), (1, id_new)]
