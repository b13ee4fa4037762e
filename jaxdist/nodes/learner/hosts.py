"""A learner spanning hosts: its processes, one per host, join one ``jax.distributed`` group
before anything touches JAX's devices, and then step as one SPMD learner.

Joining is the process's act, not the learner's: a node factory calls :func:`join_hosts` and
then builds its learner, which sees the group's devices. Each process feeds its own rows and
all must step together, so use a source on every process (not ``update()`` calls) and end by
``max_steps`` or a stop; a stop is taken at JAX's preemption sync point, the same step
everywhere. Launchers stop learners before the other nodes, so every process's source still
has data to step on to that point, and do not interrupt them meanwhile; a source must not end
on a stop there.
"""

from __future__ import annotations

import os

from jaxdist.learning import parallel

DISTRIBUTED_DEFAULTS = {"heartbeat_timeout_seconds": 10, "initialization_timeout": 120,
                        "shutdown_timeout_seconds": 10}
"""For :func:`join_hosts`: when one process of the group dies, the others are stuck in a
collective; the coordination service's heartbeat then aborts them (JAX's default waits 100 s)
and the supervisor restarts the whole group from its checkpoint. Override with
``JAXDIST_HEARTBEAT_TIMEOUT`` (seconds)."""


def join_hosts(hosts: int) -> None:
    """Join the ``jax.distributed`` group of a learner spanning ``hosts`` processes with the
    arguments the multihost launcher gave this one (its per_host group's) and
    :data:`DISTRIBUTED_DEFAULTS`; with one host there is no group to join."""
    if hosts == 1:
        return
    from jaxdist.launch import hosts as launch_hosts  # the launcher's side of the contract

    arguments = launch_hosts.distributed_from_env()
    if arguments is None:
        raise ValueError(f"a learner spanning {hosts} hosts joins the jax.distributed group the launcher makes, and "
                         f"this process has no JAXDIST_COORDINATOR_ADDRESS: launch with launcher='multihost' and "
                         f"place the learner group per_host()")
    heartbeat = os.environ.get("JAXDIST_HEARTBEAT_TIMEOUT")
    overrides = {"heartbeat_timeout_seconds": int(heartbeat)} if heartbeat else {}
    parallel.initialize(**{**DISTRIBUTED_DEFAULTS, **overrides, **arguments})
