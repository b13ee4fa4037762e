"""jaxdist.agents.actor_critic against NumPy references written out by hand."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist.agents import actor_critic as D
from jaxdist.envs.spaces import ActionSpace

DISCRETE = ActionSpace(num_actions=4)
BOX = ActionSpace(shape=(3,), low=(-1.0,) * 3, high=(1.0,) * 3)


def np_log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def np_gaussian_log_prob(a: np.ndarray, mean: np.ndarray, log_std: np.ndarray) -> np.ndarray:
    std = np.exp(log_std)
    density = np.exp(-0.5 * ((a - mean) / std) ** 2) / (std * np.sqrt(2 * np.pi))
    return np.log(density).sum(-1)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def test_discrete_log_prob_entropy_and_mode_with_two_batch_dims(rng):
    logits = rng.normal(size=(5, 7, 4)).astype(np.float32)
    action = rng.integers(4, size=(5, 7)).astype(np.int32)
    logp = np_log_softmax(logits.astype(np.float64))
    expected = np.take_along_axis(logp, action[..., None], -1)[..., 0]
    np.testing.assert_allclose(D.log_prob(DISCRETE, logits, action), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(D.entropy(DISCRETE, logits), -(np.exp(logp) * logp).sum(-1), rtol=1e-5)
    np.testing.assert_array_equal(D.mode(DISCRETE, logits), logits.argmax(-1))
    assert D.mode(DISCRETE, logits).dtype == jnp.int32


def test_discrete_entropy_of_uniform_logits_is_log_n():
    np.testing.assert_allclose(D.entropy(DISCRETE, jnp.zeros((2, 4))), [math.log(4)] * 2, rtol=1e-6)


def test_discrete_samples_follow_the_softmax():
    logits = jnp.log(jnp.array([0.1, 0.2, 0.3, 0.4]))
    actions = D.sample(DISCRETE, jnp.broadcast_to(logits, (100_000, 4)), jax.random.key(0))
    assert actions.shape == (100_000,) and actions.dtype == jnp.int32
    np.testing.assert_allclose(np.bincount(actions, minlength=4) / 100_000, [0.1, 0.2, 0.3, 0.4], atol=0.005)


@pytest.mark.parametrize("shared_log_std", [True, False])
def test_gaussian_log_prob_and_entropy_with_two_batch_dims(rng, shared_log_std):
    mean = rng.normal(size=(5, 7, 3)).astype(np.float32)
    log_std = rng.normal(scale=0.5, size=(3,) if shared_log_std else (5, 7, 3)).astype(np.float32)
    action = rng.normal(size=(5, 7, 3)).astype(np.float32) * 2
    np.testing.assert_allclose(D.log_prob(BOX, (mean, log_std), action),
                               np_gaussian_log_prob(action, mean, log_std), rtol=1e-5, atol=1e-5)
    # H of N(mu, s^2) is log(s sqrt(2 pi e)) per dimension, summed.
    expected = np.broadcast_to(np.log(np.exp(log_std) * np.sqrt(2 * np.pi * np.e)), mean.shape).sum(-1)
    entropy = D.entropy(BOX, (mean, log_std))
    assert entropy.shape == (5, 7)
    np.testing.assert_allclose(entropy, expected, rtol=1e-5)


def test_gaussian_mode_is_the_mean():
    mean = jnp.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(D.mode(BOX, (mean, jnp.zeros(3))), mean)


def test_gaussian_samples_have_the_mean_and_std_and_are_not_clipped():
    mean, log_std = jnp.array([0.5, -3.0, 0.0]), jnp.log(jnp.array([0.1, 1.0, 2.0]))
    actions = D.sample(BOX, (jnp.broadcast_to(mean, (200_000, 3)), log_std), jax.random.key(1))
    assert actions.shape == (200_000, 3) and actions.dtype == jnp.float32
    np.testing.assert_allclose(actions.mean(0), mean, atol=0.02)
    np.testing.assert_allclose(actions.std(0), [0.1, 1.0, 2.0], rtol=0.01)
    assert actions.min() < -1.0 and actions.max() > 1.0  # beyond the bounds: the env clips


def test_log_prob_of_own_samples_matches_the_reference(rng):
    mean, log_std = jnp.asarray(rng.normal(size=(8, 3)), jnp.float32), jnp.full(3, -0.5)
    action = D.sample(BOX, (mean, log_std), jax.random.key(2))
    expected = np_gaussian_log_prob(*map(np.asarray, (action, mean, log_std)))
    np.testing.assert_allclose(D.log_prob(BOX, (mean, log_std), action), expected, rtol=1e-5)


@pytest.mark.parametrize("space,dist,action", [
    (DISCRETE, jnp.zeros((2, 3, 4)), jnp.zeros((2, 3), jnp.int32)),
    (BOX, (jnp.zeros((2, 3, 3)), jnp.zeros(3)), jnp.zeros((2, 3, 3))),
])
def test_every_function_jits_with_the_space_static(space, dist, action):
    key = jax.random.key(3)
    for fn, args in [(D.sample, (dist, key)), (D.log_prob, (dist, action)),
                     (D.entropy, (dist,)), (D.mode, (dist,))]:
        jitted = jax.jit(fn, static_argnums=0)
        np.testing.assert_array_equal(jitted(space, *args), fn(space, *args))
    assert jax.jit(D.sample, static_argnums=0)(space, dist, key).shape == action.shape


def test_gaussian_log_prob_gradients_reach_mean_and_log_std():
    @functools.partial(jax.grad, argnums=(0, 1))
    def grads(mean, log_std):
        return D.log_prob(BOX, (mean, log_std), jnp.ones((2, 3))).sum()

    d_mean, d_log_std = grads(jnp.zeros((2, 3)), jnp.zeros(3))
    np.testing.assert_allclose(d_mean, jnp.ones((2, 3)))  # (a - mean) / std^2
    np.testing.assert_allclose(d_log_std, jnp.zeros(3), atol=1e-6)  # 2 * ((a - mean)^2 / std^2 - 1)
