"""Capture core without ROS: the grid alignment rule, every quality check, the Recorder engine."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from eva_export.capture.align import GridAligner, Sample, align_offline
from eva_export.capture.checks import EpisodeChecker
from eva_export.capture.features import capture_features
from eva_export.capture.recorder import (
    ImageDecoder,
    RawImage,
    RawVector,
    Recorder,
    fingerprint,
)
from eva_export.config import parse_config
from eva_export.errors import DatasetError
from eva_export.formats.lerobot_v21.writer import DatasetWriter

FPS = 30
T = 1.0 / FPS


def cam_stream(t_first: float, t_end: float, period: float = T, jitter: float = 0.0, skip=(),
               seed: int = 0) -> list[tuple[float, float]]:
    rng = np.random.default_rng(seed)
    out = []
    k = 0
    while t_first + k * period <= t_end:
        t = t_first + k * period
        if k not in skip:
            recv = t + (rng.uniform(-jitter, jitter) if jitter else 0.0)
            out.append((recv, t))
        k += 1
    return out


# ---- alignment ---------------------------------------------------------------------------------
def test_grid_starts_on_first_reference_frame_and_is_even():
    state = cam_stream(10.003, 12.0, 0.01)
    cam = cam_stream(10.020, 12.0)
    slots = align_offline([state, cam], FPS, start=10.0, stop=11.5, reference=1)
    t0 = slots[0].t
    assert t0 == pytest.approx(10.020)  # the first camera frame once every stream is present
    assert len(slots) == int((11.5 - t0) * FPS) + 1
    assert all(s.t == pytest.approx(t0 + s.index / FPS) for s in slots)
    assert [s.index for s in slots] == list(range(len(slots)))
    assert not any(p.dropped for s in slots for p in s.picks)
    cam_seq = [s.picks[1].sample.seq for s in slots]
    assert cam_seq == list(range(1, len(slots) + 1))


def test_pick_is_nearest_message_in_the_slot_window():
    # state messages at exact times; the window of slot k is (t_k - T/2, t_k + T/2]
    state = [(10.0 + i * 0.01, None) for i in range(200)]
    cam = cam_stream(10.0, 12.0)
    slots = align_offline([state, cam], FPS, start=10.0, stop=11.0, reference=1)
    for s in slots:
        recv = s.picks[0].sample.recv
        assert abs(recv - s.t) <= 0.005 + 1e-9  # the nearest 100 Hz message to the slot time
        assert not s.picks[0].dropped


def test_jitter_and_phase_offset_give_no_drops():
    cam_a = cam_stream(5.0, 9.0, jitter=0.006, seed=1)
    cam_b = cam_stream(5.011, 9.0, jitter=0.006, seed=2)  # 11 ms phase offset
    state = cam_stream(5.002, 9.0, 0.01, jitter=0.002, seed=3)
    slots = align_offline([state, cam_a, cam_b], FPS, start=5.0, stop=8.0, reference=1)
    assert len(slots) >= 89
    assert sum(p.dropped for s in slots for p in s.picks) == 0


def test_missing_frames_count_as_drops_and_hold_the_value():
    skip = {10, 20, 21, 40}
    cam = cam_stream(1.0, 4.0, skip=skip)
    state = cam_stream(1.0, 4.0, 0.01)
    slots = align_offline([state, cam], FPS, start=1.0, stop=3.0, reference=1)
    drops = [s.index for s in slots if s.picks[1].dropped]
    assert drops == sorted(skip)
    for k in drops:  # the held frame is the previous slot's frame (a repeat)
        assert slots[k].picks[1].repeat
        assert slots[k].picks[1].sample is slots[k - 1].picks[1].sample


def test_stream_that_stops_is_dropped_and_held():
    cam = cam_stream(0.0, 3.0)
    state = cam_stream(0.0, 1.0, 0.01)  # stops after 1 s
    slots = align_offline([state, cam], FPS, start=0.0, stop=2.0, reference=1)
    after = [s for s in slots if s.t > 1.0 + T / 2 + 1e-6]
    assert after and all(s.picks[0].dropped and s.picks[0].repeat for s in after)
    assert all(s.picks[0].sample.payload == (0, len(state) - 1) for s in after)
    assert not any(s.picks[1].dropped for s in slots)


def test_window_end_is_inclusive():
    al = GridAligner(1, FPS, 1.0, reference=None)
    al.push(0, Sample(1.0, 1.0, "a"))
    assert al.t0 == 1.0
    tol = T / 2
    assert [s.index for s in al.push(0, Sample(1 + T + tol, 1 + T + tol, "b"))] == [0]
    slots = al.push(0, Sample(1 + 2 * T + tol - 1e-6, 1 + 2 * T + tol - 1e-6, "c"))
    # slot 1's window ends at T + tol inclusive: it holds "b", stamped exactly there
    assert [s.index for s in slots] == [1]
    assert slots[0].picks[0].sample.payload == "b"


def test_emission_does_not_depend_on_poll_timing():
    cam = cam_stream(0.0, 2.0, jitter=0.005, seed=4)
    state = cam_stream(0.001, 2.0, 0.01, jitter=0.003, seed=5)
    ref = align_offline([state, cam], FPS, start=0.0, stop=1.5, reference=1)
    # same events, polled only at the very end (a worker that lagged the whole episode)
    al = GridAligner(2, FPS, 0.0, reference=1)
    out = []
    for recv, i, stamp in sorted([(r, 0, s) for r, s in state] + [(r, 1, s) for r, s in cam]):
        if recv > 1.5 + T / 2:
            break
        out += al.push(i, Sample(recv, stamp, None))
    al.stop(1.5)
    out += al.finish()
    assert [(s.index, [p.sample.recv for p in s.picks]) for s in out] == \
           [(s.index, [p.sample.recv for p in s.picks]) for s in ref]


def test_silent_stream_starts_grid_after_grace_with_placeholders():
    cam = cam_stream(0.0, 3.0)
    slots = align_offline([[], cam], FPS, start=0.0, stop=2.0, reference=1, grace_s=0.5)
    assert slots, "the grid starts after the grace period"
    assert slots[0].t >= 0.5 - T
    assert all(s.picks[0].sample is None and s.picks[0].dropped for s in slots)


def test_stop_before_any_data_gives_zero_slots():
    assert align_offline([[], []], FPS, start=0.0, stop=0.2) == []


# ---- checks ------------------------------------------------------------------------------------
def checker(**kw) -> EpisodeChecker:
    defaults = dict(fps=FPS, start=0.0, min_frames=10, frozen_frames=5)
    defaults.update(kw)
    return EpisodeChecker(["state", "front", "wrist"], [False, True, True], **defaults)


def row_of(slot, frozen: str = "", nan_at: int = -1) -> list:
    """The row written for a slot: a ramp state (NaN at ``nan_at``), a changing image per camera
    (or a constant one for the ``frozen`` camera)."""
    state = np.full(3, float(slot.index)) if slot.index != nan_at else np.array([np.nan, 0.0, 0.0])
    imgs = [np.full((8, 8, 3), 7 if name == frozen else (slot.index * 5 + k) % 256, np.uint8)
            for k, name in enumerate(("front", "wrist"))]
    return [state, *imgs]


def feed_clean(ck: EpisodeChecker, n: int = 60, cam_stamp_offset: float = 0.0, frozen: str = "",
               skip_front=(), state_stamps=None, nan_at: int = -1) -> int:
    wrist = [(r, s + cam_stamp_offset) for r, s in cam_stream(0.0, n * T + 1)]
    cams = {"front": cam_stream(0.0, n * T, skip=skip_front), "wrist": wrist}
    events = [(r, 0, s) for r, s in cam_stream(0.0, n * T, 0.01)]
    events += [(r, 1, s) for r, s in cams["front"]] + [(r, 2, s) for r, s in cams["wrist"]]
    events.sort()
    al = GridAligner(3, FPS, 0.0, reference=1)
    rows = 0
    for k, (recv, i, stamp) in enumerate(events):
        if recv > n * T:
            break
        if state_stamps is not None and i == 0:
            stamp = state_stamps(k, stamp)
        ck.on_message(i, recv, stamp)
        for s in al.push(i, Sample(recv, stamp, None)):
            ck.on_slot(s, row_of(s, frozen, nan_at))
            rows += 1
    al.stop(n * T)
    for s in al.finish():
        ck.on_slot(s, row_of(s, frozen, nan_at))
        rows += 1
    return rows


def test_clean_episode_is_green_with_stream_stats():
    ck = checker()
    rows = feed_clean(ck)
    res = ck.finish(rows, 60 * T, {"front": rows, "wrist": rows})
    assert res.quality == "green", res.issues
    assert set(res.stream_stats) == {"state", "front", "wrist"}
    st = res.stream_stats["front"]
    assert set(st) >= {"received", "rate_hz", "max_gap_s", "dropped"}
    assert st["dropped"] == 0 and st["rate_hz"] == pytest.approx(30, rel=0.05)
    assert res.row_extra()["quality_issues"] == []


def test_too_short():
    ck = checker(min_frames=100)
    rows = feed_clean(ck)
    res = ck.finish(rows, 60 * T, {})
    assert res.codes == ["too_short"] and res.quality == "red"


def test_dropped_frames_counts_per_camera():
    ck = checker()
    rows = feed_clean(ck, skip_front={5, 6, 30})
    res = ck.finish(rows, 60 * T, {"front": rows, "wrist": rows})
    assert res.codes == ["dropped_frames"]
    assert "front: 3/" in res.issues[0].detail and "wrist" not in res.issues[0].detail
    assert res.stream_stats["front"]["dropped"] == 3
    # a ratio allowance turns the same episode green
    ck2 = checker(max_drop_ratio=0.1)
    rows2 = feed_clean(ck2, skip_front={5, 6, 30})
    assert ck2.finish(rows2, 60 * T, {}).quality == "green"


def test_camera_skew():
    ck = checker()
    rows = feed_clean(ck, cam_stamp_offset=-0.2)  # wrist stamps 200 ms older than front's
    res = ck.finish(rows, 60 * T, {})
    assert "camera_skew" in res.codes


def test_frozen_camera():
    ck = checker()
    rows = feed_clean(ck, frozen="wrist")
    res = ck.finish(rows, 60 * T, {})
    assert res.codes == ["frozen_camera"] and "wrist" in res.issues[0].detail


def test_missing_stream_never_received_and_stopped():
    ck = checker()
    ck.on_message(1, 0.01, 0.01)
    ck.on_message(2, 0.01, 0.01)
    ck.on_message(1, 0.02, 0.02)
    res = ck.finish(30, 2.0, {})
    details = [i.detail for i in res.issues if i.code == "missing_stream"]
    assert any(d.startswith("state: no message") for d in details)
    assert any(d.startswith("front: stopped") for d in details)


def test_shape_dimension_nonfinite_clock_and_video_count():
    ck = checker()
    rows = feed_clean(ck, state_stamps=lambda k, s: s - (0.5 if k == 40 else 0.0), nan_at=20)
    ck.on_shape(1, "640x480 received, 320x240 configured")
    ck.on_dimension(0, "joints ['j9'] missing from the message")
    res = ck.finish(rows, 60 * T, {"front": rows - 1, "wrist": rows})
    assert set(res.codes) == {"image_shape_change", "vector_dimension_change", "non_finite",
                              "non_monotonic_clock", "video_frame_count_mismatch"}
    assert all(i.severity == "error" for i in res.issues) and res.quality == "red"


# ---- decoding and features ----------------------------------------------------------------------
def test_image_decoder_encodings_and_jpeg():
    from eva_export.nodes.teleop_sim import decode_counter, jpeg_bytes, render_frame

    img = render_frame(321, 64, 48)
    dec = ImageDecoder()
    flat = img.reshape(-1)
    assert np.array_equal(dec.rgb(RawImage(flat, 48, 64, "rgb8", 64 * 3)), img)
    bgr = img[..., ::-1].copy().reshape(-1)
    assert np.array_equal(dec.rgb(RawImage(bgr, 48, 64, "bgr8", 64 * 3)), img)
    padded = np.zeros((48, 64 * 3 + 8), np.uint8)
    padded[:, : 64 * 3] = img.reshape(48, -1)
    assert np.array_equal(dec.rgb(RawImage(padded.reshape(-1), 48, 64, "rgb8", 64 * 3 + 8)), img)
    jpg = dec.rgb(RawImage(np.frombuffer(jpeg_bytes(render_frame(321, 320, 240)), np.uint8), compressed=True))
    assert jpg.shape == (240, 320, 3) and decode_counter(jpg) == 321
    with pytest.raises(ValueError):
        dec.rgb(RawImage(np.zeros(10, np.uint8), compressed=True))
    a = RawImage(flat, 48, 64, "rgb8")
    assert fingerprint(a) == fingerprint(RawImage(flat.copy(), 48, 64, "rgb8"))
    assert fingerprint(a) != fingerprint(RawImage(render_frame(322, 64, 48).reshape(-1), 48, 64, "rgb8"))


def make_config(tmp_path: Path, **capture) -> object:
    cap = {"min_frames": 5, "frozen_frames": 30, "max_drop_ratio": 0.1, **capture}
    raw = {"collection": {
        "log_dir": str(tmp_path / "logs"), "fps": FPS, "robot_type": "sim",
        "tasks": [{"dataset_name": "pick", "task": "pick it"}, {"dataset_name": "place", "task": "place it"}],
        "streams": {"state": {"topic": "/s", "type": "JointState", "names": ["a", "b", "c"]},
                    "action": {"topic": "/a", "type": "Float64MultiArray", "names": ["a", "b", "c"]},
                    "cameras": [{"name": "front", "topic": "/f", "width": 64, "height": 48}]},
        "capture": cap}}
    return parse_config(raw).collection


def test_features_from_config(tmp_path):
    col = make_config(tmp_path)
    f = capture_features(col)
    assert list(f)[:4] == ["observation.state", "action", "capture_time", "observation.images.front"]
    assert f["observation.state"].dtype == "float32" and f["observation.state"].names == ["a", "b", "c"]
    assert f["capture_time"].dtype == "float64" and f["capture_time"].shape == (1,)
    assert f["observation.images.front"].shape == (48, 64, 3)
    assert f["observation.images.front"].info["video.codec"] == "h264"
    assert {"timestamp", "frame_index", "episode_index", "index", "task_index"} <= set(f)


# ---- the engine with a real-time synthetic feed --------------------------------------------------
class Feed:
    """Publishes state (JointState order c, a, b) at 100 Hz, action and a 64x48 camera at 30 Hz.

    Stamps are the scheduled sample times (as a sensor stamps them), so a publisher thread that
    a busy host starves delivers late, in a burst, but loses nothing; tests wait for a number of
    published samples (``wait_published``), not for wall time.
    """

    def __init__(self, rec: Recorder, *, names=("c", "a", "b"), nan_after: int = -1, frozen: bool = False):
        self.rec, self.names, self.nan_after, self.frozen = rec, names, nan_after, frozen
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.n = 0  # state samples published so far

    def run(self) -> None:
        from eva_export.nodes.teleop_sim import render_frame

        t0 = time.monotonic()
        n = 0
        while not self.stop.is_set():
            target = t0 + n * 0.01
            time.sleep(max(0.0, target - time.monotonic()))
            now = time.monotonic()
            vals = {"a": n + 0.0, "b": n + 0.25, "c": n + 0.5}
            v = np.array([vals.get(k, 0.0) for k in self.names])
            if 0 <= self.nan_after <= n:
                v[0] = np.nan
            self.rec.offer(0, now, target, RawVector(v, self.names))
            if n % 3 == 0:
                m = n // 3
                self.rec.offer(1, now, None, RawVector(np.array([-m, -m, -m], float)))
                img = render_frame(0 if self.frozen else m, 64, 48)
                self.rec.offer(2, now, target, RawImage(img.reshape(-1), 48, 64, "rgb8", 64 * 3))
            n += 1
            self.n = n

    def wait_published(self, samples: int, timeout: float = 60.0) -> None:
        """Until ``samples`` more state samples (at 100 Hz: samples / 100 s of data) are out."""
        want = self.n + samples
        end = time.monotonic() + timeout
        while self.n < want:
            assert time.monotonic() < end, f"feed published {self.n} of {want} samples in {timeout} s"
            time.sleep(0.005)

    def __enter__(self) -> Feed:
        self.thread.start()
        self.wait_published(20)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def rows_of(root: Path) -> list[dict]:
    p = root / "meta" / "episodes.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def test_recorder_records_green_episode_and_appends_after_restart(tmp_path):
    col = make_config(tmp_path)
    rec = Recorder(col)
    try:
        with Feed(rec) as feed:
            assert rec.start().ok
            feed.wait_published(100)  # 1 s of samples: 30 slots, less the start (t0 on a frame)
            stop = rec.stop()
            assert stop.ok and stop.episode_index == 0 and stop.frames >= 25
            assert rec.wait_saved(30)
    finally:
        rec.close()
    root = col.dataset_dir("pick")
    rows = rows_of(root)
    assert len(rows) == 1 and rows[0]["quality"] == "green", rows
    assert rows[0]["length"] == stop.frames
    import pyarrow.parquet as pq

    t = pq.read_table(root / "data/chunk-000/episode_000000.parquet").to_pydict()
    state = np.array(t["observation.state"])
    assert np.allclose(state[:, 1] - state[:, 0], 0.25) and np.allclose(state[:, 2] - state[:, 0], 0.5)
    assert np.allclose(np.array(t["timestamp"]), np.arange(len(state)) / FPS, atol=1e-6)
    # receive times, in order (a frame later than the latency budget on a starved host holds
    # its slot's previous row, so two rows may share one)
    ct = np.array(t["capture_time"])
    assert np.all(np.diff(ct) >= 0) and ct[-1] - ct[0] > 0.5, ct
    rec2 = Recorder(col)  # a relaunch appends
    try:
        with Feed(rec2) as feed:
            assert rec2.start().ok
            feed.wait_published(50)
            assert rec2.stop().episode_index == 1
            assert rec2.wait_saved(30)
    finally:
        rec2.close()
    assert [r["episode_index"] for r in rows_of(root)] == [0, 1]


def test_recorder_zero_frames_cancel_and_unsafe_names(tmp_path):
    col = make_config(tmp_path)
    rec = Recorder(col)
    try:
        assert rec.start().ok  # nothing is published
        r = rec.stop()
        assert r.ok and r.episode_index == -1 and r.frames == 0 and "nothing written" in r.message
        with Feed(rec) as feed:
            assert rec.start(dataset_name="place").ok
            feed.wait_published(50)
            c = rec.cancel()
            assert c.ok and c.frames_discarded > 0 and "nothing written" in c.message
        for bad in ("../evil", "/abs", "a/b", ".hidden", "unknown"):
            res = rec.start(dataset_name=bad)
            assert not res.ok and res.message.startswith("refused"), res
        assert not rec.stop().ok and not rec.cancel().ok
        assert rec.wait_saved(10)
    finally:
        rec.close()
    for name in ("pick", "place"):
        root = col.dataset_dir(name)
        assert rows_of(root) == []
        assert not list((root / "data").rglob("*.parquet")) if (root / "data").exists() else True
        assert not list((root / ".staging").glob("*")) if (root / ".staging").exists() else True
    assert not (tmp_path / "evil").exists()


def test_recorder_flags_missing_joint_and_nan(tmp_path):
    col = make_config(tmp_path)
    rec = Recorder(col)
    try:
        with Feed(rec, names=("a", "b")) as feed:  # joint "c" missing
            assert rec.start().ok
            feed.wait_published(50)
            assert rec.stop().ok
        with Feed(rec, nan_after=0, frozen=True) as feed:
            assert rec.start().ok
            feed.wait_published(130)
            assert rec.stop().ok
        assert rec.wait_saved(30)
    finally:
        rec.close()
    rows = rows_of(col.dataset_dir("pick"))
    codes = [{i["code"] for i in r["quality_issues"]} for r in rows]
    assert "vector_dimension_change" in codes[0] and rows[0]["quality"] == "red"
    assert {"non_finite", "frozen_camera"} <= codes[1]


def test_save_queue_full_refuses_start(tmp_path, monkeypatch):
    from eva_export.formats.lerobot_v21 import writer as writer_mod

    col = make_config(tmp_path, save_queue_size=1)
    gate = threading.Event()
    real_commit = writer_mod.DatasetWriter.commit

    def slow_commit(self, ep, row_extra=None):
        gate.wait(30)
        return real_commit(self, ep, row_extra)

    monkeypatch.setattr(writer_mod.DatasetWriter, "commit", slow_commit)
    rec = Recorder(col)
    try:
        with Feed(rec) as feed:
            assert rec.start().ok
            feed.wait_published(40)
            assert rec.stop().save_queue_depth == 1
            assert rec.status().state == "SAVING"
            refused = rec.start()
            assert not refused.ok and "save queue is full" in refused.message
            gate.set()
            assert rec.wait_saved(30)
            assert rec.start().ok
            feed.wait_published(30)
            assert rec.stop().episode_index == 1
            assert rec.wait_saved(30)
    finally:
        gate.set()
        rec.close()


def test_review_keeps_quality_and_lists(tmp_path):
    col = make_config(tmp_path, min_frames=1000)  # red: too_short
    rec = Recorder(col)
    try:
        with Feed(rec) as feed:
            assert rec.start().ok
            # 1 s (30 slots): a stray drop on a starved host stays under max_drop_ratio 0.1,
            # in 0.3 s (9 slots) one drop was 11 % (a second, unexpected red reason)
            feed.wait_published(100)
            rec.stop()
            assert rec.wait_saved(30)
        row = rec.review("", 0, "pass", "looks fine")
        assert row.qc_verdict == "pass" and row.note == "looks fine" and row.quality == "red"
        row = rec.review("pick", 0, "", None)
        assert row.qc_verdict == "pass" and row.note == "looks fine"
        row = rec.review("pick", 0, "clear", "")
        assert row.qc_verdict == "" and [i.code for i in row.quality_issues] == ["too_short"]
        with pytest.raises(DatasetError):
            rec.review("pick", 0, "maybe", None)
        _, rows = rec.list_episodes("")
        assert len(rows) == 1 and rows[0].quality == "red"
    finally:
        rec.close()


def test_relaunch_with_other_cameras_refuses_the_dataset_instead_of_dropping_videos(tmp_path):
    """A capture node relaunched with more cameras than the dataset on disk
    recovered it at start-up with the dataset's own features, then recorded into it: the extra
    cameras' frames were silently not encoded (red ``video_frame_count_mismatch``, 0 frames)."""
    col = make_config(tmp_path)
    rec = Recorder(col)
    try:
        with Feed(rec) as feed:
            assert rec.start().ok
            feed.wait_published(50)
            assert rec.stop().ok
            assert rec.wait_saved(30)
    finally:
        rec.close()
    root = col.dataset_dir("pick")
    before = (root / "meta" / "info.json").read_text()
    cams = [{"name": "front", "topic": "/f", "width": 64, "height": 48},
            {"name": "back", "topic": "/b", "width": 64, "height": 48}]
    col2 = parse_config({"collection": {
        "log_dir": str(tmp_path / "logs"), "fps": FPS, "robot_type": "sim",
        "tasks": [{"dataset_name": "pick", "task": "pick it"}],
        "streams": {"state": {"topic": "/s", "type": "JointState", "names": ["a", "b", "c"]},
                    "action": {"topic": "/a", "type": "Float64MultiArray", "names": ["a", "b", "c"]},
                    "cameras": cams},
        "capture": {"min_frames": 5}}}).collection
    rec2 = Recorder(col2)  # recovers "pick" at start-up (its own features) before any request
    try:
        assert rec2.list_episodes("pick")[1][0].episode_index == 0  # still readable and reviewable
        r = rec2.start()
        assert not r.ok and "features differ" in r.message and "observation.images.back" in r.message, r
        assert rec2.status().state == "IDLE"
    finally:
        rec2.close()
    assert [e["episode_index"] for e in rows_of(root)] == [0]
    assert (root / "meta" / "info.json").read_text() == before
    assert not (root / "videos" / "chunk-000" / "observation.images.back").exists()


def test_episode_writer_refuses_a_frame_whose_cameras_differ(tmp_path):
    """A camera the dataset does not have (or lacks) is an error, never a silently missing video."""
    col = make_config(tmp_path)
    dw = DatasetWriter.open(tmp_path / "ds", fps=FPS, features=capture_features(col), robot_type="sim")
    ep = dw.begin_episode("t")
    try:
        vals = {"observation.state": np.zeros(3), "action": np.zeros(3), "capture_time": np.zeros(1)}
        img = np.zeros((48, 64, 3), np.uint8)
        ep.add_frame(vals, {"observation.images.front": img})
        with pytest.raises(DatasetError, match="observation.images.back"):
            ep.add_frame(vals, {"observation.images.front": img, "observation.images.back": img})
        with pytest.raises(DatasetError, match="observation.images.front"):
            ep.add_frame(vals, {})
        assert ep.rows == 1
    finally:
        ep.abort()
