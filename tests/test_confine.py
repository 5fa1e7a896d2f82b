"""The confinement helper (eva_export/confine.py): property tests with hypothesis, plus the
job store and config paths that use it. No ROS here; the nodes are in test_hostile_requests.py."""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eva_export import confine
from eva_export.config import parse_config
from eva_export.errors import UnsafeNameError
from eva_export.fsutil import FILE_MODE, atomic_write_json
from eva_export.jobs import Job, JobStore

# Text a hostile caller might send: any unicode (NUL, separators, dots and long runs included).
HOSTILE = st.one_of(
    st.text(max_size=300),
    st.text(alphabet="./\\\x00a-_ é", max_size=40),
    st.builds(lambda a, n: a * n, st.sampled_from(["a", ".", "../", "é", "x/"]), st.integers(0, 400)),
)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(name=HOSTILE)
def test_names_are_single_short_components(tmp_path: Path, name: str) -> None:
    """An accepted name is one ASCII component under 100 chars that can be created in its root."""
    try:
        confine.check_name(name)
    except UnsafeNameError as exc:
        assert len(str(exc)) < 400  # the reason is short even for a 10 KB name
        return
    assert 0 < len(name) <= confine.NAME_MAX and name.isascii()
    assert "/" not in name and "\x00" not in name and not name.startswith(".")
    path = tmp_path / name
    assert path.parent == tmp_path and confine.is_inside(tmp_path, path)
    path.mkdir(exist_ok=True)  # never ENAMETOOLONG or EINVAL


@SETTINGS
@given(job_id=HOSTILE)
def test_job_ids_never_leave_the_jobs_dir(tmp_path: Path, job_id: str) -> None:
    jobs = tmp_path / "jobs"
    store = JobStore(jobs)
    try:
        confine.check_job_id(job_id)
    except UnsafeNameError:
        assert store.get(job_id) is None  # invalid ids are "no such job", never an exception
        return
    assert len(job_id) <= confine.JOB_ID_MAX
    assert store.path(job_id).parent == jobs
    assert store.get(job_id) is None


def test_generated_job_ids_pass() -> None:
    for kind in ("export", "upload"):
        confine.check_job_id(Job.new(kind, "/x", "hdf5").job_id)


def test_job_store_reads_only_job_records(tmp_path: Path) -> None:
    """Traversal, a foreign JSON named by a job id, a record of another id, a symlink: no job."""
    jobs = tmp_path / "jobs"
    store = JobStore(jobs)
    secret = tmp_path / "secret.json"
    job = Job.new("export", "/src", "hdf5")
    atomic_write_json(secret, job.to_dict() | {"job_id": "secret"})
    atomic_write_json(jobs / "foreign.json", {"hello": "world"})
    atomic_write_json(jobs / "alist.json", [1, 2, 3])
    atomic_write_json(jobs / "other-id.json", job.to_dict())  # a record of another job
    (jobs / "linked.json").symlink_to(secret)
    (jobs / "garbage.json").write_bytes(b"\xff\x00{")
    for bad in ("../secret", "foreign", "alist", "other-id", "linked", "garbage", "x" * 300, "a\x00b", ""):
        assert store.get(bad) is None, bad
    store.save(job)
    assert store.get(job.job_id) == job
    assert {j.job_id for j in store.all()} >= {job.job_id}


@SETTINGS
@given(note=st.text(max_size=5000) | st.builds(lambda n: "é" * n, st.integers(2000, 2100)))
def test_notes_are_capped_at_4_kib(note: str) -> None:
    size = len(note.encode("utf-8", errors="surrogatepass"))
    if size <= confine.NOTE_MAX_BYTES:
        assert confine.check_note(note) == note
    else:
        with pytest.raises(UnsafeNameError, match="4 KiB"):
            confine.check_note(note)


TEMPLATE_PARTS = ["data", "videos", "/", "..", ".", "chunk-", "{episode_chunk:03d}", "{episode_index:06d}",
                  "{video_key}", "{chunk_index:03d}", "{file_index:03d}", "episode_", ".parquet", ".mp4",
                  "{episode_index!r}", "{0}", "{}", "{episode_index.__class__}", "~", "\x00", "é", "//", "\\"]


@SETTINGS
@given(parts=st.lists(st.sampled_from(TEMPLATE_PARTS), max_size=12), kind=st.sampled_from(["data", "video"]),
       ep=st.integers(0, 10**7), key=st.sampled_from(["observation.images.front", "cam0"]))
def test_templates_expand_inside_the_dataset(tmp_path: Path, parts: list[str], kind: str, ep: int,
                                             key: str) -> None:
    template = "".join(parts)
    try:
        confine.check_template(template, kind)
    except UnsafeNameError:
        return
    rel = template.format(episode_chunk=ep // 1000, episode_index=ep, video_key=key, chunk_index=ep // 1000,
                          file_index=ep)
    assert not os.path.isabs(rel) and ".." not in rel.split("/") and "" not in rel.split("/")
    assert confine.is_inside(tmp_path, tmp_path / rel)


@pytest.mark.parametrize("template,kind", [
    ("data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet", "data"),
    ("videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4", "video"),
    ("data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet", "data"),
    ("videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4", "video"),
    ("data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.hdf5", "data"),
])
def test_lerobot_template_shapes_pass(template: str, kind: str) -> None:
    assert confine.check_template(template, kind) == template


@pytest.mark.parametrize("template", [
    "/etc/data/{episode_index}.parquet", "data/../../{episode_index}.parquet", "data/{episode_chunk}.parquet",
    "data//{episode_index}.parquet", "data/{episode_index!r}.parquet", "data/{episode_index}.sh",
    "videos/{episode_index}.parquet", "data/{episode_index}/{video_key}.parquet", "data/{0}.parquet", "",
    "data/{episode_index:>300}.parquet", "data/{episode_index.real}.parquet",
])
def test_hostile_data_templates_refused(template: str) -> None:
    with pytest.raises(UnsafeNameError):
        confine.check_template(template, "data")


def test_confined_follows_symlinks(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    (root / "data").mkdir(parents=True)
    outside = tmp_path / "outside.parquet"
    outside.write_bytes(b"x")
    (root / "data" / "in.parquet").write_bytes(b"x")
    (root / "data" / "out.parquet").symlink_to(outside)
    (root / "data" / "in_link.parquet").symlink_to(root / "data" / "in.parquet")
    assert confine.confined(root, "data/in.parquet") == root / "data/in.parquet"
    assert confine.confined(root, "data/in_link.parquet")  # a link that stays inside is fine
    for rel in ("data/out.parquet", "../outside.parquet", str(outside), "data/../../outside.parquet"):
        with pytest.raises(UnsafeNameError, match="outside"):
            confine.confined(root, rel)
    # The root itself may be reached through a symlink: checked after resolving both.
    (tmp_path / "alias").symlink_to(root)
    assert confine.confined(tmp_path / "alias", "data/in.parquet")


def test_confined_paths_not_written_yet(tmp_path: Path) -> None:
    """A file about to be written (missing, maybe in missing directories) passes without a
    realpath when every existing component is a plain directory; under a symlinked directory
    that leaves the root it is still refused, in a checked_dirs block too."""
    root = tmp_path / "ds"
    (root / "data").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "data" / "out").symlink_to(tmp_path / "elsewhere")
    (root / "data" / "dangling").symlink_to(tmp_path / "nowhere")
    with confine.checked_dirs():
        for _ in range(2):
            assert confine.confined(root, "data/new.parquet") == root / "data/new.parquet"
            assert confine.confined(root, "data/chunk-001/new.parquet") == root / "data/chunk-001/new.parquet"
            for rel in ("data/out/new.parquet", "data/out/chunk/new.parquet", "data/dangling/new.parquet"):
                with pytest.raises(UnsafeNameError, match="outside"):
                    confine.confined(root, rel)
    (root / "data" / "file").write_bytes(b"x")  # a file where a directory is expected: refused as before
    assert not confine._plain_below(str(root), "data/file/new.parquet")


@SETTINGS
@given(segments=st.lists(st.sampled_from(["..", ".", "data", "in", "out", "link_out", "link_in", "//"]),
                         max_size=8))
def test_confined_paths_resolve_inside(tmp_path_factory: pytest.TempPathFactory, segments: list[str]) -> None:
    base = tmp_path_factory.getbasetemp() / "confine_prop"
    root = base / "ds"
    if not root.exists():
        (root / "data" / "in").mkdir(parents=True)
        (base / "out").mkdir()
        (root / "data" / "link_out").symlink_to(base / "out")
        (root / "data" / "link_in").symlink_to(root / "data" / "in")
    rel = "/".join(segments)
    try:
        p = confine.confined(root, rel)
    except UnsafeNameError:
        return
    real = os.path.realpath(p)
    assert real == os.path.realpath(root) or real.startswith(os.path.realpath(root) + "/")


def test_dataset_dir_symlinked_out_is_refused(tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (log_dir / "evil").mkdir(parents=True)
    (log_dir / "evil" / "raw").symlink_to(outside)
    (log_dir / "evilname").symlink_to(outside)
    col = parse_config({"collection": {"log_dir": str(log_dir)}}).collection
    for name in ("evil", "evilname"):
        with pytest.raises(UnsafeNameError, match="outside log_dir"):
            col.dataset_dir(name)
    assert col.dataset_dir("good") == log_dir / "good" / "raw"


def test_export_trees_are_not_sources(tmp_path: Path) -> None:
    (tmp_path / "ds" / "raw").mkdir(parents=True)
    sub = tmp_path / "ds" / "export" / "lerobot_v21" / "rejected"
    sub.mkdir(parents=True)
    (tmp_path / "take").mkdir()
    other = tmp_path / "take_export" / "hdf5" / "accepted"
    other.mkdir(parents=True)
    marked = tmp_path / "copied_subset"
    (marked / "meta").mkdir(parents=True)
    (marked / "meta" / "quality_split.json").write_text("{}")
    for p in (sub, sub.parent, tmp_path / "ds" / "export", other, marked):
        with pytest.raises(UnsafeNameError, match="not a source"):
            confine.check_is_source(p)
    for p in (tmp_path / "ds" / "raw", tmp_path / "take"):
        assert confine.check_is_source(p) == p
    (tmp_path / "lonely_export").mkdir()  # no sibling "lonely": an ordinary name
    assert confine.check_is_source(tmp_path / "lonely_export")


@SETTINGS
@given(path=HOSTILE)
def test_request_paths_can_be_opened_or_are_refused(tmp_path: Path, path: str) -> None:
    try:
        confine.check_request_path(path)
    except UnsafeNameError:
        return
    os.path.exists(os.path.join(tmp_path, path))  # never raises ENAMETOOLONG / ValueError


def test_redact_hides_hosts_and_key_paths() -> None:
    text = "SSH connection to robot@data.example.org:2222 failed; key /home/r/.ssh/id_ed25519, dir /srv/ds"
    out = confine.redact(text, ["robot@data.example.org:2222", "data.example.org", "/home/r/.ssh/id_ed25519",
                                "/srv/ds", ""])
    assert "example" not in out and "id_ed25519" not in out and "/srv/ds" not in out and "failed" in out


def test_meta_files_get_the_data_file_mode(tmp_path: Path) -> None:
    old = os.umask(0o077)  # even under a strict umask: one mode for every file we write
    try:
        atomic_write_json(tmp_path / "meta" / "info.json", {"a": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "meta" / "info.json").stat().st_mode & 0o777 == FILE_MODE == 0o644


def test_name_pattern_examples() -> None:
    for ok in ("pick_cube", "a", "A-1.b_2", "x" * confine.NAME_MAX):
        assert confine.check_name(ok) == ok
    for bad in ("", ".hidden", "..", "a/b", "/abs", "a\x00b", "x" * (confine.NAME_MAX + 1), "caf\u00e9",
                "sp ace", "a\\b", "x" * 256):
        with pytest.raises(UnsafeNameError):
            confine.check_name(bad)
    assert set(string.ascii_letters) <= {c for c in string.printable if confine._NAME_RE.fullmatch("a" + c)}
