"""A table of hostile service requests against the three real nodes (separate processes).

Each node is started once for the module; the whole table is sent, each request with its
expected refusal, and after every request the node must still answer a harmless call. The
capture node records a take during the table: it must survive and save it. Nothing outside
the data roots (or the jobs directories) may be read, written or deleted.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import rosharness
import yaml
from capture_helpers import DDS_ENV, wait_receiving, write_config
from dsfactory import Ep, make_dataset
from eva_export_interfaces.srv import (
    GetJob,
    ListEpisodes,
    ReviewEpisode,
    StartCapture,
    StartExport,
    StartUpload,
    StopCapture,
)

from eva_export.config import parse_config
from eva_export.export.runner import ExportService
from eva_export.fsutil import atomic_write_json, read_json
from eva_export.jobs import FAILED, Job

pytestmark = pytest.mark.timeout(300)

LONG = "n" * 256
HUGE_NOTE = "x" * (1 << 20)  # 1 MiB
SSH_HOST, SSH_PORT, SSH_USER, REMOTE_DIR = "data.example.org", 2222, "robot", "/srv/datasets"


@dataclass
class World:
    base: Path
    log: Path
    outside: Path
    victim: Path
    cap: rosharness.NodeProcess
    sim: rosharness.NodeProcess
    exp: rosharness.NodeProcess
    up: rosharness.NodeProcess
    client: rosharness.RosClient
    secret_job: str
    upload_job: Job
    identity: Path


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, rclpy_context: None) -> Iterator[World]:
    base = tmp_path_factory.mktemp("hostile")
    cfg_path = write_config(base, cameras=("front",), width=64, height=48)
    cfg = yaml.safe_load(cfg_path.read_text())
    log = base / "datasets"
    identity = base / "keys" / "id_ed25519"
    identity.parent.mkdir()
    identity.write_text("not a key")
    (base / "keys" / "known_hosts").write_text("")
    cfg["collection"]["storage"] = {"sftp": {
        "host": SSH_HOST, "port": SSH_PORT, "user": SSH_USER, "identity_file": str(identity),
        "known_hosts": str(base / "keys" / "known_hosts"), "remote_dir": REMOTE_DIR, "connect_timeout_s": 1.0}}
    cfg_path.write_text(yaml.safe_dump(cfg))

    # Data: a good dataset with a published pair; a raw dir symlinked out of log_dir; a dataset
    # whose info.json points video_path at a file outside the roots.
    make_dataset(log / "demo" / "raw", [Ep(frames=8), Ep(frames=9, quality="red")], cameras=1, width=32, height=24)
    job = ExportService(parse_config(cfg), background=False, recover=False).run(log / "demo" / "raw", "lerobot_v21")
    assert job.state == "completed", job.error
    outside = base / "outside"
    make_dataset(outside / "raw", [Ep(frames=8)], cameras=1, width=32, height=24)
    (log / "evil").mkdir()
    (log / "evil" / "raw").symlink_to(outside / "raw")
    victim = base / "victim.mp4"
    shutil.copy2(outside / "raw" / "videos/chunk-000/observation.images.cam0/episode_000000.mp4", victim)
    make_dataset(log / "hostile" / "raw", [Ep(frames=8)], cameras=1, width=32, height=24)
    info = read_json(log / "hostile/raw/meta/info.json")
    info["video_path"] = str(base / "{video_key}" / "..") + "/victim.mp4"
    atomic_write_json(log / "hostile/raw/meta/info.json", info)

    # Jobs dirs: foreign JSON, a record named by another id, a job record outside the dir, and
    # a failed upload whose error holds the host, user, port, key path and remote dir.
    jobs = log / ".jobs"
    for kind in ("export", "upload"):
        (jobs / kind).mkdir(parents=True, exist_ok=True)
        atomic_write_json(jobs / kind / "foreign.json", {"hello": "world"})
        atomic_write_json(jobs / kind / "alist.json", [1, 2])
        atomic_write_json(jobs / kind / "other-name.json", Job.new(kind, "/x", "hdf5").to_dict())
    secret = Job.new("export", "/secret", "hdf5", state=FAILED, error="secret content")
    atomic_write_json(base / "secret.json", secret.to_dict() | {"job_id": "../../../secret"})
    up_job = Job.new("upload", str(log / "demo" / "raw"), "lerobot_v21", state=FAILED, finished_at=time.time(),
                     error=f"SSH connection to {SSH_USER}@{SSH_HOST}:{SSH_PORT} failed (key {identity}); "
                           f"staging {REMOTE_DIR}/.staging-x removed",
                     last_error=f"cannot connect to {SSH_HOST}:{SSH_PORT}: timed out")
    atomic_write_json(jobs / "upload" / f"{up_job.job_id}.json", up_job.to_dict())

    ns = rosharness.unique_namespace("hostile")
    logs = base / "logs"
    params = {"config_file": str(cfg_path)}
    cap = rosharness.NodeProcess("capture_node", logs, namespace=ns, env=DDS_ENV, params=params).start()
    sim = rosharness.NodeProcess("teleop_sim", logs, namespace=ns, env=DDS_ENV, params=params).start()
    exp = rosharness.NodeProcess("export_node", logs, namespace=ns, params=params).start()
    up = rosharness.NodeProcess("upload_node", logs, namespace=ns, params=params).start()
    client = rosharness.RosClient("hostile_client")
    try:
        client.wait_for_services([cap.service("review"), exp.service("get_job"), up.service("get_job")],
                                 timeout=60, procs=[cap, exp, up])
        yield World(base, log, outside, victim, cap, sim, exp, up, client, "../../../secret", up_job, identity)
    finally:
        client.close()
        for p in (up, exp, sim, cap):
            p.stop()


# ---- the table ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Req:
    name: str
    node: str  # cap / exp / up
    service: str
    srv: Any
    fields: Callable[[World], dict[str, Any]]
    expect: str  # substring of the refusal message ("" = any refusal)
    ok: bool = False


def _cap(name: str, srv: Any, service: str, expect: str, **fields: Any) -> Req:
    return Req(name, "cap", service, srv, lambda w: dict(fields), expect)


REQUESTS = [
    # capture: names
    _cap("start_long_name", StartCapture, "start", "at most 100", dataset_name=LONG),
    _cap("start_traversal", StartCapture, "start", "refused", dataset_name="../../etc"),
    _cap("start_absolute", StartCapture, "start", "refused", dataset_name="/tmp/x"),
    _cap("start_nul", StartCapture, "start", "", dataset_name="pi\x00ck"),
    _cap("start_unicode", StartCapture, "start", "ASCII", dataset_name="caf\u00e9"),
    _cap("start_dot", StartCapture, "start", "refused", dataset_name=".hidden"),
    _cap("start_huge_task", StartCapture, "start", "refused", task="t" * 100_000),
    _cap("list_long_name", ListEpisodes, "list_episodes", "at most 100", dataset_name=LONG),
    _cap("list_traversal", ListEpisodes, "list_episodes", "refused", dataset_name=".."),
    _cap("list_symlink_out", ListEpisodes, "list_episodes", "outside log_dir", dataset_name="evil"),
    _cap("list_unicode", ListEpisodes, "list_episodes", "ASCII", dataset_name="\u202edemo"),
    _cap("review_symlink_out", ReviewEpisode, "review", "outside log_dir", dataset_name="evil", episode_index=0,
         verdict="fail"),
    _cap("review_long_name", ReviewEpisode, "review", "at most 100", dataset_name=LONG, verdict="pass"),
    _cap("review_huge_note", ReviewEpisode, "review", "4 KiB", dataset_name="pick", episode_index=0,
         note=HUGE_NOTE, set_note=True),
    _cap("review_note_4097", ReviewEpisode, "review", "4097 bytes", dataset_name="pick", episode_index=0,
         note="y" * 4097, set_note=True),
    _cap("review_bad_verdict", ReviewEpisode, "review", "refused", dataset_name="pick", episode_index=0,
         verdict="rm -rf /"),
    _cap("review_missing_episode", ReviewEpisode, "review", "refused", dataset_name="pick", episode_index=2**31 - 1),
    _cap("review_negative_episode", ReviewEpisode, "review", "refused", dataset_name="pick", episode_index=-7),
    _cap("review_unknown_dataset", ReviewEpisode, "review", "refused", dataset_name="nothing_here", episode_index=0),
    Req("review_note_4096_ok", "cap", "review", ReviewEpisode,
        lambda w: {"dataset_name": "pick", "episode_index": 0, "note": "\u00e9" * 2048, "set_note": True}, "", ok=True),
    # export: sources and job ids
    Req("export_long_component", "exp", "start", StartExport,
        lambda w: {"source_dir": str(w.log / LONG / "raw"), "format": "lerobot_v21"}, "too long"),
    Req("export_huge_path", "exp", "start", StartExport,
        lambda w: {"source_dir": "/a" * 3000, "format": "lerobot_v21"}, "too long"),
    Req("export_traversal", "exp", "start", StartExport,
        lambda w: {"source_dir": str(w.log / "demo" / ".." / ".." / ".." / "outside" / "raw"),
                   "format": "lerobot_v21"}, "outside the export data roots"),
    Req("export_relative", "exp", "start", StartExport,
        lambda w: {"source_dir": "../../../../etc", "format": "hdf5"}, "outside the export data roots"),
    Req("export_nul", "exp", "start", StartExport,
        # ROS truncates at the NUL: the part after it (which would lead back to raw) is dropped
        lambda w: {"source_dir": str(w.log / "demo/export/lerobot_v21/rejected") + "\x00/../../../raw",
                   "format": "lerobot_v21"}, "not a source"),
    Req("export_symlink_out", "exp", "start", StartExport,
        lambda w: {"source_dir": str(w.log / "evil" / "raw"), "format": "lerobot_v21"},
        "outside the export data roots"),
    Req("export_rejected_subset", "exp", "start", StartExport,
        lambda w: {"source_dir": str(w.log / "demo/export/lerobot_v21/rejected"), "format": "lerobot_v21"},
        "not a source"),
    Req("export_pair_dir", "exp", "start", StartExport,
        lambda w: {"source_dir": str(w.log / "demo/export"), "format": "hdf5"}, "not a source"),
    Req("export_long_format", "exp", "start", StartExport,
        lambda w: {"source_dir": str(w.log / "demo" / "raw"), "format": "f" * 10_000}, "unknown export format"),
    Req("export_unicode", "exp", "start", StartExport,
        lambda w: {"source_dir": str(w.log / "d\u00e9mo\u202e" / "raw"), "format": "mcap"}, "not a directory"),
    Req("get_job_traversal", "exp", "get_job", GetJob, lambda w: {"job_id": w.secret_job}, "no job"),
    Req("get_job_long", "exp", "get_job", GetJob, lambda w: {"job_id": "j" * 300}, "no job"),
    Req("get_job_foreign_json", "exp", "get_job", GetJob, lambda w: {"job_id": "foreign"}, "no job"),
    Req("get_job_list_json", "exp", "get_job", GetJob, lambda w: {"job_id": "alist"}, "no job"),
    Req("get_job_other_record", "exp", "get_job", GetJob, lambda w: {"job_id": "other-name"}, "no job"),
    Req("get_job_unicode_nul", "exp", "get_job", GetJob, lambda w: {"job_id": "\u00e9\x00x"}, "no job"),
    # upload
    Req("upload_long_component", "up", "start", StartUpload,
        lambda w: {"source_dir": str(w.log / LONG / "raw"), "format": "lerobot_v21",
                   "accepted_dir": str(w.log / LONG / "export/lerobot_v21/accepted")}, ""),
    Req("upload_outside", "up", "start", StartUpload,
        lambda w: {"source_dir": str(w.outside / "raw"), "format": "lerobot_v21",
                   "accepted_dir": str(w.outside / "raw")}, ""),
    Req("upload_rejected", "up", "start", StartUpload,
        lambda w: {"source_dir": str(w.log / "demo" / "raw"), "format": "lerobot_v21",
                   "accepted_dir": str(w.log / "demo/export/lerobot_v21/rejected")}, ""),
    Req("upload_bad_format", "up", "start", StartUpload,
        lambda w: {"source_dir": str(w.log / "demo" / "raw"), "format": "../x",
                   "accepted_dir": str(w.log / "demo/export/lerobot_v21/accepted")}, ""),
    Req("upload_nul", "up", "start", StartUpload,
        lambda w: {"source_dir": "\x00", "format": "", "accepted_dir": "\x00"}, ""),
    Req("upload_get_job_traversal", "up", "get_job", GetJob, lambda w: {"job_id": w.secret_job}, "no upload job"),
    Req("upload_get_job_long", "up", "get_job", GetJob, lambda w: {"job_id": "u" * 1000}, "no upload job"),
    Req("upload_get_job_foreign", "up", "get_job", GetJob, lambda w: {"job_id": "foreign"}, "no upload job"),
    Req("upload_get_job_other", "up", "get_job", GetJob, lambda w: {"job_id": "other-name"}, "no upload job"),
]

PROBES: dict[str, tuple[Any, str, dict[str, Any]]] = {
    "cap": (ListEpisodes, "list_episodes", {"dataset_name": "pick"}),
    "exp": (GetJob, "get_job", {"job_id": ""}),
    "up": (GetJob, "get_job", {"job_id": ""}),
}


def _request(srv: Any, fields: dict[str, Any]) -> Any:
    req = srv.Request()
    for k, v in fields.items():
        setattr(req, k, v)
    return req


def _node(w: World, key: str) -> rosharness.NodeProcess:
    return {"cap": w.cap, "exp": w.exp, "up": w.up}[key]


def _call(w: World, key: str, srv: Any, service: str, fields: dict[str, Any]) -> Any:
    return w.client.call(srv, _node(w, key).service(service), _request(srv, fields), timeout=30)


def _wait_episodes(w: World, n: int) -> list[Any]:
    end = time.monotonic() + 60
    eps: list[Any] = []
    while time.monotonic() < end:
        eps = list(_call(w, "cap", ListEpisodes, "list_episodes", {"dataset_name": "pick"}).episodes)
        if len(eps) >= n:
            break
        w.client.spin_for(0.2)
    return eps


def test_hostile_request_table(world: World) -> None:
    w = world
    outside_before, victim_before = _tree(w.outside), w.victim.read_bytes()
    pair = w.log / "demo" / "export" / "lerobot_v21"
    pair_before = _tree(pair)
    # One saved take (episode 0 of "pick") to review, then a take recording during the table.
    # Data must flow first: a START before the streams are received records nothing (CI, load 9).
    wait_receiving(w.client, _node(w, "cap"), timeout=60)
    r = _call(w, "cap", StartCapture, "start", {"dataset_name": "pick"})
    assert r.success, r.message
    w.client.spin_for(1.0)
    stop = _call(w, "cap", StopCapture, "stop", {})
    assert stop.success and stop.frames > 0, stop.message
    assert len(_wait_episodes(w, 1)) == 1, _node(w, "cap").log_tail()
    r = _call(w, "cap", StartCapture, "start", {"dataset_name": "pick"})
    assert r.success, r.message

    failures = []
    for req in REQUESTS:
        reply = _call(w, req.node, req.srv, req.service, req.fields(w))
        if reply.success != req.ok or (req.expect and req.expect not in reply.message):
            failures.append(f"{req.name}: success={reply.success} message={reply.message[:300]!r}")
        if len(reply.message) > 400:
            failures.append(f"{req.name}: reply message is {len(reply.message)} chars")
        assert _node(w, req.node).alive, f"{req.name} killed the node:\n{_node(w, req.node).log_tail()}"
        srv, service, fields = PROBES[req.node]
        probe = _call(w, req.node, srv, service, fields)
        assert probe.message, f"{req.name}: no answer afterwards"
    assert not failures, "\n".join(failures)

    # The take recorded through the whole table is saved as episode 1.
    stop = _call(w, "cap", StopCapture, "stop", {})
    assert stop.success and stop.episode_index == 1 and stop.frames > 0, stop.message
    eps = _wait_episodes(w, 2)
    assert [e.episode_index for e in eps] == [0, 1]
    assert eps[0].note == "\u00e9" * 2048  # the 4 KiB note was stored, the larger ones were not

    # Nothing outside the roots was touched; the published pair is as it was.
    assert _tree(w.outside) == outside_before and w.victim.read_bytes() == victim_before
    assert _tree(pair) == pair_before
    for p in (w.log / "..", w.log / "demo"):
        assert not list(p.glob(f"{LONG[:10]}*"))


def test_template_escape_is_refused_in_the_job(world: World) -> None:
    """A dataset inside the roots whose info.json points outside: the job fails, nothing moves."""
    w = world
    victim_before = w.victim.read_bytes()
    r = _call(w, "exp", StartExport, "start", {"source_dir": str(w.log / "hostile" / "raw"),
                                               "format": "lerobot_v21"})
    assert r.success, r.message
    end = time.monotonic() + 60
    while True:
        job = _call(w, "exp", GetJob, "get_job", {"job_id": r.job_id}).job
        if job.state in ("completed", "failed") or time.monotonic() > end:
            break
        w.client.spin_for(0.1)
    assert job.state == "failed" and "video_path" in job.error, job.error
    assert w.victim.read_bytes() == victim_before
    assert not (w.log / "hostile" / "export").exists()


def test_get_job_errors_hide_hosts_and_key_paths(world: World) -> None:
    w = world
    reply = _call(w, "up", GetJob, "get_job", {"job_id": w.upload_job.job_id})
    assert reply.success and reply.job.state == "failed"
    text = json.dumps([reply.message, reply.job.error, reply.job.last_error])
    assert "failed" in reply.job.error and "timed out" in reply.job.last_error  # the reason stays
    for secret in (SSH_HOST, f"{SSH_USER}@", str(w.identity), REMOTE_DIR, str(SSH_PORT)):
        assert secret not in text, secret


def test_nodes_stop_cleanly_after_the_table(world: World) -> None:
    for p in (world.cap, world.exp, world.up):
        assert p.alive
        assert p.stop() == 0, p.log_tail()
    # Meta files the nodes wrote are 0644 like the data files beside them.
    root = world.log / "pick" / "raw"
    for name in ("meta/info.json", "meta/episodes.jsonl"):
        assert (root / name).stat().st_mode & 0o777 == 0o644, name
