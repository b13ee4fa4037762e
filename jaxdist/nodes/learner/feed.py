"""A learner's batches: where one dispatch's batch comes from, its shapes checked, on the
devices before its step, and fetched ahead of use by a thread.

A part of its own because the step loop only ever asks for the next batch on the devices:
whether it was sampled from replay nodes in one request for all of a dispatch's scanned
updates, stacked from a callable's batches, or pushed through ``update()`` is the feed's
business. A source with a ``seek(step)`` method is told the step training starts at (0, or
the restored step) before its first call, so a deterministic source (a dataset read in order)
resumes where the checkpoint left off rather than from its beginning.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxdist import courier
from jaxdist.launch import context
from jaxdist.learning import parallel
from jaxdist.learning.learner_logic import PyTree

BatchSource = Callable[[], PyTree]
"""``next_batch() -> pytree``: this process's rows of one SGD step's batch (batch on axis 0);
raising ``StopIteration`` ends training."""

Source = BatchSource | courier.Client | Sequence[courier.Client]
"""What a learner is fed from: a :data:`BatchSource` (a :class:`ReplaySource` among them) or replay node client(s)."""

DEVICE_PUT_AHEAD_BYTES = 1 << 20
"""Off CPU, batches from this size up go to the devices from the feeder thread, ahead of their step."""

END = object()
"""What :meth:`Feed.next` returns once the source has ended."""


@dataclasses.dataclass
class ReplaySource:
    """The batch source over replay nodes' clients: each call samples ``steps`` batches of
    ``batch_size`` items in one request (a learner sets ``steps`` to its ``steps_per_call``).

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
    that need the probabilities (prioritized replay) or the keys. A batch mixing item structures
    (the sample's ``"stacked"`` False) is refused.
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
            if not sample.pop("stacked", True):
                raise ValueError(f"table '{self.table}' gave a batch of items of different structures, which a learner "
                                 f"cannot train on: give the table a signature (jd.replay.Uniform(..., signature=...)) "
                                 f"so every item matches it")
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


class Feed:
    """The batches of the step ``dp`` runs, from training step ``step`` on: from ``source``
    (None: only those ``place``d for ``update()``), ``prefetch`` of them fetched and placed
    ahead of use by a thread (0: fetched inline; batches fetched ahead from a Fifo are not
    trained on if the learner stops). Replay node client(s) as the source are sampled
    ``batch_size`` items a batch, a dispatch's batches in one request (as a
    :class:`ReplaySource` is); another source is called once per batch, its batches stacked."""

    def __init__(self, dp: parallel.DataParallel, source: Source | None, *, prefetch: int = 2, step: int = 0,
                 batch_size: int | None = None, name: str = "learner") -> None:
        self._dp, self._k, self._name = dp, dp.steps_per_call, name
        self._local_devices = dp.mesh.local_mesh.devices.size
        # One process under jit: the step's own C++ dispatch places host arrays faster than a
        # device_put from Python. Off CPU a large batch is put on the devices by the feeder
        # instead, ahead of its step, so that its transfer overlaps the step before. On an H200
        # (the learner benchmark's MLP; updates/s against the bare loop, host arrays / put ahead):
        # 64 KB batches 0.74x / 0.57x, 2 MB 0.78x / 1.03x, 32 MB 1.01x / 3.42x.
        platform = dp.mesh.devices.flat[0].platform
        self._host_batch_bytes = (0 if dp.mode != "jit" or jax.process_count() > 1
                                  else float("inf") if platform == "cpu" else DEVICE_PUT_AHEAD_BYTES)
        self._feeder = (_Feeder(self._dispatch_source(source, step, batch_size), self.place, prefetch)
                        if source is not None else None)

    @property
    def has_source(self) -> bool:
        """False when batches only arrive through ``update()``."""
        return self._feeder is not None

    def place(self, batch: PyTree) -> PyTree:
        """Check a batch's shapes, then put it on devices (or pass host arrays straight to jit)."""
        size = self._check(batch)
        return batch if size < self._host_batch_bytes else self._dp.shard_batch(batch)

    def next(self, timeout: float) -> Any:
        """The next placed batch from the source, :data:`END` once it ended, None on timeout."""
        return self._feeder.get(timeout)

    def close(self) -> None:
        """Stop fetching ahead."""
        if self._feeder is not None:
            self._feeder.close()

    def _dispatch_source(self, source: Any, step: int, batch_size: int | None) -> BatchSource:
        """The source of one dispatch's batches, told the step it starts at."""
        is_client = isinstance(source, courier.Client) or (
            isinstance(source, (list, tuple)) and source and all(isinstance(s, courier.Client) for s in source))
        if is_client:
            if batch_size is None:
                raise ValueError(f"learner {self._name}: sampling from replay needs batch_size=")
            source = ReplaySource(source, batch_size)
        if isinstance(source, ReplaySource):
            return dataclasses.replace(source, steps=self._k)
        if not callable(source):
            raise TypeError(f"learner {self._name}: source must be a callable next_batch() -> batch or replay node "
                            f"client(s); got {type(source).__name__}")
        if callable(getattr(source, "seek", None)):
            source.seek(step)
        return source if self._k == 1 else _Stacked(source, self._k)

    def _check(self, batch: PyTree) -> int:
        """Refuse a batch of the wrong shapes; its size in bytes."""
        n = self._local_devices
        axis = int(self._k > 1)
        size = 0
        for leaf in jax.tree.leaves(batch):
            shape = np.shape(leaf)
            if len(shape) <= axis or shape[axis] % n or (self._k > 1 and shape[0] != self._k):
                want = f"({self._k}, batch, ...)" if self._k > 1 else "(batch, ...)"
                raise ValueError(f"learner {self._name}: batch leaf of shape {shape} must be {want} "
                                 f"with the batch a multiple of {n} local devices")
            size += getattr(leaf, "nbytes", 0)
        return size


@dataclasses.dataclass(frozen=True)
class _Stacked:
    """``steps`` batches of a source stacked along a new leading axis: one dispatch's input."""

    source: BatchSource
    steps: int

    def __call__(self) -> PyTree:
        # A list, not a generator: the source's StopIteration must end the feed, not become a RuntimeError.
        return jax.tree.map(lambda *xs: np.stack(xs), *[self.source() for _ in range(self.steps)])


class _Feeder:
    """A thread that calls the source and places batches ahead of the step loop (or, with
    ``size`` 0, the caller fetching inline)."""

    def __init__(self, source: BatchSource, place: Callable[[PyTree], PyTree], size: int) -> None:
        self._source, self._place = source, place
        self._queue: queue.Queue = queue.Queue(maxsize=max(size, 1))
        self._closed = threading.Event()
        self._inline = size == 0
        self._ended = False
        self._thread = None
        if not self._inline:
            self._thread = threading.Thread(target=self._loop, name="learner-feeder", daemon=True)
            self._thread.start()

    def get(self, timeout: float) -> Any:
        if self._inline:
            if self._ended:
                return END
            try:
                return self._next()
            except StopIteration:
                self._ended = True
                return END
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, _Failure):
            raise RuntimeError(f"the learner's batch source failed:\n{item.details}")
        if item is END:
            self._queue.put(END)  # stays ended
        return item

    def close(self) -> None:
        """Stop the thread; one blocked in the source (waiting for data) is left behind."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=0.5)

    def _next(self) -> PyTree:
        return self._place(self._source())

    def _loop(self) -> None:
        try:
            while not self._closed.is_set():
                self._put(self._next())
        except StopIteration:
            self._put(END)
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
