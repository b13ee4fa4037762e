"""The actors' side of Ape-X: each actor's exploration epsilon, the epsilon-greedy policy step
(its Q-values ride along as extras), and the sink that turns each trajectory into n-step
transitions with initial priorities and inserts them into the prioritized replay."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxdist.envs.spaces import EnvInfo


def actor_epsilons(num_actors: int, base: float = 0.4, alpha: float = 7.0) -> list[float]:
    """``base ** (1 + alpha * i / (N - 1))`` for actor i of N (Horgan et al. 2018); ``[base]``
    for one actor. Spread over many orders of magnitude, so some actors explore hard and the
    last are nearly greedy."""
    if num_actors == 1:
        return [base]
    return [base ** (1 + alpha * i / (num_actors - 1)) for i in range(num_actors)]


@dataclasses.dataclass(frozen=True)
class EpsilonGreedy:
    """``(params, obs, key) -> (action, {"q": Q-values})`` for a batch of observations; the actor
    jits it. The Q-values go out with the trajectory, so the sink can compute initial
    priorities without running the network again. ``epsilon`` None: the greedy policy of
    evaluation and ``load_policy``, no extras. Picklable and free of JAX imports until called."""

    env: EnvInfo
    network: Any
    hidden: tuple[int, ...]
    dueling: bool
    epsilon: float | None

    def __call__(self, params: Any, obs: Any, key: Any) -> tuple[Any, dict[str, Any]]:
        import jax
        import jax.numpy as jnp

        from jaxdist.agents.networks import QNetwork

        num_actions = self.env.action.size
        q = QNetwork(num_actions, self.network, tuple(self.hidden), self.dueling).apply(params["network"], obs)
        if self.epsilon is None:
            return jnp.argmax(q, axis=-1).astype(jnp.int32), {}
        explore_key, action_key = jax.random.split(key)
        batch_shape = q.shape[:-1]
        random_action = jax.random.randint(action_key, batch_shape, 0, num_actions)
        explore = jax.random.uniform(explore_key, batch_shape) < self.epsilon
        action = jnp.where(explore, random_action, jnp.argmax(q, axis=-1))
        return action.astype(jnp.int32), {"q": q}


def policy(config: Any, env: EnvInfo, actor: int | None) -> EpsilonGreedy:
    """An ``Agent.policy``: actor i explores with its epsilon (an actor added by ``running.scale``,
    i >= num_actors, takes actor i % num_actors's); the evaluator acts greedily."""
    epsilons = actor_epsilons(config.num_actors, config.base_epsilon, config.epsilon_alpha)
    return EpsilonGreedy(env, config.network, tuple(config.hidden), config.dueling,
                         None if actor is None else epsilons[actor % len(epsilons)])


def to_transitions(trajectories: list[dict[str, np.ndarray]], gamma: float,
                   n_step: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """An actor's per-env trajectories (``(T + 1, ...)`` rows with the policy's ``q``) -> the
    real n-step transitions, stacked: ``{"obs", "action", "reward", "discount", "next_obs"}``
    with a leading transitions axis (``reward`` the n-step return), and their initial
    priorities."""
    import chex

    from jaxdist.agents.apex import learning

    rows = {name: np.stack([item[name] for item in trajectories], axis=1)  # time-major (T + 1, envs, ...)
            for name in ("obs", "action", "reward", "terminated", "truncated", "q")}
    chex.assert_equal_shape_prefix(list(rows.values()), 2)
    returns, discounts, bootstrap, real = learning.n_step_returns(
        rows["reward"], rows["terminated"], rows["truncated"], gamma, n_step)
    priorities = learning.initial_priorities(rows["q"], rows["action"], returns, discounts, bootstrap)
    time, env = np.nonzero(real)
    transitions = {"obs": rows["obs"][time, env], "action": rows["action"][time, env],
                   "reward": returns[time, env], "discount": discounts[time, env],
                   "next_obs": rows["obs"][bootstrap[time, env], env]}
    return transitions, priorities[time, env]


class TransitionSink:
    """An actor's ``sink(items)`` (an ``Agent.sink``): its trajectories become n-step
    transitions, inserted into the replay node ``replay`` (a client) with their initial
    priorities in one atomic call, stacked (one array per field on the wire, not one per
    transition)."""

    def __init__(self, config: Any, replay: Any, timeout: float | None = 30.0) -> None:
        from jaxdist.nodes.replay import ReplayClient

        self._replay = ReplayClient(replay)
        self._gamma, self._n_step, self._timeout = config.gamma, config.n_step, timeout

    def __call__(self, trajectories: list[dict[str, np.ndarray]]) -> None:
        transitions, priorities = to_transitions(trajectories, self._gamma, self._n_step)
        if len(priorities):
            self._replay.insert_batch(transitions, priorities=priorities, timeout=self._timeout)
