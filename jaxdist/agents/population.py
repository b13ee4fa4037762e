"""Several Sebulba runs in one program: a population of N members for population-based
training (``--pbt N`` without ``--architecture anakin``, :class:`Population`), or a sweep's
configurations side by side (:class:`SideBySide`, under the ray and multihost launchers).

Member ``m`` is Sebulba's run of one learner host: a process ``learner/m`` of threads (its
replay, its learner, its evaluator), its share of the actors (``actor/i`` feeds member
``i % N``), in ``<run_dir>/config-<m>`` (its checkpoints, metrics, evaluations, best policy).
Its learner starts from the member's drawn hyperparameters, which it keeps in its state, and
every ``pbt_interval`` updates takes part in the round of the ``pbt`` node, the population's
coordinator (:mod:`jaxdist.learning.population`): the copies go through the members'
checkpoints, so the population runs on every launcher that shares the run directory between
its hosts. The run's ``evaluations.csv`` holds every member's return of each round
(``seed/<m>/mean_return``), ``lineage.csv`` each member's parent and hyperparameters.

A sweep side by side is the same runs without the rounds: configuration ``c``'s run with its
own config, exactly as ``<run_dir>/config-<c>`` holds it when the configurations run one after
another, and a ``sweep`` node that ends the program once every run has evaluated its last.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jaxdist as jd
from jaxdist.agents import sweep
from jaxdist.agents.experiment import (ACTOR_RESTART, LEARNER_RESTART, Agent, Lazy, Policy, actor, actor_policies,
                                       actor_seed, best_policy, evaluator, learner_replay, learner_template, pbt_ranges,
                                       program_name, restore_learner, sebulba_learner, traced_logic)

LEARNER = "learner"
"""A member's learner's name: its checkpoints are ``<run_dir>/config-<m>/checkpoints/learner``."""


@dataclasses.dataclass
class Population:
    """N members, each a learner with its replay, evaluator and actors, and their coordinator."""

    agent: Agent

    def __post_init__(self) -> None:
        agent, config = self.agent, self.agent.config
        self.program = jd.Program(program_name(agent))
        coordinator = self.program.add_node(jd.CourierNode(coordinator_node, agent).with_options(
            restart=ACTOR_RESTART), label="pbt")
        learners, self.acting = add_runs(self.program, [agent] * config.pbt, lambda member, replay: jd.CourierNode(
            member_learner, agent, member, replay, coordinator))
        self.learner = learners[0]
        self.placement = {"pbt": jd.on_host(0), "learner": jd.spread(), "actor": jd.spread()}
        # One run to the monitor: its env steps are every member's actors', and its evaluation return
        # the members' mean; each member's return is in the ranking (sweep.csv).
        self.last_update, self.seeds = config.total_updates, 1

    def checkpoints(self, run_dir: str) -> str:
        return member_checkpoints(run_dir, 0)

    def keeps_best(self, run_dir: str) -> bool:
        """No one policy scored the run's best (the members' mean): each member keeps its own best
        (``load_policy(run_dir, config_index=m, best=True)``)."""
        return False

    def trained(self, run_dir: str, step: int | None, run_seed: int, best: bool) -> Policy:
        """Member ``run_seed``'s latest (or ``step``'s) parameters, or its best evaluated ones."""
        agent, member_dir = self.agent, sweep.config_dir(run_dir, run_seed)
        if best:
            return best_policy(agent, member_dir)
        logic = logic_of(agent, run_seed)
        restored = restore_learner(member_dir, member_checkpoints(run_dir, run_seed), learner_template(logic), step,
                                   f"{agent.config.pbt_interval} updates")
        return Policy(logic.params(restored["state"]), int(restored["step"]), actor_policies(agent),
                      agent.env.obs_shape)


def add_runs(program: jd.Program, agents: list[Agent],
             learner: Callable[[int, jd.Handle], jd.CourierNode]) -> tuple[list[jd.Handle], list[jd.Handle]]:
    """Run ``i`` of ``agents`` as Sebulba's learner host: a process ``learner/i`` of threads (its
    replay, ``learner(i, replay)`` and its evaluator) and ``num_actors`` actors (``actor/j`` feeds
    run ``j % len(agents)``). The learners' and the actors' handles."""
    replays, learners = [], []
    for index, agent in enumerate(agents):
        replay_node = learner_replay(agent)
        replays.append(replay_node.create_handle())
        learner_node = learner(index, replays[-1]).with_options(stops_first=True, restart=LEARNER_RESTART)
        learners.append(learner_node.create_handle())
        evaluator_node = jd.CourierNode(member_evaluator, agent, index, learners[-1])
        program.add_node(jd.ColocationNode([replay_node, learner_node, evaluator_node], mode="threads"),
                         label="learner")
    acting = program.add_group("actor", functools.partial(member_actor, agents, learners, replays),
                               agents[0].config.num_actors * len(agents))
    return learners, acting


def member_checkpoints(run_dir: str, member: int) -> str:
    from jaxdist.learning.layout import checkpoint_dir

    return checkpoint_dir(sweep.config_dir(run_dir, member), LEARNER)


def logic_of(agent: Agent, member: int) -> Any:
    """Member ``member``'s learner logic, from its drawn hyperparameters."""
    from jaxdist.learning.population import member_logic

    return member_logic(functools.partial(traced_logic, agent), sweep.configurations(agent.config)[member])


# Node factories: each runs in its node's own process. ------------------------------------------


def coordinator_node(agent: Agent) -> Any:
    from jaxdist.learning.population import Coordinator

    config, run_dir = agent.config, jd.current_node().run_dir
    return Coordinator(run_dir, [sweep.config_dir(run_dir, member) for member in range(config.pbt)],
                       sweep.configurations(config), final_step=config.total_updates, fraction=config.pbt_fraction,
                       rule=config.pbt_explore, ranges=pbt_ranges(config), exploit=config.pbt_exploit != "none",
                       seed=config.seed)


def member_learner(agent: Agent, member: int, replay: Any, coordinator: Any) -> Any:
    """Member ``member``'s learner: its own seed and directory, saving at every round."""
    from jaxdist.learning.population import Member
    from jaxdist.nodes.learner import CheckpointOptions

    config, run_dir = agent.config, jd.current_node().run_dir
    checkpoints = [member_checkpoints(run_dir, other) for other in range(config.pbt)]
    return sebulba_learner(agent, replay, logic_of(agent, member), run_dir=sweep.config_dir(run_dir, member),
                           name=LEARNER, seed=actor_seed(config.seed, member),
                           checkpointing=CheckpointOptions(save_every_steps=config.pbt_interval, keep=3),
                           population=Member(coordinator, member, config.pbt_interval, checkpoints))


def member_evaluator(agent: Agent, member: int, learner: Any) -> Any:
    """Member (or run) ``member``'s evaluator, in its directory; the program's end is not its own."""
    return evaluator(agent, learner, run_dir=sweep.config_dir(jd.current_node().run_dir, member), ends_program=False)


def member_actor(agents: list[Agent], learners: list[jd.Handle], replays: list[jd.Handle],
                 index: int) -> jd.CourierNode:
    """Actor ``index``, of member (or run) ``index % N``: the actor group's factory."""
    member = index % len(learners)
    return jd.CourierNode(actor, agents[member], index, learners[member], replays[member]).with_options(
        restart=ACTOR_RESTART)


# A sweep side by side ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SideBySide:
    """A Sebulba sweep to train side by side: the record ``train`` launches as one program of
    every configuration's run (:class:`Together`), where a launcher has hosts to spread them
    over (ray, multihost); each run is the one ``<run_dir>/config-<c>`` would hold had it run
    alone, so the ranking, ``load_policy`` and a relaunch read it as they read those."""

    agent: Agent

    @property
    def name(self) -> str:
        return self.agent.name

    @property
    def factory(self) -> str:
        return self.agent.factory

    @property
    def config(self) -> Any:
        return self.agent.config

    def topology(self) -> Together:
        return Together(self.agent)


@dataclasses.dataclass
class Together:
    """Each configuration's Sebulba run (its learner process and actors) beside the others', in
    ``<run_dir>/config-<c>``, placed by the launcher; a ``sweep`` node ends the program once every
    run's final version is evaluated."""

    agent: Agent

    def __post_init__(self) -> None:
        agent, config = self.agent, self.agent.config
        self.runs = [Lazy(agent.factory)(sweep.configured(config, values)) for values in sweep.configurations(config)]
        self.program = jd.Program(program_name(agent))
        self.program.add_node(jd.CourierNode(finish_node, agent), label="sweep")
        learners, self.acting = add_runs(self.program, self.runs, lambda index, replay: jd.CourierNode(
            run_learner, self.runs[index], index, replay))
        self.learner = learners[0]
        self.placement = {"sweep": jd.on_host(0), "learner": jd.spread(), "actor": jd.spread()}
        self.last_update, self.seeds = config.total_updates, 1

    def checkpoints(self, run_dir: str) -> str:
        """The checkpoints of the run that has saved the fewest updates: the sweep is over once it is."""
        from jaxdist.learning.layout import saved_update

        directories = [run.topology().checkpoints(sweep.config_dir(run_dir, index))
                       for index, run in enumerate(self.runs)]
        return min(directories, key=lambda directory: saved_update(directory) or 0)

    def keeps_best(self, run_dir: str) -> bool:
        return False  # each run keeps its own: load_policy(run_dir, config_index=c, best=True)

    def trained(self, run_dir: str, step: int | None, run_seed: int, best: bool) -> Policy:
        return self.runs[run_seed].topology().trained(sweep.config_dir(run_dir, run_seed), step, 0, best)


def finish_node(agent: Agent) -> Any:
    from jaxdist.learning.population import Finish

    run_dir = jd.current_node().run_dir
    return Finish([sweep.config_dir(run_dir, index) for index in range(len(sweep.configurations(agent.config)))],
                  agent.config.total_updates)


def run_learner(run: Agent, index: int, replay: Any) -> Any:
    """Configuration ``index``'s learner, as its Sebulba run alone has it: its name, its directory."""
    run_dir = sweep.config_dir(jd.current_node().run_dir, index)
    return sebulba_learner(run, replay, config_dir=run_dir, run_dir=run_dir, name=run.topology().learner.node_name)
