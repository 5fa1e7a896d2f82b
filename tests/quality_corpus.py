"""A fault corpus for the quality rules: one faulty episode per fault class, plus clean controls.

Every episode is a set of arrays (timestamps, state, action, per-camera frame contents) with the
frames where its fault is. ``write_corpus`` writes them as one real v2.1 dataset through the
project's writer (dsfactory's features), then injects what a writer cannot produce (bad
timestamps, a short video). ``feed_live`` pushes the same samples, as messages, through the
capture engine (``EpisodeRun``, the path live capture and bag ingest share, without DDS).
Deterministic: every random draw is seeded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from dsfactory import features

from eva_export.formats.common.video import VideoEncoder, VideoSettings
from eva_export.formats.lerobot_v21.writer import DatasetWriter

FPS = 30
N = 240  # 8 s episodes
CAMS = ("cam0", "cam1")
W, H = 64, 48
JOINTS = 6
SETTINGS = VideoSettings(crf=18)


@dataclass(frozen=True)
class Expect:
    code: str
    stream: str  # the finding's stream (prefix match: "action" matches "action[2]")
    first: int  # the fault's frames: a reported range must overlap [first, last]
    last: int


@dataclass(frozen=True)
class CorpusEpisode:
    name: str
    kind: str  # "fault" or "control"
    timestamps: np.ndarray
    state: np.ndarray
    action: np.ndarray
    content: dict[str, np.ndarray]  # camera -> per-row frame content number (equal: same image)
    expect: tuple[Expect, ...] = ()
    video_frames: dict[str, int] = field(default_factory=dict)  # camera -> frames actually encoded
    offline_only: str = ""  # why the same samples cannot show this fault live ("" = they can)

    @property
    def rows(self) -> int:
        return int(self.timestamps.size)


def frame_image(content: int, cam: int) -> np.ndarray:
    """A textured frame that moves with ``content`` (equal content: identical frame)."""
    x = np.arange(W)[None, :]
    y = np.arange(H)[:, None]
    img = np.empty((H, W, 3), np.uint8)
    img[..., 0] = (x * 4 + content * 3) % 256
    img[..., 1] = (y * 5 + content * 2 + 40 * cam) % 256
    img[..., 2] = (np.sin((x + y + content) / 6.0) * 60 + 120).astype(np.uint8)
    return img


def smootherstep(m: int) -> np.ndarray:
    u = np.linspace(0.0, 1.0, m)
    return 6 * u**5 - 15 * u**4 + 10 * u**3


# ---- signals ------------------------------------------------------------------------------------
def sines(t: np.ndarray, freqs: tuple[float, ...], amps: tuple[float, ...], seed: int = 0) -> np.ndarray:
    phases = np.random.default_rng(seed).uniform(0, 2 * np.pi, JOINTS)
    return np.stack([amps[j % len(amps)] * np.sin(2 * np.pi * freqs[j % len(freqs)] * t + phases[j])
                     for j in range(JOINTS)], axis=1)


def base_signal(t: np.ndarray) -> np.ndarray:
    return sines(t, (0.5, 0.3, 0.4, 0.25, 0.6, 0.35), (0.8, 0.5, 0.6, 1.0, 0.4, 0.7), seed=1)


def episode(name: str, kind: str, action_fn: Callable[[np.ndarray], np.ndarray], n: int = N,
            **kw: Any) -> CorpusEpisode:
    """An episode whose state follows the action one frame late."""
    t = np.arange(n) / FPS
    action = action_fn(t)
    state = action_fn(t - 1.0 / FPS)
    content = {c: np.arange(n) for c in CAMS}
    return CorpusEpisode(name, kind, t, state, action, content, **kw)


def controls() -> list[CorpusEpisode]:
    rng = np.random.default_rng(7)
    noise_a = rng.normal(0, 0.003, (N, JOINTS))
    noise_s = rng.normal(0, 0.003, (N, JOINTS))
    held = episode("held_gripper", "control", base_signal)
    grip = np.full(N, 0.08)
    close = 0.08 * (1 - smootherstep(15))
    for a in (20, 125):  # close, hold 2.5 s, open: twice
        grip[a:a + 15], grip[a + 15:a + 90], grip[a + 90:a + 105] = close, 0.0, close[::-1]
    ga, gs = held.action.copy(), held.state.copy()
    ga[:, 5], gs[:, 5] = grip, np.roll(grip, 1)
    out = [
        episode("ramp", "control", lambda t: np.outer(t, np.linspace(0.05, 0.3, JOINTS)) - 0.5),
        episode("constant_velocity_big_values", "control", lambda t: 1000.0 + np.outer(t * FPS, np.ones(JOINTS))),
        episode("sine_slow", "control", lambda t: sines(t, (0.1, 0.15, 0.2), (1.5, 0.2, 0.05), seed=2)),
        episode("sine_mid", "control", base_signal),
        episode("sine_fast", "control", lambda t: sines(t, (3.0, 5.0, 7.0), (0.3, 0.1, 0.5), seed=3)),
        episode("sine_at_fps", "control", lambda t: sines(t, (10.0, 12.0, 14.0, 14.9), (0.2, 0.4, 0.05, 0.1), seed=4)),
        replace(held, name="held_gripper", action=ga, state=gs),
        episode("at_rest", "control", lambda t: np.tile(np.linspace(-0.3, 0.3, JOINTS), (t.size, 1))),
        replace(episode("noisy", "control", base_signal), name="noisy",
                action=base_signal(np.arange(N) / FPS) + noise_a,
                state=base_signal(np.arange(N) / FPS - 1 / FPS) + noise_s),
    ]
    return out


def faults() -> list[CorpusEpisode]:
    out: list[CorpusEpisode] = []
    t = np.arange(N) / FPS
    ep = episode("frozen_action", "fault", base_signal)
    a = ep.action.copy()
    a[100:161] = a[100]  # 61 identical rows: 2 s, then it catches up
    out.append(replace(ep, action=a, expect=(Expect("frozen_signal", "action", 100, 160),)))
    a = ep.action.copy()
    a[120, 3] += 0.8
    out.append(replace(ep, name="action_spike", action=a, expect=(Expect("spike", "action[joint_3]", 120, 120),)))
    a = ep.action.copy()
    a[100:161, 2] = a[100, 2]
    out.append(replace(ep, name="joint_stuck", action=a, expect=(Expect("stuck_joint", "action[joint_2]", 100, 160),)))
    a = ep.action.copy()
    a[:, 1] = np.clip(a[:, 1], -0.4, 0.4)  # its amplitude is 0.5
    out.append(replace(ep, name="saturation", action=a, expect=(Expect("saturation", "action[joint_1]", 0, N - 1),)))
    s = ep.state.copy()
    s[90:105, 0] = np.nan
    out.append(replace(ep, name="nan_run", state=s, expect=(Expect("non_finite", "observation.state", 90, 104),)))
    out.append(_gap(t))
    out.append(_duplicate())
    off = t.copy()
    off[100:141] += 0.005
    out.append(replace(ep, name="off_grid", timestamps=off, expect=(Expect("off_grid_timestamp", "timestamp", 100, 140),),
                       offline_only="capture writes its rows on the grid; off-grid stamps are aligned onto it"))
    back = t.copy()
    back[120:] -= 4 / FPS
    out.append(replace(ep, name="non_monotonic", timestamps=back,
                       expect=(Expect("non_monotonic_clock", "timestamp", 120, 120),)))
    content = dict(ep.content)
    content["cam1"] = np.where((t >= 2.0) & (t < 5.0), 60, np.arange(N))
    out.append(replace(ep, name="frozen_camera", content=content,
                       expect=(Expect("frozen_camera", "observation.images.cam1", 60, 149),)))
    out.append(replace(ep, name="frame_count_mismatch", video_frames={"cam0": N - 5},
                       expect=(Expect("video_frame_count_mismatch", "observation.images.cam0", -1, -1),)))
    out.append(episode("too_short", "fault", base_signal, n=6, expect=(Expect("too_short", "", -1, -1),)))
    return out


def _gap(t: np.ndarray) -> CorpusEpisode:
    """0.5 s missing after row 120: the rows continue at their true times."""
    tt = np.where(np.arange(N) >= 120, t + 0.5, t)
    return CorpusEpisode("timestamp_gap", "fault", tt, base_signal(tt - 1 / FPS), base_signal(tt),
                         {c: np.round(tt * FPS).astype(int) for c in CAMS},
                         (Expect("timestamp_gap", "timestamp", 119, 120),))


def _duplicate() -> CorpusEpisode:
    """Row 120 repeats row 119 (values, frames and timestamp); the rest follow one row late."""
    src = np.where(np.arange(N) >= 120, np.arange(N) - 1, np.arange(N))
    tt = src / FPS
    return CorpusEpisode("duplicate_timestamps", "fault", tt, base_signal(tt - 1 / FPS), base_signal(tt),
                         {c: src.copy() for c in CAMS}, (Expect("duplicate_timestamp", "timestamp", 120, 120),))


def corpus() -> list[CorpusEpisode]:
    return controls() + faults()


# ---- the offline side: a real v2.1 dataset ----------------------------------------------------
def write_corpus(root: Path, episodes: list[CorpusEpisode]) -> Path:
    dw = DatasetWriter.open(root, fps=FPS, features=features(len(CAMS), W, H, FPS), robot_type="test",
                            settings=SETTINGS)
    for ep in episodes:
        w = dw.begin_episode("corpus")
        for k in range(ep.rows):
            w.add_frame({"observation.state": ep.state[k].astype(np.float32),
                         "action": ep.action[k].astype(np.float32), "capture_time": float(ep.timestamps[k])},
                        {f"observation.images.{c}": frame_image(int(ep.content[c][k]), i) for i, c in enumerate(CAMS)})
        w.finish()
        row = dw.commit(w, {"corpus": ep.name})
        assert row is not None
        _inject(root, row.episode_index, ep)
    return root


def _inject(root: Path, index: int, ep: CorpusEpisode) -> None:
    """What the writer cannot write: stored timestamps that are not frame_index / fps, a short video."""
    data = root / f"data/chunk-000/episode_{index:06d}.parquet"
    if not np.array_equal(ep.timestamps, np.arange(ep.rows) / FPS):
        table = pq.read_table(data)
        col = table.schema.get_field_index("timestamp")
        table = table.set_column(col, "timestamp", pa.array(ep.timestamps.astype(np.float32)))
        pq.write_table(table, data)
    for cam, frames in ep.video_frames.items():
        path = root / f"videos/chunk-000/observation.images.{cam}/episode_{index:06d}.mp4"
        path.unlink()
        with VideoEncoder(path, W, H, FPS, SETTINGS) as enc:
            for k in range(frames):
                enc.add(frame_image(int(ep.content[cam][k]), CAMS.index(cam)))


# ---- the live side: the same samples as messages through the capture engine --------------------
def live_config(log_dir: Path, min_frames: int = 10, frozen_frames: int = 15) -> Any:
    from eva_export.config import parse_config

    names = [f"joint_{j}" for j in range(JOINTS)]
    raw = {"collection": {
        "log_dir": str(log_dir), "fps": FPS, "robot_type": "test",
        "tasks": [{"dataset_name": "live", "task": "corpus"}],
        "streams": {"state": {"topic": "/s", "type": "JointState", "names": names},
                    "action": {"topic": "/a", "type": "Float64MultiArray", "names": names},
                    "cameras": [{"name": c, "topic": f"/{c}", "width": W, "height": H} for c in CAMS]},
        "capture": {"min_frames": min_frames, "frozen_frames": frozen_frames, "max_drop_ratio": 0.05}}}
    return parse_config(raw).collection


@dataclass(frozen=True)
class LiveResult:
    quality: str
    issues: list[dict[str, Any]]
    rows: int


def _messages(ep: CorpusEpisode, t0: float) -> list[tuple[float, int, float, Any]]:
    """(receive time, stream, header stamp, payload) in receive order; a message is received
    when its stamp says (never before an earlier one: the wire does not go back in time)."""
    from eva_export.capture.intake import RawImage, RawVector

    names = [f"joint_{j}" for j in range(JOINTS)]
    arrival = t0 + np.maximum.accumulate(ep.timestamps)
    out: list[tuple[float, int, float, Any]] = []
    for k in range(ep.rows):
        stamp = t0 + float(ep.timestamps[k])
        recv = float(arrival[k]) + 1e-6 * k
        out.append((recv + 0.001, 0, stamp, RawVector(ep.state[k].astype(np.float64), names)))
        out.append((recv + 0.002, 1, stamp, RawVector(ep.action[k].astype(np.float64))))
        for i, c in enumerate(CAMS):
            # the reference camera (the first) last: the grid starts once every stream delivered
            img = frame_image(int(ep.content[c][k]), i)
            out.append((recv + 0.004 - 0.001 * i, 2 + i, stamp, RawImage(img.reshape(-1), H, W, "rgb8", W * 3)))
    out.sort(key=lambda m: (m[0], m[1]))
    return out


def feed_live(col: Any, dw: DatasetWriter, ep: CorpusEpisode, t0: float = 1000.0) -> LiveResult:
    """Record one corpus episode as live capture would (the receive clock driven by the
    messages, like bag ingest); ``ep.video_frames`` stands in for the encoder's frame count."""
    from eva_export.capture.episode import EpisodeRun
    from eva_export.capture.intake import streams_from_config
    from eva_export.capture.stream import states_for

    states = states_for(streams_from_config(col))
    run = EpisodeRun.begin(col, states, dw, "live", "corpus", t0 - 0.01, 0.0)
    last = t0
    for recv, i, stamp, payload in _messages(ep, t0):
        t_src = states[i].offset.observe(recv, stamp)
        run.poll(recv)
        run.push(i, recv, stamp, payload, t_src)
        last = recv
    run.stop(last + 0.5 / FPS)
    run.finish_slots()
    row, result = run.save()
    assert row is not None
    if ep.video_frames:  # the encoder wrote every frame it got: judge the count the corpus has
        frames = {c: ep.video_frames.get(c, row.length) for c in CAMS}
        result = run.checker.finish(row.length, last + 0.5 / FPS, frames, run.aligner.timings())
    return LiveResult(result.quality, [i.to_dict() for i in result.issues], row.length)


def missing(found: list[tuple[str, str, list[list[int]]]], ep: CorpusEpisode) -> list[str]:
    """The expected findings of ``ep`` that ``found`` lacks (code, stream and overlapping frames)."""
    out = []
    for e in ep.expect:
        ok = any(code == e.code and stream.startswith(e.stream)
                 and (e.first < 0 or any(a <= e.last and b >= e.first for a, b in ranges))
                 for code, stream, ranges in found)
        if not ok:
            out.append(f"{e.code} {e.stream} {e.first}-{e.last}")
    return out


# ---- the same episodes as sources we did not record: LeRobot v3.0 and v2.0 ----------------------
#: The episode metadata columns LeRobot 0.4.x writes (the rest are our export's extra fields).
V3_PREFIXES = ("episode_index", "tasks", "length", "data/", "dataset_", "videos/", "stats/", "meta/episodes/")


def write_v30_corpus(work: Path, root: Path, episodes: list[CorpusEpisode]) -> Path:
    """The episodes as a foreign v3.0 dataset: written as v2.1 under ``work``, converted by the
    project's v3.0 exporter (one shared Parquet and one shared MP4 per camera), stripped of
    everything LeRobot would not write. A v3.0 exporter refuses a short video, so an episode's
    ``video_frames`` is injected afterwards: that episode must be the last one, and its camera
    file loses its final frames (the shared file ends before the episode's to_timestamp)."""
    from eva_export.export.records import QualitySplit
    from eva_export.formats.common.meta import read_meta
    from eva_export.formats.lerobot_v3.exporter import LeRobotV3Exporter

    short = [ep for ep in episodes if ep.video_frames]
    assert all(ep is episodes[-1] for ep in short), "the short-video episode goes last"
    v21 = write_corpus(work, [replace(ep, video_frames={}) for ep in episodes])
    meta = read_meta(v21)
    QualitySplit(str(v21), "accepted", "lerobot_v21", [e.episode_index for e in meta.episodes],
                 episode_count=len(meta.episodes), frame_count=sum(e.length for e in meta.episodes)).write(v21)
    LeRobotV3Exporter().export(v21, root)
    for name in ("quality_split.json", "episodes.jsonl", "tasks.jsonl", "episodes_stats.jsonl"):
        (root / "meta" / name).unlink(missing_ok=True)
    eps_file = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(eps_file)
    pq.write_table(table.select([c for c in table.column_names if c.startswith(V3_PREFIXES)]), eps_file)
    for ep in short:
        for cam, frames in ep.video_frames.items():
            _drop_last_frames(root / f"videos/observation.images.{cam}/chunk-000/file-000.mp4", ep.rows - frames)
    return root


def _drop_last_frames(path: Path, drop: int) -> None:
    import av

    with av.open(str(path)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    path.unlink()
    with VideoEncoder(path, W, H, FPS, SETTINGS) as enc:
        for img in frames[: len(frames) - drop]:
            enc.add(img)


def write_v20_corpus(root: Path, episodes: list[CorpusEpisode]) -> Path:
    """The episodes as a v2.0 dataset: what tools/make_v20_fixture.py undoes of LeRobot's
    v2.0 -> v2.1 converter (no per-episode statistics, codebase_version "v2.0")."""
    import json

    write_corpus(root, episodes)
    (root / "meta/episodes_stats.jsonl").unlink()
    info_path = root / "meta/info.json"
    info = json.loads(info_path.read_text())
    info["codebase_version"] = "v2.0"
    info_path.write_text(json.dumps(info, indent=4) + "\n")
    rows = [json.loads(x) for x in (root / "meta/episodes.jsonl").read_text().splitlines()]
    keep = ("episode_index", "tasks", "length")  # an older LeRobot's rows: no eva quality fields
    (root / "meta/episodes.jsonl").write_text("".join(json.dumps({k: r[k] for k in keep}) + "\n" for r in rows))
    return root
