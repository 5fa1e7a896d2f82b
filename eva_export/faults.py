"""Fault points of a process a test starts: the one seam, read from one environment variable.

``EVA_FAULTS="point=value;point=value"`` arms points in the process that inherits it; unset, as in
production, it arms nothing. Each point is read where the code surely reaches it:

* ``check_hold=<dir>`` (export node): the first quality check writes ``<dir>/started``, then
  blocks opening the FIFO ``<dir>/release`` until the test opens it;
* ``save_hold=<dir>`` (capture save worker): each save attempt writes ``<dir>/held-<index>-<n>``
  and waits on ``<dir>/release``; the word read there decides: ``fail`` fails the attempt as a full
  disk does (ENOSPC), anything else lets it run;
* ``save_delay=<seconds>`` (capture save worker, bag ingest): each save starts that much later;
* ``deaf_intake=1`` (capture node): a first start subscribes to ``<topic>/__deaf``, so it hears
  nothing while the publishers are on the graph: the one state a deaf DDS restart produces.

In-process faults of an export job go through ``export/faults.py`` (a plan armed around the
service), not through here.
"""

from __future__ import annotations

import os

ENV = "EVA_FAULTS"


def spec(**points: str) -> str:
    """The value of ``EVA_FAULTS`` that arms ``points``."""
    return ";".join(f"{name}={value}" for name, value in points.items())


def env(**points: str) -> dict[str, str]:
    """The environment entry that arms ``points`` in a process a test starts."""
    return {ENV: spec(**points)}


def from_env(point: str) -> str:
    """The value armed for ``point`` in this process's environment; "" when none is."""
    for item in os.environ.get(ENV, "").split(";"):
        name, _, value = item.partition("=")
        if name == point:
            return value
    return ""
