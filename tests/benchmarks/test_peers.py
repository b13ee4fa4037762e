"""The peers benchmark's memory sampler (``experiments/benchmarks/peers.py``)."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments",
                                "benchmarks"))

from peers import tree_rss  # noqa: E402


def test_tree_rss_of_a_process_that_has_exited_is_zero() -> None:
    """The sampler thread samples until the process ends: a last sample can find it gone."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    watched = psutil.Process(child.pid)
    assert tree_rss(watched) >= 0
    child.wait()
    assert tree_rss(watched) == 0
