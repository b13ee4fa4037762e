"""PPO as an agent record: its config (``PPOConfig``, per-env ``PRESETS``) and its parts. The
math (GAE, the clipped loss, the jitted update) is in ``learning.py``; the actors run the shared
actor-critic policy, and the topology is the config's architecture
(``jaxdist.agents.experiment``): ``jd.launch(ppo.make_program(ppo.PPOConfig())).wait()``.
Nothing here imports JAX: the launching process builds configs and programs without it."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jaxdist as jd
from jaxdist.agents.experiment import (AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT_INTERVAL, Agent, AgentConfig,
                                       Presets, check_bounds, check_fifo, fifo_size)


@dataclasses.dataclass(frozen=True)
class PPOConfig(AgentConfig):
    """PPO (Schulman et al., 2017) on the actor-learner topology. The defaults are the CartPole
    preset: a mean evaluation return of 475 in well under 100k env steps.

    One update learns from ``batch_trajectories`` (B) env trajectories of ``trajectory_length``
    (T) steps: ``epochs`` passes over its ``B * T`` transitions in ``minibatches`` SGD steps
    each. ``queue_trajectories`` bounds the FIFO between actors and learner (default B, or more
    where an actor sends more at once): with each actor's ``max_in_flight`` sends it bounds how
    far actors run ahead, hence the policy lag (about 2 updates with these defaults);
    transitions more than ``max_policy_lag`` versions old are not learned from. With
    ``learner_hosts`` > 1 each host's learner takes ``B / learner_hosts`` trajectories of every
    update from its own FIFO. With a recurrent ``core`` the minibatches split the trajectories,
    not the transitions: each is unrolled whole from the state its actor started it with.
    """

    recurrent_cores: ClassVar[bool] = True

    learning_rate: float = 1e-3
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the run's SGD steps."""
    gamma: float = 0.98
    gae_lambda: float = 0.8
    clip_eps: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    max_grad_norm: float = 0.5
    epochs: int = 10
    minibatches: int = 2
    normalize_advantages: bool = True
    normalize_observations: bool = False
    """Running mean/std normalisation of observations, learned by the learner and shipped with
    its parameters (and checkpoints), so learner and actors normalise alike."""
    scale_rewards: bool = False
    """Divide rewards by the running std of the discounted return (as VecNormalize does)."""
    batch_trajectories: int | None = None
    """B (default: one per env, num_actors x envs_per_actor)."""
    queue_trajectories: int | None = None
    max_policy_lag: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bounds(self, {
            **dict.fromkeys(("epochs", "minibatches", "batch_trajectories", "queue_trajectories"), AT_LEAST_ONE),
            **dict.fromkeys(("learning_rate", "clip_eps", "max_grad_norm"), POSITIVE),
            **dict.fromkeys(("gamma", "gae_lambda"), UNIT_INTERVAL),
            **dict.fromkeys(("vf_coef", "ent_coef", "max_policy_lag"), NON_NEGATIVE)})
        if self.core != "none" and (self.batch_size // self.learner_hosts) % self.minibatches:
            raise ValueError(f"with a recurrent core minibatches split the trajectories: an update's "
                             f"{self.batch_size // self.learner_hosts} trajectories (per learner host) do not split "
                             f"into {self.minibatches} minibatches")
        if (self.batch_size // self.learner_hosts * self.trajectory_length) % self.minibatches:
            raise ValueError(f"an update's {self.batch_size} x {self.trajectory_length} transitions do not split "
                             f"into {self.minibatches} minibatches")
        check_fifo(self, self.queue_size, self.batch_size)

    @property
    def batch_size(self) -> int:
        return self.batch_trajectories or self.num_actors * self.envs_per_actor

    @property
    def queue_size(self) -> int:
        return fifo_size(self, self.queue_trajectories, self.batch_size)

    @property
    def steps_per_update(self) -> int:
        return self.batch_size * self.trajectory_length


MINATAR = {"network": "cnn", "num_actors": 1, "envs_per_actor": 64, "trajectory_length": 128, "epochs": 4,
           "minibatches": 8, "learning_rate": 5e-4, "gamma": 0.99, "gae_lambda": 0.95, "ent_coef": 0.01,
           "total_steps": 10_000_000, "eval_every_updates": 20, "checkpoint_every_updates": 100}

PRESETS: Presets = {
    # On two cores one actor of 16 envs beats two of 8 (a second process costs a start-up and a
    # policy call per 8 steps), and an evaluation every 5 updates finds the target ~0.5 s sooner.
    "CartPole-v1": {"target_return": 475.0, "num_actors": 1, "envs_per_actor": 16, "eval_every_updates": 5},
    "Pendulum-v1": {"target_return": -250.0, "num_actors": 2, "envs_per_actor": 4, "trajectory_length": 256,
                    "total_steps": 500_000, "gamma": 0.9, "gae_lambda": 0.95, "learning_rate": 1e-3,
                    "epochs": 10, "minibatches": 32, "normalize_observations": True, "scale_rewards": True,
                    "max_policy_lag": 2, "eval_every_updates": 5, "checkpoint_every_updates": 50},
    "HalfCheetah-v5": {"target_return": 1500.0, "num_actors": 2, "envs_per_actor": 4, "trajectory_length": 256,
                       "total_steps": 1_000_000, "gamma": 0.99, "gae_lambda": 0.95, "learning_rate": 3e-4,
                       "epochs": 10, "minibatches": 32, "ent_coef": 0.0, "normalize_observations": True,
                       "scale_rewards": True, "max_policy_lag": 2, "eval_every_updates": 10,
                       "eval_episodes": 5, "checkpoint_every_updates": 50},
    # MinAtar (gymnax): PureJaxRL's MinAtar settings with MinAtar's CNN; the targets are
    # gymnax-blines' PPO returns at 10M env steps.
    **{env_id: {**MINATAR, "target_return": target} for env_id, target in (
        ("SpaceInvaders-MinAtar", 131.0), ("Asterix-MinAtar", 15.0), ("Freeway-MinAtar", 58.0))},
    # Breakout's policy settles on a paddle that loses the ball (a mean near 13 at 10M env steps)
    # unless more entropy and a constant learning rate keep it exploring and improving.
    "Breakout-MinAtar": {**MINATAR, "target_return": 28.0, "ent_coef": 0.03, "anneal_lr": False},
    # A JAX-backend actor plays a trajectory per dispatch, so more envs cost it little: 64 raise
    # the rate, and fewer SGD steps an update (16, each of 512 transitions) keep the learner, then
    # the bottleneck, from holding the run back (measured runs: the benchmarks page, "PPO on
    # CartPole-v1, JAX env backend").
    ("CartPole-v1", "jax"): {"envs_per_actor": 64, "epochs": 4, "minibatches": 4},
    # One JAX-backend actor of 8 envs outpaces the learner alone and starts one process fewer
    # than two of 4, with data as fresh.
    ("Pendulum-v1", "jax"): {"num_actors": 1, "envs_per_actor": 8},
    # No velocities: a feed-forward policy cannot balance the pole; an LSTM remembers enough.
    "CartPoleNoVel-v1": {"target_return": 475.0, "core": "lstm", "core_size": 64, "hidden": (64,),
                         "num_actors": 1, "envs_per_actor": 16, "trajectory_length": 32, "epochs": 10,
                         "minibatches": 4, "total_steps": 200_000, "eval_every_updates": 5},
    # One actor and the default lag bound: the recurrent learner is slower than the feed-forward
    # one, and with two actors and Pendulum-v1's bound of 2 versions a busy machine's learner can
    # find every transition too stale to learn from.
    "PendulumNoVel-v1": {"target_return": -300.0, "core": "lstm", "core_size": 64, "hidden": (64,),
                         "num_actors": 1, "envs_per_actor": 16, "trajectory_length": 64, "total_steps": 1_000_000,
                         "gamma": 0.9, "gae_lambda": 0.95, "learning_rate": 1e-3, "epochs": 10, "minibatches": 4,
                         "normalize_observations": True, "scale_rewards": True,
                         "eval_every_updates": 5, "checkpoint_every_updates": 50},
}
"""Tuned defaults per env id (rl-baselines3-zoo and CleanRL's settings, checked here), and per
(env id, env backend) what differs on that backend; every field stays overridable flag by flag."""


def agent(config: PPOConfig) -> Agent:
    """The record ``run.train`` takes; ``agent(config).topology()`` builds its program."""
    return Agent("ppo", "jaxdist.agents.ppo:agent", config, learner_logic="jaxdist.agents.ppo.learning:logic",
                 policy="jaxdist.agents.actor_critic:policy")


def make_program(config: PPOConfig) -> jd.Program:
    """``jd.launch(ppo.make_program(config)).wait()`` trains to the end and returns."""
    return agent(config).topology().program


__all__ = ["PPOConfig", "PRESETS", "agent", "make_program"]
