"""ES's two nodes. The master serves what a watcher polls of a learner (``status()``: the
generation as its step), writes the learner's files (``metrics.csv`` a row per generation,
``evaluations.csv`` the mean policy's score and the env steps behind it) and checkpoints like
one; the workers serve what a watcher polls of the nodes that make env steps (``stats()``, and
``episodes(since)``: the population's returns, ES's training returns). JAX is imported where
the nodes run, never by the launching process."""

from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

import jaxdist as jd
from jaxdist.agents.experiment import save
from jaxdist.nodes.evaluator import EVALUATIONS, record
from jaxdist.records.metrics import MetricsWriter, metrics_path

if TYPE_CHECKING:
    from jaxdist.agents.es import ESConfig


class Master:
    """Each generation it publishes the mean parameters (``get_params``), maps tasks of noise
    seeds over the workers with :class:`jaxdist.Pool` (a lost worker's task is re-queued),
    steps the mean along the rank-shaped ES gradient and scores the new mean policy on
    ``eval_episodes`` fresh start states of the env's JAX port (step for step gymnasium's).

    It checkpoints every ``checkpoint_every_generations`` and when it stops, so a restart by the
    supervisor, or a rerun on the same run directory, resumes. Stopped first (a node option), it
    finishes the generation in flight while the workers still serve, saves, and ends the program."""

    def __init__(self, workers: list[Any], config: ESConfig, factory: str) -> None:
        from jaxdist.agents.es.search import Rollouts, Search  # JAX, imported where the node runs
        from jaxdist.learning.layout import checkpoint_dir

        node = jd.current_node()
        if node is None:
            raise RuntimeError("the ES master runs as a node of a launched program: see es.agent(config).topology()")
        jd.finish_on_stop()  # interrupted, it would lose the generation in flight
        self._run_dir, self._config = node.run_dir, config
        save(self._run_dir, factory, config)  # the run's config, however it was launched
        self._rollouts = Rollouts(config)
        self._search = Search(config, self._rollouts.policy, checkpoint_dir(self._run_dir, node.node_name))
        self._pool = jd.Pool(workers, task_timeout=config.task_timeout, backup_after=config.backup_after,
                             unavailable_timeout=config.unavailable_timeout)
        self._lock = threading.Lock()
        self._published: tuple[int, np.ndarray] = (-1, np.zeros(0, np.float32))

    def get_params(self, generation: int) -> np.ndarray:
        """The mean parameters of ``generation``, the one being evaluated."""
        with self._lock:
            published, theta = self._published
        if generation != published:
            raise LookupError(f"the master is evaluating generation {published}, not {generation}")
        return theta

    def status(self) -> dict[str, Any]:
        search = self._search
        return {"step": search.generation, "restored_step": search.restored_generation, "env_steps": search.env_steps}

    def run(self) -> None:
        config, search = self._config, self._search
        if search.env_steps >= config.total_steps:
            print(f"the run has trained for its {config.total_steps:,} env steps: pass --fresh to start over, or a "
                  f"larger --total-steps with --allow-config-change to train on", flush=True)
            search.close()
            jd.stop(f"the run had trained for its {config.total_steps:,} env steps already")
            return
        metrics = MetricsWriter(metrics_path(self._run_dir), purge_after_step=search.generation)
        evaluations = MetricsWriter(metrics_path(self._run_dir, EVALUATIONS))
        try:
            while not jd.stop_requested() and search.env_steps < config.total_steps:
                row = self._generation()
                metrics.write(search.generation, row)
                returns = self._rollouts.evaluate(search.theta, search.generation)
                if record(evaluations, search.generation, returns, config.target_return, config.stop_at_target,
                          search.env_steps) and config.stop_at_target:
                    break
        finally:
            with jd.saving_checkpoint():
                search.save()
            search.close()
            metrics.close()
            evaluations.close()
            self._pool.close()
        # The workers have no work of their own: the program, on every host, is over.
        jd.stop(f"training is over at generation {search.generation} ({search.env_steps:,} env steps)")

    def _generation(self) -> dict[str, Any]:
        """Publish the mean, map the generation's seeds over the workers, step: the metrics row."""
        config, search = self._config, self._search
        with self._lock:
            self._published = (search.generation, np.asarray(search.theta))
        seeds = search.seeds()
        tasks = [{"generation": search.generation, "seeds": seeds[i:i + config.pairs_per_task]}
                 for i in range(0, len(seeds), config.pairs_per_task)]
        results = self._pool.map("evaluate", tasks)
        fitness = np.concatenate([np.asarray(result["fitness"]) for result in results])
        grad_norm = search.step(seeds, fitness, sum(int(result["steps"]) for result in results))
        stats = self._pool.stats()
        return {"population_return": float(fitness.mean()), "population_best": float(fitness.max()),
                "grad_norm": grad_norm, "env_steps": search.env_steps, "requeued": stats.requeued,
                "backups": stats.backups, "workers_lost": stats.lost, "workers_live": stats.live}


class Worker:
    """``evaluate({"generation": g, "seeds": [...]})`` -> the fitness of ``theta_g +/- sigma *
    eps(seed)`` for each seed, and the env steps it took.

    Only seeds and fitnesses cross the wire per task. The parameters of generation g are
    fetched from the master on the worker's first task of g (the once-per-generation broadcast,
    pulled), so a worker that the supervisor restarted, or one that takes over a lost worker's
    task, needs nothing but the task itself."""

    def __init__(self, master: Any, config: ESConfig, keep_returns: int = 1000) -> None:
        from jaxdist.agents.es.search import Rollouts  # JAX, imported where the node runs

        self._master = master
        self._rollouts = Rollouts(config)
        self._lock = threading.Lock()
        self._params: tuple[int, np.ndarray] | None = None
        self._env_steps, self._generation = 0, -1
        self._returns: collections.deque[float] = collections.deque(maxlen=keep_returns)
        self._return_count = 0
        # Compile while the node is being built (calls wait until it is): a task's time is then
        # compute alone, so the pool's backups and deadlines never mistake compiling for slowness.
        theta = np.zeros(self._rollouts.policy.size, np.float32)
        self._rollouts.antithetic(theta, 0, np.zeros(config.pairs_per_task, np.int32))

    def evaluate(self, task: dict[str, Any]) -> dict[str, Any]:
        generation = int(task["generation"])
        fitness, steps = self._rollouts.antithetic(self._params_of(generation), generation, task["seeds"])
        with self._lock:
            self._env_steps += steps
            self._generation = max(self._generation, generation)
            self._returns.extend(fitness.ravel().tolist())
            self._return_count += fitness.size
        return {"fitness": fitness, "steps": steps}

    def stats(self) -> dict[str, Any]:
        """Env steps of this worker's life, and the newest generation it evaluated."""
        with self._lock:
            return {"env_steps": self._env_steps, "version": self._generation}

    def episodes(self, since: int = 0) -> dict[str, Any]:
        """The members' returns numbered ``since`` onwards that are still kept (as an actor's)."""
        with self._lock:
            kept = list(self._returns)[max(0, len(self._returns) - (self._return_count - since)):]
            return {"next": self._return_count, "returns": kept}

    def _params_of(self, generation: int) -> np.ndarray:
        held = self._params  # one tuple, swapped whole: generation and parameters agree
        if held is None or held[0] != generation:
            held = self._params = (generation, self._master.get_params(generation))
        return held[1]
