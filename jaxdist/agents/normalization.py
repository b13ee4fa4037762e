"""Running observation normalisation and reward scaling (as SB3's ``VecNormalize`` and CleanRL's
wrappers do them), as pure functions over a ``RunningStats`` pytree.

The stats live in the learner's state, so they travel with the parameters to the actors and are
checkpointed with them: actors and learner normalise with the same numbers, and a resume does
not relearn them. The learner updates them from each batch it trains on.

**Merge** (Chan et al.'s parallel variance): a batch of weight ``n``, mean ``m_b`` and variance
``v_b`` joins stats ``(m, v, c)`` as ``delta = m_b - m``, ``c' = c + n``,
``m' = m + delta n / c'``, ``v' = (v c + v_b n + delta^2 c n / c') / c'``. Under a pmap step
(:mod:`jaxdist.learning.parallel`) every device holds a shard: the batch moments are averaged over
devices with ``parallel.pmean`` first, so jit on the global batch and pmap give the same stats.

**Rewards** are divided by the running std of the discounted return ``G`` (no mean subtracted,
so the reward's sign and the optimal policy stay as they are).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxdist.learning import parallel

EPSILON = 1e-8  # added to the variance before dividing (SB3's value)
_INITIAL_COUNT = 1e-4  # the prior (mean 0, var 1) weighs as this many samples (SB3's value)


class RunningStats(NamedTuple):
    """Per-feature running mean and (population) variance of ``count`` samples."""

    mean: jax.Array
    var: jax.Array
    count: jax.Array


def init_stats(shape: tuple[int, ...] = ()) -> RunningStats:
    """Mean 0, variance 1, weighing almost nothing: the first batch sets the stats."""
    return RunningStats(jnp.zeros(shape, jnp.float32), jnp.ones(shape, jnp.float32),
                        jnp.asarray(_INITIAL_COUNT, jnp.float32))


def update_stats(stats: RunningStats, x: jax.Array, weight: jax.Array | None = None) -> RunningStats:
    """Merge the samples of ``x`` (``(*batch, *shape)``: every axis before ``stats.mean``'s shape
    is a batch axis) into ``stats``; ``weight`` (``batch``-shaped, e.g. a 0/1 mask of real rows)
    weighs each sample. A batch of weight 0 leaves the stats unchanged."""
    shape = stats.mean.shape
    chex.assert_equal_shape([stats.mean, stats.var])
    chex.assert_shape(x, (..., *shape))
    axes = tuple(range(x.ndim - len(shape)))
    if weight is not None:
        chex.assert_shape(weight, x.shape[:len(axes)])
    x = x.astype(jnp.float32)
    w = jnp.ones(x.shape[:len(axes)], jnp.float32) if weight is None else weight.astype(jnp.float32)
    w = w.reshape(w.shape + (1,) * len(shape))
    n, total = parallel.pmean((jnp.sum(w), jnp.sum(w * x, axes)))
    safe_n = jnp.maximum(n, 1e-12)
    batch_mean = total / safe_n
    batch_var = parallel.pmean(jnp.sum(w * jnp.square(x - batch_mean), axes)) / safe_n
    n = n * parallel.shard_count()
    count = stats.count + n
    delta = batch_mean - stats.mean
    mean = stats.mean + delta * n / count
    var = (stats.var * stats.count + batch_var * n + jnp.square(delta) * stats.count * n / count) / count
    return RunningStats(mean, var, count)


def normalize(stats: RunningStats, x: jax.Array, clip: float = 10.0) -> jax.Array:
    """``clip((x - mean) / sqrt(var + EPSILON), -clip, clip)`` in float32; ``x`` is
    ``(*batch, *shape)`` as in :func:`update_stats`."""
    chex.assert_shape(x, (..., *stats.mean.shape))
    z = (x.astype(jnp.float32) - stats.mean) / jnp.sqrt(stats.var + EPSILON)
    return jnp.clip(z, -clip, clip)


def discounted_returns(reward: jax.Array, ended: jax.Array, gamma: float) -> jax.Array:
    """The running discounted return along axis 0 (time), ``(T, ...)`` in and out:
    ``G_t = r_t + gamma (1 - ended_{t-1}) G_{t-1}`` from ``G_{-1} = 0``, so ``G`` restarts after
    every row that ended an episode. Its variance is what ``scale_rewards`` divides by."""
    chex.assert_equal_shape([reward, ended])

    def step(carry: jax.Array, row: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        r, end = row
        g = r + gamma * carry
        return g * (1.0 - end), g

    reward = reward.astype(jnp.float32)
    _, returns = jax.lax.scan(step, jnp.zeros_like(reward[0]), (reward, ended.astype(jnp.float32)))
    return returns


def scale_rewards(stats: RunningStats, reward: jax.Array, clip: float = 10.0) -> jax.Array:
    """``clip(r / sqrt(var_G + EPSILON), -clip, clip)`` with ``stats`` over discounted returns."""
    return jnp.clip(reward.astype(jnp.float32) / jnp.sqrt(stats.var + EPSILON), -clip, clip)
