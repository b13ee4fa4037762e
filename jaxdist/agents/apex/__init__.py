"""Ape-X DQN (Horgan et al. 2018): ``learning.py`` (the math: n-step returns, initial priorities,
double-DQN targets, the importance-weighted loss, the jitted update), ``acting.py`` (the epsilon
schedule, the epsilon-greedy policy, the sink that inserts n-step transitions with priorities)
and ``config.py`` (``ApexConfig``). The learner, which writes priorities back, and the topology
are the shared ones; the Q-network (dueling) is ``jaxdist.agents.networks.QNetwork``."""

from __future__ import annotations

import math
from typing import Any

import jaxdist as jd
from jaxdist.agents import distributed
from jaxdist.agents.apex import acting
from jaxdist.agents.apex.config import PRESETS, ApexConfig
from jaxdist.spaces import EnvInfo, env_info


def learner_logic(config: ApexConfig, env: EnvInfo) -> Any:
    from jaxdist.agents.apex import learning

    return learning.logic(config, env)


def replay_table(config: ApexConfig) -> jd.replay.Prioritized:
    """The prioritized table, rate-limited to ``samples_per_insert``. Its window leaves room for
    every actor's largest insert (and one learner request: a dispatch's batches) on either side
    of the target ratio."""
    spi = config.samples_per_insert
    request = config.batch_size * config.learner_steps_per_call
    error_buffer = math.ceil(spi * config.num_actors * config.transitions_per_send + request + spi)
    limiter = jd.replay.SampleToInsertRatio(spi, config.min_replay, error_buffer)
    return jd.replay.Prioritized(config.replay_size, config.priority_exponent, limiter, seed=config.seed)


def agent(config: ApexConfig) -> distributed.Agent:
    env = env_info(config.env_id)
    if not env.action.discrete:
        raise ValueError(f"DQN chooses among discrete actions; {config.env_id} has a continuous action space "
                         f"(use PPO or IMPALA)")
    return distributed.Agent("apex", config, env, learner_logic, acting.policy, replay_table,
                             sink=acting.TransitionSink, prioritized=True)


def make_program(config: ApexConfig) -> jd.Program:
    return distributed.make_program(agent(config))


__all__ = ["ApexConfig", "PRESETS", "agent", "make_program"]
