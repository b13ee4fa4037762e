"""``train(config, launcher=..., run_dir=...) -> summary``: PPO's program under the shared
monitor of :mod:`jaxdist.agents.training`."""

from __future__ import annotations

from typing import Any

from jaxdist.agents import training
from jaxdist.agents.ppo import builder
from jaxdist.agents.ppo.config import PPOConfig


def train(config: PPOConfig, *, launcher: str = "processes", run_dir: str | None = None,
          compilation_cache: str | None = None, **options: Any) -> dict[str, Any]:
    """Launch ``make_program(config)`` and watch it to the end; ``options`` are those of
    :func:`jaxdist.agents.training.run` (``target_return``, ``stop_at_target``, ...)."""
    spec = training.RunSpec(
        agent="ppo", env_id=config.env_id, seed=config.seed, learner=builder.LEARNER,
        total_updates=config.total_updates, steps_per_update=config.steps_per_update,
        resources=builder.resources(config, compilation_cache), restart=builder.restarts())
    return training.run(builder.make_program(config), spec, launcher=launcher, run_dir=run_dir, **options)
