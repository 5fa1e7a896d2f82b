"""Where each sample of a plain MP4 sits in its mdat (stsc, stco, stsz) and what its NAL units
are, checked as a demuxer and a joiner need them (mp4_index's shape). A file of a few samples
is walked in Python; a longer one in numpy passes, its counts checked before anything is
expanded (a table may claim billions of samples)."""

from __future__ import annotations

import numpy as np

from .mp4_boxes import Box, Unusual, u32

FEW_SAMPLES = 64  # up to this many samples a file is walked in Python (numpy's per-call cost is more)
FORBIDDEN_NALS = frozenset((7, 8, 13, 15))  # parameter sets: FFmpeg's size would follow them


def sample_spans(chunks: list[int], runs: list[tuple[int, int, int]], sizes: list[int], mdat: Box
                 ) -> list[tuple[int, int]]:
    """Each sample's (offset, size): the chunks' samples back to back from each chunk's offset,
    every one inside the mdat payload; Unusual otherwise."""
    if len(sizes) <= FEW_SAMPLES:
        return _spans_loop(chunks, runs, sizes, mdat)
    return _spans_vector(chunks, runs, sizes, mdat)


def check_nals(data: bytes, spans: list[tuple[int, int]]) -> None:
    """Every sample's NAL units tile it, none a parameter set; Unusual otherwise."""
    for i in range(len(spans)) if len(spans) <= FEW_SAMPLES else _multi_nal_samples(data, spans):
        _walk_nals(data, spans[i][0], spans[i][0] + spans[i][1])


def _spans_loop(chunks: list[int], runs: list[tuple[int, int, int]], sizes: list[int], mdat: Box
                ) -> list[tuple[int, int]]:
    """``sample_spans`` one sample at a time."""
    sample = 0
    spans: list[tuple[int, int]] = []
    for r, (chunk, spc, _sdi) in enumerate(runs):
        last = runs[r + 1][0] - 1 if r + 1 < len(runs) else len(chunks)
        for c in range(chunk - 1, last):
            pos = chunks[c]
            for _ in range(spc):
                if sample >= len(sizes) or pos < mdat[1] or pos + sizes[sample] > mdat[2]:
                    raise Unusual("sample place")
                spans.append((pos, sizes[sample]))
                pos += sizes[sample]
                sample += 1
    if sample != len(sizes):
        raise Unusual("samples mapped")
    return spans


def _spans_vector(chunks: list[int], runs: list[tuple[int, int, int]], sizes: list[int], mdat: Box
                  ) -> list[tuple[int, int]]:
    """``sample_spans`` in one numpy pass, the counts checked first."""
    per_run = [(runs[r + 1][0] if r + 1 < len(runs) else len(chunks) + 1) - first for r, (first, _, _) in enumerate(runs)]
    if sum(n * spc for n, (_, spc, _) in zip(per_run, runs, strict=True)) != len(sizes):
        raise Unusual("samples mapped")
    if max(chunks) > mdat[2]:  # every chunk holds a sample (stsc: none empty)
        raise Unusual("sample place")
    spc = np.repeat(np.array([r[1] for r in runs], dtype=np.int64), per_run)  # samples of each chunk
    chunk_of = np.repeat(np.arange(len(chunks)), spc)
    size = np.array(sizes, dtype=np.int64)
    before = np.cumsum(size) - size  # bytes of the samples ahead of each one
    first = np.cumsum(spc) - spc  # each chunk's first sample
    pos = np.array(chunks, dtype=np.int64)[chunk_of] + before - before[first][chunk_of]
    if pos.min() < mdat[1] or (pos + size).max() > mdat[2]:
        raise Unusual("sample place")
    return list(zip(pos.tolist(), sizes, strict=True))


def _multi_nal_samples(data: bytes, spans: list[tuple[int, int]]) -> list[int]:
    """The samples ``_check_nals`` must walk: all but those holding one allowed NAL unit (a
    frame's slice, most of them), which one numpy pass checks."""
    pos = np.fromiter((p for p, _ in spans), dtype=np.int64, count=len(spans))
    size = np.fromiter((n for _, n in spans), dtype=np.int64, count=len(spans))
    buf = np.frombuffer(data, dtype=np.uint8)
    at = np.where(size >= 5, pos, 0)  # a shorter sample goes to the loop, which refuses it
    length = (buf[at].astype(np.int64) << 24) | (buf[at + 1].astype(np.int64) << 16) | \
        (buf[at + 2].astype(np.int64) << 8) | buf[at + 3]
    head = buf[at + 4]
    one = (size >= 5) & (length > 0) & (length + 4 == size) & (head & 0x80 == 0) & \
        ~np.isin(head & 0x1F, sorted(FORBIDDEN_NALS))
    return [int(i) for i in np.flatnonzero(~one)]


def _walk_nals(data: bytes, pos: int, end: int) -> None:
    while pos < end:
        if end - pos < 5:
            raise Unusual("NAL cut")
        n = u32(data, pos)
        head = data[pos + 4]
        if n == 0 or pos + 4 + n > end or head & 0x80 or head & 0x1F in FORBIDDEN_NALS:
            raise Unusual("NAL")
        pos += 4 + n
