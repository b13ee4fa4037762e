"""IMPALA with V-trace (Espeholt et al., 2018): ``vtrace.py`` (the off-policy correction, a pure
function), ``learning.py`` (the loss and the jitted update) and ``config.py`` (``IMPALAConfig``
and per-env presets). Actors run the shared actor-critic policy, which sends the behaviour
log-probs V-trace needs; the learner and the topology are the shared ones."""

from __future__ import annotations

from typing import Any

import jaxdist as jd
from jaxdist.agents import distributed, policies
from jaxdist.agents.impala.config import PRESETS, IMPALAConfig
from jaxdist.spaces import EnvInfo, env_info


def learner_logic(config: IMPALAConfig, env: EnvInfo) -> Any:
    from jaxdist.agents.impala import learning

    return learning.logic(config, env)


def agent(config: IMPALAConfig) -> distributed.Agent:
    return distributed.Agent("impala", config, env_info(config.env_id), learner_logic, policies.actor_critic,
                             distributed.fifo)


def make_program(config: IMPALAConfig) -> jd.Program:
    return distributed.make_program(agent(config))


__all__ = ["IMPALAConfig", "PRESETS", "agent", "make_program"]
