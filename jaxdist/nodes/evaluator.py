"""The evaluator node: the deterministic policy's return on fresh episodes, every few updates.

Training returns (those of the actors' exploring policies) say little about the policy being
learned: an epsilon-greedy or sampling actor scores below its greedy self, and its episodes mix
several parameter versions. The evaluator waits for each ``every_updates``-th version the
learner publishes, plays one episode in each of its ``num_envs`` envs (seeded afresh for every
evaluation, never the actors' seeds), and appends the mean return to
``<run_dir>/evaluations.csv`` (by learner version, flushed at once): the number the progress
line, the metrics and the target report. A file, not a served method, so that the evaluation
that ends the program is read after the program has gone: with ``stop_at_target`` the
evaluator ends the program (``jd.stop()``) at the first evaluation that reaches
``target_return``, or, with ``finish_learner`` (``params`` is the learner itself), has the
learner finish there (``Learner.finish()``) and ends the program once it has evaluated the
version the learner finished at: the policy it saved.

Given the learner's ``final_version`` (its ``max_steps``), the evaluator also evaluates that
version, whatever the interval, and then ends the program itself (with ``ends_program``; a PBT
member's evaluator leaves that to the population's coordinator): the learner leaves the end to
it, so the policy training ends with -- the one ``load_policy`` restores -- is always the last
one evaluated. An evaluation cut short by a stop (Ctrl-C, a preemption) is not recorded: its
unfinished episodes would read as a low return.
"""

from __future__ import annotations

import contextvars
import queue
import threading
import time
from typing import Any

import numpy as np

from jaxdist import courier
from jaxdist.launch import context
from jaxdist.records.metrics import MetricsWriter, metrics_path, read_metrics
from jaxdist.nodes.actor import Policy, jitted_step

EVALUATIONS = "evaluations"
"""``<run_dir>/evaluations.csv``: step (the learner version), mean_return, min_return, ..."""

BEST_POLICY = "best_policy"
"""``<run_dir>/checkpoints/best_policy/<version>``: the parameters of the best evaluation so far."""


def recorded_evaluations(run_dir: str) -> list[dict[str, Any]]:
    """The rows of ``<run_dir>/evaluations.csv`` that scored a return; none where nothing has
    been evaluated yet (or the file is caught mid-write)."""
    try:
        rows = read_metrics(metrics_path(run_dir, EVALUATIONS))
    except (OSError, ValueError):
        return []
    return [row for row in rows if row.get("mean_return") is not None]


def record(writer: MetricsWriter, version: int, returns: np.ndarray, target_return: float | None,
           stop_at_target: bool, env_steps: int | None = None, version_time: float | None = None) -> bool:
    """Appends one evaluation's row to ``evaluations.csv`` (flushed: the monitor reads it at
    once) and says it: whether it reached ``target_return``, and then, with ``stop_at_target``,
    it has stopped the program. ``returns`` of several seeds (``(seeds, episodes)``) also give
    each seed's mean, ``seed/<i>/mean_return``. ``version_time``: when the evaluated version
    was fetched (a ``time.time()``), where that was well before the row is written: the env
    steps of a policy are those made by then, not while it was evaluated. ``env_steps``: those
    behind the version, where the node that records knows them (ES's master, an Anakin learner)."""
    returns = np.asarray(returns, np.float64)  # a float32 mean would be written as 47.70000076293945
    mean = float(np.mean(returns))
    row = {"mean_return": mean, "min_return": float(np.min(returns)), "max_return": float(np.max(returns)),
           "episodes": returns.shape[-1]}
    if version_time is not None:
        row["version_time"] = version_time
    if env_steps is not None:
        row["env_steps"] = env_steps
    if returns.ndim == 2 and len(returns) > 1:
        row.update({f"seed/{i}/mean_return": float(np.mean(seed)) for i, seed in enumerate(returns)})
    writer.write(version, row)
    writer.flush()
    print(f"evaluation of version {version}: mean return {mean:.1f} over {returns.size} episodes", flush=True)
    reached = target_return is not None and mean >= target_return
    if reached and stop_at_target:
        print(f"the evaluation return {mean:.1f} reached the target {target_return:g}: stopping", flush=True)
        context.stop(f"the evaluation of version {version} reached the target {target_return:g}")
    return reached


class Evaluator:
    def __init__(self, policy: Policy, env: Any, params: Any, *, every_updates: int, seed: int,
                 target_return: float | None = None, stop_at_target: bool = False,
                 final_version: int | None = None, finish_learner: bool = False, save_best: bool = False,
                 rng_impl: str | None = "unsafe_rbg", run_dir: str | None = None, ends_program: bool = True) -> None:
        self._env = env.make(seed)
        self._params = params
        self._every = every_updates
        self._seed = seed
        self._target, self._stop_at_target = target_return, stop_at_target
        self._final_version = final_version
        self._finish_learner = finish_learner
        self._step = jitted_step(policy, rng_impl)
        from jaxdist.envs.jax_rollout import recurrent

        self._initial_state = policy.initial_state if recurrent(policy) else None  # a recurrent policy's, per env
        self._jax_episodes = (_jitted_episodes(policy, self._env.env, self._env.num_envs, rng_impl)
                              if self._env.backend == "jax" else None)
        # Made at the first evaluation, not here: beside a learner spanning hosts, no JAX
        # computation may start the backend before that learner's jax.distributed.initialize().
        self._key, self._rng_impl = None, rng_impl
        self._ends_program = ends_program  # else it returns after the final version (a PBT member's)
        node = context.current_node()
        run_dir = run_dir or (node.run_dir if node else ".")
        self._writer = MetricsWriter(metrics_path(run_dir, EVALUATIONS))
        self._evaluations = 0
        self._best = BestPolicy(run_dir) if save_best else None

    def run(self) -> None:
        wanted = 0
        while not context.stop_requested():
            version, params = self._fetch(wanted)
            if params is None:
                continue
            fetched = time.time()
            returns = self.evaluate(params, episode_seed=self._seed + self._evaluations * self._env.num_envs)
            if returns is None:
                return  # the program is stopping
            self._evaluations += 1
            if self._best is not None:
                self._best.offer(version, params, returns)
            stop_here = self._stop_at_target and not self._finish_learner
            at_target = record(self._writer, version, returns, self._target, stop_here, version_time=fetched) and self._stop_at_target
            if at_target and stop_here:
                return
            if at_target and not self._last(version) and not self._finish_training(version):
                return  # the learner could not finish: the program stops
            if self._last(version):
                print(f"version {version} was the learner's last: training is over", flush=True)
                if self._ends_program:
                    context.stop(f"training is over: its final policy, version {version}, was evaluated")
                return
            wanted = self._final_version if at_target else (version // self._every + 1) * self._every
            if self._final_version is not None:
                wanted = min(wanted, self._final_version)

    def _last(self, version: int) -> bool:
        return self._final_version is not None and version >= self._final_version

    def evaluate(self, params: Any, episode_seed: int) -> np.ndarray | None:
        """One episode in each env, seeded from ``episode_seed``: their returns (None when the
        program stopped before every episode ended)."""
        import jax

        if self._key is None:
            self._key = jax.random.key_data(jax.random.key(self._seed, impl=self._rng_impl))
        if self._jax_episodes is not None:
            self._key, returns = self._jax_episodes(params, jax.random.key(episode_seed), self._key)
            return np.asarray(returns, np.float64)
        env = self._env
        env.seed = episode_seed
        timestep = env.reset()
        returns = np.zeros(env.num_envs, np.float64)
        finished = np.zeros(env.num_envs, bool)
        device_params = jax.device_put(params)
        key = self._key
        core = None if self._initial_state is None else self._initial_state(env.num_envs)
        while not finished.all() and not context.stop_requested():
            if core is None:
                key, action, _ = self._step(device_params, timestep.obs, key)
            else:
                key, action, _, core = self._step(device_params, timestep.obs, key, core, timestep.first)
            timestep = env.step(np.asarray(action))
            returns += np.where(finished, 0.0, timestep.reward)
            finished |= timestep.terminated | timestep.truncated
        self._key = key
        return returns if finished.all() else None

    def _finish_training(self, version: int) -> bool:
        """At the target: the learner ends training now, at the version it says (the final
        version, evaluated next); a learner that is away (restarting) cannot, and then the
        program stops here (False)."""
        try:
            self._final_version = int(self._params.finish(f"the evaluation of version {version} reached the target"))
        except (courier.CourierError, ConnectionError, TimeoutError) as error:
            print(f"the learner could not finish ({type(error).__name__}): stopping", flush=True)
            context.stop(f"at the target, the learner could not finish ({type(error).__name__})")
            return False
        print(f"the learner finished at version {self._final_version}, which is evaluated last", flush=True)
        return True

    def _fetch(self, wanted: int) -> tuple[int, Any]:
        """The learner's parameters once it has published version ``wanted`` or later."""
        try:
            reply = self._params.get(wanted - 1, wait=1.0)
        except (courier.CourierError, ConnectionError, TimeoutError):
            context.wait_for_stop(0.5)  # the learner is away (restarting, or done)
            return -1, None
        return reply["version"], reply["params"]

    def close(self) -> None:
        self._writer.close()
        self._env.close()
        if self._best is not None:
            self._best.close()


class BestPolicy:
    """The parameters of the best evaluation so far, saved (Orbax) under ``BEST_POLICY`` as its
    learner version, for ``load_policy(run_dir, best=True)``: the learner's own checkpoints hold
    where training ended, which can score below an earlier policy (after ``stop_at_target``
    it often does). Each save carries its return, so a restarted or resumed evaluator replaces
    the saved policy only with a better one. A learner restored from its checkpoint republishes
    versions already evaluated, with other parameters: a better one replaces the saved version."""

    def __init__(self, run_dir: str) -> None:
        from jaxdist.learning.checkpoint import Checkpointer
        from jaxdist.learning.layout import checkpoint_dir

        self._checkpointer = Checkpointer(checkpoint_dir(run_dir, BEST_POLICY), keep=1)
        self._best = self._saved_return(run_dir)

    def _saved_return(self, run_dir: str) -> float:
        """The saved policy's return; for one saved without it (an older jaxdist), the best of
        ``evaluations.csv``."""
        saved = self._checkpointer.latest_step()
        if saved is None:
            return -np.inf
        recorded = self._checkpointer.metadata(saved).get("mean_return")
        if recorded is not None:
            return float(recorded)
        return max((row["mean_return"] for row in recorded_evaluations(run_dir)), default=-np.inf)

    def offer(self, version: int, params: Any, returns: np.ndarray) -> None:
        mean = float(np.mean(returns))
        if mean > self._best:
            self._checkpointer.save(version, params, metadata={"mean_return": mean}, replace=True)
            self._best = mean

    def close(self) -> None:
        self._checkpointer.close()


def _jitted_episodes(policy: Policy, env: Any, num_envs: int, rng_impl: str | None) -> Any:
    """The JAX backend's evaluation, ``(params, reset_key, key_data) -> (key_data, returns)``:
    every env's whole episode in one jitted call on the env's port (checked step for step
    against gymnasium's env) instead of a dispatch and a gymnasium step per step."""
    import jax

    from jaxdist.envs.jax_rollout import episodes

    def play(params: Any, reset_key: jax.Array, key_data: jax.Array) -> tuple[jax.Array, jax.Array]:
        key, act_key = jax.random.split(jax.random.wrap_key_data(key_data, impl=rng_impl))
        returns, _ = episodes(policy, env, params, jax.random.split(reset_key, num_envs), act_key)
        return jax.random.key_data(key), returns

    return jax.jit(play)


class EvaluationRecorder:
    """The evaluator of a learner that evaluates inside its update (Anakin,
    :mod:`jaxdist.learning.anakin`), as its ``after_update``: each dispatch's ``eval_returns``
    (NaN where no evaluation ran), written on a thread of its own to ``evaluations.csv`` as the
    evaluator node writes them (per-seed means beside the overall one), with the env steps the
    learner had played by that version (``version x`` its update's ``env_steps``: exact, where an
    evaluator node's rows are placed by the monitor); with ``stop_at_target`` the first
    evaluation whose mean reaches ``target_return`` stops the program. ``flush()`` returns once
    what it was handed is written: the learner calls it before it ends the program."""

    def __init__(self, run_dir: str, target_return: float | None, stop_at_target: bool) -> None:
        self._writer = MetricsWriter(metrics_path(run_dir, EVALUATIONS))
        self._target, self._stop_at_target = target_return, stop_at_target
        self._pending: queue.SimpleQueue = queue.SimpleQueue()
        run_in_node = contextvars.copy_context().run  # jd.stop() names this node
        self._thread = threading.Thread(target=run_in_node, args=(self._write,), name="anakin-evaluations",
                                        daemon=True)
        self._thread.start()

    def __call__(self, batch: Any, metrics: dict[str, Any]) -> dict[str, Any]:
        """Take the evaluations (and the versions they are of) out of ``metrics``: they go to
        ``evaluations.csv``, not to the learner's ``metrics.csv`` beside its own step."""
        from jaxdist.learning import parallel

        metrics = dict(metrics)
        evaluated = (metrics.pop("version"), metrics.pop("eval_returns"), metrics["env_steps"])
        if parallel.is_primary():  # a learner spanning hosts: one of its processes writes
            self._pending.put(evaluated)
        return metrics

    def flush(self) -> None:
        written = threading.Event()
        self._pending.put(written)
        while not written.wait(0.1) and self._thread.is_alive():
            pass  # a writer that failed writes nothing more

    def _write(self) -> None:
        """Every evaluation handed over, those after the target too: the updates between the stop
        and the learner's end evaluate as well, and the state keeps their best for ``load_policy``."""
        stopped = False
        while True:
            handed = self._pending.get()
            if isinstance(handed, threading.Event):  # a flush: all before it is written
                handed.set()
                continue
            import jax

            versions, returns, steps = jax.device_get(handed)
            versions, steps = np.atleast_1d(versions), np.atleast_1d(steps)
            returns = returns.reshape(-1, *returns.shape[-2:])
            for version, seeds, per_update in zip(versions, returns, steps):  # a dispatch of several updates: each
                if not np.isnan(seeds).all():
                    stop_here = self._stop_at_target and not stopped
                    stopped |= record(self._writer, int(version), seeds, self._target, stop_here,
                                      int(version) * int(per_update)) and stop_here
