"""The quality split and source validation, on real v2.1 datasets written by the capture writer."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, make_dataset, state_value
from export_faults import faulty_service

from eva_export.config import parse_config
from eva_export.errors import DatasetError, ExportError, UnsafeNameError
from eva_export.export.paths import ExportPaths, export_root
from eva_export.export.records import ACCEPTED, REJECTED, QualitySplit
from eva_export.export.runner import ExportService
from eva_export.export.split import classify
from eva_export.formats.common.records import EpisodeRow
from eva_export.formats.lerobot_v21.exporter import verify_v21
from eva_export.formats.lerobot_v21.validate import validate_dataset, validate_source
from eva_export.formats.registry import UnknownFormatError
from eva_export.fsutil import atomic_write_json, atomic_write_jsonl, iter_jsonl, read_json
from eva_export.jobs import COMPLETED, FAILED

RED = [{"code": "drops", "severity": "error", "detail": "3 frames dropped on cam0"}]


def service(log_dir: Path, **kw: object) -> ExportService:
    cfg = parse_config({"collection": {"log_dir": str(log_dir)}})
    return faulty_service(cfg, background=False, recover=False, **kw)  # type: ignore[arg-type]


def mixed_source(tmp_path: Path) -> Path:
    """0 green, 1 red, 2 red+pass, 3 green+fail, 4 green note-only (task B), 5 red note-only."""
    return make_dataset(tmp_path / "logs" / "demo" / "raw", [
        Ep(frames=12, quality="green"),
        Ep(frames=13, quality="red", issues=RED),
        Ep(frames=14, quality="red", issues=RED, verdict="pass", note="operator: fine"),
        Ep(frames=15, quality="green", verdict="fail", note="gripper slipped"),
        Ep(frames=16, quality="green", note="just a note", task="place the cube"),
        Ep(frames=17, quality="red", issues=RED, note="note only"),
    ], cameras=1, width=32, height=24)


# ---- the rule -----------------------------------------------------------------------------------
@pytest.mark.parametrize("quality,verdict,note,expect", [
    ("green", "", None, ACCEPTED),
    ("red", "", None, REJECTED),
    ("red", "pass", "ok", ACCEPTED),
    ("green", "fail", None, REJECTED),
    ("green", "", "note only", ACCEPTED),
    ("red", "", "note only", REJECTED),
    ("", "", None, REJECTED),
    ("yellow", "", None, REJECTED),
])
def test_classify(quality: str, verdict: str, note: str | None, expect: str) -> None:
    extra: dict[str, object] = {"quality": quality}
    if verdict:
        extra["qc_verdict"] = verdict
    if note is not None:
        extra["note"] = note
    assert classify(EpisodeRow.from_dict({"episode_index": 0, "tasks": ["t"], "length": 10, **extra})) == expect


def test_paths() -> None:
    assert export_root(Path("/d/demo/raw")) == Path("/d/demo/export")
    assert export_root(Path("/d/demo/take2")) == Path("/d/demo/take2_export")
    p = ExportPaths.of(Path("/d/demo/raw"), "hdf5")
    assert p.accepted == Path("/d/demo/export/hdf5/accepted")
    assert p.rejected == Path("/d/demo/export/hdf5/rejected")
    assert p.staging.parent == Path("/d/demo/export") and p.staging.name.startswith(".staging-hdf5-")
    assert p.staging == ExportPaths.of(Path("/d/demo/raw"), "hdf5").staging  # stable across reruns
    assert p.staging != ExportPaths.of(Path("/d/other/raw"), "hdf5").staging


# ---- the split ----------------------------------------------------------------------------------
def test_split_mixed_source(tmp_path: Path) -> None:
    src = mixed_source(tmp_path)
    before = {p: p.stat().st_mtime_ns for p in src.rglob("*") if p.is_file()}
    job = service(tmp_path / "logs").run(src, "lerobot_v21")
    assert job.state == COMPLETED, job.error
    acc, rej = Path(job.accepted_dir), Path(job.rejected_dir)
    assert acc == tmp_path / "logs/demo/export/lerobot_v21/accepted"
    assert rej == tmp_path / "logs/demo/export/lerobot_v21/rejected"
    qa, qr = QualitySplit.read(acc), QualitySplit.read(rej)
    assert qa.source_episode_indices == [0, 2, 4]
    assert qr.source_episode_indices == [1, 3, 5]
    for q, subset in ((qa, ACCEPTED), (qr, REJECTED)):
        assert q.subset == subset and q.dataset_format == "lerobot_v21" and q.job_id == job.job_id
        assert q.source_dir == str(src.resolve()) and "qc_verdict 'pass'" in q.rule
        assert (q.accepted_count, q.rejected_count) == (3, 3)
    assert (job.accepted_episodes, job.accepted_frames) == (3, 12 + 14 + 16)
    assert (job.rejected_episodes, job.rejected_frames) == (3, 13 + 15 + 17)
    assert (job.episodes_done, job.episodes_total, job.reused_episodes) == (6, 6, 0)
    assert job.files_done == job.files_total == 12 and job.bytes_done == job.bytes_total > 0

    # Parquet: episode_index renumbered from 0, global index contiguous, task index remapped.
    offset = 0
    for new, (old, n) in enumerate([(0, 12), (2, 14), (4, 16)]):
        t = pq.read_table(acc / f"data/chunk-000/episode_{new:06d}.parquet")
        assert t.column("episode_index").to_pylist() == [new] * n
        assert t.column("index").to_pylist() == list(range(offset, offset + n))
        assert t.column("frame_index").to_pylist() == list(range(n))
        state = np.array(t.column("observation.state").to_pylist(), dtype=np.float32)
        assert np.allclose(state[5], state_value(old, 5))  # the rows are the source episode's
        assert t.column("task_index").to_pylist() == [1 if old == 4 else 0] * n
        assert t.schema.metadata and b"huggingface" in t.schema.metadata
        offset += n
    assert [r["task"] for r in iter_jsonl(acc / "meta/tasks.jsonl")] == ["pick the cube", "place the cube"]
    assert [r["task"] for r in iter_jsonl(rej / "meta/tasks.jsonl")] == ["pick the cube"]
    t = pq.read_table(rej / "data/chunk-000/episode_000002.parquet")
    assert t.column("index").to_pylist() == list(range(13 + 15, 13 + 15 + 17))

    # Episode rows keep every original field plus source_episode_index.
    rows = list(iter_jsonl(rej / "meta/episodes.jsonl"))
    assert [r["episode_index"] for r in rows] == [0, 1, 2]
    assert [r["source_episode_index"] for r in rows] == [1, 3, 5]
    assert rows[0]["quality"] == "red" and rows[0]["quality_issues"] == RED
    assert rows[1]["qc_verdict"] == "fail" and rows[1]["note"] == "gripper slipped"
    assert rows[2]["note"] == "note only" and "qc_verdict" not in rows[2]
    arow = list(iter_jsonl(acc / "meta/episodes.jsonl"))[1]
    assert arow["quality"] == "red" and arow["quality_issues"] == RED and arow["qc_verdict"] == "pass"

    # Statistics recomputed: per-episode index stats follow the new values; stats.json aggregates.
    st = {r["episode_index"]: r["stats"] for r in iter_jsonl(acc / "meta/episodes_stats.jsonl")}
    assert st[1]["episode_index"]["min"] == [1] and st[1]["episode_index"]["max"] == [1]
    assert st[1]["index"]["min"] == [12] and st[1]["index"]["max"] == [12 + 14 - 1]
    assert st[2]["task_index"]["max"] == [1]
    agg = read_json(acc / "meta/stats.json")
    assert agg["index"]["max"] == [41.0] and agg["episode_index"]["max"] == [2.0]
    assert agg["observation.state"]["count"] == [42]
    assert "observation.images.cam0" in agg
    src_st = {r["episode_index"]: r["stats"] for r in iter_jsonl(src / "meta/episodes_stats.jsonl")}
    assert st[1]["observation.state"] == src_st[2]["observation.state"]

    info = read_json(acc / "meta/info.json")
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"], info["total_videos"]) == (3, 42, 2, 3)
    assert info["splits"] == {"train": "0:3"} and info["codebase_version"] == "v2.1"

    # Videos are hard links of the source MP4s (never re-encoded).
    v_new = acc / "videos/chunk-000/observation.images.cam0/episode_000001.mp4"
    v_old = src / "videos/chunk-000/observation.images.cam0/episode_000002.mp4"
    assert v_new.stat().st_ino == v_old.stat().st_ino
    for d in (acc, rej):
        rep = verify_v21(d)
        assert rep.ok, rep.errors
    # The source is untouched and the staging root is gone.
    assert {p: p.stat().st_mtime_ns for p in src.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in (tmp_path / "logs/demo/export").iterdir()) == [".lock-lerobot_v21", "lerobot_v21"]


@pytest.mark.parametrize("kind", ["all_accepted", "all_rejected"])
def test_empty_subset_is_valid(tmp_path: Path, kind: str) -> None:
    eps = [Ep(frames=10, quality="green"), Ep(frames=11, quality="red", verdict="pass")] if kind == "all_accepted" \
        else [Ep(frames=10, quality="red"), Ep(frames=11, quality="green", verdict="fail")]
    src = make_dataset(tmp_path / "logs" / "take2", eps, cameras=1, width=32, height=24)
    job = service(tmp_path / "logs").run(src, "lerobot_v21")
    assert job.state == COMPLETED, job.error
    assert Path(job.accepted_dir) == tmp_path / "logs/take2_export/lerobot_v21/accepted"
    full, empty = (Path(job.accepted_dir), Path(job.rejected_dir))
    if kind == "all_rejected":
        full, empty = empty, full
    assert QualitySplit.read(full).source_episode_indices == [0, 1]
    q = QualitySplit.read(empty)
    assert q.source_episode_indices == [] and q.episode_count == 0
    info = read_json(empty / "meta/info.json")
    assert (info["total_episodes"], info["total_frames"], info["total_videos"], info["total_tasks"]) == (0, 0, 0, 0)
    for name in ("episodes.jsonl", "episodes_stats.jsonl", "tasks.jsonl"):
        assert (empty / "meta" / name).read_text() == ""
    assert read_json(empty / "meta/stats.json") == {}
    assert validate_dataset(empty).episodes == []
    assert verify_v21(empty).ok and verify_v21(full).ok


# ---- validation ---------------------------------------------------------------------------------
def _edit_jsonl(path: Path, fn) -> None:  # type: ignore[no-untyped-def]
    atomic_write_jsonl(path, [fn(r) for r in iter_jsonl(path)])


def _break(src: Path, what: str) -> str:
    """Break the source one way; returns a substring the error must contain."""
    meta = src / "meta"
    vid = src / "videos/chunk-000/observation.images.cam0/episode_000001.mp4"
    data1 = src / "data/chunk-000/episode_000001.parquet"
    if what == "no_episodes":
        (meta / "episodes.jsonl").unlink()
        return "episodes.jsonl is missing"
    if what == "no_info":
        (meta / "info.json").unlink()
        return "info.json is missing"
    if what == "version":
        atomic_write_json(meta / "info.json", {**read_json(meta / "info.json"), "codebase_version": "v3.0"})
        return "codebase_version is 'v3.0'"
    if what == "format":
        atomic_write_json(meta / "info.json", {**read_json(meta / "info.json"), "dataset_format": "hdf5"})
        return "dataset_format is 'hdf5'"
    if what == "duplicate":
        _edit_jsonl(meta / "episodes.jsonl", lambda r: {**r, "episode_index": min(r["episode_index"], 1)})
        return "episode_index 1 appears twice"
    if what == "parquet":
        data1.unlink()
        return "episode 1: Parquet file"
    if what == "video":
        vid.unlink()
        return "episode 1: camera file"
    if what == "no_index":
        t = pq.read_table(data1)
        pq.write_table(t.drop(["index"]), data1)
        return "has no 'index' column"
    if what == "no_episode_index":
        t = pq.read_table(data1)
        pq.write_table(t.drop(["episode_index"]), data1)
        return "has no 'episode_index' column"
    if what == "task":
        atomic_write_jsonl(meta / "tasks.jsonl", [{"task_index": 7, "task": "pick the cube"}])
        return "task_index 0"
    if what == "stats":
        _edit_jsonl(meta / "episodes_stats.jsonl",
                    lambda r: {**r, "stats": {k: v for k, v in r["stats"].items() if "images" not in k}})
        return "no statistics for 'observation.images.cam0'"
    if what == "empty":
        _edit_jsonl(meta / "episodes.jsonl", lambda r: {**r, "length": 0} if r["episode_index"] == 1 else r)
        return "episode 1 is empty"
    if what == "length":
        _edit_jsonl(meta / "episodes.jsonl", lambda r: {**r, "length": 99} if r["episode_index"] == 1 else r)
        return "length 99"
    raise AssertionError(what)


BREAKS = ["no_episodes", "no_info", "version", "format", "duplicate", "parquet", "video", "no_index",
          "no_episode_index", "task", "stats", "empty", "length"]


@pytest.mark.parametrize("what", BREAKS)
def test_validation_failure_writes_nothing(tmp_path: Path, what: str) -> None:
    src = make_dataset(tmp_path / "logs" / "demo" / "raw",
                       [Ep(frames=8), Ep(frames=9, quality="red"), Ep(frames=10)], cameras=1, width=32, height=24)
    msg = _break(src, what)
    with pytest.raises(DatasetError, match=None) as err:
        validate_source(src)
    assert msg in str(err.value)
    job = service(tmp_path / "logs").run(src, "lerobot_v21")
    assert job.state == FAILED and msg in job.error
    assert not (tmp_path / "logs/demo/export").exists()  # nothing written, no final directory


def test_validate_dataset_after_crash(tmp_path: Path) -> None:
    """A raw dataset whose writer died mid-episode still validates (the staging is ignored)."""
    src = make_dataset(tmp_path / "raw", [Ep(frames=5), Ep(frames=6)], cameras=1, width=32, height=24)
    (src / ".staging" / "20260101T000000-dead").mkdir(parents=True)
    (src / ".staging" / "20260101T000000-dead" / "observation.images.cam0.mp4").write_bytes(b"partial")
    check = validate_dataset(src)
    assert [e.index for e in check.episodes] == [0, 1] and check.files_total == 4


# ---- requests and the job record -----------------------------------------------------------------
def test_refusals(tmp_path: Path) -> None:
    src = make_dataset(tmp_path / "logs" / "demo" / "raw", [Ep(frames=5)], cameras=1, width=32, height=24)
    outside = make_dataset(tmp_path / "elsewhere" / "raw", [Ep(frames=5)], cameras=1, width=32, height=24)
    svc = service(tmp_path / "logs")
    with pytest.raises(UnknownFormatError, match="unknown export format 'zip'"):
        svc.run(src, "zip")
    with pytest.raises(UnsafeNameError, match="outside the export data roots"):
        svc.run(outside, "lerobot_v21")
    with pytest.raises(UnsafeNameError):  # '..' resolved before the check
        svc.run(tmp_path / "logs" / ".." / "elsewhere" / "raw", "lerobot_v21")
    link = tmp_path / "logs" / "link"
    link.symlink_to(outside)
    with pytest.raises(UnsafeNameError):  # a symlink inside the root that points out
        svc.run(link, "lerobot_v21")
    assert not (tmp_path / "elsewhere" / "export").exists()
    assert svc.store.all() == []


def test_duplicate_source_refused_and_jobs_survive_restart(tmp_path: Path) -> None:
    src = make_dataset(tmp_path / "logs" / "demo" / "raw", [Ep(frames=40)] * 6, cameras=2, width=32, height=24)
    other = make_dataset(tmp_path / "logs" / "b" / "raw", [Ep(frames=5)], cameras=1, width=32, height=24)
    cfg = parse_config({"collection": {"log_dir": str(tmp_path / "logs")}})
    svc = ExportService(cfg)
    try:
        first = svc.start(src, "lerobot_v21")
        assert first.accepted_dir.endswith("demo/export/lerobot_v21/accepted")
        with pytest.raises(ExportError, match="already has export"):
            svc.start(src, "hdf5")
        second = svc.start(other, "lerobot_v21")  # another source queues behind it
        done = svc.wait(second.job_id, timeout=60)
        assert done is not None and done.state == COMPLETED
        assert svc.get(first.job_id).state == COMPLETED  # type: ignore[union-attr]
        st = svc.status()
        state, queued, current = st.state, st.queued, st.current
        assert (state, queued) == ("IDLE", 0) and current is not None and current.job_id == second.job_id
        assert svc.latest().job_id == second.job_id  # type: ignore[union-attr]
    finally:
        svc.close()
    svc2 = ExportService(cfg)  # a restart: the store still knows the completed export
    try:
        got = svc2.latest_completed(str(src), "lerobot_v21")
        assert got is not None and got.job_id == first.job_id and got.accepted_episodes == 6
        assert svc2.get(first.job_id).state == COMPLETED  # type: ignore[union-attr]
    finally:
        svc2.close()


def test_interrupted_jobs_marked_failed(tmp_path: Path) -> None:
    cfg = parse_config({"collection": {"log_dir": str(tmp_path / "logs")}})
    from eva_export.jobs import Job, JobStore

    store = JobStore(cfg.export.jobs_dir)
    stale = Job.new("export", str(tmp_path), "lerobot_v21", state="running")
    store.save(stale)
    svc = ExportService(cfg)
    svc.close()
    job = store.get(stale.job_id)
    assert job is not None and job.state == FAILED and "interrupted" in job.error


# ---- resume ---------------------------------------------------------------------------------------
def test_rerun_reuses_finished_units(tmp_path: Path) -> None:
    src = make_dataset(tmp_path / "logs" / "demo" / "raw",
                       [Ep(frames=6, quality="green" if i % 3 else "red") for i in range(8)],
                       cameras=1, width=32, height=24)
    job = service(tmp_path / "logs", fail_at="unit:5").run(src, "lerobot_v21")
    assert job.state == FAILED and "unit:5" in job.error
    paths = ExportPaths.of(src, "lerobot_v21")
    assert paths.staging.is_dir() and not paths.pair_dir.exists()
    finished = {json.loads(p.read_text())["source_episode_index"]
                for p in (paths.staging / "units").glob("*/ep_*")}
    # units are built by a pool of two: 0..4 finished, 5 failed, 6 and 7 may have finished too
    assert finished >= {0, 1, 2, 3, 4} and 5 not in finished
    job = service(tmp_path / "logs").run(src, "lerobot_v21")
    assert job.state == COMPLETED and job.reused_episodes == len(finished) and job.episodes_done == 8
    assert verify_v21(paths.accepted).ok and verify_v21(paths.rejected).ok
    assert not paths.staging.exists()


def test_damaged_unit_is_rebuilt(tmp_path: Path) -> None:
    src = make_dataset(tmp_path / "logs" / "demo" / "raw", [Ep(frames=6)] * 4, cameras=1, width=32, height=24)
    service(tmp_path / "logs", fail_at="split_units").run(src, "lerobot_v21")
    paths = ExportPaths.of(src, "lerobot_v21")
    unit = paths.staging / "native" / ACCEPTED
    (unit / "videos/chunk-000/observation.images.cam0/episode_000002.mp4").unlink()
    (unit / "data/chunk-000/.episode_000003.parquet.tmp").write_bytes(b"left by a kill")
    job = service(tmp_path / "logs").run(src, "lerobot_v21")
    assert job.state == COMPLETED and job.reused_episodes == 3
    assert verify_v21(paths.accepted).ok
    assert not list(paths.accepted.rglob("*.tmp"))


def test_staging_of_another_source_state_not_reused(tmp_path: Path) -> None:
    src = make_dataset(tmp_path / "logs" / "demo" / "raw", [Ep(frames=6)] * 4, cameras=1, width=32, height=24)
    service(tmp_path / "logs", fail_at="split_units").run(src, "lerobot_v21")
    # The operator fails episode 1 after the interrupted run: the units are stale.
    _edit_jsonl(src / "meta/episodes.jsonl", lambda r: {**r, "qc_verdict": "fail"} if r["episode_index"] == 1 else r)
    job = service(tmp_path / "logs").run(src, "lerobot_v21")
    assert job.state == COMPLETED and job.reused_episodes == 0
    paths = ExportPaths.of(src, "lerobot_v21")
    assert QualitySplit.read(paths.accepted).source_episode_indices == [0, 2, 3]
    assert QualitySplit.read(paths.rejected).source_episode_indices == [1]
    assert verify_v21(paths.accepted).ok and verify_v21(paths.rejected).ok


# ---- non-native formats go through a native split and the format's exporter ------------------------
class CopyExporter:
    """A stand-in format backend (injected the way the registry would provide one)."""

    name = "hdf5"
    seen: ClassVar[list[Path]] = []  # shared by every instance the runner creates

    def export(self, native_subset: Path, out_dir: Path, progress) -> None:  # type: ignore[no-untyped-def]
        assert QualitySplit.read(native_subset).dataset_format == "lerobot_v21"
        CopyExporter.seen.append(native_subset)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        shutil.copytree(native_subset, out_dir)
        q = QualitySplit.read(out_dir)
        d = q.to_dict()
        d["dataset_format"] = self.name
        atomic_write_json(out_dir / "meta/quality_split.json", d)
        for row in iter_jsonl(native_subset / "meta/episodes.jsonl"):
            progress.on_episode(row["episode_index"], 1)

    def verify(self, out_dir: Path):  # type: ignore[no-untyped-def]
        """The stand-in's own check (the core runs it before publishing): the marker is there."""
        from eva_export.formats.common.exporter import VerifyReport
        q = QualitySplit.read(out_dir)
        errors = [] if q.dataset_format == self.name else [f"marker says {q.dataset_format}"]
        return VerifyReport(path=str(out_dir), dataset_format=self.name, errors=errors)


def test_non_native_format_uses_native_split_then_exporter(tmp_path: Path) -> None:
    src = mixed_source(tmp_path)
    CopyExporter.seen = []
    job = service(tmp_path / "logs", exporters={"hdf5": CopyExporter}).run(src, "hdf5")
    assert job.state == COMPLETED, job.error
    assert job.accepted_dir.endswith("demo/export/hdf5/accepted")
    assert [p.name for p in CopyExporter.seen] == [ACCEPTED, REJECTED]
    assert all(".staging-hdf5-" in str(p) for p in CopyExporter.seen)
    assert QualitySplit.read(Path(job.accepted_dir)).dataset_format == "hdf5"
    assert QualitySplit.read(Path(job.rejected_dir)).source_episode_indices == [1, 3, 5]
    assert job.episodes_done == job.episodes_total == 6  # each source episode once
    assert not ExportPaths.of(src, "hdf5").staging.exists()


@pytest.mark.parametrize("fmt", ["lerobot_v3", "hdf5", "mcap"])
def test_real_format_exporters(tmp_path: Path, fmt: str) -> None:
    """Through the registry's exporters; each subset verified with the shared verifier."""
    from eva_export.formats import verify

    src = mixed_source(tmp_path)
    job = service(tmp_path / "logs").run(src, fmt)
    assert job.state == COMPLETED, job.error
    assert job.episodes_done == job.episodes_total == 6  # each source episode once, not 12
    for d, idx in ((job.accepted_dir, [0, 2, 4]), (job.rejected_dir, [1, 3, 5])):
        q = QualitySplit.read(Path(d))
        assert q.dataset_format == fmt and q.source_episode_indices == idx and q.job_id == job.job_id
        rep = verify.verify_export(Path(d))
        assert rep.ok, rep.errors
        assert rep.episodes == 3
    assert not ExportPaths.of(src, fmt).staging.exists()


def test_cli_export_and_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from eva_export.cli import main

    src = mixed_source(tmp_path)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f'collection:\n  log_dir: "{tmp_path / "logs"}"\n')
    assert main(["export", "--config", str(cfg), "--source", str(src), "--format", "lerobot_v21"]) == 0
    job = json.loads(capsys.readouterr().out)
    assert job["state"] == "completed" and job["accepted_episodes"] == 3
    assert main(["jobs", "--config", str(cfg)]) == 0
    assert json.loads(capsys.readouterr().out)[0]["job_id"] == job["job_id"]
    assert main(["verify", str(Path(job["accepted_dir"]).parent)]) == 0
    out = capsys.readouterr().out
    assert "accepted: OK" in out and "rejected: OK" in out
    os.unlink(Path(job["rejected_dir"]) / "data/chunk-000/episode_000001.parquet")
    assert main(["verify", job["rejected_dir"]]) == 1
    assert main(["export", "--config", str(cfg), "--source", str(tmp_path), "--format", "lerobot_v21"]) == 2


def test_a_long_running_service_keeps_only_the_requests_of_unfinished_jobs(tmp_path: Path) -> None:
    src = make_dataset(tmp_path / "logs" / "demo" / "raw", [Ep(frames=5)], cameras=1, width=32, height=24)
    svc = service(tmp_path / "logs")
    jobs = [svc.run(src, fmt) for fmt in ("lerobot_v21", "lerobot_v3", "lerobot_v21")]
    assert [j.state for j in jobs] == [COMPLETED] * 3
    assert list(svc._requests) == [jobs[-1].job_id]  # earlier finished jobs' requests were let go
