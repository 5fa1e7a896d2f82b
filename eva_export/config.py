"""Configuration: the YAML file shared by the three nodes and the CLI.

Every section is a frozen dataclass built by ``load_config``; unknown keys are refused so a
typo does not silently fall back to a default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from . import confine
from .confine import inside as inside  # re-exported: importers of config
from .errors import ConfigError, UnsafeNameError
from .formats import registry
from .formats.common.options import FormatOptions
from .sftp_settings import BULK_MODES as BULK_MODES  # re-exported: importers of config
from .sftp_settings import SftpSettings as SftpSettings

VECTOR_TYPES = ("JointState", "Float64MultiArray")
IMAGE_TYPES = ("Image", "CompressedImage", "CompressedVideo")  # CompressedVideo: bag ingest only


def check_name(name: str, what: str = "dataset name") -> str:
    """Refuse a name that could leave its parent directory (see eva_export.confine)."""
    return confine.check_name(name, what)


@dataclass(frozen=True)
class TaskSpec:
    dataset_name: str
    task: str


@dataclass(frozen=True)
class VectorStream:
    """A state or action vector from JointState (by joint name) or Float64MultiArray."""

    topic: str
    type: str = "JointState"
    names: tuple[str, ...] = ()
    field: str = "position"  # JointState field: position, velocity or effort


@dataclass(frozen=True)
class PoseStream:
    topic: str


@dataclass(frozen=True)
class CameraStream:
    name: str
    topic: str
    type: str = "Image"
    width: int = 640
    height: int = 480

    @property
    def key(self) -> str:
        return f"observation.images.{self.name}"


@dataclass(frozen=True)
class CaptureSettings:
    """Alignment, checks and encoding knobs of the capture node."""

    skew_tolerance_s: float = 0.0  # 0 -> half a frame period
    camera_skew_tolerance_s: float = 0.0  # 0 -> one frame period
    min_frames: int = 10
    max_drop_ratio: float = 0.0  # drops allowed per stream before red (0: any drop is red)
    frozen_frames: int = 15  # identical consecutive camera frames that count as frozen
    save_queue_size: int = 4
    video_codec: str = "libx264"
    video_preset: str = "ultrafast"
    video_crf: int = 18
    reliable_qos: bool = True
    # bag ingest: roots a request may read bags from (empty: log_dir); the topic that cuts episodes
    ingest_roots: tuple[str, ...] = ()
    ingest_marker_topic: str = ""
    # START is refused below this much free space: one expected episode (60 s, 3 cameras 640x480)
    min_free_mb: int = 256


@dataclass(frozen=True)
class StorageSection:
    """A section under collection.storage, parsed by the upload backend of its name (upload/backends.py)."""
    name: str
    values: dict[str, Any]


@dataclass(frozen=True)
class CollectionConfig:
    log_dir: Path
    fps: int
    robot_type: str
    tasks: tuple[TaskSpec, ...]
    state: VectorStream | None
    action: VectorStream | None
    ee_pose: PoseStream | None
    cameras: tuple[CameraStream, ...]
    capture: CaptureSettings
    sftp: SftpSettings | None
    storage: tuple[StorageSection, ...] = ()  # every configured upload backend section

    def task_for(self, dataset_name: str = "", task: str = "") -> TaskSpec:
        """The task a start request selects: by dataset name and prompt, default the first."""
        if dataset_name:
            check_name(dataset_name)
        for spec in self.tasks:
            if dataset_name and spec.dataset_name != dataset_name:
                continue
            if task and spec.task != task:
                continue
            return spec
        raise ConfigError(
            f"no configured task matches dataset_name={dataset_name!r} task={task!r}; "
            f"configured: {[(t.dataset_name, t.task) for t in self.tasks]}"
        )

    def dataset_dir(self, dataset_name: str) -> Path:
        """``<log_dir>/<dataset-name>/raw``; the name is checked to stay inside log_dir."""
        check_name(dataset_name)
        path = self.log_dir / dataset_name / "raw"
        # The dataset directory itself (a symlinked <name> or raw pointing out) must stay inside.
        if not inside(self.log_dir, path):
            raise UnsafeNameError(f"dataset {dataset_name!r} resolves outside log_dir {self.log_dir} "
                                  f"(symlink); refused")
        return path


#: export.nonfinite: what an accepted episode with NaN/inf values does (formats/common/nonfinite.py's
#: NonFinitePolicy; spelled out here so the config stays free of numpy and pyarrow).
NONFINITE_POLICIES = ("finite_runs", "keep_passed", "refuse", "keep")


@dataclass(frozen=True)
class ExportConfig:
    data_roots: tuple[Path, ...]
    jobs_dir: Path
    workers: int = 0  # worker processes for episode units; 0 -> auto (os.cpu_count() when worth it); 1 -> serial
    nonfinite: str = "finite_runs"  # NaN/inf in accepted episodes: finite_runs, keep_passed, refuse or keep (formats/common/nonfinite.py)
    nonfinite_min_run: int = 10  # finite_runs: shorter finite runs are dropped (and counted)
    # export.formats.<name>: each registered format's options record, parsed when the config loads
    formats: Mapping[str, FormatOptions] = field(default_factory=lambda: MappingProxyType({}))

    def options_for(self, name: str) -> FormatOptions:
        """Format ``name``'s options record (its defaults when registered after the config loaded)."""
        found = self.formats.get(name)
        return found if found is not None else registry.get_spec(name).options()


@dataclass(frozen=True)
class UploadConfig:
    jobs_dir: Path


@dataclass(frozen=True)
class ConsoleConfig:
    """The review console (eva_console): off unless enabled; loopback unless configured."""

    enabled: bool = False
    bind: str = "127.0.0.1"
    port: int = 8765


@dataclass(frozen=True)
class Config:
    collection: CollectionConfig
    export: ExportConfig
    upload: UploadConfig
    path: Path | None = None
    console: ConsoleConfig = ConsoleConfig()


def _take(d: dict[str, Any], where: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ConfigError(f"{where} must be a mapping")
    unknown = set(d) - allowed
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")
    return d


def _vector(d: Any, where: str) -> VectorStream | None:
    if d is None:
        return None
    d = _take(d, where, {"topic", "type", "names", "field"})
    vs = VectorStream(topic=str(d["topic"]), type=str(d.get("type", "JointState")),
                      names=tuple(str(n) for n in d.get("names") or ()), field=str(d.get("field", "position")))
    if vs.type not in VECTOR_TYPES:
        raise ConfigError(f"{where}.type {vs.type!r} not one of {VECTOR_TYPES}")
    if not vs.names:
        raise ConfigError(f"{where}.names must list the vector's element names")
    if vs.field not in ("position", "velocity", "effort"):
        raise ConfigError(f"{where}.field must be position, velocity or effort")
    return vs


def default_log_dir() -> Path:
    """Where datasets go when collection.log_dir is empty: a work directory of the user."""
    base = os.environ.get("EVA_EXPORT_HOME") or os.path.join(os.path.expanduser("~"), "eva_export_data")
    return Path(base)


def parse_config(raw: dict[str, Any], path: Path | None = None) -> Config:
    raw = _take(raw or {}, "config", {"collection", "export", "upload", "console"})
    col = _take(raw.get("collection") or {}, "collection",
                {"log_dir", "fps", "robot_type", "tasks", "streams", "capture", "storage"})
    log_dir_s = str(col.get("log_dir") or "")
    log_dir = Path(log_dir_s).expanduser() if log_dir_s else default_log_dir()
    if path is not None and not log_dir.is_absolute():
        log_dir = path.parent / log_dir
    log_dir = log_dir.absolute()
    fps = int(col.get("fps", 30))
    if fps <= 0:
        raise ConfigError("collection.fps must be positive")
    tasks_raw = col.get("tasks") or [{"dataset_name": "demo", "task": "teleoperation demo"}]
    tasks = []
    for i, t in enumerate(tasks_raw):
        t = _take(t, f"collection.tasks[{i}]", {"dataset_name", "task"})
        tasks.append(TaskSpec(check_name(str(t["dataset_name"])), str(t.get("task", ""))))
    streams = _take(col.get("streams") or {}, "collection.streams", {"state", "action", "ee_pose", "cameras"})
    cams = _cameras(streams)
    ee = streams.get("ee_pose")
    ee_pose = PoseStream(str(_take(ee, "collection.streams.ee_pose", {"topic"})["topic"])) if ee else None
    capture = _capture(col)
    storage = _storage(col)
    sftp = next((parse_sftp(s.values) for s in storage if s.name == "sftp"), None)
    collection = CollectionConfig(
        log_dir=log_dir, fps=fps, robot_type=str(col.get("robot_type", "eva")), tasks=tuple(tasks),
        state=_vector(streams.get("state"), "collection.streams.state"),
        action=_vector(streams.get("action"), "collection.streams.action"),
        ee_pose=ee_pose, cameras=tuple(cams), capture=capture, sftp=sftp, storage=storage,
    )
    export = _export(raw, log_dir)
    up = _take(raw.get("upload") or {}, "upload", {"jobs_dir"})
    upload = UploadConfig(jobs_dir=Path(up.get("jobs_dir") or log_dir / ".jobs" / "upload"))
    return Config(collection=collection, export=export, upload=upload, path=path,
                  console=_console(raw.get("console")))


def _cameras(streams: dict[str, Any]) -> list[CameraStream]:
    cams = []
    for i, c in enumerate(streams.get("cameras") or []):
        c = _take(c, f"collection.streams.cameras[{i}]", {"name", "topic", "type", "width", "height"})
        cam = CameraStream(name=check_name(str(c["name"]), "camera name"), topic=str(c["topic"]),
                           type=str(c.get("type", "Image")), width=int(c.get("width", 640)),
                           height=int(c.get("height", 480)))
        if cam.type not in IMAGE_TYPES:
            raise ConfigError(f"camera {cam.name}: type {cam.type!r} not one of {IMAGE_TYPES}")
        cams.append(cam)
    if len({c.name for c in cams}) != len(cams):
        raise ConfigError("collection.streams.cameras: camera names must be unique")
    return cams


def _capture(col: dict[str, Any]) -> CaptureSettings:
    cap_raw = _take(col.get("capture") or {}, "collection.capture",
                    {f for f in CaptureSettings.__dataclass_fields__})
    if "ingest_roots" in cap_raw:
        cap_raw["ingest_roots"] = tuple(str(r) for r in (cap_raw["ingest_roots"] or ()))
    capture = CaptureSettings(**cap_raw)
    if not isinstance(capture.min_free_mb, int) or capture.min_free_mb < 0:
        raise ConfigError(f"collection.capture.min_free_mb {capture.min_free_mb!r} must be a whole number >= 0")
    return capture


def _storage(col: dict[str, Any]) -> tuple[StorageSection, ...]:
    """The non-empty sections under collection.storage (names checked by upload/backends.py)."""
    def keys(d: Any) -> set[str]:
        return set(d) if isinstance(d, dict) else set()
    storage = _take(col.get("storage") or {}, "collection.storage", keys(col.get("storage")))
    return tuple(StorageSection(str(k), _take(v, f"collection.storage.{k}", keys(v))) for k, v in storage.items() if v)


def parse_sftp(values: dict[str, Any]) -> SftpSettings:
    """collection.storage.sftp as checked settings."""
    s = _take(values, "collection.storage.sftp", set(SftpSettings.__dataclass_fields__))
    fields: dict[str, Any] = {k: (int(v) if k == "port" else v) for k, v in s.items()}
    sftp = SftpSettings(**fields)
    sftp.check()
    return sftp


def _export(raw: dict[str, Any], log_dir: Path) -> ExportConfig:
    ex = _take(raw.get("export") or {}, "export",
               {"data_roots", "jobs_dir", "formats", "workers", "nonfinite", "nonfinite_min_run", *OLDER_KEYS})
    roots = tuple(Path(r).expanduser().absolute() for r in (ex.get("data_roots") or [log_dir]))
    export = ExportConfig(
        data_roots=roots, jobs_dir=Path(ex.get("jobs_dir") or log_dir / ".jobs" / "export"),
        workers=_workers(ex.get("workers", 0)),
        nonfinite=str(ex.get("nonfinite", "finite_runs")),
        nonfinite_min_run=int(ex.get("nonfinite_min_run", 10)), formats=_format_options(ex),
    )
    if export.nonfinite not in NONFINITE_POLICIES or export.nonfinite_min_run < 1:
        raise ConfigError(f"export.nonfinite must be one of {list(NONFINITE_POLICIES)} (got {export.nonfinite!r}) "
                          f"and export.nonfinite_min_run at least 1 frame (got {export.nonfinite_min_run})")
    return export


#: The older spellings under export, each one key of a format's section (mcap_compression set
#: both MCAP profiles); export.eva_store.<key> is the older spelling of export.formats.eva_store.<key>.
OLDER_KEYS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "v3_data_file_mb": (("lerobot_v3", "data_file_mb"),),
    "v3_video_file_mb": (("lerobot_v3", "video_file_mb"),),
    "hdf5_compression": (("hdf5", "compression"),),
    "mcap_compression": (("mcap", "compression"), ("mcap_foxglove", "compression")),
    "eva_store": (),
}


def _format_options(ex: dict[str, Any]) -> Mapping[str, FormatOptions]:
    """export.formats.<name> as each registered format's options record, the older keys mapped in."""
    given = _take(ex.get("formats") or {}, "export.formats", set(registry.FORMATS))
    sections = {name: _mapping(v, f"export.formats.{name}") for name, v in given.items()}
    older = [(f"export.{k}", name, key, ex[k]) for k, targets in OLDER_KEYS.items() if k in ex for name, key in targets]
    store = _mapping(ex.get("eva_store"), "export.eva_store")
    older += [(f"export.eva_store.{key}", "eva_store", key, value) for key, value in store.items()]
    spelled: dict[str, list[str]] = {}
    for old, name, key, value in older:
        if key in sections.setdefault(name, {}):
            raise ConfigError(f"{old} and export.formats.{name}.{key} are one setting given twice; "
                              f"keep export.formats.{name}.{key}")
        sections[name][key] = value
        spelled.setdefault(name, []).append(old)
    records = {}
    for spec in registry.SPECS:  # read now: a format registered later (a test plugin) counts
        try:
            records[spec.name] = spec.parse(sections.get(spec.name, {}), f"export.formats.{spec.name}")
        except ConfigError as exc:
            if spec.name not in spelled:
                raise
            raise ConfigError(f"{exc} (given as {', '.join(spelled[spec.name])})") from exc
    return MappingProxyType(records)


def _mapping(d: Any, where: str) -> dict[str, Any]:
    """A section whose keys its own parser checks: here only that it is a mapping (or empty)."""
    return dict(_take(d or {}, where, set(d) if isinstance(d, dict) else set()))


def _workers(value: Any) -> int:
    """export.workers: a whole number >= 0 (0: one per core)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1024:
        raise ConfigError(f"export.workers must be a whole number from 0 (one per core) to 1024, got {value!r}")
    return value


def _console(d: Any) -> ConsoleConfig:
    c = _take(d or {}, "console", {"enabled", "bind", "port"})
    enabled = c.get("enabled", False)
    if not isinstance(enabled, bool):
        raise ConfigError("console.enabled must be true or false")
    cc = ConsoleConfig(enabled=enabled, bind=str(c.get("bind") or "127.0.0.1"), port=int(c.get("port", 8765)))
    if not 0 <= cc.port <= 65535:
        raise ConfigError(f"console.port {cc.port} must be 0..65535 (0 = any free port)")
    return cc


def load_config(path: str | Path | None) -> Config:
    """Load the YAML config; an empty path gives the defaults."""
    if not path:
        return parse_config({})
    import yaml  # only a config file needs it (an export without --config does not)
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config {p}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {p} is not valid YAML: {exc}") from exc
    return parse_config(raw, p)
