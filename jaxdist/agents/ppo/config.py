"""One frozen dataclass describes a whole PPO experiment: environment, actors, algorithm, system.

Nothing here imports JAX: the launching process builds configs and programs without it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from jaxdist.agents.common import env_dims


@dataclasses.dataclass(frozen=True)
class PPOHyperparams:
    """The learning side of a PPO config (see ``config.PPOConfig`` for what each field means)."""

    num_actions: int
    obs_shape: tuple[int, ...]
    hidden: tuple[int, ...] = (64, 64)
    learning_rate: float = 1e-3
    anneal_lr: bool = True
    total_updates: int | None = None
    gamma: float = 0.98
    gae_lambda: float = 0.8
    clip_eps: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    max_grad_norm: float = 0.5
    epochs: int = 10
    minibatches: int = 2
    normalize_advantages: bool = True
    recompute_values: bool = True
    max_policy_lag: int = 4

    def network(self) -> Any:
        """The flax ``ActorCritic`` (imported here: building a config needs no JAX)."""
        from jaxdist.agents.networks import ActorCritic

        return ActorCritic(self.num_actions, self.hidden)


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Defaults solve CartPole-v1 (mean return >= 475) in well under 100k env steps.

    ``batch_trajectories`` (B) is how many env trajectories of ``trajectory_length`` (T) steps
    one update learns from (default: one per env, ``num_actors * envs_per_actor``); an update
    is ``epochs`` passes over its ``B * T`` transitions in ``minibatches`` SGD steps each.
    ``queue_trajectories`` bounds the FIFO between actors and learner (default B): with each
    actor's ``max_in_flight`` sends and the learner's ``learner_prefetch`` batches it bounds
    how far actors run ahead of the learner, hence the policy lag (about 2 updates with these
    defaults: data collected during update k is learned from at update k + 1, by a policy the
    actors fetched a little after update k - 1 was published). Transitions more than
    ``max_policy_lag`` versions old are not learned from.

    ``learner_hosts`` > 1: one learner process per host (launcher ``multihost``, ``placement()``),
    together one ``jax.distributed`` SPMD learner. Each host has its own FIFO queue, fed by the
    actors placed on it, and its learner takes ``batch_size / learner_hosts`` trajectories of
    every update from there; host 0's learner publishes parameters.
    """

    # Environment and actors.
    env_id: str = "CartPole-v1"
    env_backend: str = "auto"
    num_actors: int = 2
    envs_per_actor: int = 8
    trajectory_length: int = 32
    total_steps: int = 500_000
    seed: int = 0

    # PPO (the rl-zoo CartPole settings, with a larger batch per update).
    learning_rate: float = 1e-3
    anneal_lr: bool = True
    gamma: float = 0.98
    gae_lambda: float = 0.8
    clip_eps: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    max_grad_norm: float = 0.5
    epochs: int = 10
    minibatches: int = 2
    hidden: tuple[int, ...] = (64, 64)
    normalize_advantages: bool = True

    # The system.
    batch_trajectories: int | None = None
    queue_trajectories: int | None = None
    max_policy_lag: int = 4
    param_refresh_seconds: float = 0.02
    max_in_flight: int = 1
    learner_prefetch: int = 0
    learner_mode: Literal["jit", "pmap"] = "jit"
    learner_hosts: int = 1
    checkpoint_every_updates: int = 200
    log_every_updates: int = 5

    def __post_init__(self) -> None:
        for name in ("num_actors", "envs_per_actor", "trajectory_length", "total_steps", "epochs", "minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if (self.batch_size * self.trajectory_length) % self.minibatches:
            raise ValueError(f"an update's {self.batch_size} x {self.trajectory_length} transitions do not split "
                             f"into {self.minibatches} minibatches")
        if self.learner_hosts < 1 or self.batch_size % self.learner_hosts or self.num_actors % self.learner_hosts:
            raise ValueError(f"learner_hosts ({self.learner_hosts}) must divide the batch ({self.batch_size} "
                             f"trajectories) and num_actors ({self.num_actors}): each host's learner learns from "
                             f"its own actors' share")
        if self.queue_size < self.batch_size:
            raise ValueError(f"queue_trajectories ({self.queue_size}) must hold one batch ({self.batch_size})")

    @property
    def batch_size(self) -> int:
        """B: env trajectories per update."""
        return self.batch_trajectories or self.num_actors * self.envs_per_actor

    @property
    def queue_size(self) -> int:
        return self.queue_trajectories or self.batch_size

    @property
    def steps_per_update(self) -> int:
        return self.batch_size * self.trajectory_length

    @property
    def total_updates(self) -> int:
        return max(1, self.total_steps // self.steps_per_update)

    def hyperparams(self) -> PPOHyperparams:
        obs_shape, num_actions = env_dims(self.env_id, "PPO here")
        return PPOHyperparams(
            num_actions=num_actions, obs_shape=obs_shape, hidden=tuple(self.hidden),
            learning_rate=self.learning_rate, anneal_lr=self.anneal_lr, total_updates=self.total_updates,
            gamma=self.gamma, gae_lambda=self.gae_lambda, clip_eps=self.clip_eps, vf_coef=self.vf_coef,
            ent_coef=self.ent_coef, max_grad_norm=self.max_grad_norm, epochs=self.epochs,
            minibatches=self.minibatches, normalize_advantages=self.normalize_advantages,
            recompute_values=True, max_policy_lag=self.max_policy_lag)
