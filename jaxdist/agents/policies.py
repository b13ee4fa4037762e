"""The policies actors, the evaluator and ``load_policy`` run: ``(params, obs, key) -> (action,
extras)`` for a batch of observations (see :mod:`jaxdist.nodes.actor`). Frozen dataclasses,
picklable and free of JAX imports until called, so a launching process hands them to actor
processes without importing JAX."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxdist.envs.spaces import EnvInfo


@dataclasses.dataclass(frozen=True)
class ActorCriticPolicy:
    """PPO's and IMPALA's: sample from the actor-critic's distribution and send its log-prob
    (PPO's ratio and V-trace's importance weights need ``mu(a|x)`` of the policy that acted);
    ``deterministic``: its mode, no extras. ``params`` are the learner's published
    ``{"network"}``, with ``"obs_norm"`` (running statistics) when the agent normalises
    observations."""

    env: EnvInfo
    network: Any
    hidden: tuple[int, ...]
    deterministic: bool = False

    def __call__(self, params: Any, obs: Any, key: Any) -> tuple[Any, dict[str, Any]]:
        from jaxdist.agents import distributions, normalization
        from jaxdist.agents.networks import ActorCritic

        net = ActorCritic(action=self.env.action, network=self.network, hidden=tuple(self.hidden))
        if "obs_norm" in params:
            obs = normalization.normalize(normalization.RunningStats(**params["obs_norm"]), obs)
        dist = net.apply(params["network"], obs, method="policy")
        if self.deterministic:
            return distributions.mode(self.env.action, dist), {}
        action = distributions.sample(self.env.action, dist, key)
        return action, {"logp": distributions.log_prob(self.env.action, dist, action)}


def actor_critic(config: Any, env: EnvInfo, actor: int | None) -> ActorCriticPolicy:
    """An ``Agent.policy``: every actor samples; the evaluator (``actor`` None) acts by the mode."""
    return ActorCriticPolicy(env, config.network, tuple(config.hidden), deterministic=actor is None)
