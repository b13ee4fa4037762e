"""ES math against NumPy references written from Salimans et al. 2017, and its jitted episode
batches against gymnasium's envs."""

from __future__ import annotations

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdist.agents.es import learning, search
from jaxdist.agents.es import ESConfig
from jaxdist.agents.es.policy import Policy
from jaxdist.envs.jax_envs import jax_env

# NumPy references ------------------------------------------------------------------------------


def reference_centered_ranks(x: np.ndarray) -> np.ndarray:
    """Fitness shaping: rank 0..N-1 over all N fitnesses, scaled to [-0.5, 0.5]."""
    ranks = np.empty(x.size)
    ranks[x.ravel().argsort()] = np.arange(x.size)
    return (ranks / (x.size - 1) - 0.5).reshape(x.shape)


def reference_gradient(eps: np.ndarray, fitness: np.ndarray, sigma: float) -> np.ndarray:
    """Algorithm 1 of the paper, g = 1/(N sigma) sum_j F_j eps_j, over the N = 2n mirrored
    samples eps_1..eps_n, -eps_1..-eps_n (fitness[:, 0] for +eps_i, fitness[:, 1] for -eps_i)."""
    samples = np.concatenate([eps, -eps])
    scores = np.concatenate([fitness[:, 0], fitness[:, 1]])
    return sum(f * e for f, e in zip(scores, samples)) / (len(samples) * sigma)


def test_centered_ranks_match_the_reference_and_span_minus_half_to_half():
    values = np.random.default_rng(0).normal(size=(50, 2)).astype(np.float32)
    shaped = np.asarray(learning.centered_ranks(jnp.asarray(values)))
    np.testing.assert_allclose(shaped, reference_centered_ranks(values), atol=1e-6)
    assert shaped.min() == pytest.approx(-0.5) and shaped.max() == pytest.approx(0.5)
    # Invariant to any increasing transform of the fitness: the update ignores return scale.
    np.testing.assert_allclose(np.asarray(learning.centered_ranks(jnp.asarray(np.exp(values) * 1e3 - 7))), shaped)


def test_antithetic_gradient_estimate_matches_the_papers_estimator():
    rng = np.random.default_rng(1)
    eps = rng.normal(size=(16, 40)).astype(np.float32)
    fitness = reference_centered_ranks(rng.normal(size=(16, 2))).astype(np.float32)
    got = learning.gradient_estimate(jnp.asarray(eps), jnp.asarray(fitness), 0.05)
    np.testing.assert_allclose(np.asarray(got), reference_gradient(eps, fitness, 0.05), rtol=1e-4, atol=1e-5)


def test_the_gradient_estimate_points_up_a_quadratic():
    theta, sigma, dimension = np.zeros(30, np.float32), 0.1, 30
    target = np.linspace(-1, 1, dimension).astype(np.float32)
    seeds = learning.generation_seeds(0, 0, 500)
    eps = np.asarray(learning.noise(jnp.asarray(seeds), dimension))
    score = lambda p: -np.sum((p - target) ** 2, axis=-1)  # noqa: E731
    fitness = np.stack([score(theta + sigma * eps), score(theta - sigma * eps)], axis=1)
    g = np.asarray(learning.gradient_estimate(jnp.asarray(eps), learning.centered_ranks(jnp.asarray(fitness)), sigma))
    true = 2 * (target - theta)
    assert g @ true / (np.linalg.norm(g) * np.linalg.norm(true)) > 0.9


def test_noise_rows_depend_on_their_own_seed_alone():
    """What lets only seeds cross the wire: any process regenerates the same vector."""
    seeds = jnp.asarray([7, 123456, 2**31 - 2], jnp.int32)
    batch = np.asarray(learning.noise(seeds, 64))
    alone = np.asarray(learning.noise(seeds[1:2], 64))
    np.testing.assert_array_equal(batch[1], alone[0])
    assert abs(batch.mean()) < 0.2 and 0.8 < batch.std() < 1.2
    np.testing.assert_array_equal(learning.generation_seeds(3, 5, 8), learning.generation_seeds(3, 5, 8))
    assert not np.array_equal(learning.generation_seeds(3, 5, 8), learning.generation_seeds(3, 6, 8))


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_an_sgd_update_steps_along_the_estimate_with_l2_decay(weight_decay):
    rng = np.random.default_rng(2)
    theta = rng.normal(size=12).astype(np.float32)
    seeds = learning.generation_seeds(0, 1, 8)
    fitness = rng.normal(size=(8, 2)).astype(np.float32)
    tx = learning.optimizer("sgd", 0.5, weight_decay, momentum=0.0)
    new, _, norm = learning.update(tx, jnp.asarray(theta), tx.init(jnp.asarray(theta)), jnp.asarray(seeds),
                                   jnp.asarray(fitness), 0.1)
    g = reference_gradient(np.asarray(learning.noise(jnp.asarray(seeds), 12)), reference_centered_ranks(fitness), 0.1)
    np.testing.assert_allclose(np.asarray(new), theta + 0.5 * (g - weight_decay * theta), rtol=1e-4, atol=1e-5)
    assert float(norm) == pytest.approx(np.linalg.norm(g), rel=1e-4)


def test_adam_is_optax_adam_on_the_negated_estimate():
    theta = jnp.ones(12)
    seeds, fitness = learning.generation_seeds(0, 2, 8), jnp.asarray(np.random.default_rng(3).normal(size=(8, 2)))
    tx = learning.optimizer("adam", 0.01)
    new, _, _ = learning.update(tx, theta, tx.init(theta), jnp.asarray(seeds), fitness, 0.1)
    g = learning.gradient_estimate(learning.noise(jnp.asarray(seeds), 12), learning.centered_ranks(fitness), 0.1)
    reference = optax.adam(0.01)
    updates, _ = reference.update(-g, reference.init(theta), theta)
    np.testing.assert_allclose(np.asarray(new), np.asarray(theta + updates), rtol=1e-6)
    assert bool(jnp.all(jnp.sign(new - theta) == jnp.sign(g)))  # first Adam step: lr * sign(g)


def test_config_takes_the_envs_defaults_and_rejects_bad_values():
    assert ESConfig().target_return == 475.0 and ESConfig().episodes_per_member == 1
    pendulum = ESConfig(env_id="Pendulum-v1")
    assert pendulum.target_return == -200.0 and pendulum.episodes_per_member == 8
    with pytest.raises(ValueError, match="multiple of 16"):
        ESConfig(population=40)
    with pytest.raises(ValueError, match="ES here runs"):
        ESConfig(env_id="Acrobot-v1")


# Jitted episode batches against gymnasium ------------------------------------------------------


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_a_jitted_batch_of_episodes_returns_what_gymnasium_returns_from_the_same_start_states(env_id):
    """The masked scan: every episode's length and return as gymnasium counts them (returns to
    float precision: the batch acts in float64 where gymnasium's env takes a float32 action)."""
    port = jax_env(env_id)
    policy = Policy.for_env(port, (8,))
    keys = jax.random.split(jax.random.key(0), 3)
    with jax.enable_x64(True):
        params = jnp.stack([policy.init(jax.random.key(i)) * 3 for i in range(2)]).astype(jnp.float64)
        returns, lengths = search.episodes(policy, port, params, keys)
        starts = jax.vmap(port.reset_physics)(keys)
        act = jax.jit(policy.act)
        for p in range(len(params)):
            for e in range(len(keys)):
                env = gym.make(env_id)
                env.reset(seed=0)
                env.unwrapped.state = np.asarray(starts[e], np.float64)
                obs, total, length, done = np.asarray(port.observe(starts[e])), 0.0, 0, False
                while not done:
                    action = np.asarray(act(params[p], jnp.asarray(obs)))
                    action = int(action) if port.discrete else action.astype(np.float32)
                    obs, reward, terminated, truncated, _ = env.step(action)
                    total, length, done = total + reward, length + 1, terminated or truncated
                assert int(lengths[p, e]) == length, (p, e)
                assert float(returns[p, e]) == pytest.approx(total, rel=1e-6)
    if port.discrete:
        assert int(lengths.max()) < port.max_steps  # these random policies drop the pole: terminated
    else:
        assert bool(jnp.all(lengths == port.max_steps))  # a Pendulum episode ends at its time limit only
