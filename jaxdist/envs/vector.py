"""Vectorized gymnasium environments for actors: seeded, with per-env episode statistics, and
with gymnasium's autoreset boundary made explicit so that no learner trains across it.

    env = EnvSpec("CartPole-v1", num_envs=8, backend="auto").make(seed=0)
    step = env.reset()                       # a TimeStep of arrays with a leading num_envs axis
    step = env.step(actions)                 # continuous actions are clipped to the bounds here
    returns, lengths = env.pop_episodes()    # episodes that ended since the last pop

Backends: ``"vector"`` (the env's own vectorized implementation, ``make_vec(...,
vectorization_mode="vector_entry_point")``: no Python per env; CartPole has one),
``"sync"`` (``SyncVectorEnv``), ``"async"`` (``AsyncVectorEnv`` with shared memory, workers
spawned so that none is forked from a process that already runs JAX or gRPC threads; not
from multiprocessing's forkserver, the launchers' own, of which a process has one), ``"envpool"`` (when EnvPool is installed), and ``"auto"``: EnvPool for its Atari games
(``jaxdist.envs.atari``), vector when the env has a vector entry point, else sync; never a choice
that depends on what else is installed, so one command plays the same envs on every machine.
``"jax"`` is not gymnasium's: the env's JAX version (``jaxdist.envs.jax_envs``) played with the actor's policy a whole trajectory per
jitted dispatch (``jaxdist.envs.jax_rollout.JaxVectorEnv``, made by the same ``make(seed)``).

**The autoreset boundary.** Gymnasium 1.x vector envs reset an env on the step *after* its
episode ended: that step ignores the action and returns the first observation of the next
episode with reward 0. A ``TimeStep`` row describes arriving at ``obs``: ``reward`` earned on
the way, ``terminated``/``truncated`` when ``obs`` ends its episode, and ``first`` when ``obs``
begins one, i.e. when the step that led here was an autoreset and must never be learned from.
Equivalently: the transition from row t to row t+1 is real exactly when row t is not the end of
an episode (``~(terminated | truncated)``). Because the terminal observation is a row of its
own, a learner can bootstrap a truncated episode from the value of its true last observation.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from jaxdist.envs.ports import envpool_installed
from jaxdist.envs.mujoco_log import route_mujoco_warnings

if TYPE_CHECKING:
    from jaxdist.envs.jax_rollout import JaxVectorEnv

BACKENDS = ("auto", "vector", "sync", "async", "envpool", "jax")


class TimeStep(NamedTuple):
    """One row for every env (leading axis ``num_envs``); see the module docstring."""

    obs: np.ndarray
    reward: np.ndarray  # float32: earned arriving at obs; 0 on a first row
    terminated: np.ndarray  # bool: obs is terminal (the MDP ended; no bootstrap)
    truncated: np.ndarray  # bool: obs is the last of an episode cut short (bootstrap from it)
    first: np.ndarray  # bool: obs starts an episode (after reset, or the autoreset step)


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """A picklable description of a vector env, built where the actor runs with ``make(seed)``.

    ``kwargs`` go to the env's constructor (``gymnasium.make`` / ``make_vec``; EnvPool's
    ``make``); ``async_context`` is the multiprocessing start method of async workers.
    """

    env_id: str = "CartPole-v1"
    num_envs: int = 8
    backend: str = "auto"
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    async_context: str = "spawn"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown env backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if not isinstance(self.num_envs, int) or self.num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {self.num_envs!r}")
        if self.backend == "jax" and self.kwargs:
            raise ValueError(f"kwargs {dict(self.kwargs)} go to gymnasium's constructor; backend 'jax' takes none")

    def make(self, seed: int, wrap: Callable[[Any], Any] | None = None) -> "VectorEnv | JaxVectorEnv":
        """The envs, seeded from ``seed``; ``wrap`` takes the backend's gymnasium vector env and
        returns the one played (e.g. gymnasium's vector ``RecordVideo``; not for ``"jax"``)."""
        if self.backend == "jax":
            if wrap is not None:
                raise ValueError("backend 'jax' plays no gymnasium vector env to wrap")
            from jaxdist.envs.jax_envs import jax_env
            from jaxdist.envs.jax_rollout import JaxVectorEnv

            return JaxVectorEnv(jax_env(registered_id(self.env_id)), self.num_envs, seed)
        backend = resolve_backend(self.env_id, self.backend)
        env = _make_raw(self, backend, seed)
        return VectorEnv(env if wrap is None else wrap(env), backend, seed)


def backend_unavailable(backend: str) -> str | None:
    """Why ``backend`` cannot run here, said as what to install; None when it can."""
    if backend == "envpool" and not envpool_installed():
        return "env backend 'envpool' needs EnvPool, which is not installed: pip install envpool (Linux, Python <= 3.11)"
    return None


def resolve_backend(env_id: str, backend: str = "auto") -> str:
    """The backend ``auto`` picks for ``env_id`` (or ``backend`` itself, checked)."""
    missing = backend_unavailable(backend)
    if missing:
        raise ImportError(missing)
    from jaxdist.envs import atari

    if atari.is_atari(env_id):
        if backend not in ("auto", "envpool"):
            raise ValueError(f"{env_id} is EnvPool's Atari game: use env backend 'envpool' (or 'auto')")
        return "envpool"
    if backend != "auto":
        return backend
    import gymnasium as gym

    return "vector" if gym.spec(registered_id(env_id)).vector_entry_point is not None else "sync"


def registered_id(env_id: str) -> str:
    """The id under which gymnasium knows ``env_id``: for ``module:EnvId``, ``EnvId`` once the
    module (which registers it on import) is imported in this process."""
    from jaxdist.envs import gymnax_as_gym

    gymnax_as_gym.register()
    module, _, name = env_id.rpartition(":")
    if module:
        importlib.import_module(module)
    return name


def _make_raw(spec: EnvSpec, backend: str, seed: int) -> Any:
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    kwargs = dict(spec.kwargs)
    spec = dataclasses.replace(spec, env_id=registered_id(spec.env_id))
    if backend == "envpool":
        import envpool

        from jaxdist.envs import atari

        kwargs = {"seed": seed, **kwargs}  # EnvPool seeds its envs where it makes them, not at reset
        if atari.is_atari(spec.env_id):
            return atari.make(spec.env_id, spec.num_envs, **kwargs)
        return envpool.make_gymnasium(spec.env_id, num_envs=spec.num_envs, **kwargs)
    route_mujoco_warnings(gym.spec(spec.env_id).entry_point)  # in this process: sync and vector backends
    if backend == "vector":
        env = gym.make_vec(spec.env_id, spec.num_envs, vectorization_mode="vector_entry_point", **kwargs)
        mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        if AutoresetMode(mode) != AutoresetMode.NEXT_STEP:
            env.close()
            raise ValueError(f"{spec.env_id}'s vector env autoresets in mode {mode}; jaxdist.envs.vector expects "
                             "NEXT_STEP: use backend='sync' or 'async'")
        return env
    vector_kwargs: dict[str, Any] = {"autoreset_mode": AutoresetMode.NEXT_STEP}
    if backend == "async":
        vector_kwargs.update(shared_memory=True, context=spec.async_context)
    return gym.make_vec(spec.env_id, spec.num_envs, vectorization_mode=backend, vector_kwargs=vector_kwargs,
                        **kwargs)


def _box_bounds(space: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """(low, high) of a continuous action space, None for any other: continuous policies act
    with unbounded samples (their log-probabilities are of those), and the env gets them
    clipped to its bounds, as gymnasium's ``ClipAction`` would."""
    import gymnasium as gym

    if not isinstance(space, gym.spaces.Box):
        return None
    return space.low.astype(space.dtype), space.high.astype(space.dtype)


class VectorEnv:
    """A gymnasium-style vector env in NEXT_STEP autoreset mode, returning ``TimeStep`` rows and
    keeping each env's episode returns and lengths.

    ``first`` is computed here from the previous row. Gymnasium's vector envs already report
    the autoreset step with reward 0 and no termination; for EnvPool, whose contract is its own,
    those are forced here too. A step adds one NumPy operation to the backend's: it runs once
    per env step of every actor. Episode statistics are computed from the recorded rewards and
    boundaries when asked for (``pop_episodes``, or every ``BACKLOG`` steps), over many steps at
    once.
    """

    BACKLOG = 256

    def __init__(self, env: Any, backend: str, seed: int) -> None:
        self.env = env
        self.backend = backend
        self.seed = seed
        self.num_envs = int(env.num_envs if hasattr(env, "num_envs") else len(env.all_env_ids))
        self.single_observation_space = getattr(env, "single_observation_space", None) or env.observation_space
        self.single_action_space = getattr(env, "single_action_space", None) or env.action_space
        self._mask_first = backend == "envpool"
        self._action_bounds = _box_bounds(self.single_action_space)
        self._reset_done = False
        self._clear()

    def _clear(self) -> None:
        n = self.num_envs
        self._ended = np.zeros(n, bool)  # the last row ended an episode: the next row is first
        self._rows: list[tuple[np.ndarray, np.ndarray]] = []  # (reward, ended) since the last tally
        self._tallied_ended = np.zeros(n, bool)  # ended, for the row before the backlog
        self._return = np.zeros(n, np.float64)  # running episode totals up to the backlog
        self._length = np.zeros(n, np.int64)
        self._episodes: list[tuple[np.ndarray, np.ndarray]] = []

    def reset(self) -> TimeStep:
        """Reset every env, seeded with ``seed`` (sub-env i gets ``seed + i`` where it matters)."""
        if self.backend == "envpool":
            obs, _ = self.env.reset()
        else:
            obs, _ = self.env.reset(seed=self.seed)
        self._reset_done = True
        self._clear()
        n = self.num_envs
        return TimeStep(obs, np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool), np.ones(n, bool))

    def step(self, actions: np.ndarray) -> TimeStep:
        if not self._reset_done:
            raise RuntimeError("call reset() before step()")
        if self._action_bounds is not None:  # a Gaussian policy's raw sample, clipped for the env only
            actions = np.clip(actions, *self._action_bounds)
        obs, reward, terminated, truncated, _ = self.env.step(actions)
        reward = np.asarray(reward, np.float32)
        terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
        first = self._ended
        if self._mask_first:  # the autoreset step: the action was ignored and nothing was earned
            reward = np.where(first, np.float32(0.0), reward)
            terminated, truncated = terminated & ~first, truncated & ~first
        self._ended = terminated | truncated
        self._rows.append((reward, self._ended))
        if len(self._rows) >= self.BACKLOG:
            self._tally()
        return TimeStep(obs, reward, terminated, truncated, first)

    def _tally(self) -> None:
        """Episode statistics of the backlog of rows, all envs and steps in a few array ops."""
        if not self._rows:
            return
        reward = np.stack([r for r, _ in self._rows]).astype(np.float64)  # (K, envs)
        ended = np.stack([e for _, e in self._rows])
        self._rows = []
        steps = np.arange(len(reward))[:, None]
        first = np.concatenate([self._tallied_ended[None], ended[:-1]])  # row k starts an episode
        cumulative = np.cumsum(reward, axis=0)
        # The last first row at or before each row (-1: the episode began before the backlog).
        last_first = np.maximum.accumulate(np.where(first, steps, -1), axis=0)
        began_before = last_first < 0
        at_first = np.take_along_axis(cumulative, np.maximum(last_first, 0), axis=0)
        returns = np.where(began_before, self._return + cumulative, cumulative - at_first)
        lengths = np.where(began_before, self._length + steps + 1, steps - last_first)
        if ended.any():
            self._episodes.append((returns[ended], lengths[ended]))  # row-major: in time order
        self._return, self._length, self._tallied_ended = returns[-1], lengths[-1], ended[-1]

    def pop_episodes(self) -> tuple[np.ndarray, np.ndarray]:
        """(returns, lengths) of the episodes that ended since the last call, in order."""
        self._tally()
        if not self._episodes:
            return np.zeros(0, np.float64), np.zeros(0, np.int64)
        episodes, self._episodes = self._episodes, []
        return np.concatenate([r for r, _ in episodes]), np.concatenate([n for _, n in episodes])

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> "VectorEnv":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"VectorEnv({self.backend}, num_envs={self.num_envs}, seed={self.seed})"


__all__ = ["BACKENDS", "EnvSpec", "TimeStep", "VectorEnv", "envpool_installed", "resolve_backend"]
