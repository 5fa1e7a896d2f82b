"""The ``mcap_foxglove`` exporter: one viewer-profile MCAP file per episode (layout.py).

Each file is read back through the viewers' decoders and compared with its source before it
is renamed into place (readback.py). Runs the same per-episode loop as hdf5 and the eva-client mcap (episode_files.py): each file is
written as ``.episode_NNNNNN.mcap.partial`` and renamed when closed, a finished file is kept
by a resumed run, and the common meta files and the quality marker come last. A camera with
fewer or more frames than the table's rows fails the export, naming the episode, the camera
and its source file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
from mcap.writer import CompressionType, Writer
from numpy.typing import NDArray

from ...errors import ExportError, VideoError
from ..common.exporter import Progress, VerifyReport
from ..common.mcap_summary import channel_counts
from ..common.meta import DatasetMeta
from ..common.records import EpisodeRow
from ..lerobot_v21.episode_files import export_episode_files
from ..lerobot_v21.subset import column_numpy
from .cameras import CameraPlan, camera_message, camera_payloads, plan_camera, schema_data
from .layout import (
    EPISODE_TOPIC,
    FORMAT,
    JOINT_MSGDEF,
    JOINT_SCHEMA,
    LIBRARY,
    METADATA_NAME,
    PROFILE,
    STRING_MSGDEF,
    STRING_SCHEMA,
    JointStateCdr,
    dimension_names,
    frame_time_ns,
    numeric_keys,
    string_cdr,
    topic,
)
from .options import ViewerOptions
from .readback import check_episode_file
from .record import episode_record, episode_text, metadata_strings

CHUNK_SIZE = 4 * 1024 * 1024
_COMPRESSION = {"lz4": CompressionType.LZ4, "zstd": CompressionType.ZSTD, "none": CompressionType.NONE}


class McapViewerExporter:
    """Write a native v2.1 subset as one viewer-profile MCAP file per episode."""

    name = FORMAT

    def __init__(self, options: ViewerOptions = ViewerOptions(), *, chunk_size: int = CHUNK_SIZE) -> None:
        compression = options.compression
        if compression not in _COMPRESSION:
            raise ValueError(f"mcap compression {compression!r}: choose one of {sorted(_COMPRESSION)}")
        self.compression = compression
        self.chunk_size = chunk_size
        self.resumed: list[int] = []

    def export(self, native_subset: Path, out_dir: Path, progress: Progress | None = None) -> None:
        self.resumed = export_episode_files(
            Path(native_subset), Path(out_dir), progress or Progress(), self.name, "mcap",
            write_episode=self._write_episode,
            is_complete=lambda path, meta, ep: _complete(path, meta, ep.length))

    def verify(self, out_dir: Path) -> VerifyReport:
        from .verify import verify_viewer

        return verify_viewer(Path(out_dir))

    def _write_episode(self, tmp: Path, meta: DatasetMeta, ep: EpisodeRow, table: pa.Table) -> str | None:
        plans = [plan_camera(meta, ep.episode_index, k) for k in meta.info.visual_keys]
        with open(tmp, "wb") as fh:
            w = Writer(fh, chunk_size=self.chunk_size, compression=_COMPRESSION[self.compression])
            w.start(profile=PROFILE, library=LIBRARY)
            cams = {p.key: self._camera_channel(w, meta, p) for p in plans}
            joints = self._joint_channels(w, meta)
            record = episode_record(meta, ep)
            w.add_metadata(METADATA_NAME, metadata_strings(record))
            text = episode_text(record)
            self._write_text(w, text)
            self._write_messages(w, meta, ep, table, plans, cams, joints)
            w.finish()  # type: ignore[no-untyped-call]  # mcap's Writer.finish has no annotations
        check_episode_file(tmp, meta, ep, table, plans, text)
        return None  # the manifest hashes the file when it is recorded

    @staticmethod
    def _camera_channel(w: Writer, meta: DatasetMeta, plan: CameraPlan) -> int:
        h, wd = meta.info.features[plan.key].shape[:2]
        schema = w.register_schema(plan.schema, "protobuf", schema_data(plan.schema))
        return w.register_channel(topic(plan.key), "protobuf", schema,
                                  {"key": plan.key, "height": str(h), "width": str(wd), "carrier": plan.carrier})

    @staticmethod
    def _write_text(w: Writer, text: str) -> None:
        schema = w.register_schema(STRING_SCHEMA, "ros2msg", STRING_MSGDEF.encode())
        channel = w.register_channel(EPISODE_TOPIC, "cdr", schema, {})
        w.add_message(channel, 0, string_cdr(text), 0, 0)

    @staticmethod
    def _joint_channels(w: Writer, meta: DatasetMeta) -> dict[str, tuple[int, JointStateCdr]]:
        schema = w.register_schema(JOINT_SCHEMA, "ros2msg", JOINT_MSGDEF.encode())
        out = {}
        for key in numeric_keys(meta.info.features):
            names = dimension_names(key, meta.info.features[key])
            channel = w.register_channel(topic(key), "cdr", schema, {"key": key, "names": json.dumps(names)})
            out[key] = (channel, JointStateCdr("", names))
        return out

    def _write_messages(self, w: Writer, meta: DatasetMeta, ep: EpisodeRow, table: pa.Table,
                        plans: list[CameraPlan], cams: dict[str, int],
                        joints: dict[str, tuple[int, JointStateCdr]]) -> None:
        """Frame by frame: every camera, then every numeric feature, at the frame's stamp."""
        fps, rows = meta.info.fps, table.num_rows
        values = {k: feature_values(meta, ep, table, k) for k in joints}
        iters = {p.key: (p, camera_payloads(meta, ep.episode_index, table, p)) for p in plans}
        try:
            for i in range(rows):
                t = frame_time_ns(i, fps)
                for key, (plan, it) in iters.items():
                    item = next(it, None)
                    if item is None:
                        raise ExportError(f"episode {ep.episode_index}: camera {key} ({_where(plan)}) ends "
                                          f"early at frame {i} of {rows}")
                    w.add_message(cams[key], t, camera_message(plan.schema, key, t, *item), t, i)
                for key, (channel, cdr) in joints.items():
                    w.add_message(channel, t, cdr.encode(t, values[key][i]), t, i)
            for key, (plan, it) in iters.items():
                if next(it, None) is not None:
                    raise ExportError(f"episode {ep.episode_index}: camera {key} ({_where(plan)}) has frames "
                                      f"after the table's {rows} rows")
        except VideoError as exc:
            raise ExportError(f"episode {ep.episode_index}: {exc}") from exc
        finally:
            for _, it in iters.values():
                getattr(it, "close", lambda: None)()


def feature_values(meta: DatasetMeta, ep: EpisodeRow, table: pa.Table, key: str) -> NDArray[np.float64]:
    """A numeric feature's column as (rows, dims) float64, dims as many as its names."""
    dims = len(dimension_names(key, meta.info.features[key]))
    try:
        values = np.asarray(column_numpy(table, key), dtype=np.float64).reshape(table.num_rows, -1)
    except (ValueError, TypeError) as exc:
        raise ExportError(f"episode {ep.episode_index}: {meta.data_path(ep.episode_index)}: column {key!r} is "
                          f"not a fixed-size numeric vector ({exc})") from exc
    if values.shape[1] != dims:
        raise ExportError(f"episode {ep.episode_index}: {meta.data_path(ep.episode_index)}: column {key!r} holds "
                          f"{values.shape[1]} values per row, info.json declares {dims}")
    return values


def _where(plan: CameraPlan) -> str:
    return str(plan.source) if plan.source is not None else "Parquet image column"


def _complete(path: Path, meta: DatasetMeta, rows: int) -> bool:
    """A finished file of a run that was stopped: every channel holds one message per row."""
    counts = channel_counts(path)
    want = [topic(k) for k in [*meta.info.visual_keys, *numeric_keys(meta.info.features)]]
    return (counts is not None and sorted(counts) == sorted([*want, EPISODE_TOPIC])
            and counts[EPISODE_TOPIC] == 1 and all(counts[t] == rows for t in want))


