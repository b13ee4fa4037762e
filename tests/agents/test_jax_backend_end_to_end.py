"""Agents on the actors' JAX env backend (``--env-backend jax``), through the experiment script
as a user runs it: the learners take the JAX actor's trajectories unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def script(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(REPO, "experiments", name), "--quiet", "--compilation-cache",
                           "", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_ppo_solves_cartpole_with_the_jax_backend_through_the_script(tmp_path):
    # A trajectory per dispatch outruns the learner, which dispatches updates ahead of their
    # results: the actors' data arrive ~8 versions old, beyond PPO's default max_policy_lag.
    done = script("ppo.py", "--run-dir", str(tmp_path), "--env-backend", "jax", "--stop-at-target",
                  "--epochs", "4", "--minibatches", "2", "--max-policy-lag", "12")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reached evaluation return 475" in done.stdout, done.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["final_return"] >= 475
    assert "JaxVectorEnv(CartPole-v1, num_envs=16" in (tmp_path / "logs" / "actor-0.log").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["impala.py", "apex_dqn.py"])
def test_the_other_agents_learn_from_the_jax_backends_trajectories(tmp_path, agent):
    done = script(agent, "--run-dir", str(tmp_path), "--env-backend", "jax", "--total-steps", "20000")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env_steps"] >= 20_000 and summary["final_return"] is not None
    assert "JaxVectorEnv(CartPole-v1" in (tmp_path / "logs" / "actor-0.log").read_text()


def test_actors_get_the_jax_backend_and_the_evaluator_gymnasiums_env():
    from jaxdist.agents import distributed, ppo

    config = ppo.PPOConfig(env_backend="jax")
    assert distributed.env_spec(config, 16).backend == "jax"
    assert distributed.env_spec(config, 10, evaluation=True).backend == "auto"
    assert distributed.env_spec(ppo.PPOConfig(env_backend="sync"), 10, evaluation=True).backend == "sync"
