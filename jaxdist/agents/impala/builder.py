"""IMPALA as a jaxdist program: ``make_program(config)``.

    learner/0   one process: a FIFO replay node and the generic Learner, colocated as threads
                (learner/0/0 the queue, learner/0/1 the learner, which also serves parameters)
    actor/i     Actor nodes (spread over the hosts under the multihost launcher, see
                ``placement``): a vector env of ``envs_per_actor`` envs each, acting asynchronously
                with the newest parameters they hold and sending unrolls (with the behaviour
                logits) to the queue; the learner corrects for their lag with V-trace

Building the program has no side effects and is deterministic (the same config builds the
same program on every host). It imports no JAX: every node's process imports what its node
needs when it starts.
"""

from __future__ import annotations

import functools
from typing import Any

import jaxdist as jd
from jaxdist.agents.common import FifoLearner, actor_seed, cpu_resources
from jaxdist.agents.impala.acting import PolicyStep
from jaxdist.agents.impala.config import IMPALAConfig, IMPALAHyperparams
from jaxdist.envs import EnvSpec
from jaxdist.nodes.actor import Actor

QUEUE, LEARNER = "learner/0/0", "learner/0/1"


def learner_logic(hp: IMPALAHyperparams) -> Any:
    """IMPALA's ``LearnerLogic`` for the generic ``jaxdist.nodes.learner.Learner``."""
    from jaxdist.agents.impala import learning
    from jaxdist.nodes.learner import LearnerLogic

    return LearnerLogic(init=functools.partial(learning.init, hp), update=functools.partial(learning.update, hp))


def make_program(config: IMPALAConfig) -> jd.Program:
    hp = config.hyperparams()
    program = jd.Program(f"impala-{config.env_id.lower()}")
    queue, learner = jd.Handle(QUEUE), jd.Handle(LEARNER)
    learner_node = jd.CourierNode(
        FifoLearner, learner_logic, hp, queue, config.batch_trajectories, mode=config.learner_mode,
        publish_every=1, seed=config.seed, max_steps=config.total_updates, log_every=config.log_every_updates,
        checkpoint={"save_every_steps": config.checkpoint_every_updates, "keep": 2},
        prefetch=config.learner_prefetch)
    handles = program.add_node(jd.ColocationNode([jd.ReplayNode(jd.replay.Fifo(max_size=config.queue_size)),
                                                  learner_node], mode="threads"), label="learner")
    assert [h.node_name for h in handles] == [QUEUE, LEARNER], handles
    policy = PolicyStep(hp.num_actions, hp.hidden)
    env = EnvSpec(config.env_id, config.envs_per_actor, config.env_backend)
    with program.group("actor"):
        for i in range(config.num_actors):
            program.add_node(jd.CourierNode(
                Actor, policy, env, learner, queue, trajectory_length=config.trajectory_length,
                seed=actor_seed(config.seed, i), params_method="get_params",
                refresh_every_seconds=config.param_refresh_seconds, max_in_flight=config.max_in_flight))
    return program


def placement(config: IMPALAConfig) -> dict[str, Any]:
    """For the multihost launcher: the learner process (with its queue) on host 0, actors
    round-robin over the hosts, every one sending its unrolls to host 0's queue."""
    return {"learner": jd.on_host(0), "actor": jd.spread()}


def restarts() -> dict[str, jd.Restart]:
    """Crashed nodes come back: the learner (with its queue) from its latest checkpoint, actors
    afresh; meanwhile the other actors keep acting with the parameters they hold."""
    return {"learner": jd.Restart(max_restarts=10, backoff=1.0), "actor": jd.Restart(max_restarts=10, backoff=0.5)}


def resources(compilation_cache: str | None = None) -> dict[str, dict[str, Any]]:
    """Per-group environment for the processes launcher (see ``common.cpu_resources``)."""
    return cpu_resources(("learner", "actor"), compilation_cache)
