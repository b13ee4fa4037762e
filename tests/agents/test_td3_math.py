"""TD3's math: target policy smoothing within its clips, delayed policy and target updates,
each actor's exploration noise, and the refusal of a discrete action space."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist.agents import td3
from jaxdist.agents.sac.learning import polyak
from jaxdist.agents.td3 import TD3Config
from jaxdist.agents.td3 import learning

from off_policy_data import ENV, transitions

CONFIG = TD3Config(hidden=(16, 16), update_batch=8, learning_starts=8, policy_delay=2, tau=0.5)


def test_target_smoothing_noise_is_clipped_and_the_action_stays_in_the_unit_box():
    action = jnp.array([[0.0, 0.95]]).repeat(4096, axis=0)
    smoothed = learning.smoothed_target_action(action, jax.random.key(0), noise=1.0, clip=0.3)
    assert float(jnp.max(jnp.abs(smoothed[:, 0]))) == pytest.approx(0.3)  # noise of std 1 clipped at 0.3
    assert float(jnp.max(smoothed[:, 1])) == 1.0 and float(jnp.min(smoothed[:, 1])) == pytest.approx(0.65)
    assert float(jnp.std(smoothed[:, 0])) > 0.2  # and noise it is


def test_the_policy_and_the_targets_move_only_every_policy_delay_updates():
    update = jax.jit(functools.partial(learning.update, CONFIG, ENV))
    start = learning.init(CONFIG, ENV, jax.random.key(0))
    first, _ = update(start, transitions(seed=1), jax.random.key(1))
    same = lambda a, b: jax.tree.map(np.testing.assert_array_equal, a, b)  # noqa: E731
    same(first["policy"], start["policy"])
    same(first["target_policy"], start["target_policy"])
    same(first["target_critic"], start["target_critic"])
    assert not np.array_equal(jax.tree.leaves(first["critic"])[0], jax.tree.leaves(start["critic"])[0])
    second, metrics = update(first, transitions(seed=2), jax.random.key(2))
    assert not np.array_equal(jax.tree.leaves(second["policy"])[0], jax.tree.leaves(first["policy"])[0])
    close = lambda a, b: jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7), a, b)  # noqa: E731
    close(second["target_policy"], polyak(second["policy"], first["target_policy"], 0.5))
    close(second["target_critic"], polyak(second["critic"], first["target_critic"], 0.5))
    assert int(second["updates"]) == 2 and {"critic_loss", "q_mean"} <= set(metrics)


def test_each_actor_explores_with_its_own_noise_and_the_evaluator_with_none():
    config = TD3Config(hidden=(16, 16), num_actors=3, exploration_noise=0.05, exploration_noise_max=0.8)
    np.testing.assert_allclose([config.actor_noise(i) for i in range(4)], [0.05, 0.2, 0.8, 0.05])
    assert TD3Config(num_actors=3).actor_noise(2) == 0.1
    params = dict(learning.published(learning.init(CONFIG, ENV, jax.random.key(0))), warmup=jnp.bool_(False))
    obs = jnp.zeros((2048, 3))
    spread = [float(jnp.std(learning.policy(config, ENV, i)(params, obs, jax.random.key(i))[0][:, 0]))
              for i in (0, 2)]
    assert spread[0] < spread[1]
    assert float(jnp.max(jnp.std(learning.policy(config, ENV, None)(params, obs, jax.random.key(0))[0], axis=0))) == 0.0


def test_a_discrete_action_space_is_refused_naming_the_agents_that_act_in_it():
    with pytest.raises(ValueError, match=r"TD3 acts in continuous \(Box\) action spaces .*use PPO"):
        td3.agent(TD3Config(env_id="CartPole-v1"))
