"""The ``eva-export`` command's exit (cli.run): the interpreter's teardown is skipped, nothing the
program relies on is: its exit code, its printed result whole, non-daemon threads joined, atexit
handlers run, usage errors reported as argparse reports them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dsfactory import Ep, make_dataset

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)

WRAPPED = """
import atexit, sys, threading, time
from eva_export import cli

def late():
    ended.wait()  # main() has returned: only run()'s join lets this thread finish
    time.sleep(0.3)
    print("thread finished", flush=True)

ended = threading.Event()
main = cli.main
def wrapped(argv=None):
    try:
        return main(argv)
    finally:
        ended.set()
cli.main = wrapped
threading.Thread(target=late).start()
atexit.register(lambda: print("atexit ran", flush=True))
sys.argv = ["eva-export", *sys.argv[1:]]
cli.run()
"""


def command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "eva_export.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)


def test_an_export_prints_its_whole_result_and_exits_0(tmp_path: Path) -> None:
    raw = make_dataset(tmp_path / "ds" / "raw", [Ep(frames=4), Ep(frames=3, quality="red")])
    out = command("export", str(raw), "--format", "lerobot_v3")
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    assert job["state"] == "completed" and job["accepted_episodes"] == 1 and job["rejected_episodes"] == 1


def test_errors_keep_their_codes(tmp_path: Path) -> None:
    missing = command("export", str(tmp_path / "nothing"), "--format", "lerobot_v3")
    assert missing.returncode != 0 and "nothing" in missing.stderr
    usage = command("export")
    assert usage.returncode == 2 and "usage:" in usage.stderr
    helped = command("--help")
    assert helped.returncode == 0 and "usage:" in helped.stdout


def test_threads_are_joined_and_atexit_handlers_run(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", WRAPPED, "clean", str(tmp_path), "--older-than", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "thread finished" in lines and "atexit ran" in lines
    assert lines.index("thread finished") < lines.index("atexit ran")  # the interpreter's own order


KEPT_POOL = """
import sys
from concurrent.futures import ThreadPoolExecutor
from eva_export import cli

pool = ThreadPoolExecutor(2, thread_name_prefix="kept")  # a pool kept for the process, never shut down
print(pool.submit(sum, [1, 2]).result(), flush=True)
sys.argv = ["eva-export", *sys.argv[1:]]
cli.run()
"""


def test_a_thread_pool_kept_for_the_process_does_not_hold_the_exit(tmp_path: Path) -> None:
    # its idle workers end only when the interpreter's exit hooks tell them to: joined before
    # those hooks ran, the process waited for them forever
    out = subprocess.run([sys.executable, "-c", KEPT_POOL, "clean", str(tmp_path), "--older-than", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "3"


def test_an_mcap_export_of_episodes_over_a_chunk_exits(tmp_path: Path) -> None:
    # episodes larger than one MCAP chunk are compressed on the writer's kept thread pool
    raw = make_dataset(tmp_path / "ds" / "raw", [Ep(frames=30), Ep(frames=30)], width=320, height=240)
    out = command("export", str(raw), "--format", "mcap")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["state"] == "completed"
