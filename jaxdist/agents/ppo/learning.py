"""PPO's math (Schulman et al., 2017): GAE, the clipped surrogate loss, and one jitted update of
several epochs x minibatches. Everything here is a pure function; the distribution (actors,
replay, the learner node) lives elsewhere.

**Batch.** ``B`` trajectories of ``T + 1`` rows each, every leaf shaped ``(B, T + 1, ...)``:
``obs``, ``action``, ``reward``, ``terminated``, ``truncated`` (the row convention of
:mod:`jaxdist.envs.vector`: a row describes arriving at ``obs``), and from the acting policy ``logp``
(of ``action``) and ``version`` (the parameter version that chose the action). Actions are
discrete or continuous: the policy's distribution comes from :mod:`jaxdist.agents.actor_critic`. An
actor's consecutive trajectories share a row: the last row of one is the first of the next, and
serves only to bootstrap.

**Which transitions are learned from.** Transition ``t -> t+1`` (action ``a_t`` on ``obs_t``,
reward ``r_{t+1}``) is real unless row ``t`` ended an episode: then the env ignored ``a_t`` and
autoreset (gymnasium's NEXT_STEP mode). A real transition is also dropped when its policy lag,
``learner version - version_t``, exceeds ``max_policy_lag``: the bound that keeps on-policy data
on-policy when actors run ahead of the learner.

**Advantages.** ``delta_t = r_{t+1} + gamma (1 - terminated_{t+1}) V(obs_{t+1}) - V(obs_t)`` and
``A_t = delta_t + gamma lambda (1 - ended_{t+1}) A_{t+1}``, with ``A = 0`` past the last row.
A truncated episode bootstraps from the value of its true last observation (a row of its own).
Values are computed with the learner's parameters, since the actor's may be a few versions old.

**Normalisation** (optional). Observations are normalised by running statistics kept in the
learner's state (updated from each batch after it is learned from) and published with the
parameters, so actors normalise as the learner does; rewards are divided by the running std of
the discounted return.

**Loss** per minibatch, means weighted by the real-and-fresh mask:
``-min(rho A, clip(rho, 1 - eps, 1 + eps) A) + c_v 0.5 (V - (A + V_old))^2 - c_e H(pi)`` with
``rho = pi(a|s) / mu(a|s)`` against the acting policy ``mu`` and ``A`` normalised per minibatch.
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
from jaxdist.agents.ppo import PPOConfig
from jaxdist.envs.spaces import EnvInfo
from jaxdist.learning.learner_logic import LearnerLogic

PyTree = Any


# GAE -------------------------------------------------------------------------------------------


def gae(reward: jax.Array, value: jax.Array, terminated: jax.Array, truncated: jax.Array,
        gamma: float, lam: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Generalized advantage estimates along axis 0 (time): rows ``(T + 1, ...)`` in (rewards
    and values float, ``terminated`` and ``truncated`` bool), ``(advantages, value targets,
    real)`` of shape ``(T, ...)`` out; ``real`` marks transitions that did not cross an
    autoreset boundary (advantages there are 0)."""
    chex.assert_equal_shape([reward, value, terminated, truncated])
    chex.assert_type([reward, value, terminated, truncated], [float, float, bool, bool])
    terminated = terminated.astype(value.dtype)
    ended = jnp.maximum(terminated, truncated.astype(value.dtype))
    delta = reward[1:] + gamma * (1.0 - terminated[1:]) * value[1:] - value[:-1]
    carry_on = gamma * lam * (1.0 - ended[1:])

    def backward(next_advantage: jax.Array, step: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        delta_t, carry_on_t = step
        advantage = delta_t + carry_on_t * next_advantage
        return advantage, advantage

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(value[0]), (delta, carry_on), reverse=True)
    real = ended[:-1] == 0
    advantages = jnp.where(real, advantages, 0.0)
    return advantages, advantages + value[:-1], real


# Loss ------------------------------------------------------------------------------------------


def _global_weighted_mean(x: jax.Array, weight: jax.Array) -> jax.Array:
    """``sum(x w) / sum(w)`` over the global batch, the same on every device: for statistics
    used inside the step (advantage normalisation), not differentiated."""
    total, count = parallel.pmean((jnp.sum(x * weight), jnp.sum(weight)))
    return total / jnp.where(count > 0, count, 1.0)


def ppo_loss(params: PyTree, minibatch: dict[str, jax.Array], config: PPOConfig,
             env: EnvInfo) -> tuple[jax.Array, dict]:
    """The clipped-surrogate PPO loss of one minibatch of flat transitions: ``obs`` (normalised
    if the config says so), ``action``, ``logp`` (acting policy), ``advantage``, ``target``
    (value target), ``weight`` (0 or 1), each with a leading transitions axis ``(N, ...)``; with
    a recurrent core, of whole sequences ``(b, T, ...)`` with their ``first`` and ``core_state``."""
    per_transition = [minibatch[name] for name in ("logp", "advantage", "target", "weight")]
    time_axes = (None,) if actor_critic.recurrent(config) else ()
    chex.assert_rank(per_transition, 1 + len(time_axes))
    chex.assert_type(per_transition, float)
    chex.assert_shape(minibatch["obs"], (None, *time_axes, *env.obs_shape))
    chex.assert_equal_shape_prefix(jax.tree.leaves(minibatch), 1)
    dist, value = actor_critic.apply(config, env, params, minibatch["obs"], minibatch)
    logp = actor_critic.log_prob(env.action, dist, minibatch["action"])
    weight = minibatch["weight"]
    advantage = minibatch["advantage"]
    if config.normalize_advantages:
        mean = _global_weighted_mean(advantage, weight)
        std = jnp.sqrt(_global_weighted_mean((advantage - mean) ** 2, weight))
        advantage = (advantage - mean) / (std + 1e-8)

    log_ratio = logp - minibatch["logp"]
    ratio = jnp.exp(log_ratio)
    eps = config.clip_eps
    surrogate = jnp.minimum(ratio * advantage, jnp.clip(ratio, 1.0 - eps, 1.0 + eps) * advantage)
    policy_loss = -parallel.weighted_mean(surrogate, weight)
    value_loss = 0.5 * parallel.weighted_mean((value - minibatch["target"]) ** 2, weight)
    entropy = parallel.weighted_mean(actor_critic.entropy(env.action, dist), weight)
    loss = policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy
    return loss, {
        "loss": loss, "policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy,
        "approx_kl": parallel.weighted_mean((ratio - 1.0) - log_ratio, weight),
        "clip_fraction": parallel.weighted_mean((jnp.abs(ratio - 1.0) > eps).astype(jnp.float32), weight),
    }


# State and update ------------------------------------------------------------------------------


def optimizer(config: PPOConfig) -> optax.GradientTransformation:
    """Clipped Adam; with ``anneal_lr`` the rate falls linearly to 0 over the run's SGD steps."""
    steps = config.total_updates * config.epochs * config.minibatches if config.anneal_lr else None
    return actor_critic.clipped_adam(config.learning_rate, config.max_grad_norm, steps)


def logic(config: PPOConfig, env: EnvInfo) -> LearnerLogic:
    """PPO's ``LearnerLogic`` for the generic ``jaxdist.nodes.learner.Learner``; the state is
    the shared actor-critic one (:mod:`jaxdist.agents.actor_critic`)."""
    return LearnerLogic(init=functools.partial(actor_critic.init, config, env, optimizer),
                        update=functools.partial(update, config, env),
                        params=functools.partial(actor_critic.published, config))


def update(config: PPOConfig, env: EnvInfo, state: dict[str, PyTree], batch: dict[str, jax.Array],
           rng: jax.Array) -> tuple[dict[str, PyTree], dict[str, jax.Array]]:
    """One PPO update on a batch of trajectories: ``epochs`` passes of ``minibatches`` SGD steps,
    all under ``lax.scan`` in one jitted call. Gradients go through ``parallel.pmean``, so the
    same function runs data-parallel under jit (global batch) and pmap (per-device shards).
    Every leaf of ``batch`` is ``(B, T + 1, ...)`` (the module docstring); with a recurrent core
    also ``first`` (``(B, T + 1)``) and ``core_state`` (the carry each trajectory started from,
    ``(B, ...)``), and the minibatches are of whole trajectories."""
    sequences = actor_critic.recurrent(config)
    chex.assert_equal_shape_prefix([x for name, x in batch.items() if name != "core_state"], 2)
    tx = optimizer(config)
    params, version = state["params"], state["version"]
    time_major = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731
    obs, reward, stats = actor_critic.normalized(config, state, batch,
                                                 time_major(batch["terminated"] | batch["truncated"]))
    values = actor_critic.apply(config, env, params, obs, batch)[1]
    advantage, target, real = gae(reward, time_major(values), time_major(batch["terminated"]),
                                  time_major(batch["truncated"]), config.gamma, config.gae_lambda)
    advantage, target, real = time_major(advantage), time_major(target), time_major(real)
    lag = version - batch["version"][:, :-1]
    fresh = lag <= config.max_policy_lag
    weight = (real & fresh).astype(jnp.float32)

    # Minibatches of transitions, (B, T, ...) -> (B*T, ...); of whole trajectories with a core.
    flat = (lambda x: x) if sequences else (lambda x: x.reshape(-1, *x.shape[2:]))  # noqa: E731
    transitions = {"obs": flat(obs[:, :-1]), "action": flat(batch["action"][:, :-1]),
                   "logp": flat(batch["logp"][:, :-1]), "advantage": flat(advantage),
                   "target": flat(jax.lax.stop_gradient(target)), "weight": flat(weight)}
    if sequences:
        transitions.update(first=batch["first"][:, :-1], core_state=batch["core_state"])
    count = transitions["weight"].shape[0]
    if count % config.minibatches:
        raise ValueError(f"{count} {'trajectories' if sequences else 'transitions'} per update do not split into "
                         f"{config.minibatches} minibatches")

    def sgd_step(carry: tuple, indices: jax.Array) -> tuple[tuple, dict]:
        params, opt_state = carry
        minibatch = jax.tree.map(lambda x: x[indices], transitions)
        grads, info = jax.grad(ppo_loss, has_aux=True)(params, minibatch, config, env)
        updates, opt_state = tx.update(parallel.pmean(grads), opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), info

    def epoch(carry: tuple, key: jax.Array) -> tuple[tuple, dict]:
        order = jax.random.permutation(key, count).reshape(config.minibatches, -1)
        return jax.lax.scan(sgd_step, carry, order)

    (new_params, new_opt_state), info = jax.lax.scan(epoch, (params, state["opt_state"]),
                                                     jax.random.split(rng, config.epochs))
    # A batch with nothing to learn from (all of it too stale) must not move the parameters:
    # with zero gradients Adam would still step along its momentum.
    learned = parallel.pmean(jnp.sum(weight)) > 0  # the same on every device under pmap
    params, opt_state = jax.tree.map(lambda new, old: jnp.where(learned, new, old),
                                     (new_params, new_opt_state), (params, state["opt_state"]))
    real_f = real.astype(jnp.float32)
    metrics = {name: jnp.mean(value) for name, value in info.items()}
    metrics.update(
        policy_lag_mean=parallel.weighted_mean(lag.astype(jnp.float32), real_f),
        # As version - the oldest behaviour version, not max(lag): where every row was played by
        # the learned version (Anakin) lag is a constant XLA folds element by element at compile
        # time, which grows with the envs (a quarter of the compile at 32768 envs).
        policy_lag_max=(version - jnp.min(jnp.where(real, batch["version"][:, :-1], version))).astype(jnp.float32),
        stale_fraction=parallel.weighted_mean((~fresh).astype(jnp.float32), real_f),
        transitions=jnp.sum(weight),
        value_mean=jnp.mean(values),
    )
    return {"params": params, "opt_state": opt_state, "version": version + 1, **stats}, metrics
