"""SAC's math (Haarnoja et al. 2018), the pieces TD3 shares with it, and the actors' side.

**Actions.** Networks act in ``[-1, 1]^d``; the env's Box ``[low, high]`` is that interval
scaled (``to_env`` / ``from_env``). The replay holds env-scale actions, as the actors sent
them.

**Policy.** ``u ~ N(mu(s), sigma(s))``, ``a = tanh(u)``, with the log-density of the squashed
sample (the change of variables of the paper's appendix C):

    log pi(a|s) = sum_i [log N(u_i; mu_i, sigma_i) - log(1 - tanh(u_i)^2)],
    log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))   (stable for large |u|).

``log sigma`` is squashed into ``[log_std_min, log_std_max]``.

**Critics.** Twin Q-networks (Fujimoto et al. 2018), the target of both
``y = r + discount * (min_j Q'_j(s', a') - alpha log pi(a'|s'))`` with ``a' ~ pi(s')``
(``r`` the n-step return, ``discount`` ``gamma^n`` or 0 past a terminal state), their targets
``Q' <- tau Q + (1 - tau) Q'`` after every update.

**Policy and temperature.** ``J_pi = E[alpha log pi(a|s) - min_j Q_j(s, a)]`` with the
reparameterised sample, and ``J_alpha = E[-log alpha (log pi(a|s) + H_target)]``: alpha grows
when the entropy falls below ``H_target``.
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

from jaxdist.agents.actor_critic import torso
from jaxdist.agents.apex.learning import importance_weights, n_step_returns
from jaxdist.agents.sac import OffPolicyConfig, SACConfig, anakin
from jaxdist.envs.spaces import ActionSpace, EnvInfo
from jaxdist.learning.learner_logic import LearnerLogic
from jaxdist.nodes.replay import ReplayClient

PyTree = Any


# Actions in [-1, 1] and in the env's bounds ------------------------------------------------------


def to_env(space: ActionSpace, action: jax.Array) -> jax.Array:
    """``[-1, 1]^d`` -> the env's ``[low, high]``, shaped as the space."""
    low, high = jnp.asarray(space.low, jnp.float32), jnp.asarray(space.high, jnp.float32)
    scaled = low + (action + 1.0) * 0.5 * (high - low)
    return scaled.reshape(*action.shape[:-1], *space.shape)


def from_env(space: ActionSpace, action: jax.Array) -> jax.Array:
    """The env's ``[low, high]`` -> ``[-1, 1]^d`` (flattened)."""
    low, high = jnp.asarray(space.low, jnp.float32), jnp.asarray(space.high, jnp.float32)
    flat = action.reshape(*action.shape[:action.ndim - len(space.shape)], -1).astype(jnp.float32)
    return 2.0 * (flat - low) / (high - low) - 1.0


# The squashed Gaussian -----------------------------------------------------------------------------


def squashed_log_prob(u: jax.Array, mean: jax.Array, log_std: jax.Array) -> jax.Array:
    """``log pi(tanh(u))`` of the pre-squash sample ``u`` (summed over the last axis)."""
    chex.assert_equal_shape([u, mean, log_std])
    gaussian = -0.5 * ((u - mean) / jnp.exp(log_std)) ** 2 - log_std - 0.5 * jnp.log(2 * jnp.pi)
    log_det = 2.0 * (jnp.log(2.0) - u - jax.nn.softplus(-2.0 * u))
    return jnp.sum(gaussian - log_det, axis=-1)


def squashed_sample(mean: jax.Array, log_std: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A reparameterised sample ``tanh(mean + std * eps)`` and its log-probability."""
    u = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
    return jnp.tanh(u), squashed_log_prob(u, mean, log_std)


# Networks -----------------------------------------------------------------------------------------


def mlp_torso(network: Any, hidden: tuple[int, ...]) -> nn.Module:
    """The torso of SAC's and TD3's networks: ReLU, LeCun-normal init (as their papers' MLPs)."""
    return torso(network, hidden, activation=nn.relu, kernel_init=nn.initializers.lecun_normal())


class GaussianPolicy(nn.Module):
    """``obs -> (mean, log_std)`` of the pre-squash Gaussian, ``log_std`` squashed into its bounds."""

    action_dims: int
    network: Any = "mlp"
    hidden: tuple[int, ...] = (256, 256)
    log_std_min: float = -5.0
    log_std_max: float = 2.0

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = mlp_torso(self.network, self.hidden)(obs.astype(jnp.float32))
        mean = nn.Dense(self.action_dims)(x)
        log_std = jnp.tanh(nn.Dense(self.action_dims)(x))
        return mean, self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (log_std + 1.0)


class TwinCritic(nn.Module):
    """``(obs, action in [-1, 1]) -> (2, ...)``: two independent Q-networks on the pair."""

    network: Any = "mlp"
    hidden: tuple[int, ...] = (256, 256)

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        flat = obs.reshape(*action.shape[:-1], -1).astype(jnp.float32)
        x = jnp.concatenate([flat, action], axis=-1)
        return jnp.stack([nn.Dense(1)(mlp_torso(self.network, self.hidden)(x))[..., 0] for _ in range(2)])


def critic(config: OffPolicyConfig) -> TwinCritic:
    return TwinCritic(config.network, tuple(config.hidden))


def gaussian_policy(config: SACConfig, env: EnvInfo) -> GaussianPolicy:
    return GaussianPolicy(env.action.size, config.network, tuple(config.hidden), config.log_std_min,
                          config.log_std_max)


# Shared by the off-policy agents: targets, Polyak averaging, the critics' step -------------------


def polyak(online: PyTree, target: PyTree, tau: float) -> PyTree:
    """``tau * online + (1 - tau) * target``, leaf by leaf."""
    return optax.incremental_update(online, target, tau)


def twin_target(reward: jax.Array, discount: jax.Array, q_next: jax.Array, entropy_bonus: jax.Array | float = 0.0
                ) -> jax.Array:
    """``reward + discount * (min_j q_next[j] + entropy_bonus)``: the clipped double-Q target,
    ``q_next (2, N)`` from the target critics (SAC's bonus is ``-alpha log pi(a'|s')``)."""
    chex.assert_equal_shape([reward, discount])
    chex.assert_shape(q_next, (2, *reward.shape))
    return reward + discount * (jnp.min(q_next, axis=0) + entropy_bonus)


def replay_batch(config: OffPolicyConfig, env: EnvInfo, batch: dict[str, Any]) -> tuple[dict[str, jax.Array], jax.Array]:
    """A sample's transitions (actions in ``[-1, 1]``) and each one's weight in the critics'
    loss: importance weights from a prioritized table, else 1 (0 for a transition marked not
    ``valid``, as the device replay of Anakin holds some)."""
    data = dict(batch["data"] if config.prioritized else batch)
    chex.assert_rank([data["reward"], data["discount"]], 1)
    chex.assert_shape([data["obs"], data["next_obs"]], (data["reward"].shape[0], *env.obs_shape))
    data["action"] = from_env(env.action, data["action"])
    if config.prioritized:
        weights = importance_weights(batch["probabilities"].astype(jnp.float32), config.importance_exponent)
    else:
        weights = data.pop("valid", jnp.ones_like(data["reward"]))
    return data, weights


def adam(config: OffPolicyConfig) -> optax.GradientTransformation:
    return optax.adam(config.learning_rate)


def critic_step(config: OffPolicyConfig, params: PyTree, opt_state: PyTree, data: dict[str, jax.Array],
                target: jax.Array, weights: jax.Array) -> tuple[PyTree, PyTree, jax.Array, dict[str, jax.Array]]:
    """One Adam step of both critics on ``0.5 * mean_i w_i sum_j (Q_j(s_i, a_i) - y_i)^2``:
    ``(params, opt_state, |TD error| (the new priorities), metrics)``."""
    target = jax.lax.stop_gradient(target)

    def loss_fn(p: PyTree) -> tuple[jax.Array, jax.Array]:
        q = critic(config).apply(p, data["obs"], data["action"])
        td = q - target
        return 0.5 * jnp.mean(weights * jnp.sum(td**2, axis=0)), q

    (loss, q), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = adam(config).update(grads, opt_state, params)
    td_abs = jnp.mean(jnp.abs(q - target), axis=0)
    return optax.apply_updates(params, updates), opt_state, td_abs, {"critic_loss": loss, "q_mean": jnp.mean(q)}


def init_critics(config: OffPolicyConfig, env: EnvInfo, key: jax.Array) -> dict[str, PyTree]:
    """Both critics, their targets and their optimizer state."""
    obs = jnp.zeros((1, *env.obs_shape), jnp.float32)
    params = critic(config).init(key, obs, jnp.zeros((1, env.action.size), jnp.float32))
    return {"critic": params, "target_critic": params, "critic_opt": adam(config).init(params)}


def with_priorities(config: OffPolicyConfig, metrics: dict[str, jax.Array], td_abs: jax.Array) -> dict[str, jax.Array]:
    """The sampled transitions' new priorities go with the metrics where the replay is prioritized
    (the learner's ``PriorityWriter`` takes them out)."""
    return dict(metrics, priorities=td_abs) if config.prioritized else metrics


# SAC's state and update -----------------------------------------------------------------------------


def target_entropy(config: SACConfig, env: EnvInfo) -> float:
    return -float(env.action.size) if config.target_entropy is None else config.target_entropy


def temperature_step(config: SACConfig, log_alpha: jax.Array, opt_state: PyTree, logp: jax.Array,
                     entropy_target: float) -> tuple[jax.Array, PyTree]:
    """One Adam step of ``log alpha`` on ``-mean(log alpha (log pi + H_target))`` (unchanged
    without ``autotune_alpha``)."""
    entropy_gap = jax.lax.stop_gradient(logp + entropy_target)
    grad = jax.grad(lambda value: -jnp.mean(value * entropy_gap))(log_alpha)
    step, opt_state = adam(config).update(grad, opt_state, log_alpha)
    return (optax.apply_updates(log_alpha, step) if config.autotune_alpha else log_alpha), opt_state


def learner_logic(config: OffPolicyConfig, env: EnvInfo, init: Any, update: Any) -> LearnerLogic:
    """An off-policy agent's ``LearnerLogic`` from its ``init(config, env, rng)`` and
    ``update(config, env, state, batch, rng)``; both publish ``published``."""
    return LearnerLogic(init=functools.partial(init, config, env), update=functools.partial(update, config, env),
                        params=published)


def logic(config: SACConfig, env: EnvInfo) -> LearnerLogic:
    """SAC's ``LearnerLogic`` for the generic ``jaxdist.nodes.learner.Learner``."""
    return learner_logic(config, env, init, update)


def anakin_logic(config: SACConfig, env: EnvInfo) -> LearnerLogic:
    """SAC under ``--architecture anakin``: the same update, its replay on the device."""
    return anakin.logic(config, env, logic(config, env))


@functools.partial(jax.jit, static_argnums=(0, 1))
def init(config: SACConfig, env: EnvInfo, rng: jax.Array) -> dict[str, PyTree]:
    policy_key, critic_key = jax.random.split(rng)
    policy = gaussian_policy(config, env).init(policy_key, jnp.zeros((1, *env.obs_shape), jnp.float32))
    log_alpha = jnp.log(jnp.float32(config.initial_alpha))
    return {"policy": policy, "policy_opt": adam(config).init(policy), **init_critics(config, env, critic_key),
            "log_alpha": log_alpha, "alpha_opt": adam(config).init(log_alpha), "updates": jnp.zeros((), jnp.int32)}


def published(state: dict[str, PyTree]) -> dict[str, PyTree]:
    """What actors, the evaluator and ``load_policy`` get (SAC's and TD3's): the policy, and
    whether the learner has not updated yet (actors then act at random)."""
    return {"policy": state["policy"], "warmup": state["updates"] == 0}


def update(config: SACConfig, env: EnvInfo, state: dict[str, PyTree], batch: dict[str, Any],
           rng: jax.Array) -> tuple[dict[str, PyTree], dict[str, jax.Array]]:
    """One SAC update: the critics towards the soft target, then the policy against the new
    critics, then the temperature; the target critics follow by Polyak averaging."""
    data, weights = replay_batch(config, env, batch)
    next_key, policy_key = jax.random.split(rng)
    network = gaussian_policy(config, env)
    alpha = jnp.exp(state["log_alpha"])
    next_action, next_logp = squashed_sample(*network.apply(state["policy"], data["next_obs"]), next_key)
    q_next = critic(config).apply(state["target_critic"], data["next_obs"], next_action)
    target = twin_target(data["reward"], data["discount"], q_next, -alpha * next_logp)
    critic_params, critic_opt, td_abs, metrics = critic_step(config, state["critic"], state["critic_opt"], data,
                                                             target, weights)

    def policy_loss(params: PyTree) -> tuple[jax.Array, jax.Array]:
        action, logp = squashed_sample(*network.apply(params, data["obs"]), policy_key)
        q = jnp.min(critic(config).apply(critic_params, data["obs"], action), axis=0)
        return jnp.mean(alpha * logp - q), logp

    (actor_loss, logp), grads = jax.value_and_grad(policy_loss, has_aux=True)(state["policy"])
    updates, policy_opt = adam(config).update(grads, state["policy_opt"], state["policy"])
    policy = optax.apply_updates(state["policy"], updates)
    log_alpha, alpha_opt = temperature_step(config, state["log_alpha"], state["alpha_opt"], logp,
                                            target_entropy(config, env))
    state = {"policy": policy, "policy_opt": policy_opt, "critic": critic_params, "critic_opt": critic_opt,
             "target_critic": polyak(critic_params, state["target_critic"], config.tau), "log_alpha": log_alpha,
             "alpha_opt": alpha_opt, "updates": state["updates"] + 1}
    metrics = dict(metrics, policy_loss=actor_loss, alpha=alpha, entropy=-jnp.mean(logp))
    return state, with_priorities(config, metrics, td_abs)


# The actors' side ---------------------------------------------------------------------------------


def explore_or_random(params: dict[str, PyTree], action: jax.Array, key: jax.Array) -> jax.Array:
    """``action`` (in ``[-1, 1]``), or uniform random ones while the learner has not updated
    (``params["warmup"]``): the first ``learning_starts`` env steps explore at random."""
    random_action = jax.random.uniform(key, action.shape, minval=-1.0, maxval=1.0)
    return jnp.where(params["warmup"], random_action, action)


@dataclasses.dataclass(frozen=True)
class SquashedGaussian:
    """``(params, obs, key) -> (action, {})`` for a batch of observations: a sample of the policy
    (random before the first update), or with ``deterministic`` its mean's squash, as
    evaluation and ``load_policy`` play. Picklable, hashable (one compile per process)."""

    env: EnvInfo
    network: Any
    hidden: tuple[int, ...]
    log_std_min: float
    log_std_max: float
    deterministic: bool

    def __call__(self, params: Any, obs: Any, key: Any) -> tuple[Any, dict[str, Any]]:
        network = GaussianPolicy(self.env.action.size, self.network, tuple(self.hidden), self.log_std_min,
                                 self.log_std_max)
        mean, log_std = network.apply(params["policy"], obs)
        if self.deterministic:
            return to_env(self.env.action, jnp.tanh(mean)), {}
        sample_key, random_key = jax.random.split(key)
        action, _ = squashed_sample(mean, log_std, sample_key)
        return to_env(self.env.action, explore_or_random(params, action, random_key)), {}


def policy(config: SACConfig, env: EnvInfo, actor: int | None) -> SquashedGaussian:
    """An ``Agent.policy``: every actor samples the policy; the evaluator plays its mean."""
    return SquashedGaussian(env, config.network, tuple(config.hidden), config.log_std_min, config.log_std_max,
                            deterministic=actor is None)


def to_transitions(trajectories: list[dict[str, np.ndarray]], gamma: float, n_step: int) -> dict[str, np.ndarray]:
    """An actor's per-env trajectories (``(T + 1, ...)`` rows) -> their real n-step transitions,
    stacked: ``{"obs", "action", "reward" (the n-step return), "discount", "next_obs"}``."""
    rows = {name: np.stack([item[name] for item in trajectories], axis=1)  # time-major (T + 1, envs, ...)
            for name in ("obs", "action", "reward", "terminated", "truncated")}
    returns, discounts, bootstrap, real = n_step_returns(rows["reward"].astype(np.float32), rows["terminated"],
                                                         rows["truncated"], gamma, n_step)
    time, env = np.nonzero(real)
    return {"obs": rows["obs"][time, env], "action": rows["action"][time, env].astype(np.float32),
            "reward": returns[time, env], "discount": discounts[time, env],
            "next_obs": rows["obs"][bootstrap[time, env], env]}


class TransitionSink:
    """An actor's ``sink(items)`` (an ``Agent.sink``): its trajectories become n-step transitions,
    inserted into the replay node ``replay`` (a client) in one atomic call, stacked; a
    prioritized table gives them its largest priority so far."""

    def __init__(self, config: Any, replay: Any, timeout: float | None = 30.0) -> None:
        self._replay = ReplayClient(replay)
        self._gamma, self._n_step, self._timeout = config.gamma, config.n_step, timeout

    def __call__(self, trajectories: list[dict[str, np.ndarray]]) -> None:
        transitions = to_transitions(trajectories, self._gamma, self._n_step)
        if len(transitions["reward"]):
            self._replay.insert_batch(transitions, timeout=self._timeout)
