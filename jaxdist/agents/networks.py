"""Every agent's networks: a torso named by the config, PPO's and IMPALA's actor-critic, Ape-X's
Q-network, and the optimiser and training state they share.

A torso maps observations to features. ``network`` names it: ``"mlp"`` (vector observations,
widths ``hidden``), ``"cnn"`` (the Nature-DQN torso for images) or ``"package.module:function"``;
in Python any callable. A named function is imported and called with no arguments wherever the
network is built (learner, actors, evaluator), so it must return a fresh flax module each time.
Custom torsos get observations as they come (uint8 images stay uint8) and must accept any
number of leading batch axes: learners apply networks to ``(B, T, ...)`` observations.

The actor-critic (orthogonal init: policy head gain 0.01, value head 1, as CleanRL and
PureJaxRL) gives the MLP separate policy and value torsos: sharing one couples the two losses'
scales for no gain on small control tasks. Image torsos are shared (CleanRL's Atari PPO, the
IMPALA paper): two CNNs cost twice the compute for the same features.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxdist.agents.experiment import check_network_name
from jaxdist.agents.distributions import Dist
from jaxdist.envs.spaces import ActionSpace

if TYPE_CHECKING:
    import optax

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


class NatureCNN(nn.Module):
    """The Nature-DQN torso (Mnih et al., 2015): conv 32 8x8 stride 4, 64 4x4 stride 2, 64 3x3
    stride 1 (VALID, ReLU), flatten, Dense 512 ReLU. Images ``(..., H, W, C)``, at least
    36 pixels a side (``config.CNN_MIN_SIZE``); uint8 is scaled
    by 1/255 here, so actors can send frames as bytes; floats are taken as already scaled."""

    kernel_init: Initializer = nn.initializers.orthogonal(np.sqrt(2))

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = obs.astype(jnp.float32)
        if obs.dtype == jnp.uint8:
            x = x / 255.0
        batch = x.shape[:-3]
        x = x.reshape((-1, *x.shape[-3:]))
        for features, size, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = nn.relu(nn.Conv(features, (size, size), (stride, stride), padding="VALID",
                                kernel_init=self.kernel_init)(x))
        x = x.reshape((*batch, -1))
        return nn.relu(nn.Dense(512, kernel_init=self.kernel_init)(x))


def torso(network: Network, hidden: Sequence[int], *,
          activation: Callable[[jax.Array], jax.Array] = nn.tanh,
          kernel_init: Initializer = nn.initializers.orthogonal(np.sqrt(2))) -> nn.Module:
    """The feature extractor ``network`` names (see the module docstring). ``hidden`` sizes the
    MLP; ``activation`` is the MLP's, ``kernel_init`` that of the built-in torsos' layers."""
    if network == "mlp":
        return MLP(tuple(hidden), activation, kernel_init)
    if network == "cnn":
        return NatureCNN(kernel_init)
    if isinstance(network, str):
        factory = _import_factory(network)
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


def _import_factory(spec: str) -> Callable[[], Any]:
    check_network_name(spec)
    module_name, _, name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is None or not (module_name == err.name or module_name.startswith(f"{err.name}.")):
            raise
        raise ValueError(f"network {spec!r}: cannot import module {module_name!r} ({err}); it must "
                         "be importable (installed or on PYTHONPATH) wherever the network is "
                         "built") from err
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ValueError(f"network {spec!r}: module {module_name!r} has no function {name!r}")
    return factory


class ActorCritic(nn.Module):
    """``(obs) -> (dist, value (...))``; ``method="policy"`` runs only the policy, for actors.

    ``dist`` is what :mod:`jaxdist.agents.distributions` takes: logits ``(..., n)`` for discrete
    actions; ``(mean (..., d), log_std (d,))`` for continuous ones, with ``log_std`` a
    state-independent parameter (init 0, std 1), as in PPO's paper and CleanRL.
    """

    action: ActionSpace
    network: Network = "mlp"
    hidden: tuple[int, ...] = (64, 64)

    def setup(self) -> None:
        self.torso = torso(self.network, self.hidden)
        self.value_torso = torso(self.network, self.hidden) if self.network == "mlp" else None
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

    def _dist(self, features: jax.Array) -> Dist:
        out = self.head(features)
        return out if self.action.discrete else (out, self.log_std)


class QNetwork(nn.Module):
    """``(obs) -> Q-values (..., num_actions)``. Ape-X's as tuned: ReLU and flax's default
    (LeCun normal) init, and the dueling head of its paper (Wang et al., 2016):
    ``Q(s, a) = V(s) + A(s, a) - mean_a A(s, a)``."""

    num_actions: int
    network: Network = "mlp"
    hidden: tuple[int, ...] = (128, 128)
    dueling: bool = True

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = torso(self.network, self.hidden, activation=nn.relu,
                  kernel_init=nn.initializers.lecun_normal())(obs)
        if not self.dueling:
            return nn.Dense(self.num_actions)(x)
        advantage = nn.Dense(self.num_actions)(x)
        value = nn.Dense(1)(x)
        return value + advantage - jnp.mean(advantage, axis=-1, keepdims=True)


def clipped_adam(learning_rate: float, max_grad_norm: float, anneal_steps: int | None) -> optax.GradientTransformation:
    """Adam (eps 1e-5) after global-norm clipping; over ``anneal_steps`` SGD steps (if given)
    the rate falls linearly to 0."""
    import optax  # here: actors build networks and need no optimiser

    rate: Any = learning_rate if not anneal_steps else optax.linear_schedule(learning_rate, 0.0, anneal_steps)
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(rate, eps=1e-5))
