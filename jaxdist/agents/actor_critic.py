"""The learner-side pieces PPO and IMPALA share around their actor-critic: the network from the
config, the training state, normalisation of a batch, and what gets published.

The state is ``{"params", "opt_state", "version", "obs_norm", "return_norm"}``: running
statistics of observations and of discounted returns live in it (so they are checkpointed and
restored with the parameters) and are used only when the config asks (``normalize_observations``,
``scale_rewards``). Observations are normalised with the statistics *before* the batch updates
them, the ones the actors acted with; the new statistics are published with the parameters.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxdist.agents import normalization
from jaxdist.agents.networks import ActorCritic
from jaxdist.envs.spaces import EnvInfo

PyTree = Any


def network(config: Any, env: EnvInfo) -> ActorCritic:
    return ActorCritic(action=env.action, network=config.network, hidden=tuple(config.hidden))


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def init(config: Any, env: EnvInfo, optimizer: Callable[[Any], optax.GradientTransformation],
         rng: jax.Array) -> dict[str, PyTree]:
    """The initial state, in one jitted call: run op by op, flax's initialisers compile a dozen
    small programs (seconds on a cold start); one program is one compile, or one cache hit."""
    params = network(config, env).init(rng, jnp.zeros((1, *env.obs_shape), env.obs_dtype))
    return {"params": params, "opt_state": optimizer(config).init(params), "version": jnp.zeros((), jnp.int32),
            "obs_norm": normalization.init_stats(env.obs_shape), "return_norm": normalization.init_stats(())}


def normalized(config: Any, state: dict[str, PyTree], batch: dict[str, jax.Array],
               time_major_ended: jax.Array) -> tuple[jax.Array, jax.Array, dict[str, PyTree]]:
    """``(obs, time-major rewards, statistics)`` of a ``(B, T + 1, ...)`` batch as the loss should
    see them, and the state's statistics updated with this batch."""
    obs, reward = batch["obs"], jnp.swapaxes(batch["reward"], 0, 1)
    stats = {"obs_norm": state["obs_norm"], "return_norm": state["return_norm"]}
    if config.normalize_observations:
        obs = normalization.normalize(state["obs_norm"], obs)
        stats["obs_norm"] = normalization.update_stats(state["obs_norm"], batch["obs"][:, :-1])
    if config.scale_rewards:
        returns = normalization.discounted_returns(reward, time_major_ended, config.gamma)
        # Row 0 is the previous trajectory's last row: its reward was counted there.
        stats["return_norm"] = normalization.update_stats(state["return_norm"], returns[1:])
        reward = normalization.scale_rewards(stats["return_norm"], reward)
    return obs, reward, stats


def published(config: Any, state: dict[str, PyTree]) -> dict[str, PyTree]:
    """What actors, the evaluator and ``load_policy`` get: the network, and the observation
    statistics it was trained with when it normalises them."""
    if not config.normalize_observations:
        return {"network": state["params"]}
    return {"network": state["params"], "obs_norm": state["obs_norm"]._asdict()}
