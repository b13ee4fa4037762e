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
from peers import tree_memory  # noqa: E402


def test_tree_memory_of_a_process_that_has_exited_is_zero() -> None:
    """The sampler thread samples until the process ends: a last sample can find it gone."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    watched = psutil.Process(child.pid)
    assert tree_memory(watched) >= 0
    child.wait()
    assert tree_memory(watched) == 0


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


def test_each_peer_is_timed_against_the_jaxdist_run_it_stands_beside() -> None:
    """On Pendulum-v1 two jaxdist agents run, SAC and TD3: SB3's SAC is divided by jaxdist's SAC,
    its TD3 by jaxdist's TD3, never by whichever jaxdist run came first."""
    from peers import COMPARISONS, table

    comparison = COMPARISONS["Pendulum-v1"]
    wall = {"jaxdist SAC (processes launcher)": 10.0, "jaxdist TD3 (processes launcher)": 20.0,
            "Stable-Baselines3 SAC (PyTorch, CPU)": 30.0, "Stable-Baselines3 TD3 (PyTorch, CPU)": 30.0}
    results = {name: {0: {"wall_time_to_target": seconds, "steps_to_target": 5000, "env_steps": 5000,
                          "steps_per_second": 500, "peak_memory": 2 ** 30}} for name, seconds in wall.items()}
    rows = {line.split(" | ")[0].lstrip("| "): line.rsplit(" | ", 1)[1].rstrip(" |")
            for line in table(results, comparison, [0], "peers.py").splitlines() if line.startswith("| ") and "x |" in line}
    assert rows == {"jaxdist SAC (processes launcher)": "1.00x", "jaxdist TD3 (processes launcher)": "1.00x",
                    "Stable-Baselines3 SAC (PyTorch, CPU)": "3.00x", "Stable-Baselines3 TD3 (PyTorch, CPU)": "1.50x"}
    assert "| run | reached -200 |" in table(results, comparison, [0], "peers.py")


def test_a_peer_stopped_short_of_the_target_is_slower_by_at_least_its_time_to_the_stop() -> None:
    """With ``--peer-timeout`` at five times jaxdist's time, a peer stopped there has shown the
    five times: its ratio is a lower bound, never a blank."""
    from peers import COMPARISONS, ratio

    assert "HalfCheetah-v5" in COMPARISONS and COMPARISONS["HalfCheetah-v5"].target == 5_000.0
    jaxdist = {0: 250.0, 1: 300.0}
    stopped = {"wall_time_to_target": None, "wall_time": 1_500.0}
    assert ratio({0: stopped, 1: dict(stopped)}, jaxdist) == ">5.50x"  # 6.0 and 5.0
    assert ratio({0: stopped, 1: {"wall_time_to_target": 600.0}}, jaxdist) == ">4.00x"  # 6.0 and 2.0
    assert ratio({0: {"wall_time_to_target": 500.0}, 1: {"wall_time_to_target": 600.0}}, jaxdist) == "2.00x"
    assert ratio({0: {"wall_time_to_target": None}}, {0: None}) == "-"


def test_only_picks_the_runs_whose_names_hold_the_word() -> None:
    """``--only SAC`` runs jaxdist's and SB3's SAC on HalfCheetah, not their TD3; words match
    whole words of the name, case aside."""
    from peers import COMPARISONS, chosen

    names = [*COMPARISONS["HalfCheetah-v5"].jaxdist, *COMPARISONS["HalfCheetah-v5"].peers]
    assert [name for name in names if chosen(name, ["SAC"])] == [
        "jaxdist SAC (processes launcher)", "jaxdist SAC, replay ratio 0.5 (processes launcher)",
        "Stable-Baselines3 SAC (PyTorch, CPU)"]
    assert [name for name in names if chosen(name, ["td3", "jaxdist"])] == [
        "jaxdist SAC (processes launcher)", "jaxdist SAC, replay ratio 0.5 (processes launcher)",
        "jaxdist TD3 (processes launcher)", "jaxdist TD3, replay ratio 0.5 (processes launcher)",
        "Stable-Baselines3 TD3 (PyTorch, CPU)"]
    assert all(chosen(name, None) for name in names)


def test_a_peer_is_also_timed_against_its_agents_runs_with_other_flags() -> None:
    """On HalfCheetah jaxdist's SAC also runs at a replay ratio of 0.5: SB3's SAC stays divided by
    the run with its own hyperparameters in its row, and the table says its ratio over the other
    SAC run too (never over a TD3 run)."""
    from peers import COMPARISONS, table

    comparison = COMPARISONS["HalfCheetah-v5"]
    wall = {"jaxdist SAC (processes launcher)": 400.0, "jaxdist SAC, replay ratio 0.5 (processes launcher)": 250.0,
            "Stable-Baselines3 SAC (PyTorch, CPU)": 800.0}
    results = {name: {0: {"wall_time_to_target": seconds, "steps_to_target": 100_000, "env_steps": 100_000,
                          "steps_per_second": 300, "peak_memory": 2 ** 30}} for name, seconds in wall.items()}
    text = table(results, comparison, [0], "peers.py")
    assert "| Stable-Baselines3 SAC (PyTorch, CPU) | 1 of 1 | 800 | 100,000 | 300 | 1,024 | 2.00x |" in text
    assert ("Stable-Baselines3 SAC (PyTorch, CPU)'s wall time over jaxdist SAC, replay ratio 0.5 (processes "
            "launcher)'s: 3.20x (median over the seeds).") in text
    assert "TD3" not in text
