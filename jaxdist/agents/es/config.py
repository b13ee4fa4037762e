"""One frozen dataclass describes a whole ES experiment. Nothing here imports JAX: the launching
process builds configs and programs without it."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    # A CartPole episode starts within 0.05 of upright, so one episode ranks a member well.
    "CartPole-v1": {"episodes_per_member": 1, "total_steps": 3_000_000, "target_return": 475.0},
    # A Pendulum episode starts at any angle, so a member is ranked on eight start states: with
    # four, the noise of the ranking left the mean policy of some seeds hovering near -200.
    "Pendulum-v1": {"episodes_per_member": 8, "total_steps": 40_000_000, "target_return": -200.0},
}


@dataclasses.dataclass(frozen=True)
class ESConfig:
    """Defaults reach CartPole-v1 >= 475 and Pendulum-v1 >= -200 (mean return of the mean
    policy over ``eval_episodes`` episodes); fields left None take the env's value from
    ``ENV_DEFAULTS``.

    Each generation evaluates ``population`` perturbations (``population / 2`` antithetic
    pairs) in tasks of ``pairs_per_task`` pairs spread over ``num_evaluators`` evaluator
    nodes; every member plays the generation's ``episodes_per_member`` start states. The run
    ends after ``total_steps`` env steps of training episodes (evaluation episodes are not
    counted), or, with ``stop_at_target``, once the mean policy reaches ``target_return``
    on the JAX env and then on gymnasium's. The final mean policy is then scored on
    ``final_episodes`` fresh episodes of gymnasium's env (the summary's ``final_return``).

    The pool (``jd.Pool``) gives each call ``task_timeout`` seconds, runs a backup copy of a
    task still running after ``backup_after`` seconds on an idle evaluator, and gives up once
    no evaluator has answered for ``unavailable_timeout`` seconds.
    """

    env_id: str = "CartPole-v1"
    seed: int = 0
    num_evaluators: int = 2

    # OpenAI-ES.
    population: int = 64
    sigma: float = 0.1
    learning_rate: float = 0.1
    optimizer: Literal["adam", "sgd"] = "adam"
    momentum: float = 0.9
    weight_decay: float = 0.005
    hidden: tuple[int, ...] = (32, 32)
    episodes_per_member: int | None = None

    # The run.
    total_steps: int | None = None
    target_return: float | None = None
    stop_at_target: bool = False
    eval_episodes: int = 20
    final_episodes: int = 100
    pairs_per_task: int = 8
    checkpoint_every_generations: int = 10
    task_timeout: float = 120.0
    backup_after: float = 3.0
    unavailable_timeout: float = 300.0

    def __post_init__(self) -> None:
        if self.env_id not in ENV_DEFAULTS:
            raise ValueError(f"ES here runs {', '.join(ENV_DEFAULTS)} (JAX ports of their dynamics); "
                             f"got {self.env_id!r}")
        for name, value in ENV_DEFAULTS[self.env_id].items():
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
