"""The evaluator node: the deterministic policy's return on fresh episodes, every few updates.

Training returns (those of the actors' exploring policies) say little about the policy being
learned: an epsilon-greedy or sampling actor scores below its greedy self, and its episodes mix
several parameter versions. The evaluator waits for each ``every_updates``-th version the
learner publishes, plays one episode in each of its ``num_envs`` envs (seeded afresh for every
evaluation, never the actors' seeds), and records the mean return: the number the progress
line, the metrics and the target report. With ``stop_at_target`` it ends the program (``jd.
stop()``) at the first evaluation that reaches ``target_return``.

Served: ``results(since)`` (evaluations numbered ``since`` onwards) and ``status()``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from jaxdist import courier
from jaxdist.launch import context
from jaxdist.nodes.actor import Policy, jitted_step


class Evaluator:
    def __init__(self, policy: Policy, env: Any, params: Any, *, every_updates: int, seed: int,
                 target_return: float | None = None, stop_at_target: bool = False,
                 rng_impl: str | None = "unsafe_rbg") -> None:
        import jax

        self._env = env.make(seed)
        self._params = params
        self._every = every_updates
        self._seed = seed
        self._target, self._stop_at_target = target_return, stop_at_target
        self._step = jitted_step(policy, rng_impl)
        self._key = jax.random.key_data(jax.random.key(seed, impl=rng_impl))
        self._lock = threading.Lock()
        self._results: list[tuple[float, int, float, float, float]] = []  # (time, version, mean, min, max)

    def results(self, since: int = 0) -> dict[str, Any]:
        """``{"next": the number to ask for next time, "times", "versions", "returns" (means),
        "min", "max"}`` of the evaluations numbered ``since`` onwards."""
        with self._lock:
            kept = self._results[since:]
            count = len(self._results)
        columns = list(zip(*kept)) or [(), (), (), (), ()]
        return {"next": count, "times": list(columns[0]), "versions": list(columns[1]),
                "returns": list(columns[2]), "min": list(columns[3]), "max": list(columns[4])}

    def status(self) -> dict[str, Any]:
        with self._lock:
            last = self._results[-1] if self._results else None
        return {"evaluations": len(self._results), "version": None if last is None else last[1],
                "mean_return": None if last is None else last[2]}

    def run(self) -> None:
        wanted = 0
        while not context.stop_requested():
            version, params = self._fetch(wanted)
            if params is None:
                continue
            returns = self.evaluate(params, episode_seed=self._seed + len(self._results) * self._env.num_envs)
            mean = float(np.mean(returns))
            with self._lock:
                self._results.append((time.time(), version, mean, float(np.min(returns)), float(np.max(returns))))
            print(f"evaluation of version {version}: mean return {mean:.1f} over {len(returns)} episodes", flush=True)
            if self._stop_at_target and self._target is not None and mean >= self._target:
                print(f"the evaluation return {mean:.1f} reached the target {self._target:g}: stopping", flush=True)
                context.stop()
                return
            wanted = (version // self._every + 1) * self._every

    def evaluate(self, params: Any, episode_seed: int) -> np.ndarray:
        """One episode in each env, seeded from ``episode_seed``: their returns."""
        env = self._env
        env.seed = episode_seed
        timestep = env.reset()
        returns = np.zeros(env.num_envs, np.float64)
        finished = np.zeros(env.num_envs, bool)
        import jax

        device_params = jax.device_put(params)
        key = self._key
        while not finished.all() and not context.stop_requested():
            key, action, _ = self._step(device_params, timestep.obs, key)
            timestep = env.step(np.asarray(action))
            returns += np.where(finished, 0.0, timestep.reward)
            finished |= timestep.terminated | timestep.truncated
        self._key = key
        return returns

    def _fetch(self, wanted: int) -> tuple[int, Any]:
        """The learner's parameters once it has published version ``wanted`` or later."""
        try:
            reply = self._params.get(wanted - 1, wait=1.0)
        except (courier.CourierError, ConnectionError, TimeoutError):
            context.wait_for_stop(0.5)  # the learner is away (restarting, or done)
            return -1, None
        return reply["version"], reply["params"]

    def close(self) -> None:
        self._env.close()
