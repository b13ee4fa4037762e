"""IMPALA's network for discrete actions: the actor-critic of two tanh MLPs that PPO uses
(``jaxdist.agents.ppo.networks``), imported rather than copied. The paper's agent shares a torso
between policy and baseline; on small control tasks separate MLPs keep the baseline loss from
pulling on the policy's features, and ``method="logits"`` lets actors run the policy alone."""

from __future__ import annotations

from jaxdist.agents.ppo.networks import ActorCritic

__all__ = ["ActorCritic"]
