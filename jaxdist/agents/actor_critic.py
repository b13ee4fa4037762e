"""The actor-critic kit the on-policy agents (PPO, IMPALA, one's own) share, in the order a
batch meets it: the torso a config names, the action distribution, observation and reward
normalisation, the actor-critic network, the policy actors act with, and the learner's state.

**Torsos.** A torso maps observations to features. ``network`` names it: ``"mlp"`` (vector
observations, widths ``hidden``), ``"cnn"`` (images: the Nature-DQN torso, or MinAtar's for
grids too small for it; images channels-last, or channels-first where the env's
``EnvInfo.channels_first`` says so, as EnvPool's Atari frames come) or
``"package.module:function"``; in Python any callable. A named function is imported and called
with no arguments wherever the network is built (learner, actors, evaluator), so it must return a
fresh flax module each time. Custom torsos get observations as they come (uint8 images stay
uint8, in the env's layout) and must accept any number of leading batch axes: learners apply networks to
``(B, T, ...)`` observations. Ape-X's Q-network puts its heads on the same torsos.

**Distributions** are chosen by the action space, as pure jittable functions, so the losses read
the same for discrete and continuous actions. ``space`` is a static (hashable)
:class:`~jaxdist.envs.spaces.ActionSpace`; ``dist`` is what ``ActorCritic`` outputs:

- Discrete: ``dist = logits (..., n)``, a categorical ``pi(a) = softmax(logits)_a``; actions int32.
- Continuous: ``dist = (mean (..., d), log_std (..., d) or (d,))``, a diagonal Gaussian
  ``pi(a) = prod_i N(a_i; mean_i, exp(log_std_i)^2)``. Actions are the raw, unbounded samples:
  the env clips them to the bounds and log-probs are of the raw sample (as CleanRL does), so the
  importance ratios of PPO and V-trace stay exact.

**Normalisation** (as SB3's ``VecNormalize`` and CleanRL's wrappers): running statistics of
observations and of discounted returns, a ``RunningStats`` pytree kept in the learner's state,
so they travel with the parameters to the actors and are checkpointed with them. A batch of
weight ``n``, mean ``m_b`` and variance ``v_b`` joins stats ``(m, v, c)`` as ``delta = m_b - m``,
``c' = c + n``, ``m' = m + delta n / c'``, ``v' = (v c + v_b n + delta^2 c n / c') / c'`` (Chan
et al.'s parallel variance); under a pmap step the batch moments are averaged over devices with
``parallel.pmean`` first, so jit on the global batch and pmap give the same stats. Rewards are
divided by the running std of the discounted return (no mean subtracted, so the reward's sign and
the optimal policy stay as they are).

**The actor-critic** (orthogonal init: policy head gain 0.01, value head 1, as CleanRL and
PureJaxRL) gives the MLP separate policy and value torsos: sharing one couples the two losses'
scales for no gain on small control tasks. Image torsos are shared (CleanRL's Atari PPO, the
IMPALA paper): two CNNs cost twice the compute for the same features.

**The state** is ``{"params", "opt_state", "version", "obs_norm", "return_norm"}``; the
statistics are used only when the config asks (``normalize_observations``, ``scale_rewards``).
Observations are normalised with the statistics *before* the batch updates them, the ones the
actors acted with; the new statistics are published with the parameters.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdist.agents.experiment import CNN_MIN_SIZE, import_factory
from jaxdist.agents.recurrent import Unroll, initial_carry
from jaxdist.envs.spaces import ActionSpace, EnvInfo
from jaxdist.learning import parallel

PyTree = Any
Network = str | Callable[[], nn.Module]
Initializer = Callable[..., jax.Array]


class MLP(nn.Module):
    """``Dense -> activation`` per width in ``hidden``, no output layer; inputs cast to float32.
    tanh with orthogonal init (gain sqrt 2) for actor-critics, as CleanRL."""

    hidden: Sequence[int]
    activation: Callable[[jax.Array], jax.Array] = nn.tanh
    kernel_init: Initializer = nn.initializers.orthogonal(np.sqrt(2))

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        for width in self.hidden:
            x = self.activation(nn.Dense(width, kernel_init=self.kernel_init)(x))
        return x


class CNN(nn.Module):
    """The image torso, sized by the image. From ``CNN_MIN_SIZE`` pixels a side, the Nature-DQN
    torso (Mnih et al., 2015): conv 32 8x8 stride 4, 64 4x4 stride 2, 64 3x3 stride 1 (VALID,
    ReLU), flatten, Dense 512 ReLU. Below, MinAtar's (Young and Tian, 2019), for its 10x10 grids:
    conv 16 3x3 stride 1 (SAME, ReLU), flatten, Dense 128 ReLU. Images ``(..., H, W, C)``, or
    ``(..., C, H, W)`` with ``channels_first`` (moved here, inside the jitted call, so that actors
    send frames as their envs make them); uint8 is scaled by 1/255 here, so actors can send frames
    as bytes; floats are taken as scaled."""

    kernel_init: Initializer = nn.initializers.orthogonal(np.sqrt(2))
    channels_first: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        if self.channels_first:
            obs = jnp.moveaxis(obs, -3, -1)
        x = obs.astype(jnp.float32)
        if obs.dtype == jnp.uint8:
            x = x / 255.0
        batch = x.shape[:-3]
        x = x.reshape((-1, *x.shape[-3:]))
        small = min(x.shape[1:3]) < CNN_MIN_SIZE
        convolutions = ((16, 3, 1, "SAME"),) if small else ((32, 8, 4, "VALID"), (64, 4, 2, "VALID"),
                                                              (64, 3, 1, "VALID"))
        for features, size, stride, padding in convolutions:
            x = nn.relu(nn.Conv(features, (size, size), (stride, stride), padding=padding,
                                kernel_init=self.kernel_init)(x))
        x = x.reshape((*batch, -1))
        return nn.relu(nn.Dense(128 if small else 512, kernel_init=self.kernel_init)(x))


def torso(network: Network, hidden: Sequence[int], *, channels_first: bool = False,
          activation: Callable[[jax.Array], jax.Array] = nn.tanh,
          kernel_init: Initializer = nn.initializers.orthogonal(np.sqrt(2))) -> nn.Module:
    """The feature extractor ``network`` names (see the module docstring). ``hidden`` sizes the
    MLP; ``channels_first`` (``EnvInfo.channels_first``) lays out the CNN's images; ``activation``
    is the MLP's, ``kernel_init`` that of the built-in torsos' layers."""
    if network == "mlp":
        return MLP(tuple(hidden), activation, kernel_init)
    if network == "cnn":
        return CNN(kernel_init, channels_first)
    if isinstance(network, str):
        factory = import_factory(network)
    elif callable(network):
        factory = network
    else:
        raise TypeError(f"network must be 'mlp', 'cnn', 'package.module:function' or a callable; "
                        f"got {network!r}")
    module = factory()
    if not isinstance(module, nn.Module):
        raise TypeError(f"network {network!r} returned {type(module).__name__}, not a flax "
                        "nn.Module; it must return a module mapping observations to features")
    return module


class ActorCritic(nn.Module):
    """``(obs) -> (dist, value (...))``; ``method="policy"`` runs only the policy, for actors.

    ``dist`` is what :mod:`jaxdist.agents.actor_critic` takes: logits ``(..., n)`` for discrete
    actions; ``(mean (..., d), log_std (d,))`` for continuous ones, with ``log_std`` a
    state-independent parameter (init 0, std 1), as in PPO's paper and CleanRL.

    With a recurrent ``core`` (:mod:`jaxdist.agents.recurrent`) one torso feeds the core and both
    heads sit on its output; ``method="unroll"`` is then the network:
    ``(carry, obs (B, T, ...), first (B, T)) -> (carry, dist, value (B, T))``.
    """

    action: ActionSpace
    network: Network = "mlp"
    hidden: tuple[int, ...] = (64, 64)
    core: str = "none"
    core_size: int = 128
    channels_first: bool = False

    def setup(self) -> None:
        recurrent = self.core != "none"
        self.torso = torso(self.network, self.hidden, channels_first=self.channels_first)
        self.value_torso = torso(self.network, self.hidden) if self.network == "mlp" and not recurrent else None
        self.memory = Unroll(self.core, self.core_size) if recurrent else None
        self.head = nn.Dense(self.action.size, kernel_init=nn.initializers.orthogonal(0.01))
        self.value_head = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0))
        if not self.action.discrete:
            self.log_std = self.param("log_std", nn.initializers.zeros, (self.action.size,))

    def __call__(self, obs: jax.Array) -> tuple[Dist, jax.Array]:
        features = self.torso(obs)
        value_features = features if self.value_torso is None else self.value_torso(obs)
        return self._dist(features), self.value_head(value_features)[..., 0]

    def policy(self, obs: jax.Array) -> Dist:
        return self._dist(self.torso(obs))

    def unroll(self, carry: Any, obs: jax.Array, first: jax.Array) -> tuple[Any, Dist, jax.Array]:
        carry, features = self.memory(carry, self.torso(obs), first)
        return carry, self._dist(features), self.value_head(features)[..., 0]

    def _dist(self, features: jax.Array) -> Dist:
        out = self.head(features)
        return out if self.action.discrete else (out, self.log_std)


# Distributions --------------------------------------------------------------------------------


Dist = Any  # logits, or (mean, log_std)

_LOG_2PI = math.log(2.0 * math.pi)


def sample(space: ActionSpace, dist: Dist, key: jax.Array) -> jax.Array:
    """``a ~ pi``: int32 ``(...)`` (discrete) or float ``(..., d)`` (continuous)."""
    if space.discrete:
        return jax.random.categorical(key, dist).astype(jnp.int32)
    mean, log_std = dist
    return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)


def log_prob(space: ActionSpace, dist: Dist, action: jax.Array) -> jax.Array:
    """``log pi(a)``, shape ``(...)``; for a Gaussian
    ``sum_i -((a_i - mean_i) / std_i)^2 / 2 - log_std_i - log(2 pi) / 2``."""
    if space.discrete:
        logp = jax.nn.log_softmax(dist)
        return jnp.take_along_axis(logp, action[..., None].astype(jnp.int32), -1)[..., 0]
    mean, log_std = dist
    z = (action - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * z * z - log_std - 0.5 * _LOG_2PI, -1)


def entropy(space: ActionSpace, dist: Dist) -> jax.Array:
    """``H(pi)``, shape ``(...)``: ``-sum_a pi(a) log pi(a)``, or for a Gaussian
    ``sum_i log_std_i + (1 + log(2 pi)) / 2``, whatever the mean."""
    if space.discrete:
        logp = jax.nn.log_softmax(dist)
        return -jnp.sum(jnp.exp(logp) * logp, -1)
    mean, log_std = dist
    return jnp.sum(jnp.broadcast_to(log_std, mean.shape) + 0.5 * (1.0 + _LOG_2PI), -1)


def mode(space: ActionSpace, dist: Dist) -> jax.Array:
    """The deterministic action (evaluation, trained policies): ``argmax logits`` or ``mean``."""
    if space.discrete:
        return jnp.argmax(dist, -1).astype(jnp.int32)
    return dist[0]


# Normalisation --------------------------------------------------------------------------------


EPSILON = 1e-8  # added to the variance before dividing (SB3's value)
_INITIAL_COUNT = 1e-4  # the prior (mean 0, var 1) weighs as this many samples (SB3's value)


class RunningStats(NamedTuple):
    """Per-feature running mean and (population) variance of ``count`` samples."""

    mean: jax.Array
    var: jax.Array
    count: jax.Array


def init_stats(shape: tuple[int, ...] = ()) -> RunningStats:
    """Mean 0, variance 1, weighing almost nothing: the first batch sets the stats."""
    return RunningStats(jnp.zeros(shape, jnp.float32), jnp.ones(shape, jnp.float32),
                        jnp.asarray(_INITIAL_COUNT, jnp.float32))


def update_stats(stats: RunningStats, x: jax.Array, weight: jax.Array | None = None) -> RunningStats:
    """Merge the samples of ``x`` (``(*batch, *shape)``: every axis before ``stats.mean``'s shape
    is a batch axis) into ``stats``; ``weight`` (``batch``-shaped, e.g. a 0/1 mask of real rows)
    weighs each sample. A batch of weight 0 leaves the stats unchanged."""
    shape = stats.mean.shape
    chex.assert_equal_shape([stats.mean, stats.var])
    chex.assert_shape(x, (..., *shape))
    axes = tuple(range(x.ndim - len(shape)))
    if weight is not None:
        chex.assert_shape(weight, x.shape[:len(axes)])
    x = x.astype(jnp.float32)
    w = jnp.ones(x.shape[:len(axes)], jnp.float32) if weight is None else weight.astype(jnp.float32)
    w = w.reshape(w.shape + (1,) * len(shape))
    n, total = parallel.pmean((jnp.sum(w), jnp.sum(w * x, axes)))
    safe_n = jnp.maximum(n, 1e-12)
    batch_mean = total / safe_n
    batch_var = parallel.pmean(jnp.sum(w * jnp.square(x - batch_mean), axes)) / safe_n
    n = n * parallel.shard_count()
    count = stats.count + n
    delta = batch_mean - stats.mean
    mean = stats.mean + delta * n / count
    var = (stats.var * stats.count + batch_var * n + jnp.square(delta) * stats.count * n / count) / count
    return RunningStats(mean, var, count)


def normalize(stats: RunningStats, x: jax.Array, clip: float = 10.0) -> jax.Array:
    """``clip((x - mean) / sqrt(var + EPSILON), -clip, clip)`` in float32; ``x`` is
    ``(*batch, *shape)`` as in :func:`update_stats`."""
    chex.assert_shape(x, (..., *stats.mean.shape))
    z = (x.astype(jnp.float32) - stats.mean) / jnp.sqrt(stats.var + EPSILON)
    return jnp.clip(z, -clip, clip)


def discounted_returns(reward: jax.Array, ended: jax.Array, gamma: float) -> jax.Array:
    """The running discounted return along axis 0 (time), ``(T, ...)`` in and out:
    ``G_t = r_t + gamma (1 - ended_{t-1}) G_{t-1}`` from ``G_{-1} = 0``, so ``G`` restarts after
    every row that ended an episode. Its variance is what ``scale_rewards`` divides by."""
    chex.assert_equal_shape([reward, ended])

    def step(carry: jax.Array, row: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        r, end = row
        g = r + gamma * carry
        return g * (1.0 - end), g

    reward = reward.astype(jnp.float32)
    _, returns = jax.lax.scan(step, jnp.zeros_like(reward[0]), (reward, ended.astype(jnp.float32)))
    return returns


def scale_rewards(stats: RunningStats, reward: jax.Array, clip: float = 10.0) -> jax.Array:
    """``clip(r / sqrt(var_G + EPSILON), -clip, clip)`` with ``stats`` over discounted returns."""
    return jnp.clip(reward.astype(jnp.float32) / jnp.sqrt(stats.var + EPSILON), -clip, clip)


# The policy -----------------------------------------------------------------------------------


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
        net = ActorCritic(action=self.env.action, network=self.network, hidden=tuple(self.hidden),
                          channels_first=self.env.channels_first)
        if "obs_norm" in params:
            obs = normalize(RunningStats(**params["obs_norm"]), obs)
        dist = net.apply(params["network"], obs, method="policy")
        if self.deterministic:
            return mode(self.env.action, dist), {}
        action = sample(self.env.action, dist, key)
        return action, {"logp": log_prob(self.env.action, dist, action)}


@dataclasses.dataclass(frozen=True)
class RecurrentActorCriticPolicy(ActorCriticPolicy):
    """The actor-critic policy with a recurrent core: ``initial_state(num_envs)`` is the carry
    of every env at an episode's start, and ``(params, obs, key, state, first) -> (action,
    extras, state)`` steps the core once (reset where ``first``), as the learner unrolls it."""

    core: str = "lstm"
    core_size: int = 128

    def initial_state(self, num_envs: int) -> Any:
        return initial_carry(self.core, self.core_size, num_envs)

    def __call__(self, params: Any, obs: Any, key: Any, state: Any = None,  # type: ignore[override]
                 first: Any = None) -> tuple[Any, dict[str, Any], Any]:
        net = ActorCritic(action=self.env.action, network=self.network, hidden=tuple(self.hidden), core=self.core,
                          core_size=self.core_size, channels_first=self.env.channels_first)
        if "obs_norm" in params:
            obs = normalize(RunningStats(**params["obs_norm"]), obs)
        one_step = lambda x: x[:, None]  # noqa: E731  (B, ...) -> (B, 1, ...)
        state, dist, _ = net.apply(params["network"], state, one_step(obs), one_step(first), method="unroll")
        dist = jax.tree.map(lambda x: x[:, 0] if x.ndim > 1 else x, dist)  # a log_std (d,) has no time axis
        if self.deterministic:
            return mode(self.env.action, dist), {}, state
        action = sample(self.env.action, dist, key)
        return action, {"logp": log_prob(self.env.action, dist, action)}, state


def policy(config: Any, env: EnvInfo, actor: int | None) -> ActorCriticPolicy:
    """An ``Agent.policy``: every actor samples; the evaluator (``actor`` None) acts by the mode.
    With a ``core`` the policy is recurrent (:class:`RecurrentActorCriticPolicy`)."""
    if recurrent(config):
        return RecurrentActorCriticPolicy(env, config.network, tuple(config.hidden), deterministic=actor is None,
                                          core=config.core, core_size=config.core_size)
    return ActorCriticPolicy(env, config.network, tuple(config.hidden), deterministic=actor is None)


def recurrent(config: Any) -> bool:
    """Whether ``config``'s network has a recurrent core."""
    return config.core != "none"


# The learner's state --------------------------------------------------------------------------


def network(config: Any, env: EnvInfo) -> ActorCritic:
    return ActorCritic(action=env.action, network=config.network, hidden=tuple(config.hidden),
                       core=config.core, core_size=config.core_size, channels_first=env.channels_first)


def apply(config: Any, env: EnvInfo, params: PyTree, obs: jax.Array,
          batch: dict[str, jax.Array]) -> tuple[Dist, jax.Array]:
    """``(dist, value)`` of ``obs`` (``(B, T, ...)``, or ``(N, ...)`` flat transitions for a
    feed-forward network): a recurrent network is unrolled over each of the ``B`` sequences from
    ``batch["core_state"]`` (the carry its first row was fed), reset where ``batch["first"]``."""
    net = network(config, env)
    if not recurrent(config):
        return net.apply(params, obs)
    _, dist, value = net.apply(params, batch["core_state"], obs, batch["first"], method="unroll")
    return dist, value


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def init(config: Any, env: EnvInfo, optimizer: Callable[[Any], optax.GradientTransformation],
         rng: jax.Array) -> dict[str, PyTree]:
    """The initial state, in one jitted call: run op by op, flax's initialisers compile a dozen
    small programs (seconds on a cold start); one program is one compile, or one cache hit."""
    # float64 observations (MuJoCo's) are float32 under JAX's default: ask for what JAX gives, unwarned
    obs = jnp.zeros((1, *env.obs_shape), jax.dtypes.canonicalize_dtype(env.obs_dtype))
    if recurrent(config):
        carry = initial_carry(config.core, config.core_size, 1)
        params = network(config, env).init(rng, carry, obs[:, None], jnp.ones((1, 1), bool), method="unroll")
    else:
        params = network(config, env).init(rng, obs)
    return {"params": params, "opt_state": optimizer(config).init(params), "version": jnp.zeros((), jnp.int32),
            "obs_norm": init_stats(env.obs_shape), "return_norm": init_stats(())}


def normalized(config: Any, state: dict[str, PyTree], batch: dict[str, jax.Array],
               time_major_ended: jax.Array) -> tuple[jax.Array, jax.Array, dict[str, PyTree]]:
    """``(obs, time-major rewards, statistics)`` of a ``(B, T + 1, ...)`` batch as the loss should
    see them, and the state's statistics updated with this batch."""
    obs, reward = batch["obs"], jnp.swapaxes(batch["reward"], 0, 1)
    stats = {"obs_norm": state["obs_norm"], "return_norm": state["return_norm"]}
    if config.normalize_observations:
        obs = normalize(state["obs_norm"], obs)
        stats["obs_norm"] = update_stats(state["obs_norm"], batch["obs"][:, :-1])
    if config.scale_rewards:
        returns = discounted_returns(reward, time_major_ended, config.gamma)
        # Row 0 is the previous trajectory's last row: its reward was counted there.
        stats["return_norm"] = update_stats(state["return_norm"], returns[1:])
        reward = scale_rewards(stats["return_norm"], reward)
    return obs, reward, stats


def published(config: Any, state: dict[str, PyTree]) -> dict[str, PyTree]:
    """What actors, the evaluator and ``load_policy`` get: the network, and the observation
    statistics it was trained with when it normalises them."""
    if not config.normalize_observations:
        return {"network": state["params"]}
    return {"network": state["params"], "obs_norm": state["obs_norm"]._asdict()}


def clipped_adam(learning_rate: float, max_grad_norm: float, anneal_steps: int | None) -> optax.GradientTransformation:
    """Adam (eps 1e-5) after global-norm clipping; over ``anneal_steps`` SGD steps (if given)
    the rate falls linearly to 0. Optax counts steps in int32: a longer schedule (a run told to
    go on until stopped, ``--total-steps 10**12``) is cut to the most it can count."""
    anneal_steps = min(anneal_steps, np.iinfo(np.int32).max) if anneal_steps else None
    rate: Any = learning_rate if not anneal_steps else optax.linear_schedule(learning_rate, 0.0, anneal_steps)
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(rate, eps=1e-5))
