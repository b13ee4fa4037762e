"""ES as a jaxdist program: ``make_program(config)``, or ``build(config)`` for the program and
the master's handle.

    evaluator/i   ``Evaluator`` nodes: jitted rollouts of perturbations regenerated from seeds
    master/0      the driver (``Master``): runs the generations, calls the evaluators with
                  futures through a ``jd.Pool``, serves the parameters they pull, checkpoints,
                  and ends the program (``jd.stop()``) after its last generation

The master is a node rather than part of the launching process so that the evaluators can pull
the current parameters from it (a restarted evaluator needs nothing else), so that the
supervisor restarts it from its checkpoint like any learner, and so that the launching process
needs no JAX. Crashed nodes come back (node options): an evaluator afresh (the pool gives its
task to the others meanwhile and its work back when it answers again), the master from its
checkpoint. A stop reaches the master first, while its evaluators still serve the generation in
flight. Building the program imports no JAX either.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jaxdist as jd
from jaxdist.agents import distributed
from jaxdist.agents.distributed import env_slug
from jaxdist.agents.es.config import ESConfig
from jaxdist.agents.es.evaluator import Evaluator
from jaxdist.agents.es.master import Master

MASTER_RESTART = jd.Restart(max_restarts=3, backoff=1.0)
EVALUATOR_RESTART = jd.Restart(max_restarts=10, backoff=0.5)


@dataclasses.dataclass(frozen=True)
class Topology:
    """The program and the handle a watcher needs: the master's."""

    program: jd.Program
    master: jd.Handle


def make_program(config: ESConfig, start_time: float | None = None) -> jd.Program:
    return build(config, start_time).program


def build(config: ESConfig, start_time: float | None = None) -> Topology:
    """``start_time`` (a ``time.time()``, default: when the master starts) is where the master's
    clock starts, e.g. at the top of a script, so that start-up counts in its wall times."""
    program = jd.Program(f"es-{env_slug(config.env_id)}")
    # The master and the evaluators call each other: the master's node is made first, with the
    # list its evaluators' handles are added to below (arguments travel only at launch).
    evaluators: list[jd.Handle] = []
    master_node = jd.CourierNode(Master, evaluators, config, start_time).with_options(
        restart=MASTER_RESTART, stops_first=True)
    master = master_node.create_handle()
    with program.group("evaluator"):
        evaluators.extend(program.add_node(jd.CourierNode(Evaluator, master, config)
                                           .with_options(restart=EVALUATOR_RESTART))
                          for _ in range(config.num_evaluators))
    with program.group("master"):
        program.add_node(master_node)
    return Topology(program, master)


def placement() -> dict[str, Any]:
    """For the multihost launcher: the master on host 0, the evaluators round-robin over hosts."""
    return {"master": jd.on_host(0), "evaluator": jd.spread()}


def resources(compilation_cache: str | None = None) -> dict[str, dict[str, Any]]:
    """Per-group environment for the processes launcher (see ``distributed.resources``)."""
    return distributed.resources(compilation_cache, groups=("master", "evaluator"))
