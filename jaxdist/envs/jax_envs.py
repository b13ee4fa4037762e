"""Environments in JAX, so that a whole batch of episodes (``vmap`` over envs) runs inside one
jitted ``lax.scan`` with the policy: CartPole-v1 and Pendulum-v1 ported line by line from
gymnasium's classic control, and, with ``pip install -e '.[jaxenv]' in the jaxdist clone``, gymnax's envs
(Acrobot-v1, MountainCar-v0, MinAtar, bsuite, ...). ``jax_env(env_id)`` gives an id's JAX env:
jaxdist's own port where there is one (no gymnax import, ~2 s), else gymnax's; a task masked
with :mod:`jaxdist.envs.masked` (``CartPoleNoVel-v1``, ``PendulumNoVel-v1``) gets its base's, masked.

The API is functional: ``reset(key) -> (state, obs)`` and ``step(state, action, key) -> Step``
(the key matters to stochastic envs; the ports ignore it), both pure and jittable and without
autoreset, so a caller vmaps them over envs and autoresets with ``jnp.where`` on
``terminated | truncated`` inside its scan. The actors' JAX backend (``jaxdist.envs.jax_rollout``),
Anakin and ES's rollouts run on them.

The functions are pure and follow the dtype of the state: float32 in training, float64 (under
``jax.enable_x64``) where a test checks them step for step against gymnasium, whose envs keep
their state in float64. A state carries its step count ``t``; ``truncated`` turns true at
``max_steps``, as gymnasium's ``TimeLimit`` does (500 for CartPole-v1, 200 for Pendulum-v1).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxdist.envs.masked import MASKED
from jaxdist.envs.ports import gymnax_installed, jax_version_missing


class State(NamedTuple):
    physics: jax.Array  # CartPole: (x, x_dot, theta, theta_dot); Pendulum: (theta, theta_dot)
    t: jax.Array  # steps taken in this episode


class Step(NamedTuple):
    state: State
    obs: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array


@dataclasses.dataclass(frozen=True)
class JaxEnv:
    """One of jaxdist's ports: ``reset(key) -> (state, obs)``, ``step(state, action, key=None) -> Step``."""

    env_id: str
    obs_size: int
    action_size: int  # number of actions when discrete, else the action's dimension
    discrete: bool
    action_scale: float  # continuous actions lie in [-action_scale, action_scale]
    max_steps: int
    reset_physics: Callable[[jax.Array], jax.Array]
    physics_step: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]
    observe: Callable[[jax.Array], jax.Array]

    def reset(self, key: jax.Array) -> tuple[State, jax.Array]:
        physics = self.reset_physics(key)
        return State(physics, jnp.zeros((), jnp.int32)), self.observe(physics)

    def step(self, state: State, action: jax.Array, key: jax.Array | None = None) -> Step:
        del key  # deterministic dynamics
        physics, reward, terminated = self.physics_step(state.physics, action)
        t = state.t + 1
        return Step(State(physics, t), self.observe(physics), reward, terminated, t >= self.max_steps)

    @property
    def action_bounds(self) -> tuple[float, float] | None:
        """(low, high) of a continuous action (what an actor clips a policy's sample to), None if discrete."""
        return None if self.discrete else (-self.action_scale, self.action_scale)


# CartPole-v1 (gymnasium/envs/classic_control/cartpole.py, Euler integrator) ------------------

GRAVITY, MASSCART, MASSPOLE, LENGTH, FORCE_MAG, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
TOTAL_MASS = MASSPOLE + MASSCART
POLEMASS_LENGTH = MASSPOLE * LENGTH
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4


def cartpole_reset(key: jax.Array) -> jax.Array:
    return jax.random.uniform(key, (4,), minval=-0.05, maxval=0.05)


def cartpole_step(physics: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    x, x_dot, theta, theta_dot = physics
    force = jnp.where(action == 1, FORCE_MAG, -FORCE_MAG)
    costheta, sintheta = jnp.cos(theta), jnp.sin(theta)
    temp = (force + POLEMASS_LENGTH * jnp.square(theta_dot) * sintheta) / TOTAL_MASS
    thetaacc = (GRAVITY * sintheta - costheta * temp) / (
        LENGTH * (4.0 / 3.0 - MASSPOLE * jnp.square(costheta) / TOTAL_MASS))
    xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
    x = x + TAU * x_dot
    x_dot = x_dot + TAU * xacc
    theta = theta + TAU * theta_dot
    theta_dot = theta_dot + TAU * thetaacc
    terminated = (x < -X_THRESHOLD) | (x > X_THRESHOLD) | (theta < -THETA_THRESHOLD) | (theta > THETA_THRESHOLD)
    reward = jnp.ones((), physics.dtype)  # 1 on every step, the terminating one included
    return jnp.stack([x, x_dot, theta, theta_dot]), reward, terminated


# Pendulum-v1 (gymnasium/envs/classic_control/pendulum.py, g = 10) ---------------------------

MAX_SPEED, MAX_TORQUE, DT, G, M, L = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0


def pendulum_reset(key: jax.Array) -> jax.Array:
    high = jnp.array([math.pi, 1.0])
    return jax.random.uniform(key, (2,), minval=-high, maxval=high)


def angle_normalize(x: jax.Array) -> jax.Array:
    return jnp.mod(x + math.pi, 2 * math.pi) - math.pi


def pendulum_step(physics: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    th, thdot = physics
    u = jnp.clip(action, -MAX_TORQUE, MAX_TORQUE)[0]  # in the action's dtype, as gymnasium computes with it
    costs = angle_normalize(th) ** 2 + 0.1 * thdot**2 + 0.001 * (u**2)
    newthdot = thdot + (3 * G / (2 * L) * jnp.sin(th) + 3.0 / (M * L**2) * u) * DT
    newthdot = jnp.clip(newthdot, -MAX_SPEED, MAX_SPEED)
    newth = th + newthdot * DT
    return jnp.stack([newth, newthdot]), -costs, jnp.zeros((), bool)


def pendulum_observe(physics: jax.Array) -> jax.Array:
    th, thdot = physics
    return jnp.stack([jnp.cos(th), jnp.sin(th), thdot])


ENVS: dict[str, JaxEnv] = {
    "CartPole-v1": JaxEnv("CartPole-v1", obs_size=4, action_size=2, discrete=True, action_scale=1.0,
                            max_steps=500, reset_physics=cartpole_reset, physics_step=cartpole_step,
                            observe=lambda physics: physics),
    "Pendulum-v1": JaxEnv("Pendulum-v1", obs_size=3, action_size=1, discrete=False, action_scale=MAX_TORQUE,
                            max_steps=200, reset_physics=pendulum_reset, physics_step=pendulum_step,
                            observe=pendulum_observe),
}


# gymnax (optional: jaxdist[jaxenv]) ------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity (jit's static argument); one per id
class GymnaxEnv:
    """A gymnax env behind the same surface as ``JaxEnv``. gymnax's own ``step`` autoresets in
    the same step, losing the terminal observation; this steps with ``step_env`` and reports
    truncation (gymnax's ``is_truncated``: the time limit) apart from termination, as the ports do."""

    env_id: str
    env: Any  # gymnax.environments.environment.Environment
    params: Any  # its EnvParams
    obs_size: int
    action_size: int
    discrete: bool
    action_scale: float
    max_steps: int
    action_bounds: tuple[jax.Array, jax.Array] | None

    def reset(self, key: jax.Array) -> tuple[Any, jax.Array]:
        obs, state = self.env.reset_env(key, self.params)
        return state, obs

    def step(self, state: Any, action: jax.Array, key: jax.Array | None = None) -> Step:
        key = jax.random.key(0) if key is None else key
        obs, state, reward, terminated, _ = self.env.step_env(key, state, action, self.params)
        truncated = self.env.is_truncated(state, self.params)
        return Step(state, obs, jnp.asarray(reward, jnp.float32), jnp.asarray(terminated, bool),
                    jnp.asarray(truncated, bool))


@functools.lru_cache(maxsize=None)
def gymnax_env(env_id: str) -> GymnaxEnv:
    """gymnax's ``env_id`` with its default parameters (one object per id and process)."""
    import gymnax
    from gymnax.environments import spaces

    env, params = gymnax.make(env_id)
    space = env.action_space(params)
    obs_size = math.prod(env.observation_space(params).shape)
    if isinstance(space, spaces.Discrete):
        return GymnaxEnv(env_id, env, params, obs_size, int(space.n), True, 1.0, int(params.max_steps_in_episode),
                         None)
    if isinstance(space, spaces.Box):
        low, high = jnp.broadcast_to(space.low, space.shape), jnp.broadcast_to(space.high, space.shape)
        return GymnaxEnv(env_id, env, params, obs_size, math.prod(space.shape), False,
                         float(jnp.max(jnp.abs(jnp.concatenate([low.ravel(), high.ravel()])))),
                         int(params.max_steps_in_episode), (low, high))
    raise ValueError(f"gymnax's {env_id} has action space {space}; jaxdist's actors take Discrete and Box")


# Masked observations (jaxdist.envs.masked) -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MaskedEnv:
    """A JAX env whose observation entries at ``hidden`` read 0, as the gymnasium task
    :func:`jaxdist.envs.masked.register_masked` made of the same base."""

    env_id: str
    base: Any  # JaxEnv | GymnaxEnv
    hidden: tuple[int, ...]

    def __getattr__(self, name: str) -> Any:  # sizes, bounds, max_steps: the base's
        if name.startswith("__") or name == "base":  # copy and pickle probe before base is set
            raise AttributeError(name)
        return getattr(self.base, name)

    def mask(self, obs: jax.Array) -> jax.Array:
        keep = jnp.ones(obs.shape[-1], bool).at[jnp.asarray(self.hidden)].set(False)
        return jnp.where(keep, obs, jnp.zeros((), obs.dtype))

    def observe(self, physics: jax.Array) -> jax.Array:
        return self.mask(self.base.observe(physics))

    def reset(self, key: jax.Array) -> tuple[Any, jax.Array]:
        state, obs = self.base.reset(key)
        return state, self.mask(obs)

    def step(self, state: Any, action: jax.Array, key: jax.Array | None = None) -> Step:
        out = self.base.step(state, action, key)
        return out._replace(obs=self.mask(out.obs))


def jax_env(env_id: str) -> JaxEnv | GymnaxEnv | MaskedEnv:
    """The JAX env of ``env_id``: jaxdist's port, else gymnax's when installed (any of its ids),
    masked for a masked task; an error that names the ids the agents have one of (and what to
    install) for the others."""
    if env_id in MASKED:
        base, hidden = MASKED[env_id]
        return MaskedEnv(env_id, jax_env(base), hidden)
    if env_id in ENVS:
        return ENVS[env_id]
    if gymnax_installed():
        import gymnax

        if env_id in gymnax.registered_envs:
            return gymnax_env(env_id)
    raise ValueError(jax_version_missing(env_id))
