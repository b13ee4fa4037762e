"""IMPALA's math (Espeholt et al., 2018): the loss on V-trace targets and one jitted update.
Everything here is a pure function; the distribution (actors, replay, the learner node) lives
elsewhere, and V-trace itself in :mod:`jaxdist.agents.impala.vtrace`.

**Batch.** ``B`` trajectories of ``T + 1`` rows each, every leaf shaped ``(B, T + 1, ...)``:
``obs``, ``action``, ``reward``, ``terminated``, ``truncated`` (the row convention of
:mod:`jaxdist.envs`), and from the acting policy ``logits`` (the behaviour policy ``mu`` at
``obs``) and ``version`` (the parameter version that chose the action). The last row serves only
to bootstrap (it is the next trajectory's first).

**Loss**, means over the real transitions (not across an autoreset) of the whole batch::

    -log pi(a_s|x_s) A_s  +  baseline_cost 0.5 (v_s - V(x_s))^2  -  ent_coef H(pi(.|x_s))

with ``v_s`` and ``A_s`` from V-trace with ``log rho = log pi(a|x) - log mu(a|x)``, computed from
the learner's current parameters (policy and values) and the behaviour logits. Every
transition is learned from however stale: the truncated importance weights are the correction.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxdist import parallel
from jaxdist.agents import networks
from jaxdist.agents.impala.config import IMPALAHyperparams
from jaxdist.agents.impala.vtrace import vtrace

PyTree = Any


def _weighted_mean(x: jax.Array, weight: jax.Array) -> jax.Array:
    return jnp.sum(x * weight) / jnp.maximum(jnp.sum(weight), 1.0)


def _time_major(x: jax.Array) -> jax.Array:
    return jnp.swapaxes(x, 0, 1)


def _action_log_prob(logits: jax.Array, action: jax.Array) -> jax.Array:
    return jnp.take_along_axis(jax.nn.log_softmax(logits), action[..., None].astype(jnp.int32), -1)[..., 0]


def impala_loss(params: PyTree, batch: dict[str, jax.Array], hp: IMPALAHyperparams) -> tuple[jax.Array, dict]:
    """The IMPALA loss of a batch of trajectories (see the module docstring) and its parts."""
    logits, value = hp.network().apply(params, batch["obs"])  # (B, T + 1, A), (B, T + 1)
    log_probs = jax.nn.log_softmax(logits[:, :-1])
    action = batch["action"][:, :-1]
    logp = _action_log_prob(logits[:, :-1], action)
    log_rho = logp - _action_log_prob(batch["logits"][:, :-1], action)
    corrected = vtrace(_time_major(value), _time_major(batch["reward"]), _time_major(batch["terminated"]),
                       _time_major(batch["truncated"]), _time_major(log_rho), hp.gamma, rho_bar=hp.rho_bar,
                       c_bar=hp.c_bar, pg_rho_bar=hp.pg_rho_bar, lam=hp.trace_lambda)
    targets, advantages, real = (_time_major(x) for x in corrected)
    weight = real.astype(jnp.float32)
    policy_loss = -_weighted_mean(logp * advantages, weight)
    baseline_loss = 0.5 * _weighted_mean((targets - value[:, :-1]) ** 2, weight)
    entropy = _weighted_mean(-jnp.sum(jnp.exp(log_probs) * log_probs, -1), weight)
    loss = policy_loss + hp.baseline_cost * baseline_loss - hp.ent_coef * entropy
    rho = jnp.exp(log_rho)
    return loss, {
        "loss": loss, "policy_loss": policy_loss, "baseline_loss": baseline_loss, "entropy": entropy,
        "rho_mean": _weighted_mean(rho, weight),
        "rho_clipped_fraction": _weighted_mean((rho > hp.rho_bar).astype(jnp.float32), weight),
        "advantage_mean": _weighted_mean(advantages, weight), "value_mean": _weighted_mean(value[:, :-1], weight),
        "transitions": jnp.sum(weight),
    }


def optimizer(hp: IMPALAHyperparams) -> optax.GradientTransformation:
    """Clipped Adam; with ``anneal_lr`` the rate falls linearly to 0 over the run's updates."""
    return networks.clipped_adam(hp.learning_rate, hp.max_grad_norm,
                                 hp.total_updates if hp.anneal_lr and hp.total_updates else None)


def init(hp: IMPALAHyperparams, rng: jax.Array) -> dict[str, PyTree]:
    """``{"params", "opt_state", "version"}`` (see ``networks.init_train_state``)."""
    return networks.init_train_state(hp, optimizer, rng)


def update(hp: IMPALAHyperparams, state: dict[str, PyTree], batch: dict[str, jax.Array],
           rng: jax.Array) -> tuple[dict[str, PyTree], dict[str, jax.Array]]:
    """One SGD step on a batch of trajectories. Gradients go through ``parallel.pmean``, so the
    same function runs data-parallel under jit (global batch) and pmap (per-device shards).
    ``rng`` is unused: the loss is deterministic (kept for the ``LearnerLogic`` contract)."""
    del rng
    tx = optimizer(hp)
    grads, info = jax.grad(impala_loss, has_aux=True)(state["params"], batch, hp)
    grads = parallel.pmean(grads)
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    version = state["version"]
    lag = (version - batch["version"][:, :-1]).astype(jnp.float32)
    weight = (~(batch["terminated"] | batch["truncated"])[:, :-1]).astype(jnp.float32)
    info.update(policy_lag_mean=_weighted_mean(lag, weight), policy_lag_max=jnp.max(lag * weight),
                grad_norm=optax.tree.norm(grads))
    return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state,
            "version": version + 1}, info
