"""Data-parallel learner steps over a device mesh, multi-host setup and preemption.

One update function, written for the *global* batch, runs on both paths:

    def update(state, batch, rng):
        grads = jax.grad(loss)(state.params, batch)      # loss = mean over the batch
        grads = parallel.pmean(grads)                    # identity under jit
        ...
        return new_state, {"loss": ...}

- ``mode="jit"`` (main path): ``jax.jit`` with ``NamedSharding``; the state is replicated, the
  batch split along the ``data`` axis. The update sees the global batch, so XLA averages the
  gradients itself and ``pmean`` is the identity.
- ``mode="pmap"``: every device runs the update on its shard; ``pmean`` averages over devices.
  Metrics are averaged over devices by the step, so both paths return the same metrics.
"""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import itertools
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

PyTree = Any
Update = Callable[[PyTree, PyTree, jax.Array], tuple[PyTree, PyTree]]

_PMAP_AXIS: contextvars.ContextVar[str | None] = contextvars.ContextVar("pmap_axis", default=None)


def make_mesh(devices: Sequence[jax.Device] | None = None, axis_name: str = "data") -> Mesh:
    """A 1-D mesh over ``devices`` (default: all global devices) with an Auto axis.

    ``jax.make_mesh`` now defaults to Explicit axes, which changes how jit propagates shardings;
    the data-parallel step relies on the classic Auto behaviour.
    """
    devices = list(jax.devices() if devices is None else devices)
    return jax.make_mesh((len(devices),), (axis_name,), (AxisType.Auto,), devices=devices)


def pmean(tree: PyTree) -> PyTree:
    """Mean over the data-parallel devices inside a ``mode="pmap"`` step; identity otherwise.

    Under jit the update already sees the global batch, so there is nothing to average.
    """
    axis = _PMAP_AXIS.get()
    return tree if axis is None else jax.lax.pmean(tree, axis)


def weighted_mean(x: jax.Array, weight: jax.Array) -> jax.Array:
    """``sum(x w) / sum(w)`` over the global batch, as a term of a loss or a metric: under a pmap
    step this device's sum over its shard, divided by the weight of every shard (the step
    averages gradients and metrics over devices, which sums the numerators). 0 if no weight."""
    count = pmean(jnp.sum(weight))
    return jnp.sum(x * weight) / jnp.where(count > 0, count, 1.0)


def shard_count() -> int | jax.Array:
    """Devices the batch is split over: pmap's inside a ``mode="pmap"`` step, else 1 (under jit
    the update sees the global batch whole). With ``pmean``, it turns a per-shard mean into the
    global batch's, e.g. for a count of samples."""
    axis = _PMAP_AXIS.get()
    return 1 if axis is None else jax.lax.psum(1, axis)


def shard_index() -> int | jax.Array:
    """This device's index among the devices of a ``mode="pmap"`` step, else 0."""
    axis = _PMAP_AXIS.get()
    return 0 if axis is None else jax.lax.axis_index(axis)


def global_batch_from_local(local_batch: PyTree, mesh: Mesh, axis_name: str = "data",
                            batch_axis: int = 0) -> PyTree:
    """Host arrays of this process's share -> global arrays split along ``axis_name``.

    With one process this is a ``device_put``; with several, every process passes its own rows
    and the global batch is their concatenation (in mesh device order).
    """
    spec = P(*([None] * batch_axis), axis_name)
    return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), local_batch)


@dataclasses.dataclass(eq=False)
class DataParallel:
    """A compiled data-parallel step; build it with :func:`data_parallel`.

    Batch leaves have the global batch on axis 0, or ``(steps_per_call, batch, ...)`` when
    ``steps_per_call > 1``; metrics then come back stacked along that leading steps axis.
    """

    update: Update
    mesh: Mesh
    mode: Literal["jit", "pmap"]
    steps_per_call: int
    axis_name: str
    donate: bool
    block_every: int | None
    _calls: int = dataclasses.field(default=0, init=False)
    _pending: PyTree = dataclasses.field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.mode not in ("jit", "pmap"):
            raise ValueError(f"mode must be 'jit' or 'pmap', got {self.mode!r}")
        if self.steps_per_call < 1:
            raise ValueError(f"steps_per_call must be >= 1, got {self.steps_per_call}")
        donate = (0,) if self.donate else ()
        self._replicated = NamedSharding(self.mesh, P())
        self._local_split = NamedSharding(self.mesh.local_mesh, P(self.axis_name))
        if self.mode == "jit":
            batch = P(*([None] * (self.steps_per_call > 1)), self.axis_name)
            self._fn = jax.jit(self._steps, donate_argnums=donate,
                               in_shardings=(self._replicated, NamedSharding(self.mesh, batch),
                                             self._replicated),
                               out_shardings=(self._replicated, self._replicated))
        else:
            self._fn = jax.pmap(self._per_device, self.axis_name, in_axes=(0, 0, None),
                                out_axes=(0, None), devices=list(self.mesh.devices.flat),
                                donate_argnums=donate)
        # Unblocked multi-device collectives queued in a loop can deadlock the CPU backend.
        on_cpu = self.mesh.devices.flat[0].platform == "cpu"
        default = 8 if on_cpu and self.mesh.devices.size > 1 else 0
        self._block = default if self.block_every is None else self.block_every

    def _steps(self, state: PyTree, batch: PyTree, rng: jax.Array) -> tuple[PyTree, PyTree]:
        if self.steps_per_call == 1:
            return self.update(state, batch, rng)
        keys = jax.random.split(rng, self.steps_per_call)
        return jax.lax.scan(lambda s, xs: self.update(s, *xs), state, (batch, keys))

    def _per_device(self, state: PyTree, batch: PyTree, rng: jax.Array) -> tuple[PyTree, PyTree]:
        token = _PMAP_AXIS.set(self.axis_name)
        try:
            device_rng = jax.random.fold_in(rng, jax.lax.axis_index(self.axis_name))
            state, metrics = self._steps(state, batch, device_rng)
            return state, jax.lax.pmean(metrics, self.axis_name)
        finally:
            _PMAP_AXIS.reset(token)

    def __call__(self, state: PyTree, batch: PyTree, rng: jax.Array) -> tuple[PyTree, PyTree]:
        """Run ``steps_per_call`` updates. With ``donate`` the passed state is consumed."""
        state, metrics = self._fn(state, batch, rng)
        self._calls += 1
        if self._block and self._calls % self._block == 0:
            # Wait for the metrics of the call N back, not for this one: at most 2N calls in
            # flight and no pipeline stall (measured faster than not blocking at all).
            jax.block_until_ready(self._pending)
            self._pending = metrics
            if not jax.tree.leaves(metrics):  # nothing to wait on later; the state gets donated
                jax.block_until_ready(state)
        return state, metrics

    def replicate(self, tree: PyTree) -> PyTree:
        """Host or device pytree -> fresh copies on every device, in the step's layout.

        Always copies, so donating the result to the step never deletes ``tree``
        (``device_put(..., may_alias=False)`` still aliases device 0's copy in JAX 0.10.2), and
        needs no collective with several processes (``device_put`` to a global sharding does).
        """
        if self.mode == "jit":
            return jax.tree.map(self._replicate_leaf, tree)
        n = self.mesh.local_mesh.devices.size
        return jax.tree.map(
            lambda x: jax.device_put(jnp.broadcast_to(x, (n, *jnp.shape(x))), self._local_split),
            tree)

    def restore_layout(self, template: PyTree) -> PyTree:
        """Shapes and dtypes of ``template`` (arrays or ``jax.ShapeDtypeStruct``s) placed where a
        checkpoint is restored for the step: replicated under jit; under pmap on this process's
        first device, for ``replicate`` to copy to every device."""
        sharding = self._replicated if self.mode == "jit" else SingleDeviceSharding(self.mesh.local_mesh.devices.flat[0])
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), x.dtype, sharding=sharding), template)

    def _replicate_leaf(self, x: Any) -> jax.Array:
        fresh = jnp.copy(x)
        return jax.make_array_from_callback(fresh.shape, self._replicated, lambda _: fresh)

    def unreplicate(self, tree: PyTree) -> PyTree:
        """One copy of a replicated pytree, on this process's first device."""
        if self.mode == "jit":
            return jax.tree.map(lambda x: x.addressable_data(0), tree)
        return jax.tree.map(lambda x: x.addressable_data(0)[0], tree)

    def shard_batch(self, local_batch: PyTree) -> PyTree:
        """This process's host batch -> device arrays split along the batch axis."""
        batch_axis = int(self.steps_per_call > 1)
        if self.mode == "jit":
            return global_batch_from_local(local_batch, self.mesh, self.axis_name, batch_axis)
        n = self.mesh.local_mesh.devices.size

        def split(x: np.ndarray) -> jax.Array:
            x = np.asarray(x)
            if x.shape[batch_axis] % n:
                raise ValueError(f"batch axis {batch_axis} of shape {x.shape} does not split "
                                 f"over {n} local devices")
            shape = (*x.shape[:batch_axis], n, x.shape[batch_axis] // n, *x.shape[batch_axis + 1:])
            return jax.device_put(np.moveaxis(x.reshape(shape), batch_axis, 0), self._local_split)

        return jax.tree.map(split, local_batch)

    def prefetch(self, batches: Iterable[PyTree], size: int = 2) -> Iterator[PyTree]:
        """Yield sharded batches while the next ``size`` are already on their way to devices."""
        it = iter(batches)
        queue = collections.deque(map(self.shard_batch, itertools.islice(it, size)))
        while queue:
            batch = queue.popleft()
            queue.extend(map(self.shard_batch, itertools.islice(it, 1)))
            yield batch


def data_parallel(update: Update, *, mesh: Mesh | None = None,
                  mode: Literal["jit", "pmap"] = "jit", steps_per_call: int = 1,
                  axis_name: str = "data", donate: bool = True,
                  block_every: int | None = None) -> DataParallel:
    """Turn ``update(state, batch, rng) -> (state, metrics)`` into a data-parallel step.

    ``rng`` is split into one key per step (``steps_per_call > 1``); under pmap each device
    also folds in its index. Under jit, random draws over the global batch do not depend on
    the device count (``jax_threefry_partitionable``), so 1 and 8 devices agree.
    ``block_every``: every N-th call waits for the results of the call N before it, so no more
    than 2N calls are ever queued (0: never wait). None: 8 on a multi-device CPU mesh, where
    unbounded queues of collectives can deadlock XLA's CPU backend, otherwise 0. A learner of
    on-policy data passes 1: its data's policy lag counts dispatched updates, and updates
    queued ahead of their results only age it.
    """
    return DataParallel(update, mesh if mesh is not None else make_mesh(axis_name=axis_name),
                        mode, steps_per_call, axis_name, donate, block_every)


_init_args: dict[str, Any] | None = None


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids: Sequence[int] | None = None,
               **kwargs: Any) -> None:
    """``jax.distributed.initialize`` that may be called again with the same arguments.

    No arguments: JAX auto-detects the cluster (TPU, SLURM, Open MPI). Must run before any
    JAX computation. CPU processes use gloo collectives.

    The coordinator has neither TLS nor a token, so process 0 binds it where
    `coordinator_address` says (JAX's default is every interface), unless
    ``coordinator_bind_address=`` or ``$JAX_COORDINATOR_BIND_ADDRESS`` says otherwise: where
    host 0's own name resolves to loopback there (Debian's /etc/hosts maps it to 127.0.1.1),
    name host 0 by an address, or set the latter.
    """
    global _init_args
    if coordinator_address is not None and "coordinator_bind_address" not in kwargs \
            and "JAX_COORDINATOR_BIND_ADDRESS" not in os.environ:
        kwargs["coordinator_bind_address"] = coordinator_address
    args = dict(coordinator_address=coordinator_address, num_processes=num_processes,
                process_id=process_id, local_device_ids=local_device_ids, **kwargs)
    if jax.distributed.is_initialized():
        known = {k: v for k, v in (_init_args or {}).items() if v is not None}
        known |= {"num_processes": jax.process_count(), "process_id": jax.process_index()}
        clash = {k: (known.get(k), v) for k, v in args.items()
                 if v is not None and known.get(k) != v}
        if clash:
            raise RuntimeError("jax.distributed is already initialized; these arguments differ "
                               f"(current, requested): {clash}")
        return
    if jax.config.jax_cpu_collectives_implementation is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    before = _sigterm_disposition()
    jax.distributed.initialize(**args)
    _init_args = args
    if _jax_syncs_preemption():
        _reclaim_sigterm(before)


def is_primary() -> bool:
    """True on process 0: the only one that publishes parameters and writes metrics."""
    return jax.process_index() == 0


_sigterm = threading.Event()
_handler: Callable[[int, Any], None] | None = None

PREEMPTION_NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"
"""The coordination service's key whose value, a death time, starts JAX's preemption sync
protocol on every process of the ``jax.distributed`` group (TSL's ``preemption_sync_manager``)."""


def _jax_syncs_preemption() -> bool:
    return jax.distributed.is_initialized() and jax.config.jax_enable_preemption_service


def install_sigterm_flag() -> None:
    """Make SIGTERM set a flag for :func:`preemption_requested` instead of killing us.

    Main thread only. A Python handler already installed (a launcher's worker sets the
    program's stop event with one) is chained: it runs first, so whoever sees the flag sees
    what that handler did (the program stopping); the default action (terminate) is not.

    Under ``jax.distributed`` the handler also gives JAX's preemption service its notice, as
    the service's own SIGTERM handler would (which :func:`initialize` takes SIGTERM back from):
    that handler's C++ log line, ``SIGTERM caught at <time>``, read as a crash in the output of
    every ordered stop. Called again, it installs the same handler again.
    """
    global _handler
    if _handler is None:
        previous = signal.getsignal(signal.SIGTERM)

        def handler(signum: int, frame: Any) -> None:
            try:
                if callable(previous):
                    previous(signum, frame)
            finally:
                _sigterm.set()
                post_preemption_notice()

        _handler = handler
    signal.signal(signal.SIGTERM, _handler)


_notice_posted = False


def post_preemption_notice() -> None:
    """The notice JAX's preemption service posts on SIGTERM: a death time of now, after which
    every process of the ``jax.distributed`` group reaches the sync point at one step. A learner
    spanning hosts posts it when its program stops; SIGTERM's handler posts it (once each)."""
    global _notice_posted
    if _notice_posted or not _jax_syncs_preemption():
        return
    import datetime

    from jax._src import distributed

    now = datetime.datetime.now(datetime.timezone.utc).isoformat()
    try:
        distributed.global_state.client.key_value_set(PREEMPTION_NOTICE_KEY, now, allow_overwrite=True)
        _notice_posted = True
    except Exception as error:  # from a signal handler: never raise into whatever the main thread was doing
        print(f"the preemption notice could not reach JAX's coordination service ({error})", flush=True)


_SIGACTION_BYTES = 512
"""More than any libc's ``struct sigaction``, saved and restored whole."""


def _sigterm_disposition() -> Any:
    """The process's SIGTERM disposition as the C library holds it (None off POSIX)."""
    if os.name != "posix":
        return None
    import ctypes

    saved = ctypes.create_string_buffer(_SIGACTION_BYTES)
    ctypes.CDLL(None).sigaction(signal.SIGTERM, None, saved)
    return saved


def _reclaim_sigterm(before: Any) -> None:
    """SIGTERM back from the C++ handler ``jax.distributed.initialize`` installs for its
    preemption service: :func:`install_sigterm_flag`'s handler on the main thread; elsewhere (a
    node's parts are built on threads of their own) the Python handler there was before, whose
    stop the learner turns into the notice (:func:`post_preemption_notice`)."""
    if threading.current_thread() is threading.main_thread():
        install_sigterm_flag()
    elif before is not None and callable(signal.getsignal(signal.SIGTERM)):
        import ctypes

        ctypes.CDLL(None).sigaction(signal.SIGTERM, before, None)


def preemption_requested(step: int) -> bool:
    """Whether to save and stop at ``step``; call it at every step.

    Under ``jax.distributed`` this turns true at the same step on every process, once any of
    them got SIGTERM (JAX's preemption sync point). Otherwise it reports a SIGTERM flag. The
    first call from the main thread installs the handler.
    """
    if _handler is None and threading.current_thread() is threading.main_thread():
        install_sigterm_flag()
    if _jax_syncs_preemption():
        return multihost_utils.reached_preemption_sync_point(step)
    return _sigterm.is_set()
