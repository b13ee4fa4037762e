"""PPO: ``learning.py`` (the math: GAE, the clipped loss, the jitted update) and ``config.py``
(``PPOConfig`` and per-env presets). The actors run the shared actor-critic policy
(``jaxdist.agents.policies``), the learner is the generic one, the topology the shared one
(``jaxdist.agents.distributed``): ``jd.launch(ppo.make_program(ppo.PPOConfig())).wait()``."""

from __future__ import annotations

from typing import Any

import jaxdist as jd
from jaxdist.agents import distributed, policies
from jaxdist.agents.ppo.config import PRESETS, PPOConfig
from jaxdist.spaces import EnvInfo, env_info


def learner_logic(config: PPOConfig, env: EnvInfo) -> Any:
    from jaxdist.agents.ppo import learning

    return learning.logic(config, env)


def agent(config: PPOConfig) -> distributed.Agent:
    return distributed.Agent("ppo", config, env_info(config.env_id), learner_logic, policies.actor_critic,
                             distributed.fifo)


def make_program(config: PPOConfig) -> jd.Program:
    return distributed.make_program(agent(config))


__all__ = ["PPOConfig", "PRESETS", "agent", "make_program"]
