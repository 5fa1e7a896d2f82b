"""Capture engine (no ROS imports): grid alignment, quality checks, episode recording.

``Recorder`` is driven by the capture node (eva_export.nodes.capture_node); everything here
is testable without ROS.
"""

from .align import GridAligner, Pick, Sample, Slot, align_offline
from .checks import EpisodeChecker, QualityResult
from .episode import EpisodeRun
from .features import capture_features
from .intake import RawImage, RawVector, StreamSpec, streams_from_config
from .recorder import Recorder
from .stream import StreamState

__all__ = ["EpisodeChecker", "EpisodeRun", "GridAligner", "Pick", "QualityResult", "RawImage", "RawVector", "Recorder",
           "Sample", "Slot", "StreamSpec", "StreamState", "align_offline", "capture_features", "streams_from_config"]
