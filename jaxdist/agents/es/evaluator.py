"""The evaluator node: ES's actor, scoring perturbations of the master's parameters."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from jaxdist.agents.es.config import ESConfig


class Evaluator:
    """``evaluate({"generation": g, "seeds": [...]})`` -> the fitness of ``theta_g +/- sigma *
    eps(seed)`` for each seed, and the env steps it took.

    Only seeds and fitnesses cross the wire per task. The parameters of generation g are
    fetched from the master on the evaluator's first task of g (the once-per-generation
    broadcast, pulled), so an evaluator that the supervisor restarted, or one that takes over
    a lost evaluator's task, needs nothing but the task itself.
    """

    def __init__(self, master: Any, config: ESConfig) -> None:
        from jaxdist.agents.es.search import Rollouts  # JAX, imported where the node runs

        self._master = master
        self._rollouts = Rollouts(config)
        self._lock = threading.Lock()
        self._params: tuple[int, np.ndarray] | None = None
        # Compile while the node is being built (calls wait until it is): a task's time is then
        # compute alone, so the pool's backups and deadlines never mistake compiling for slowness.
        theta = np.zeros(self._rollouts.policy.size, np.float32)
        self._rollouts.antithetic(theta, 0, np.zeros(config.pairs_per_task, np.int32))

    def evaluate(self, task: dict[str, Any]) -> dict[str, Any]:
        generation = int(task["generation"])
        fitness, steps = self._rollouts.antithetic(self._params_of(generation), generation, task["seeds"])
        return {"fitness": fitness, "steps": steps}

    def _params_of(self, generation: int) -> np.ndarray:
        with self._lock:
            if self._params is None or self._params[0] != generation:
                self._params = (generation, self._master.get_params(generation))
            return self._params[1]
