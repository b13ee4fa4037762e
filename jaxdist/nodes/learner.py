"""The learner node: data-parallel updates from a batch source, published parameters,
metrics, checkpoints, and resume.

The algorithm is three pure functions in a :class:`LearnerLogic`; the node does the plumbing::

    logic = LearnerLogic(init=init_fn, update=update_fn)   # params=: default state["params"]
    with p.group("learner"):
        learner = p.add_node(jd.CourierNode(Learner, logic, queue, batch_size=256,
                                            checkpoint=True, publish_every=10))
    with p.group("params"):
        params = p.add_node(jd.CacherNode(learner, refresh_interval=0.5, uncached=("update",)))

- ``update(state, batch, rng) -> (state, metrics)`` is written for the global batch and runs
  through :func:`jaxdist.learning.parallel.data_parallel` over every device (``mode="jit"`` or
  ``"pmap"``), ``steps_per_call`` updates per dispatch under ``lax.scan``.
- Batches come from a *source*: any callable ``next_batch() -> pytree`` (this process's rows
  of one step's batch; raising ``StopIteration`` ends training), or the client(s) of replay
  nodes (wrapped in :class:`ReplaySource`), fetched and put on devices ahead of use by a
  background thread. A source with a ``seek(step)`` method is told the step training starts
  at (0, or the restored step) before its first call, so a deterministic source (a dataset
  read in order) resumes where the checkpoint left off rather than from its beginning. Without a source, callers push batches with the served ``update(batch)``.
- Served: ``update(batch)``, ``get(min_version=-1, wait=0)`` (the ParameterServer contract,
  so actors' ``VariableClient`` reads it directly or through a ``CacherNode``: give the cacher
  ``uncached=("update",)``), ``status()``, and ``stats()``: a learner whose updates make env
  steps (Anakin's play their envs) reports them as the metric ``env_steps``, which it counts
  (summed over a dispatch's scanned updates) as an actor counts its own.
  Only ``parallel.is_primary()`` publishes and writes metrics; device-to-host copies for both
  happen on a background thread, so the step loop never waits on them.
- Outside a program (a script, a benchmark) it works the same: ``Learner(logic, source,
  max_steps=N, run_dir=...).run()``; there only SIGTERM stops it early.
- Checkpoints (``<run_dir>/checkpoints/<node name>``) hold the state and the step; the latest
  is restored on start, so steps, RNG streams and the published version carry on. A stop
  (``jd.stop_requested()``, SIGTERM, JAX's preemption sync point) saves at the current step,
  waits for the save and returns; so do ``max_steps`` and the end of the source.
- RNG: the key of SGD step ``s`` is ``fold_in(k, s)`` with ``k`` drawn from ``seed`` (then
  split per scanned step), so a resumed run draws what an uninterrupted one would.

The callables must pickle to reach a process: module-level functions, or dataclasses of them.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist import courier

from jaxdist.learning import parallel
from jaxdist.learning.checkpoint import Checkpointer, checkpoint_dir
from jaxdist.launch import context
from jaxdist.launch.restart import Restart
from jaxdist.learning.learner_logic import LearnerLogic, PyTree, state_params
from jaxdist.records.metrics import MetricsWriter, metrics_path
from jaxdist.nodes.parameter_server import VersionedParams

BatchSource = Callable[[], PyTree]
"""``next_batch() -> pytree``: this process's rows of one SGD step's batch (batch on axis 0)."""


@dataclasses.dataclass(frozen=True)
class CheckpointOptions:
    """``checkpoint=True`` means these defaults; a dict of the same fields also works."""

    save_every_steps: int | None = 1000
    save_every_seconds: float | None = None
    keep: int = 3
    async_save: bool = True


@dataclasses.dataclass
class ReplaySource:
    """The batch source over replay nodes' clients: each call samples ``steps`` batches of
    ``batch_size`` items in one request.

    One client: ``ReplayClient(client).sample``; several: ``sample_many`` (the batch split over
    them, asked at once). With ``steps > 1`` a call returns every leaf as ``(steps,
    batch_size, ...)``, the input of a learner's ``steps_per_call`` scanned updates: one round
    trip per dispatch, not one per update. Row i of the sample goes to batch ``i % steps``, so
    with several nodes each batch holds every node's share. It waits in slices of
    ``slice_seconds`` while a rate limiter or an empty table holds the sample back, for as
    long as it takes, except that with ``end_on_stop`` it ends the source (``StopIteration``:
    the learner saves and returns) once the program is stopping, so a learner fetching inline
    is never left waiting on actors that have stopped. A learner spanning processes keeps
    ``end_on_stop=False``: all its processes must step on to the step they agreed to stop at,
    and launchers keep its actors running until it has. ``field`` picks one entry of the sample
    (``"data"``); ``None`` returns the whole ``{"keys", "data", "probabilities"}``, for losses
    that need the probabilities (prioritized replay) or the keys.
    """

    clients: Any
    batch_size: int
    table: str = "default"
    field: str | None = "data"
    end_on_stop: bool = False
    slice_seconds: float = 0.25
    steps: int = 1

    def __call__(self) -> PyTree:
        from jaxdist.nodes.replay import client as replay_client  # a node layer beside this one

        while True:
            try:
                sample = self._sample(replay_client)
            except TimeoutError:
                if self.end_on_stop and context.stop_requested():
                    raise StopIteration from None
                continue
            if self.steps > 1:
                sample = jax.tree.map(self._split_steps, sample)
            return sample if self.field is None else sample[self.field]

    def _sample(self, replay_client: Any) -> PyTree:
        size = self.batch_size * self.steps
        if isinstance(self.clients, (list, tuple)):
            return replay_client.sample_many(list(self.clients), size, table=self.table, timeout=self.slice_seconds)
        if not isinstance(self.clients, replay_client.ReplayClient):
            self.clients = replay_client.ReplayClient(self.clients)
        return self.clients.sample(size, table=self.table, timeout=self.slice_seconds)

    def _split_steps(self, leaf: np.ndarray) -> np.ndarray:
        """``(steps * batch, ...)`` rows -> ``(steps, batch, ...)``, row i in batch ``i % steps``."""
        leaf = np.asarray(leaf)
        return leaf.reshape(self.batch_size, self.steps, *leaf.shape[1:]).swapaxes(0, 1)


class Learner:
    """A learner served by ``jd.CourierNode(Learner, logic, source, ...)``; see the module doc.

    Options: ``batch_size`` (for replay sources), ``steps_per_call``, ``mode``,
    ``publish_every`` (steps; None: only at start and end; ``get`` serves what was published,
    and a ``ParameterServer(source=learner)`` follows it), ``checkpoint`` (False, True,
    a :class:`CheckpointOptions` or a dict of its fields), ``seed``, ``max_steps``,
    ``metrics`` (True: ``<run_dir>/metrics.csv``, rows past the restored step dropped, and the
    first row after a restore carries ``learner/restored_step``; a
    name: ``<run_dir>/<name>.csv``; an object with ``write(step, dict)``; False; None, the
    default: True when there is a run directory), ``log_every`` (steps), ``prefetch`` (batches
    fetched, and off CPU put on devices, ahead of use by a thread; 0: fetch inline; batches
    fetched ahead from a Fifo are not trained on if the learner stops), ``run_dir`` / ``name``
    (default: the node's),
    ``replay_options`` (``table``, ``field``, ``end_on_stop`` of :class:`ReplaySource`, used
    when the source is replay node client(s)), ``end_program`` (call ``jd.stop()`` once
    ``max_steps`` are done: training ends inside the program; a learner spanning processes
    calls it from its primary one), ``distributed`` (arguments of
    ``parallel.initialize``, called first; ``"env"``: those the multihost launcher gives the
    per_host group, with a heartbeat short enough that a dead peer ends the group in seconds,
    see :data:`DISTRIBUTED_DEFAULTS`), ``checkpoint_name`` (the directory under
    ``<run_dir>/checkpoints``; default: the node name, or for a learner spanning processes the
    group's label, shared by all its processes), ``after_update`` (``after_update(batch, metrics)
    -> metrics``, called after every dispatch with the batch learned from and the metrics,
    possibly device arrays still being computed: it takes out what it handles and returns the
    metrics left to log; it should hand what it took to a thread, and may have a ``flush()``,
    called when the learner finishes, before it ends the program, that returns once what it
    was handed is done. Prioritized replay gets the new priorities of the keys it sampled this
    way; Anakin's evaluations are written this way), ``block_every`` (how far dispatches run
    ahead of their results, see ``parallel.data_parallel``: 1 for on-policy data).
    Steps count SGD updates: a call of ``steps_per_call`` advances the step by that many, and
    intervals fire when the step crosses a multiple of them.

    Several processes (``distributed``): each feeds its own rows and all must step together,
    so use a source on every process (not ``update()`` calls) and end by ``max_steps`` or a
    stop; a stop is taken at JAX's preemption sync point, the same step everywhere. Launchers
    stop learners before the other nodes, so every process's source still has data to step on
    to that point, and do not interrupt them meanwhile; a source must not end on a stop there.
    """

    default_restart = Restart(max_restarts=10, backoff=1.0)  # it resumes from its checkpoint
    stops_first = True  # it saves at its final step while its inputs still run

    def __init__(self, logic: LearnerLogic, source: BatchSource | Any = None, *,
                 batch_size: int | None = None, steps_per_call: int = 1,
                 mode: Literal["jit", "pmap"] = "jit", publish_every: int | None = 1,
                 checkpoint: bool | CheckpointOptions | Mapping[str, Any] = False,
                 seed: int = 0, max_steps: int | None = None, metrics: bool | str | Any = None,
                 log_every: int | None = 100, prefetch: int = 2, run_dir: str | None = None,
                 name: str | None = None, replay_options: Mapping[str, Any] | None = None,
                 distributed: Mapping[str, Any] | Literal["env"] | None = None, block_every: int | None = None,
                 after_update: Callable[[PyTree, PyTree], PyTree] | None = None,
                 checkpoint_name: str | None = None, end_program: bool = False) -> None:
        if distributed is not None:
            parallel.initialize(**_distributed_arguments(distributed))
        if not isinstance(logic, LearnerLogic):
            raise TypeError(f"Learner takes a LearnerLogic(init, update, params) first, got "
                            f"{type(logic).__name__}")
        for option, value in (("publish_every", publish_every), ("log_every", log_every),
                              ("max_steps", max_steps)):
            if value is not None and value < 1:
                raise ValueError(f"{option} must be >= 1 or None, got {value}")
        node = context.current_node()
        self._in_program = node is not None  # the stop event means something only inside a node
        self.name = name or (node.node_name if node else "learner")
        self.run_dir = run_dir or (node.run_dir if node else None)
        # The processes of a learner spanning hosts save collectively into one directory.
        self._checkpoint_name = checkpoint_name or (self.name.split("/")[0] if jax.process_count() > 1 else self.name)
        self._logic = logic
        self._k = steps_per_call
        self._publish_every = publish_every
        self._log_every = log_every
        self._max_steps = max_steps
        self._ends_because = "max_steps reached"  # or why finish() was called
        self._end_program = end_program
        self._after_update = after_update
        self._primary = parallel.is_primary()
        self._multiprocess = jax.process_count() > 1
        if self._multiprocess and self._in_program:
            context.finish_on_stop()
        self._lock = threading.RLock()
        self._closed = False
        self._dp = parallel.data_parallel(_CountedUpdate(logic.update), mode=mode,
                                          steps_per_call=steps_per_call,
                                          block_every=block_every)
        self._ckpt, self._every_steps, self._every_seconds = self._make_checkpointer(checkpoint)
        # One process under jit: the step's own C++ dispatch places host arrays faster than a
        # device_put from Python. Off CPU a large batch is put on the devices by the feeder
        # instead, ahead of its step, so that its transfer overlaps the step before. On an H200
        # (the learner benchmark's MLP; updates/s against the bare loop, host arrays / put ahead):
        # 64 KB batches 0.74x / 0.57x, 2 MB 0.78x / 1.03x, 32 MB 1.01x / 3.42x.
        platform = self._dp.mesh.devices.flat[0].platform
        self._host_batch_bytes = (0 if mode != "jit" or self._multiprocess
                                  else float("inf") if platform == "cpu" else DEVICE_PUT_AHEAD_BYTES)
        self._local_devices = self._dp.mesh.local_mesh.devices.size

        init_key, update_key = jax.random.split(jax.random.key(seed))
        self.restored_step = self._ckpt.latest_step() if self._ckpt is not None else None
        self._train = (self._dp.replicate(initial_state(logic, init_key)) if self.restored_step is None
                       else self._restore(init_key))
        self._step = int(jax.device_get(self._dp.unreplicate(self._train["step"])))
        key_data = jax.random.key_data(update_key)
        self._rng = self._dp.replicate(key_data) if mode == "jit" else key_data

        self._writer = self._make_writer(metrics) if self._primary else None
        self._io = _HostIO(self._writer, self.name) if self._primary else None
        self._published = VersionedParams()  # what get() serves, long polls capped
        if self._primary:
            self._publish_now()
        self._last_metrics: PyTree = None
        self._logged_step = self._step
        self._logged_restore = False
        self._rate = _Rate()
        self._feeder = _Feeder(self._resolve_source(source, batch_size, replay_options or {}),
                               self._shard, prefetch) if source is not None else None
        self._checked_step = -1
        print(f"{self.name}: {'restored step %d' % self._step if self.restored_step is not None else 'fresh start'}"
              f" on {self._dp.mesh.devices.size} {platform} device(s), mode={mode}", flush=True)

    # Served -----------------------------------------------------------------------------------

    def update(self, batch: PyTree) -> dict[str, Any]:
        """Run one call (``steps_per_call`` SGD steps) on ``batch`` now; its step and metrics.

        With ``steps_per_call > 1`` the batch leaves are ``(steps_per_call, batch, ...)``.
        """
        device_batch = self._shard(batch)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"learner {self.name} is closed")
            if self._finished():
                raise RuntimeError(f"learner {self.name} reached max_steps={self._max_steps}")
            metrics = self._advance(device_batch)
            step = self._step
        return {"step": step, "metrics": _host_metrics(metrics, self._k)}

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
        return self._published.get(min_version, wait)

    def stats(self) -> dict[str, Any]:
        """The env steps this life of the learner's updates played (see the module doc), and its step."""
        return {"env_steps": self._io.env_steps if self._io is not None else 0, "version": self._step}

    def status(self) -> dict[str, Any]:
        """step, the published version, restored_step (None for a fresh start), devices, mode."""
        return {"step": self._step, "version": self._published.version(),
                "restored_step": self.restored_step,
                "devices": int(self._dp.mesh.devices.size), "mode": self._dp.mode}

    # The node's own work ----------------------------------------------------------------------

    def run(self) -> None:
        """Train until max_steps (or ``finish()``), the end of the source, or a stop; then save and return."""
        reason = None
        while not self._finished():
            stop = self._stop_reason()
            if stop:
                reason = stop
                break
            if self._feeder is None:  # batches arrive through update()
                context.wait_for_stop(0.05)
                continue
            batch = self._feeder.get(timeout=0.1)
            if batch is _END:
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
        if self._feeder is not None:
            self._feeder.close()
        if self._io is not None:
            self._io.close()
        if self._ckpt is not None:
            self._ckpt.close()
        if self._writer is not None and hasattr(self._writer, "close"):
            self._writer.close()

    # Internals --------------------------------------------------------------------------------

    def _advance(self, device_batch: PyTree) -> PyTree:
        """One dispatch of the step, then whatever the intervals ask; caller holds the lock."""
        self._train, metrics = self._dp(self._train, device_batch, self._rng)
        if self._after_update is not None:
            metrics = self._after_update(device_batch, metrics)
        if isinstance(metrics, dict) and "env_steps" in metrics:  # a counter, not a metric to average
            metrics = dict(metrics)
            env_steps = metrics.pop("env_steps")
            if self._io is not None:
                self._io.count(self._dp.unreplicate(env_steps))
        before, self._step = self._step, self._step + self._k
        self._last_metrics = metrics
        self._rate.tick(self._step)
        if self._primary:
            if _crossed(before, self._step, self._publish_every):
                self._publish_async()
            if _crossed(before, self._step, self._log_every):
                self._log(metrics)
        if self._ckpt is not None:
            due = _crossed(before, self._step, self._every_steps)
            if (due or self._every_seconds is not None) and \
                    self._ckpt.maybe_save(self._step, self._saveable(), force=due) and self._io:
                self._io.flush()  # rows up to a checkpoint survive a SIGKILL: none are lost for good
        return metrics

    def _finished(self) -> bool:
        return self._max_steps is not None and self._step >= self._max_steps

    def _stop_reason(self) -> str | None:
        """Why to stop now, if so: the program is stopping, or a preemption (SIGTERM) came."""
        if self._multiprocess:  # every process must decide at the same step: JAX's sync point
            if self._step == self._checked_step:
                return None
            self._checked_step = self._step
            return "preempted" if parallel.preemption_requested(self._step) else None
        if self._in_program and context.stop_requested():
            return "the program is stopping"
        return "preempted (SIGTERM)" if parallel.preemption_requested(self._step) else None

    def _finish(self, reason: str) -> None:
        """Save at the current step (off the interval if need be), publish, flush; for run()."""
        with self._lock:
            if self._ckpt is not None:
                self._ckpt.maybe_save(self._step, self._saveable(), force=True)
            if self._primary:
                if self._last_metrics is not None and self._logged_step != self._step:
                    self._log(self._last_metrics)
                if self._last_publish != self._step:
                    self._publish_async()
                self._io.flush()
        # A stop interrupts run() with KeyboardInterrupt after a while: let the save commit.
        for attempt in range(3):
            try:
                if self._ckpt is not None:
                    self._ckpt.wait()
                if self._io is not None:
                    self._io.drain()
                if hasattr(self._after_update, "flush"):
                    self._after_update.flush()
                break
            except KeyboardInterrupt:
                if attempt == 2:
                    raise
        saved = " (checkpoint saved)" if self._ckpt is not None else ""
        print(f"{self.name}: stopped at step {self._step}: {reason}{saved}", flush=True)

    def _shard(self, batch: PyTree) -> PyTree:
        """Check a batch's shapes, then put it on devices (or pass host arrays straight to jit)."""
        size = self._check_batch(batch)
        return batch if size < self._host_batch_bytes else self._dp.shard_batch(batch)

    def _check_batch(self, batch: PyTree) -> int:
        """Refuse a batch of the wrong shapes; its size in bytes."""
        n = self._local_devices
        axis = int(self._k > 1)
        size = 0
        for leaf in jax.tree.leaves(batch):
            shape = np.shape(leaf)
            if len(shape) <= axis or shape[axis] % n or (self._k > 1 and shape[0] != self._k):
                want = f"({self._k}, batch, ...)" if self._k > 1 else "(batch, ...)"
                raise ValueError(f"learner {self.name}: batch leaf of shape {shape} must be {want} "
                                 f"with the batch a multiple of {n} local devices")
            size += getattr(leaf, "nbytes", 0)
        return size

    def _saveable(self) -> PyTree:
        # pmap state is stacked per device: save one copy, so any device count can restore it.
        return self._train if self._dp.mode == "jit" else self._dp.unreplicate(self._train)

    def _restore(self, init_key: jax.Array) -> PyTree:
        """The latest checkpoint, in the step's layout. A fresh state is only its template, so
        it is traced, not made (``eval_shape``: 0.2 s where compiling and running ``init`` took
        0.6-0.9 s on this 2-core CPU): a restart serves that much sooner."""
        template = self._dp.restore_layout(jax.eval_shape(functools.partial(initial_state, self._logic), init_key))
        restored = self._ckpt.restore(template)
        return restored if self._dp.mode == "jit" else self._dp.replicate(restored)

    def _device_copy_of_params(self) -> PyTree:
        """A fresh device-0 copy of the params: the state itself is donated to the next call."""
        copy = _copy_tree(self._dp.unreplicate(self._logic.params(self._train["state"])))
        for leaf in jax.tree.leaves(copy):
            leaf.copy_to_host_async()
        return copy

    def _publish_async(self) -> None:
        self._last_publish = self._step
        self._io.publish(self._step, self._device_copy_of_params(), self._set_published)

    def _publish_now(self) -> None:
        """Publish synchronously: get serves it at once."""
        self._last_publish = self._step
        host = jax.device_get(self._device_copy_of_params())
        self._set_published(self._step, host)

    def _set_published(self, version: int, params: PyTree) -> None:
        self._published.push(params, version)  # an older version than the one held is ignored

    def _log(self, metrics: PyTree) -> None:
        self._logged_step = self._step
        if self._writer is not None:
            rate = self._rate.value
            extra = {"learner/steps_per_second": rate} if rate else {}
            if self.restored_step is not None and not self._logged_restore:
                # The first row of a resumed life says where it resumed: restarts are auditable
                # from the metrics file alone.
                extra["learner/restored_step"] = self.restored_step
                self._logged_restore = True
            self._io.log(self._step, metrics, self._k, extra)

    def _make_checkpointer(self, option: Any) -> tuple[Checkpointer | None, int | None, float | None]:
        if option is False or option is None:
            return None, None, None
        options = (CheckpointOptions() if option is True
                   else option if isinstance(option, CheckpointOptions)
                   else CheckpointOptions(**option))
        directory = checkpoint_dir(self._need_run_dir("checkpoints"), self._checkpoint_name)
        # Step intervals are decided here (crossings, for steps_per_call > 1); time by Orbax.
        ckpt = Checkpointer(directory, save_every_seconds=options.save_every_seconds,
                            keep=options.keep, async_save=options.async_save)
        return ckpt, options.save_every_steps, options.save_every_seconds

    def _make_writer(self, option: Any) -> Any:
        if option is None:
            option = self.run_dir is not None
        if option is False:
            return None
        if option is True or isinstance(option, str):
            run_dir = self._need_run_dir("metrics")
            path = metrics_path(run_dir) if option is True else metrics_path(run_dir, option.removesuffix(".csv"))
            return MetricsWriter(path, purge_after_step=self._step)
        if not callable(getattr(option, "write", None)):
            raise TypeError(f"metrics must be a bool, a file name or an object with write(step, dict), "
                            f"got {type(option).__name__}")
        return option

    def _need_run_dir(self, what: str) -> str:
        if self.run_dir is None:
            raise ValueError(f"learner {self.name} writes {what} under a run directory: launch it as a "
                             f"node (jd.CourierNode) or pass run_dir=...")
        return self.run_dir

    def _resolve_source(self, source: Any, batch_size: int | None, replay_options: Mapping[str, Any]) -> BatchSource:
        """The source of one dispatch's batch: replay samples all ``steps_per_call`` batches in
        one request; another source is called that many times and its batches stacked."""
        is_client = isinstance(source, courier.Client) or (
            isinstance(source, (list, tuple)) and source
            and all(isinstance(s, courier.Client) for s in source))
        if is_client:
            if batch_size is None:
                raise ValueError(f"learner {self.name}: sampling from replay needs batch_size=")
            return ReplaySource(source, batch_size, steps=self._k, **replay_options)
        if callable(getattr(source, "seek", None)):
            source.seek(self._step)
        if hasattr(source, "__next__") and not callable(source):
            source = source.__next__
        if not callable(source):
            raise TypeError(f"learner {self.name}: source must be a callable next_batch() -> batch, an "
                            f"iterator, or replay node client(s); got {type(source).__name__}")
        return source if self._k == 1 else _Stacked(source, self._k)


DEVICE_PUT_AHEAD_BYTES = 1 << 20
"""Off CPU, batches from this size up go to the devices from the feeder thread, ahead of their step."""

DISTRIBUTED_DEFAULTS = {"heartbeat_timeout_seconds": 10, "initialization_timeout": 120,
                        "shutdown_timeout_seconds": 10}
"""For ``distributed="env"``: when one process of the group dies, the others are stuck in a
collective; the coordination service's heartbeat then aborts them (JAX's default waits 100 s)
and the supervisor restarts the whole group from its checkpoint. Override with
``JAXDIST_HEARTBEAT_TIMEOUT`` (seconds)."""


def initial_state(logic: LearnerLogic, init_key: jax.Array) -> PyTree:
    """What a learner checkpoints, before its first step: its state and step. A restore (the
    learner's, ``load_policy``'s) needs only its shapes: ``jax.eval_shape`` of this."""
    return {"state": logic.init(init_key), "step": jnp.zeros((), jnp.int32)}


def _distributed_arguments(distributed: Mapping[str, Any] | str) -> dict[str, Any]:
    if distributed != "env":
        if isinstance(distributed, str):
            raise ValueError(f"distributed must be a dict of parallel.initialize arguments or 'env', "
                             f"got {distributed!r}")
        return dict(distributed)
    from jaxdist.launch import hosts  # the launcher's side of the contract

    arguments = hosts.distributed_from_env()
    if arguments is None:
        raise ValueError("distributed='env', but this process has no JAXDIST_COORDINATOR_ADDRESS: launch with "
                         "launcher='multihost' and place the learner group per_host()")
    heartbeat = os.environ.get("JAXDIST_HEARTBEAT_TIMEOUT")
    overrides = {"heartbeat_timeout_seconds": int(heartbeat)} if heartbeat else {}
    return {**DISTRIBUTED_DEFAULTS, **overrides, **arguments}


@dataclasses.dataclass(frozen=True)
class _CountedUpdate:
    """The user's update with the step counter kept in the state and the RNG folded by it."""

    update: parallel.Update

    def __call__(self, train: PyTree, batch: PyTree, rng: jax.Array) -> tuple[PyTree, PyTree]:
        key = jax.random.wrap_key_data(jax.random.fold_in(rng, train["step"]))
        state, metrics = self.update(train["state"], batch, key)
        return {"state": state, "step": train["step"] + 1}, metrics


@jax.jit
def _copy_tree(tree: PyTree) -> PyTree:
    """New buffers for every leaf in one dispatch (a ``jnp.copy`` per leaf costs ~20 us each)."""
    return jax.tree.map(jnp.copy, tree)


def _crossed(before: int, after: int, every: int | None) -> bool:
    return every is not None and after // every > before // every


def _host_metrics(metrics: PyTree, steps_per_call: int) -> dict[str, float]:
    """Metrics as host floats named by their path; a call's scanned steps are averaged."""
    flat = {}
    for path, value in jax.tree_util.tree_flatten_with_path(jax.device_get(metrics))[0]:
        name = "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
        value = np.asarray(value)
        flat[name or "value"] = float(value.mean(axis=0).mean() if steps_per_call > 1 else value.mean())
    return flat


class _Rate:
    """Steps per second between reads of ``value``, timed from the end of the first call
    (which compiles); dispatch is asynchronous, so this is the rate of dispatching."""

    def __init__(self) -> None:
        self._mark: tuple[float, int] | None = None
        self._last = 0.0

    def tick(self, step: int) -> None:
        if self._mark is None:
            self._mark = (time.monotonic(), step)
        self._step = step

    @property
    def value(self) -> float:
        if self._mark is None:
            return 0.0
        now, (then, start) = time.monotonic(), self._mark
        if self._step > start and now > then:
            self._last = (self._step - start) / (now - then)
            self._mark = (now, self._step)
        return self._last


_END = object()


@dataclasses.dataclass(frozen=True)
class _Stacked:
    """``steps`` batches of a source stacked along a new leading axis: one dispatch's input."""

    source: BatchSource
    steps: int

    def __call__(self) -> PyTree:
        return jax.tree.map(lambda *xs: np.stack(xs), *(self.source() for _ in range(self.steps)))


class _Feeder:
    """A thread that calls the source and puts batches on devices ahead of the step loop."""

    def __init__(self, source: BatchSource, shard: Callable[[PyTree], PyTree], size: int) -> None:
        self._source, self._shard = source, shard
        self._queue: queue.Queue = queue.Queue(maxsize=max(size, 1))
        self._closed = threading.Event()
        self._inline = size == 0
        self._ended = False
        self._thread = None
        if not self._inline:
            self._thread = threading.Thread(target=self._loop, name="learner-feeder", daemon=True)
            self._thread.start()

    def get(self, timeout: float) -> Any:
        """The next device batch, ``_END`` when the source ended, None on timeout."""
        if self._inline:
            if self._ended:
                return _END
            try:
                return self._next()
            except StopIteration:
                self._ended = True
                return _END
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, _Failure):
            raise RuntimeError(f"the learner's batch source failed:\n{item.details}")
        if item is _END:
            self._queue.put(_END)  # stays ended
        return item

    def close(self) -> None:
        """Stop the thread; one blocked in the source (waiting for data) is left behind."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=0.5)

    def _next(self) -> PyTree:
        return self._shard(self._source())

    def _loop(self) -> None:
        try:
            while not self._closed.is_set():
                self._put(self._next())
        except StopIteration:
            self._put(_END)
        except BaseException:
            self._put(_Failure(traceback.format_exc()))

    def _put(self, item: Any) -> None:
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue


@dataclasses.dataclass
class _Failure:
    details: str


class _HostIO:
    """A thread that copies published params and logged metrics to the host, then publishes
    (latest version wins) and writes rows, in order, so the step loop never waits on them."""

    def __init__(self, writer: Any, name: str) -> None:
        self._writer, self._name = writer, name
        self._cond = threading.Condition()
        self._params: tuple | None = None
        self._rows: list[tuple] = []
        self._counts: list[Any] = []
        self.env_steps = 0  # counted from the updates' env_steps metric
        self._flush = False
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="learner-io", daemon=True)
        self._thread.start()

    def publish(self, version: int, device_params: PyTree, done: Callable[[int, PyTree], None]) -> None:
        with self._cond:
            self._params = (version, device_params, done)
            self._cond.notify_all()

    def count(self, env_steps: PyTree) -> None:
        """Add a dispatch's env steps (device values, one per scanned update) to ``env_steps``."""
        with self._cond:
            self._counts.append(env_steps)
            self._cond.notify_all()

    def log(self, step: int, metrics: PyTree, steps_per_call: int, extra: dict[str, float]) -> None:
        with self._cond:
            self._rows.append((step, metrics, steps_per_call, extra))
            self._cond.notify_all()

    def flush(self) -> None:
        """Flush the metrics file after the rows logged so far are written."""
        with self._cond:
            self._flush = True
            self._cond.notify_all()

    def drain(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not (self._params or self._rows or self._counts or self._flush or self._busy)
                                or self._closed)

    def close(self) -> None:
        self.drain()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._params or self._rows or self._counts or self._flush or self._closed)
                if self._closed:
                    return
                params, self._params = self._params, None
                rows, self._rows = self._rows, []
                counts, self._counts = self._counts, []
                flush, self._flush = self._flush, False
                self._busy = True
            try:
                self.env_steps += sum(int(np.sum(count)) for count in jax.device_get(counts))
                for step, metrics, k, extra in rows:
                    self._writer.write(step, {**_host_metrics(metrics, k), **extra})
                if flush and hasattr(self._writer, "flush"):
                    self._writer.flush()
                if params is not None:
                    version, device_params, done = params
                    host = jax.device_get(device_params)
                    done(version, host)
            except Exception:
                print(f"{self._name}: publishing or logging failed (training goes on):\n"
                      f"{traceback.format_exc()}", flush=True)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


__all__ = ["DISTRIBUTED_DEFAULTS", "BatchSource", "CheckpointOptions", "Learner", "LearnerLogic", "ReplaySource", "state_params"]
