"""Partially observable tasks: an env's observations with some entries hidden, so that an agent
must remember what it can no longer see.

A hidden entry reads 0 (the observation space keeps its bounds), as rl-baselines3-zoo's
``MaskVelocityWrapper`` does: the observation keeps its shape, so a network, a normaliser or a
wrapper written for the full task takes the masked one unchanged. Two such tasks ship with
jaxdist, registered with gymnasium whenever ``jaxdist.envs`` is imported (any jaxdist agent,
actor or evaluator imports it), under the ids rl-baselines3-zoo and SB3-contrib's benchmarks use:

- ``CartPoleNoVel-v1``: CartPole-v1 without its two velocities (cart position, pole angle only);
- ``PendulumNoVel-v1``: Pendulum-v1 without the angular velocity (cos and sin of the angle).

Make another task partially observable with :func:`register_masked` in a module of your own and
pass ``--env-id your_module:YourTask-v0`` (every process then imports the module). Where the base
task has a JAX version (:mod:`jaxdist.envs.jax_envs`), the masked one has too, for
``--env-backend jax`` and Anakin. This module imports no JAX: configs read :data:`MASKED` before
anything is launched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np

MASKED: dict[str, tuple[str, tuple[int, ...]]] = {}
"""Each masked task's id -> (its base task's id, the indices of the hidden entries)."""


class MaskObservation(gymnasium.ObservationWrapper):
    """Observations (a flat ``Box``) with the entries at ``hidden`` set to 0."""

    def __init__(self, env: gymnasium.Env, hidden: Sequence[int]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gymnasium.spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"MaskObservation hides entries of flat Box observations; got {space}")
        bad = [i for i in hidden if not 0 <= i < space.shape[0]]
        if bad or not hidden:
            raise ValueError(f"hidden must name entries 0 to {space.shape[0] - 1} of the observation; got "
                             f"{tuple(hidden)}")
        self._keep = np.ones(space.shape, space.dtype)
        self._keep[list(hidden)] = 0

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation * self._keep


def make_masked(base: str, hidden: Sequence[int], **kwargs: Any) -> gymnasium.Env:
    """``gymnasium.make(base, **kwargs)`` with the entries at ``hidden`` masked."""
    return MaskObservation(gymnasium.make(base, **kwargs), hidden)


def register_masked(env_id: str, base: str, hidden: Sequence[int]) -> None:
    """Register ``env_id`` with gymnasium: ``base`` (a registered id) with the observation entries
    at ``hidden`` masked; its episodes end where ``base``'s do (its time limit included)."""
    hidden = tuple(int(i) for i in hidden)
    MASKED[env_id] = (base, hidden)
    if env_id not in gymnasium.registry:
        gymnasium.register(id=env_id, entry_point=make_masked, kwargs={"base": base, "hidden": hidden})


def register_no_velocity() -> None:
    """The no-velocity tasks of rl-baselines3-zoo (see the module docstring)."""
    register_masked("CartPoleNoVel-v1", "CartPole-v1", (1, 3))
    register_masked("PendulumNoVel-v1", "Pendulum-v1", (2,))


__all__ = ["MASKED", "MaskObservation", "make_masked", "register_masked", "register_no_velocity"]
