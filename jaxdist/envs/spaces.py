"""What an agent must know about an environment before it builds networks: the observation shape
and dtype and the action space, as small hashable records. They sit beside the envs (gymnasium's,
read by ``env_info``, and the JAX ports in ``jaxdist.envs.jax_envs``), below the agents.

No JAX here: launching processes read an env's spaces (``env_info``) without starting JAX.
``ActionSpace`` is hashable so that jitted functions take it as a static argument (see
:mod:`jaxdist.agents.actor_critic`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
from typing import Any

import gymnasium
import numpy as np

from jaxdist.envs import atari, gymnax_as_gym
from jaxdist.envs.mujoco_log import route_mujoco_warnings

_SUPPORTED = "Discrete (starting at 0) and float Box"


@dataclasses.dataclass(frozen=True)
class ActionSpace:
    """``ActionSpace(num_actions=n)`` (Discrete) or ``ActionSpace(shape, low, high)`` (Box, bounds
    flattened row-major into tuples so that the record stays hashable; they may be infinite)."""

    num_actions: int | None = None
    shape: tuple[int, ...] = ()
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.num_actions is not None:
            if self.num_actions < 1 or self.shape or self.low or self.high:
                raise ValueError(f"a discrete ActionSpace has num_actions >= 1 and no shape or "
                                 f"bounds; got {self}")
            return
        size = math.prod(self.shape)
        if not self.shape or size < 1 or len(self.low) != size or len(self.high) != size:
            raise ValueError(f"a continuous ActionSpace needs a non-empty shape and {size} low and "
                             f"high bounds (flattened); got {self}")

    @property
    def discrete(self) -> bool:
        return self.num_actions is not None

    @property
    def size(self) -> int:
        """The number of logits (discrete) or action dimensions (continuous) a policy outputs."""
        return self.num_actions if self.num_actions is not None else math.prod(self.shape)

    @classmethod
    def from_gym(cls, space: gymnasium.Space) -> ActionSpace:
        """The record of a gymnasium ``Discrete`` or float ``Box`` action space."""
        if isinstance(space, gymnasium.spaces.Discrete):
            if int(space.start) != 0:
                raise ValueError(f"action space {space} starts at {int(space.start)}; policies "
                                 "choose actions 0..n-1: shift the env's actions to start at 0 "
                                 "(e.g. with gymnasium.wrappers.TransformAction)")
            return cls(num_actions=int(space.n))
        if isinstance(space, gymnasium.spaces.Box) and np.issubdtype(space.dtype, np.floating):
            return cls(shape=tuple(int(d) for d in space.shape),
                       low=tuple(float(x) for x in space.low.flat),
                       high=tuple(float(x) for x in space.high.flat))
        raise ValueError(f"action space {space} is not supported; supported: {_SUPPORTED}")


@dataclasses.dataclass(frozen=True)
class EnvInfo:
    """One (unvectorized) env's observation shape and dtype (e.g. ``"uint8"``) and action space;
    ``channels_first``: its images are ``(channels, height, width)``, as EnvPool's Atari frames
    (``jaxdist.envs.atari``), not ``(height, width, channels)``."""

    obs_shape: tuple[int, ...]
    obs_dtype: str
    action: ActionSpace
    channels_first: bool = False


@functools.lru_cache(maxsize=None)
def env_info(env_id: str) -> EnvInfo:
    """Make ``env_id`` once with gymnasium and read its spaces.

    ``"module:EnvId"`` ids work as in ``gymnasium.make``: the module is imported first, so it can
    register the env; that is how an env of your own reaches actors in other processes.
    """
    channels_first = atari.is_atari(env_id)
    if channels_first:
        obs, action = atari.spaces(env_id)
    else:
        env = _make(env_id)
        try:
            obs, action = env.observation_space, env.action_space
        finally:
            env.close()
    if not isinstance(obs, gymnasium.spaces.Box):
        raise ValueError(f"{env_id}: observation space {obs} is not supported; observations must "
                         "be one array (a Box); flatten others with gymnasium's wrappers")
    return EnvInfo(tuple(int(d) for d in obs.shape), np.dtype(obs.dtype).name,
                   ActionSpace.from_gym(action), channels_first)


def _make(env_id: str) -> Any:
    gymnax_as_gym.register()
    if ":" in env_id:
        module = env_id.split(":")[0]
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name is None or not (module == err.name or module.startswith(f"{err.name}.")):
                raise
            raise ValueError(f"environment id {env_id!r}: cannot import module {module!r} ({err}); "
                             "'module:EnvId' needs the module importable (installed or on "
                             "PYTHONPATH) in every process") from err
    try:
        route_mujoco_warnings(gymnasium.spec(env_id.rpartition(":")[2]).entry_point)  # module imported above
        return gymnasium.make(env_id)
    except gymnasium.error.UnregisteredEnv as err:
        raise ValueError(f"unknown environment id {env_id!r}: {err} Register it with "
                         "gymnasium.register(id=..., entry_point=...) in a module and pass "
                         "'module:EnvId' so that every process imports that module") from err
    except gymnasium.error.DependencyNotInstalled as err:  # Box2D, MuJoCo, ALE, ...
        raise ValueError(f"environment {env_id!r} needs what is not installed here: {err}") from err
