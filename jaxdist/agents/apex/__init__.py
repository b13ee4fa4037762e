"""Ape-X DQN (Horgan et al. 2018) as an agent record: its config (``ApexConfig``, ``PRESETS``)
and its parts. ``learning.py`` has the math (n-step returns, initial priorities, double-DQN
targets, the importance-weighted loss, the dueling Q-network, the jitted update) and the
actors' side (the epsilon schedule, the epsilon-greedy policy and the sink that inserts n-step
transitions with priorities). The learner writes priorities back; the topology is the
config's architecture (Sebulba). Nothing here imports JAX."""

from __future__ import annotations

import dataclasses
import math

import jaxdist as jd
from jaxdist.agents.experiment import (AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT_INTERVAL, Agent, AgentConfig, Bound,
                                       Presets, check_bounds)
from jaxdist.envs.gymnax_as_gym import MINATAR_IDS


@dataclasses.dataclass(frozen=True)
class ApexConfig(AgentConfig):
    """Ape-X DQN (Horgan et al. 2018) on the actor-learner topology. In tuning on CartPole-v1,
    the 5-step horizon sped learning up most; copying the target network every 50 updates was
    faster still but let Q-values diverge in one run, 100 did not. On two shared cores, 2
    actors of 8 envs reached the target sooner than 4 of 4 (fewer processes and policy calls for
    the same env steps), and the learner's updates, not the actors, set the pace; evaluating
    every 1,000 updates rather than 250, and publishing every 16 rather than 2, left it more.

    **Actors.** Actor i of N explores with epsilon ``base_epsilon ** (1 + epsilon_alpha * i /
    (N - 1))`` (Horgan et al. 2018: 0.4 and 7; one actor: 0.4), steps ``envs_per_actor`` envs
    and every ``trajectory_length`` steps turns each env's trajectory into ``n_step``
    transitions, each inserted with its initial priority: its |n-step TD error| under the
    actor's own Q-values. The evaluator plays the greedy policy.

    **Replay.** A prioritized table of ``replay_size`` transitions, drawn with probability
    ``p^priority_exponent / sum p^priority_exponent`` and corrected by importance weights
    ``(P_min / P_i)^importance_exponent``. A rate limiter keeps the learner's samples near
    ``samples_per_insert`` times the inserted transitions once ``min_replay`` are stored:
    actors wait for a slow learner and the learner for slow actors, so how fast each runs on a
    shared CPU does not change what is learned per env step.

    **Learner.** Double DQN on batches of ``batch_size`` with Adam and a Huber loss; the target
    network is copied from the online one every ``target_update_period`` updates; after every
    dispatch of ``learner_steps_per_call`` updates (their batches sampled in one request, ahead
    of use) the sampled transitions get their new priorities, written behind the learner.
    ``total_steps`` env steps set the number of updates: ``total_steps * samples_per_insert /
    batch_size``.

    **Checkpoints.** The learner saves every ``checkpoint_every_updates``; the replay (items,
    priorities and the rate limiter's counts) every ``replay_checkpoint_seconds`` and at a stop,
    so a preempted or crashed run resumes with the data it had rather than refilling
    ``min_replay`` first (None: the replay is not saved).
    """

    num_actors: int = 2
    envs_per_actor: int = 8
    total_steps: int = 400_000
    hidden: tuple[int, ...] = (128, 128)
    base_epsilon: float = 0.4
    epsilon_alpha: float = 7.0
    max_in_flight: int = 2
    max_send_wait: float = 60.0
    learner_prefetch: int = 1
    learner_steps_per_call: int = 8
    publish_every_updates: int = 16
    checkpoint_every_updates: int = 1_000
    replay_checkpoint_seconds: float | None = 300.0
    log_every_updates: int = 100
    eval_every_updates: int = 1_000

    # Ape-X DQN.
    n_step: int = 5
    gamma: float = 0.99
    dueling: bool = True
    learning_rate: float = 5e-4
    adam_eps: float = 1e-5
    max_grad_norm: float = 10.0
    huber_delta: float = 1.0
    target_update_period: int = 100
    batch_size: int = 128  # type: ignore[assignment]  # a field here, a property of other agents
    """Transitions per update."""

    # Prioritized replay.
    replay_size: int = 100_000
    min_replay: int = 2_000
    priority_exponent: float = 0.6
    importance_exponent: float = 0.4
    samples_per_insert: float = 16.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.architecture != "sebulba":
            raise ValueError(f"architecture {self.architecture!r} learns on-policy from the envs it plays; Ape-X "
                             f"learns from a replay of transitions: use --architecture sebulba")
        if self.inference == "central":
            raise ValueError("Ape-X's actors explore each with its own epsilon, and an inference node plays one "
                             "policy for all: use --inference actor")
        check_bounds(self, {
            **dict.fromkeys(("n_step", "batch_size", "target_update_period"), AT_LEAST_ONE),
            **dict.fromkeys(("learning_rate", "adam_eps", "max_grad_norm", "huber_delta", "samples_per_insert"),
                            POSITIVE),
            **dict.fromkeys(("base_epsilon", "importance_exponent"), UNIT_INTERVAL),
            **dict.fromkeys(("epsilon_alpha", "priority_exponent"), NON_NEGATIVE),
            "gamma": Bound(0, 1, low_open=True)})
        if not self.batch_size <= self.min_replay <= self.replay_size:
            raise ValueError(f"need batch_size ({self.batch_size}) <= min_replay ({self.min_replay}) <= "
                             f"replay_size ({self.replay_size})")

    @property
    def transitions_per_send(self) -> int:
        """The most transitions one actor inserts at once: one per env and step of a trajectory."""
        return self.envs_per_actor * self.trajectory_length

    @property
    def steps_per_update(self) -> float:
        """Env steps behind one update at the rate limiter's ratio."""
        return self.batch_size / self.samples_per_insert


ATARI = {"network": "cnn", "env_backend": "envpool", "num_actors": 2, "envs_per_actor": 16, "total_steps": 12_500_000,
         "n_step": 3, "gamma": 0.99, "learning_rate": 6.25e-5, "adam_eps": 1.5e-4, "max_grad_norm": 40.0,
         "batch_size": 512, "target_update_period": 2_500, "replay_size": 100_000, "min_replay": 20_000,
         "samples_per_insert": 8.0, "replay_checkpoint_seconds": None, "eval_episodes": 4,
         "eval_every_updates": 2_500, "checkpoint_every_updates": 2_500}
"""Atari through EnvPool (``jaxdist.envs.atari``), 50M frames (12.5M env steps of 4 frames);
not tuned here. Horgan et al. 2018's learner: 3-step returns, batches of 512, the target
network copied every 2,500 updates, a gradient norm clipped at 40, a learning rate of
0.00025 / 4 (with Adam, and Rainbow's epsilon, for their centred RMSProp); DQN's replay ratio
(a batch of 32 every 4 env steps: 8 samples per insert) for their 360 actors' far higher rate.

**Memory.** A transition stores its observation and its n-step successor's, two 84x84x4 uint8
stacks, and an action, a return and a discount: 56,460 bytes. The replay holds 100,000
transitions, 5.6 GB (Horgan et al. held 2M); each ``--replay-size`` of 100,000
more takes 5.6 GB more. The replay is not saved (``--replay-checkpoint-seconds`` saves it, 5.6
GB each time): a resumed run refills ``min_replay`` (1.1 GB) first."""

MINATAR = {"network": "cnn", "env_backend": "jax"}
"""MinAtar (gymnax): MinAtar's CNN, its envs played in JAX a trajectory per dispatch; not tuned here."""

PRESETS: Presets = {
    "CartPole-v1": {"target_return": 475.0},
    "Pong-v5": {**ATARI, "target_return": 18.0},
    "Breakout-v5": {**ATARI, "target_return": 400.0},
    **dict.fromkeys(MINATAR_IDS, MINATAR),
}
"""Tuned defaults per env id; every field stays overridable flag by flag."""


def replay_table(config: ApexConfig) -> jd.replay.Prioritized:
    """The prioritized table, rate-limited to ``samples_per_insert``. Its window leaves room for
    every actor's largest insert (and one learner request: a dispatch's batches) on either side
    of the target ratio."""
    spi = config.samples_per_insert
    request = config.batch_size * config.learner_steps_per_call
    error_buffer = math.ceil(spi * config.num_actors * config.transitions_per_send + request + spi)
    limiter = jd.replay.SampleToInsertRatio(spi, config.min_replay, error_buffer)
    return jd.replay.Prioritized(config.replay_size, config.priority_exponent, limiter, seed=config.seed)


def agent(config: ApexConfig) -> Agent:
    """The record ``run.train`` takes; ``agent(config).topology()`` builds its program."""
    record = Agent("apex", "jaxdist.agents.apex:agent", config, learner_logic="jaxdist.agents.apex.learning:logic",
                   policy="jaxdist.agents.apex.learning:policy", replay_table="jaxdist.agents.apex:replay_table",
                   sink="jaxdist.agents.apex.learning:TransitionSink", prioritized=True)
    if not record.env.action.discrete:
        raise ValueError(f"DQN chooses among discrete actions; {config.env_id} has a continuous action space "
                         f"(use PPO or IMPALA)")
    return record


__all__ = ["ApexConfig", "PRESETS", "agent"]
