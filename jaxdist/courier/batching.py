"""`batched_handler`: many callers' requests served as one call of a batched function -- the
central-inference pattern (one policy evaluation for every actor's observation).

Each caller's arguments are stacked with the other callers' (arrays gain a leading batch axis,
dicts and tuples are batched leaf by leaf, anything else is gathered into a list); the function
returns a batched result, and each caller gets its own row. Callers wait in their own threads
(a server's pool threads), and whichever waiting caller finds a batch ready runs it, so no extra
thread is needed. A batch runs when `batch_size` calls are waiting or the oldest has waited
`timeout` seconds: with fewer pool threads than `batch_size`, batches are smaller, never stuck.

Only calls of one signature -- the same arguments by position and by name, the same structure,
each array's shape and dtype -- share a batch: a caller whose arguments cannot stack with the
others' would otherwise fail every call of its batch. It is batched with its own kind.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np


def batched_handler(batch_size: int, max_parallelism: int = 1, timeout: float = 0.2,
                    pad_batch: bool = False) -> Callable[[Callable[..., Any]], "BatchedHandler"]:
    """Decorate a function or a method so that concurrent calls are served in batches of at most
    `batch_size`, at most `max_parallelism` batches at once; a partial batch runs after
    `timeout` seconds (padded to `batch_size` by repeating its last call when `pad_batch`, so
    that a jitted function sees one shape). Used on a method in a class body it batches per
    instance; Launchpad's way, ``self.f = batched_handler(8)(self.f)`` in ``__init__``, works too.
    """
    if batch_size < 1 or max_parallelism < 1:
        raise ValueError(f"batch_size and max_parallelism must be >= 1, got {batch_size} and {max_parallelism}")
    if not timeout >= 0:
        raise ValueError(f"timeout is seconds a partial batch waits (>= 0), got {timeout}")

    def decorate(function: Callable[..., Any]) -> BatchedHandler:
        return BatchedHandler(function, batch_size, max_parallelism, timeout, pad_batch)

    return decorate


class _Call:
    __slots__ = ("args", "kwargs", "signature", "arrived", "done", "result", "error")

    def __init__(self, args: tuple, kwargs: dict) -> None:
        self.args, self.kwargs = args, kwargs
        self.signature = (signature(args), signature(kwargs))
        self.arrived = time.monotonic()
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


class BatchedHandler:
    """A function whose calls are batched (see `batched_handler`); courier serves it as any
    other method, and calling it directly batches the same way."""

    def __init__(self, function: Callable[..., Any], batch_size: int, max_parallelism: int, timeout: float,
                 pad_batch: bool) -> None:
        functools.update_wrapper(self, function)
        self._function = function
        self.batch_size, self.max_parallelism, self.timeout, self.pad_batch = (
            batch_size, max_parallelism, timeout, pad_batch)
        self._waiting: list[_Call] = []
        self._running = 0
        self._changed = threading.Condition()
        self._per_instance = f"_batched_{getattr(function, '__name__', id(self))}"

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """On an instance: that instance's own batcher (its calls batch with each other only)."""
        if instance is None:
            return self
        bound = instance.__dict__.get(self._per_instance)
        if bound is None:
            bound = instance.__dict__[self._per_instance] = BatchedHandler(
                self._function.__get__(instance, owner), self.batch_size, self.max_parallelism, self.timeout,
                self.pad_batch)
        return bound

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = _Call(args, kwargs)
        with self._changed:
            self._waiting.append(call)
            self._changed.notify_all()
            while not call.done:
                batch = self._take_ready_batch()
                if batch is None:
                    self._changed.wait(self._until_next_batch())
                    continue
                self._running += 1
                self._changed.release()
                try:
                    self._run(batch)
                finally:
                    self._changed.acquire()
                    self._running -= 1
                    self._changed.notify_all()
        if call.error is not None:
            raise call.error
        return call.result

    def _take_ready_batch(self) -> list[_Call] | None:
        """Calls of one signature: a full batch of any, else the oldest call's once it timed out."""
        if not self._waiting or self._running >= self.max_parallelism:
            return None
        kinds: dict[Hashable, list[_Call]] = {}
        for call in self._waiting:
            kinds.setdefault(call.signature, []).append(call)
        ready = next((calls for calls in kinds.values() if len(calls) >= self.batch_size), None)
        if ready is None:
            oldest = self._waiting[0]
            if time.monotonic() - oldest.arrived < self.timeout:
                return None
            ready = kinds[oldest.signature]
        batch = ready[:self.batch_size]
        taken = set(map(id, batch))
        self._waiting = [call for call in self._waiting if id(call) not in taken]
        return batch

    def _until_next_batch(self) -> float | None:
        if not self._waiting or self._running >= self.max_parallelism:
            return None  # woken when a call arrives or a batch ends
        return max(0.0, self._waiting[0].arrived + self.timeout - time.monotonic())

    def _run(self, batch: list[_Call]) -> None:
        calls = batch + [batch[-1]] * (self.batch_size - len(batch)) if self.pad_batch else batch
        try:
            args = [stack([call.args[i] for call in calls]) for i in range(len(calls[0].args))]
            kwargs = {key: stack([call.kwargs[key] for call in calls]) for key in calls[0].kwargs}
            results = self._function(*args, **kwargs)
            rows = [unstack(results, i, len(calls)) for i in range(len(batch))]
        except BaseException as exc:
            for call in batch:
                call.error = exc
        else:
            for call, row in zip(batch, rows):
                call.result = row
        finally:
            with self._changed:
                for call in batch:
                    call.done = True
                self._changed.notify_all()


def signature(value: Any) -> Hashable:
    """What calls must share for `stack` to batch their values: the structure of dicts and
    tuples, each array's shape and dtype, the type of anything else."""
    if isinstance(value, dict):
        return dict, frozenset((key, signature(item)) for key, item in value.items())
    if isinstance(value, tuple):
        return type(value), tuple(signature(item) for item in value)
    if isinstance(value, (np.ndarray, np.generic)) or hasattr(value, "__array_namespace__"):
        return np.ndarray, tuple(value.shape), str(value.dtype)
    return type(value)


def stack(values: list[Any]) -> Any:
    """Callers' values as one batched value: arrays stacked on a new leading axis, dicts and
    tuples batched per element, anything else gathered into a list."""
    first = values[0]
    if isinstance(first, dict):
        return {key: stack([value[key] for value in values]) for key in first}
    if isinstance(first, tuple):
        parts = [stack(list(column)) for column in zip(*values)]
        return type(first)(*parts) if hasattr(first, "_fields") else tuple(parts)
    if isinstance(first, (np.ndarray, np.generic)) or hasattr(first, "__array_namespace__"):
        return np.stack([np.asarray(value) for value in values])
    return list(values)


def unstack(batched: Any, row: int, size: int) -> Any:
    """Row `row` of a batched result of `size` rows (the inverse of `stack`)."""
    if isinstance(batched, dict):
        return {key: unstack(value, row, size) for key, value in batched.items()}
    if isinstance(batched, tuple):
        parts = [unstack(value, row, size) for value in batched]
        return type(batched)(*parts) if hasattr(batched, "_fields") else tuple(parts)
    if len(batched) != size:
        raise ValueError(f"a batched handler must return one row per call: got {len(batched)} rows for {size} calls")
    return batched[row]
