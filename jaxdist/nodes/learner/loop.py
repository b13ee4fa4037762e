"""The learner's step loop: data-parallel updates on the batches of its feed until
``max_steps``, ``finish()``, the end of its source or a stop, with its checkpointing and
publishing parts told of every step; see the package doc for how a learner is composed."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, Literal

import jax

from jaxdist.launch import context
from jaxdist.launch.restart import Restart
from jaxdist.learning import parallel
from jaxdist.learning.checkpoint import restore_saved
from jaxdist.learning.layout import checkpoint_dir
from jaxdist.learning.learner_logic import LearnerLogic, PyTree
from jaxdist.nodes.learner.checkpointing import CheckpointOptions, Checkpointing
from jaxdist.nodes.learner.feed import END, Feed, Source
from jaxdist.nodes.learner.publishing import PublishOptions, Publishing, host_metrics
from jaxdist.nodes.learner.steps import CountedUpdate, check_every, initial_state


class Learner:
    """A learner served by ``jd.CourierNode(Learner, logic, source, ...)``: the step loop over
    ``logic``, fed by ``source`` (see :class:`~jaxdist.nodes.learner.feed.Feed`: a callable,
    or replay node client(s) sampled ``batch_size`` items a batch, ``prefetch`` batches fetched
    ahead; None: batches arrive through ``update()``), composed with the parts the caller picks:
    ``checkpointing`` (None: no checkpoints) and ``publishing``.

    The loop's own options: ``steps_per_call`` (updates per dispatch, scanned), ``mode``
    (``"jit"`` or ``"pmap"``), ``block_every`` (how far dispatches run ahead of their results,
    see ``parallel.data_parallel``: 1 for on-policy data), ``seed``, ``max_steps``,
    ``after_update(batch, metrics) -> metrics`` (called after every dispatch with the batch
    learned from and the metrics, possibly device arrays still being computed: it takes out
    what it handles and returns the metrics left to log; it should hand what it took to a
    thread, and may have a ``flush()``, called when the learner finishes, that returns once
    what it was handed is done: prioritized replay's priorities, Anakin's evaluations),
    ``end_program`` (call ``jd.stop()`` once ``max_steps`` are done: training ends inside the
    program; a learner spanning processes calls it from its primary one), ``run_dir`` and
    ``name`` (default: the node's), ``population`` (a PBT member's part,
    :class:`~jaxdist.learning.population.Member`: at the steps it is ``due``, once this learner's
    checkpoint of the step is committed, its ``exploit(step)`` may hand over another learner's
    checkpoint directory and a change of its state, to train on from; also at the start of
    ``run()`` when the learner was restored at such a step, so a copy lost with a crash is made).
    """

    default_restart = Restart(max_restarts=10, backoff=1.0)  # it resumes from its checkpoint
    stops_first = True  # it saves at its final step while its inputs still run

    def __init__(self, logic: LearnerLogic, source: Source | None = None,
                 *, batch_size: int | None = None, prefetch: int = 2, steps_per_call: int = 1,
                 mode: Literal["jit", "pmap"] = "jit", block_every: int | None = None, seed: int = 0,
                 max_steps: int | None = None, checkpointing: CheckpointOptions | None = None,
                 publishing: PublishOptions = PublishOptions(),
                 after_update: Callable[[PyTree, PyTree], PyTree] | None = None, end_program: bool = False,
                 run_dir: str | None = None, name: str | None = None, population: Any = None) -> None:
        if not isinstance(logic, LearnerLogic):
            raise TypeError(f"Learner takes a LearnerLogic(init, update, params) first, got "
                            f"{type(logic).__name__}")
        check_every(max_steps=max_steps)
        node = context.current_node()
        self._in_program = node is not None  # the stop event means something only inside a node
        self.name = name or (node.node_name if node else "learner")
        self.run_dir = run_dir or (node.run_dir if node else None)
        self._logic = logic
        self._k = steps_per_call
        self._max_steps = max_steps
        self._ends_because = "max_steps reached"  # or why finish() was called
        self._end_program = end_program
        self._after_update = after_update
        self._population = population
        if population is not None and checkpointing is None:
            raise ValueError(f"learner {self.name} exchanges states with its population through its checkpoints: "
                             f"give it checkpointing=CheckpointOptions(...)")
        self._primary = parallel.is_primary()
        self._multiprocess = jax.process_count() > 1
        if self._multiprocess and self._in_program:
            context.finish_on_stop()
        self._lock = threading.RLock()
        self._closed = False
        self._dp = parallel.data_parallel(CountedUpdate(logic.update), mode=mode, steps_per_call=steps_per_call,
                                          block_every=block_every)

        init_key, update_key = jax.random.split(jax.random.key(seed))
        self._checkpointing = self._checkpoints(checkpointing) if checkpointing is not None else None
        self.restored_step = self._checkpointing.restored_step if self._checkpointing is not None else None
        self._init_key = init_key
        self._train = (self._dp.replicate(initial_state(logic, init_key)) if self.restored_step is None
                       else self._checkpointing.restore(self._template))
        self._step = int(jax.device_get(self._dp.unreplicate(self._train["step"])))
        key_data = jax.random.key_data(update_key)
        self._rng = self._dp.replicate(key_data) if mode == "jit" else key_data

        self._publishing = Publishing(publishing, self._dp, logic.params, self._train, self._step, name=self.name,
                                      run_dir=self.run_dir, restored_step=self.restored_step)
        self._feed = Feed(self._dp, source, prefetch=prefetch, step=self._step, batch_size=batch_size,
                          name=self.name)
        self._checked_step = -1
        platform = self._dp.mesh.devices.flat[0].platform
        print(f"{self.name}: {'restored step %d' % self._step if self.restored_step is not None else 'fresh start'}"
              f" on {self._dp.mesh.devices.size} {platform} device(s), mode={mode}", flush=True)

    # Served -----------------------------------------------------------------------------------

    def update(self, batch: PyTree) -> dict[str, Any]:
        """Run one call (``steps_per_call`` SGD steps) on ``batch`` now; its step and metrics.

        With ``steps_per_call > 1`` the batch leaves are ``(steps_per_call, batch, ...)``.
        """
        device_batch = self._feed.place(batch)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"learner {self.name} is closed")
            if self._finished():
                raise RuntimeError(f"learner {self.name} reached max_steps={self._max_steps}")
            metrics = self._advance(device_batch)
            step = self._step
        return {"step": step, "metrics": host_metrics(metrics, self._k)}

    def finish(self, reason: str) -> int:
        """End training at the current step, as ``max_steps`` would (``run()`` saves, publishes
        and returns), and say why in its last line: the version it ends at. An evaluator that
        reached its target calls this rather than stopping the program, so that the policy
        training ends with is evaluated too. A learner spanning processes refuses: its processes
        must agree on the step, which a stop of the program does (JAX's preemption sync point)."""
        if self._multiprocess:
            raise RuntimeError(f"learner {self.name} spans processes, which must stop at one step: stop the program")
        with self._lock:
            if not self._finished():
                self._max_steps, self._ends_because = self._step, reason
            return self._step

    def get(self, min_version: int = -1, wait: float = 0.0) -> dict[str, Any]:
        """``{"version": step, "params": host arrays, or None unless newer than min_version}``:
        the ParameterServer's ``get`` contract, so a ``VariableClient`` (directly or through a
        ``CacherNode``) reads parameters from the learner itself.

        ``wait`` > 0 long-polls: returns once a newer version is published or after ``wait``
        seconds (at most ``parameter_server.MAX_WAIT``); beyond ``max_waiting`` (8) polls at once
        it answers at once, so that polls never hold every server thread.
        """
        return self._publishing.get(min_version, wait)

    def stats(self) -> dict[str, Any]:
        """The env steps this life of the learner's updates played (see the package doc), and its step."""
        return {"env_steps": self._publishing.env_steps, "version": self._step}

    def status(self) -> dict[str, Any]:
        """step, the published version, restored_step (None for a fresh start), devices, mode."""
        return {"step": self._step, "version": self._publishing.version(), "restored_step": self.restored_step,
                "devices": int(self._dp.mesh.devices.size), "mode": self._dp.mode}

    # The node's own work ----------------------------------------------------------------------

    def run(self) -> None:
        """Train until max_steps (or ``finish()``), the end of the source, or a stop; then save and return."""
        reason = None
        if self.restored_step is not None and self._exchange_due(self._step - 1):
            with self._lock:
                self._exchange()
        while not self._finished():
            stop = self._stop_reason()
            if stop:
                reason = stop
                break
            if not self._feed.has_source:  # batches arrive through update()
                context.wait_for_stop(0.05)
                continue
            batch = self._feed.next(timeout=0.1)
            if batch is END:
                reason = "the batch source ended"
                break
            if batch is not None:
                with self._lock:
                    if not self._finished():  # finish() may have come while the batch did
                        self._advance(batch)
        self._finish(reason or self._ends_because)
        if self._end_program and self._finished() and self._in_program and self._primary:
            context.stop(f"training is over at update {self._step} ({self._ends_because})")

    def close(self) -> None:
        """Stop fetching, flush metrics and publishing, wait for saves; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._feed.close()
        self._publishing.close()
        if self._checkpointing is not None:
            self._checkpointing.close()

    # Internals --------------------------------------------------------------------------------

    def _advance(self, device_batch: PyTree) -> PyTree:
        """One dispatch of the step, then whatever the parts' intervals ask; caller holds the lock."""
        self._train, metrics = self._dp(self._train, device_batch, self._rng)
        if self._after_update is not None:
            metrics = self._after_update(device_batch, metrics)
        if isinstance(metrics, dict) and "env_steps" in metrics:  # a counter, not a metric to average
            metrics = dict(metrics)
            self._publishing.count(metrics.pop("env_steps"))
        before, self._step = self._step, self._step + self._k
        self._publishing.after_step(before, self._step, self._train, metrics)
        if self._checkpointing is not None and self._checkpointing.after_step(before, self._step, self._train):
            self._publishing.flush()  # rows up to a checkpoint survive a SIGKILL: none are lost for good
        if self._exchange_due(before):
            self._exchange()
        return metrics

    @functools.cached_property
    def _template(self) -> PyTree:
        """The state's shapes, for a restore: a fresh state traced, not made (``eval_shape``: 0.2 s
        where compiling and running ``init`` took 0.6-0.9 s on this 2-core CPU), so a restart
        serves that much sooner."""
        return jax.eval_shape(functools.partial(initial_state, self._logic), self._init_key)

    def _exchange_due(self, before: int) -> bool:
        return self._population is not None and not self._finished() and self._population.due(before, self._step)

    def _exchange(self) -> None:
        """PBT: commit this step's checkpoint (another member may copy it), then train on from
        the state the population hands over: this one, or another learner's of this step,
        changed (its hyperparameters explored); caller holds the lock."""
        self._checkpointing.save(self._step, self._train)
        self._checkpointing.wait()
        handed = self._population.exploit(self._step)
        if handed is None:
            return
        directory, change = handed
        missing = FileNotFoundError(f"learner {self.name} was to copy the checkpoint of step {self._step} in "
                                    f"{directory}, which has none")
        saved = restore_saved(directory, self._template, self._step, missing)[1]
        self._train = self._dp.replicate({"state": change(saved["state"]), "step": saved["step"]})

    def _finished(self) -> bool:
        return self._max_steps is not None and self._step >= self._max_steps

    def _stop_reason(self) -> str | None:
        """Why to stop now, if so: the program is stopping, or a preemption (SIGTERM) came."""
        if self._multiprocess:  # every process must decide at the same step: JAX's sync point
            if self._step == self._checked_step:
                return None
            self._checked_step = self._step
            if self._stopping():  # every process stops where the sync point says, once one saw the stop
                parallel.post_preemption_notice()
            if not parallel.preemption_requested(self._step):
                return None
            return "the program is stopping" if self._stopping() else "preempted"
        if self._stopping():
            return "the program is stopping"
        return "preempted (SIGTERM)" if parallel.preemption_requested(self._step) else None

    def _stopping(self) -> bool:
        return self._in_program and context.stop_requested()

    def _finish(self, reason: str) -> None:
        """Save at the current step (off the interval if need be), publish, flush; for run()."""
        with context.saving_checkpoint():  # not cut by the stop's interrupt, nor killed at its grace
            with self._lock:
                if self._checkpointing is not None:
                    self._checkpointing.save(self._step, self._train)
                self._publishing.finish(self._step, self._train)
            # A stop's interrupt (KeyboardInterrupt) that raced the save's start: let the save commit.
            for attempt in range(3):
                try:
                    if self._checkpointing is not None:
                        self._checkpointing.wait()
                    self._publishing.drain()
                    if hasattr(self._after_update, "flush"):
                        self._after_update.flush()
                    break
                except KeyboardInterrupt:
                    if attempt == 2:
                        raise
        saved = " (checkpoint saved)" if self._checkpointing is not None else ""
        print(f"{self.name}: stopped at step {self._step}: {reason}{saved}", flush=True)

    def _checkpoints(self, options: CheckpointOptions) -> Checkpointing:
        """The checkpointing part, saving under ``<run_dir>/checkpoints/<name>``; the processes
        of a learner spanning hosts save collectively into their group's directory."""
        if self.run_dir is None:
            raise ValueError(f"learner {self.name} writes checkpoints under a run directory: launch it as a node "
                             f"(jd.CourierNode) or pass run_dir=...")
        name = self.name.split("/")[0] if self._multiprocess else self.name
        return Checkpointing(checkpoint_dir(self.run_dir, name), options, self._dp)

