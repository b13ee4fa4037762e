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
def test_ppo_solves_cartpole_with_the_jax_backend_through_the_script_on_fresh_data(tmp_path):
    """A trajectory per dispatch outruns the learner. Its updates used to be dispatched ahead of
    their results, so the actors' data arrived 5-30 versions old and most of it was thrown away;
    now each update waits for the one before it, and the lag is the pipeline's: the batch in the
    queue, the send waiting behind it, the update running, about 4-6 versions, which the JAX
    backend's preset allows."""
    from jaxdist.metrics import read_metrics

    done = script("ppo.py", "--run-dir", str(tmp_path), "--env-backend", "jax", "--stop-at-target")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reached evaluation return 475" in done.stdout, done.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["final_return"] >= 475
    assert "JaxVectorEnv(CartPole-v1, num_envs=16" in (tmp_path / "logs" / "actor-0.log").read_text()
    rows = read_metrics(tmp_path / "metrics.csv")
    assert max(row["stale_fraction"] for row in rows) == 0.0


@pytest.mark.slow
def test_ppo_learns_pendulum_with_the_jax_backend(tmp_path):
    """Pendulum's preset allows a lag of 2, which JAX-backend data always exceeds: every update
    threw its whole batch away and nothing was learned. Its backend preset allows 6."""
    done = script("ppo.py", "--env-id", "Pendulum-v1", "--run-dir", str(tmp_path), "--env-backend", "jax",
                  "--stop-at-target")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reached evaluation return -250" in done.stdout, done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["impala.py", "apex_dqn.py"])
def test_the_other_agents_learn_from_the_jax_backends_trajectories(tmp_path, agent):
    done = script(agent, "--run-dir", str(tmp_path), "--env-backend", "jax", "--total-steps", "20000")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env_steps"] >= 20_000 and summary["final_return"] is not None
    assert "JaxVectorEnv(CartPole-v1" in (tmp_path / "logs" / "actor-0.log").read_text()


def test_a_backend_preset_comes_over_the_envs_and_under_the_flags():
    from jaxdist.agents import ppo
    from jaxdist.agents.cli import parse

    gymnasium, _ = parse(ppo.PPOConfig, ppo.PRESETS, None, ["--env-id", "Pendulum-v1"])
    jax_backend, _ = parse(ppo.PPOConfig, ppo.PRESETS, None, ["--env-id", "Pendulum-v1", "--env-backend", "jax"])
    flagged, _ = parse(ppo.PPOConfig, ppo.PRESETS, None, ["--env-id", "Pendulum-v1", "--env-backend=jax",
                                                          "--max-policy-lag", "3"])
    assert (gymnasium.max_policy_lag, jax_backend.max_policy_lag, flagged.max_policy_lag) == (2, 6, 3)
    assert jax_backend.trajectory_length == gymnasium.trajectory_length == 256  # the env's preset still holds
    assert jax_backend.env_backend == "jax"


def test_the_actors_and_the_evaluator_play_the_configured_backend():
    from jaxdist.agents import distributed, ppo

    assert distributed.env_spec(ppo.PPOConfig(env_backend="jax"), 16).backend == "jax"
    assert distributed.env_spec(ppo.PPOConfig(env_backend="sync"), 10).backend == "sync"
