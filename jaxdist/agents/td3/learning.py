"""TD3's math (Fujimoto et al. 2018) on SAC's twin critics (``jaxdist.agents.sac.learning``):

    a' = clip(pi'(s') + clip(eps, -c, c), -1, 1),   eps ~ N(0, sigma~)   (target policy smoothing)
    y  = r + discount * min_j Q'_j(s', a')                                (clipped double Q)

the critics step towards ``y`` every update; every ``policy_delay``-th update the policy
ascends ``Q_1(s, pi(s))`` and the target policy and critics follow by Polyak averaging (the
delayed policy updates). Actions are in ``[-1, 1]`` as SAC's; actors add Gaussian noise of their
own scale."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxdist.agents.sac import anakin
from jaxdist.agents.sac.learning import (adam, critic, critic_step, explore_or_random, init_critics, learner_logic,
                                         mlp_torso, polyak, published, replay_batch, to_env, twin_target,
                                         with_priorities)
from jaxdist.agents.td3 import TD3Config
from jaxdist.envs.spaces import EnvInfo
from jaxdist.learning.learner_logic import LearnerLogic

PyTree = Any


class DeterministicPolicy(nn.Module):
    """``obs -> tanh(...)``: an action in ``[-1, 1]^d``."""

    action_dims: int
    network: Any = "mlp"
    hidden: tuple[int, ...] = (256, 256)

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        return jnp.tanh(nn.Dense(self.action_dims)(mlp_torso(self.network, self.hidden)(obs.astype(jnp.float32))))


def deterministic_policy(config: Any, env: EnvInfo) -> DeterministicPolicy:
    return DeterministicPolicy(env.action.size, config.network, tuple(config.hidden))


def smoothed_target_action(action: jax.Array, key: jax.Array, noise: float, clip: float) -> jax.Array:
    """``clip(action + clip(N(0, noise), -clip, clip), -1, 1)``: target policy smoothing."""
    eps = jnp.clip(noise * jax.random.normal(key, action.shape), -clip, clip)
    return jnp.clip(action + eps, -1.0, 1.0)


def logic(config: TD3Config, env: EnvInfo) -> LearnerLogic:
    """TD3's ``LearnerLogic`` for the generic ``jaxdist.nodes.learner.Learner``."""
    return learner_logic(config, env, init, update)


def anakin_logic(config: TD3Config, env: EnvInfo) -> LearnerLogic:
    """TD3 under ``--architecture anakin``: the same update, its replay on the device."""
    return anakin.logic(config, env, logic(config, env))


@functools.partial(jax.jit, static_argnums=(0, 1))
def init(config: TD3Config, env: EnvInfo, rng: jax.Array) -> dict[str, PyTree]:
    policy_key, critic_key = jax.random.split(rng)
    policy = deterministic_policy(config, env).init(policy_key, jnp.zeros((1, *env.obs_shape), jnp.float32))
    return {"policy": policy, "target_policy": policy, "policy_opt": adam(config).init(policy),
            **init_critics(config, env, critic_key), "updates": jnp.zeros((), jnp.int32)}


def update(config: TD3Config, env: EnvInfo, state: dict[str, PyTree], batch: dict[str, Any],
           rng: jax.Array) -> tuple[dict[str, PyTree], dict[str, jax.Array]]:
    """One TD3 update: the critics every time; the policy and the targets every
    ``policy_delay``-th (``lax.cond``: the other updates skip their cost)."""
    data, weights = replay_batch(config, env, batch)
    network = deterministic_policy(config, env)
    next_action = smoothed_target_action(network.apply(state["target_policy"], data["next_obs"]), rng,
                                         config.policy_noise, config.noise_clip)
    target = twin_target(data["reward"], data["discount"],
                         critic(config).apply(state["target_critic"], data["next_obs"], next_action))
    critic_params, critic_opt, td_abs, metrics = critic_step(config, state["critic"], state["critic_opt"], data,
                                                             target, weights)
    updates = state["updates"] + 1

    def policy_step(state: dict[str, PyTree]) -> dict[str, PyTree]:
        def loss(params: PyTree) -> jax.Array:
            return -jnp.mean(critic(config).apply(critic_params, data["obs"], network.apply(params, data["obs"]))[0])

        grads = jax.grad(loss)(state["policy"])
        steps, policy_opt = adam(config).update(grads, state["policy_opt"], state["policy"])
        policy = optax.apply_updates(state["policy"], steps)
        return dict(state, policy=policy, policy_opt=policy_opt,
                    target_policy=polyak(policy, state["target_policy"], config.tau),
                    target_critic=polyak(critic_params, state["target_critic"], config.tau))

    state = jax.lax.cond(updates % config.policy_delay == 0, policy_step, lambda state: state, state)
    state = dict(state, critic=critic_params, critic_opt=critic_opt, updates=updates)
    return state, with_priorities(config, metrics, td_abs)


@dataclasses.dataclass(frozen=True)
class NoisyDeterministic:
    """``(params, obs, key) -> (action, {})``: the policy plus Gaussian noise of std ``noise``
    (clipped to the bounds; random before the first update), or with ``noise`` None the policy
    alone, as evaluation and ``load_policy`` play. Picklable, hashable."""

    env: EnvInfo
    network: Any
    hidden: tuple[int, ...]
    noise: float | None

    def __call__(self, params: Any, obs: Any, key: Any) -> tuple[Any, dict[str, Any]]:
        action = DeterministicPolicy(self.env.action.size, self.network, tuple(self.hidden)).apply(params["policy"],
                                                                                                    obs)
        if self.noise is None:
            return to_env(self.env.action, action), {}
        noise_key, random_key = jax.random.split(key)
        noisy = jnp.clip(action + self.noise * jax.random.normal(noise_key, action.shape), -1.0, 1.0)
        chex.assert_equal_shape([noisy, action])
        return to_env(self.env.action, explore_or_random(params, noisy, random_key)), {}


def policy(config: TD3Config, env: EnvInfo, actor: int | None) -> NoisyDeterministic:
    """An ``Agent.policy``: actor i explores with its own noise scale; the evaluator plays the
    policy without noise."""
    return NoisyDeterministic(env, config.network, tuple(config.hidden),
                              None if actor is None else config.actor_noise(actor))
