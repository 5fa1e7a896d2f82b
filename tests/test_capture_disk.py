"""Capture on a full disk (a real tmpfs filled to a known free amount): START is refused below
collection.capture.min_free_mb, STOP says when the save cannot be kept, and the status and
list_episodes agree."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from diskfull import fill, tmpfs, unfill
from test_capture_core import Feed, make_config

from eva_export.capture.recorder import Recorder


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "fs", 16) as root:
        yield root


def test_start_is_refused_below_the_free_space_floor(fs: Path) -> None:
    col = make_config(fs, min_free_mb=8)
    rec = Recorder(col)
    try:
        fill(fs, leave=4 << 20)
        r = rec.start()
        assert not r.ok and "min_free_mb" in r.message and "4.0 MiB free" in r.message, r.message
        assert rec.status().state == "IDLE"
        unfill(fs)
        assert rec.start().ok
        assert rec.cancel().ok
    finally:
        rec.close()


def _wait_frames(rec: Recorder, n: int = 5, timeout: float = 60.0) -> None:
    """Until the episode holds ``n`` rows (a loaded machine takes longer to start the grid)."""
    end = time.monotonic() + timeout
    while rec.status().frames < n:
        assert time.monotonic() < end, "no frames recorded"
        time.sleep(0.02)


def test_stop_reports_a_save_that_cannot_be_kept(fs: Path) -> None:
    col = make_config(fs, min_free_mb=1)
    rec = Recorder(col)
    try:
        with Feed(rec):
            assert rec.start().ok
            _wait_frames(rec)
            fill(fs, leave=0)
            stop = rec.stop()
            assert not stop.ok and "saving failed" in stop.message and "free" in stop.message, stop.message
            assert rec.wait_saved(30)
            st = rec.status()
            assert st.last_episode_quality == "failed" and st.last_message == stop.message
            _root, rows = rec.list_episodes()
            assert rows == [] and st.last_episode_index == -1  # the status and the dataset agree
            unfill(fs)
            assert rec.start().ok
            _wait_frames(rec)
            again = rec.stop()
            assert again.ok and again.episode_index == 0, again.message
            assert rec.wait_saved(30)
        _, rows = rec.list_episodes()
        assert [r.episode_index for r in rows] == [0] and rec.status().last_episode_index == 0
    finally:
        rec.close()
