"""Ape-X DQN's math (Horgan et al. 2018): n-step transitions with the actors' initial
priorities, double-DQN targets, the prioritized-replay loss, and one jitted update, all pure;
then the actors' side: each actor's exploration epsilon, the epsilon-greedy policy (its Q-values
ride along as extras), and the sink that turns each trajectory into n-step transitions with
initial priorities and inserts them into the prioritized replay.

**Rows and transitions.** Actors send trajectories of ``T + 1`` rows in the convention of
:mod:`jaxdist.envs.vector`: row t holds ``obs_t``, the reward earned arriving there, whether ``obs_t``
ended its episode (``terminated`` / ``truncated``), and the action taken at ``obs_t``. The
transition from row t is real unless row t ended an episode (the env then ignored the action and
autoreset). Its n-step return looks ``m <= n`` rows ahead, stopping early at the row that ends
the episode or at the trajectory's last row:

    R_t = sum_{k<m} gamma^k r_{t+k+1},   discount_t = gamma^m (0 if row t+m is terminal),
    target_t = R_t + discount_t Q_target(s_{t+m}, argmax_a Q_online(s_{t+m}, a)).

A truncated episode bootstraps from its true last observation, a row of its own.

**Priorities.** An actor inserts each transition with ``|target_t - Q(s_t, a_t)|`` computed
from its own Q-values (its copy of the online network stands in for both networks); after every
update the learner replaces the priorities of the transitions it sampled with their new
``|TD error|``.

**Loss.** ``mean_i w_i huber(target_i - Q(s_i, a_i))`` with importance weights
``w_i = (P_min / P_i)^beta``, i.e. ``(N P_i)^-beta`` normalised by the batch's largest weight.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdist.agents.actor_critic import Network, torso
from jaxdist.agents.apex import ApexConfig
from jaxdist.envs.spaces import EnvInfo
from jaxdist.learning.learner_logic import LearnerLogic
from jaxdist.nodes.replay import ReplayClient

PyTree = Any


# n-step transitions and the actors' priorities (NumPy: they run in the actors' send thread) -----


def n_step_returns(reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, gamma: float,
                   n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """n-step returns along axis 0 (time) of rows ``(T + 1, ...)`` (``terminated`` and
    ``truncated`` bool): ``(returns, discounts, bootstrap rows, real)``, each ``(T, ...)``.
    ``real`` marks the transitions that did not cross an autoreset; for the others the returns
    and discounts are 0."""
    chex.assert_equal_shape([reward, terminated, truncated])
    chex.assert_type([reward, terminated, truncated], [float, bool, bool])
    last = reward.shape[0] - 1
    ended = np.logical_or(terminated, truncated)
    column = lambda x: x.reshape((-1,) + (1,) * (reward.ndim - 1))  # noqa: E731 - (T,) against (T, ...)
    t = np.arange(last)
    real = ~ended[:-1]
    returns = np.zeros(reward[:-1].shape, np.float32)
    discounts = np.zeros(reward[:-1].shape, np.float32)
    bootstrap = np.broadcast_to(column(t), returns.shape)
    going = real  # still looking further ahead
    for k in range(1, n + 1):
        row = np.minimum(t + k, last)
        step = going & column(t + k <= last)
        returns = returns + np.where(step, np.float32(gamma ** (k - 1)) * reward[row], np.float32(0))
        discounts = np.where(step, np.float32(gamma**k) * ~terminated[row], discounts)
        bootstrap = np.where(step, column(row), bootstrap)
        going = step & ~ended[row]
    return returns, discounts.astype(np.float32), bootstrap, real


def initial_priorities(q: np.ndarray, action: np.ndarray, returns: np.ndarray, discounts: np.ndarray,
                       bootstrap: np.ndarray) -> np.ndarray:
    """|n-step TD error| of every transition of a trajectory from the actor's own Q-values:
    ``q (T + 1, ..., A)`` and ``action (T + 1, ...)`` per row; the rest as ``n_step_returns``
    gives them. With one network, the double-DQN bootstrap is ``max_a Q(s_{t+m}, a)``."""
    chex.assert_equal_shape([returns, discounts, bootstrap])
    chex.assert_shape(action, (returns.shape[0] + 1, *returns.shape[1:]))
    chex.assert_shape(q, (*action.shape, None))
    chex.assert_type(bootstrap, int)
    q_max = np.max(q, axis=-1)
    bootstrap_value = np.take_along_axis(q_max, bootstrap, axis=0)
    q_taken = np.take_along_axis(q[:-1], action[:-1, ..., None].astype(np.int64), axis=-1)[..., 0]
    return np.abs(returns + discounts * bootstrap_value - q_taken)


# Targets and loss ------------------------------------------------------------------------------


def double_q_targets(reward: jax.Array, discount: jax.Array, q_next_online: jax.Array,
                     q_next_target: jax.Array) -> jax.Array:
    """``reward + discount * Q_target(s', argmax_a Q_online(s', a))`` (van Hasselt et al. 2016):
    ``reward`` and ``discount`` of any batch shape, the Q-values that shape by actions."""
    chex.assert_equal_shape([reward, discount])
    chex.assert_equal_shape([q_next_online, q_next_target])
    chex.assert_shape(q_next_online, (*reward.shape, None))
    best = jnp.argmax(q_next_online, axis=-1)
    return reward + discount * jnp.take_along_axis(q_next_target, best[..., None], axis=-1)[..., 0]


def importance_weights(probabilities: jax.Array, exponent: float) -> jax.Array:
    """``(N P_i)^-exponent / max_j (N P_j)^-exponent``: N cancels, so the table size is not needed."""
    return (jnp.min(probabilities) / probabilities) ** exponent


def dqn_loss(params: PyTree, target_params: PyTree, batch: dict[str, Any],
             config: ApexConfig, env: EnvInfo) -> tuple[jax.Array, tuple[jax.Array, dict[str, jax.Array]]]:
    """The importance-weighted Huber loss of one sample ``{"data", "probabilities"}`` of N
    transitions (``data`` as ``learning.to_transitions`` makes them, ``probabilities`` ``(N,)``);
    also the TD errors (the new priorities) and metrics."""
    data, network = batch["data"], q_network(config, env)
    chex.assert_rank([data["action"], data["reward"], data["discount"], batch["probabilities"]], 1)
    chex.assert_equal_shape_prefix([*data.values(), batch["probabilities"]], 1)
    chex.assert_shape([data["obs"], data["next_obs"]], (None, *env.obs_shape))
    q = network.apply(params, data["obs"])
    q_taken = jnp.take_along_axis(q, data["action"][..., None].astype(jnp.int32), axis=-1)[..., 0]
    q_next_online = network.apply(params, data["next_obs"])
    q_next_target = network.apply(target_params, data["next_obs"])
    target = jax.lax.stop_gradient(double_q_targets(data["reward"], data["discount"], q_next_online, q_next_target))
    td = target - q_taken
    weights = importance_weights(batch["probabilities"].astype(jnp.float32), config.importance_exponent)
    loss = jnp.mean(weights * optax.huber_loss(td, delta=config.huber_delta))
    return loss, (td, {"loss": loss, "q_mean": jnp.mean(q_taken), "td_abs_mean": jnp.mean(jnp.abs(td)),
                       "importance_weight_mean": jnp.mean(weights)})


# State and update ------------------------------------------------------------------------------


class QNetwork(nn.Module):
    """``(obs) -> Q-values (..., num_actions)``. Ape-X's as tuned: ReLU and flax's default
    (LeCun normal) init, and the dueling head of its paper (Wang et al., 2016):
    ``Q(s, a) = V(s) + A(s, a) - mean_a A(s, a)``."""

    num_actions: int
    network: Network = "mlp"
    hidden: tuple[int, ...] = (128, 128)
    dueling: bool = True
    channels_first: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = torso(self.network, self.hidden, channels_first=self.channels_first, activation=nn.relu,
                  kernel_init=nn.initializers.lecun_normal())(obs)
        if not self.dueling:
            return nn.Dense(self.num_actions)(x)
        advantage = nn.Dense(self.num_actions)(x)
        value = nn.Dense(1)(x)
        return value + advantage - jnp.mean(advantage, axis=-1, keepdims=True)


def q_network(config: ApexConfig, env: EnvInfo) -> QNetwork:
    return QNetwork(num_actions=env.action.size, network=config.network, hidden=tuple(config.hidden),
                    dueling=config.dueling, channels_first=env.channels_first)


def optimizer(config: ApexConfig) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                       optax.adam(config.learning_rate, eps=config.adam_eps))


def logic(config: ApexConfig, env: EnvInfo) -> LearnerLogic:
    """Ape-X's ``LearnerLogic`` for the generic ``jaxdist.nodes.learner.Learner``."""
    return LearnerLogic(init=functools.partial(init, config, env), update=functools.partial(update, config, env),
                        params=published)


@functools.partial(jax.jit, static_argnums=(0, 1))
def init(config: ApexConfig, env: EnvInfo, rng: jax.Array) -> dict[str, PyTree]:
    """``{"params", "target_params", "opt_state", "updates"}``, in one jitted call (one compile)."""
    params = q_network(config, env).init(rng, jnp.zeros((1, *env.obs_shape), jax.dtypes.canonicalize_dtype(env.obs_dtype)))
    return {"params": params, "target_params": params, "opt_state": optimizer(config).init(params),
            "updates": jnp.zeros((), jnp.int32)}


def published(state: dict[str, PyTree]) -> dict[str, PyTree]:
    """What actors, the evaluator and ``load_policy`` get: the online network."""
    return {"network": state["params"]}


def update(config: ApexConfig, env: EnvInfo, state: dict[str, PyTree], batch: dict[str, Any],
           rng: jax.Array) -> tuple[dict[str, PyTree], dict[str, jax.Array]]:
    """One SGD step on a prioritized sample; the target network follows every
    ``target_update_period`` updates. ``metrics["priorities"]`` holds the sampled transitions'
    new priorities, ``|TD error|`` before the step, in sample order (for the learner's
    ``after_update``, which writes them back to the replay). Runs under jit (not pmap: the
    priorities are per transition)."""
    del rng
    (_, (td, metrics)), grads = jax.value_and_grad(dqn_loss, has_aux=True)(
        state["params"], state["target_params"], batch, config, env)
    updates, opt_state = optimizer(config).update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    count = state["updates"] + 1
    target_params = optax.periodic_update(params, state["target_params"], count, config.target_update_period)
    metrics = dict(metrics, priorities=jnp.abs(td))
    return {"params": params, "target_params": target_params, "opt_state": opt_state, "updates": count}, metrics


# The actors' side ---------------------------------------------------------------------------


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
    evaluation and ``load_policy``, no extras. Picklable."""

    env: EnvInfo
    network: Any
    hidden: tuple[int, ...]
    dueling: bool
    epsilon: float | None

    def __call__(self, params: Any, obs: Any, key: Any) -> tuple[Any, dict[str, Any]]:
        num_actions = self.env.action.size
        q = QNetwork(num_actions, self.network, tuple(self.hidden), self.dueling,
                     self.env.channels_first).apply(params["network"], obs)
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
    rows = {name: np.stack([item[name] for item in trajectories], axis=1)  # time-major (T + 1, envs, ...)
            for name in ("obs", "action", "reward", "terminated", "truncated", "q")}
    chex.assert_equal_shape_prefix(list(rows.values()), 2)
    returns, discounts, bootstrap, real = n_step_returns(
        rows["reward"], rows["terminated"], rows["truncated"], gamma, n_step)
    priorities = initial_priorities(rows["q"], rows["action"], returns, discounts, bootstrap)
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
        self._replay = ReplayClient(replay)
        self._gamma, self._n_step, self._timeout = config.gamma, config.n_step, timeout

    def __call__(self, trajectories: list[dict[str, np.ndarray]]) -> None:
        transitions, priorities = to_transitions(trajectories, self._gamma, self._n_step)
        if len(priorities):
            self._replay.insert_batch(transitions, priorities=priorities, timeout=self._timeout)
