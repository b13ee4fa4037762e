"""R2D2's math (Kapturowski et al. 2019): the value rescaling, n-step double-Q targets over
sequences, sequence priorities, the burn-in, the LSTM Q-network and one jitted update, all pure;
then the actors' side: the recurrent epsilon-greedy policy and the sink that cuts overlapping
sequences with their stored state out of each env's trajectories.

**Rows and sequences.** Actors send trajectories of ``P + 1`` rows (the row convention of
:mod:`jaxdist.envs.vector`, with a recurrent policy's ``first`` and ``core_state``: see
:mod:`jaxdist.agents.recurrent`). The sink joins each env's last ``W / P`` trajectories into one
sequence of ``W + 1`` rows (``W = burn_in + sequence_length``; the last row only bootstraps),
stored with the state its actor fed row 0. The n-step returns are Ape-X's
(:func:`jaxdist.agents.apex.learning.n_step_returns`), computed once in the sink: within the
sequence, up to ``n`` rows ahead, stopping at an episode's end.

**Targets.** With the value rescaling ``h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x`` and its
inverse ``h^-1(x) = sign(x)(((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)``, the
target of step ``t`` is ``h(R_t + discount_t h^-1(Q_target(s_{t+m}, argmax_a Q(s_{t+m}, a))))``.
Both networks are unrolled over the whole sequence from its stored state; the online one's
first ``burn_in`` steps only refresh that state (no gradient flows into them), and only the
later steps are learned from.

**Loss and priorities.** ``mean_i w_i mean_t td_it^2 / 2`` over the real steps of each sampled
sequence ``i``, ``w_i = (P_min / P_i)^beta`` (Ape-X's importance weights); the new priority of a
sequence is ``eta max_t |td_t| + (1 - eta) mean_t |td_t|``. Actors insert each sequence with that
priority from their own Q-values.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdist.agents.actor_critic import torso
from jaxdist.agents.apex.learning import actor_epsilons, importance_weights, n_step_returns, optimizer, published
from jaxdist.agents.r2d2 import R2D2Config
from jaxdist.agents.recurrent import Unroll, initial_carry
from jaxdist.envs.spaces import EnvInfo
from jaxdist.learning.learner_logic import LearnerLogic
from jaxdist.nodes.replay import ReplayClient

PyTree = Any


# Value rescaling, targets, priorities ----------------------------------------------------------


def rescale(x: Any, eps: float) -> Any:
    """``h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x`` (Pohlen et al. 2018), for NumPy or JAX arrays."""
    xp = jnp if isinstance(x, jax.Array) else np
    return xp.sign(x) * (xp.sqrt(xp.abs(x) + 1.0) - 1.0) + eps * x


def unrescale(x: Any, eps: float) -> Any:
    """``h^-1``, the inverse of :func:`rescale`."""
    xp = jnp if isinstance(x, jax.Array) else np
    return xp.sign(x) * (xp.square((xp.sqrt(1.0 + 4.0 * eps * (xp.abs(x) + 1.0 + eps)) - 1.0) / (2.0 * eps)) - 1.0)


def sequence_priority(td: Any, real: Any, eta: float) -> Any:
    """``eta max_t |td_t| + (1 - eta) mean_t |td_t|`` over the real steps (axis -1); 0 for a
    sequence with none."""
    xp = jnp if isinstance(td, jax.Array) else np
    magnitude = xp.where(real, xp.abs(td), 0.0)
    count = xp.sum(real, axis=-1)
    mean = xp.sum(magnitude, axis=-1) / xp.maximum(count, 1)
    return eta * xp.max(magnitude, axis=-1) + (1.0 - eta) * mean


def td_errors(q: jax.Array, q_target: jax.Array, action: jax.Array, returns: jax.Array, discounts: jax.Array,
              bootstrap: jax.Array, eps: float) -> jax.Array:
    """``target_t - Q(s_t, a_t)`` of every step ``t`` of sequences (axis 1 time): ``q`` and
    ``q_target`` ``(B, L + 1, A)`` over the learned steps and the row after them; ``action``,
    ``returns``, ``discounts``, ``bootstrap`` (rows into ``q``) ``(B, L)``. The target is the
    double-Q one through the value rescaling (the module docstring)."""
    chex.assert_equal_shape([q, q_target])
    chex.assert_equal_shape([action, returns, discounts, bootstrap])
    chex.assert_shape(q, (action.shape[0], action.shape[1] + 1, None))
    take = lambda values, rows: jnp.take_along_axis(values, rows[..., None], axis=1)  # noqa: E731 (B, L, A)
    best = jnp.argmax(take(q, bootstrap), axis=-1)
    q_next = jnp.take_along_axis(take(q_target, bootstrap), best[..., None], axis=-1)[..., 0]
    target = rescale(returns + discounts * unrescale(q_next, eps), eps)
    q_taken = jnp.take_along_axis(q[:, :-1], action[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return jax.lax.stop_gradient(target) - q_taken


# The Q-network ---------------------------------------------------------------------------------


class RecurrentQNetwork(nn.Module):
    """``(carry, obs (B, T, ...), first (B, T)) -> (carry, Q-values (B, T, A))``: a torso (ReLU),
    the recurrent core (reset where ``first``), and a dueling head (Wang et al. 2016), as R2D2's."""

    num_actions: int
    network: Any = "mlp"
    hidden: tuple[int, ...] = (64,)
    core: str = "lstm"
    core_size: int = 64
    channels_first: bool = False

    @nn.compact
    def __call__(self, carry: Any, obs: jax.Array, first: jax.Array) -> tuple[Any, jax.Array]:
        x = torso(self.network, self.hidden, channels_first=self.channels_first, activation=nn.relu,
                  kernel_init=nn.initializers.lecun_normal())(obs)
        carry, x = Unroll(self.core, self.core_size)(carry, x, first)
        advantage = nn.Dense(self.num_actions)(x)
        value = nn.Dense(1)(x)
        return carry, value + advantage - jnp.mean(advantage, axis=-1, keepdims=True)


def q_network(config: R2D2Config, env: EnvInfo) -> RecurrentQNetwork:
    return RecurrentQNetwork(env.action.size, config.network, tuple(config.hidden), config.core, config.core_size,
                             env.channels_first)


# The learner -----------------------------------------------------------------------------------


def r2d2_loss(params: PyTree, target_params: PyTree, batch: dict[str, Any], config: R2D2Config,
              env: EnvInfo) -> tuple[jax.Array, tuple[jax.Array, dict[str, jax.Array]]]:
    """The importance-weighted loss of one sample ``{"data", "probabilities"}`` of B sequences
    (``data`` as :func:`to_sequences` makes them), their new priorities and metrics."""
    data, network, burn = batch["data"], q_network(config, env), config.burn_in
    chex.assert_shape(data["obs"], (None, config.window + 1, *env.obs_shape))
    chex.assert_shape([data["action"], data["returns"], data["discounts"], data["bootstrap"], data["real"]],
                      (None, config.sequence_length))
    carry = data["core_state"]
    if burn:  # the burn-in refreshes the stored state; nothing is learned from it
        carry, _ = network.apply(params, carry, data["obs"][:, :burn], data["first"][:, :burn])
        carry = jax.lax.stop_gradient(carry)
    _, q = network.apply(params, carry, data["obs"][:, burn:], data["first"][:, burn:])
    _, q_target = network.apply(target_params, data["core_state"], data["obs"], data["first"])
    td = td_errors(q, q_target[:, burn:], data["action"], data["returns"], data["discounts"], data["bootstrap"] - burn,
                   config.rescale_epsilon)
    real = data["real"].astype(jnp.float32)
    per_sequence = jnp.sum(real * 0.5 * jnp.square(td), axis=1) / jnp.maximum(jnp.sum(real, axis=1), 1.0)
    weights = importance_weights(batch["probabilities"].astype(jnp.float32), config.importance_exponent)
    loss = jnp.mean(weights * per_sequence)
    priorities = sequence_priority(td, data["real"], config.eta)
    return loss, (priorities, {"loss": loss, "td_abs_mean": jnp.sum(real * jnp.abs(td)) / jnp.maximum(jnp.sum(real), 1),
                               "q_mean": jnp.mean(q), "importance_weight_mean": jnp.mean(weights)})


def logic(config: R2D2Config, env: EnvInfo) -> LearnerLogic:
    """R2D2's ``LearnerLogic`` for the generic ``jaxdist.nodes.learner.Learner``."""
    return LearnerLogic(init=functools.partial(init, config, env), update=functools.partial(update, config, env),
                        params=published)


@functools.partial(jax.jit, static_argnums=(0, 1))
def init(config: R2D2Config, env: EnvInfo, rng: jax.Array) -> dict[str, PyTree]:
    """``{"params", "target_params", "opt_state", "updates"}``, in one jitted call."""
    carry = initial_carry(config.core, config.core_size, 1)
    params = q_network(config, env).init(rng, carry, jnp.zeros((1, 1, *env.obs_shape), env.obs_dtype),
                                         jnp.ones((1, 1), bool))
    return {"params": params, "target_params": params, "opt_state": optimizer(config).init(params),
            "updates": jnp.zeros((), jnp.int32)}


def update(config: R2D2Config, env: EnvInfo, state: dict[str, PyTree], batch: dict[str, Any],
           rng: jax.Array) -> tuple[dict[str, PyTree], dict[str, jax.Array]]:
    """One SGD step on a prioritized sample of sequences; the target network follows every
    ``target_update_period`` updates; ``metrics["priorities"]`` are the sampled sequences' new
    priorities, in sample order (the learner's ``after_update`` writes them back)."""
    del rng
    (_, (priorities, metrics)), grads = jax.value_and_grad(r2d2_loss, has_aux=True)(
        state["params"], state["target_params"], batch, config, env)
    updates, opt_state = optimizer(config).update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    count = state["updates"] + 1
    target_params = optax.periodic_update(params, state["target_params"], count, config.target_update_period)
    return ({"params": params, "target_params": target_params, "opt_state": opt_state, "updates": count},
            dict(metrics, priorities=priorities))


# The actors' side ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RecurrentEpsilonGreedy:
    """A recurrent policy (``jaxdist.envs.jax_rollout.recurrent``): ``(params, obs, key, state,
    first) -> (action, {"q": Q-values}, state)``, epsilon-greedy on the LSTM's Q-values (their
    greedy action where ``epsilon`` is None: evaluation and ``load_policy``, no extras)."""

    env: EnvInfo
    network: Any
    hidden: tuple[int, ...]
    core: str
    core_size: int
    epsilon: float | None

    def initial_state(self, num_envs: int) -> Any:
        return initial_carry(self.core, self.core_size, num_envs)

    def __call__(self, params: Any, obs: Any, key: Any, state: Any, first: Any) -> tuple[Any, dict[str, Any], Any]:
        num_actions = self.env.action.size
        net = RecurrentQNetwork(num_actions, self.network, tuple(self.hidden), self.core, self.core_size,
                                self.env.channels_first)
        state, q = net.apply(params["network"], state, obs[:, None], first[:, None])
        q = q[:, 0]
        greedy = jnp.argmax(q, axis=-1).astype(jnp.int32)
        if self.epsilon is None:
            return greedy, {}, state
        explore_key, action_key = jax.random.split(key)
        random_action = jax.random.randint(action_key, greedy.shape, 0, num_actions)
        explore = jax.random.uniform(explore_key, greedy.shape) < self.epsilon
        return jnp.where(explore, random_action, greedy).astype(jnp.int32), {"q": q}, state


def policy(config: Any, env: EnvInfo, actor: int | None) -> RecurrentEpsilonGreedy:
    """An ``Agent.policy``: actor i explores with Ape-X's epsilon i; the evaluator acts greedily."""
    epsilons = actor_epsilons(config.num_actors, config.base_epsilon, config.epsilon_alpha)
    return RecurrentEpsilonGreedy(env, config.network, tuple(config.hidden), config.core, config.core_size,
                                  None if actor is None else epsilons[actor % len(epsilons)])


def to_sequences(trajectories: list[list[dict[str, Any]]], config: Any) -> tuple[dict[str, Any], np.ndarray]:
    """Each env's consecutive trajectories (oldest first, ``W / P`` of them, rows shared at the
    joins) -> one sequence each, stacked: ``obs``, ``first`` (``W + 1`` rows), ``core_state``
    (the first trajectory's), and over the ``sequence_length`` learned steps ``action``,
    ``returns``, ``discounts``, ``bootstrap`` (rows of the sequence) and ``real``; and their
    initial priorities from the actor's Q-values."""
    burn = config.burn_in
    columns: dict[str, list] = collections.defaultdict(list)
    priorities = []
    for parts in trajectories:
        rows = {name: np.concatenate([part[name][:-1] for part in parts[:-1]] + [parts[-1][name]])
                for name in ("obs", "action", "reward", "terminated", "truncated", "first", "q")}
        returns, discounts, bootstrap, real = n_step_returns(rows["reward"], rows["terminated"], rows["truncated"],
                                                             config.gamma, config.n_step)
        q = rows["q"]
        learned = slice(burn, None)
        q_next = np.max(q, axis=-1)[bootstrap[learned]]
        target = rescale(returns[learned] + discounts[learned] * unrescale(q_next, config.rescale_epsilon),
                         config.rescale_epsilon)
        q_taken = np.take_along_axis(q[:-1], rows["action"][:-1, None].astype(np.int64), axis=-1)[learned, 0]
        priorities.append(sequence_priority(target - q_taken, real[learned], config.eta))
        for name, value in (("obs", rows["obs"]), ("first", rows["first"]), ("action", rows["action"][burn:-1]),
                            ("returns", returns[learned]), ("discounts", discounts[learned]),
                            ("bootstrap", bootstrap[learned]), ("real", real[learned])):
            columns[name].append(value)
        columns["core_state"].append(parts[0]["core_state"])
    stacked = {name: (jax.tree.map(lambda *xs: np.stack(xs), *values) if name == "core_state" else np.stack(values))
               for name, values in columns.items()}
    return stacked, np.asarray(priorities, np.float64)


class SequenceSink:
    """An actor's ``sink(items)`` (an ``Agent.sink``): keeps each env's last ``W / P``
    trajectories and, once it has them, inserts their sequence into the replay node ``replay``
    with its initial priority, every env's in one atomic call. Trajectories come in the actor's
    env order, one per env per send."""

    def __init__(self, config: Any, replay: Any, timeout: float | None = 30.0) -> None:
        self._replay = ReplayClient(replay)
        self._config, self._timeout = config, timeout
        self._per_sequence = config.window // config.trajectory_length
        self._recent: dict[int, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=self._per_sequence))

    def __call__(self, trajectories: list[dict[str, Any]]) -> None:
        for env, item in enumerate(trajectories):
            self._recent[env].append(item)
        full = [list(recent) for recent in self._recent.values() if len(recent) == self._per_sequence]
        if full:
            sequences, priorities = to_sequences(full, self._config)
            self._replay.insert_batch(sequences, priorities=priorities, timeout=self._timeout)
