"""gymnax's MinAtar games (Young and Tian, 2019: Atari's dynamics on 10x10 grids of object
channels) under gymnasium ids, so that every path an agent has plays them: gymnasium's spaces
(what an agent reads before it builds networks), its ``sync`` vector backend, and, as for every
gymnax env, their JAX version for ``--env-backend jax`` and Anakin (``jaxdist.envs.jax_envs``).

The ids are gymnax's own (``Breakout-MinAtar``, ...), registered with gymnasium the first time an
env id is resolved in a process (:func:`register`), never at import: nothing here imports JAX
until an env is made. Observations are float32 ``(10, 10, channels)`` grids in {0, 1}."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

MINATAR_IDS = ("Breakout-MinAtar", "SpaceInvaders-MinAtar", "Asterix-MinAtar", "Freeway-MinAtar")


class GymnaxAsGym(gymnasium.Env):
    """One gymnax env stepped as a gymnasium env: jitted ``reset_env``/``step_env`` on the CPU,
    NumPy in and out, the time limit reported as truncation (gymnax's ``is_truncated``)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, gymnax_id: str) -> None:
        import jax

        from jaxdist.envs.jax_envs import gymnax_env
        from jaxdist.envs.ports import gymnax_installed

        if not gymnax_installed():
            raise gymnasium.error.DependencyNotInstalled(f"{gymnax_id} is gymnax's: pip install 'jaxdist[jaxenv]'")
        self._env = gymnax_env(gymnax_id)
        space = self._env.env.observation_space(self._env.params)
        self.observation_space = gymnasium.spaces.Box(float(np.min(space.low)), float(np.max(space.high)),
                                                      tuple(space.shape), np.float32)
        self.action_space = gymnasium.spaces.Discrete(self._env.action_size)
        self._reset = jax.jit(self._env.reset)
        self._step = jax.jit(self._env.step)
        self._key = jax.random.key(0)
        self._state: Any = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        import jax

        super().reset(seed=seed)
        if seed is not None:
            self._key = jax.random.key(seed)
        self._key, key = jax.random.split(self._key)
        self._state, obs = self._reset(key)
        return np.asarray(obs, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        import jax

        self._key, key = jax.random.split(self._key)
        step = self._step(self._state, np.int32(action), key)
        self._state = step.state
        return (np.asarray(step.obs, np.float32), float(step.reward), bool(step.terminated), bool(step.truncated), {})


def register() -> None:
    """Register the MinAtar ids with gymnasium (once per process; a no-op after)."""
    for env_id in MINATAR_IDS:
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=f"{__name__}:GymnaxAsGym", kwargs={"gymnax_id": env_id})
