"""A2C's math: the advantage actor-critic loss and one jitted update, on the library's
actor-critic network, state and normalisation (``jaxdist.agents.actor_critic``) and PPO's GAE.

A batch is ``B`` trajectories of ``T + 1`` rows (``obs``, ``action``, ``reward``,
``terminated``, ``truncated``, the acting policy's ``logp``): the row convention of
``jaxdist.envs.vector``, where a transition that crosses an autoreset is not real.
Loss: ``-A log pi(a|s) + c_v 0.5 (V(s) - G)^2 - c_e H(pi)``, averaged over real transitions,
with ``A`` and ``G`` from GAE on the learner's own values."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from a2c import A2CConfig
from jaxdist.agents import actor_critic
from jaxdist.agents.ppo.learning import gae
from jaxdist.envs.spaces import EnvInfo
from jaxdist.learning import parallel
from jaxdist.learning.learner_logic import LearnerLogic


def optimizer(config: A2CConfig) -> optax.GradientTransformation:
    return actor_critic.clipped_adam(config.learning_rate, config.max_grad_norm, None)


def logic(config: A2CConfig, env: EnvInfo) -> LearnerLogic:
    """What the learner runs, under either architecture."""
    return LearnerLogic(init=functools.partial(actor_critic.init, config, env, optimizer),
                        update=functools.partial(update, config, env),
                        params=functools.partial(actor_critic.published, config))


def update(config: A2CConfig, env: EnvInfo, state: dict[str, Any], batch: dict[str, jax.Array],
           rng: jax.Array) -> tuple[dict[str, Any], dict[str, jax.Array]]:
    del rng  # A2C draws nothing
    net = actor_critic.network(config, env)
    time_major = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731
    ended = time_major(batch["terminated"] | batch["truncated"])
    obs, reward, stats = actor_critic.normalized(config, state, batch, ended)

    def loss(params: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
        dist, value = net.apply(params, obs)
        advantage, target, real = gae(reward, time_major(jax.lax.stop_gradient(value)),
                                      time_major(batch["terminated"]), time_major(batch["truncated"]),
                                      config.gamma, config.gae_lambda)
        weight = time_major(real).astype(jnp.float32)
        logp = actor_critic.log_prob(env.action, dist, batch["action"])[:, :-1]
        policy_loss = -parallel.weighted_mean(logp * time_major(advantage), weight)
        value_loss = 0.5 * parallel.weighted_mean((value[:, :-1] - time_major(target)) ** 2, weight)
        entropy = parallel.weighted_mean(actor_critic.entropy(env.action, dist)[:, :-1], weight)
        total = policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy
        return total, {"loss": total, "policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy}

    grads, metrics = jax.grad(loss, has_aux=True)(state["params"])
    updates, opt_state = optimizer(config).update(parallel.pmean(grads), state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return {**state, **stats, "params": params, "opt_state": opt_state, "version": state["version"] + 1}, metrics
