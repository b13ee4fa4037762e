"""The actor-critic for discrete actions that PPO and IMPALA share, and its training state.

Separate policy and value MLPs (tanh, orthogonal init: policy head gain 0.01, value head 1),
as in CleanRL and PureJaxRL: sharing a torso couples the two losses' scales for no gain on
small control tasks (IMPALA's paper shares one; here the baseline loss would pull on the
policy's features), and ``method="logits"`` lets actors run the policy alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax


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


def clipped_adam(learning_rate: float, max_grad_norm: float, anneal_steps: int | None) -> optax.GradientTransformation:
    """Adam (eps 1e-5) after global-norm clipping; over ``anneal_steps`` SGD steps (if given)
    the rate falls linearly to 0."""
    rate: Any = learning_rate if not anneal_steps else optax.linear_schedule(learning_rate, 0.0, anneal_steps)
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(rate, eps=1e-5))


def init_train_state(hp: Any, optimizer: Callable[[Any], optax.GradientTransformation],
                     rng: jax.Array) -> dict[str, Any]:
    """``{"params", "opt_state", "version"}`` of ``hp.network()`` (``hp`` has ``obs_shape``);
    ``version`` counts updates, as the learner's step does. Jitted as a whole: run op by op,
    flax's orthogonal initialisers compile a dozen small programs (seconds on a cold start); one
    program is one compile, or one cache hit."""
    return _jitted_init_train_state(hp, optimizer, rng)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _jitted_init_train_state(hp: Any, optimizer: Callable[[Any], optax.GradientTransformation],
                             rng: jax.Array) -> dict[str, Any]:
    params = hp.network().init(rng, jnp.zeros((1, *hp.obs_shape), jnp.float32))
    return {"params": params, "opt_state": optimizer(hp).init(params), "version": jnp.zeros((), jnp.int32)}
