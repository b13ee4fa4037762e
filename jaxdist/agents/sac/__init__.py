"""Soft Actor-Critic (Haarnoja et al. 2018) as an agent record: the config every off-policy
continuous-control agent shares (``OffPolicyConfig``: the replay, its ratio, n-step
transitions, twin critics with Polyak-averaged targets), SAC's own (``SACConfig``, ``PRESETS``)
and its parts. ``learning.py`` has the math (the tanh-squashed Gaussian policy and its
log-probability, twin-critic targets, the temperature tuned to a target entropy, the jitted
update) and the actors' side (the policy, random actions before learning starts, the sink
that inserts n-step transitions). ``anakin.py`` is the same update with its replay on the
device, for ``--architecture anakin``. TD3 (``jaxdist.agents.td3``) builds on these pieces.
Nothing here imports JAX."""

from __future__ import annotations

import dataclasses
import math

import jaxdist as jd
from jaxdist.agents.experiment import (AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT_INTERVAL, Agent, AgentConfig,
                                       Bound, Presets, check_bounds)

DISCRETE_AGENTS = "PPO (experiments/ppo.py), IMPALA (experiments/impala.py) or Ape-X DQN (experiments/apex_dqn.py)"
"""The agents that act in a discrete action space, named where a continuous-only agent refuses one."""


@dataclasses.dataclass(frozen=True)
class OffPolicyConfig(AgentConfig):
    """An off-policy agent for continuous actions on the replay (SAC, TD3).

    **Actors** step ``envs_per_actor`` envs with the exploring policy (random actions, uniform
    in the action bounds, until the learner has made its first update: the replay holds
    ``learning_starts`` transitions before it may sample) and every ``trajectory_length`` steps
    insert each env's trajectory as ``n_step`` transitions.

    **Replay ratio.** ``replay_ratio`` is gradient updates per env step (SB3's ``train_freq=1,
    gradient_steps=1`` is 1.0). The replay's rate limiter holds it: each update samples
    ``update_batch`` transitions, so samples per insert is ``replay_ratio * update_batch``; actors
    wait for a slow learner and the learner for slow actors, so what is learned per env step
    does not depend on which of them the machine favours. A higher ratio learns more from each
    env step (sample efficiency) and costs more learner time per env step (wall time); below
    1.0 the actors run further ahead of the learning.

    **Replay.** ``replay_size`` transitions, uniform, or with ``prioritized`` drawn with
    probability ``p^priority_exponent / sum p^priority_exponent`` (new transitions at the
    largest priority so far, sampled ones at their new |TD error|) and corrected by importance
    weights ``(P_min / P_i)^importance_exponent``.

    **Learner.** ``learner_steps_per_call`` updates per dispatch (``lax.scan``), their batches
    sampled in one request, ahead of use with ``learner_prefetch``. Twin critics, their targets
    Polyak-averaged at rate ``tau`` after every update. ``total_steps`` env steps set the updates:
    ``(total_steps - learning_starts) * replay_ratio``.

    **Checkpoints.** The learner saves every ``checkpoint_every_updates``; the replay (items,
    priorities and the rate limiter's counts) every ``replay_checkpoint_seconds`` and at a
    stop, so a resumed run keeps the data it had.
    """

    env_id: str = "Pendulum-v1"
    num_actors: int = 1
    envs_per_actor: int = 4
    trajectory_length: int = 8
    total_steps: int = 20_000
    hidden: tuple[int, ...] = (256, 256)
    max_in_flight: int = 2
    max_send_wait: float = 60.0
    learner_steps_per_call: int = 8
    publish_every_updates: int = 8
    checkpoint_every_updates: int = 2_000
    replay_checkpoint_seconds: float | None = 300.0
    log_every_updates: int = 200
    eval_every_updates: int = 1_000

    learning_rate: float = 1e-3
    gamma: float = 0.99
    tau: float = 0.005
    """Polyak rate of the target critics: ``target <- tau * online + (1 - tau) * target``."""
    n_step: int = 1
    update_batch: int = 256
    """Transitions per gradient update, sampled from the replay."""
    replay_ratio: float = 1.0
    """Gradient updates per env step (see the class docstring)."""
    learning_starts: int = 1_000
    """Transitions in the replay before learning starts; actors act at random until then."""
    replay_size: int = 1_000_000
    prioritized: bool = False
    priority_exponent: float = 0.6
    importance_exponent: float = 0.4

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bounds(self, {
            **dict.fromkeys(("n_step", "update_batch", "learning_starts", "replay_size"), AT_LEAST_ONE),
            **dict.fromkeys(("learning_rate", "replay_ratio"), POSITIVE),
            **dict.fromkeys(("tau", "importance_exponent"), UNIT_INTERVAL),
            "priority_exponent": NON_NEGATIVE, "gamma": Bound(0, 1, low_open=True)})
        if self.network == "cnn":
            raise ValueError("the critics take an observation and an action together: use --network mlp (or a "
                             "torso of your own taking both, flattened)")
        if not self.update_batch <= self.learning_starts <= self.replay_size:
            raise ValueError(f"need update_batch ({self.update_batch}) <= learning_starts ({self.learning_starts}) <= "
                             f"replay_size ({self.replay_size})")
        if self.architecture == "anakin" and self.prioritized:
            raise ValueError("--architecture anakin keeps a uniform replay on the device: drop --prioritized")
        if self.architecture == "anakin" and self.n_step > 1:
            raise ValueError("--architecture anakin inserts one-step transitions into its device replay: drop --n-step")

    @property
    def batch_size(self) -> int:
        """What one learner update takes: ``update_batch`` transitions from the replay, or under
        anakin the trajectories of its envs (``num_actors * envs_per_actor``) that it plays and
        inserts into its replay before its gradient updates."""
        if self.architecture == "anakin":
            return self.num_actors * self.envs_per_actor
        return self.update_batch

    @property
    def samples_per_insert(self) -> float:
        return self.replay_ratio * self.update_batch

    @property
    def total_updates(self) -> int:
        """The learner's updates: gradient updates, or under anakin its dispatches, each playing a
        trajectory of every env before its ``trajectory_length * batch_size * replay_ratio``
        gradient updates."""
        if self.architecture == "anakin":
            return max(1, round(self.total_steps / (self.trajectory_length * self.batch_size)))
        return max(1, round(max(0, self.total_steps - self.learning_starts) * self.replay_ratio))

    @property
    def steps_per_update(self) -> float:
        return 1 / self.replay_ratio


@dataclasses.dataclass(frozen=True)
class SACConfig(OffPolicyConfig):
    """SAC (Haarnoja et al. 2018, with the learned temperature of its second paper): a
    tanh-squashed Gaussian policy, twin critics, and the temperature alpha tuned so the
    policy's entropy stays near ``target_entropy`` (default ``-dim(A)``). Actors sample the
    policy; evaluation plays its mean."""

    initial_alpha: float = 1.0
    target_entropy: float | None = None
    """The entropy alpha is tuned to (default: minus the action's dimensions)."""
    autotune_alpha: bool = True
    """False: alpha stays initial_alpha."""
    log_std_min: float = -5.0
    log_std_max: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bounds(self, {"initial_alpha": POSITIVE})
        if not self.log_std_min < self.log_std_max:
            raise ValueError(f"need log_std_min ({self.log_std_min}) < log_std_max ({self.log_std_max})")


PRESETS: Presets = {
    # 64-unit layers reached -200 in as few env steps as 256-unit ones in tuning here, at ~6x the updates/s.
    "Pendulum-v1": {"target_return": -200.0, "hidden": (64, 64), "learning_starts": 500, "eval_every_updates": 500,
                    "replay_size": 50_000},
    "HalfCheetah-v5": {"target_return": 5_000.0, "total_steps": 1_000_000, "learning_starts": 10_000,
                       "learning_rate": 3e-4, "eval_every_updates": 10_000, "eval_episodes": 5,
                       "checkpoint_every_updates": 20_000},
}
"""Tuned defaults per env id (rl-baselines3-zoo's for Pendulum-v1 and HalfCheetah); every field
stays overridable flag by flag."""


def replay_table(config: OffPolicyConfig) -> jd.replay.Uniform | jd.replay.Prioritized:
    """The uniform or prioritized table, rate-limited to ``replay_ratio`` updates per env step.
    Its window leaves room for every actor's largest insert (and a dispatch's batches) on
    either side of the target ratio."""
    spi = config.samples_per_insert
    request = config.update_batch * config.learner_steps_per_call
    error_buffer = math.ceil(spi * config.num_actors * config.envs_per_actor * config.trajectory_length + request
                             + spi)
    limiter = jd.replay.SampleToInsertRatio(spi, config.learning_starts, error_buffer)
    if config.prioritized:
        return jd.replay.Prioritized(config.replay_size, config.priority_exponent, limiter, seed=config.seed)
    return jd.replay.Uniform(config.replay_size, limiter, seed=config.seed)


def continuous_record(name: str, config: OffPolicyConfig, learning: str) -> Agent:
    """The record of an off-policy agent whose math is the module ``learning``: under Sebulba its
    actors insert transitions into the replay; under Anakin the replay is on the device, in the
    learner's state (``learning``'s ``anakin_logic``). A discrete action space is refused."""
    sebulba = config.architecture == "sebulba"
    record = Agent(name, f"jaxdist.agents.{name}:agent", config,
                   learner_logic=f"{learning}:{'logic' if sebulba else 'anakin_logic'}", policy=f"{learning}:policy",
                   replay_table="jaxdist.agents.sac:replay_table",
                   sink="jaxdist.agents.sac.learning:TransitionSink" if sebulba else None,
                   prioritized=config.prioritized)
    if record.env.action.discrete:
        raise ValueError(f"{name.upper()} acts in continuous (Box) action spaces and {config.env_id}'s actions are "
                         f"discrete: use {DISCRETE_AGENTS}")
    return record


def agent(config: SACConfig) -> Agent:
    """The record ``run.train`` takes; ``agent(config).topology()`` builds its program."""
    return continuous_record("sac", config, "jaxdist.agents.sac.learning")


__all__ = ["OffPolicyConfig", "PRESETS", "SACConfig", "agent", "replay_table"]
