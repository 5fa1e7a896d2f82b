"""H.264 camera streams (``foxglove_msgs/msg/CompressedVideo``): every message decoded in the
order it arrived, because a P-frame needs the frames before it (the aligner may skip a message;
the decoder must not).

The decoded RGB is what the checks and the image statistics see, as for any camera; the access
unit travels with it, so the episode writer can copy the source's bitstream into the episode MP4
instead of encoding it again (formats/lerobot_v21/video_copy.py; the rule for when it may:
``StreamState.copy_packet``).

Supported: format "h264", Annex B, one access unit per message, no B-frames (each message decodes
to exactly one frame). A message that does not decode becomes an undecodable frame (the episode's
checks report it, nothing is dropped silently); a format other than "h264" is refused.
"""

from __future__ import annotations

from typing import Any

import av
import numpy as np

from ..formats.common.video import RgbConverter
from .intake import RawImage

H264 = "h264"
_EMPTY = np.zeros(0, np.uint8)


class VideoFeed:
    """The decoder of one H.264 stream, fed every message in arrival order."""

    def __init__(self) -> None:
        self._ctx: Any = None
        self._rgb = RgbConverter()
        self.count = 0  # messages fed so far (the next frame_no)

    def take(self, raw: RawImage) -> RawImage:
        """The message decoded: an rgb8 RawImage carrying its packet, or an undecodable one.

        Raises ValueError for a format other than H.264 (a stream this path cannot read at all).
        """
        if raw.encoding.strip().lower() != H264:
            raise ValueError(f"CompressedVideo format {raw.encoding!r} is not supported (only 'h264': Annex B, "
                             f"one frame per message)")
        no = self.count
        self.count += 1
        data = raw.data.tobytes()
        if self._ctx is None:
            self._ctx = av.CodecContext.create(H264, "r")
            self._ctx.thread_count = 1  # frame threads would delay output: one frame out per packet in
            # a damaged frame is an error, not a silently concealed picture copied into the dataset
            self._ctx.options = {"err_detect": "explode"}
        try:
            frames = self._ctx.decode(av.Packet(data))
        except (av.FFmpegError, ValueError) as exc:
            return _undecodable(no, f"does not decode ({exc})")
        if len(frames) != 1:
            return _undecodable(no, f"decodes to {len(frames)} frames (one per message expected: no B-frames, "
                                    f"and the stream must start at a keyframe)")
        f = frames[0]
        rgb = self._rgb(f)
        h, w = rgb.shape[:2]
        return RawImage(rgb.reshape(-1), h, w, "rgb8", w * 3, packet=data, key=bool(f.key_frame), frame_no=no)


def _undecodable(no: int, why: str) -> RawImage:
    # an encoding the image decoder refuses: the emit path reports it as an undecodable frame
    return RawImage(_EMPTY, encoding=f"h264 frame {no} {why}", frame_no=no)
