"""``train(config, launcher=..., run_dir=...) -> summary``: Ape-X's program under the shared
monitor of :mod:`jaxdist.agents.training`, whose return is that of the greediest actors."""

from __future__ import annotations

from typing import Any

from jaxdist.agents import training
from jaxdist.agents.apex import builder
from jaxdist.agents.apex.config import ApexConfig


def train(config: ApexConfig, *, launcher: str = "processes", run_dir: str | None = None,
          compilation_cache: str | None = None, **options: Any) -> dict[str, Any]:
    """Launch ``make_program(config)`` and watch it to the end; ``options`` are those of
    :func:`jaxdist.agents.training.run` (``target_return``, ``stop_at_target``, ...)."""
    spec = training.RunSpec(
        agent="apex", env_id=config.env_id, seed=config.seed, learner=builder.LEARNER,
        total_updates=config.total_updates, steps_per_update=config.steps_per_update,
        resources=builder.resources(config, compilation_cache), restart=builder.restarts(),
        return_actors=tuple(range(config.num_actors - config.report_actors, config.num_actors)))
    return training.run(builder.make_program(config), spec, launcher=launcher, run_dir=run_dir, **options)
