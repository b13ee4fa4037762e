"""The mean policy in gymnasium's own env rather than the JAX port: the returns a run reports."""

from __future__ import annotations

import functools

import gymnasium as gym
import jax
import numpy as np

from jaxdist.agents.es.policy import Policy


@functools.partial(jax.jit, static_argnums=0)
def _actions(policy: Policy, theta: jax.Array, obs: jax.Array) -> jax.Array:
    return jax.vmap(policy.act, (None, 0))(theta, obs)


def gymnasium_returns(env_id: str, policy: Policy, theta: jax.Array, episodes: int, seed: int) -> np.ndarray:
    """Returns of ``episodes`` episodes of ``gymnasium.make(env_id)`` (its time limit included),
    reset with seeds ``seed, seed + 1, ...``; one batched policy call per step for all of them."""
    envs = [gym.make(env_id) for _ in range(episodes)]
    try:
        obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
        returns, done = np.zeros(episodes), np.zeros(episodes, bool)
        while not done.all():
            actions = np.asarray(_actions(policy, theta, obs))
            for i in np.flatnonzero(~done):
                action = int(actions[i]) if policy.discrete else actions[i].astype(np.float32)
                obs[i], reward, terminated, truncated, _ = envs[i].step(action)
                returns[i] += reward
                done[i] = terminated or truncated
        return returns
    finally:
        for env in envs:
            env.close()
