"""ES's config: one frozen dataclass for a whole experiment, and per-env presets. Its command
line is generated from it (``jaxdist.agents.cli``; a field's docstring is its help text).
Nothing here imports JAX: the launching process builds configs and programs without it."""

from __future__ import annotations

import dataclasses
from typing import Literal

from jaxdist.agents.config import Presets

PRESETS: Presets = {
    # A CartPole episode starts within 0.05 of upright, so one episode ranks a member well.
    "CartPole-v1": {"episodes_per_member": 1, "total_steps": 3_000_000, "target_return": 475.0},
    # A Pendulum episode starts at any angle, so a member is ranked on eight start states: with
    # four, the noise of the ranking left the mean policy of some seeds hovering near -200.
    "Pendulum-v1": {"episodes_per_member": 8, "total_steps": 40_000_000, "target_return": -200.0},
}
"""Per env id: the values of the fields left None. ES runs only the envs it has JAX ports of."""


@dataclasses.dataclass(frozen=True)
class ESConfig:
    """OpenAI-ES (Salimans et al. 2017). The defaults reach CartPole-v1 >= 475 and Pendulum-v1
    >= -200 (mean return of the mean policy over ``eval_episodes`` episodes); fields left None
    take the env's value from ``PRESETS``.

    Each generation evaluates ``population`` perturbations (``population / 2`` antithetic
    pairs) in tasks of ``pairs_per_task`` pairs spread over ``num_evaluators`` evaluator
    nodes; every member plays the generation's ``episodes_per_member`` start states. The run
    ends after ``total_steps`` env steps of training episodes (evaluation episodes are not
    counted), or, with ``stop_at_target``, once the mean policy reaches ``target_return``
    on the JAX env and then on gymnasium's. The final mean policy is then scored on
    ``final_episodes`` fresh episodes of gymnasium's env (the summary's ``final_return``).
    """

    env_id: Literal["CartPole-v1", "Pendulum-v1"] = "CartPole-v1"
    """An env with a JAX port of its dynamics (jaxdist/jax_envs.py); picks its preset."""
    seed: int = 0
    num_evaluators: int = 2
    """Evaluator nodes: ES's actors."""

    # OpenAI-ES.
    population: int = 64
    """Perturbations per generation (antithetic pairs: half as many)."""
    sigma: float = 0.1
    """Standard deviation of the parameter noise."""
    learning_rate: float = 0.1
    optimizer: Literal["adam", "sgd"] = "adam"
    momentum: float = 0.9
    """SGD's momentum."""
    weight_decay: float = 0.005
    """L2 decay of the mean parameters."""
    hidden: tuple[int, ...] = (32, 32)
    """Widths of the policy MLP's hidden layers."""
    episodes_per_member: int | None = None
    """Start states every member plays per generation (None: the env's preset)."""

    # The run.
    total_steps: int | None = None
    """Env steps of training episodes, then the run ends (None: the env's preset)."""
    target_return: float | None = None
    """The mean policy's return whose first crossing is timed (None: the env's preset)."""
    stop_at_target: bool = False
    """End the run once the mean policy reaches target_return (on the JAX env, then on gymnasium's)."""
    eval_episodes: int = 20
    """Episodes that score the mean policy each generation."""
    final_episodes: int = 100
    """Fresh gymnasium episodes that score the final mean policy (the summary's final_return)."""
    pairs_per_task: int = 8
    """Antithetic pairs per task sent to an evaluator."""
    checkpoint_every_generations: int = 10
    task_timeout: float = 120.0
    """Seconds the pool (jd.Pool) gives each call."""
    backup_after: float = 3.0
    """Seconds after which the pool runs a backup copy of a task still running on an idle evaluator."""
    unavailable_timeout: float = 300.0
    """Seconds without any evaluator answering after which the pool gives up."""

    def __post_init__(self) -> None:
        if self.env_id not in PRESETS:
            raise ValueError(f"ES here runs {', '.join(PRESETS)} (JAX ports of their dynamics); "
                             f"got {self.env_id!r}")
        for name, value in PRESETS[self.env_id].items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        object.__setattr__(self, "hidden", tuple(self.hidden))
        for name in ("num_evaluators", "population", "pairs_per_task", "episodes_per_member", "total_steps",
                     "eval_episodes", "final_episodes", "checkpoint_every_generations"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.population % (2 * self.pairs_per_task):
            raise ValueError(f"population {self.population} must split into antithetic pairs in tasks of "
                             f"{self.pairs_per_task} pairs: make it a multiple of {2 * self.pairs_per_task}")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if self.sigma <= 0 or self.learning_rate <= 0:
            raise ValueError(f"sigma and learning_rate must be > 0, got {self.sigma} and {self.learning_rate}")

    @property
    def pairs(self) -> int:
        return self.population // 2
