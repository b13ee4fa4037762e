"""Ape-X's Q-network for vector observations: an MLP torso and, as in the paper, a dueling head
(Wang et al. 2016): ``Q(s, a) = V(s) + A(s, a) - mean_a A(s, a)``."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class QNetwork(nn.Module):
    """``(obs (..., *obs_shape)) -> Q-values (..., num_actions)``."""

    num_actions: int
    hidden: Sequence[int] = (128, 128)
    dueling: bool = True

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = obs.astype(jnp.float32)
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        if not self.dueling:
            return nn.Dense(self.num_actions)(x)
        advantage = nn.Dense(self.num_actions)(x)
        value = nn.Dense(1)(x)
        return value + advantage - jnp.mean(advantage, axis=-1, keepdims=True)
