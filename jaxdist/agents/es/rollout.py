"""Whole episodes for many parameter vectors at once: one jitted ``lax.scan`` over the env's
``max_steps``, ``vmap``-ped over parameter vectors and over episodes. Episodes that end early
keep stepping, masked, so that every episode of the batch runs the same program."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxdist.agents.es import learning
from jaxdist.jax_envs import JaxEnv
from jaxdist.agents.es.policy import Policy


@functools.partial(jax.jit, static_argnums=(0, 1))
def episodes(policy: Policy, dynamics: JaxEnv, params: jax.Array, keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Returns and lengths, both ``[P, E]``, of ``params[p]`` (``[P, D]``) in the episodes that
    start from ``reset(keys[e])``: every parameter vector meets the same start states."""

    def one_policy(theta: jax.Array) -> tuple[jax.Array, jax.Array]:
        state, obs = jax.vmap(dynamics.reset)(keys)

        def step(carry, _):
            state, obs, done, total, length = carry
            out = jax.vmap(dynamics.step)(state, jax.vmap(policy.act, (None, 0))(theta, obs))
            total = total + jnp.where(done, 0.0, out.reward)
            length = length + (~done).astype(jnp.int32)
            return (out.state, out.obs, done | out.terminated | out.truncated, total, length), None

        count = keys.shape[0]
        start = (state, obs, jnp.zeros(count, bool), jnp.zeros(count, theta.dtype), jnp.zeros(count, jnp.int32))
        (_, _, _, total, length), _ = jax.lax.scan(step, start, None, length=dynamics.max_steps)
        return total, length

    return jax.vmap(one_policy)(params)


@functools.partial(jax.jit, static_argnums=(0, 1))
def antithetic_fitness(policy: Policy, dynamics: JaxEnv, theta: jax.Array, seeds: jax.Array, sigma: float,
                       keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Fitness ``[n, 2]`` of ``theta + sigma * eps_i`` and ``theta - sigma * eps_i`` (mean return
    over the episodes of ``keys``), ``eps_i`` regenerated from ``seeds[i]``; and env steps taken."""
    eps = learning.noise(seeds, theta.shape[0])
    params = jnp.concatenate([theta + sigma * eps, theta - sigma * eps])
    returns, lengths = episodes(policy, dynamics, params, keys)
    fitness = returns.mean(axis=1).reshape(2, -1).T
    return fitness, lengths.sum()
