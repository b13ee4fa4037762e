"""The learner node: data-parallel updates from a batch source, published parameters,
metrics, checkpoints, and resume.

The algorithm is three pure functions in a :class:`LearnerLogic`; the node does the plumbing,
and is built from parts the caller picks rather than set through a long list of options::

    logic = LearnerLogic(init=init_fn, update=update_fn)   # params=: default state["params"]
    with p.group("learner"):
        learner = p.add_node(jd.CourierNode(Learner, logic, queue, batch_size=256,
                                            checkpointing=jd.CheckpointOptions(),
                                            publishing=PublishOptions(every=10)))
    with p.group("params"):
        params = p.add_node(jd.CacherNode(learner, refresh_interval=0.5, uncached=("update",)))

The parts, each a module with one job and testable alone:

- the loop (:mod:`.loop`, :class:`Learner`): ``update(state, batch, rng) -> (state, metrics)``
  is written for the global batch and runs through
  :func:`jaxdist.learning.parallel.data_parallel` over every device (``mode="jit"`` or
  ``"pmap"``), ``steps_per_call`` updates per dispatch under ``lax.scan``, until
  ``max_steps``, ``finish()``, the end of the source, or a stop. It serves ``update(batch)``,
  ``get``, ``status()``, ``stats()`` and ``finish(reason)``.
- its feed (:mod:`.feed`): batches from any callable ``next_batch() -> pytree`` (this
  process's rows of one step's batch; raising ``StopIteration`` ends training), or from replay
  nodes (their clients, or a :class:`ReplaySource`), fetched and put on devices ahead of use
  by a thread. Without a source, callers push batches with the served ``update(batch)``.
- checkpointing (:mod:`.checkpointing`, ``checkpointing=CheckpointOptions(...)``; None: none):
  ``<run_dir>/checkpoints/<node name>`` holds the state and the step; the latest is restored on
  start, so steps, RNG streams and the published version carry on. A stop
  (``jd.stop_requested()``, SIGTERM, JAX's preemption sync point) saves at the current step,
  waits for the save and returns; so do ``max_steps`` and the end of the source.
- publishing (:mod:`.publishing`, ``publishing=PublishOptions(...)``): ``get(min_version=-1,
  wait=0)`` serves the published parameters (the ParameterServer contract, so actors'
  ``VariableClient`` reads it directly or through a ``CacherNode``: give the cacher
  ``uncached=("update",)``), metrics rows go to ``<run_dir>/metrics.csv``, and a learner whose
  updates make env steps (Anakin's play their envs) reports them as the metric ``env_steps``,
  which ``stats()`` counts. Only ``parallel.is_primary()`` publishes and writes, from a
  background thread, so the step loop never waits on a device-to-host copy.
- spanning hosts (:mod:`.hosts`): a node factory calls :func:`join_hosts` before it builds the
  learner.

Outside a program (a script, a benchmark) it works the same: ``Learner(logic, source,
max_steps=N, run_dir=...).run()``; there only SIGTERM stops it early. RNG: the key of SGD step
``s`` is ``fold_in(k, s)`` with ``k`` drawn from ``seed`` (then split per scanned step), so a
resumed run draws what an uninterrupted one would.

The callables must pickle to reach a process: module-level functions, or dataclasses of them.
"""

from jaxdist.learning.learner_logic import LearnerLogic, state_params
from jaxdist.nodes.learner.checkpointing import CheckpointOptions, Checkpointing
from jaxdist.nodes.learner.feed import BatchSource, Feed, ReplaySource
from jaxdist.nodes.learner.hosts import DISTRIBUTED_DEFAULTS, join_hosts
from jaxdist.nodes.learner.loop import Learner
from jaxdist.nodes.learner.publishing import PublishOptions, Publishing
from jaxdist.nodes.learner.steps import initial_state

__all__ = ["DISTRIBUTED_DEFAULTS", "BatchSource", "CheckpointOptions", "Checkpointing", "Feed", "Learner",
           "LearnerLogic", "PublishOptions", "Publishing", "ReplaySource", "initial_state", "join_hosts",
           "state_params"]
