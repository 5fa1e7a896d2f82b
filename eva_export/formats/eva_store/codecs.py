"""Per-row image codecs of the store: JPEG (simplejpeg), PNG (PyAV's png codec) and raw.

Each camera frame is one MessagePack record ``{"codec", "shape", "data"}``: self-describing, so a
reader needs nothing but the record to decode it, and ``raw`` rows can be rebuilt without the
manifest. No codec state is kept between rows, so a forked worker shares nothing.
"""

from __future__ import annotations

from typing import Any, Literal, cast

import msgpack
import numpy as np
from numpy.typing import NDArray

CODECS = ("jpeg", "png", "raw")


def _png_context(mode: Literal["r", "w"], width: int = 0, height: int = 0) -> Any:
    """A fresh PyAV png codec context: a reused decoder was seen returning wrong pixels after a
    few frames, and creating one costs microseconds next to the decode itself."""
    import av  # only PNG needs PyAV at read time

    cc = av.CodecContext.create("png", mode)
    if mode == "w":
        cc.width, cc.height, cc.pix_fmt = width, height, "rgb24"
    return cc


def encode_image(frame: NDArray[Any], codec: str, quality: int = 90) -> bytes:
    """One HxWx3 uint8 frame as the bytes of ``codec``."""
    frame = np.ascontiguousarray(frame)
    if codec == "jpeg":
        import simplejpeg

        return bytes(simplejpeg.encode_jpeg(frame, quality=quality, colorspace="RGB", colorsubsampling="420"))
    if codec == "png":
        import av

        cc = _png_context("w", frame.shape[1], frame.shape[0])
        packets = cc.encode(av.VideoFrame.from_ndarray(frame, format="rgb24"))
        return b"".join(bytes(p) for p in packets)
    if codec == "raw":
        return frame.tobytes()
    raise ValueError(f"image codec {codec!r}: choose one of {CODECS}")


def decode_image(data: bytes, codec: str, shape: tuple[int, ...]) -> NDArray[Any]:
    """Bytes of one record back to an HxWx3 uint8 frame; ValueError when they do not decode."""
    if codec == "jpeg":
        import simplejpeg

        out = simplejpeg.decode_jpeg(data, colorspace="RGB")
    elif codec == "png":
        import av

        frames = _png_context("r").decode(av.Packet(data))
        if not frames:
            raise ValueError("png record decoded to no frame")
        out = frames[0].to_ndarray(format="rgb24")
    elif codec == "raw":
        out = np.frombuffer(data, np.uint8)
        if out.size != int(np.prod(shape)):
            raise ValueError(f"raw record holds {out.size} bytes, shape {tuple(shape)} needs {int(np.prod(shape))}")
        out = out.reshape(shape)
    else:
        raise ValueError(f"unknown image codec {codec!r}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"record decoded to shape {tuple(out.shape)}, its header says {tuple(shape)}")
    return cast("NDArray[Any]", out)  # simplejpeg and PyAV are untyped


def sniff_codec(data: bytes) -> str:
    """The codec of already-encoded image bytes (LeRobot's Parquet image columns hold PNG)."""
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:2] == b"\xff\xd8":
        return "jpeg"
    raise ValueError("image bytes are neither PNG nor JPEG")


def pack_record(codec: str, shape: tuple[int, ...], data: bytes) -> bytes:
    return cast(bytes, msgpack.packb({"codec": codec, "shape": list(shape), "data": data}, use_bin_type=True))


def unpack_record(buf: bytes) -> tuple[str, tuple[int, ...], bytes]:
    """(codec, shape, data) of one record; ValueError on anything that is not such a record."""
    try:
        rec = msgpack.unpackb(buf, raw=False)
        return str(rec["codec"]), tuple(int(s) for s in rec["shape"]), rec["data"]
    except (msgpack.exceptions.ExtraData, msgpack.exceptions.UnpackException, ValueError, KeyError,
            TypeError) as exc:
        raise ValueError(f"not a frame record ({type(exc).__name__}: {exc})") from exc
