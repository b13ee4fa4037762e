"""Population-based training across learners (Sebulba's): each member is a learner of its own,
with its actors and evaluator, and the exploit goes through the members' checkpoints, so it
works wherever the launcher puts them, as long as they share the run directory.

Every ``interval`` updates a member (:class:`Member`, its learner's ``population`` part) commits
its checkpoint of the step and asks the :class:`Coordinator` what to do. Once every member has
asked and every member's evaluator has evaluated that version, the coordinator ranks them by
that evaluation's return and takes the PBT step of :mod:`jaxdist.learning.pbt` (the exploit and
explore rules the Anakin learner takes in its update): a member that copies restores its
parent's checkpoint of the step, parameters, optimizer state and all, and trains on with the
hyperparameters explored from the parent's. The hyperparameters are traced values of the
learner's state (:func:`member_logic`), so a copy costs no compilation.

The coordinator writes each round to ``lineage.csv`` (:func:`pbt.write_lineage`) and the
members' returns to the run's ``evaluations.csv`` (``seed/<member>/mean_return``, as an Anakin
population's), and reads its decisions back from ``lineage.csv`` when it restarts. A member
restarted from a checkpoint of an earlier round asks again and is told the same: a crash loses
no copy, and the member rejoins the round the others wait in. Training ends once every
member's final version is evaluated: the coordinator then stops the program.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist import courier
from jaxdist.launch import context
from jaxdist.learning import parallel, pbt
from jaxdist.learning.layout import LINEAGE
from jaxdist.learning.learner_logic import LearnerLogic, PyTree
from jaxdist.nodes.evaluator import EVALUATIONS, recorded_evaluations
from jaxdist.nodes.learner.steps import crossed
from jaxdist.records.metrics import MetricsWriter, metrics_path, read_metrics

POLL_SECONDS = 0.1  # how often a member waiting in a round asks again


def evaluated(run_dirs: Sequence[str], step: int) -> np.ndarray | None:
    """Each run's evaluation return of version ``step`` (its latest), if every run has one."""
    scores = []
    for directory in run_dirs:
        rows = [row["mean_return"] for row in recorded_evaluations(directory) if row["step"] == step]
        if not rows:
            return None
        scores.append(rows[-1])
    return np.asarray(scores, np.float32)


class Finish:
    """Ends a program of several runs (in ``run_dirs``) once each has evaluated its final version
    ``final_step``, having handed their returns to ``then``: their evaluators leave the end to it."""

    def __init__(self, run_dirs: Sequence[str], final_step: int,
                 then: Callable[[int, np.ndarray], None] | None = None) -> None:
        self._dirs, self._final_step, self._then = list(run_dirs), final_step, then

    def run(self) -> None:
        while not context.wait_for_stop(0.5):
            returns = evaluated(self._dirs, self._final_step)
            if returns is not None:
                if self._then is not None:
                    self._then(self._final_step, returns)
                context.stop(f"training is over: every run's final policy (version {self._final_step}) was evaluated")
                return


def member_logic(logic_of: Callable[[Mapping[str, Any]], LearnerLogic], values: Mapping[str, float]) -> LearnerLogic:
    """A member's logic: the agent's ``logic_of(hyperparameters)``, with ``values`` kept in the
    state (``{"agent", "hyperparams"}``) and passed to it traced in the update, so a member's
    checkpoint carries them and a copy or an explore changes them without a compilation."""
    fixed = logic_of(values)  # for init and params, which do not read the hyperparameters

    def init(rng: jax.Array) -> PyTree:
        return {"agent": fixed.init(rng), "hyperparams": {name: jnp.float32(value) for name, value in values.items()}}

    def update(state: PyTree, batch: PyTree, rng: jax.Array) -> tuple[PyTree, PyTree]:
        agent, metrics = logic_of(state["hyperparams"]).update(state["agent"], batch, rng)
        return {"agent": agent, "hyperparams": state["hyperparams"]}, metrics

    return LearnerLogic(init, update, lambda state: fixed.params(state["agent"]))


class Member:
    """A member's learner part (``Learner(..., population=Member(...))``): member ``index`` of
    a population whose members save their checkpoints in ``checkpoints`` (one directory each)."""

    def __init__(self, coordinator: Any, index: int, interval: int, checkpoints: Sequence[str]) -> None:
        self._coordinator, self._index = coordinator, index
        self._interval, self._checkpoints = interval, list(checkpoints)

    def due(self, before: int, step: int) -> bool:
        return crossed(before, step, self._interval)

    def exploit(self, step: int) -> tuple[str, Callable[[PyTree], PyTree]] | None:
        """Wait for the round of ``step``: None to train on as it is (or when the program stops
        first), else the parent's checkpoint directory and the change of its state (the
        explored hyperparameters)."""
        while not (context.stop_requested() or parallel.preemption_requested(step)):
            try:
                decided = self._coordinator.decision(self._index, step)
            except (courier.CourierError, ConnectionError, TimeoutError):
                decided = None  # the coordinator is away (restarting): ask again
            if decided is not None:
                break
            context.wait_for_stop(POLL_SECONDS)
        else:
            return None
        parent = decided["parent"]
        if parent == self._index:
            return None
        print(f"PBT at update {step}: member {self._index} copies member {parent}, then trains with "
              f"{decided['hyperparams']}", flush=True)
        values = {name: jnp.float32(value) for name, value in decided["hyperparams"].items()}
        return self._checkpoints[parent], lambda state: {**state, "hyperparams": values}


class Coordinator:
    """The population's rounds (a courier node): ``decision(member, step)`` answers a member
    once the round of ``step`` is decided; ``run()`` ends the program when every member's final
    version (``final_step``) is evaluated. ``initial``: each member's drawn hyperparameters;
    ``member_dirs``: each member's run directory (its evaluator's ``evaluations.csv``)."""

    def __init__(self, run_dir: str, member_dirs: Sequence[str], initial: Sequence[Mapping[str, float]], *,
                 final_step: int, fraction: float, rule: str, ranges: Mapping[str, pbt.Range], exploit: bool,
                 seed: int) -> None:
        self._dirs, self._size = list(member_dirs), len(member_dirs)
        self._final_step, self._exploit = final_step, exploit
        self._step = jax.jit(functools.partial(pbt.exploit_and_explore, fraction=fraction, rule=rule, ranges=ranges))
        self._key = jax.random.key(seed)
        self._lock = threading.Lock()
        self._asked: dict[int, set[int]] = {}  # step -> the members waiting in its round
        self._decided = self._read_decisions(metrics_path(run_dir, LINEAGE))
        self._lineage = MetricsWriter(metrics_path(run_dir, LINEAGE))
        self._evaluations = MetricsWriter(metrics_path(run_dir, EVALUATIONS))
        if not self._decided:  # the drawn population, as step 0
            self._decided[0] = [{"parent": member, "hyperparams": dict(values)}
                                for member, values in enumerate(initial)]
            self._write_lineage(0)

    def decision(self, member: int, step: int) -> dict[str, Any] | None:
        """``{"parent", "hyperparams"}`` of ``member`` after the round of ``step``, or None while
        other members have not reached it or their evaluations of it are not recorded yet."""
        with self._lock:
            if step not in self._decided:
                waiting = self._asked.setdefault(step, set())
                waiting.add(member)
                scores = evaluated(self._dirs, step) if len(waiting) == self._size else None
                if scores is None:
                    return None
                self._decide(step, scores)
            return self._decided[step][member]

    def run(self) -> None:
        Finish(self._dirs, self._final_step, self._record).run()

    def close(self) -> None:
        self._lineage.close()
        self._evaluations.close()

    def _decide(self, step: int, scores: np.ndarray) -> None:
        latest = self._decided[max(self._decided)]
        fields = sorted(latest[0]["hyperparams"])
        values = {field: jnp.asarray([member["hyperparams"][field] for member in latest], jnp.float32)
                  for field in fields}
        parents = np.arange(self._size)
        if self._exploit:
            _, values, parents = jax.device_get(self._step(jax.random.fold_in(self._key, step), jnp.asarray(scores),
                                                           {}, values))
        self._decided[step] = [  # a member that kept its state keeps its values exactly
            {"parent": int(parent), "hyperparams": latest[member]["hyperparams"] if parent == member else
             {field: float(values[field][member]) for field in fields}} for member, parent in enumerate(parents)]
        self._write_lineage(step)
        self._record(step, scores)
        self._asked.pop(step, None)

    def _write_lineage(self, step: int) -> None:
        decided = self._decided[step]
        fields = decided[0]["hyperparams"]
        pbt.write_lineage(self._lineage, step, [member["parent"] for member in decided],
                          {field: [member["hyperparams"][field] for member in decided] for field in fields})
        self._lineage.flush()

    def _record(self, step: int, scores: np.ndarray) -> None:
        """The round's returns as an evaluation of the population (each member's as its seed's)."""
        self._evaluations.write(step, {"mean_return": float(np.mean(scores)), "min_return": float(np.min(scores)),
                                       "max_return": float(np.max(scores)),
                                       **{f"seed/{member}/mean_return": float(score)
                                          for member, score in enumerate(scores)}})
        self._evaluations.flush()
        print(f"PBT round at update {step}: returns {', '.join(f'{score:.1f}' for score in scores)}", flush=True)

    def _read_decisions(self, path: str) -> dict[int, list[dict[str, Any]]]:
        """The rounds ``lineage.csv`` holds (a restarted coordinator's): step -> each member's row."""
        try:
            rows = read_metrics(path)
        except (OSError, ValueError):
            return {}
        decided: dict[int, list[dict[str, Any]]] = {}
        for row in rows:
            members = decided.setdefault(int(row["step"]), [None] * self._size)
            members[int(row["member"])] = {"parent": int(row["parent"]), "hyperparams": {
                name: value for name, value in row.items() if name not in ("step", "wall_time", "member", "parent")}}
        return {step: members for step, members in decided.items() if None not in members}

