"""Replay tables: ``Fifo`` for on-policy data, ``Uniform`` and ``Prioritized`` for off-policy data.

Items are pytrees (nested dict/list/tuple/NamedTuple) of arrays, stored column-wise: the first
insert fixes the structure, shapes and dtypes and allocates one ``(max_size, *shape)`` array per
leaf; a later item that differs is refused at insert (its producer hears of it, not a sampler),
and sampling a batch is one fancy index per leaf.

Keys are consecutive ints and key k lives in slot ``k % max_size``: every table drops its oldest
items first (``Fifo`` by delivering them, the others by eviction), so the live keys are always
``[first_key, next_key)``.

``insert_many`` stores a batch atomically: it waits until the whole batch is admitted, then
writes it with consecutive keys, so a caller never has to guess which part of a batch got in.
``insert_batch`` does the same for a batch already stacked (every leaf with a leading items
axis, as ``sample`` returns them): no per-item work, for producers of many small items.

A table remembers the arguments it was built with (``table.spec``); a fresh table pickles as
them, so a program can ship ``Fifo(64)`` to a node's process. A used table refuses to pickle
rather than silently arrive empty: its contents travel through ``state()`` / ``load_state()``.

Threads: one Condition guards a table. Blocking calls wait with an optional timeout (None waits
until ready or closed) and raise ``TimeoutError`` saying what blocked them. ``close()`` wakes every
waiter with ``TableClosedError``; ``size``, ``stats`` and ``state`` keep working after it, so a
server can checkpoint while shutting down.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from jaxdist.nodes.replay.rate_limiters import MinSize, RateLimiter
from jaxdist.nodes.replay.sum_tree import SumTree, check_priorities, last_write_wins


class TableClosedError(RuntimeError):
    """Raised by any call that mutates or waits on a table after ``close()``."""


class Sample(NamedTuple):
    keys: np.ndarray  # int64, (batch_size,): pass back to update_priorities
    data: Any  # the items' pytree with every leaf stacked along a new leading axis
    probabilities: np.ndarray | None  # each draw's chance, for importance weights; None for Fifo


MAX_SAMPLE_ITEMS = 1 << 20
MAX_SAMPLE_BYTES = 1 << 30
"""The most items, and item bytes, one ``sample`` returns: sampling with replacement is not
bounded by the table's size, and an answer is allocated whole before it is sent."""

_LEAF = "*"  # a leaf's structure; None means no structure yet


def _flatten(tree: Any) -> tuple[Any, list[np.ndarray], list[str]]:
    """Returns a hashable description of the structure, the leaves (dict keys sorted), their paths."""
    arrays: list[np.ndarray] = []
    paths: list[str] = []

    def visit(node: Any, path: str) -> Any:
        if isinstance(node, dict):
            keys = tuple(sorted(node))
            return (dict, keys, tuple(visit(node[k], f"{path}[{k!r}]") for k in keys))
        if isinstance(node, (list, tuple)):
            return (type(node), None, tuple(visit(x, f"{path}[{i}]") for i, x in enumerate(node)))
        array = np.asarray(node)
        if array.dtype == object:
            raise TypeError(f"{path} is a {type(node).__name__}, not a numeric array; items hold arrays")
        arrays.append(array)
        paths.append(path)
        return _LEAF

    return visit(tree, "item"), arrays, paths


def _unflatten(treedef: Any, leaves: Iterator[np.ndarray]) -> Any:
    if treedef == _LEAF:
        return next(leaves)
    kind, keys, children = treedef
    values = [_unflatten(child, leaves) for child in children]
    if kind is dict:
        return dict(zip(keys, values))
    return kind(*values) if hasattr(kind, "_fields") else kind(values)


def _describe(treedef: Any) -> str:
    if treedef == _LEAF:
        return _LEAF
    kind, keys, children = treedef
    parts = [_describe(child) for child in children]
    if kind is dict:
        return "{" + ", ".join(f"{k!r}: {p}" for k, p in zip(keys, parts)) + "}"
    if kind is list:
        return "[" + ", ".join(parts) + "]"
    name = "" if kind is tuple else kind.__name__
    return f"{name}({', '.join(parts)}{',' if len(parts) == 1 else ''})"


class _Columns:
    """One preallocated array per leaf; writes take leaves with a leading axis matching ``slots``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.treedef: Any = None
        self.arrays: list[np.ndarray] = []

    def write(self, slots: np.ndarray, treedef: Any, leaves: list[np.ndarray], paths: list[str]) -> None:
        """Checks everything before writing anything, so a refused item leaves the table as it was."""
        for path, leaf in zip(paths, leaves):
            if leaf.shape[:1] != slots.shape:
                raise ValueError(f"{path} has {leaf.shape[:1]} rows for {len(slots)} items")
        if self.treedef is None:
            self.treedef = treedef
            self.arrays = [np.empty((self.capacity, *leaf.shape[1:]), leaf.dtype) for leaf in leaves]
        elif treedef != self.treedef:
            raise ValueError(f"item structure {_describe(treedef)} differs from the table's "
                             f"{_describe(self.treedef)} (fixed by its first item)")
        for path, leaf, array in zip(paths, leaves, self.arrays):
            if leaf.shape[1:] != array.shape[1:] or leaf.dtype != array.dtype:
                raise ValueError(f"{path} has shape {leaf.shape[1:]} {leaf.dtype} but the table stores "
                                 f"{array.shape[1:]} {array.dtype} (fixed by its first item)")
        for leaf, array in zip(leaves, self.arrays):
            array[slots] = leaf

    def row_bytes(self) -> int:
        """Bytes of one stored item (0 before the first insert fixes its layout)."""
        return sum(array[0].nbytes for array in self.arrays)

    def read(self, slots: np.ndarray) -> Any:
        return None if self.treedef is None else _unflatten(self.treedef, (a[slots] for a in self.arrays))


class TableSpec(NamedTuple):
    """A table's class and constructor arguments: what a program ships instead of a live table."""

    cls: type
    args: tuple
    kwargs: dict

    def build(self) -> "_Table":
        """A fresh, empty table built as the original was."""
        return self.cls(*self.args, **self.kwargs)


def _build(spec: TableSpec) -> "_Table":
    return spec.build()


class _Table:
    """Storage, keys, waiting, closing and snapshots; subclasses decide who waits and who is drawn."""

    def __new__(cls, *args: Any, **kwargs: Any) -> "_Table":
        table = super().__new__(cls)
        table.spec = TableSpec(cls, args, kwargs)
        return table

    def __reduce__(self) -> tuple:
        stats = self.stats()
        if stats["inserts"] or stats["samples"] or stats["closed"]:
            raise TypeError(f"{self!r} has been used ({stats['inserts']} inserts, {stats['samples']} samples"
                            f"{', closed' if stats['closed'] else ''}); only a fresh table pickles (as its "
                            "constructor arguments); move contents with state() and load_state()")
        return (_build, (self.spec,))

    def __init__(self, max_size: int) -> None:
        if not isinstance(max_size, (int, np.integer)) or isinstance(max_size, bool) or max_size < 1:
            raise ValueError(f"max_size must be an int >= 1, got {max_size!r}")
        self.max_size = int(max_size)
        self._cond = threading.Condition()
        self._columns = _Columns(self.max_size)
        self._first_key = 0
        self._next_key = 0
        self._closed = False
        self._counts = dict(inserts=0, samples=0, evictions=0, insert_waits=0, sample_waits=0, timeouts=0)

    def insert(self, item: Any, priority: float | None = None, timeout: float | None = None) -> int:
        """Stores a copy of ``item`` and returns its key; blocks while the table refuses inserts."""
        priorities = None if priority is None else [priority]
        priorities = self._check_priorities(priorities, 1)
        treedef, leaves, paths = _flatten(item)
        rows = [leaf[None] for leaf in leaves]
        return int(self._insert_rows(1, treedef, rows, paths, priorities, timeout)[0])

    def insert_many(self, items: Sequence[Any], priorities: Sequence[float] | None = None,
                    timeout: float | None = None) -> np.ndarray:
        """Stores copies of ``items`` all at once (or none of them) and returns their keys, int64.

        Waits until the whole batch is admitted; a batch that could never be admitted at once (more
        than ``max_size`` items, or more than the rate limiter's window allows) is refused at once.
        """
        items = list(items)
        n = len(items)
        priorities = self._check_priorities(priorities, n)
        if n == 0:
            return np.empty(0, np.int64)
        self._check_insert_batch(n)
        flat = [_flatten(item) for item in items]
        treedef, first, paths = flat[0]
        for i, (other, leaves, _) in enumerate(flat[1:], 1):
            if other != treedef:
                raise ValueError(f"items[{i}] has structure {_describe(other)} but items[0] has {_describe(treedef)}")
            for path, a, b in zip(paths, first, leaves):
                if a.shape != b.shape or a.dtype != b.dtype:
                    raise ValueError(f"items[{i}]: {path} has shape {b.shape} {b.dtype} but in items[0] it has "
                                     f"{a.shape} {a.dtype}")
        columns = [np.stack(column) for column in zip(*(leaves for _, leaves, _ in flat))]
        return self._insert_rows(n, treedef, columns, paths, priorities, timeout)

    def insert_batch(self, batch: Any, priorities: Sequence[float] | None = None,
                     timeout: float | None = None) -> np.ndarray:
        """``insert_many`` for items stacked along a leading axis of every leaf of ``batch``."""
        treedef, columns, paths = _flatten(batch)
        lengths = {len(column) if column.ndim else None for column in columns}
        if len(lengths) != 1 or None in lengths:
            raise ValueError(f"insert_batch takes leaves stacked along a leading items axis of one length; got "
                             f"shapes {', '.join(f'{path}: {c.shape}' for path, c in zip(paths, columns))}")
        n = lengths.pop()
        priorities = self._check_priorities(priorities, n)
        if n == 0:
            return np.empty(0, np.int64)
        self._check_insert_batch(n)
        return self._insert_rows(n, treedef, columns, paths, priorities, timeout)

    def _insert_rows(self, n: int, treedef: Any, rows: list[np.ndarray], paths: list[str],
                     priorities: np.ndarray | None, timeout: float | None) -> np.ndarray:
        with self._cond:
            self._wait(lambda: self._can_insert(n), timeout, "insert_waits", lambda: self._insert_blocked(n))
            keys = np.arange(self._next_key, self._next_key + n, dtype=np.int64)
            slots = keys % self.max_size
            self._columns.write(slots, treedef, rows, paths)
            overflow = max(0, self._size() + n - self.max_size)  # only tables that evict get here
            self._first_key += overflow
            self._counts["evictions"] += overflow
            self._next_key += n
            self._counts["inserts"] += n
            self._on_insert(slots, priorities)
            self._cond.notify_all()
        return keys

    def sample(self, batch_size: int, timeout: float | None = None) -> Sample:
        """Returns ``batch_size`` items stacked; blocks while the table cannot provide them."""
        if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if batch_size > MAX_SAMPLE_ITEMS:
            raise ValueError(f"a sample of {batch_size} items is more than one call may take ({MAX_SAMPLE_ITEMS}); "
                             "sample fewer items per call")
        self._check_batch_size(batch_size)
        with self._cond:
            self._check_sample_bytes(batch_size)
            self._wait(lambda: self._can_sample(batch_size), timeout, "sample_waits",
                       lambda: self._sample_blocked(batch_size))
            self._check_sample_bytes(batch_size)  # the first insert may have come meanwhile
            keys, probabilities = self._draw(batch_size)
            data = self._columns.read(keys % self.max_size)
            self._counts["samples"] += batch_size
            self._cond.notify_all()
        return Sample(keys, data, probabilities)

    def size(self) -> int:
        with self._cond:
            return self._size()

    def stats(self) -> dict[str, int | bool]:
        """Counters since creation (``samples`` counts items, ``*_waits`` calls that had to block)."""
        with self._cond:
            return dict(self._counts, size=self._size(), max_size=self.max_size, closed=self._closed)

    def close(self) -> None:
        """Wakes every waiter with TableClosedError and refuses later inserts, samples and updates."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def state(self) -> dict[str, Any]:
        """A snapshot of plain arrays and ints: items (stacked, oldest first), keys, counters, RNG."""
        with self._cond:
            slots = np.arange(self._first_key, self._next_key) % self.max_size
            return dict(first_key=self._first_key, next_key=self._next_key, items=self._columns.read(slots),
                        counters=dict(self._counts), **self._extra_state(slots))

    def load_state(self, state: dict[str, Any]) -> None:
        """Replaces the contents with a ``state()`` snapshot taken from a table built the same way.

        Container types must survive the checkpoint (a tuple restored as a list is a different
        structure for later inserts): restore with a target, or rebuild them before loading.
        """
        first, next_key = int(state["first_key"]), int(state["next_key"])
        if not 0 <= next_key - first <= self.max_size:
            raise ValueError(f"state holds {next_key - first} items but max_size is {self.max_size}")
        slots = np.arange(first, next_key) % self.max_size
        columns = _Columns(self.max_size)
        if state["items"] is not None:
            columns.write(slots, *_flatten(state["items"]))
        counts = {name: int(state["counters"][name]) for name in self._counts}
        with self._cond:
            self._check_open()
            self._load_extra_state(state, slots)
            self._columns, self._first_key, self._next_key, self._counts = columns, first, next_key, counts
            self._cond.notify_all()

    def _size(self) -> int:
        return self._next_key - self._first_key

    def _check_sample_bytes(self, batch_size: int) -> None:
        row = self._columns.row_bytes()
        if batch_size * row > MAX_SAMPLE_BYTES:
            raise ValueError(f"a sample of {batch_size} items of {row} bytes ({batch_size * row} bytes) is more than "
                             f"one call may return ({MAX_SAMPLE_BYTES} bytes); sample fewer items per call")

    def _check_open(self) -> None:
        if self._closed:
            raise TableClosedError(f"{self!r} is closed (its server is shutting down); stop calling it")

    def _wait(self, ready: Callable[[], bool], timeout: float | None, counter: str,
              blocked: Callable[[], str]) -> None:
        """Waits until ``ready()``; raises TimeoutError naming the cause, or TableClosedError."""
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be None or >= 0 seconds, got {timeout!r}")
        self._check_open()
        if ready():
            return
        self._counts[counter] += 1
        if not self._cond.wait_for(lambda: self._closed or ready(), timeout):
            self._counts["timeouts"] += 1
            raise TimeoutError(f"{blocked()} (gave up after {timeout} s)")
        self._check_open()

    def _check_priorities(self, priorities: Sequence[float] | None, n: int) -> np.ndarray | None:
        if priorities is not None:
            raise ValueError(f"{type(self).__name__} has no priorities; pass priority=None or use Prioritized")
        return None

    def _check_insert_batch(self, n: int) -> None:
        if n > self.max_size:
            raise ValueError(f"a batch of {n} items exceeds {self!r}'s max_size; insert fewer items per call")

    def _on_insert(self, slots: np.ndarray, priorities: np.ndarray | None) -> None:
        pass

    def _extra_state(self, slots: np.ndarray) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: dict[str, Any], slots: np.ndarray) -> None:
        pass


class Fifo(_Table):
    """An on-policy queue: ``sample(n)`` waits for exactly n items and removes them, oldest first.

    Inserts wait while the queue is full, so slow learners push back on actors. A batch larger
    than ``max_size`` is refused at once: the sampler would wait for items the inserters could
    never add.
    """

    def __repr__(self) -> str:
        return f"Fifo(max_size={self.max_size})"

    def _can_insert(self, n: int) -> bool:
        return self._size() + n <= self.max_size

    def _can_sample(self, batch_size: int) -> bool:
        return self._size() >= batch_size

    def _check_batch_size(self, batch_size: int) -> None:
        if batch_size > self.max_size:
            raise ValueError(f"batch_size {batch_size} exceeds Fifo max_size {self.max_size}; "
                             "a Fifo sample removes items, so it can never be satisfied")

    def _draw(self, batch_size: int) -> tuple[np.ndarray, None]:
        keys = np.arange(self._first_key, self._first_key + batch_size, dtype=np.int64)
        self._first_key += batch_size
        return keys, None

    def _insert_blocked(self, n: int) -> str:
        room = self.max_size - self._size()
        state = f"full ({self.max_size} items)" if room == 0 else f"short of room ({room} free, {n} to insert)"
        return (f"Fifo is {state} and no sampler took any; "
                "sample faster, raise max_size, or pass a longer timeout")

    def _sample_blocked(self, batch_size: int) -> str:
        return (f"Fifo holds {self._size()} of the {batch_size} items asked for; "
                "insert more, ask for fewer, or pass a longer timeout")


def _rng_state(rng: np.random.Generator) -> np.ndarray:
    """PCG64's 128-bit state as uint64 words, since checkpoints hold no Python big ints."""
    state = rng.bit_generator.state
    mask = (1 << 64) - 1
    pcg, inc = state["state"]["state"], state["state"]["inc"]
    return np.array([pcg >> 64, pcg & mask, inc >> 64, inc & mask, state["has_uint32"], state["uinteger"]],
                    dtype=np.uint64)


def _rng_from_state(words: np.ndarray) -> np.random.Generator:
    w = [int(x) for x in np.asarray(words, dtype=np.uint64)]
    bit_generator = np.random.PCG64()
    bit_generator.state = {"bit_generator": "PCG64", "has_uint32": w[4], "uinteger": w[5],
                           "state": {"state": w[0] << 64 | w[1], "inc": w[2] << 64 | w[3]}}
    return np.random.Generator(bit_generator)


class _SampledTable(_Table):
    """Samples with replacement, evicts the oldest item when full, and waits on a rate limiter.

    ``rate_limiter`` defaults to ``MinSize(1)``; ``seed`` fixes the sampling stream.
    """

    def __init__(self, max_size: int, rate_limiter: RateLimiter | None = None, seed: int | None = None) -> None:
        super().__init__(max_size)
        self.rate_limiter = MinSize(1) if rate_limiter is None else rate_limiter
        if self.rate_limiter.min_size > self.max_size:
            raise ValueError(f"{self.rate_limiter!r} waits for {self.rate_limiter.min_size} items but "
                             f"max_size is {self.max_size}, so samplers would wait forever")
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_size={self.max_size}, rate_limiter={self.rate_limiter!r})"

    def _counters(self) -> dict[str, int]:
        return dict(size=self._size(), inserts=self._counts["inserts"], samples=self._counts["samples"])

    def _can_insert(self, n: int) -> bool:
        return self.rate_limiter.can_insert(n, **self._counters())

    def _check_insert_batch(self, n: int) -> None:
        super()._check_insert_batch(n)
        limiter = self.rate_limiter
        spi = limiter.samples_per_insert
        if n * spi > limiter.max_diff - limiter.min_diff - max(1.0, spi):
            raise ValueError(f"a batch of {n} inserts can never be admitted at once under {limiter!r}: its window "
                             f"max_diff - min_diff = {limiter.max_diff - limiter.min_diff} leaves room for at most "
                             f"{int((limiter.max_diff - limiter.min_diff - max(1.0, spi)) // spi)}; insert fewer "
                             "items per call or widen error_buffer")

    def _can_sample(self, batch_size: int) -> bool:
        return self.rate_limiter.can_sample(batch_size, **self._counters())

    def _check_batch_size(self, batch_size: int) -> None:
        self.rate_limiter.check_sample_batch(batch_size)

    def _insert_blocked(self, n: int) -> str:
        return (f"insert of {n} blocked by {self.rate_limiter!r}: samplers are behind ({self._counters()}); "
                "sample more, widen error_buffer, or pass a longer timeout")

    def _sample_blocked(self, batch_size: int) -> str:
        if self._size() < self.rate_limiter.min_size:
            return (f"{type(self).__name__} holds {self._size()} items and {self.rate_limiter!r} waits for "
                    f"{self.rate_limiter.min_size}; insert more or pass a longer timeout")
        return (f"sample of {batch_size} blocked by {self.rate_limiter!r}: inserters are behind "
                f"({self._counters()}); insert more, widen error_buffer, or pass a longer timeout")

    def _extra_state(self, slots: np.ndarray) -> dict[str, Any]:
        return {"rng": _rng_state(self._rng)}

    def _load_extra_state(self, state: dict[str, Any], slots: np.ndarray) -> None:
        self._rng = _rng_from_state(state["rng"])


class Uniform(_SampledTable):
    """Every live item is equally likely; ``probabilities`` is ``1 / size`` for each draw."""

    def _draw(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        keys = self._first_key + self._rng.integers(0, self._size(), batch_size, dtype=np.int64)
        return keys, np.full(batch_size, 1.0 / self._size())


class Prioritized(_SampledTable):
    """Draws key k with probability p_k**priority_exponent / sum_j p_j**priority_exponent.

    ``insert(item)`` without a priority gives the largest priority set so far (1.0 before any is
    positive), so new data is seen soon, as in prioritized experience replay.
    """

    def __init__(self, max_size: int, priority_exponent: float = 0.6, rate_limiter: RateLimiter | None = None,
                 seed: int | None = None) -> None:
        super().__init__(max_size, rate_limiter, seed)
        if not (np.isfinite(priority_exponent) and priority_exponent >= 0):
            raise ValueError(f"priority_exponent must be finite and >= 0, got {priority_exponent!r}")
        self.priority_exponent = float(priority_exponent)
        self._tree = SumTree(self.max_size)  # holds p**exponent by slot
        self._priorities = np.zeros(self.max_size)  # raw p by slot, for snapshots
        self._max_priority = 0.0
        self._counts["stale_priority_updates"] = 0

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Sets priorities by key; keys already evicted are skipped (counted as stale_priority_updates)."""
        keys = np.asarray(keys)
        priorities = check_priorities(priorities)
        if keys.ndim != 1 or keys.shape != priorities.shape:
            raise ValueError(f"keys and priorities must be 1-D and the same length, got {keys.shape} and "
                             f"{priorities.shape}")
        if keys.size and not np.issubdtype(keys.dtype, np.integer):
            raise TypeError(f"keys must be integers (from Sample.keys), got dtype {keys.dtype}")
        with self._cond:
            self._check_open()
            live = (keys >= self._first_key) & (keys < self._next_key)
            self._counts["stale_priority_updates"] += int(np.count_nonzero(~live))
            self._set(*last_write_wins(keys[live].astype(np.int64) % self.max_size, priorities[live]))

    def _check_priorities(self, priorities: Sequence[float] | None, n: int) -> np.ndarray | None:
        if priorities is None:
            return None
        priorities = check_priorities(priorities)
        if priorities.shape != (n,):
            raise ValueError(f"got {priorities.shape} priorities for {n} items; pass one per item")
        return priorities

    def _on_insert(self, slots: np.ndarray, priorities: np.ndarray | None) -> None:
        if priorities is None:
            priorities = np.full(len(slots), self._max_priority if self._max_priority > 0 else 1.0)
        self._set(slots, priorities)

    def _set(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Slots must be unique (NumPy gives no order to repeated fancy writes)."""
        if slots.size:
            self._tree.set(slots, priorities**self.priority_exponent)
            self._priorities[slots] = priorities
            self._max_priority = max(self._max_priority, float(priorities.max()))

    def _draw(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        slots = self._tree.sample(self._rng.random(batch_size))
        keys = self._first_key + (slots - self._first_key) % self.max_size
        return keys, self._tree.get(slots) / self._tree.total()

    def _extra_state(self, slots: np.ndarray) -> dict[str, Any]:
        return dict(super()._extra_state(slots), priorities=self._priorities[slots],
                    max_priority=self._max_priority)

    def _load_extra_state(self, state: dict[str, Any], slots: np.ndarray) -> None:
        priorities = check_priorities(state["priorities"])
        if priorities.shape != slots.shape:
            raise ValueError(f"state has {priorities.shape} priorities for {len(slots)} items")
        super()._load_extra_state(state, slots)
        self._tree, self._priorities = SumTree(self.max_size), np.zeros(self.max_size)
        self._max_priority = 0.0
        self._set(slots, priorities)
        self._max_priority = float(state["max_priority"])


Table = _Table
"""The base class of every table, for ``isinstance`` checks and type hints."""
