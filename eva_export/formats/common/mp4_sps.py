"""The picture size an H.264 avcC's sequence parameter set states (mp4_index's SPS check).

FFmpeg reports a stream's size from the decoder's SPS, not from the MP4 sample entry, so the
box reader (mp4_index) answers only when both agree. Only the plain shape is read: one SPS,
4-byte NAL lengths, 8-bit 4:2:0, no scaling matrices, cropping only at the right and bottom;
anything else raises ValueError (the caller then takes PyAV's path).
"""

from __future__ import annotations

from functools import lru_cache

_HIGH_PROFILES = frozenset((100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135))


class _Bits:
    """Exp-Golomb reading of an RBSP (emulation prevention bytes removed)."""

    def __init__(self, nal: bytes) -> None:
        self.data = nal.replace(b"\x00\x00\x03", b"\x00\x00")
        self.pos = 0

    def u(self, n: int) -> int:
        v = 0
        for _ in range(n):
            byte = self.pos >> 3
            if byte >= len(self.data):
                raise ValueError("SPS cut")
            v = (v << 1) | ((self.data[byte] >> (7 - (self.pos & 7))) & 1)
            self.pos += 1
        return v

    def ue(self) -> int:
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
            if zeros > 31:
                raise ValueError("ue too long")
        return (1 << zeros) - 1 + self.u(zeros)

    def se(self) -> int:
        k = self.ue()
        return (k + 1) // 2 if k & 1 else -(k // 2)


@lru_cache(maxsize=64)  # one encoder's files share one avcC: its bits are read once, not per file
def avcc_size(avcc: bytes) -> tuple[int, int]:
    """(width, height) of the avcC payload's one SPS; ValueError outside the plain shape."""
    return _sps_size(_avcc_sps(avcc))


@lru_cache(maxsize=64)
def avcc_pix_fmt(avcc: bytes) -> str | None:
    """The pixel format FFmpeg's H.264 decoder reports for the avcC's SPS (plain shape: 8-bit
    4:2:0): "yuv420p" when the SPS states no video signal type, so neither a full range nor a
    matrix; None when it states one (a full-range stream is reported as yuvj420p: PyAV decides).
    ValueError outside the plain shape."""
    b = _avcc_sps(avcc)
    _sps_size(b)
    if not b.u(1):  # vui_parameters_present_flag
        return "yuv420p"
    if b.u(1) and b.u(8) == 255:  # aspect_ratio_info_present_flag; Extended_SAR
        b.u(32)
    if b.u(1):  # overscan_info_present_flag
        b.u(1)
    return None if b.u(1) else "yuv420p"  # video_signal_type_present_flag


def _avcc_sps(avcc: bytes) -> _Bits:
    """The avcC payload's one SPS, read past its NAL header."""
    if len(avcc) < 8 or avcc[0] != 1 or avcc[4] & 3 != 3 or avcc[5] & 0x1F != 1:
        raise ValueError("avcC header")
    n = int.from_bytes(avcc[6:8], "big")
    sps = avcc[8:8 + n]
    pos = 8 + n
    if len(sps) != n or n < 4 or sps[0] & 0x9F != 0x07 or pos >= len(avcc):
        raise ValueError("avcC SPS")
    pps_count = avcc[pos]
    pos += 1
    if pps_count != 1:
        raise ValueError("avcC PPS count")
    m = int.from_bytes(avcc[pos:pos + 2], "big")
    pps = avcc[pos + 2:pos + 2 + m]
    if len(pps) != m or m < 2 or pps[0] & 0x9F != 0x08 or pos + 2 + m != len(avcc):
        raise ValueError("avcC PPS")
    return _Bits(sps[1:])


def _sps_size(b: _Bits) -> tuple[int, int]:
    profile = b.u(8)
    b.u(16)  # constraint flags, level
    if b.ue() != 0:
        raise ValueError("SPS id")
    if profile in _HIGH_PROFILES:
        if b.ue() != 1 or b.ue() != 0 or b.ue() != 0:  # 4:2:0, 8-bit luma and chroma
            raise ValueError("SPS format")
        b.u(1)
        if b.u(1):
            raise ValueError("SPS scaling matrix")
    if b.ue() > 12:
        raise ValueError("SPS frame num")
    poc = b.ue()
    if poc == 0:
        if b.ue() > 12:
            raise ValueError("SPS poc lsb")
    elif poc == 1:
        b.u(1)
        b.se()
        b.se()
        if b.ue() > 255:
            raise ValueError("SPS poc cycle")
        raise ValueError("SPS poc type 1")  # rare: not read further
    elif poc != 2:
        raise ValueError("SPS poc type")
    if b.ue() > 16:
        raise ValueError("SPS refs")
    b.u(1)
    mbs_w, map_h = b.ue() + 1, b.ue() + 1
    frame_mbs_only = b.u(1)
    if not frame_mbs_only:
        raise ValueError("SPS fields")
    b.u(1)  # direct_8x8_inference
    crop = (b.ue(), b.ue(), b.ue(), b.ue()) if b.u(1) else (0, 0, 0, 0)
    left, right, top, bottom = crop
    width, height = mbs_w * 16, map_h * 16
    if left or top or not 0 <= 2 * right < 16 or not 0 <= 2 * bottom < 16 or width > 8192 or height > 8192:
        raise ValueError("SPS cropping")
    return width - 2 * right, height - 2 * bottom
