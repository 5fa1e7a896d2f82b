"""Adding a source kind is its module + one registry line: shown with a tiny CSV dataset.

``plugins/csv_source.py`` is the module; the one line is the ``SourceSpec`` patched into the
registry below. The export service then splits it by quality and writes every registered
format, each subset checked by that format's verifier and the values read back. A directory
no kind recognises is refused by name, never read as a v2.1 dataset.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, image, make_dataset

from eva_export.config import parse_config
from eva_export.export.records import QualitySplit
from eva_export.export.runner import ExportService
from eva_export.formats import sources as registry
from eva_export.formats.common.video import VideoEncoder, VideoSettings
from eva_export.formats.registry import format_names
from eva_export.formats.sources import UnknownSourceError, detect_kind
from eva_export.formats.verify import verify_export
from eva_export.jobs import COMPLETED

SPEC = registry.SourceSpec("tiny_csv", "plugins.csv_source:CsvSource")
JOINTS = ["j0", "j1", "j2"]
LENGTHS = [5, 7, 4]  # episode 1 is red: accepted = source episodes 0 and 2


@pytest.fixture
def csv_source(monkeypatch: pytest.MonkeyPatch) -> registry.SourceSpec:
    monkeypatch.setattr(registry, "SOURCES", (*registry.SOURCES, SPEC))  # the one registry line
    return SPEC


def values(episode: int, frames: int) -> np.ndarray:
    f = np.arange(frames, dtype=np.float64)[:, None]
    state = episode * 100 + f + np.arange(len(JOINTS)) / 10
    return np.hstack([state, -state]).astype(np.float32)


def write_csv_dataset(root: Path) -> Path:
    root.mkdir(parents=True)
    episodes = []
    for i, n in enumerate(LENGTHS):
        name = f"episode_{i:06d}.csv"
        with open(root / name, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow([f"state.{j}" for j in JOINTS] + [f"action.{j}" for j in JOINTS])
            w.writerows(values(i, n).tolist())
        video = f"episode_{i:06d}.mp4"
        with VideoEncoder(root / video, 32, 24, 10, VideoSettings(crf=10)) as enc:
            for f in range(n):
                enc.add(image(i, f, 0, 32, 24))
        episodes.append({"file": name, "video": video, "task": "stack the cups" if i else "pick the cube",
                         "quality": "red" if i == 1 else "green"})
    (root / "csv_dataset.json").write_text(json.dumps({"fps": 10, "robot_type": "csv_arm", "joints": JOINTS,
                                                       "camera": {"width": 32, "height": 24},
                                                       "episodes": episodes}), encoding="utf-8")
    return root


def service(tmp_path: Path) -> ExportService:
    cfg = parse_config({"collection": {"log_dir": str(tmp_path / "logs")}, "export": {"workers": 1}})
    return ExportService(cfg, background=False, recover=False)


def test_a_registered_source_kind_is_exported_to_every_format_and_verified(
        tmp_path: Path, csv_source: registry.SourceSpec) -> None:
    src = write_csv_dataset(tmp_path / "logs" / "arm" / "raw")
    assert detect_kind(src) == "tiny_csv"
    svc = service(tmp_path)
    for fmt in format_names():
        job = svc.run(src, fmt)
        assert job.state == COMPLETED, f"{fmt}: {job.error}"
        assert (job.accepted_episodes, job.accepted_frames) == (2, LENGTHS[0] + LENGTHS[2]), fmt
        assert (job.rejected_episodes, job.rejected_frames) == (1, LENGTHS[1]), fmt
        for subset, episodes, frames in ((job.accepted_dir, 2, 9), (job.rejected_dir, 1, 7)):
            report = verify_export(Path(subset))
            assert report.ok, f"{fmt}: {report.errors}"
            assert report.dataset_format == fmt and (report.episodes, report.frames) == (episodes, frames), fmt
        marker = QualitySplit.read(Path(job.accepted_dir))
        assert marker.source_episode_indices == [0, 2] and marker.dataset_format == fmt
        if fmt == "lerobot_v21":  # the values, read back: accepted episode 1 is source episode 2
            table = pq.read_table(Path(job.accepted_dir) / "data" / "chunk-000" / "episode_000001.parquet")
            want = values(2, LENGTHS[2])
            np.testing.assert_allclose(np.array(table.column("observation.state").to_pylist()), want[:, :3],
                                       rtol=0, atol=1e-6)
            np.testing.assert_allclose(np.array(table.column("action").to_pylist()), want[:, 3:], rtol=0, atol=1e-6)
            assert table.column("episode_index").to_pylist() == [1] * LENGTHS[2]
            assert table.column("index").to_pylist() == list(range(LENGTHS[0], LENGTHS[0] + LENGTHS[2]))
            mp4 = Path(job.accepted_dir) / "videos" / "chunk-000" / "observation.images.cam" / "episode_000001.mp4"
            with av.open(str(mp4)) as container:
                frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
            assert len(frames) == LENGTHS[2]
            want_px = image(2, 3, 0, 32, 24)[12, 16].astype(int)  # the camera, read back: source episode 2
            assert np.abs(frames[3][12, 16].astype(int) - want_px).max() <= 8
    assert not list(src.glob("meta")), "the source is only read"


def test_a_broken_csv_episode_is_refused_naming_its_file_and_episode(
        tmp_path: Path, csv_source: registry.SourceSpec) -> None:
    src = write_csv_dataset(tmp_path / "logs" / "arm" / "raw")
    with open(src / "episode_000001.csv", "a", encoding="utf-8") as fh:
        fh.write("1,2,x,4,5,6\n")
    job = service(tmp_path).run(src, "hdf5")
    assert job.state != COMPLETED
    assert "episode 1" in job.error and "episode_000001.csv" in job.error
    assert not (src.parent / "export").exists() or not list((src.parent / "export").rglob("accepted"))


def test_a_directory_no_kind_recognises_is_refused_by_name(tmp_path: Path) -> None:
    # a CSV dataset while its kind is not registered, and a LeRobot dataset without info.json
    csv_dir = write_csv_dataset(tmp_path / "logs" / "arm" / "raw")
    with pytest.raises(UnknownSourceError, match=r"no source kind recognises .*arm/raw.*registered source kinds: "
                                                 r"lerobot_v21, lerobot_v30, lerobot_v20"):
        detect_kind(csv_dir)
    job = service(tmp_path).run(csv_dir, "lerobot_v21")
    assert job.state != COMPLETED and str(csv_dir) in job.error and "no source kind recognises" in job.error
    v21 = make_dataset(tmp_path / "logs" / "demo" / "raw", [Ep(frames=5)], cameras=0)
    (v21 / "meta" / "info.json").unlink()
    with pytest.raises(UnknownSourceError, match=r"info\.json is missing: no source kind recognises"):
        detect_kind(v21)
