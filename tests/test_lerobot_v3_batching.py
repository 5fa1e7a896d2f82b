"""The batched v3 paths: many episodes per data file and per row group, statistics gathered in
flat columns, MP4 packets kept from the one probe of each file. Read back with pyarrow and
PyAV, compared with what the per-episode paths gave."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, make_subset

from eva_export.formats.common import stats as stats_mod
from eva_export.formats.common.meta import read_meta
from eva_export.formats.lerobot_v3 import probe as v3_probe
from eva_export.formats.lerobot_v3.exporter import LeRobotV3Exporter, stats_column
from eva_export.formats.lerobot_v3.options import V3Options
from eva_export.formats.lerobot_v3.tables import StatColumn
from eva_export.formats.lerobot_v3.timing import shard_timing_problems
from eva_export.formats.lerobot_v3.verify import read_episodes_meta

FPS = 30
LENGTHS = [3, 4, 2, 5, 4, 1, 3, 4, 2, 4, 3, 5, 2, 4, 3, 4, 1, 4, 2, 3, 4, 3]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_subset(tmp_path_factory.mktemp("src") / "acc", [Ep(frames=n) for n in LENGTHS], cameras=2)


def export(src: Path, out: Path) -> Path:
    # small limits: several data files and several video shards, many episodes in each
    LeRobotV3Exporter(V3Options(data_file_mb=1500 / 2**20, video_file_mb=8000 / 2**20)).export(src, out)
    return out


def test_episodes_across_data_files_read_back_with_their_ranges(source: Path, tmp_path: Path) -> None:
    out = export(source, tmp_path / "v3")
    eps = read_episodes_meta(out).to_pylist()
    assert [e["episode_index"] for e in eps] == list(range(len(LENGTHS)))
    assert [e["length"] for e in eps] == LENGTHS
    files = sorted({(e["data/chunk_index"], e["data/file_index"]) for e in eps})
    assert len(files) >= 3  # the boundary is crossed more than once
    total = most = 0
    for chunk, file in files:
        path = out / f"data/chunk-{chunk:03d}/file-{file:03d}.parquet"
        members = [e for e in eps if (e["data/chunk_index"], e["data/file_index"]) == (chunk, file)]
        meta = pq.ParquetFile(path).metadata
        assert meta.num_row_groups == 1  # the file's episodes batched into one row group
        most = max(most, len(members))
        t = pq.read_table(path)
        first = members[0]["dataset_from_index"]
        assert first == total
        assert t.column("index").to_pylist() == list(range(first, first + t.num_rows))
        for e in members:
            rows = t.slice(e["dataset_from_index"] - first, e["length"])
            assert rows.column("episode_index").to_pylist() == [e["episode_index"]] * e["length"]
            assert rows.column("frame_index").to_pylist() == list(range(e["length"]))
        total += t.num_rows
    assert total == sum(LENGTHS) and most >= 3
    assert json.loads((out / "meta/info.json").read_text())["total_frames"] == total
    assert LeRobotV3Exporter().verify(out).ok


def test_video_timestamps_match_the_frames_of_each_shard(source: Path, tmp_path: Path) -> None:
    out = export(source, tmp_path / "v3")
    eps = read_episodes_meta(out).to_pylist()
    for key in ("observation.images.cam0", "observation.images.cam1"):
        shards = sorted({(e[f"videos/{key}/chunk_index"], e[f"videos/{key}/file_index"]) for e in eps})
        assert len(shards) >= 2
        for chunk, file in shards:
            members = [e for e in eps if (e[f"videos/{key}/chunk_index"], e[f"videos/{key}/file_index"]) == (chunk, file)]
            path = out / f"videos/{key}/chunk-{chunk:03d}/file-{file:03d}.mp4"
            with av.open(str(path)) as c:
                s = c.streams.video[0]
                pts = sorted(Fraction(p.pts) * s.time_base for p in c.demux(s) if p.size)
            before = 0
            for e in members:
                assert abs(e[f"videos/{key}/from_timestamp"] - before / FPS) < 1e-9
                assert abs(e[f"videos/{key}/to_timestamp"] - (before + e["length"]) / FPS) < 1e-9
                shown = pts[before:before + e["length"]]
                assert [abs(float(t) - (before + i) / FPS) < 1e-4 for i, t in enumerate(shown)] == [True] * e["length"]
                before += e["length"]
            assert len(pts) == before
            assert shard_timing_problems(path, FPS, before) == []


def test_kept_packets_and_reread_files_give_the_same_shards(source: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    kept = export(source, tmp_path / "kept")
    monkeypatch.setattr(v3_probe, "PACKET_BUDGET", 0)  # nothing kept: every file opened again to copy
    reread = export(source, tmp_path / "reread")
    mp4s = sorted(p.relative_to(kept) for p in kept.rglob("*.mp4"))
    assert len(mp4s) >= 4 and mp4s == sorted(p.relative_to(reread) for p in reread.rglob("*.mp4"))
    for rel in mp4s:
        assert (kept / rel).read_bytes() == (reread / rel).read_bytes()


def test_stats_columns_and_dataset_stats_match_the_per_episode_paths(source: Path, tmp_path: Path) -> None:
    out = export(source, tmp_path / "v3")
    meta = read_meta(source)
    per = [meta.episodes_stats[e.episode_index].stats for e in meta.episodes]
    t = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet")
    stat_cols = [c for c in t.column_names if c.startswith("stats/")]
    assert stat_cols
    for name in stat_cols:
        _, feat, stat = name.split("/", 2)
        want = stats_column([p[feat][stat] for p in per])
        assert t.schema.field(name).type == want.type, name
        assert t.column(name).combine_chunks().equals(want), name
    got = json.loads((out / "meta/stats.json").read_text())
    agg = stats_mod.aggregate(per)
    for feat, entry in agg.items():
        for stat, value in entry.items():
            assert np.allclose(np.asarray(got[feat][stat], dtype=np.float64), np.asarray(value, dtype=np.float64),
                               rtol=1e-12, atol=1e-12), (feat, stat)


@pytest.mark.parametrize("values", [
    [[1.0, 2.0], [3.0, 4.5]],                      # flat floats
    [[1, 2], [3, 4]],                              # ints stay int64
    [[0, 1], [0.5, 2.0]],                          # ints then floats: double, as pa.array infers
    [[0.5, 2.0], [1, 3.0], [4, 5]],                # ints in a double column: doubles
    [[0.5, 2.0], [3.0, None], [4.0, 5.0]],         # a null after a number: the generic path, no stray 3.0
    [[[[1.0]], [[2.0]], [[3.0]]], [[[4.0]], [[5.0]], [[6.0]]]],  # an image stat (3, 1, 1)
    [[[[1]], [[2]], [[3]]], [[[4]], [[5]], [[6]]]],              # nested ints stay int64
    [[[[1]], [[2]], [[3]]], [[[4.5]], [[5]], [[6]]]],            # nested ints then a float: double
    [[[[1.0]], [[2.0]], [[3.0]]], [[[4.0]], [[5.0, 6.0]], [[7.0]]]],  # ragged inside: the generic path
    [[[[1.0]], [[2.0]], [[3.0]]], [[[4.0]], [[None]], [[6.0]]]],      # a null inside
    [[[[1.0]], [[2.0]], [[3.0]]], [[[4.0]], [[5.0]]]],               # fewer rows: the generic path
    [[1.0, 2.0], [1.0, 2.0, 3.0]],                 # ragged: the generic path
    [[True, False], [False, True]],                # not numbers: the generic path
    [5, 7],                                        # scalars
])
def test_stat_column_gives_the_arrow_column_pa_array_gives(values: list[object]) -> None:
    col = StatColumn()
    for row, v in enumerate(values):
        col.add(row, v)
    got = col.arrow(len(values))
    want = stats_column(values)
    assert got.type == want.type
    assert got.equals(want)


def test_stat_column_with_a_gap_holds_a_null_there() -> None:
    col = StatColumn()
    col.add(0, [1.0])
    col.add(2, [3.0])  # episode 1 lacks the stat
    got = col.arrow(4)
    assert got.to_pylist() == [[1.0], None, [3.0], None]
    assert got.type == pa.list_(pa.float64())


def test_only_small_files_keep_their_packets(source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file over KEEP_FILE_BYTES is probed (codec, reorder lead) but not kept: the copy opens it
    again, so long episodes do not hold megabytes of packets until they are copied."""
    meta = read_meta(source)
    key = meta.info.video_keys[0]
    paths = [(e.episode_index, meta.video_path(key, e.episode_index)) for e in meta.episodes[:4]]
    sizes = sorted(p.stat().st_size for _, p in paths)
    monkeypatch.setattr(v3_probe, "KEEP_FILE_BYTES", sizes[1])  # the two smallest fit, the others not
    probes = v3_probe.Probes(FPS, budget=1 << 30)
    probes.take_all(paths)
    got = {i: probes.pop(i) for i, _ in paths}
    assert all(p is not None for p in got.values())
    kept = {i for i, p in got.items() if p is not None and p.packets is not None}
    small = {i for i, p in paths if p.stat().st_size <= sizes[1]}
    assert kept == small and 2 <= len(kept) < len(paths)


def test_probes_hold_only_the_window_and_give_the_budget_back(source: Path) -> None:
    """Probes.next probes at most ``window`` files ahead, hands them out in order, and the
    packet budget a copied episode's packets took is free again (memory flat in episodes)."""
    meta = read_meta(source)
    key = meta.info.video_keys[0]
    paths = [(e.episode_index, meta.video_path(key, e.episode_index)) for e in meta.episodes]
    probes = v3_probe.Probes(FPS, budget=1 << 20, window=4)
    probes.stream(iter(paths))
    for i, path in paths:
        got_i, got_path, p, lead = probes.next()
        assert (got_i, got_path) == (i, path)
        assert p is not None and p.packets is not None and lead >= p.lead_frames
        assert len(probes._ahead) < 4
        assert not probes._held
    assert probes.left == 1 << 20


def _write_video(path: Path, fmt: str, frames: int = 3) -> None:
    with av.open(str(path), mode="w", format=fmt) as c:
        s = c.add_stream("libx264", rate=FPS)
        s.width, s.height, s.pix_fmt = 32, 16, "yuv420p"
        for i in range(frames):
            img = np.full((16, 32, 3), 40 * i, np.uint8)
            for pkt in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(pkt)
        for pkt in s.encode():
            c.mux(pkt)


def test_an_mp4_opens_with_the_mp4_demuxer_and_a_misnamed_file_still_opens(tmp_path: Path) -> None:
    real, misnamed = tmp_path / "real.mp4", tmp_path / "misnamed.mp4"
    _write_video(real, "mp4")
    _write_video(misnamed, "matroska")  # a Matroska file under an .mp4 name
    with v3_probe.open_input(real) as c:
        assert "mp4" in c.format.name
    with v3_probe.open_input(misnamed) as c:
        assert c.format.name.startswith("matroska")
    for path in (real, misnamed):
        p = v3_probe.probe(path, FPS, keep=True)
        assert p is not None and p.packets is not None and len(p.packets) == 3
