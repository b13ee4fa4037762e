"""The policy's action distribution, chosen by the action space: pure jittable functions, so the
losses in each agent's ``learning.py`` read the same for discrete and continuous actions.

``space`` is a static (hashable) :class:`~jaxdist.envs.spaces.ActionSpace`; ``dist`` is what
``ActorCritic`` outputs:

- Discrete: ``dist = logits (..., n)``, a categorical ``pi(a) = softmax(logits)_a``; actions int32.
- Continuous: ``dist = (mean (..., d), log_std (..., d) or (d,))``, a diagonal Gaussian
  ``pi(a) = prod_i N(a_i; mean_i, exp(log_std_i)^2)``. Actions are the raw, unbounded samples:
  the env clips them to the bounds and log-probs are of the raw sample (as CleanRL does), so the
  importance ratios of PPO and V-trace stay exact.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxdist.envs.spaces import ActionSpace

Dist = Any  # logits, or (mean, log_std)

_LOG_2PI = math.log(2.0 * math.pi)


def sample(space: ActionSpace, dist: Dist, key: jax.Array) -> jax.Array:
    """``a ~ pi``: int32 ``(...)`` (discrete) or float ``(..., d)`` (continuous)."""
    if space.discrete:
        return jax.random.categorical(key, dist).astype(jnp.int32)
    mean, log_std = dist
    return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)


def log_prob(space: ActionSpace, dist: Dist, action: jax.Array) -> jax.Array:
    """``log pi(a)``, shape ``(...)``; for a Gaussian
    ``sum_i -((a_i - mean_i) / std_i)^2 / 2 - log_std_i - log(2 pi) / 2``."""
    if space.discrete:
        logp = jax.nn.log_softmax(dist)
        return jnp.take_along_axis(logp, action[..., None].astype(jnp.int32), -1)[..., 0]
    mean, log_std = dist
    z = (action - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * z * z - log_std - 0.5 * _LOG_2PI, -1)


def entropy(space: ActionSpace, dist: Dist) -> jax.Array:
    """``H(pi)``, shape ``(...)``: ``-sum_a pi(a) log pi(a)``, or for a Gaussian
    ``sum_i log_std_i + (1 + log(2 pi)) / 2``, whatever the mean."""
    if space.discrete:
        logp = jax.nn.log_softmax(dist)
        return -jnp.sum(jnp.exp(logp) * logp, -1)
    mean, log_std = dist
    return jnp.sum(jnp.broadcast_to(log_std, mean.shape) + 0.5 * (1.0 + _LOG_2PI), -1)


def mode(space: ActionSpace, dist: Dist) -> jax.Array:
    """The deterministic action (evaluation, trained policies): ``argmax logits`` or ``mean``."""
    if space.discrete:
        return jnp.argmax(dist, -1).astype(jnp.int32)
    return dist[0]
