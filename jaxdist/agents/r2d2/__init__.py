"""R2D2 (Kapturowski et al. 2019) as an agent record: its config (``R2D2Config``, ``PRESETS``)
and its parts, on Ape-X's model: epsilon-greedy actors of many epsilons, Ape-X's prioritized
replay table (of sequences) rate-limited to ``samples_per_insert``, a learner that writes
priorities back. What R2D2 adds is
memory: an LSTM Q-network, a replay of overlapping sequences that keep the recurrent state they
started from, a burn-in, the value rescaling ``h``, and sequence priorities. ``learning.py`` has
the math and the actors' side. Nothing here imports JAX."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from jaxdist.agents.experiment import (AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT_INTERVAL, Agent, AgentConfig, Bound,
                                       Presets, check_bounds)
from jaxdist.agents.apex import MINATAR
from jaxdist.envs.gymnax_as_gym import MINATAR_IDS


@dataclasses.dataclass(frozen=True)
class R2D2Config(AgentConfig):
    """R2D2 on the actor-learner topology.

    **Sequences.** Every ``trajectory_length`` steps (the period, the paper's 40) each env's last
    ``burn_in + sequence_length`` steps become one sequence (the paper's 40 + 80): consecutive
    sequences overlap by all but a period, and each keeps the recurrent state its actor had
    before its first row (the paper's "stored state"). ``burn_in + sequence_length`` must be a
    multiple of ``trajectory_length``.

    **Learner.** The online and target LSTM Q-networks are unrolled over each sequence from its
    stored state; the first ``burn_in`` steps only refresh that state (no gradient). On the
    rest: n-step double-Q targets through the value rescaling ``h(x) = sign(x)(sqrt(|x| + 1) -
    1) + epsilon x`` (``rescale_epsilon``), ``h(R + gamma^n h^-1(Q_target(s', argmax Q(s'))))``;
    the loss is the importance-weighted mean of ``td^2 / 2``; a sequence's priority is
    ``eta max |td| + (1 - eta) mean |td|`` over its steps (``eta`` = 0.9).
    """

    recurrent_cores: ClassVar[bool] = True

    env_id: str = "CartPoleNoVel-v1"
    num_actors: int = 2
    envs_per_actor: int = 8
    trajectory_length: int = 10
    total_steps: int = 500_000
    hidden: tuple[int, ...] = (64,)
    core: str = "lstm"
    core_size: int = 64
    base_epsilon: float = 0.4
    epsilon_alpha: float = 7.0
    max_in_flight: int = 2
    max_send_wait: float = 60.0
    learner_prefetch: int = 1
    learner_steps_per_call: int = 4
    publish_every_updates: int = 8
    checkpoint_every_updates: int = 1_000
    replay_checkpoint_seconds: float | None = None
    log_every_updates: int = 50
    eval_every_updates: int = 250

    # R2D2.
    burn_in: int = 10
    sequence_length: int = 20
    n_step: int = 5
    gamma: float = 0.99
    eta: float = 0.9
    rescale_epsilon: float = 1e-3
    learning_rate: float = 1e-3
    adam_eps: float = 1e-3
    max_grad_norm: float = 40.0
    target_update_period: int = 200
    batch_size: int = 32  # type: ignore[assignment]  # a field here, a property of other agents
    """Sequences per update."""

    # Prioritized sequence replay.
    replay_size: int = 10_000
    """Sequences kept."""
    min_replay: int = 200
    priority_exponent: float = 0.9
    importance_exponent: float = 0.6
    samples_per_insert: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.architecture != "sebulba":
            raise ValueError(f"architecture {self.architecture!r} learns on-policy from the envs it plays; R2D2 "
                             f"learns from a replay of sequences: use --architecture sebulba")
        if self.core == "none":
            raise ValueError("R2D2's Q-network is recurrent: give it a core (--core lstm, gru or module:function)")
        check_bounds(self, {
            **dict.fromkeys(("n_step", "batch_size", "target_update_period", "sequence_length"), AT_LEAST_ONE),
            **dict.fromkeys(("learning_rate", "adam_eps", "max_grad_norm", "samples_per_insert", "rescale_epsilon"),
                            POSITIVE),
            **dict.fromkeys(("base_epsilon", "importance_exponent", "eta"), UNIT_INTERVAL),
            **dict.fromkeys(("epsilon_alpha", "priority_exponent", "burn_in"), NON_NEGATIVE),
            "gamma": Bound(0, 1, low_open=True)})
        if self.window % self.trajectory_length:
            raise ValueError(f"burn_in + sequence_length ({self.window}) must be a multiple of trajectory_length "
                             f"({self.trajectory_length}), the period at which sequences start")
        if not self.batch_size <= self.min_replay <= self.replay_size:
            raise ValueError(f"need batch_size ({self.batch_size}) <= min_replay ({self.min_replay}) <= "
                             f"replay_size ({self.replay_size})")

    @property
    def window(self) -> int:
        """Steps of a stored sequence: the burn-in and the steps learned from."""
        return self.burn_in + self.sequence_length

    @property
    def transitions_per_send(self) -> int:
        """The most sequences one actor inserts at once (one per env), for Ape-X's replay table."""
        return self.envs_per_actor

    @property
    def steps_per_update(self) -> float:
        """Env steps behind one update: a sequence is inserted every period, per env."""
        return self.batch_size * self.trajectory_length / self.samples_per_insert


PRESETS: Presets = {
    "CartPoleNoVel-v1": {"target_return": 475.0},
    **dict.fromkeys(MINATAR_IDS, MINATAR),  # Ape-X's: MinAtar's CNN, then the LSTM; played in JAX
}
"""Tuned defaults per env id; every field stays overridable flag by flag."""


def agent(config: R2D2Config) -> Agent:
    """The record ``run.train`` takes; ``agent(config).topology()`` builds its program."""
    record = Agent("r2d2", "jaxdist.agents.r2d2:agent", config, learner_logic="jaxdist.agents.r2d2.learning:logic",
                   policy="jaxdist.agents.r2d2.learning:policy", replay_table="jaxdist.agents.apex:replay_table",
                   sink="jaxdist.agents.r2d2.learning:SequenceSink", prioritized=True)
    if not record.env.action.discrete:
        raise ValueError(f"R2D2 chooses among discrete actions; {config.env_id} has a continuous action space "
                         f"(use PPO or IMPALA)")
    return record


__all__ = ["PRESETS", "R2D2Config", "agent"]
