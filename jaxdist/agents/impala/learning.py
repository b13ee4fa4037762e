"""IMPALA's math (Espeholt et al., 2018): the loss on V-trace targets and one jitted update.
Everything here is a pure function; the distribution (actors, replay, the learner node) lives
elsewhere, and V-trace itself in :mod:`jaxdist.agents.impala.vtrace`.

**Batch.** ``B`` trajectories of ``T + 1`` rows each, every leaf shaped ``(B, T + 1, ...)``:
``obs``, ``action``, ``reward``, ``terminated``, ``truncated`` (the row convention of
:mod:`jaxdist.envs.vector`), and from the acting policy ``logp`` (``log mu(a|x)`` of the behaviour
policy, discrete or continuous) and ``version`` (the parameter version that chose the action). The last row serves only
to bootstrap (it is the next trajectory's first).

**Loss**, means over the real transitions (not across an autoreset) of the whole batch::

    -log pi(a_s|x_s) A_s  +  baseline_cost 0.5 (v_s - V(x_s))^2  -  ent_coef H(pi(.|x_s))

with ``v_s`` and ``A_s`` from V-trace with ``log rho = log pi(a|x) - log mu(a|x)``, computed from
the learner's current parameters (policy and values) and the behaviour log-probs. Observation
normalisation and reward scaling, when configured, are the shared actor-critic ones
(:mod:`jaxdist.agents.actor_critic`). Every
transition is learned from however stale: the truncated importance weights are the correction.
"""

from __future__ import annotations

import functools
from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax

from jaxdist.learning import parallel
from jaxdist.agents import actor_critic
from jaxdist.agents.impala import IMPALAConfig
from jaxdist.agents.impala.vtrace import vtrace
from jaxdist.envs.spaces import EnvInfo
from jaxdist.learning.learner_logic import LearnerLogic

PyTree = Any


def _time_major(x: jax.Array) -> jax.Array:
    return jnp.swapaxes(x, 0, 1)


def impala_loss(params: PyTree, batch: dict[str, jax.Array], obs: jax.Array, reward: jax.Array,
                config: IMPALAConfig, env: EnvInfo) -> tuple[jax.Array, dict]:
    """The IMPALA loss of a batch of trajectories (see the module docstring) and its parts;
    ``obs`` (``(B, T + 1, ...)``) and the time-major ``reward`` (``(T + 1, B)``) as
    :func:`actor_critic.normalized` gives them."""
    chex.assert_rank(batch["logp"], 2)
    chex.assert_equal_shape_prefix([obs, *(x for name, x in batch.items() if name != "core_state")], 2)
    chex.assert_shape(reward, batch["logp"].shape[::-1])
    dist, value = actor_critic.apply(config, env, params, obs, batch)  # value (B, T + 1)
    logp = actor_critic.log_prob(env.action, dist, batch["action"])[:, :-1]
    log_rho = logp - batch["logp"][:, :-1]
    corrected = vtrace(_time_major(value), reward, _time_major(batch["terminated"]),
                       _time_major(batch["truncated"]), _time_major(log_rho), config.gamma, rho_bar=config.rho_bar,
                       c_bar=config.c_bar, pg_rho_bar=config.pg_rho_bar, lam=config.trace_lambda)
    targets, advantages, real = (_time_major(x) for x in corrected)
    weight = real.astype(jnp.float32)
    policy_loss = -parallel.weighted_mean(logp * advantages, weight)
    baseline_loss = 0.5 * parallel.weighted_mean((targets - value[:, :-1]) ** 2, weight)
    entropy = actor_critic.entropy(env.action, dist)  # per row; a state-independent std: one value
    entropy = parallel.weighted_mean(entropy[:, :-1] if entropy.ndim == 2 else entropy, weight)
    loss = policy_loss + config.baseline_cost * baseline_loss - config.ent_coef * entropy
    rho = jnp.exp(log_rho)
    return loss, {
        "loss": loss, "policy_loss": policy_loss, "baseline_loss": baseline_loss, "entropy": entropy,
        "rho_mean": parallel.weighted_mean(rho, weight),
        "rho_clipped_fraction": parallel.weighted_mean((rho > config.rho_bar).astype(jnp.float32), weight),
        "advantage_mean": parallel.weighted_mean(advantages, weight), "value_mean": parallel.weighted_mean(value[:, :-1], weight),
        "transitions": jnp.sum(weight),
    }


def optimizer(config: IMPALAConfig) -> optax.GradientTransformation:
    """Clipped Adam; with ``anneal_lr`` the rate falls linearly to 0 over the run's updates."""
    return actor_critic.clipped_adam(config.learning_rate, config.max_grad_norm,
                                 config.total_updates if config.anneal_lr else None)


def logic(config: IMPALAConfig, env: EnvInfo) -> LearnerLogic:
    """IMPALA's ``LearnerLogic`` for the generic ``jaxdist.nodes.learner.Learner``."""
    return LearnerLogic(init=functools.partial(actor_critic.init, config, env, optimizer),
                        update=functools.partial(update, config, env),
                        params=functools.partial(actor_critic.published, config))


def update(config: IMPALAConfig, env: EnvInfo, state: dict[str, PyTree], batch: dict[str, jax.Array],
           rng: jax.Array) -> tuple[dict[str, PyTree], dict[str, jax.Array]]:
    """One SGD step on a batch of trajectories. Gradients go through ``parallel.pmean``, so the
    same function runs data-parallel under jit (global batch) and pmap (per-device shards).
    ``rng`` is unused: the loss is deterministic (kept for the ``LearnerLogic`` contract)."""
    del rng
    tx = optimizer(config)
    ended = _time_major(batch["terminated"] | batch["truncated"])
    obs, reward, stats = actor_critic.normalized(config, state, batch, ended)
    grads, info = jax.grad(impala_loss, has_aux=True)(state["params"], batch, obs, reward, config, env)
    grads = parallel.pmean(grads)
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    version = state["version"]
    lag = (version - batch["version"][:, :-1]).astype(jnp.float32)
    weight = (~(batch["terminated"] | batch["truncated"])[:, :-1]).astype(jnp.float32)
    info.update(policy_lag_mean=parallel.weighted_mean(lag, weight), policy_lag_max=jnp.max(lag * weight),
                grad_norm=optax.tree.norm(grads))
    return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state,
            "version": version + 1, **stats}, info
