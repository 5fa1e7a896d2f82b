"""The robot install path, run for real: tools/robot_install.sh (colcon) into a workspace.

A copy of the tree goes to ``<tmp>/ws/src/eva_export``; the venv running these tests plays the
ROS 2 install (``tools/venv_ros_setup.bash`` stands in for ``/opt/ros/<distro>/setup.bash``),
and ``tools/robot_install.sh`` - the script README's "On a robot with ROS 2" section runs -
builds eva_export_interfaces and eva_export with colcon from PyPI. Then, in a clean
environment that only sourced ``install/setup.bash``, the tests check what ``ros2 launch`` and
``ros2 run`` would resolve (package share, launch file, default config, DDS profile,
``lib/eva_export/<executable>`` of every launched node, the interface types) and start the
installed capture and export nodes and call a service on each.

Also here: package.xml's keys against the rosdep database check, and the systemd unit example.
The build is the slow part (about 3 min of CPU); it runs once per module. Developers may set
EVA_COLCON_TEST_WS=<a workspace an earlier run built> to skip it while changing the checks.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest
import rosharness
import yaml

pytestmark = pytest.mark.timeout(1500)

ROOT = rosharness.REPO_ROOT
TESTS_DIR = Path(__file__).resolve().parent
VENV = Path(sys.prefix)  # the venv with the ROS 2 wheels: the "ROS install" of these tests
UNIT_FILE = ROOT / "deploy" / "eva_export.service"
BUILD_TIMEOUT = 1200
#: (service type, private name) called on each installed node.
NODE_SERVICES = {"capture_node": ("ListEpisodes", "list_episodes"), "export_node": ("GetJob", "get_job")}
#: Directories of a checkout that are not part of the source (build products, local state).
NOT_SOURCE = {".git", ".venv", "build", "install", "log", "demo_output", "__pycache__", ".pytest_cache",
              ".ruff_cache"}


@dataclass(frozen=True)
class Workspace:
    root: Path
    src: Path
    install: Path
    env: dict[str, str]  # the environment after sourcing install/setup.bash
    build_seconds: float


def base_env() -> dict[str, str]:
    """A clean environment as on a robot: nothing of the test process's PYTHONPATH or venv."""
    env = {
        "HOME": os.environ.get("HOME", "/root"),
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
    }
    for key in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "RMW_IMPLEMENTATION"):
        env[key] = os.environ[key]  # set by conftest.py: loopback only, this run's domain
    return env


def bash(script: str, env: dict[str, str], timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def source_files() -> list[Path]:
    """The files of this checkout a clone would have (git's view when available)."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True, timeout=60).stdout
        files = [Path(p) for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        files = [p.relative_to(ROOT) for p in ROOT.rglob("*") if p.is_file()]
    return [f for f in files if not NOT_SOURCE & set(f.parts) and (ROOT / f).is_file()]


def copy_source(dest: Path) -> None:
    for rel in source_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)


def underlay(src: Path) -> str:
    """The shell line that plays `source /opt/ros/<distro>/setup.bash` with the venv."""
    return f'source "{src}/tools/venv_ros_setup.bash" "{VENV}"'


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    reuse = os.environ.get("EVA_COLCON_TEST_WS")  # developers only: a workspace this test built
    if reuse:
        root = Path(reuse)
        src = root / "src" / "eva_export"
        env = sourced_env(root, src)
        print(f"\nEVA_COLCON_TEST_WS: reusing {root}, no build")
        return Workspace(root, src, root / "install", env, 0.0)
    root = tmp_path_factory.mktemp("colcon") / "ws"
    src = root / "src" / "eva_export"
    copy_source(src)
    assert (src / "package.xml").is_file() and (src / "interfaces" / "package.xml").is_file()

    # The README's robot steps with the venv as the ROS install (rosdep skipped: the venv has
    # the Python packages of package.xml's keys from pip, and there is no apt ROS here).
    script = f'{underlay(src)} && EVA_SKIP_ROSDEP=1 "{src}/tools/robot_install.sh" "{root}"'
    start = time.monotonic()
    proc = bash(script, base_env(), timeout=BUILD_TIMEOUT)
    build_seconds = time.monotonic() - start
    (root / "robot_install.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"robot_install.sh failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    print(f"\nrobot_install.sh (colcon build of both packages) took {build_seconds:.1f} s")

    return Workspace(root, src, root / "install", sourced_env(root, src), build_seconds)


def sourced_env(root: Path, src: Path) -> dict[str, str]:
    """The environment of a shell that sourced the ROS setup and the workspace's setup.bash."""
    script = f'{underlay(src)} && set +u && source "{root}/install/setup.bash" && env -0'
    dump = bash(script, base_env(), timeout=60, cwd=Path("/"))
    assert dump.returncode == 0, dump.stderr
    return dict(item.split("=", 1) for item in dump.stdout.split("\0") if "=" in item)


PROBE = r"""
import json, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])  # tests/: launch doubles (ROS 2 launch is not on PyPI)
from ament_index_python.packages import get_package_prefix, get_package_share_directory
from rclpy.type_support import check_for_type_support
import launch_doubles
import eva_export, eva_export_interfaces, eva_export_interfaces.msg as msgs, eva_export_interfaces.srv as srvs

share = get_package_share_directory("eva_export")
plan, launch_env = launch_doubles.launch_plan({}, Path(share) / "launch" / "eva.launch.py")
srv_names = sorted(n for n in dir(srvs) if n[:1].isupper() and "_" not in n)
msg_names = sorted(n for n in dir(msgs) if n[:1].isupper() and "_" not in n)
for name in srv_names:
    check_for_type_support(getattr(srvs, name))  # loads the C type support libraries
for name in msg_names:
    check_for_type_support(getattr(msgs, name))
print(json.dumps({
    "share": share,
    "prefix": get_package_prefix("eva_export"),
    "interfaces_prefix": get_package_prefix("eva_export_interfaces"),
    "nodes": [{"executable": n.executable, "name": n.name, "params": n.params} for n in plan],
    "eva_export_file": eva_export.__file__,
    "interfaces_file": eva_export_interfaces.__file__,
    "srv_types": srv_names,
    "msg_types": msg_names,
}))
"""


@pytest.fixture(scope="module")
def probe(workspace: Workspace) -> dict:
    """What the sourced workspace resolves, asked from a clean process in that environment."""
    proc = subprocess.run([workspace.env.get("VIRTUAL_ENV", str(VENV)) + "/bin/python", "-c", PROBE, str(TESTS_DIR)],
                          env=workspace.env, cwd="/", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def under(path: str | Path, parent: Path) -> bool:
    return Path(path).resolve().is_relative_to(parent.resolve())


# --- the colcon install ------------------------------------------------------------------------
def test_install_space_resolves_like_ros2_launch_and_run(workspace, probe):
    install = workspace.install
    # the overlay wins over the "ROS install" (the venv has an editable eva_export and its own
    # eva_export_interfaces build: the workspace's copies must be the ones used)
    assert Path(probe["prefix"]) == install / "eva_export"
    assert Path(probe["interfaces_prefix"]) == install / "eva_export_interfaces"
    assert under(probe["eva_export_file"], install / "eva_export"), probe["eva_export_file"]
    assert under(probe["interfaces_file"], install / "eva_export_interfaces"), probe["interfaces_file"]

    share = Path(probe["share"])
    assert share == install / "eva_export" / "share" / "eva_export"
    for rel in ("package.xml", "launch/eva.launch.py", "config/default.yaml", "config/fastdds_shm.xml"):
        assert (share / rel).is_file(), rel
        assert (share / rel).read_bytes() == (workspace.src / rel).read_bytes(), rel
    assert (install / "eva_export" / "share" / "ament_index" / "resource_index" / "packages" / "eva_export").is_file()

    # ros2 launch eva_export eva.launch.py: every node's executable where `ros2 run` looks,
    # the default config from the installed share directory
    nodes = probe["nodes"]
    assert {n["name"] for n in nodes} == {"eva_capture", "eva_export", "eva_upload", "eva_console"}
    for node in nodes:
        exe = Path(probe["prefix"]) / "lib" / "eva_export" / node["executable"]
        assert exe.is_file() and os.access(exe, os.X_OK), exe
        assert node["params"] == {"config_file": str(share / "config" / "default.yaml")}
        # colcon ran with the venv's Python: the script's interpreter is that one
        assert exe.read_text().splitlines()[0] == f"#!{VENV}/bin/python", exe

    # every .srv/.msg of the source tree is generated, importable and has its type support
    assert probe["srv_types"] == sorted(p.stem for p in (ROOT / "srv").glob("*.srv"))
    assert probe["msg_types"] == sorted(p.stem for p in (ROOT / "msg").glob("*.msg"))
    ishare = install / "eva_export_interfaces" / "share" / "eva_export_interfaces"
    assert sorted(p.name for p in (ishare / "srv").glob("*.srv")) == sorted(p.name for p in (ROOT / "srv").glob("*.srv"))


def maps_of(pid: int) -> set[str]:
    """Paths of the files mapped into a process (shared libraries)."""
    paths = set()
    with open(f"/proc/{pid}/maps") as fh:
        for line in fh:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                paths.add(parts[5].strip())
    return paths


def test_installed_nodes_answer(workspace, probe, tmp_path, ros_client):
    """Start capture_node and export_node from the install space (as `ros2 run` does) and call
    one service on each; they must load the workspace's interface libraries, not the venv's."""
    import eva_export_interfaces.srv as srvs

    log_dir = tmp_path / "datasets"
    log_dir.mkdir()
    config = tmp_path / "robot.yaml"
    # the installed default config (it configures streams) with the datasets under tmp_path
    data = yaml.safe_load((Path(probe["share"]) / "config" / "default.yaml").read_text())
    data["collection"]["log_dir"] = str(log_dir)
    config.write_text(yaml.safe_dump(data))
    namespace = rosharness.unique_namespace("colcon")
    lib = Path(probe["prefix"]) / "lib" / "eva_export"
    env_args = [f"{k}={v}" for k, v in sorted(workspace.env.items())]
    procs = []
    try:
        for executable in NODE_SERVICES:
            name = rosharness.NODE_NAMES[executable]
            # env -i: only what sourcing the workspace gives, nothing of the test process;
            # the script where `ros2 run eva_export <executable>` finds it
            command = ["env", "-i", *env_args, str(lib / executable), "--ros-args",
                       "-r", f"__node:={name}", "-r", f"__ns:={namespace}", "-p", f"config_file:={config}"]
            node = rosharness.NodeProcess(executable, tmp_path / "logs", name=name, namespace=namespace,
                                          command=command)
            procs.append(node.start())
        wanted = {p.service(NODE_SERVICES[p.executable][1]): getattr(srvs, NODE_SERVICES[p.executable][0])
                  for p in procs}
        ros_client.wait_for_services(wanted, timeout=60, procs=procs)
        replies = {name: ros_client.call(srv_type, name, srv_type.Request(), timeout=15)
                   for name, srv_type in wanted.items()}

        capture = replies[procs[0].service("list_episodes")]
        assert capture.success, capture.message
        assert list(capture.episodes) == []
        job = replies[procs[1].service("get_job")]
        assert isinstance(job, srvs.GetJob.Response)
        assert not job.success and job.message  # no job yet: a clear refusal, not a crash

        for proc in procs:
            mapped = {p for p in maps_of(proc.pid) if "libeva_export_interfaces__" in p}
            assert mapped, f"{proc.executable}: no eva_export_interfaces library loaded"
            assert all(under(p, workspace.install) for p in mapped), (proc.executable, mapped)
        cap_log = procs[0].log_text()
        assert f"config_file={str(config)!r}" in cap_log, procs[0].log_tail()
        dds = Path(probe["share"]) / "config" / "fastdds_shm.xml"
        assert f"dds_profile={str(dds)!r}" in cap_log, procs[0].log_tail()
    finally:
        codes = {p.executable: p.stop() for p in procs}
    assert codes == {"capture_node": 0, "export_node": 0}, codes


def test_robot_install_refuses_without_ros_environment(tmp_path):
    """Run without a sourced ROS 2 environment, the script says what to do and builds nothing."""
    proc = bash(f'"{ROOT}/tools/robot_install.sh" "{tmp_path / "ws"}"', base_env(), timeout=60)
    assert proc.returncode != 0
    assert "source /opt/ros/<distro>/setup.bash" in proc.stdout + proc.stderr
    assert not (tmp_path / "ws" / "install").exists()


# --- package.xml: dependencies a robot can install ----------------------------------------------
#: top-level import -> where a robot gets it (a rosdep key of package.xml, or "pip")
IMPORT_SOURCES = {
    "rclpy": "rclpy", "std_msgs": "std_msgs", "sensor_msgs": "sensor_msgs", "geometry_msgs": "geometry_msgs",
    "eva_export_interfaces": "eva_export_interfaces", "ament_index_python": "ament_index_python",
    "launch": "launch", "launch_ros": "launch_ros",
    "numpy": "python3-numpy", "h5py": "python3-h5py", "yaml": "python3-yaml", "msgpack": "python3-msgpack",
    "paramiko": "python3-paramiko",
    "pyarrow": "pip", "av": "pip", "mcap": "pip", "mcap_ros2": "pip", "zarr": "pip", "simplejpeg": "pip",
    # mcap's own compressors, called directly by formats/mcap_eva/chunks.py (so pinned, not left to mcap)
    "lz4": "pip", "zstandard": "pip",
    # zarr's own zstd codec, called directly by formats/eva_store/zarr_write.py (so pinned, not left to zarr)
    "numcodecs": "pip",
    # the mcap_foxglove format: the Foxglove camera schemas and the protobuf decoder of its verifier
    "foxglove_schemas_protobuf": "pip", "mcap_protobuf": "pip",
    # `pip install .[ray]`: only eva-export batch --ray imports it, never a node (test_core_imports)
    "ray": "optional",
}
PIP_NAMES = {"pyarrow": "pyarrow", "av": "av", "mcap": "mcap", "mcap_ros2": "mcap-ros2-support", "zarr": "zarr",
             "simplejpeg": "simplejpeg", "lz4": "lz4", "zstandard": "zstandard", "numcodecs": "numcodecs",
             "foxglove_schemas_protobuf": "foxglove-schemas-protobuf", "mcap_protobuf": "mcap-protobuf-support"}


def third_party_imports() -> set[str]:
    """Top-level modules imported by the installed code (package and launch file)."""
    stdlib = set(sys.stdlib_module_names)
    found = set()
    files = list((ROOT / "eva_export").rglob("*.py")) + [ROOT / "launch" / "eva.launch.py"]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found.update(n.split(".")[0] for n in names)
    return found - stdlib - {"eva_export", "__future__"}


def rosdep_keys_checked() -> set[str]:
    lines = (TESTS_DIR / "fixtures" / "rosdep_keys.txt").read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def test_every_runtime_import_has_a_rosdep_key_or_a_pin():
    imports = third_party_imports()
    unknown = imports - set(IMPORT_SOURCES)
    assert not unknown, f"new runtime imports: add a rosdep key to package.xml or a pip pin: {sorted(unknown)}"

    xml = ET.parse(ROOT / "package.xml").getroot()
    exec_deps = {e.text for e in xml.findall("exec_depend")}
    pins = {}
    for line in (ROOT / "requirements-robot.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"requirements-robot.txt must pin with ==: {line}"
            pins[name.strip().lower()] = version
    for module in sorted(imports):
        source = IMPORT_SOURCES[module]
        if source == "optional":
            continue
        if source == "pip":
            assert PIP_NAMES[module] in pins, f"{module}: no pin in requirements-robot.txt"
        else:
            assert source in exec_deps, f"{module}: package.xml lacks <exec_depend>{source}</exec_depend>"
    # the pins are the versions the tests run with
    from importlib.metadata import version
    for name, pinned in pins.items():
        assert version(name) == pinned, f"{name}: installed {version(name)}, requirements-robot.txt {pinned}"


def test_package_xml_keys_exist_in_rosdep_database():
    known = rosdep_keys_checked() | {"eva_export_interfaces"}  # built from this repository
    for xml_path in (ROOT / "package.xml", ROOT / "interfaces" / "package.xml"):
        root = ET.parse(xml_path).getroot()
        deps = [e.text for e in root if e.tag.endswith("depend")]
        assert deps
        missing = sorted(set(deps) - known)
        assert not missing, f"{xml_path.name}: keys not checked against the rosdep database: {missing}"


# --- systemd unit ---------------------------------------------------------------------------------
def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """systemd unit syntax: sections, repeated keys kept in order, comments, no continuation."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"bad unit line: {raw!r}"
        key, value = (part.strip() for part in line.split("=", 1))
        current.setdefault(key, []).append(value)
    return sections


def test_systemd_unit_runs_the_launch_file_and_stops_with_sigint():
    unit = parse_unit(UNIT_FILE.read_text())
    service = unit["Service"]
    one = {k: v[-1] for k, v in service.items()}
    assert one["Restart"] == "on-failure"
    assert one["KillSignal"] == "SIGINT"
    assert one["KillMode"] == "mixed"  # SIGINT to ros2 launch, which stops its nodes
    assert 0 < int(one["TimeoutStopSec"]) <= 300
    assert one.get("SendSIGKILL", "yes") == "yes"
    env = dict(e.split("=", 1) for e in service["Environment"])
    assert env["ROS_AUTOMATIC_DISCOVERY_RANGE"] in {"LOCALHOST", "SUBNET"}
    assert 0 <= int(env["ROS_DOMAIN_ID"]) <= 232
    exec_start = one["ExecStart"]
    assert "exec ros2 launch eva_export eva.launch.py config:=${EVA_CONFIG}" in exec_start
    assert "source /opt/ros/${ROS_DISTRO}/setup.bash" in exec_start
    assert "source ${EVA_WS}/install/setup.bash" in exec_start
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_systemd_unit_command_starts_from_the_workspace(workspace, tmp_path):
    """The unit's ExecStart with its Environment, against the test workspace: everything up to
    `ros2 launch` (not installable from PyPI) must work; `ros2` is replaced by a recorder."""
    unit = parse_unit(UNIT_FILE.read_text())["Service"]
    command = unit["ExecStart"][-1]
    prefix, _, script = command.partition(" -c ")
    assert prefix == "/bin/bash" and script[0] == script[-1] == "'"
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "ros2").write_text(
        '#!/bin/bash\nprintf "%s\\n" "$@" > "$RECORD"\n'
        'python -c "from ament_index_python.packages import get_package_share_directory as g;'
        ' print(g(\'eva_export\'))" >> "$RECORD"\n')
    (fake_bin / "ros2").chmod(0o755)
    fake_ros = tmp_path / "opt_ros"
    fake_ros.mkdir()
    (fake_ros / "setup.bash").write_text(f'{underlay(workspace.src)}\nexport PATH="{fake_bin}:$PATH"\n')
    env = dict(e.split("=", 1) for e in unit["Environment"])
    env.update(base_env(), EVA_WS=str(workspace.root), EVA_CONFIG=str(tmp_path / "robot.yaml"),
               RECORD=str(tmp_path / "record"))
    script = script[1:-1].replace("/opt/ros/${ROS_DISTRO}", str(fake_ros))
    proc = subprocess.run(["/bin/bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    recorded = (tmp_path / "record").read_text().splitlines()
    assert recorded[:4] == ["launch", "eva_export", "eva.launch.py", f"config:={tmp_path / 'robot.yaml'}"]
    assert Path(recorded[4]) == workspace.install / "eva_export" / "share" / "eva_export"


def test_systemd_analyze_verify(tmp_path):
    """`systemd-analyze verify` on the unit (tools/setup.sh installs systemd for it)."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze not found: tools/setup.sh installs the systemd package"
    unit = tmp_path / "eva_export.service"
    shutil.copy(UNIT_FILE, unit)
    proc = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    # systemd only warns (exit code 0) about unknown keys or bad values: any output fails
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr
