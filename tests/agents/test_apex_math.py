"""Ape-X DQN's math against NumPy references written from the paper's definitions: n-step
returns truncated at episode ends and at the trajectory's end, the actors' initial priorities,
double-DQN targets, importance weights, the epsilon schedule, and the update itself."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist.agents.apex import learning
from jaxdist.agents.apex import ApexConfig
from jaxdist.envs.spaces import ActionSpace, EnvInfo

CONFIG = ApexConfig(hidden=(16, 16), target_update_period=3)
ENV = EnvInfo((4,), "float32", ActionSpace(num_actions=3))


# n-step returns --------------------------------------------------------------------------------


def n_step_reference(reward, terminated, truncated, q_online, q_target, gamma, n):
    """Plain loops over rows (T + 1, envs): for each real transition t,
    R = sum_{k<m} gamma^k r_{t+k+1} + gamma^m Q_target(s_{t+m}, argmax_a Q_online(s_{t+m}, a)),
    where m <= n stops at the row that ends the episode (no bootstrap if it is terminal) or at
    the trajectory's last row. None marks transitions that cross an autoreset."""
    rows, envs = reward.shape
    targets = np.full((rows - 1, envs), np.nan)
    for b in range(envs):
        for t in range(rows - 1):
            if terminated[t, b] or truncated[t, b]:
                continue  # row t ended its episode: the next row is an autoreset
            total, m = 0.0, 0
            while True:
                m += 1
                total += gamma ** (m - 1) * reward[t + m, b]
                if terminated[t + m, b] or truncated[t + m, b] or m == n or t + m == rows - 1:
                    break
            if not terminated[t + m, b]:
                best = int(np.argmax(q_online[t + m, b]))
                total += gamma**m * q_target[t + m, b, best]
            targets[t, b] = total
    return targets


def random_rows(seed, rows=30, envs=5, actions=3):
    rng = np.random.default_rng(seed)
    reward = rng.normal(size=(rows, envs)).astype(np.float32)
    terminated = rng.random((rows, envs)) < 0.12
    truncated = (rng.random((rows, envs)) < 0.06) & ~terminated
    q_online = rng.normal(size=(rows, envs, actions)).astype(np.float32)
    q_target = rng.normal(size=(rows, envs, actions)).astype(np.float32)
    return reward, terminated, truncated, q_online, q_target


@pytest.mark.parametrize("n", [1, 3, 5])
@pytest.mark.parametrize("seed", [0, 1])
def test_n_step_targets_match_a_plain_loop_across_episode_ends(n, seed):
    reward, terminated, truncated, q_online, q_target = random_rows(seed)
    gamma = 0.97
    returns, discounts, bootstrap, real = learning.n_step_returns(reward, terminated, truncated, gamma, n)
    q_next_online = np.take_along_axis(q_online, bootstrap[..., None], axis=0)
    q_next_target = np.take_along_axis(q_target, bootstrap[..., None], axis=0)
    targets = np.asarray(learning.double_q_targets(returns, discounts, q_next_online, q_next_target))
    expected = n_step_reference(reward, terminated, truncated, q_online, q_target, gamma, n)
    np.testing.assert_array_equal(real, ~np.isnan(expected))
    np.testing.assert_allclose(targets[real], expected[real], rtol=1e-5, atol=1e-5)
    assert (returns[~real] == 0).all() and (discounts[~real] == 0).all()


def test_n_step_hand_worked_example():
    # One env, rows 0..5: the episode terminates at row 2, a new one starts at row 3 (autoreset)
    # and is truncated at row 5, the trajectory's last row.
    reward = np.array([0.0, 1.0, 2.0, 0.0, 4.0, 8.0], np.float32)[:, None]
    terminated = np.array([0, 0, 1, 0, 0, 0], bool)[:, None]
    truncated = np.array([0, 0, 0, 0, 0, 1], bool)[:, None]
    returns, discounts, bootstrap, real = learning.n_step_returns(reward, terminated, truncated, 0.5, 3)
    np.testing.assert_array_equal(real[:, 0], [True, True, False, True, True])
    np.testing.assert_allclose(returns[:, 0], [1 + 0.5 * 2, 2, 0, 4 + 0.5 * 8, 8])
    np.testing.assert_allclose(discounts[:, 0], [0, 0, 0, 0.25, 0.5])  # terminal: no bootstrap
    np.testing.assert_array_equal(bootstrap[real][-2:], [5, 5])  # the truncated episode's last obs


def test_initial_priorities_are_the_actors_n_step_td_errors_with_its_own_q():
    reward, terminated, truncated, q, _ = random_rows(2)
    action = np.random.default_rng(2).integers(0, 3, reward.shape)
    returns, discounts, bootstrap, real = learning.n_step_returns(reward, terminated, truncated, 0.9, 3)
    priorities = learning.initial_priorities(q, action, returns, discounts, bootstrap)
    # One network for both roles: the double-DQN target is the n-step target with Q_target = Q.
    targets = n_step_reference(reward, terminated, truncated, q, q, 0.9, 3)
    q_taken = np.take_along_axis(q[:-1], action[:-1, :, None], axis=-1)[..., 0]
    np.testing.assert_allclose(priorities[real], np.abs(targets - q_taken)[real], rtol=1e-5, atol=1e-5)


def test_to_transitions_keeps_real_transitions_with_their_bootstrap_observations():
    reward, terminated, truncated, q, _ = random_rows(3, rows=9, envs=2, actions=3)
    obs = np.arange(9 * 2 * 4, dtype=np.float32).reshape(9, 2, 4)
    action = np.random.default_rng(3).integers(0, 3, (9, 2)).astype(np.int32)
    trajectories = [{"obs": obs[:, b], "action": action[:, b], "reward": reward[:, b], "terminated": terminated[:, b],
                     "truncated": truncated[:, b], "q": q[:, b], "version": np.zeros(9, np.int32)} for b in range(2)]
    transitions, priorities = learning.to_transitions(trajectories, 0.9, 2)
    returns, discounts, bootstrap, real = learning.n_step_returns(reward, terminated, truncated, 0.9, 2)
    assert len(transitions["obs"]) == real.sum() == len(priorities)
    t, b = np.nonzero(real)
    chex.assert_trees_all_equal(transitions, {"obs": obs[t, b], "next_obs": obs[bootstrap[t, b], b],
                                              "action": action[t, b], "reward": returns[t, b],
                                              "discount": discounts[t, b]})
    with pytest.raises(AssertionError, match="different shape prefixes"):  # Q-values per transition, not per row
        learning.to_transitions([dict(item, q=item["q"][:-1]) for item in trajectories], 0.9, 2)


def test_n_step_math_refuses_rows_of_the_wrong_shapes_or_dtypes():
    reward, terminated, truncated, q, _ = random_rows(4, rows=6, envs=2)
    with pytest.raises(AssertionError, match=r"different shapes: \[\(5, 2\), \(6, 2\), \(6, 2\)\]"):
        learning.n_step_returns(reward[1:], terminated, truncated, 0.9, 3)
    with pytest.raises(AssertionError, match="input 1 has type int64 but expected bool"):
        learning.n_step_returns(reward, terminated.astype(np.int64), truncated, 0.9, 3)  # ~ would flip its bits
    returns, discounts, bootstrap, _ = learning.n_step_returns(reward, terminated, truncated, 0.9, 3)
    action = np.zeros((6, 2), np.int32)
    with pytest.raises(AssertionError, match=r"shape \(5, 2\) but expected \(6, 2\)"):
        learning.initial_priorities(q, action[:-1], returns, discounts, bootstrap)
    with pytest.raises(AssertionError, match=r"shape \(6, 3\) but expected \(6, 2, None\)"):
        learning.initial_priorities(q[:, 0], action, returns, discounts, bootstrap)


# Double DQN and importance weights ---------------------------------------------------------------


def test_double_q_target_takes_the_online_argmax_and_the_target_value():
    rng = np.random.default_rng(4)
    q_online, q_target = rng.normal(size=(64, 5)), rng.normal(size=(64, 5))
    reward, discount = rng.normal(size=64), rng.random(64)
    expected = np.array([reward[i] + discount[i] * q_target[i, np.argmax(q_online[i])] for i in range(64)])
    got = learning.double_q_targets(jnp.asarray(reward), jnp.asarray(discount), jnp.asarray(q_online),
                                     jnp.asarray(q_target))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(expected, reward + discount * q_target.max(-1))  # not plain DQN's max
    with pytest.raises(AssertionError, match=r"shape \(64,\) but expected \(64, None\)"):
        learning.double_q_targets(reward, discount, q_online.max(-1), q_target.max(-1))  # values, not Q per action


def test_importance_weights_are_normalised_per_batch():
    probabilities = np.array([0.1, 0.02, 0.05, 0.4])
    size, beta = 1000, 0.4
    raw = (size * probabilities) ** -beta
    np.testing.assert_allclose(learning.importance_weights(jnp.asarray(probabilities), beta), raw / raw.max(),
                               rtol=1e-5)


# The epsilon schedule --------------------------------------------------------------------------


def test_epsilon_schedule_follows_the_paper():
    eps = learning.actor_epsilons(8)
    np.testing.assert_allclose(eps, [0.4 ** (1 + 7 * i / 7) for i in range(8)])
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4**8)
    assert all(a > b for a, b in zip(eps, eps[1:]))
    assert learning.actor_epsilons(1) == [0.4]
    assert learning.actor_epsilons(3) == pytest.approx([0.4, 0.4**4.5, 0.4**8])


def test_epsilon_greedy_explores_at_its_rate():
    network = learning.q_network(CONFIG, ENV)
    params = network.init(jax.random.key(0), jnp.zeros((1, 4)))
    obs = jnp.asarray(np.random.default_rng(5).normal(size=(4000, 4)), jnp.float32)
    greedy = jnp.argmax(network.apply(params, obs), -1)
    for epsilon in (0.0, 0.3):
        policy = learning.EpsilonGreedy(ENV, CONFIG.network, CONFIG.hidden, CONFIG.dueling, epsilon)
        action, extras = jax.jit(policy)({"network": params}, obs, jax.random.key(1))
        np.testing.assert_allclose(extras["q"], network.apply(params, obs), rtol=1e-6)
        # A random action differs from the greedy one 2 times in 3 with 3 actions.
        assert float(jnp.mean(action != greedy)) == pytest.approx(epsilon * 2 / 3, abs=0.03)


def test_the_evaluators_policy_is_greedy_with_no_extras_and_actors_get_their_epsilons():
    network = learning.q_network(CONFIG, ENV)
    params = network.init(jax.random.key(0), jnp.zeros((1, 4)))
    obs = jnp.asarray(np.random.default_rng(6).normal(size=(64, 4)), jnp.float32)
    config = dataclasses.replace(CONFIG, num_actors=3)
    evaluator = learning.policy(config, ENV, None)
    assert evaluator.epsilon is None
    action, extras = jax.jit(evaluator)({"network": params}, obs, jax.random.key(1))
    np.testing.assert_array_equal(action, jnp.argmax(network.apply(params, obs), -1))
    assert extras == {} and action.dtype == jnp.int32
    epsilons = learning.actor_epsilons(3, config.base_epsilon, config.epsilon_alpha)
    assert [learning.policy(config, ENV, i).epsilon for i in range(3)] == epsilons


def test_apex_refuses_a_continuous_action_space_when_the_agent_is_built():
    from jaxdist.agents import apex

    with pytest.raises(ValueError, match="continuous action space"):
        apex.agent(dataclasses.replace(CONFIG, env_id="Pendulum-v1"))


# The update ------------------------------------------------------------------------------------


def make_batch(seed, size=32):
    rng = np.random.default_rng(seed)
    data = {"obs": rng.normal(size=(size, 4)).astype(np.float32), "action": rng.integers(0, 3, size).astype(np.int32),
            "reward": rng.normal(size=size).astype(np.float32), "discount": np.full(size, 0.9, np.float32),
            "next_obs": rng.normal(size=(size, 4)).astype(np.float32)}
    probabilities = rng.random(size) + 0.1
    return {"keys": np.arange(size), "data": data, "probabilities": probabilities / probabilities.sum()}


def test_update_returns_pre_step_td_errors_as_priorities_and_lowers_the_loss():
    state = learning.init(CONFIG, ENV, jax.random.key(0))
    batch = make_batch(0)
    network = learning.q_network(CONFIG, ENV)
    data = batch["data"]
    q = network.apply(state["params"], data["obs"])[np.arange(32), data["action"]]
    target = learning.double_q_targets(data["reward"], data["discount"], network.apply(state["params"], data["next_obs"]),
                                       network.apply(state["target_params"], data["next_obs"]))
    config = dataclasses.replace(CONFIG, learning_rate=5e-3, target_update_period=1000)  # a fixed target
    update = jax.jit(lambda s, b: learning.update(config, ENV, s, b, jax.random.key(0)))
    new_state, metrics = update(state, batch)
    np.testing.assert_allclose(metrics["priorities"], np.abs(target - q), rtol=1e-5, atol=1e-5)
    losses = [float(metrics["loss"])]
    for _ in range(40):  # with a fixed target; 20 steps halved it only for some initialisations
        new_state, metrics = update(new_state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.5 * losses[0]
    assert learning.published(new_state) == {"network": new_state["params"]}


def test_the_loss_refuses_a_sample_that_is_not_flat_transitions():
    state = learning.init(CONFIG, ENV, jax.random.key(0))
    batch = make_batch(0)
    loss = jax.jit(learning.dqn_loss, static_argnums=(3, 4))
    with pytest.raises(AssertionError, match="different shape prefixes"):
        loss(state["params"], state["target_params"], dict(batch, probabilities=batch["probabilities"][:-1]),
             CONFIG, ENV)
    with pytest.raises(AssertionError, match=r"shape \(32, 2\) but expected \(None, 4\)"):
        loss(state["params"], state["target_params"], dict(batch, data=dict(batch["data"], next_obs=np.zeros((32, 2)))),
             CONFIG, ENV)


def test_target_network_is_synced_every_period_and_held_between():
    state = learning.init(CONFIG, ENV, jax.random.key(0))
    update = jax.jit(lambda s, b: learning.update(CONFIG, ENV, s, b, jax.random.key(0)))
    for step in range(1, 7):
        before = state["target_params"]
        state, _ = update(state, make_batch(step))
        if step % CONFIG.target_update_period:
            chex.assert_trees_all_equal(state["target_params"], before)
            with pytest.raises(AssertionError):
                chex.assert_trees_all_equal(state["params"], before)
        else:
            chex.assert_trees_all_equal(state["target_params"], state["params"])
