"""OpenAI-ES as an agent record: its config (``ESConfig``, per-env ``PRESETS``) and its program.

ES keeps its own program, a pool rather than actors and a learner:

    worker/i   ``Worker`` nodes (``nodes.py``): jitted rollouts of perturbations of the
               master's parameters, regenerated from noise seeds
    master/0   the driver (``Master``): runs the generations, maps tasks of seeds over the
               workers with futures through a ``jd.Pool``, serves the parameters they pull,
               checkpoints, scores the mean policy, and ends the program (``jd.stop()``)

and implements the topology protocol (``jaxdist.agents.experiment.Topology``) the actor-learner
agents' architectures do, so that the command line, the monitor (``jaxdist.agents.run``) and
``load_policy`` treat it as them: the master stands for the learner, the workers for the actors. The math is in
``learning.py``, the policy in ``policy.py``, the batched episodes and the
master's state in ``search.py``. Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jaxdist as jd
from jaxdist.agents.experiment import (AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, SEED, Bound, Lazy, Policy, Presets,
                                       check_bounds, check_choices, learner_checkpoints, program_name)

PRESETS: Presets = {
    # A CartPole episode starts within 0.05 of upright, so one episode ranks a member well.
    "CartPole-v1": {"episodes_per_member": 1, "total_steps": 3_000_000, "target_return": 475.0},
    # A Pendulum episode starts at any angle, so a member is ranked on eight start states: with
    # four, the noise of the ranking left the mean policy of some seeds hovering near -200.
    "Pendulum-v1": {"episodes_per_member": 8, "total_steps": 40_000_000, "target_return": -200.0},
}
"""Per env id: the values of the fields left None. ES runs only the envs it has JAX ports of."""

MASTER_RESTART = jd.Restart(max_restarts=3, backoff=1.0)
WORKER_RESTART = jd.Restart(max_restarts=10, backoff=0.5)


@dataclasses.dataclass(frozen=True)
class ESConfig:
    """OpenAI-ES (Salimans et al. 2017). The defaults reach CartPole-v1 >= 475 and Pendulum-v1
    >= -200 (the mean policy's mean return over ``eval_episodes`` fresh episodes); fields left
    None take the env's value from ``PRESETS``. Each generation's ``population`` is evaluated in
    tasks of ``pairs_per_task`` antithetic pairs spread over the workers, every member on the
    generation's ``episodes_per_member`` start states (evaluation episodes count no env steps)."""

    env_id: Literal["CartPole-v1", "Pendulum-v1"] = "CartPole-v1"
    """An env with a JAX port of its dynamics (jaxdist/envs/jax_envs.py); picks its preset."""
    seed: int = 0
    num_workers: int = 2
    """Worker nodes: ES's actors."""

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
    """The evaluation return whose first crossing is timed (None: the env's preset)."""
    stop_at_target: bool = False
    """End the run once an evaluation of the mean policy reaches target_return."""
    eval_episodes: int = 20
    """Fresh episodes that score the mean policy after each generation."""
    pairs_per_task: int = 8
    """Antithetic pairs per task sent to a worker."""
    checkpoint_every_generations: int = 10
    task_timeout: float = 120.0
    """Seconds the pool (jd.Pool) gives each call."""
    backup_after: float = 3.0
    """Seconds after which the pool runs a backup copy of a task still running on an idle worker."""
    unavailable_timeout: float = 300.0
    """Seconds without any worker answering after which the pool gives up."""

    def __post_init__(self) -> None:
        if self.env_id not in PRESETS:
            raise ValueError(f"ES here runs {', '.join(PRESETS)} (JAX ports of their dynamics); "
                             f"got {self.env_id!r}")
        check_choices(self)
        for name, value in PRESETS[self.env_id].items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        object.__setattr__(self, "hidden", tuple(self.hidden))
        check_bounds(self, {
            **dict.fromkeys(("num_workers", "population", "pairs_per_task", "episodes_per_member", "total_steps",
                             "eval_episodes", "checkpoint_every_generations", "hidden"), AT_LEAST_ONE),
            **dict.fromkeys(("sigma", "learning_rate", "task_timeout", "backup_after", "unavailable_timeout"),
                            POSITIVE),
            "seed": SEED, "momentum": Bound(0, 1, high_open=True), "weight_decay": NON_NEGATIVE})
        if self.population % (2 * self.pairs_per_task):
            raise ValueError(f"population {self.population} must split into antithetic pairs in tasks of "
                             f"{self.pairs_per_task} pairs: make it a multiple of {2 * self.pairs_per_task}")

    @property
    def pairs(self) -> int:
        return self.population // 2


@dataclasses.dataclass(frozen=True)
class ES:
    """What ``run.train`` launches and watches: ``train(es.agent(config))``."""

    config: ESConfig
    name: str = "es"
    factory: str = "jaxdist.agents.es:agent"

    def topology(self) -> ESTopology:
        """ES's own program, behind the protocol every architecture implements."""
        return ESTopology(self)


@dataclasses.dataclass
class ESTopology:
    """The master and the workers call each other: the master's node is made first, with the
    list its workers' handles are added to (arguments travel only at launch). Crashed nodes
    come back (node options): a worker afresh (the pool gives its task to the others
    meanwhile), the master from its checkpoint; a stop reaches the master first, while its
    workers still serve the generation in flight. The workers make (and count) the env steps."""

    es: ES

    def __post_init__(self) -> None:
        config = self.es.config
        self.program = jd.Program(program_name(self.es))
        workers: list[jd.Handle] = []
        # The nodes are named, as an agent's parts are: they import what the record must not know.
        master_node = jd.CourierNode(Lazy("jaxdist.agents.es.nodes:Master"), workers, config, self.es.factory).with_options(
            restart=MASTER_RESTART, stops_first=True)
        self.learner = master_node.create_handle()
        with self.program.group("worker"):
            workers.extend(self.program.add_node(jd.CourierNode(Lazy("jaxdist.agents.es.nodes:Worker"), self.learner,
                                                                config).with_options(restart=WORKER_RESTART))
                           for _ in range(config.num_workers))
        with self.program.group("master"):
            self.program.add_node(master_node)
        self.acting, self.placement = workers, {"master": jd.on_host(0), "worker": jd.spread()}
        self.last_update, self.seeds = None, 1

    def checkpoints(self, run_dir: str) -> str:
        return learner_checkpoints(run_dir, self.learner)

    def keeps_best(self, run_dir: str) -> bool:
        return False

    def trained(self, run_dir: str, step: int | None, run_seed: int, best: bool) -> Policy:
        """The master's mean parameters, played greedily by its flat-vector MLP."""
        if best:
            raise FileNotFoundError(f"{run_dir} has no best policy: ES keeps only its mean parameters; load the "
                                    f"latest checkpoint's (best=False)")
        return Lazy("jaxdist.agents.es.search:trained")(self.es.config, run_dir, self.checkpoints(run_dir), step)


agent = ES  # es.agent(config), as ppo.agent(config): the record run.train takes


__all__ = ["ES", "ESConfig", "PRESETS", "agent"]
