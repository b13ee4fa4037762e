"""Chaos: SIGTERM to an agent's script while it trains on the processes launcher, then the same
command again on the same run directory: the relaunch carries on from exactly the state saved at
the stop, leaf for leaf.

ES is deterministic (its noise and start states are drawn from the seed and the generation), so
its relaunched run must end where a run that never stopped ends: the mean parameters, the
optimizer's moments, the generation and the env-step count, to the bit. Anything the stop left
unsaved, or the relaunch restored otherwise, makes them differ.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys

import chex
import pytest

from jaxdist.agents import es
from jaxdist.agents.run import parse, train
from jaxdist.records.metrics import read_metrics
from resume_checks import saved_state
from waiting import wait_until

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def script(name: str, run_dir: str, flags: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.join(REPO, "experiments", name), "--run-dir", run_dir, "--quiet",
                             "--compilation-cache", "", *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def rows(path: str) -> list[dict]:
    try:
        return read_metrics(path)
    except (OSError, ValueError):
        return []


def stop(process: subprocess.Popen) -> str:
    """SIGTERM, as a scheduler's preemption: the launch stops in order and exits 0."""
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=180)
    assert process.returncode == 0, output[-3000:]
    return output


@pytest.mark.timeout(400)
def test_es_relaunched_after_a_sigterm_ends_exactly_where_a_run_that_never_stopped_does(tmp_path):
    flags = ["--total-steps", "20000", "--seed", "3", "--checkpoint-every-generations", "1000"]
    run_dir, whole_dir = str(tmp_path / "stopped"), str(tmp_path / "whole")
    checkpoints = os.path.join(run_dir, "checkpoints", "master", "0")
    launch = script("es.py", run_dir, flags)
    try:
        wait_until(lambda: len(rows(os.path.join(run_dir, "metrics.csv"))) >= 2, "two generations", timeout=240)
        output = stop(launch)
    finally:
        launch.kill()
    stopped_at, state = saved_state(checkpoints)  # the stop's own save: the interval never came
    assert "the launcher got SIGTERM" in output, output[-3000:]
    assert state["generation"] == stopped_at >= 2 and state["env_steps"] < 20_000

    relaunch = script("es.py", run_dir, flags)
    output, _ = relaunch.communicate(timeout=300)
    assert relaunch.returncode == 0, output[-3000:]
    assert f"resuming from the learner's checkpoint at update {stopped_at} (" in output, output[-3000:]

    config, _ = parse(es.ESConfig, es.PRESETS, None, args=flags)
    train(es.agent(config), launcher="threads", run_dir=whole_dir, echo=False, out=io.StringIO())
    end, resumed = saved_state(checkpoints)
    assert end > stopped_at and resumed["env_steps"] >= 20_000
    chex.assert_trees_all_equal(resumed, saved_state(os.path.join(whole_dir, "checkpoints", "master", "0"))[1])
    # One metrics row per generation across both segments, as the run that never stopped wrote them.
    learned = ("step", "population_return", "population_best", "grad_norm", "env_steps")
    assert [[row[k] for k in learned] for row in rows(os.path.join(run_dir, "metrics.csv"))] == \
        [[row[k] for k in learned] for row in rows(os.path.join(whole_dir, "metrics.csv"))]
