"""Environments in JAX: CartPole-v1 and Pendulum-v1, ported line by line from gymnasium's classic
control, so that a whole batch of episodes (``vmap`` over envs) runs inside one jitted
``lax.scan`` with the policy. ``jax_env(env_id)`` gives the port of a gymnasium id.

The API is functional: ``reset(key) -> (state, obs)`` and ``step(state, action) -> Step``, both
pure and jittable, so a caller vmaps them over envs and autoresets with ``jnp.where`` on
``terminated | truncated`` inside its scan. ES's rollouts (``jaxdist.agents.es``) run on them.

The functions are pure and follow the dtype of the state: float32 in training, float64 (under
``jax.enable_x64``) where a test checks them step for step against gymnasium, whose envs keep
their state in float64. A state carries its step count ``t``; ``truncated`` turns true at
``max_steps``, as gymnasium's ``TimeLimit`` does (500 for CartPole-v1, 200 for Pendulum-v1).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp


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
    """One environment: ``reset(key) -> (state, obs)``, ``step(state, action) -> Step``."""

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

    def step(self, state: State, action: jax.Array) -> Step:
        physics, reward, terminated = self.physics_step(state.physics, action)
        t = state.t + 1
        return Step(State(physics, t), self.observe(physics), reward, terminated, t >= self.max_steps)


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


def jax_env(env_id: str) -> JaxEnv:
    """The JAX port of ``env_id``; a clear error for the envs that have none."""
    try:
        return ENVS[env_id]
    except KeyError:
        raise ValueError(f"no JAX port of {env_id!r}; jaxdist.jax_envs has {', '.join(ENVS)}") from None

