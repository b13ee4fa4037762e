"""SAC and TD3 under ``--architecture anakin``: the transitions of the device replay, and a run of
two seeds vmapped that learns Pendulum-v1's JAX port with its replay in the learner's
checkpoints, plays back per seed, and resumes from them."""

from __future__ import annotations

import dataclasses
import io

import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist.agents import load_policy, sac, td3
from jaxdist.agents.experiment import anakin_logic, learner_template, restore_learner, with_preset
from jaxdist.agents.run import train
from jaxdist.agents.sac.anakin import one_step_transitions
from jaxdist.records.metrics import read_metrics


def test_trajectories_become_one_step_transitions_and_those_across_an_autoreset_are_not_valid():
    # Two envs, rows 0..3; env 1's row 1 ends its episode (terminated), env 0's row 2 (truncated).
    terminated = jnp.array([[0, 0, 0, 0], [0, 1, 0, 0]], bool)
    truncated = jnp.array([[0, 0, 1, 0], [0, 0, 0, 0]], bool)
    rows = {"obs": jnp.arange(8.0).reshape(2, 4, 1), "action": jnp.zeros((2, 4, 1)),
            "reward": jnp.arange(8.0).reshape(2, 4) * 10, "terminated": terminated, "truncated": truncated}
    got = one_step_transitions(rows, gamma=0.9)
    np.testing.assert_allclose(got["obs"][:, 0], [0, 1, 2, 4, 5, 6])
    np.testing.assert_allclose(got["next_obs"][:, 0], [1, 2, 3, 5, 6, 7])
    np.testing.assert_allclose(got["reward"], [10, 20, 30, 50, 60, 70])
    np.testing.assert_allclose(got["discount"], [0.9, 0.9, 0.9, 0.0, 0.9, 0.9])  # a truncation bootstraps
    np.testing.assert_allclose(got["valid"], [1, 1, 0, 1, 0, 1])


def test_anakin_refuses_what_its_device_replay_does_not_do():
    with pytest.raises(ValueError, match="drop --n-step"):
        sac.SACConfig(architecture="anakin", n_step=3)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("agent, resumes", [(sac, True), (td3, False)], ids=["sac", "td3"])
def test_two_vmapped_seeds_learn_pendulum_with_their_replay_checkpointed_and_resume(agent, resumes, tmp_path):
    """Both agents learn and checkpoint their replays; the resume, the same Anakin path for both
    (the learner's state restored whole, replay included), is run once."""
    config_type = sac.SACConfig if agent is sac else td3.TD3Config
    config = with_preset(config_type, "Pendulum-v1", agent.PRESETS, architecture="anakin", num_seeds=2,
                         total_steps=4_096, eval_every_updates=16, seed=3)
    record = agent.agent(config)
    train(record, launcher="threads", run_dir=str(tmp_path), echo=False, out=io.StringIO())
    rows = read_metrics(tmp_path / "evaluations.csv")
    for seed in range(2):
        returns = [row[f"seed/{seed}/mean_return"] for row in rows]
        assert max(returns[1:]) > returns[0] + 400, returns  # random: about -1,300

    topology = record.topology()
    restored = restore_learner(str(tmp_path), topology.checkpoints(str(tmp_path)),
                               learner_template(anakin_logic(record)), None, "")
    version = int(restored["step"])
    replay = restored["state"]["agent"]["replay"]
    env_steps_per_seed = version * config.trajectory_length * config.num_actors * config.envs_per_actor
    assert list(np.asarray(replay.current_index)) == [env_steps_per_seed] * 2  # every transition played, per seed
    assert load_policy(str(tmp_path), run_seed=1).act(np.zeros((2, 3), np.float32)).shape == (2, 1)
    if not resumes:
        return

    longer = dataclasses.replace(config, total_steps=5_120)
    summary = train(agent.agent(longer), launcher="threads", run_dir=str(tmp_path), echo=False, out=io.StringIO())
    assert summary["restored_step"] == version
    resumed = restore_learner(str(tmp_path), topology.checkpoints(str(tmp_path)),
                              learner_template(anakin_logic(record)), None, "")
    steps = int(resumed["step"]) * config.trajectory_length * config.num_actors * config.envs_per_actor
    assert int(resumed["step"]) > version
    assert list(np.asarray(resumed["state"]["agent"]["replay"].current_index)) == [steps] * 2  # kept, then added to
