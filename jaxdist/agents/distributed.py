"""The one actor-learner topology every agent's program is built on (Acme's
``make_distributed_experiment``): ``agent.topology()`` builds the program of an ``Agent``.

    learner/h     one process per learner host h (``learner_hosts``), threads of it:
                  learner/h/0 the agent's replay table (a FIFO for on-policy agents,
                  prioritized for Ape-X); learner/h/1 the generic Learner (host 0's serves the
                  parameters: ``get``); on host 0, learner/0/2 the Evaluator: every
                  ``eval_every_updates`` it plays ``eval_episodes`` episodes with the
                  deterministic policy, and its mean return is the reported and target metric
    evaluator/0   the Evaluator instead, in a process of its own on host 0, when the learner
                  spans hosts: there every Orbax save in a learner process is collective, and
                  the evaluator saves the best policy alone
    actor/i       Actor nodes: a vector env each, acting with the agent's policy and sending
                  trajectories (or, through the agent's sink, transitions) to the replay of host
                  i % learner_hosts; one factory (``actor_node``) makes them all, so the group
                  grows and shrinks while it runs (``running.scale("actor", n)``): the learner
                  reads the replay, not the actors, and the monitor follows the group's members

With ``architecture="anakin"`` (``jaxdist.agents.anakin``) there are no actors and no replay:
each learner plays its own envs, written in JAX, inside its update.

The evaluator shares the learner's process rather than having its own (unless the learner spans
hosts): on a small machine a process of its own costs a JAX start-up and a compilation that every
other process waits on, while its evaluations are short and come every few updates.

Training ends inside the program: the evaluator calls ``jd.stop()`` once it has evaluated the
learner's last version: at ``max_steps``, or, with ``stop_at_target``, where the learner finished
when asked at the first evaluation to reach the target (a learner spanning hosts is stopped
there instead). Under Anakin the learner ends it, after its last update and that update's
evaluation, or its evaluations' recorder at the target. So
``jd.launch(agent.topology().program).wait()`` returns. Every node is built in its own process by a
plain factory function below, from the agent record; learners are stopped first and restart
from their checkpoint (node options, not class attributes).

Building the program has no side effects and is deterministic (every host of a multihost run
builds the same one), and imports no JAX: a node's process imports what its node needs.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from collections.abc import Callable
from typing import Any

import jaxdist as jd
from jaxdist.agents.config import AgentConfig, check_network_input, save
from jaxdist.envs.spaces import EnvInfo
from jaxdist.envs.vector import EnvSpec

SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
"""Small XLA computations on a shared CPU: one thread each, no pool hand-offs."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """The program, where its groups go (the multihost launcher's ``placement``), and the
    handles a watcher (``jaxdist.agents.monitor``) polls: host 0's learner (``status()``) and the
    actors (``stats()``, ``episodes(since)``). ``last_update``: the learner's last update, where
    it is known before training (a run whose learner has saved it is over)."""

    program: jd.Program
    learner: jd.Handle
    actors: list[jd.Handle]
    placement: dict[str, Any]
    last_update: int | None = None


@dataclasses.dataclass(frozen=True)
class Agent:
    """An algorithm as a small set of components over one config (all picklable, none
    importing JAX until called, so launching processes and actors stay light):

    - ``learner_logic(config, env) -> LearnerLogic``: the pure ``(init, update)`` (``Lazy`` when
      its module imports JAX);
    - ``policy(config, env, actor) -> policy``: what actor ``actor`` runs, or with ``actor``
      None the deterministic policy of evaluation and ``load_policy``; a policy is
      ``(params, obs, key) -> (action, extras)`` (see ``jaxdist.nodes.actor``);
    - ``replay_table(config) -> table``: one learner host's table;
    - ``sink(config, replay_client) -> sink``: what actors send through (None: trajectories
      go to the replay as they are);
    - ``prioritized``: the learner samples keys and probabilities and writes new priorities
      (its update's ``metrics["priorities"]``) back after every update.
    """

    name: str
    config: AgentConfig
    env: EnvInfo
    learner_logic: Callable[[Any, EnvInfo], Any]
    policy: Callable[[Any, EnvInfo, int | None], Any]
    replay_table: Callable[[Any], Any]
    sink: Callable[[Any, Any], Any] | None = None
    prioritized: bool = False

    def __post_init__(self) -> None:
        check_network_input(self.config.network, self.config.env_id, self.env.obs_shape)

    def topology(self) -> Topology:
        if self.config.architecture == "anakin":
            return self._anakin_topology()
        config = self.config
        program = jd.Program(f"{self.name}-{env_slug(config.env_id)}")
        hosts = config.learner_hosts
        replays, learners = [], []
        for host in range(hosts):
            replay_node = jd.ReplayNode(self.replay_table(config),
                                        checkpoint=config.replay_checkpoint_seconds is not None,
                                        checkpoint_every_seconds=config.replay_checkpoint_seconds)
            replay = replay_node.create_handle()
            learner_node = jd.CourierNode(build_learner, self, replay).with_options(
                stops_first=True, restart=LEARNER_RESTART)
            parts = [replay_node, learner_node]
            learners.append(learner_node.create_handle())
            if hosts == 1:
                parts.append(jd.CourierNode(build_evaluator, self, learners[0]))
            program.add_node(jd.ColocationNode(parts, mode="threads"), label="learner")
            replays.append(replay)
        # One factory for every actor, so the group grows and shrinks as it runs (running.scale).
        actors = program.add_group("actor", functools.partial(actor_node, self, learners[0], replays), config.num_actors)
        # A learner process (with its replay) on each of the first learner_hosts hosts, actors
        # round-robin over the hosts (actor i beside the replay it feeds when every host has a learner).
        placement = {"learner": jd.per_host() if hosts > 1 else jd.on_host(0), "actor": jd.spread()}
        if hosts > 1:
            program.add_node(jd.CourierNode(build_evaluator, self, learners[0]), label="evaluator")
            placement["evaluator"] = jd.on_host(0)
        return Topology(program, learners[0], actors, placement, config.total_updates)

    def _anakin_topology(self) -> Topology:
        """A learner process per learner host that plays and evaluates its own envs
        (``jaxdist.agents.anakin``); no actors, no replay, no evaluator node."""
        config = self.config
        if self.sink is not None or self.prioritized:
            raise ValueError(f"architecture='anakin' runs on-policy agents (a batch of trajectories per update); "
                             f"{self.name} learns from replayed transitions: use architecture='sebulba'")
        program = jd.Program(f"{self.name}-{env_slug(config.env_id)}")
        with program.group("learner"):
            learners = [program.add_node(jd.CourierNode(build_learner, self, None).with_options(
                stops_first=True, restart=LEARNER_RESTART)) for _ in range(config.learner_hosts)]
        placement = {"learner": jd.per_host() if config.learner_hosts > 1 else jd.on_host(0)}
        return Topology(program, learners[0], [], placement, config.total_updates)


@dataclasses.dataclass(frozen=True)
class Lazy:
    """The function ``target`` (``"module:name"``), imported at its first call: an agent's learner
    logic lives in a module that imports JAX, which the launching process never needs."""

    target: str

    def __call__(self, *args: Any) -> Any:
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)(*args)


LEARNER_RESTART = jd.Restart(max_restarts=10, backoff=1.0)
ACTOR_RESTART = jd.Restart(max_restarts=10, backoff=0.5)


def resources(program: jd.Program, compilation_cache: str | None = None) -> dict[str, dict[str, Any]]:
    """Per-group environment for the processes launcher: the learners on ``JAX_PLATFORMS`` (unset:
    JAX's own choice, a GPU or TPU where there is one), every other node on CPU (an accelerator is
    one process's: a TPU opens in one process only, and every process on a GPU would take most of
    its memory); single-threaded XLA, and optionally a persistent compilation cache shared by every
    process."""
    env = {"XLA_FLAGS": SINGLE_THREAD_XLA}
    if compilation_cache:
        env.update(JAX_COMPILATION_CACHE_DIR=compilation_cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    learner_platforms = os.environ.get("JAX_PLATFORMS", "")
    return {group: {"env": {**env, "JAX_PLATFORMS": learner_platforms if group == "learner" else "cpu"}}
            for group in program.groups}


def fifo(config: AgentConfig) -> Any:
    """An on-policy agent's ``replay_table``: one learner host's FIFO of trajectories, its share
    of ``queue_size``; a full one makes actors wait (bounding the policy lag)."""
    return jd.replay.Fifo(max_size=config.queue_size // config.learner_hosts)


def env_slug(env_id: str) -> str:
    """``CartPole-v1`` -> ``cartpole``; ``my_envs:Maze-v0`` -> ``maze``: for run and program names."""
    return env_id.rpartition(":")[2].lower().rsplit("-v", 1)[0]


def actor_seed(seed: int, index: int) -> int:
    """Distinct per actor and run; spaced so sync/async sub-envs (seed + i) never collide."""
    return seed * 1_000_003 + index * 10_007


def env_spec(config: AgentConfig, num_envs: int) -> EnvSpec:
    """The actors' envs, or the evaluator's (one episode per env): with the JAX backend it plays
    all its episodes in one jitted call, on the port that is checked against gymnasium's env."""
    return EnvSpec(config.env_id, num_envs, config.env_backend)


# Node factories: each runs in its node's own process, where handles have become clients. ------


def build_learner(agent: Agent, replay: Any) -> Any:
    from jaxdist.nodes.learner import Learner

    config = agent.config
    save(jd.current_node().run_dir, agent.name, config)  # the run's config, however it was launched
    multihost = config.learner_hosts > 1
    after_update = None
    if agent.prioritized:
        from jaxdist.nodes.replay import PriorityWriter

        after_update = PriorityWriter(replay)
    logic, source, mode = agent.learner_logic(config, agent.env), replay, config.learner_mode
    fed_by_actors_on_policy = config.architecture == "sebulba" and not agent.prioritized
    if config.architecture == "anakin":
        from jaxdist.agents import anakin

        logic, source = anakin_logic(agent), anakin.no_batch
        if not multihost:  # one host: every local device plays its own envs (a multihost learner says its mode)
            import jax

            mode = "pmap" if jax.local_device_count() > 1 else "jit"
        after_update = anakin.EvaluationRecorder(jd.current_node().run_dir, config.target_return, config.stop_at_target)
    return Learner(
        logic, source, batch_size=config.batch_size // config.learner_hosts,
        mode=mode, steps_per_call=config.learner_steps_per_call,
        publish_every=config.publish_every_updates, seed=config.seed,
        max_steps=config.total_updates, log_every=config.log_every_updates,
        checkpoint={"save_every_steps": config.checkpoint_every_updates, "keep": 2}, prefetch=config.learner_prefetch,
        replay_options={"field": None if agent.prioritized else "data", "end_on_stop": not multihost},
        distributed="env" if multihost else None, after_update=after_update,
        end_program=config.architecture == "anakin",  # else the evaluator ends it, after the final version
        # Updates dispatched ahead of their results only age on-policy data (its lag counts
        # dispatched updates); across processes an update waits on the slowest host anyway.
        block_every=1 if multihost or fed_by_actors_on_policy else None)


def anakin_logic(agent: Agent) -> Any:
    """The learner logic of an Anakin run of ``agent`` (what its learner and ``load_policy`` build)."""
    from jaxdist.agents import anakin

    config = agent.config
    return anakin.logic(agent.learner_logic(config, agent.env), agent.policy(config, agent.env, 0),
                        agent.policy(config, agent.env, None), config.env_id, config.batch_size // config.learner_hosts,
                        config.trajectory_length, num_seeds=config.num_seeds, eval_every=config.eval_every_updates,
                        eval_episodes=config.eval_episodes, final_version=config.total_updates)


def actor_node(agent: Agent, params: jd.Handle, replays: list[jd.Handle], index: int) -> jd.CourierNode:
    """Actor ``index``, feeding the replay of learner host ``index % hosts``: the actor group's
    factory, for the actors at launch and for those ``running.scale("actor", n)`` adds."""
    return jd.CourierNode(build_actor, agent, index, params, replays[index % len(replays)]).with_options(
        restart=ACTOR_RESTART)


def build_actor(agent: Agent, index: int, params: Any, replay: Any) -> Any:
    from jaxdist.nodes.actor import Actor

    config = agent.config
    sink = replay if agent.sink is None else agent.sink(config, replay)
    return Actor(agent.policy(config, agent.env, index), env_spec(config, config.envs_per_actor), params, sink,
                 trajectory_length=config.trajectory_length, seed=actor_seed(config.seed, index),
                 refresh_every_seconds=config.param_refresh_seconds, max_in_flight=config.max_in_flight,
                 max_send_wait=config.max_send_wait,
                 params_like=functools.partial(published_shapes, agent) if config.env_backend == "jax" else None)


def published_shapes(agent: Agent) -> Any:
    """The shapes and dtypes of what the learner publishes, from its logic, without running it."""
    import jax

    logic = agent.learner_logic(agent.config, agent.env)
    return jax.eval_shape(lambda key: logic.params(logic.init(key)), jax.random.key(0))


def build_evaluator(agent: Agent, params: Any) -> Any:
    from jaxdist.nodes.evaluator import Evaluator

    config = agent.config
    return Evaluator(agent.policy(config, agent.env, None), env_spec(config, config.eval_episodes), params,
                     every_updates=config.eval_every_updates, seed=actor_seed(config.seed, config.num_actors + 1),
                     target_return=config.target_return, stop_at_target=config.stop_at_target,
                     final_version=config.total_updates,
                     # At the target one learner process finishes there, so that the policy it saves
                     # is evaluated; the processes of a learner spanning hosts stop together instead.
                     finish_learner=config.learner_hosts == 1, save_best=True)
