"""The peers benchmark's memory sampler (``experiments/benchmarks/peers.py``) and its peers' clock
(``peer_loops/peer_clock.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments",
                          "benchmarks")
sys.path[:0] = [BENCHMARKS, os.path.join(BENCHMARKS, "peer_loops")]

from peer_clock import Clock  # noqa: E402
from peers import tree_rss  # noqa: E402


def test_tree_rss_of_a_process_that_has_exited_is_zero() -> None:
    """The sampler thread samples until the process ends: a last sample can find it gone."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    watched = psutil.Process(child.pid)
    assert tree_rss(watched) >= 0
    child.wait()
    assert tree_rss(watched) == 0


def test_a_peers_evaluations_count_towards_its_time_to_the_target_not_against_its_training_rate(capsys) -> None:
    """The peers evaluate in their training loop: SB3's steady rate once counted its evaluations'
    seconds as training, where jaxdist's evaluator runs beside its actors."""
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        clock = Clock()
        clock.updated(0)
        time.sleep(0.2)  # training
        clock.updated(1000)
        assert clock.evaluate(lambda: time.sleep(0.6) or 500.0, 1000)
        clock.report(1000)
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    result = json.loads(capsys.readouterr().out.split("PEER_RESULT ", 1)[1])
    assert result["steps_to_target"] == 1000 and result["wall_time_to_target"] >= 0.8
    assert 2_500 < result["steps_per_second"] <= 5_000  # 1,000 steps in 0.2 s of training, not in 0.8 s
