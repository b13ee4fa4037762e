"""SAC's math against NumPy references written from the paper's definitions: the squashed
Gaussian's log-probability, Polyak averaging, the clipped double-Q soft target, action scaling,
the temperature's direction, the actors' random start, n-step transitions, and the refusal of
a discrete action space."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist.agents import sac
from jaxdist.agents.sac import SACConfig
from jaxdist.agents.sac import learning
from off_policy_data import ENV, transitions

CONFIG = SACConfig(hidden=(16, 16), update_batch=8, learning_starts=8)


def test_the_squashed_log_probability_is_the_gaussians_less_the_tanh_jacobian():
    rng = np.random.default_rng(0)
    u = rng.normal(scale=3.0, size=(64, 2))
    mean, log_std = rng.normal(size=(64, 2)), rng.uniform(-2, 1, size=(64, 2))
    std = np.exp(log_std)
    gaussian = -0.5 * ((u - mean) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)
    expected = np.sum(gaussian - np.log(1 - np.tanh(u) ** 2), axis=-1)
    got = learning.squashed_log_prob(jnp.asarray(u, jnp.float32), jnp.asarray(mean, jnp.float32),
                                     jnp.asarray(log_std, jnp.float32))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)


def test_the_squashed_log_probability_stays_finite_where_tanh_saturates():
    u = jnp.array([[30.0, -30.0]])
    logp = learning.squashed_log_prob(u, jnp.zeros_like(u), jnp.zeros_like(u))
    assert np.isfinite(logp).all()  # log(1 - tanh(30)^2) in float32 is log(0)


def test_a_squashed_sample_lies_in_the_unit_box_with_its_own_log_probability():
    mean, log_std = jnp.full((1000, 2), 0.5), jnp.full((1000, 2), 0.3)
    action, logp = learning.squashed_sample(mean, log_std, jax.random.key(0))
    assert float(jnp.max(jnp.abs(action))) <= 1.0
    np.testing.assert_allclose(logp, learning.squashed_log_prob(jnp.arctanh(action), mean, log_std), rtol=1e-3,
                               atol=1e-2)


def test_polyak_moves_each_leaf_tau_of_the_way_to_the_online_one():
    online, target = {"w": np.array([1.0, 2.0]), "b": np.array(3.0)}, {"w": np.array([0.0, 0.0]), "b": np.array(1.0)}
    moved = learning.polyak(online, target, 0.1)
    np.testing.assert_allclose(moved["w"], [0.1, 0.2])
    np.testing.assert_allclose(moved["b"], 0.1 * 3.0 + 0.9 * 1.0)


def test_the_twin_target_bootstraps_from_the_smaller_critic_with_the_entropy_bonus():
    reward, discount = jnp.array([1.0, 2.0]), jnp.array([0.9, 0.0])
    q_next = jnp.array([[5.0, 7.0], [4.0, 9.0]])
    bonus = jnp.array([0.5, 0.5])
    np.testing.assert_allclose(learning.twin_target(reward, discount, q_next, bonus), [1.0 + 0.9 * 4.5, 2.0])


def test_actions_scale_to_the_envs_bounds_and_back():
    unit = jnp.array([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.5]])
    scaled = learning.to_env(ENV.action, unit)
    np.testing.assert_allclose(scaled, [[-2.0, 0.0], [2.0, 1.0], [0.0, 0.75]])
    np.testing.assert_allclose(learning.from_env(ENV.action, scaled), unit, atol=1e-6)


@functools.lru_cache(maxsize=None)
def jitted_update(config):
    return jax.jit(functools.partial(learning.update, config, ENV))


def test_the_temperature_rises_when_entropy_is_below_its_target_and_falls_when_above():
    log_alpha = jnp.float32(0.0)
    opt_state = learning.adam(CONFIG).init(log_alpha)
    logp = jnp.array([1.0, 3.0])  # entropy about -2
    below, _ = learning.temperature_step(CONFIG, log_alpha, opt_state, logp, 0.0)
    above, _ = learning.temperature_step(CONFIG, log_alpha, opt_state, logp, -5.0)
    assert float(below) > 0.0 > float(above)
    fixed = dataclasses.replace(CONFIG, autotune_alpha=False)
    assert float(learning.temperature_step(fixed, log_alpha, opt_state, logp, 0.0)[0]) == 0.0


def test_an_update_moves_the_target_critics_by_polyak_only_and_a_fixed_temperature_stays():
    config = dataclasses.replace(CONFIG, tau=0.25, autotune_alpha=False, initial_alpha=0.2)
    start = learning.init(config, ENV, jax.random.key(1))
    state, metrics = jitted_update(config)(start, transitions(), jax.random.key(2))
    expected = learning.polyak(state["critic"], start["target_critic"], 0.25)
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7),
                 state["target_critic"], expected)
    assert int(state["updates"]) == 1
    np.testing.assert_allclose(jnp.exp(state["log_alpha"]), 0.2, rtol=1e-6)
    assert {"critic_loss", "q_mean", "policy_loss", "alpha", "entropy"} <= set(metrics)
    assert "priorities" not in metrics


def test_a_prioritized_update_weights_its_loss_and_returns_a_priority_per_transition():
    config = dataclasses.replace(CONFIG, prioritized=True)
    state = learning.init(config, ENV, jax.random.key(0))
    batch = {"data": transitions(), "probabilities": np.full(8, 1 / 100, np.float32), "keys": np.arange(8)}
    _, metrics = jitted_update(config)(state, batch, jax.random.key(1))
    assert metrics["priorities"].shape == (8,) and bool(jnp.all(metrics["priorities"] >= 0))


def test_the_actors_act_at_random_until_the_first_update_then_sample_the_policy():
    params = learning.published(learning.init(CONFIG, ENV, jax.random.key(0)))
    obs = jnp.zeros((512, 3))
    explore, deterministic = learning.policy(CONFIG, ENV, 0), learning.policy(CONFIG, ENV, None)
    random_actions, _ = explore(params, obs, jax.random.key(1))  # one obs: a policy's samples cluster
    assert float(jnp.std(random_actions[:, 0])) > 1.0  # uniform on [-2, 2]: std 1.15
    assert np.all((random_actions >= np.array(ENV.action.low)) & (random_actions <= np.array(ENV.action.high)))
    mean_action, _ = deterministic(params, obs, jax.random.key(1))
    assert float(jnp.max(jnp.std(mean_action, axis=0))) == 0.0  # evaluation never explores
    learned = dict(params, warmup=jnp.bool_(False))
    sampled, _ = explore(learned, obs, jax.random.key(1))
    assert float(jnp.std(sampled[:, 0])) < float(jnp.std(random_actions[:, 0]))


def test_trajectories_become_n_step_transitions_that_stop_at_episode_ends():
    # One env, rows 0..4; row 2 ends its episode (terminated), so the transition out of it is not real.
    rows = {"obs": np.arange(5, dtype=np.float32)[:, None].repeat(3, 1),
            "action": np.zeros((5, 2), np.float32), "reward": np.array([0, 1, 2, 3, 4], np.float32),
            "terminated": np.array([0, 0, 1, 0, 0], bool), "truncated": np.zeros(5, bool)}
    got = learning.to_transitions([rows], gamma=0.5, n_step=2)
    np.testing.assert_allclose(got["obs"][:, 0], [0, 1, 3])
    np.testing.assert_allclose(got["reward"], [1 + 0.5 * 2, 2, 4])
    np.testing.assert_allclose(got["discount"], [0.0, 0.0, 0.5])  # both of the first reach the terminal row
    np.testing.assert_allclose(got["next_obs"][:, 0], [2, 2, 4])


def test_the_replay_table_holds_the_replay_ratio_and_is_prioritized_on_request():
    table = sac.replay_table(dataclasses.replace(CONFIG, replay_ratio=0.5))
    assert table.rate_limiter.samples_per_insert == 0.5 * CONFIG.update_batch
    assert table.rate_limiter.min_size == CONFIG.learning_starts
    assert "Prioritized" in repr(sac.replay_table(dataclasses.replace(CONFIG, prioritized=True)))


def test_updates_are_the_env_steps_after_learning_starts_times_the_replay_ratio():
    config = SACConfig(total_steps=20_000, learning_starts=1_000, replay_ratio=0.5)
    assert config.total_updates == 9_500


def test_a_discrete_action_space_is_refused_naming_the_agents_that_act_in_it():
    with pytest.raises(ValueError, match=r"SAC acts in continuous \(Box\) action spaces and CartPole-v1's actions "
                                         r"are discrete: use PPO .*IMPALA .*Ape-X"):
        sac.agent(SACConfig(env_id="CartPole-v1"))


@pytest.mark.parametrize("fields, error", [
    ({"update_batch": 512, "learning_starts": 256}, "need update_batch"),
    ({"replay_ratio": 0.0}, "replay_ratio must be > 0"),
    ({"tau": 1.5}, r"tau must be in \[0, 1\]"),
    ({"network": "cnn"}, "critics take an observation and an action"),
    ({"architecture": "anakin", "prioritized": True}, "drop --prioritized"),
])
def test_bad_settings_are_refused_by_name(fields, error):
    with pytest.raises(ValueError, match=error):
        SACConfig(**fields)
