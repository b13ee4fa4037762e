"""Population-based training (Jaderberg et al., 2017, "Population Based Training of Neural
Networks") as pure functions over a population's stacked state: members on a leading axis, each
with its hyperparameters (field -> one value a member), ranked by a score (their evaluation return).

**Exploit** (truncation selection): the bottom ``fraction`` of the members, by score, each copy a
member drawn uniformly from the top ``fraction``: its whole learner state (parameters, optimizer
state, statistics) and its hyperparameters. **Explore**: a member that copied perturbs each copied
hyperparameter (times 0.8 or 1.2, kept inside the field's range) or draws it anew from the range.
Every function is jittable: under Anakin the step runs inside the learner's update.

:class:`Lineage` writes each step's parents and hyperparameters to ``lineage.csv`` (the Anakin
learner's), as :func:`write_lineage` does for every PBT; under Sebulba the members are learners of
their own and :mod:`jaxdist.learning.population` takes the step there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist.learning.layout import LINEAGE
from jaxdist.records.metrics import MetricsWriter, metrics_path

PyTree = Any
PERTURB_FACTORS = (0.8, 1.2)


@dataclasses.dataclass(frozen=True)
class Range:
    """Where a hyperparameter may go: ``[low, high]`` (log-uniform draws with ``log``), or, when
    ``values`` are listed, among them (perturbations stay in ``[min, max]`` of them)."""

    low: float
    high: float
    log: bool = False
    values: tuple[float, ...] = ()


def truncation(key: jax.Array, scores: jax.Array, fraction: float) -> jax.Array:
    """Each member's parent: itself, or for the bottom ``fraction`` (at least one), a member of
    the top ``fraction`` drawn uniformly. A NaN score ranks last."""
    size = scores.shape[0]
    count = max(1, int(size * fraction))
    order = jnp.argsort(-jnp.nan_to_num(scores, nan=-jnp.inf))  # best first
    chosen = order[:count][jax.random.randint(key, (count,), 0, count)]
    return jnp.arange(size).at[order[size - count:]].set(chosen)


def perturb(key: jax.Array, values: jax.Array, where: Range) -> jax.Array:
    """Each value times 0.8 or 1.2 (drawn per value), clipped to the range."""
    factors = jnp.asarray(PERTURB_FACTORS, values.dtype)[jax.random.randint(key, values.shape, 0, 2)]
    return jnp.clip(values * factors, where.low, where.high)


def resample(key: jax.Array, values: jax.Array, where: Range) -> jax.Array:
    """Fresh draws from the range (uniform, log-uniform, or among its listed values)."""
    if where.values:
        return jnp.asarray(where.values, values.dtype)[jax.random.randint(key, values.shape, 0, len(where.values))]
    if where.log:
        return jnp.exp(jax.random.uniform(key, values.shape, values.dtype, np.log(where.low), np.log(where.high)))
    return jax.random.uniform(key, values.shape, values.dtype, where.low, where.high)


EXPLORERS = {"perturb": perturb, "resample": resample}


def explore(key: jax.Array, hyperparams: Mapping[str, jax.Array], copied: jax.Array, ranges: Mapping[str, Range],
            rule: str) -> dict[str, jax.Array]:
    """The hyperparameters after exploring: changed by ``rule`` where a member ``copied``."""
    keys = jax.random.split(key, len(ranges))
    return {name: jnp.where(copied, EXPLORERS[rule](k, hyperparams[name], ranges[name]), hyperparams[name])
            for k, name in zip(keys, sorted(ranges))}


def exploit_and_explore(key: jax.Array, scores: jax.Array, state: PyTree, hyperparams: Mapping[str, jax.Array], *,
                        fraction: float, rule: str,
                        ranges: Mapping[str, Range]) -> tuple[PyTree, dict[str, jax.Array], jax.Array]:
    """One PBT step over a population on the leading axis: ``(state, hyperparams, parents)``."""
    exploit_key, explore_key = jax.random.split(key)
    parents = truncation(exploit_key, scores, fraction)
    state = jax.tree.map(lambda leaf: leaf[parents], state)
    copied = parents != jnp.arange(scores.shape[0])
    inherited = {name: values[parents] for name, values in hyperparams.items()}
    return state, explore(explore_key, inherited, copied, ranges, rule), parents


class Lineage:
    """The learner's ``after_update`` under PBT, before ``then`` (the evaluations' recorder): takes
    ``pbt/parent`` and ``pbt/<field>`` out of the metrics and writes, at the first update and at
    each exploit step, a row per member to ``lineage.csv``: ``step``, ``member``, ``parent`` (itself
    where it kept its state) and its hyperparameters."""

    def __init__(self, run_dir: str, interval: int, then: Any) -> None:
        self._writer = MetricsWriter(metrics_path(run_dir, LINEAGE))
        self._interval, self._then = interval, then
        self._written = False

    def __call__(self, batch: Any, metrics: dict[str, Any]) -> dict[str, Any]:
        from jaxdist.learning import parallel

        metrics = dict(metrics)
        taken = {name: metrics.pop(name) for name in [name for name in metrics if name.startswith("pbt/")]}
        if parallel.is_primary():
            self._write(jax.device_get(metrics["version"]), jax.device_get(taken))
        return self._then(batch, metrics)

    def _write(self, versions: Any, taken: dict[str, np.ndarray]) -> None:
        versions = np.atleast_1d(versions)
        per_update = {name: np.reshape(value, (len(versions), -1)) for name, value in taken.items()}
        fields = sorted(name.removeprefix("pbt/") for name in taken if name != "pbt/parent")
        for row, version in enumerate(versions):
            if self._written and version % self._interval:
                continue
            self._written = True
            write_lineage(self._writer, int(version), per_update["pbt/parent"][row],
                          {field: per_update[f"pbt/{field}"][row] for field in fields})
        self._writer.flush()

    def flush(self) -> None:
        self._then.flush()


def write_lineage(writer: MetricsWriter, step: int, parents: Any, hyperparams: Mapping[str, Any]) -> None:
    """``lineage.csv``'s rows of one step: each member's parent and hyperparameters after it."""
    for member, parent in enumerate(parents):
        writer.write(step, {"member": member, "parent": int(parent),
                            **{field: float(values[member]) for field, values in sorted(hyperparams.items())}})
