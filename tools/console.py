"""`make console`: the review console with the nodes it talks to, up until Ctrl-C.

    tools/console.py                         # a small sample dataset in build/console/
    tools/console.py --config my.yaml        # your config (console.enabled is forced on)
    tools/console.py --log-dir OUT/datasets  # e.g. the datasets `make demo` left behind

Starts eva_capture, eva_export, eva_upload and eva_console as processes (as the launch file
would), prints the console URL and waits. DDS stays on loopback with its own domain id.
"""

from __future__ import annotations

import argparse
import re
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import rosharness  # noqa: E402

NODES = ("capture_node", "export_node", "upload_node", "console_node")


def sample_dataset(log_dir: Path) -> None:
    """Three short episodes: green, red with a located drop, reviewed with a note."""
    from dsfactory import Ep, make_dataset

    if (log_dir / "sample" / "raw" / "meta" / "info.json").is_file():
        return
    make_dataset(log_dir / "sample" / "raw", [
        Ep(frames=90, task="pick up the cube"),
        Ep(frames=120, quality="red", task="pick up the cube",
           issues=[{"code": "dropped_frames", "severity": "error", "detail": "cam0: 6/120",
                    "frames": [40, 41, 42, 70, 71, 72]}],
           extra={"stream_stats": {"cam0": {"received": 114, "rate_hz": 28.6, "dropped": 6}}}),
        Ep(frames=60, task="place it in the bin", verdict="pass", note="slow but clean"),
    ], cameras=2, width=160, height=120)


def build_config(args: argparse.Namespace, work: Path) -> Path:
    import yaml

    raw: dict[str, Any] = {}
    if args.config:
        raw = yaml.safe_load(Path(args.config).read_text()) or {}
    col = raw.setdefault("collection", {})
    if args.log_dir:
        col["log_dir"] = str(Path(args.log_dir).absolute())
    if not col.get("log_dir"):
        col["log_dir"] = str(work / "datasets")
        sample_dataset(work / "datasets")
        col.setdefault("tasks", [{"dataset_name": "sample", "task": "pick up the cube"}])
    col.setdefault("streams", {"state": {"topic": "/console_demo/joint_states", "names": ["j0"]}})
    console = raw.setdefault("console", {})
    console["enabled"] = True
    if args.port is not None:
        console["port"] = args.port
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def port_in_use(config: Path) -> str:
    """One line when the console's port is taken (else ""), checked before any node starts:
    the console node would otherwise die with its traceback in the log."""
    import yaml

    console = (yaml.safe_load(config.read_text()) or {}).get("console") or {}
    bind, port = str(console.get("bind", "127.0.0.1")), int(console.get("port", 8765))
    if port == 0:
        return ""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the console's server does
        try:
            s.bind((bind, port))
        except OSError as exc:
            return (f"eva console: port {port} on {bind} is not available ({exc.strerror}); "
                    'pick another with CONSOLE_ARGS="--port 0" (any free port) or --port N')
    return ""


def _startup_failure(proc: rosharness.NodeProcess) -> str:
    """The console node's own one-line reason when it has one, else its log tail."""
    m = re.search(r"console cannot listen[^\n]*", proc.log_text())
    return f"eva console: {m.group(0)}" if m else proc.log_tail()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="an eva_export config (default: a sample one)")
    ap.add_argument("--log-dir", help="the datasets' log_dir (overrides the config's)")
    ap.add_argument("--port", type=int, help="the console port (default: the config's, 8765)")
    ap.add_argument("--work", default=str(ROOT / "build" / "console"), help="where the config and logs go")
    args = ap.parse_args()
    rosharness.configure_ros_env(keep_user_domain=True)
    work = Path(args.work).absolute()
    work.mkdir(parents=True, exist_ok=True)
    config = build_config(args, work)
    busy = port_in_use(config)
    if busy:
        print(busy, file=sys.stderr)
        return 1
    ns = rosharness.unique_namespace("console")  # one namespace: the console finds its peers
    procs = [rosharness.NodeProcess(exe, work / "logs", params={"config_file": str(config)}, namespace=ns)
             for exe in NODES]
    try:
        for p in procs:
            p.start()
        end = time.monotonic() + 60
        url = ""
        while not url and time.monotonic() < end:
            m = re.search(r"console at (http://\S+)", procs[-1].log_text())
            url = m.group(1) if m else ""
            if not procs[-1].alive():
                print(_startup_failure(procs[-1]), file=sys.stderr)
                return 1
            time.sleep(0.2)
        if not url:
            print("the console did not start; logs in", work / "logs", file=sys.stderr)
            return 1
        # the URL is printed once the console node's own clients see their peers, so the first
        # page load lists the episodes
        while "console peers ready" not in procs[-1].log_text():
            if "console peers not found" in procs[-1].log_text() or not all(p.alive() for p in procs):
                print(procs[-1].log_tail(), file=sys.stderr)
                return 1
            time.sleep(0.2)
        print(f"eva console: {url}   (config {config}; logs {work / 'logs'}; Ctrl-C stops)", flush=True)
        while all(p.alive() for p in procs):
            time.sleep(1.0)
        dead = rosharness.describe_dead(procs)
        print(f"a node stopped:\n{dead}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    finally:
        for p in reversed(procs):
            p.stop()
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the nodes on TERM too
    sys.exit(main())
