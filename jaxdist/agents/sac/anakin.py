"""An off-policy agent under ``--architecture anakin``: its replay on the device, in the learner's
state (so the learner's checkpoints hold it), filled and sampled inside the jitted update.

:mod:`jaxdist.learning.anakin` hands every update ``B`` trajectories of ``T + 1`` rows it has
just played (the row convention of :mod:`jaxdist.envs.vector`). Here they become ``B * T``
one-step transitions, inserted into a flashbax item buffer (a ring of ``replay_size``); once it
holds ``learning_starts``, ``round(B * T * replay_ratio)`` gradient updates follow under
``lax.scan``, each on ``update_batch`` transitions sampled uniformly: the replay ratio, held
exactly. A transition out of a row that ended an episode crossed an autoreset: it is stored
(the buffer takes fixed-size batches) with ``valid`` 0, which zeroes its weight in the critics'
loss. Until the first gradient update the actors' policy acts at random (``warmup``), as under
Sebulba.
"""

from __future__ import annotations

import functools
from typing import Any

import flashbax
import jax
import jax.numpy as jnp

from jaxdist.agents.sac import OffPolicyConfig
from jaxdist.envs.spaces import EnvInfo
from jaxdist.learning.learner_logic import LearnerLogic

PyTree = Any


def one_step_transitions(trajectories: dict[str, jax.Array], gamma: float) -> dict[str, jax.Array]:
    """``(B, T + 1, ...)`` rows -> ``B * T`` transitions ``{"obs", "action", "reward",
    "discount", "next_obs", "valid"}``: ``discount`` is ``gamma`` (0 into a terminal row),
    ``valid`` 0 for the transition out of a row that ended its episode."""
    ended = trajectories["terminated"] | trajectories["truncated"]
    flat = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731 - (B, T, ...) -> (B * T, ...)
    return {"obs": flat(trajectories["obs"][:, :-1]).astype(jnp.float32),
            "action": flat(trajectories["action"][:, :-1]).astype(jnp.float32),
            "reward": flat(trajectories["reward"][:, 1:]).astype(jnp.float32),
            "discount": flat(gamma * ~trajectories["terminated"][:, 1:]).astype(jnp.float32),
            "next_obs": flat(trajectories["obs"][:, 1:]).astype(jnp.float32),
            "valid": flat(~ended[:, :-1]).astype(jnp.float32)}


def replay(config: OffPolicyConfig) -> Any:
    """The device replay: flashbax's item buffer, uniform, ``update_batch`` a sample."""
    return flashbax.make_item_buffer(max_length=config.replay_size, min_length=config.learning_starts,
                                     sample_batch_size=config.update_batch, add_batches=True)


def logic(config: OffPolicyConfig, env: EnvInfo, agent_logic: LearnerLogic) -> LearnerLogic:
    """``agent_logic`` (the Sebulba learner's) with its replay on the device, for
    ``jaxdist.learning.anakin``: the state is ``{"agent", "replay", "version"}``."""
    return LearnerLogic(init=functools.partial(_init, config, env, agent_logic),
                        update=functools.partial(_update, config, agent_logic),
                        params=lambda state: agent_logic.params(state["agent"]))


def _init(config: OffPolicyConfig, env: EnvInfo, agent_logic: LearnerLogic, rng: jax.Array) -> dict[str, PyTree]:
    obs = jnp.zeros(env.obs_shape, jnp.float32)
    example = {"obs": obs, "action": jnp.zeros(env.action.shape, jnp.float32), "reward": jnp.float32(0),
               "discount": jnp.float32(0), "next_obs": obs, "valid": jnp.float32(0)}
    return {"agent": agent_logic.init(rng), "replay": replay(config).init(example), "version": jnp.int32(0)}


def _update(config: OffPolicyConfig, agent_logic: LearnerLogic, state: dict[str, PyTree],
            trajectories: dict[str, jax.Array], rng: jax.Array) -> tuple[dict[str, PyTree], dict[str, jax.Array]]:
    buffer = replay(config)
    transitions = one_step_transitions(trajectories, config.gamma)
    stored = buffer.add(state["replay"], transitions)
    count = max(1, round(transitions["reward"].shape[0] * config.replay_ratio))

    def learn(agent: PyTree) -> tuple[PyTree, dict[str, jax.Array]]:
        def step(agent: PyTree, key: jax.Array) -> tuple[PyTree, dict[str, jax.Array]]:
            sample_key, update_key = jax.random.split(key)
            return agent_logic.update(agent, buffer.sample(stored, sample_key).experience, update_key)

        agent, metrics = jax.lax.scan(step, agent, jax.random.split(rng, count))
        return agent, jax.tree.map(jnp.mean, metrics)

    shapes = jax.eval_shape(learn, state["agent"])[1]
    wait = lambda agent: (agent, jax.tree.map(lambda m: jnp.full(m.shape, jnp.nan, m.dtype), shapes))  # noqa: E731
    agent, metrics = jax.lax.cond(buffer.can_sample(stored), learn, wait, state["agent"])
    return {"agent": agent, "replay": stored, "version": state["version"] + 1}, metrics
