"""PPO as a jaxdist program: ``make_program(config)``.

    learner/h   one process per learner host h (one in all unless ``learner_hosts`` > 1): a FIFO
                replay node and the generic Learner, colocated as threads (learner/h/0 the
                queue, learner/h/1 the learner; learner/0/1 also serves parameters)
    actor/i     Actor nodes: a vector env of ``envs_per_actor`` envs each, sending trajectories
                to the queue of host i % learner_hosts and fetching parameters from the
                learner's ``get_params``

Building the program has no side effects and is deterministic (the same config builds the
same program on every host). It imports no JAX: every node's process imports what its node
needs when it starts (with spawn, each child also re-imports the launching script), so a
launching process and actors that never import optax, orbax or the learner start faster.
"""

from __future__ import annotations

import functools
from typing import Any

import jaxdist as jd
from jaxdist.agents.common import FifoLearner, actor_seed, cpu_resources
from jaxdist.agents.ppo.acting import PolicyStep
from jaxdist.agents.ppo.config import PPOConfig, PPOHyperparams
from jaxdist.envs import EnvSpec
from jaxdist.nodes.actor import Actor



def queue_name(host: int) -> str:
    return f"learner/{host}/0"


def learner_name(host: int) -> str:
    return f"learner/{host}/1"


QUEUE, LEARNER = queue_name(0), learner_name(0)


def learner_logic(hp: PPOHyperparams) -> Any:
    """PPO's ``LearnerLogic`` for the generic ``jaxdist.nodes.learner.Learner``."""
    from jaxdist.agents.ppo import learning
    from jaxdist.nodes.learner import LearnerLogic

    return LearnerLogic(init=functools.partial(learning.init, hp), update=functools.partial(learning.update, hp))


def make_program(config: PPOConfig) -> jd.Program:
    hp = config.hyperparams()
    program = jd.Program(f"ppo-{config.env_id.lower()}")
    hosts = config.learner_hosts
    queues = [jd.Handle(queue_name(host)) for host in range(hosts)]
    for host, queue in enumerate(queues):
        learner_node = jd.CourierNode(
            FifoLearner, learner_logic, hp, queue, config.batch_size // hosts, mode=config.learner_mode,
            publish_every=1, seed=config.seed, max_steps=config.total_updates, log_every=config.log_every_updates,
            checkpoint={"save_every_steps": config.checkpoint_every_updates, "keep": 2},
            prefetch=config.learner_prefetch, distributed="env" if hosts > 1 else None,
            # Across processes an update waits on the slowest host: dispatching ahead of it
            # would only age the on-policy data (the lag counts dispatched updates).
            cpu_block_every=1 if hosts > 1 else 8)
        fifo = jd.ReplayNode(jd.replay.Fifo(max_size=config.queue_size // hosts))
        handles = program.add_node(jd.ColocationNode([fifo, learner_node], mode="threads"), label="learner")
        assert [h.node_name for h in handles] == [queue_name(host), learner_name(host)], handles
    learner = jd.Handle(LEARNER)
    policy = PolicyStep(hp.num_actions, hp.hidden, with_value=not hp.recompute_values)
    env = EnvSpec(config.env_id, config.envs_per_actor, config.env_backend)
    with program.group("actor"):
        for i in range(config.num_actors):
            program.add_node(jd.CourierNode(
                Actor, policy, env, learner, queues[i % hosts], trajectory_length=config.trajectory_length,
                seed=actor_seed(config.seed, i), params_method="get_params",
                refresh_every_seconds=config.param_refresh_seconds, max_in_flight=config.max_in_flight))
    return program


def placement(config: PPOConfig) -> dict[str, Any]:
    """For the multihost launcher: a learner process on every host (``learner_hosts`` of them),
    actors round-robin over the hosts, so actor i runs beside the queue it feeds."""
    return {"learner": jd.per_host(), "actor": jd.spread()}


def restarts() -> dict[str, jd.Restart]:
    """Crashed nodes come back: the learner (with its queue) from its latest checkpoint, actors
    afresh; meanwhile the other actors keep acting with the parameters they hold."""
    return {"learner": jd.Restart(max_restarts=10, backoff=1.0), "actor": jd.Restart(max_restarts=10, backoff=0.5)}


def resources(config: PPOConfig, compilation_cache: str | None = None) -> dict[str, dict[str, Any]]:
    """Per-group environment for the processes launcher (see ``common.cpu_resources``)."""
    return cpu_resources(("learner", "actor"), compilation_cache)
