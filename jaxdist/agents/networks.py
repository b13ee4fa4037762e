"""The actor-critic for discrete actions that PPO and IMPALA share.

Separate policy and value MLPs (tanh, orthogonal init: policy head gain 0.01, value head 1),
as in CleanRL and PureJaxRL: sharing a torso couples the two losses' scales for no gain on
small control tasks (IMPALA's paper shares one; here the baseline loss would pull on the
policy's features), and ``method="logits"`` lets actors run the policy alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


class MLP(nn.Module):
    """tanh hidden layers, orthogonal init (gain sqrt 2), an output layer with gain ``out_gain``."""

    hidden: Sequence[int]
    out: int
    out_gain: float

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for width in self.hidden:
            x = nn.tanh(nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
        return nn.Dense(self.out, kernel_init=nn.initializers.orthogonal(self.out_gain))(x)


class ActorCritic(nn.Module):
    """``(obs) -> (logits (..., num_actions), value (...))``; ``method="logits"`` runs only the policy."""

    num_actions: int
    hidden: Sequence[int] = (64, 64)

    def setup(self) -> None:
        self.policy = MLP(self.hidden, self.num_actions, 0.01)
        self.critic = MLP(self.hidden, 1, 1.0)

    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        obs = obs.astype(jnp.float32)
        return self.policy(obs), self.critic(obs)[..., 0]

    def logits(self, obs: jax.Array) -> jax.Array:
        return self.policy(obs.astype(jnp.float32))
