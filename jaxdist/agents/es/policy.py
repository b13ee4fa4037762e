"""A deterministic MLP policy over one flat parameter vector: ES perturbs, averages and steps
that vector as a whole, so the layers are views into it rather than a pytree."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jaxdist.envs.jax_envs import JaxEnv


@dataclasses.dataclass(frozen=True)
class Policy:
    """``tanh`` hidden layers; the greedy action of a discrete env, ``action_scale * tanh`` of a
    continuous one (no exploration noise: ES explores in parameter space)."""

    obs_size: int
    hidden: tuple[int, ...]
    action_size: int
    discrete: bool
    action_scale: float = 1.0

    @classmethod
    def for_env(cls, dynamics: JaxEnv, hidden: tuple[int, ...]) -> "Policy":
        return cls(dynamics.obs_size, tuple(hidden), dynamics.action_size, dynamics.discrete, dynamics.action_scale)

    @property
    def layer_sizes(self) -> list[tuple[int, int]]:
        sizes = [self.obs_size, *self.hidden, self.action_size]
        return list(zip(sizes[:-1], sizes[1:]))

    @property
    def size(self) -> int:
        """Parameters in the flat vector."""
        return sum(fan_in * fan_out + fan_out for fan_in, fan_out in self.layer_sizes)

    def init(self, key: jax.Array) -> jax.Array:
        """LeCun-normal weights, zero biases; the last layer scaled down so that the first
        policies act gently and the search starts near the origin of action space."""
        pieces = []
        keys = jax.random.split(key, len(self.layer_sizes))
        for i, ((fan_in, fan_out), layer_key) in enumerate(zip(self.layer_sizes, keys)):
            scale = (0.1 if i == len(self.layer_sizes) - 1 else 1.0) / math.sqrt(fan_in)
            pieces += [scale * jax.random.normal(layer_key, (fan_in * fan_out,)), jnp.zeros(fan_out)]
        return jnp.concatenate(pieces)

    def __call__(self, params: jax.Array, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, dict]:
        """The actors' policy signature (``jaxdist.nodes.actor``): a batch of observations ->
        their actions and no extras; the key is unused."""
        return jax.vmap(self.act, (None, 0))(params, obs), {}

    def act(self, params: jax.Array, obs: jax.Array) -> jax.Array:
        """The action for one observation (``vmap`` it for batches)."""
        x, offset = obs.astype(params.dtype), 0
        for i, (fan_in, fan_out) in enumerate(self.layer_sizes):
            weights = params[offset:offset + fan_in * fan_out].reshape(fan_in, fan_out)
            offset += fan_in * fan_out
            x = x @ weights + params[offset:offset + fan_out]
            offset += fan_out
            if i < len(self.layer_sizes) - 1:
                x = jnp.tanh(x)
        if self.discrete:
            return jnp.argmax(x)
        return self.action_scale * jnp.tanh(x)
