"""The policy step IMPALA's actors run: sample an action for every env in one jitted call, and
send the behaviour policy's logits with it (the learner's V-trace importance weights need
``mu(a|x)`` of the policy that actually acted, whatever version that was)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class PolicyStep:
    """``(params, obs, key) -> (action, {"logits"})`` for a batch of observations; the actor
    jits it. Picklable and free of JAX imports until called, so a launching process can hand it
    to actor processes without importing JAX. Only the policy MLP runs: the learner computes
    values with its own parameters."""

    num_actions: int
    hidden: tuple[int, ...] = (64, 64)

    def __call__(self, params: Any, obs: Any, key: Any) -> tuple[Any, dict[str, Any]]:
        import jax
        import jax.numpy as jnp

        from jaxdist.agents.networks import ActorCritic

        logits = ActorCritic(self.num_actions, self.hidden).apply(params, obs, method="logits")
        action = jax.random.categorical(key, logits)
        return action.astype(jnp.int32), {"logits": logits}
