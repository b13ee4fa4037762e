"""The master node: ES's driver. It runs the generations, serves the parameters evaluators pull,
checkpoints, and writes the run directory's outputs.

Each generation it publishes the mean parameters (``get_params``), maps tasks of noise seeds
over the evaluators with :class:`jaxdist.Pool` (a lost evaluator's task is re-queued), steps the
mean along the rank-shaped ES gradient, and scores the new mean policy on ``eval_episodes``
start states of the JAX env. When that score reaches the target it is checked on fresh
episodes of gymnasium's own env; the target counts as reached once gymnasium agrees.

It writes ``progress.csv`` and ``tensorboard/progress`` (one row per generation, by env steps),
and at the end ``learning_curve.png`` and ``summary.json`` (the keys of the actor-learner
agents' summary, which ``jaxdist.agents.cli.report`` reads; ``final_return`` is the final mean
policy's mean return on ``final_episodes`` fresh gymnasium episodes, or after a stop from outside,
which leaves no time for those, its last score on ``eval_episodes``), then stops the program on
every host.
Its state is checkpointed every ``checkpoint_every_generations`` and when it stops, so a
restart by the supervisor, or a rerun with the same run directory, resumes; steps and wall time
to the target are counted over the whole run (``progress.csv`` carries them across segments).
A stop from outside (Ctrl-C, SIGTERM) reaches it first, while the evaluators still serve: it
finishes its generation, saves and writes the summary within the launcher's grace period.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import numpy as np

import jaxdist as jd
from jaxdist.agents.es.config import ESConfig
from jaxdist.launch import context
from jaxdist.metrics import MetricsWriter, metrics_path, read_metrics
from jaxdist.metrics_tensorboard import TensorBoardWriter
from jaxdist.plotting import line_plot

ALREADY_FINISHED = "the run had already finished"
SUMMARY = "summary.json"
STOPPED = "the program was stopped"


class Master:
    """``Master(evaluators, config, start_time)``: see the module docstring; ``run()`` is the
    run, ``get_params`` and ``status`` are served to the evaluators and the launching process."""

    def __init__(self, evaluators: list[Any], config: ESConfig, start_time: float | None = None) -> None:
        from jaxdist.agents.es.search import Rollouts, Search  # JAX, imported where the node runs
        from jaxdist.checkpoint import checkpoint_dir

        node = jd.current_node()
        if node is None:
            raise RuntimeError("the ES master runs as a node of a launched program: see es.make_program")
        # Stopped first (a node option), it ends by itself: the generation in flight, a
        # checkpoint, the summary. Interrupted, it would leave the summary unwritten.
        context.finish_on_stop()
        self._run_dir = node.run_dir
        self._config = config
        self._start = time.time() if start_time is None else start_time
        self._rollouts = Rollouts(config)
        self._search = Search(config, self._rollouts.policy, checkpoint_dir(self._run_dir, node.node_name))
        self._pool = jd.Pool(evaluators, task_timeout=config.task_timeout, backup_after=config.backup_after,
                             unavailable_timeout=config.unavailable_timeout)
        self._lock = threading.Lock()
        self._published: tuple[int, np.ndarray] = (-1, np.zeros(0, np.float32))
        self._status: dict[str, Any] = {"generation": self._search.generation, "env_steps": self._search.env_steps,
                                        "restored_generation": self._search.restored_generation}
        self._curve: list[tuple[int, float]] = []
        self._earlier_seconds = 0.0  # wall time of the run's earlier segments (a resumed run)
        self._solved_at: tuple[float, int] | None = None  # (run seconds, env steps), over the whole run
        self._first_generation: tuple[float, int] | None = None  # (time.time(), env steps) after it

    def get_params(self, generation: int) -> np.ndarray:
        """The mean parameters of ``generation``, the one being evaluated."""
        with self._lock:
            published, theta = self._published
        if generation != published:
            raise LookupError(f"the master is evaluating generation {published}, not {generation}")
        return theta

    def status(self) -> dict[str, Any]:
        """Where the run is: generation, env steps, returns, pool counts."""
        with self._lock:
            return dict(self._status)

    def run(self) -> None:
        config, search = self._config, self._search
        if search.env_steps >= config.total_steps:
            print(f"the checkpoint is at {search.env_steps:,} env steps, past total_steps={config.total_steps:,}; "
                  f"nothing to do", flush=True)
            self._mark_already_finished()
            search.close()
            jd.stop()
            return
        if search.restored_generation:
            self._resume_clock()
            print(f"resumed from generation {search.generation} ({search.env_steps:,} env steps, "
                  f"{self._earlier_seconds:.1f} s of earlier segments)", flush=True)
        progress = MetricsWriter(metrics_path(self._run_dir, "progress"), purge_after_step=search.env_steps)
        board = TensorBoardWriter(os.path.join(self._run_dir, "tensorboard", "progress"), purge_step=search.env_steps)
        try:
            reason = self._train(progress, board)
        finally:
            search.save()
            search.close()
            progress.close()
            board.close()
            self._pool.close()
        if reason == STOPPED:  # a stop's grace is too short for the final score: the last one stands
            self._write_summary(reason, self._curve[-1][1] if self._curve else None, self._config.eval_episodes)
        else:
            final = self._rollouts.gymnasium_returns(search.theta, self._config.final_episodes,
                                                     seed=self._gymnasium_seed(final=True))
            self._write_summary(reason, float(final.mean()), self._config.final_episodes)
        jd.stop()  # the evaluators have no work of their own: the program, on every host, is over

    def _train(self, progress: MetricsWriter, board: TensorBoardWriter) -> str:
        config, search = self._config, self._search
        while True:
            if jd.stop_requested():
                return STOPPED
            row = self._generation()
            progress.write(search.env_steps, row)
            board.write(search.env_steps, {f"progress/{key}": value for key, value in row.items()})
            if search.env_steps >= config.total_steps:
                return f"trained for {config.total_steps:,} env steps"
            if config.stop_at_target and self._solved_at is not None:
                return f"the mean return reached {config.target_return:g}"

    def _generation(self) -> dict[str, Any]:
        """One generation: evaluate, step, score; returns its progress row."""
        search, started = self._search, time.time()
        seeds, fitness, steps = self._evaluate_population()
        grad_norm = search.step(seeds, fitness, steps)
        mean_return = self._rollouts.mean_policy_return(search.theta, search.generation)
        if self._first_generation is None:
            self._first_generation = (time.time(), search.env_steps)
        if self._solved_at is None and mean_return >= self._config.target_return:
            self._confirm_on_gymnasium(mean_return)
        self._curve.append((search.env_steps, mean_return))
        stats, now = self._pool.stats(), time.time()
        row = {"elapsed": now - self._start, "run_seconds": self._run_seconds(now),
               "solved": int(self._solved_at is not None), "env_steps_per_second": steps / max(now - started, 1e-9),
               "episode_return": mean_return, "generation": search.generation,
               "population_return": float(fitness.mean()), "population_best": float(fitness.max()),
               "grad_norm": grad_norm, "requeued": stats.requeued, "backups": stats.backups,
               "evaluators_lost": stats.lost, "evaluators_live": stats.live}
        with self._lock:
            self._status.update(row, env_steps=search.env_steps, solved=self._solved_at is not None)
        return row

    def _evaluate_population(self) -> tuple[np.ndarray, np.ndarray, int]:
        """Publish the mean, map the generation's seeds over the evaluators: (seeds, fitness
        ``[pairs, 2]``, env steps)."""
        config, search = self._config, self._search
        with self._lock:
            self._published = (search.generation, np.asarray(search.theta))
        seeds = search.seeds()
        tasks = [{"generation": search.generation, "seeds": seeds[i:i + config.pairs_per_task]}
                 for i in range(0, len(seeds), config.pairs_per_task)]
        results = self._pool.map("evaluate", tasks)
        fitness = np.concatenate([np.asarray(result["fitness"]) for result in results])
        return seeds, fitness, sum(int(result["steps"]) for result in results)

    def _confirm_on_gymnasium(self, mean_return: float) -> None:
        """The target counts when gymnasium's env agrees: a 20-episode score that just crossed
        is biased upwards (it was picked for crossing), a fresh one is not."""
        confirmed = self._rollouts.gymnasium_returns(self._search.theta, self._config.eval_episodes,
                                                     seed=self._gymnasium_seed()).mean()
        print(f"generation {self._search.generation}: mean return {mean_return:.1f} on the JAX env, "
              f"{confirmed:.1f} on gymnasium's", flush=True)
        if confirmed >= self._config.target_return:
            self._solved_at = (self._run_seconds(time.time()), self._search.env_steps)

    def _run_seconds(self, now: float) -> float:
        """Wall time over the whole run: earlier segments' and this one's, start-up included."""
        return self._earlier_seconds + now - self._start

    def _resume_clock(self) -> None:
        """The earlier segments' wall time and the target's crossing, from ``progress.csv``'s rows
        up to the restored generation (rows past it, of a cut-short segment, are not the run's).
        Rows written since this segment's clock started (by a master the supervisor restarted)
        are on this segment's clock already."""
        try:
            rows = [row for row in read_metrics(metrics_path(self._run_dir, "progress"))
                    if row["step"] <= self._search.env_steps]
        except OSError:
            return
        earlier = [row for row in rows if row["wall_time"] < self._start]
        if earlier:
            last = earlier[-1]
            self._earlier_seconds = float(last["elapsed"] if last.get("run_seconds") is None else last["run_seconds"])
        solved = next((row for row in rows if row.get("solved")), None)
        if solved is not None:
            self._solved_at = (float(solved["run_seconds"]), int(solved["step"]))

    def _gymnasium_seed(self, final: bool = False) -> int:
        """Fresh start states for each generation's check, and others for the final score, which
        no decision looked at (the check that stopped a run is biased by having passed)."""
        config = self._config
        return 10_000_000 * (2 * config.seed + 1 + final) + self._search.generation * config.eval_episodes

    def _write_summary(self, reason: str, final_return: float | None, final_episodes: int) -> None:
        config, search, stats = self._config, self._search, self._pool.stats()
        now = time.time()
        steady = None
        if self._first_generation is not None and now > self._first_generation[0]:
            steady = round((search.env_steps - self._first_generation[1]) / (now - self._first_generation[0]))
        summary = {
            "seed": config.seed, "env_id": config.env_id, "target_return": config.target_return,
            "wall_time_to_target": None if self._solved_at is None else round(self._solved_at[0], 2),
            "steps_to_target": None if self._solved_at is None else self._solved_at[1],
            "env_steps": search.env_steps, "wall_time": round(self._run_seconds(now), 2),
            "steps_per_second": steady,
            "first_update_at": (None if self._first_generation is None
                                else round(self._first_generation[0] - self._start, 2)),
            "final_return": final_return, "final_return_episodes": final_episodes,
            "final_return_jax": self._curve[-1][1] if self._curve else None,
            "generations": search.generation, "restored_generation": search.restored_generation,
            "requeued": stats.requeued, "backups": stats.backups, "evaluators_lost": stats.lost,
            "stop_reason": reason,
        }
        with open(os.path.join(self._run_dir, SUMMARY), "w") as f:
            json.dump(summary, f, indent=2)
        self._plot_curve()

    def _mark_already_finished(self) -> None:
        """The earlier run's summary stays, with this stop reason (the launcher prints a hint)."""
        path = os.path.join(self._run_dir, SUMMARY)
        try:
            with open(path) as f:
                summary = json.load(f)
        except (OSError, ValueError):
            summary = {"seed": self._config.seed, "env_id": self._config.env_id,
                       "target_return": self._config.target_return, "wall_time_to_target": None,
                       "steps_to_target": None, "env_steps": self._search.env_steps,
                       "wall_time": round(self._run_seconds(time.time()), 2), "steps_per_second": None,
                       "final_return": None, "generations": self._search.generation}
        summary["stop_reason"] = ALREADY_FINISHED
        with open(path, "w") as f:
            json.dump(summary, f, indent=2)

    def _plot_curve(self) -> None:
        """The mean policy's return by env steps, over the whole ``progress.csv`` (every segment)."""
        try:
            rows = read_metrics(metrics_path(self._run_dir, "progress"))
        except OSError:
            return
        if len(rows) < 2:
            return
        target = self._config.target_return
        line_plot(os.path.join(self._run_dir, "learning_curve.png"),
                  {"mean policy": ([row["step"] for row in rows], [row["episode_return"] for row in rows])},
                  title=f"ES {self._config.env_id}", xlabel="env steps", ylabel="episode return", log2_x=False,
                  hlines={f"target {target:g}": target})
