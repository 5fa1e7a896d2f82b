"""video_facts: a camera file demuxed once per process, reused for its hard links, never when changed."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from dsfactory import Ep, make_dataset

from eva_export.errors import DatasetError
from eva_export.formats.common import video_facts
from eva_export.formats.common.meta import read_meta
from eva_export.formats.common.video import count_frames
from eva_export.formats.lerobot_v21.validate import validate_source

HOUR_NS = 3600 * 10**9


def age(root: Path) -> None:
    """Every file an hour old: past the racy margin, as a source recorded earlier is."""
    old = os.stat(root).st_mtime_ns - HOUR_NS
    for p in root.rglob("*"):
        if p.is_file():
            os.utime(p, ns=(old, old))


@pytest.fixture()
def source(tmp_path: Path) -> Iterator[Path]:
    video_facts.forget_all()
    root = make_dataset(tmp_path / "raw", [Ep(frames=5), Ep(frames=7)])
    yield root
    video_facts.forget_all()


def videos(root: Path) -> list[Path]:
    meta = read_meta(root)
    return [meta.video_path(k, e.episode_index) for e in meta.episodes for k in meta.info.video_keys]


def test_an_old_file_is_remembered_and_its_hard_link_reuses_it(source: Path, tmp_path: Path) -> None:
    age(source)
    validate_source(source)
    first = videos(source)[0]
    facts = video_facts.lookup(video_facts.file_key(first))
    assert facts is not None and facts.frames == 5 and facts.timing == ()
    link = tmp_path / "link.mp4"
    os.link(first, link)
    assert video_facts.lookup(video_facts.file_key(link)) == facts  # same inode, same facts
    assert count_frames(link) == 5


def test_a_fresh_file_is_never_remembered(source: Path) -> None:
    validate_source(source)  # written just now: inside the racy margin
    assert all(video_facts.lookup(video_facts.file_key(p)) is None for p in videos(source))
    assert video_facts.file_key(videos(source)[0]) is None


def test_a_replaced_file_is_demuxed_again(source: Path) -> None:
    age(source)
    validate_source(source)
    vids = videos(source)
    target, other = vids[0], vids[-1]  # episode 0's camera replaced by episode 1's (7 frames, not 5)
    st = os.stat(target)
    tmp = target.with_name("swap.tmp")
    shutil.copyfile(other, tmp)
    os.replace(tmp, target)  # a new inode
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with the old mtime
    with pytest.raises(DatasetError, match=r"episode 0: .*has 7 frames but .* has 5 rows"):
        validate_source(source)


def test_a_truncated_file_with_the_old_mtime_is_refused(source: Path) -> None:
    age(source)
    validate_source(source)
    target = videos(source)[1]
    st = os.stat(target)
    with open(target, "r+b") as fh:  # same inode, shorter: the size is part of the identity
        fh.truncate(st.st_size // 2)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(DatasetError, match="not a complete MP4"):
        validate_source(source)
