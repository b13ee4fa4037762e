"""``train(config, launcher=..., run_dir=...) -> summary``: IMPALA's program under the shared
monitor of :mod:`jaxdist.agents.training`."""

from __future__ import annotations

from typing import Any

from jaxdist.agents import training
from jaxdist.agents.impala import builder
from jaxdist.agents.impala.config import IMPALAConfig


def train(config: IMPALAConfig, *, launcher: str = "processes", run_dir: str | None = None,
          compilation_cache: str | None = None, **options: Any) -> dict[str, Any]:
    """Launch ``make_program(config)`` and watch it to the end; ``options`` are those of
    :func:`jaxdist.agents.training.run` (``target_return``, ``stop_at_target``, ...)."""
    spec = training.RunSpec(
        agent="impala", env_id=config.env_id, seed=config.seed, learner=builder.LEARNER,
        total_updates=config.total_updates, steps_per_update=config.steps_per_update,
        resources=builder.resources(compilation_cache), restart=builder.restarts())
    return training.run(builder.make_program(config), spec, launcher=launcher, run_dir=run_dir, **options)
