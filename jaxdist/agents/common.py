"""Pieces every agent's program uses: a learner fed from a FIFO of trajectories, actor seeds,
and the per-group environment of CPU processes. No JAX here: launching processes import it."""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

# Small XLA computations on a shared CPU: one thread each, no pool hand-offs.
SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


class TrajectoryBatches:
    """A learner's batch source: ``batch_size`` trajectories from a FIFO replay node.

    It waits for data in short slices and ends the source (``StopIteration``: the learner saves
    and returns) once the program is stopping, so a learner fetching inline (``prefetch=0``,
    which keeps the policy lag lowest) is never left waiting on actors that have stopped. A
    learner spanning processes passes ``end_on_stop=False``: all its processes must step on to
    the step they agreed to stop at, and its actors still run until it has."""

    def __init__(self, queue: Any, batch_size: int, slice_seconds: float = 0.25, end_on_stop: bool = True) -> None:
        from jaxdist.nodes.replay import ReplayClient

        self._replay = ReplayClient(queue)
        self._batch_size, self._slice, self._end_on_stop = batch_size, slice_seconds, end_on_stop

    def __call__(self) -> Any:
        from jaxdist.launch import context

        while True:
            try:
                return self._replay.sample(self._batch_size, timeout=self._slice)["data"]
            except TimeoutError:
                if self._end_on_stop and context.stop_requested():
                    raise StopIteration from None


class FifoLearner:
    """``FifoLearner(make_logic, hp, queue, batch_size, **options)`` is the generic ``Learner``
    with the ``LearnerLogic`` that ``make_logic(hp)`` returns, learning from ``batch_size``
    trajectories of the FIFO replay node ``queue`` per update. It is built in the process it
    runs in, so that the launching process needs no JAX."""

    stops_first = True  # as the Learner it builds

    def __new__(cls, make_logic: Callable[[Any], Any], hp: Any, queue: Any, batch_size: int, **options: Any) -> Any:
        from jaxdist.nodes.learner import Learner

        source = TrajectoryBatches(queue, batch_size, end_on_stop=options.get("distributed") is None)
        return Learner(make_logic(hp), source, **options)

    def run(self) -> None:  # pragma: no cover - marks a node with work; the Learner's run() runs
        raise NotImplementedError


def actor_seed(seed: int, index: int) -> int:
    """Distinct per actor and run; spaced so sync/async sub-envs (seed + i) never collide."""
    return seed * 1_000_003 + index * 10_007


def cpu_resources(groups: tuple[str, ...] = ("learner", "actor"),
                  compilation_cache: str | None = None) -> dict[str, dict[str, Any]]:
    """Per-group environment for the processes launcher: CPU JAX (unless ``JAX_PLATFORMS``
    says otherwise), single-threaded XLA, and optionally a persistent compilation cache shared
    by every process."""
    env = {"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"), "XLA_FLAGS": SINGLE_THREAD_XLA}
    if compilation_cache:
        env.update(JAX_COMPILATION_CACHE_DIR=compilation_cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return {group: {"env": dict(env)} for group in groups}


@functools.lru_cache(maxsize=None)
def env_dims(env_id: str, agent: str = "this agent") -> tuple[tuple[int, ...], int]:
    """(observation shape, number of actions) of a gymnasium env with discrete actions."""
    import gymnasium as gym

    env = gym.make(env_id)
    try:
        if not hasattr(env.action_space, "n"):
            raise ValueError(f"{agent} chooses among discrete actions; {env_id} has {env.action_space}")
        return tuple(env.observation_space.shape), int(env.action_space.n)
    finally:
        env.close()
