"""MinAtar's games (gymnax's) under their gymnax ids: gymnasium's spaces and ``sync`` envs, the
JAX version the agents' JAX backend and Anakin play, PPO's MinAtar preset on them, and Ape-X's
and R2D2's actors playing them on the JAX backend into their replays."""

from __future__ import annotations

import gymnasium as gym
import jax
import numpy as np
import pytest

from jaxdist.agents import apex, ppo, r2d2
from jaxdist.agents.experiment import with_preset
from jaxdist.envs import gymnax_as_gym
from jaxdist.envs.gymnax_as_gym import MINATAR_IDS
from jaxdist.envs.spaces import env_info
from jaxdist.envs.vector import EnvSpec
from jaxdist.learning import anakin

CHANNELS = {"Breakout-MinAtar": 4, "SpaceInvaders-MinAtar": 6, "Asterix-MinAtar": 4, "Freeway-MinAtar": 7}


@pytest.mark.parametrize("env_id", MINATAR_IDS)
def test_each_game_is_known_to_gymnasium_with_its_grid_and_actions(env_id):
    info = env_info(env_id)
    assert info.obs_shape == (10, 10, CHANNELS[env_id]) and info.obs_dtype == "float32"
    assert info.action.discrete and info.action.num_actions >= 3


def test_a_gymnasium_episode_steps_to_its_end_with_grids_of_zeros_and_ones():
    gymnax_as_gym.register()
    env = gym.make("Breakout-MinAtar")
    obs, _ = env.reset(seed=3)
    rng = np.random.default_rng(0)
    total, steps, ended = 0.0, 0, False
    while not ended:
        obs, reward, terminated, truncated, _ = env.step(int(rng.integers(3)))
        assert obs.shape == (10, 10, 4) and set(np.unique(obs)) <= {0.0, 1.0}
        total, steps, ended = total + reward, steps + 1, terminated or truncated
    assert 0 < steps <= 1000 and total >= 0
    env.close()


def test_the_gymnasium_env_and_the_jax_version_play_the_same_game_from_the_same_key():
    gymnax_as_gym.register()
    env = gym.make("Breakout-MinAtar").unwrapped
    env.reset(seed=5)
    jax_version = env._env  # the JAX env the agents' JAX backend and Anakin play
    key = jax.random.key(5)
    key, reset_key = jax.random.split(key)
    state, obs = jax_version.reset(reset_key)
    for action in [0, 1, 2, 2, 1, 0, 1, 2]:
        key, step_key = jax.random.split(key)
        expected = jax_version.step(state, np.int32(action), step_key)
        got = env.step(action)
        np.testing.assert_array_equal(got[0], np.asarray(expected.obs))
        assert got[1] == float(expected.reward) and got[2] == bool(expected.terminated)
        state = expected.state


def test_sync_vector_envs_of_a_game_autoreset_as_the_actors_expect():
    env = EnvSpec("SpaceInvaders-MinAtar", 2, backend="sync").make(seed=0)
    first = env.reset()
    assert first.obs.shape == (2, 10, 10, 6) and first.first.all()
    step = env.step(np.array([0, 3]))
    assert step.obs.shape == (2, 10, 10, 6) and not step.first.any()
    env.close()


def test_ppos_minatar_preset_trains_with_minatars_cnn_under_anakin():
    config = with_preset(ppo.PPOConfig, "Breakout-MinAtar", ppo.PRESETS, architecture="anakin", envs_per_actor=4,
                         trajectory_length=8, minibatches=2)
    assert config.network == "cnn" and config.target_return == 28.0
    agent = ppo.agent(config)
    logic = anakin.logic(agent.part("learner_logic", config, agent.env), agent.part("policy", config, agent.env, 0),
                         agent.part("policy", config, agent.env, None), config.env_id, 4, 8, eval_every=1000)
    state = logic.init(jax.random.key(0))
    assert state["agent"]["params"]["params"]["torso"]["Conv_0"]["kernel"].shape == (1, 3, 3, 4, 16)  # seed axis
    state, metrics = jax.jit(logic.update)(state, {}, jax.random.key(1))
    assert int(metrics["env_steps"]) == 4 * 8 and np.isfinite(np.asarray(metrics["loss"])).all()


@pytest.mark.slow
@pytest.mark.parametrize("name,fields", [
    ("apex", {"trajectory_length": 8, "batch_size": 8, "min_replay": 8}),
    ("r2d2", {"trajectory_length": 4, "burn_in": 4, "sequence_length": 8, "batch_size": 2, "min_replay": 2}),
])
def test_the_replay_agents_preset_play_minatar_on_the_jax_backend_with_minatars_cnn_and_learn(tmp_path, name, fields):
    from replay_actors import act_into_replay

    module = {"apex": apex, "r2d2": r2d2}[name]
    config_type = {"apex": apex.ApexConfig, "r2d2": r2d2.R2D2Config}[name]
    config = with_preset(config_type, "Breakout-MinAtar", module.PRESETS, num_actors=1, envs_per_actor=2, **fields)
    assert (config.network, config.env_backend) == ("cnn", "jax")
    played = act_into_replay(module.agent(config), str(tmp_path), max_steps=2 * 4 * config.trajectory_length)
    assert played["stored"] >= config.batch_size and played["sample"]["obs"].shape[-3:] == (10, 10, 4)
    kernels = {leaf.shape for leaf in jax.tree.leaves(played["state"]["params"]) if leaf.ndim == 4}
    assert kernels == {(3, 3, 4, 16)}  # MinAtar's one convolution, not the Nature CNN's three
    assert int(played["state"]["updates"]) == 1 and np.isfinite(np.asarray(played["metrics"]["loss"]))
