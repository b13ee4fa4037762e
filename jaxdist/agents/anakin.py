"""Anakin (Hessel et al., 2021, "Podracer architectures"): acting and learning in one jitted
function, for environments written in JAX (:mod:`jaxdist.jax_envs`).

An on-policy agent's update already takes a batch of ``B`` trajectories of ``T + 1`` rows. Here
the batch is not sent by actors: every update first plays ``T`` steps of ``B`` envs with the
current parameters (policy and env ``vmap``-ed over the envs, the steps under ``lax.scan``,
autoreset inside), in the same row convention as :mod:`jaxdist.nodes.actor`, then runs the
agent's own update on it. So the agent's math is shared by both architectures, and the generic
:class:`~jaxdist.nodes.learner.Learner` runs the loop: its checkpoints (which now hold the envs
too), metrics, publishing and stops are the distributed mode's. On several devices the learner
runs under ``pmap``: each device plays its own envs and gradients are averaged; on several hosts
the learner spans them as in the distributed mode (``jax.distributed``).

The envs are those of the learner's state: the trajectories never leave the device, and the
policy lag is 0 (every row is acted by the parameters that learn from it).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from jaxdist import jax_envs, parallel
from jaxdist.nodes.learner import LearnerLogic

PyTree = Any


def logic(agent_logic: LearnerLogic, policy: Any, env_id: str, num_envs: int, length: int) -> LearnerLogic:
    """The ``LearnerLogic`` of Anakin over ``agent_logic``: ``num_envs`` envs of ``env_id``
    (its JAX port) acted by ``policy`` (``(params, obs, key) -> (action, {"logp": ...})``, fed
    with ``agent_logic.params``), ``length`` steps a trajectory."""
    env = jax_envs.jax_env(env_id)
    return LearnerLogic(init=functools.partial(_init, agent_logic, env, num_envs),
                        update=functools.partial(_update, agent_logic, policy, env, length),
                        params=lambda state: agent_logic.params(state["agent"]))


def no_batch() -> dict:
    """The learner's batch source under Anakin: the batch is made inside the update."""
    return {}


def _init(agent_logic: LearnerLogic, env: jax_envs.JaxEnv, num_envs: int, rng: jax.Array) -> dict[str, PyTree]:
    agent_key, env_key = jax.random.split(rng)
    env_state, obs = jax.vmap(env.reset)(jax.random.split(env_key, num_envs))
    row = {"obs": obs, "reward": jnp.zeros(num_envs, obs.dtype),
           "terminated": jnp.zeros(num_envs, bool), "truncated": jnp.zeros(num_envs, bool)}
    return {"agent": agent_logic.init(agent_key),
            "envs": {"state": env_state, "row": row, "return": jnp.zeros(num_envs, obs.dtype)}}


def _update(agent_logic: LearnerLogic, policy: Any, env: jax_envs.JaxEnv, length: int, state: dict[str, PyTree],
            batch: dict, rng: jax.Array) -> tuple[dict[str, PyTree], dict[str, jax.Array]]:
    del batch  # made here
    act_key, learn_key = jax.random.split(rng)
    envs, trajectories, finished = rollout(policy, env, agent_logic.params(state["agent"]), state["envs"],
                                           act_key, length)
    version = state["agent"]["version"]
    trajectories["version"] = jnp.full(trajectories["reward"].shape, version, jnp.int32)
    agent_state, metrics = agent_logic.update(state["agent"], trajectories, learn_key)
    returns, ended = finished
    total, count = parallel.pmean((jnp.sum(jnp.where(ended, returns, 0.0)), jnp.sum(ended).astype(jnp.float32)))
    metrics = dict(metrics, episodes=count * parallel.shard_count(),  # every device plays its own envs
                   episode_return=jnp.where(count > 0, total / jnp.maximum(count, 1.0), jnp.nan))
    return {"agent": agent_state, "envs": envs}, metrics


def rollout(policy: Any, env: jax_envs.JaxEnv, params: PyTree, envs: dict[str, PyTree], key: jax.Array,
            length: int) -> tuple[dict[str, PyTree], dict[str, jax.Array], tuple[jax.Array, jax.Array]]:
    """``length`` steps of every env in ``envs``: ``(envs after, trajectories, (returns, ended))``.

    Trajectories are ``(num_envs, length + 1, ...)``: rows ``obs, reward, terminated,
    truncated`` (arriving at ``obs``), ``action`` and the policy's extras (acting on ``obs``);
    the last row is the next rollout's first, its action left 0 (it only bootstraps). A row
    that ended an episode is followed by a reset, the action chosen on it ignored (gymnasium's
    NEXT_STEP autoreset). ``returns[t, i]`` is the return of the episode env ``i`` ended at step
    ``t`` where ``ended[t, i]``.
    """
    num_envs = envs["row"]["obs"].shape[0]

    def step(carry: dict[str, PyTree], key: jax.Array) -> tuple[dict[str, PyTree], tuple]:
        act_key, reset_key = jax.random.split(key)
        row = carry["row"]
        action, extras = policy(params, row["obs"], act_key)
        restart = row["terminated"] | row["truncated"]
        stepped = jax.vmap(env.step)(carry["state"], action)
        fresh_state, fresh_obs = jax.vmap(env.reset)(jax.random.split(reset_key, num_envs))
        pick = lambda fresh, stepped: jnp.where(_per_env(restart, fresh), fresh, stepped)  # noqa: E731
        next_row = {"obs": pick(fresh_obs, stepped.obs), "reward": pick(jnp.zeros_like(stepped.reward), stepped.reward),
                    "terminated": pick(False, stepped.terminated), "truncated": pick(False, stepped.truncated)}
        episode_return = jnp.where(restart, 0.0, carry["return"]) + next_row["reward"]
        ended = next_row["terminated"] | next_row["truncated"]
        carry = {"state": jax.tree.map(pick, fresh_state, stepped.state), "row": next_row, "return": episode_return}
        return carry, ({**row, "action": action, **extras}, (episode_return, ended))

    envs, (rows, finished) = jax.lax.scan(step, envs, jax.random.split(key, length))
    last = {**envs["row"], **{name: jnp.zeros_like(value[0]) for name, value in rows.items() if name not in envs["row"]}}
    trajectories = jax.tree.map(lambda xs, x: jnp.swapaxes(jnp.concatenate([xs, x[None]]), 0, 1), rows, last)
    return envs, trajectories, finished


def _per_env(flag: jax.Array, like: jax.Array) -> jax.Array:
    """``flag`` (num_envs,) shaped to broadcast against ``like`` (num_envs, ...)."""
    return flag.reshape(flag.shape + (1,) * (jnp.ndim(like) - 1))
