"""Many configurations of one agent in one run: what ``--sweep``, ``--sweep-random`` and
``--pbt`` expand to, which fields they may name, and the summary that ranks the configurations.

**Specs.** ``--sweep FIELD=V1,V2,...`` (repeatable) lists a field's values; the configurations are
the grid of every list, the first field varying slowest. ``FIELD=LOW:HIGH`` (``:log`` after it
for a log-uniform draw) is a range, drawn from by ``--sweep-random N`` (N configurations, each
field drawn on its own; a list is drawn from uniformly) and by ``--pbt N`` (a population of N,
whose members' fields PBT then explores). Draws are seeded by ``--seed``, so every host and every
relaunch expands the same configurations.

**Runs.** Under Anakin configuration ``c``'s seed ``s`` is run ``c x num_seeds + s`` of one
learner; a seed's runs share their initial parameters and keys across configurations (common
random numbers, and configuration ``c`` trains as it would alone with the same seed and
``num_seeds``). PBT's members are each a configuration of one seed, with keys of their own.
Under Sebulba each configuration is a run of its own in ``<run_dir>/config-<c>`` (:func:`apart`):
a program after the previous one, or, under the ray and multihost launchers, side by side in one
program (:class:`jaxdist.agents.population.Together`); a PBT population is one program whose members are
each a learner with its actors and evaluator, member ``m`` in ``<run_dir>/config-<m>``
(:mod:`jaxdist.agents.population`).

**Fields.** Only the agent's own ``float`` hyperparameters (learning rate, discount, GAE lambda,
clip range, loss coefficients, ...): under Anakin they are traced values of the learner's state,
so every configuration shares one compiled update (the optimizer is rebuilt in the update from
the traced rate, as optax's ``inject_hyperparams`` would hold it); an ``int``, ``bool``, ``str``
or tuple field sets shapes, loop lengths or the program itself, and is refused.

Nothing here imports JAX: the launching process expands and checks sweeps.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import os
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SWEEP_FILE = "sweep.csv"
SWEEP_PLOT = "sweep.png"


@dataclasses.dataclass(frozen=True)
class Spec:
    """One ``--sweep`` entry: a field and its values, or its range (``low``, ``high``, ``log``)."""

    field: str
    values: tuple[float, ...] = ()
    low: float | None = None
    high: float | None = None
    log: bool = False

    @property
    def is_range(self) -> bool:
        return self.low is not None

    def draw(self, rng: np.random.Generator) -> float:
        if not self.is_range:
            return float(self.values[rng.integers(len(self.values))])
        if self.log:
            return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
        return float(rng.uniform(self.low, self.high))


def parse_spec(text: str) -> Spec:
    """``FIELD=V1,V2`` or ``FIELD=LOW:HIGH[:log]`` (``-`` or ``_`` in the field's name)."""
    name, sep, body = text.partition("=")
    field = name.strip().replace("-", "_")
    how = f"--sweep takes FIELD=V1,V2,... or FIELD=LOW:HIGH[:log], got {text!r}"
    if not sep or not field or not body:
        raise ValueError(how)
    try:
        if ":" in body:
            parts = body.split(":")
            log = parts[2:] == ["log"]
            if len(parts) not in (2, 3) or (len(parts) == 3 and not log):
                raise ValueError(how)
            low, high = float(parts[0]), float(parts[1])
            if not low < high or (log and low <= 0):
                raise ValueError(f"--sweep {text}: a range needs LOW < HIGH{' and LOW > 0 for :log' if log else ''}")
            return Spec(field, low=low, high=high, log=log)
        return Spec(field, values=tuple(float(value) for value in body.split(",")))
    except ValueError as error:
        raise ValueError(str(error) if str(error).startswith("--sweep") else how) from None


def _system_fields(config: Any) -> set[str]:
    """The fields of the config base that declares ``sweep`` (``AgentConfig``, which checks its
    sweeps here, so this module does not import it)."""
    base = next(cls for cls in type(config).__mro__ if "sweep" in vars(cls).get("__annotations__", {}))
    return {field.name for field in dataclasses.fields(base)}


def sweepable(config: Any) -> list[str]:
    """The fields a sweep may name: the ``float`` fields of the agent's config that are not the
    system's (:class:`~jaxdist.agents.experiment.AgentConfig`'s)."""
    system, hints = _system_fields(config), typing.get_type_hints(type(config))
    return [field.name for field in dataclasses.fields(config)
            if field.name not in system and hints[field.name] is float]


def _refuse_unsweepable(config: Any, field: str) -> None:
    names = {f.name for f in dataclasses.fields(config)}
    fields = ", ".join(sweepable(config))
    if field not in names:
        raise ValueError(f"--sweep {field}: {type(config).__name__} has no field {field!r}; it sweeps {fields}")
    if field in sweepable(config):
        return
    hint = typing.get_type_hints(type(config))[field]
    sets_shapes = hint in (int, bool) or typing.get_origin(hint) is tuple
    if field in _system_fields(config) and not sets_shapes:
        raise ValueError(f"--sweep {field}: {field} is a setting of the system, not a hyperparameter of the agent's "
                         f"learning; sweep {fields}, or launch one run per value (each its own --run-dir)")
    kind = hint.__name__ if isinstance(hint, type) else hint
    raise ValueError(f"--sweep {field}: {field} ({kind}) sets shapes, loop lengths or the program of the learner, "
                     f"so its values cannot share one compiled update; sweep {fields}, or launch one run per value "
                     f"of {field} (each its own --run-dir)")


def specs(config: Any) -> list[Spec]:
    """The config's ``--sweep`` entries, checked: fields that exist and keep the update's shapes,
    each named once, ranges only where something draws from them."""
    parsed = [parse_spec(text) for text in config.sweep]
    seen: set[str] = set()
    for spec in parsed:
        _refuse_unsweepable(config, spec.field)
        if spec.field in seen:
            raise ValueError(f"--sweep {spec.field} is given twice: give its values in one --sweep {spec.field}=V1,V2")
        seen.add(spec.field)
        if spec.is_range and not (config.sweep_random or config.pbt):
            raise ValueError(f"--sweep {spec.field}={spec.low:g}:{spec.high:g} is a range: draw N configurations from "
                             f"it with --sweep-random N (or --pbt N), or list values: {spec.field}=V1,V2")
    return parsed


def configurations(config: Any) -> list[dict[str, float]]:
    """Every configuration of the run, as its swept fields' values: one, with no field, when
    nothing is swept."""
    parsed = specs(config)
    drawn = config.pbt or config.sweep_random
    if drawn:
        rng = np.random.default_rng(config.seed)
        return [{spec.field: spec.draw(rng) for spec in parsed} for _ in range(drawn)]
    grid = itertools.product(*(spec.values for spec in parsed))
    return [dict(zip([spec.field for spec in parsed], values)) for values in grid]


def configured(config: Any, values: Mapping[str, float]) -> Any:
    """The config of one configuration, checked as a config of its own (bounds), and no sweep."""
    return dataclasses.replace(config, sweep=(), sweep_random=0, pbt=0, **values)


def check(config: Any) -> None:
    """Refuse a sweep the config cannot run, in one line (called by the config's own checks)."""
    if not (config.sweep or config.sweep_random or config.pbt):
        return
    if not config.sweep:
        raise ValueError("--sweep-random and --pbt draw their configurations from the --sweep FIELD=LOW:HIGH ranges "
                         "(or FIELD=V1,V2 lists): name at least one field")
    if config.sweep_random and config.pbt:
        raise ValueError("--pbt N draws its population as --sweep-random N would: give one of them")
    if config.pbt and config.num_seeds > 1:
        raise ValueError(f"--pbt's members are each a seed of their own: drop --num-seeds {config.num_seeds}")
    if config.pbt and config.architecture == "sebulba":
        _check_population(config)
    # PBT's perturbations stay inside a range: its ends must be values the field takes.
    ends = [{spec.field: end} for spec in specs(config) if spec.is_range for end in (spec.low, spec.high)]
    for values in [*configurations(config), *ends]:
        try:
            configured(config, values)
        except ValueError as error:
            raise ValueError(f"--sweep: the configuration {describe(values)} is refused: {error}") from None


def _check_population(config: Any) -> None:
    """What a population of Sebulba learners (:mod:`jaxdist.agents.population`) cannot run."""
    for interval in ("eval_every_updates", "publish_every_updates"):
        if config.pbt_interval % getattr(config, interval):
            flag = "--" + interval.replace("_", "-")
            raise ValueError(f"--pbt-interval {config.pbt_interval} must be a multiple of {flag} "
                             f"({getattr(config, interval)}) under --architecture sebulba: the members are ranked by "
                             f"their evaluators' returns of the version each round is at")
    if config.learner_hosts > 1:
        raise ValueError("--pbt under --architecture sebulba runs each member's learner on one host (the members "
                         "spread over the hosts): drop --learner-hosts")
    if config.stop_at_target:
        raise ValueError("--pbt trains every member to --total-steps: drop --stop-at-target")
    if config.inference != "actor":
        raise ValueError("--pbt under --architecture sebulba runs each member's policy in its actors: drop "
                         "--inference central")


def layout(config: Any) -> tuple[int, int]:
    """(configurations, seeds of each): run ``c x seeds + s`` is configuration ``c``'s seed ``s``.
    A config without the fields (an agent with a program of its own, ES's) runs one of each."""
    if not getattr(config, "sweep", ()):
        return 1, getattr(config, "num_seeds", 1)
    return len(configurations(config)), config.num_seeds


def searches(config: Any) -> bool:
    """Whether a run trains several configurations: a sweep or a PBT population (a config
    without those fields, ES's, never does)."""
    return bool(getattr(config, "sweep", ()) or getattr(config, "sweep_random", 0) or getattr(config, "pbt", 0))


def apart(config: Any, run_dir: str) -> list[tuple[Any, str]]:
    """The configurations that run as programs of their own, one after another, with their run
    directories (``<run_dir>/config-<c>``): a sweep under Sebulba, whose every configuration has
    its actors, learner and evaluator. None where they share one learner (Anakin) or one program
    (a PBT population), and for a config without the fields (ES's)."""
    if not getattr(config, "sweep", ()) or config.architecture == "anakin" or config.pbt:
        return []
    return [(configured(config, values), config_dir(run_dir, index))
            for index, values in enumerate(configurations(config))]


def config_dir(run_dir: str, index: int) -> str:
    """Where configuration ``index`` of a sweep run apart has its run."""
    return os.path.join(run_dir, f"config-{index}")


def runs(config: Any) -> dict[str, list[float]]:
    """Each swept field's value in every run, in run order (empty when nothing is swept)."""
    configs, (_, seeds) = configurations(config), layout(config)
    fields = list(configs[0])
    return {field: [values[field] for values in configs for _ in range(seeds)] for field in fields}


def traced(config: Any, values: Mapping[str, Any]) -> Any:
    """``config`` with ``values`` (traced arrays, inside the learner's update) in place of its
    fields: a copy that skips the config's checks, which would compare tracers."""
    copied = copy.copy(config)
    for name, value in values.items():
        object.__setattr__(copied, name, value)
    return copied


# The summary ---------------------------------------------------------------------------------


def summarize(run_dir: str, config: Any) -> list[dict[str, Any]]:
    """One row a configuration, best first: its fields, the mean over its seeds of their last
    evaluation return with the spread (std, min, max), the mean of their best, and how many
    reached ``target_return``. Written to ``<run_dir>/sweep.csv`` with ``sweep.png`` (each
    configuration's evaluation return, mean over seeds, by env steps)."""
    configs, (_, seeds) = configurations(config), layout(config)
    curves = _curves(run_dir, config, len(configs), seeds)
    target = config.target_return
    table = []
    for index, values in enumerate(configs):
        mine = curves[index][1]
        final = mine[-1] if len(mine) else np.full(seeds, np.nan)
        reached = int(np.sum(np.any(mine >= target, axis=0))) if target is not None and len(mine) else 0
        table.append({"config_index": index, **values, "mean_return": float(np.mean(final)),
                      "std_return": float(np.std(final)), "min_return": float(np.min(final)),
                      "max_return": float(np.max(final)),
                      "mean_best_return": float(np.mean(np.max(mine, axis=0))) if len(mine) else math.nan,
                      "seeds_at_target": reached})
    table.sort(key=lambda row: -np.nan_to_num(row["mean_return"], nan=-np.inf))
    for rank, row in enumerate(table, start=1):
        row["rank"] = rank
    _write_table(os.path.join(run_dir, SWEEP_FILE), table)
    _plot(run_dir, config, configs, curves)
    return table


def _curves(run_dir: str, config: Any, count: int, seeds: int) -> list[tuple[list[float], np.ndarray]]:
    """Each configuration's evaluations: (env steps, or learner versions where a row has no env
    steps; returns ``(evaluations, seeds)``), from its run's ``evaluations.csv`` (one per
    configuration when they ran apart, else the learner's, a column a run)."""
    from jaxdist.nodes.evaluator import recorded_evaluations

    def at(row: Mapping[str, Any]) -> float:
        return row.get("env_steps") or row["step"]

    if apart(config, run_dir):
        rows = [recorded_evaluations(config_dir(run_dir, index)) for index in range(count)]
        return [([at(row) for row in mine], np.array([[row["mean_return"]] for row in mine]).reshape(-1, 1))
                for mine in rows]
    rows = recorded_evaluations(run_dir)
    columns = [f"seed/{run}/mean_return" for run in range(count * seeds)] if count * seeds > 1 else ["mean_return"]
    returns = np.array([[row.get(column, np.nan) for column in columns] for row in rows]).reshape(-1, count, seeds)
    return [([at(row) for row in rows], returns[:, index, :]) for index in range(count)]


def _write_table(path: str, table: Sequence[Mapping[str, Any]]) -> None:
    columns = ["rank", *[name for name in table[0] if name != "rank"]]
    with open(path, "w") as f:
        f.write(",".join(columns) + "\n")
        for row in table:
            f.write(",".join(f"{row[name]:.6g}" if isinstance(row[name], float) else str(row[name])
                             for name in columns) + "\n")


def _plot(run_dir: str, config: Any, configs: list[dict[str, float]],
          curves: list[tuple[list[float], np.ndarray]]) -> None:
    from jaxdist.records.plotting import line_plot

    series = {describe(values): (steps, list(np.mean(returns, axis=1)))
              for values, (steps, returns) in zip(configs, curves) if len(steps) >= 2}
    if not series:
        return
    target = config.target_return
    line_plot(os.path.join(run_dir, SWEEP_PLOT), series, title=f"{config.env_id}, {len(configs)} configurations x "
              f"{config.num_seeds} seed(s): mean over seeds", xlabel="env steps (or updates) per run",
              ylabel="episode return", log2_x=False,
              hlines={f"target {target:g}": target} if target is not None else None)


def describe(values: Mapping[str, float]) -> str:
    """``learning_rate=0.001 gamma=0.99``: a configuration as the table and the plot name it."""
    return " ".join(f"{name}={value:.4g}" for name, value in values.items())


def format_table(table: Sequence[Mapping[str, Any]], seeds: int) -> str:
    """The ranking as the command line prints it."""
    lines = [f"{'rank':>4}  {'config':>6}  {'mean return':>11}  {'std':>6}  {'min..max':>15}  "
             f"{'at target':>9}  fields"]
    for row in table:
        fields = {name: row[name] for name in row if name not in _SUMMARY_COLUMNS}
        lines.append(f"{row['rank']:>4}  {row['config_index']:>6}  {row['mean_return']:>11.1f}  "
                     f"{row['std_return']:>6.1f}  {row['min_return']:>7.1f}..{row['max_return']:<7.1f}  "
                     f"{row['seeds_at_target']:>4}/{seeds:<4}  {describe(fields)}")
    return "\n".join(lines)


_SUMMARY_COLUMNS = {"rank", "config_index", "mean_return", "std_return", "min_return", "max_return",
                    "mean_best_return", "seeds_at_target"}


def plot_lineage(run_dir: str) -> list[str]:
    """A PBT run's ``lineage_<field>.png``, each member's value of the field by update, and one
    line a copy (``step: member <- parent``), from ``lineage.csv``."""
    from jaxdist.learning.layout import LINEAGE
    from jaxdist.records.metrics import metrics_path, read_metrics
    from jaxdist.records.plotting import line_plot

    try:
        rows = read_metrics(metrics_path(run_dir, LINEAGE))
    except (OSError, ValueError):
        return []
    fields = [name for name in (rows[0] if rows else {}) if name not in ("step", "wall_time", "member", "parent")]
    members = sorted({row["member"] for row in rows})
    for field in fields:
        series = {f"member {member}": ([row["step"] for row in rows if row["member"] == member],
                                       [row[field] for row in rows if row["member"] == member]) for member in members}
        line_plot(os.path.join(run_dir, f"lineage_{field}.png"), series, title=f"PBT: {field} of each member",
                  xlabel="update", ylabel=field, log2_x=False)
    return [f"{row['step']}: member {row['member']} <- {row['parent']}" for row in rows
            if row["member"] != row["parent"]]
