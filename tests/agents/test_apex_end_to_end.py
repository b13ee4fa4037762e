"""Ape-X DQN end to end: its experiment script as a user runs it (processes, the README's
configuration and target, its actors on the JAX env backend), and a relaunch on gymnasium's envs
that resumes with its replay and learner step."""

from __future__ import annotations

import dataclasses
import io
import os
import re
import subprocess
import sys

import pytest

from jaxdist.agents import apex
from jaxdist.agents.apex import ApexConfig
from jaxdist.agents.run import train
from jaxdist.records.metrics import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_script_solves_cartpole_across_processes_on_the_jax_backends_transitions(tmp_path):
    done = subprocess.run([sys.executable, os.path.join(REPO, "experiments", "apex_dqn.py"), "--run-dir",
                           str(tmp_path), "--stop-at-target", "--quiet", "--compilation-cache", "", "--env-backend",
                           "jax"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reached evaluation return 475" in done.stdout, done.stdout
    assert "JaxVectorEnv(CartPole-v1" in (tmp_path / "logs" / "actor-0.log").read_text()
    rows = read_metrics(tmp_path / "metrics.csv")  # the learner's
    assert rows and {"loss", "q_mean", "td_abs_mean", "importance_weight_mean"} <= set(rows[-1])
    assert "priorities" not in rows[-1]  # the priority writer's, sent to the replay, not logged
    assert rows[-1]["q_mean"] > rows[0]["q_mean"]  # values grow as episodes lengthen


@pytest.mark.slow
def test_a_relaunched_run_resumes_with_its_replay_and_learner_step(tmp_path, capsys):
    # The first run ends at its step budget and saves the replay at the stop; the second, on
    # the same run directory, starts from both instead of refilling min_replay.
    config = ApexConfig(num_actors=2, envs_per_actor=4, total_steps=4_000, min_replay=500, seed=2,
                        log_every_updates=50)
    train(apex.agent(config), launcher="threads", run_dir=str(tmp_path), echo=False, out=io.StringIO())
    assert "restored" not in capsys.readouterr().out
    first = read_metrics(tmp_path / "metrics.csv")[-1]["step"]
    train(apex.agent(dataclasses.replace(config, total_steps=6_000)), launcher="threads", run_dir=str(tmp_path),
          echo=False, out=io.StringIO())
    log = capsys.readouterr().out  # the threads launcher's nodes print here
    restored = re.findall(r"replay node learner/0/0 restored checkpoint step \d+ \(default: (\d+)", log)
    assert restored and int(restored[-1]) >= config.min_replay, log[-3000:]
    assert f"learner/0/1: restored step {first}" in log
