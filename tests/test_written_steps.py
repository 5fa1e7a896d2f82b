"""The exporters' shared background-write thread (``written.StepThread``): a step that fails
(ENOSPC on its Nth call, counted, so the fault is reached for sure) is raised in the caller once,
no step runs after it, and both raw-frame writers turn it into a StorageError naming the
episode file with nothing of that file left behind."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from diskfull import direct_supported
from dsfactory import Ep, make_subset

from eva_export.errors import StorageError
from eva_export.formats.common import written
from eva_export.formats.common.written import StepThread
from eva_export.formats.hdf5.exporter import Hdf5Exporter
from eva_export.formats.mcap_eva import chunks as mcap_chunks
from eva_export.formats.mcap_eva.exporter import McapExporter


def _enospc_on_call(n: int, inner: Callable[..., Any], calls: list[int]) -> Callable[..., Any]:
    """``inner``, except that its ``n``-th call raises ENOSPC instead of running."""

    def step(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == n:
            raise OSError(errno.ENOSPC, "No space left on device")
        return inner(*args)

    return step


def test_a_failed_step_is_raised_once_and_no_later_step_runs() -> None:
    ran: list[int] = []
    calls: list[int] = []
    steps: StepThread[int] = StepThread(_enospc_on_call(3, ran.append, calls), "test-steps", depth=2)
    raised: list[OSError] = []
    try:
        for i in range(20):
            steps.put(i)
        steps.drain()
    except OSError as exc:
        raised.append(exc)
    steps.drain()  # raised once only: the caller has it
    steps.close()
    assert [e.errno for e in raised] == [errno.ENOSPC]
    assert ran == [0, 1], "a step ran after the failed one, or one before it was lost"
    assert len(calls) == 3
    assert not any(t.name == "test-steps" for t in threading.enumerate()), "close left the thread running"


def test_steps_run_in_order_and_drain_waits_for_all() -> None:
    ran: list[int] = []
    steps: StepThread[int] = StepThread(ran.append, "test-order", depth=3)
    try:
        for i in range(100):
            steps.put(i)
        steps.drain()
        assert ran == list(range(100))
    finally:
        steps.close()
    steps.close()  # a second close is harmless (the writers close in finally after finish)


def _export_fails(exporter: Any, tmp_path: Path) -> StorageError:
    src = make_subset(tmp_path / "native", [Ep(frames=40), Ep(frames=40)], cameras=2, width=64, height=48)
    out = tmp_path / "out"
    with pytest.raises(StorageError) as info:
        exporter.export(src, out)
    assert not list(out.rglob("*.partial")), "the partial episode file was left"
    return info.value


def test_mcap_output_step_failing_names_the_file_and_leaves_nothing(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(mcap_chunks._FileBytes, "step",
                        _enospc_on_call(5, mcap_chunks._FileBytes.step, calls))
    err = _export_fails(McapExporter(chunk_size=16 * 1024), tmp_path)
    assert err.errno == errno.ENOSPC
    assert "episode_000000.mcap" in str(err) and "episode 0" in str(err), str(err)
    assert not list((tmp_path / "out").rglob("*.mcap")), "an episode file was published"


def test_hdf5_frame_write_failing_names_the_file_and_leaves_nothing(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    # the frame writes go through written.DirectWrites (h5py's own writes do not use pwritev_all)
    monkeypatch.setattr(written, "pwritev_all", _enospc_on_call(2, written.pwritev_all, calls))
    err = _export_fails(Hdf5Exporter(), tmp_path)
    assert err.errno == errno.ENOSPC
    assert "episode_000000.hdf5" in str(err) and "episode 0" in str(err), str(err)
    assert not list((tmp_path / "out").rglob("*.hdf5")), "an episode file was published"
    assert len(calls) == 2, "frame writes went on after the failed one"


def test_pwritev_all_writes_more_buffers_than_one_call_takes(tmp_path: Path) -> None:
    from eva_export.formats.common.written import pwritev_all

    parts = [bytes([i % 251]) * (1 + i % 7) for i in range(3000)]  # past Linux's 1024 per call
    path = tmp_path / "f.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.pwrite(fd, b"head", 0)
        pwritev_all(fd, parts, 4)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"head" + b"".join(parts)


def _appended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refuse_after: int | None) -> tuple[bytes, list[bool]]:
    """Odd-sized pieces through a DirectAppender with 64 KiB blocks; every write recorded as
    direct or not; direct writes refused (EINVAL) after ``refuse_after`` of them, if given."""
    import fcntl

    real, kinds = written.pwritev_all, []

    def recording(fd: int, views: list[Any], offset: int) -> None:
        direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        if direct and refuse_after is not None and kinds.count(True) >= refuse_after:
            raise OSError(errno.EINVAL, "refused")
        kinds.append(direct)
        real(fd, views, offset)

    monkeypatch.setattr(written, "pwritev_all", recording)
    monkeypatch.setattr(written.DirectAppender, "BLOCK", 64 << 10)
    rng = __import__("random").Random(7)
    pieces = [os.urandom(rng.choice([1, 100, 4095, 70_000, 200_001])) for _ in range(40)]
    path = tmp_path / "f.bin"
    with open(path, "wb", buffering=0) as fh:
        out = written.DirectAppender(fh.fileno(), str(path))
        for i in range(0, len(pieces), 3):
            out.write(pieces[i:i + 3])
        out.finish()
        out.close()
    assert path.read_bytes() == b"".join(pieces)
    return path.read_bytes(), kinds


@pytest.mark.parametrize("refuse_after", [None, 0, 3])
def test_direct_appender_writes_exactly_the_bytes_direct_or_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     refuse_after: int | None) -> None:
    """Whole blocks O_DIRECT, the last part block buffered; once a direct write is refused
    (EINVAL: a file system that takes no such alignment) the rest go buffered. The file holds
    exactly the bytes given, in order, either way."""
    _data, kinds = _appended(tmp_path, monkeypatch, refuse_after)
    if not direct_supported(tmp_path):
        assert not any(kinds)
        return
    if refuse_after is None:
        assert kinds.count(True) > 1 and kinds[-1] is False and kinds.count(False) == 1  # only the last part block buffered
    else:
        assert kinds[:refuse_after] == [True] * refuse_after and len(kinds) > refuse_after
        assert not any(kinds[refuse_after:])
