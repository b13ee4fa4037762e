"""IMPALA with V-trace (Espeholt et al., 2018) as an agent record: its config (``IMPALAConfig``,
per-env ``PRESETS``) and its components. ``vtrace.py`` is the off-policy correction (a pure
function), ``learning.py`` the loss and the jitted update. Actors run the shared actor-critic
policy, which sends the behaviour log-probs V-trace needs; the learner and the topology are the
shared ones. Nothing here imports JAX."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from jaxdist.agents.experiment import (AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT_INTERVAL, Agent, AgentConfig,
                                       Presets, check_bounds, check_fifo, fifo_size)


@dataclasses.dataclass(frozen=True)
class IMPALAConfig(AgentConfig):
    """IMPALA with V-trace (Espeholt et al., 2018) on the actor-learner topology.

    Each update is one SGD step on ``batch_trajectories`` (B) trajectories of
    ``trajectory_length`` (T) transitions, whatever policy version acted them: V-trace corrects
    for the lag instead of dropping stale data. ``queue_trajectories`` bounds the FIFO between
    actors and learner (default 2 B, or more where an actor sends more at once); a full queue
    makes actors wait (back-pressure), which bounds the policy lag. ``rho_bar`` / ``c_bar`` /
    ``pg_rho_bar`` truncate the importance weights of the value targets, the traces and the
    policy gradient; ``trace_lambda`` is the paper's lambda in
    ``c_i = lambda min(c_bar, pi/mu)``.

    Tuned here (2 seeds each): a learning rate of 2e-3 reached the CartPole and Acrobot targets
    in about a third of the env steps 1e-3 needed; clipping the gradient norm at 0.5 matters
    (with the paper's 40, CartPole runs stalled below a mean return of 200 for 1.5M steps).
    With a recurrent ``core`` each trajectory is unrolled from the state its actor started it with,
    and the policy and value heads share the torso and the core: ``baseline_cost`` then weighs the
    value's gradient against the policy's in them. At 0.5, on CartPole's returns (tens), it
    saturates the core and the policy stays uniform; the recurrent preset takes 0.002.
    Feed-forward MLPs have a value torso of their own, where the weight matters little.
    """

    recurrent_cores: ClassVar[bool] = True

    num_actors: int = 4
    trajectory_length: int = 20
    total_steps: int = 2_000_000
    checkpoint_every_updates: int = 500
    log_every_updates: int = 10
    eval_every_updates: int = 25

    learning_rate: float = 2e-3
    anneal_lr: bool = True
    gamma: float = 0.98
    rho_bar: float = 1.0
    c_bar: float = 1.0
    pg_rho_bar: float = 1.0
    trace_lambda: float = 1.0
    baseline_cost: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    normalize_observations: bool = False
    """Running mean/std normalisation of observations, shipped with the parameters."""
    scale_rewards: bool = False
    """Divide rewards by the running std of the discounted return."""
    batch_trajectories: int = 32
    queue_trajectories: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bounds(self, {
            **dict.fromkeys(("batch_trajectories", "queue_trajectories"), AT_LEAST_ONE),
            **dict.fromkeys(("learning_rate", "rho_bar", "c_bar", "pg_rho_bar", "max_grad_norm"), POSITIVE),
            **dict.fromkeys(("gamma", "trace_lambda"), UNIT_INTERVAL),
            **dict.fromkeys(("baseline_cost", "ent_coef"), NON_NEGATIVE)})
        check_fifo(self, self.queue_size, self.batch_trajectories)

    @property
    def batch_size(self) -> int:
        return self.batch_trajectories

    @property
    def queue_size(self) -> int:
        return fifo_size(self, self.queue_trajectories, 2 * self.batch_trajectories)

    @property
    def steps_per_update(self) -> int:
        return self.batch_trajectories * self.trajectory_length


ATARI = {"network": "cnn", "env_backend": "envpool", "num_actors": 2, "envs_per_actor": 16, "learning_rate": 6e-4,
         "gamma": 0.99, "ent_coef": 0.01, "max_grad_norm": 40.0, "total_steps": 12_500_000, "eval_episodes": 4,
         "eval_every_updates": 500, "checkpoint_every_updates": 1_000}
"""Atari through EnvPool (``jaxdist.envs.atari``): Cleanba's IMPALA settings, 50M frames; not tuned here."""

PRESETS: Presets = {
    "CartPole-v1": {"target_return": 475.0},
    "Pong-v5": {**ATARI, "target_return": 18.0},
    "Breakout-v5": {**ATARI, "target_return": 400.0},
    "Acrobot-v1": {"target_return": -100.0},
    "Pendulum-v1": {"target_return": -250.0, "normalize_observations": True, "scale_rewards": True,
                    "gamma": 0.9, "learning_rate": 1e-3, "ent_coef": 0.0, "total_steps": 1_000_000},
    # The heads share the core: the value's gradient, weighed at 0.5, left the policy nothing to learn from.
    "CartPoleNoVel-v1": {"target_return": 475.0, "core": "lstm", "core_size": 64, "hidden": (64,),
                         "baseline_cost": 0.002, "total_steps": 1_000_000},
}
"""Tuned defaults per env id; every field stays overridable flag by flag."""


def agent(config: IMPALAConfig) -> Agent:
    """The record ``run.train`` takes; ``agent(config).topology()`` builds its program."""
    return Agent("impala", "jaxdist.agents.impala:agent", config, learner_logic="jaxdist.agents.impala.learning:logic",
                 policy="jaxdist.agents.actor_critic:policy")


__all__ = ["IMPALAConfig", "PRESETS", "agent"]
