"""The dataset features a collection config records (config -> LeRobot v2.1 features)."""

from __future__ import annotations

from ..config import CaptureSettings, CollectionConfig
from ..formats.common.records import Feature
from ..formats.common.video import VideoSettings
from ..formats.lerobot_v21.writer import make_features

STATE = "observation.state"
ACTION = "action"
EE_POSE = "observation.ee_pose"
CAPTURE_TIME = "capture_time"
EE_POSE_NAMES = ("x", "y", "z", "qx", "qy", "qz", "qw")

#: PyAV encoder name -> codec name stored in info.json (video.codec).
CODEC_NAMES = {"libx264": "h264", "libx265": "hevc", "libsvtav1": "av1", "libaom-av1": "av1",
               "libvpx-vp9": "vp9", "ffv1": "ffv1"}


def video_settings(capture: CaptureSettings) -> VideoSettings:
    return VideoSettings(codec=capture.video_codec, preset=capture.video_preset, crf=capture.video_crf)


def capture_features(col: CollectionConfig) -> dict[str, Feature]:
    """observation.state, action, observation.ee_pose (when configured), capture_time, one video
    feature per camera, then LeRobot's five default columns."""
    feats: dict[str, Feature] = {}
    if col.state is not None:
        feats[STATE] = Feature("float32", (len(col.state.names),), names=list(col.state.names))
    if col.action is not None:
        feats[ACTION] = Feature("float32", (len(col.action.names),), names=list(col.action.names))
    if col.ee_pose is not None:
        feats[EE_POSE] = Feature("float32", (7,), names=list(EE_POSE_NAMES))
    feats[CAPTURE_TIME] = Feature("float64", (1,), names=None)
    codec = CODEC_NAMES.get(col.capture.video_codec, col.capture.video_codec)
    for cam in col.cameras:
        feats[cam.key] = Feature.video(cam.height, cam.width, col.fps, codec=codec)
    return make_features(feats)
