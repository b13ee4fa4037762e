"""ES as a jaxdist program: ``make_program(config)``.

    master/0      the driver (``Master``): runs the generations, calls the evaluators with
                  futures through a ``jd.Pool``, serves the parameters they pull, checkpoints
    evaluator/i   ``Evaluator`` nodes: jitted rollouts of perturbations regenerated from seeds

The master is a node rather than part of the launching process so that the evaluators can pull
the current parameters from it (a restarted evaluator needs nothing else), so that the
supervisor restarts it from its checkpoint like any learner, and so that the launching process
needs no JAX. Building the program imports no JAX either.
"""

from __future__ import annotations

from typing import Any

import jaxdist as jd
from jaxdist.agents import distributed
from jaxdist.agents.es.config import ESConfig
from jaxdist.agents.es.evaluator import Evaluator
from jaxdist.agents.es.master import Master

MASTER = "master/0"


def make_program(config: ESConfig, start_time: float | None = None) -> jd.Program:
    """``start_time`` (a ``time.time()``, default: when the master starts) is where the master's
    clock starts, e.g. at the top of a script, so that start-up counts in its wall times."""
    program = jd.Program(f"es-{config.env_id.lower()}")
    master = jd.Handle(MASTER)
    with program.group("evaluator"):
        evaluators = [program.add_node(jd.CourierNode(Evaluator, master, config))
                      for _ in range(config.num_evaluators)]
    with program.group("master"):
        handle = program.add_node(jd.CourierNode(Master, evaluators, config, start_time))
    assert handle.node_name == MASTER, handle
    return program


def placement() -> dict[str, Any]:
    """For the multihost launcher: the master on host 0, the evaluators round-robin over hosts."""
    return {"master": jd.on_host(0), "evaluator": jd.spread()}


def restarts() -> dict[str, jd.Restart]:
    """Crashed nodes come back: an evaluator afresh (the pool gives its task to the others
    meanwhile and its work back when it answers again), the master from its checkpoint."""
    return {"master": jd.Restart(max_restarts=3, backoff=1.0), "evaluator": jd.Restart(max_restarts=10, backoff=0.5)}


def resources(compilation_cache: str | None = None) -> dict[str, dict[str, Any]]:
    """Per-group environment for the processes launcher (see ``distributed.resources``)."""
    return distributed.resources(compilation_cache, groups=("master", "evaluator"))
