"""A2C (Mnih et al., 2016, synchronous) as an agent record: its config, presets and parts. The
math is in ``a2c_learning.py``; the actors act with the library's actor-critic policy. Nothing
here imports JAX: the launching process builds the program without it."""

from __future__ import annotations

import dataclasses

from jaxdist.agents.experiment import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT_INTERVAL, Agent, AgentConfig, check_bounds


@dataclasses.dataclass(frozen=True)
class A2CConfig(AgentConfig):
    """One SGD step per batch of ``num_actors x envs_per_actor`` trajectories, on the advantage
    actor-critic loss with GAE(``gae_lambda``) advantages (1: n-step returns)."""

    num_actors: int = 1
    envs_per_actor: int = 16
    trajectory_length: int = 16
    learning_rate: float = 2e-3
    gamma: float = 0.99
    gae_lambda: float = 0.95
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    normalize_observations: bool = False
    scale_rewards: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bounds(self, {"learning_rate": POSITIVE, "max_grad_norm": POSITIVE, "gamma": UNIT_INTERVAL,
                            "gae_lambda": UNIT_INTERVAL, "vf_coef": NON_NEGATIVE, "ent_coef": NON_NEGATIVE,
                            "trajectory_length": AT_LEAST_ONE})

    @property
    def batch_size(self) -> int:
        return self.num_actors * self.envs_per_actor

    @property
    def queue_size(self) -> int:
        return self.batch_size

    @property
    def steps_per_update(self) -> int:
        return self.batch_size * self.trajectory_length


PRESETS = {"CartPole-v1": {"target_return": 475.0, "eval_every_updates": 25, "total_steps": 1_000_000}}


def agent(config: A2CConfig) -> Agent:
    """The record ``jaxdist.agents.run`` trains; its parts are named, imported where they run."""
    return Agent("a2c", "a2c:agent", config, learner_logic="a2c_learning:logic",
                 policy="jaxdist.agents.actor_critic:policy")
