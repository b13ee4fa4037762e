"""The policy step PPO's actors run: sample an action for every env in one jitted call."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class PolicyStep:
    """``(params, obs, key) -> (action, {"logp"[, "value"]})`` for a batch of observations; the
    actor jits it. Picklable and free of JAX imports until called, so a launching process can
    hand it to actor processes without importing JAX. Without ``with_value`` only the policy
    MLP runs (the learner recomputes values with its own parameters anyway)."""

    num_actions: int
    hidden: tuple[int, ...] = (64, 64)
    with_value: bool = False

    def __call__(self, params: Any, obs: Any, key: Any) -> tuple[Any, dict[str, Any]]:
        import jax
        import jax.numpy as jnp

        from jaxdist.agents.networks import ActorCritic

        network = ActorCritic(self.num_actions, self.hidden)
        if self.with_value:
            logits, value = network.apply(params, obs)
        else:
            logits, value = network.apply(params, obs, method="logits"), None
        action = jax.random.categorical(key, logits)
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[..., None], -1)[..., 0]
        extras = {"logp": logp} if value is None else {"logp": logp, "value": value}
        return action.astype(jnp.int32), extras
