"""Replay tables with Reverb's semantics: a selector, the oldest-first remover, a rate limiter,
``max_times_sampled``, and an optional signature.

The selectors are the table classes: ``Fifo`` (oldest first; by default Reverb's queue:
``max_times_sampled=1`` and a ``Queue`` limiter), ``Lifo`` (newest first), ``Uniform``,
``Prioritized``, ``MaxHeap`` and ``MinHeap`` (the highest / lowest priority, ties to the item
inserted or updated least recently). ``Table.queue(n)`` and ``Table.stack(n)`` build Reverb's
queue and stack. Every table stores a priority per item (1.0 unless given; ``Prioritized``
gives the largest so far) and counts the times each item was sampled; an item sampled
``max_times_sampled`` times (0: no limit) is removed. When an insert would exceed ``max_size``
the oldest items are removed first (a queue's or stack's limiter blocks that insert instead).

Storage: items are pytrees of arrays, stored column-wise per *signature* (structure, shapes and
dtypes), one ``(max_size, *shape)`` array per leaf (``np.empty``: pages are only committed as
rows are written). Items may differ from one another unless the table was given a
``signature``, which they must then match; without one, a table holds items of at most
``MAX_SIGNATURES`` signatures at once (each costs columns of its own, at least a page per leaf),
and an insert of one more is refused. Sampling is one fancy index per leaf when the drawn
items share a signature; a batch mixing signatures comes back as a list of items, and
``Sample.stacked`` says which of the two a sample is (a stacked batch of list-shaped items is a
list too).

Keys: an item lives in a slot, and its key is ``generation * max_size + slot``; a key is never
given twice, so a stale key (of an item removed since) is recognised and skipped. While nothing
is removed out of insertion order, keys are the consecutive ints 0, 1, 2, ...

``insert_many`` / ``insert_batch`` store a batch atomically (all of it, once admitted, or none);
``insert_into`` stores one item in several tables that share a lock, atomically.

A sample of more than the rate limiter's window (of a table that does not remove what it
samples) is served as inserts arrive: the sampler takes the limiter's allowance as it comes,
counted as samples so inserters carry on, and draws the whole batch once it has it. A sampler
that times out gives its allowance back, so nothing is lost.

A producer may ask for room before it makes its data and have the table hold it:
``can_insert(n, wait, hold=seconds)`` answering True keeps room for n items: other
``can_insert`` calls count it as taken until the next inserts use it or ``hold`` seconds pass.
Held room is not per caller: any insert uses the oldest held room first (so an insert is never
refused for room held for someone), and several actors that each ask before they play fill a
queue exactly, instead of all seeing its one free slot.

A table remembers the arguments it was built with (``table.spec``); a fresh table pickles as
them, so a program can ship ``Fifo(64)`` to a node's process. A used table refuses to pickle
rather than silently arrive empty: its contents travel through ``state()`` / ``load_state()``.

Threads: one Condition guards a table (tables may share one, see ``share_lock``). Blocking
calls wait with an optional timeout (None waits until ready or closed) and raise
``TimeoutError`` saying what blocked them. ``close()`` wakes every waiter with
``TableClosedError``; ``size``, ``stats`` and ``state`` keep working after it, so a server can
checkpoint while shutting down.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from jaxdist.nodes.replay.rate_limiters import MinSize, Queue, RateLimiter, Stack
from jaxdist.nodes.replay.sum_tree import SumTree, check_priorities, last_write_wins


class TableClosedError(RuntimeError):
    """Raised by any call that mutates or waits on a table after ``close()``."""


class SampleInfo(NamedTuple):
    """What Reverb's ``SampleInfo`` holds besides key and probability, one entry per draw."""

    priorities: np.ndarray  # float64: each item's priority when drawn
    times_sampled: np.ndarray  # int32: times the item has been sampled, this draw included
    table_size: int  # items in the table when the batch was drawn


class Sample(NamedTuple):
    keys: np.ndarray  # int64, (batch_size,): pass back to update_priorities or delete
    data: Any  # stacked: the items' pytree, every leaf stacked along a new leading axis; else a list of the items
    probabilities: np.ndarray | None  # each draw's chance, for importance weights; None for ordered selectors
    info: SampleInfo | None  # with sample(..., info=True)
    stacked: bool = True  # False when the drawn items' signatures differ and `data` lists them one by one


MAX_SAMPLE_ITEMS = 1 << 20
MAX_SAMPLE_BYTES = 1 << 30
"""The most items, and item bytes, one ``sample`` returns: sampling with replacement is not
bounded by the table's size, and an answer is allocated whole before it is sent."""
MAX_SIGNATURES = 16
"""The most item signatures a table without a declared ``signature`` holds at once: each has
columns of its own, so a stream of ever new structures would cost far more than its bytes."""

_LEAF = "*"  # a leaf's structure


def _as_array(node: Any, path: str) -> np.ndarray:
    array = np.asarray(node)
    if array.dtype == object:
        raise TypeError(f"{path} is a {type(node).__name__}, not a numeric array; items hold arrays")
    return array


def _flatten(tree: Any, leaf: Callable[[Any, str], Any] = _as_array) -> tuple[Any, list, list[str]]:
    """A hashable description of the structure, the leaves (dict keys sorted), their paths."""
    leaves: list = []
    paths: list[str] = []

    def visit(node: Any, path: str) -> Any:
        if isinstance(node, dict):
            keys = tuple(sorted(node))
            return (dict, keys, tuple(visit(node[k], f"{path}[{k!r}]") for k in keys))
        if isinstance(node, (list, tuple)):
            return (type(node), None, tuple(visit(x, f"{path}[{i}]") for i, x in enumerate(node)))
        leaves.append(leaf(node, path))
        paths.append(path)
        return _LEAF

    return visit(tree, "item"), leaves, paths


def _spec_leaf(node: Any, path: str) -> tuple[tuple[int, ...], np.dtype]:
    """A signature leaf: anything with ``.shape`` and ``.dtype`` (``jax.ShapeDtypeStruct``), or an example value."""
    if not (hasattr(node, "shape") and hasattr(node, "dtype")):
        node = _as_array(node, f"signature {path}")
    return tuple(int(d) for d in node.shape), np.dtype(node.dtype)


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


class _Rows(NamedTuple):
    """Items of one signature, stacked: what a table writes in one go."""

    treedef: Any
    leaves: list[np.ndarray]  # each with a leading items axis
    paths: list[str]
    index: np.ndarray  # the items' positions in the batch they came in

    @property
    def signature(self) -> tuple:
        return self.treedef, tuple((leaf.shape[1:], leaf.dtype) for leaf in self.leaves)


def rows_of_item(item: Any) -> list[_Rows]:
    """One item as a batch of one."""
    treedef, leaves, paths = _flatten(item)
    return [_Rows(treedef, [leaf[None] for leaf in leaves], paths, np.zeros(1, np.int64))]


def rows_of_batch(batch: Any) -> list[_Rows]:
    """Items stacked along a leading axis of every leaf of ``batch`` (one signature)."""
    treedef, columns, paths = _flatten(batch)
    lengths = {len(column) if column.ndim else None for column in columns}
    if len(lengths) != 1 or None in lengths:
        raise ValueError(f"a batch takes leaves stacked along a leading items axis of one length; got "
                         f"shapes {', '.join(f'{path}: {c.shape}' for path, c in zip(paths, columns))}")
    return [_Rows(treedef, columns, paths, np.arange(lengths.pop()))]


def rows_of_items(items: Sequence[Any]) -> list[_Rows]:
    """Items grouped by signature, each group stacked."""
    groups: dict[tuple, list] = {}
    for i, item in enumerate(items):
        treedef, leaves, paths = _flatten(item)
        key = treedef, tuple((leaf.shape, leaf.dtype) for leaf in leaves)
        groups.setdefault(key, [treedef, [], paths, []])[1].append(leaves)
        groups[key][3].append(i)
    return [_Rows(treedef, [np.stack(column) for column in zip(*rows)], paths, np.array(index))
            for treedef, rows, paths, index in groups.values()]


class _Group:
    """One signature's columns, indexed by slot."""

    def __init__(self, signature: tuple, capacity: int) -> None:
        self.signature = signature
        self.treedef, shapes = signature
        self.arrays = [np.empty((capacity, *shape), np.dtype(dtype)) for shape, dtype in shapes]
        self.row_bytes = sum(array[0].nbytes for array in self.arrays)
        self.count = 0

    def read(self, slots: np.ndarray) -> Any:
        return _unflatten(self.treedef, (a[slots] for a in self.arrays))


class _Items:
    """Every signature's columns; ``signature`` (a spec pytree) fixes the one signature allowed.
    A signature's group is found by one dict lookup, and an emptied group goes at once (unless it
    is the only one, see `_drop`): nothing scans the groups."""

    def __init__(self, capacity: int, signature: Any) -> None:
        self.capacity = capacity
        self.groups: dict[int, _Group] = {}
        self._ids: dict[tuple, int] = {}
        self._kept_empty: set[int] = set()  # emptied groups kept while they were the only one
        self._next_id = 0
        self.group_of_slot = np.full(capacity, -1, np.int64)
        self.fixed = None
        if signature is not None:
            treedef, shapes, _ = _flatten(signature, _spec_leaf)
            self.fixed = (treedef, tuple(shapes))
            self._group(self.fixed)

    def check_room(self, rows: list[_Rows], table: str) -> None:
        """Raises when ``rows`` would bring the signatures held past ``MAX_SIGNATURES``."""
        new = {group.signature for group in rows} - self._ids.keys()
        held = len(self._ids) - len(self._kept_empty)
        if new and held + len(new) > MAX_SIGNATURES:
            raise ValueError(f"{table} holds items of {held} signatures (structures, shapes, dtypes) and takes at "
                             f"most {MAX_SIGNATURES}; this insert brings {len(new)} more. Give the table a "
                             f"signature= (an example item or a pytree of jax.ShapeDtypeStruct) and insert "
                             f"items that match it")

    def check(self, rows: _Rows) -> None:
        """Raises, naming what differs, when a signature was given and ``rows`` do not match it."""
        if self.fixed is None or rows.signature == self.fixed:
            return
        treedef, shapes = self.fixed
        if rows.treedef != treedef:
            raise ValueError(f"item structure {_describe(rows.treedef)} differs from the table's signature "
                             f"{_describe(treedef)}")
        for path, leaf, (shape, dtype) in zip(rows.paths, rows.leaves, shapes):
            if (leaf.shape[1:], leaf.dtype) != (shape, dtype):
                raise ValueError(f"{path} has shape {leaf.shape[1:]} {leaf.dtype} but the table's signature says "
                                 f"{shape} {np.dtype(dtype)}")

    def write(self, slots: np.ndarray, rows: _Rows) -> None:
        gid = self._group(rows.signature)
        group = self.groups[gid]
        for leaf, array in zip(rows.leaves, group.arrays):
            array[slots] = leaf
        self.group_of_slot[slots] = gid
        group.count += len(slots)
        self._kept_empty.discard(gid)

    def release(self, slots: np.ndarray) -> None:
        if len(self.groups) == 1:  # the common case, without a per-call np.unique
            gid = next(iter(self.groups))
            self._drop(gid, len(slots))
            return
        gids, counts = np.unique(self.group_of_slot[slots], return_counts=True)
        for gid, count in zip(gids.tolist(), counts.tolist()):
            self._drop(gid, count)

    def _drop(self, gid: int, count: int) -> None:
        """An emptied group keeps its arrays while it is the only one (a queue drained and refilled
        reuses its pages); beside others it goes, its arrays with it."""
        group = self.groups[gid]
        group.count -= count
        if group.count == 0 and group.signature != self.fixed:
            self._kept_empty.add(gid)
            if len(self.groups) > 1:
                self._forget_empty()

    def _forget_empty(self) -> None:
        for gid in self._kept_empty:
            del self._ids[self.groups.pop(gid).signature]
        self._kept_empty.clear()

    def read(self, slots: np.ndarray) -> tuple[Any, bool]:
        """The items and whether they are stacked: stacked when the slots share a signature, else
        a list of single items."""
        if not slots.size:
            return None, True
        if len(self.groups) == 1:
            return next(iter(self.groups.values())).read(slots), True
        gids = self.group_of_slot[slots]
        if gids.min() == gids.max():
            return self.groups[int(gids[0])].read(slots), True
        return [_unflatten(self.groups[g].treedef, (a[s] for a in self.groups[g].arrays))
                for g, s in zip(gids.tolist(), slots.tolist())], False

    def row_bytes(self) -> int:
        """Bytes of the largest stored item (0 before any)."""
        return max((group.row_bytes for group in self.groups.values()), default=0)

    def by_group(self, slots: np.ndarray) -> list[tuple[np.ndarray, Any]]:
        """``(positions in slots, stacked items)`` for each signature among ``slots``."""
        gids = self.group_of_slot[slots]
        return [(np.flatnonzero(gids == gid), self.groups[gid].read(slots[gids == gid])) for gid in np.unique(gids)]

    def _group(self, signature: tuple) -> int:
        gid = self._ids.get(signature)
        if gid is None:
            self._forget_empty()
            gid, self._next_id = self._next_id, self._next_id + 1
            self._ids[signature] = gid
            self.groups[gid] = _Group(signature, self.capacity)
        return gid


class _FreeSlots:
    """Free slots in the order they were freed (so slots, and keys, cycle while nothing is deleted)."""

    def __init__(self, capacity: int) -> None:
        self._ring = np.arange(capacity, dtype=np.int64)
        self._head, self.count = 0, capacity

    def pop(self, n: int) -> np.ndarray:
        slots = self._ring[(self._head + np.arange(n)) % len(self._ring)]
        self._head, self.count = (self._head + n) % len(self._ring), self.count - n
        return slots

    def push(self, slots: np.ndarray) -> None:
        self._ring[(self._head + self.count + np.arange(len(slots))) % len(self._ring)] = slots
        self.count += len(slots)

    def ordered(self) -> np.ndarray:
        return self._ring[(self._head + np.arange(self.count)) % len(self._ring)]

    def load(self, slots: np.ndarray) -> None:
        self._ring[:len(slots)] = slots
        self._head, self.count = 0, len(slots)


class _Order:
    """Live slots in insertion order: a ring twice the table's size with lazy deletion (an entry
    is stale once its slot is freed or reused), compacted when it fills, so every operation is
    amortised O(items touched)."""

    def __init__(self, capacity: int) -> None:
        self._ring = np.zeros(2 * capacity, np.int64)
        self._pos = np.full(capacity, -1, np.int64)  # where each slot was last pushed
        self._head = self._tail = 0

    def push(self, slots: np.ndarray, live: np.ndarray) -> None:
        if self._tail - self._head + len(slots) > len(self._ring):
            self.compact(live)
        positions = self._tail + np.arange(len(slots))
        self._ring[positions % len(self._ring)] = slots
        self._pos[slots] = positions
        self._tail += len(slots)

    def span(self) -> int:
        return self._tail - self._head

    def compact(self, live: np.ndarray) -> None:
        slots = self.ordered(live)
        self._tail = self._head
        self.push(slots, live)

    def ordered(self, live: np.ndarray) -> np.ndarray:
        slots, valid = self._at(np.arange(self._head, self._tail), live)
        return slots[valid]

    def take(self, n: int, live: np.ndarray, newest: bool = False, consume: bool = False) -> np.ndarray:
        """Up to n live slots, oldest (or newest) first, scanning chunks that double in size.
        ``consume``: the caller removes them now, so that end moves past them (the remover)."""
        self._trim(live, newest)
        start = self._tail - 1 if newest else self._head
        found: list[np.ndarray] = []
        count, chunk, end = 0, max(8, 2 * n), start
        while count < n:
            positions = self._chunk(start, chunk, newest)
            if not len(positions):
                break
            slots, valid = self._at(positions, live)
            taken = np.flatnonzero(valid)[:n - count]
            found.append(slots[taken])
            count += len(taken)
            end = int(positions[taken[-1]]) if len(taken) else end
            start, chunk = int(positions[-1]) + (-1 if newest else 1), 2 * chunk
        if consume and count:
            if newest:
                self._tail = end
            else:
                self._head = end + 1
        if not found:
            return np.empty(0, np.int64)
        return found[0] if len(found) == 1 else np.concatenate(found)

    def _trim(self, live: np.ndarray, newest: bool) -> None:
        """Forgets the stale entries at one end, so the next look there starts at a live one."""
        for _ in range(8):  # usually that end is live, or a few entries from it: scalar looks
            if self._head == self._tail:
                return
            end = self._tail - 1 if newest else self._head
            slot = self._ring[end % len(self._ring)]
            if live[slot] and self._pos[slot] == end:
                return
            if newest:
                self._tail -= 1
            else:
                self._head += 1
        chunk = 64
        while self._head < self._tail:
            positions = self._chunk(self._tail - 1 if newest else self._head, chunk, newest)
            valid = self._at(positions, live)[1]
            stale = int(np.argmax(valid)) if valid.any() else len(valid)
            if newest:
                self._tail -= stale
            else:
                self._head += stale
            if stale < len(valid):
                return
            chunk *= 2

    def _chunk(self, start: int, length: int, newest: bool) -> np.ndarray:
        if newest:
            return np.arange(start, max(self._head, start - length + 1) - 1, -1)
        return np.arange(start, min(self._tail, start + length))

    def uniform(self, n: int, live: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
        """n live slots drawn uniformly with replacement (rejecting stale entries)."""
        self._trim(live, newest=False)  # what the remover just took leaves stale entries at the head
        if self.span() > 2 * size:
            self.compact(live)
        if self.span() == size:  # no stale entry in between: every position is a live slot
            return self._ring[(self._head + rng.integers(0, size, n, dtype=np.int64)) % len(self._ring)]
        drawn: list[np.ndarray] = []
        count = 0
        while count < n:
            positions = self._head + rng.integers(0, self.span(), n - count, dtype=np.int64)
            slots, valid = self._at(positions, live)
            drawn.append(slots[valid])
            count += len(drawn[-1])
        return np.concatenate(drawn) if len(drawn) > 1 else drawn[0]

    def _at(self, positions: np.ndarray, live: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        slots = self._ring[positions % len(self._ring)]
        return slots, live[slots] & (self._pos[slots] == positions)


def _occurrences(slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each entry, how many equal entries come before it; and the distinct slots with counts."""
    order = np.argsort(slots, kind="stable")
    ordered = slots[order]
    starts = np.empty(len(slots), bool)
    starts[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    if starts.all():  # no repeats: the usual case for a small batch from a large table
        return np.zeros(len(slots), np.int64), slots, np.ones(len(slots), np.int64)
    index = np.arange(len(slots))
    rank = np.empty(len(slots), np.int64)
    rank[order] = index - np.maximum.accumulate(np.where(starts, index, 0))
    first = np.flatnonzero(starts)
    return rank, ordered[first], np.diff(np.append(first, len(slots)))


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


def _check_count(name: str, value: Any, least: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return int(value)


class _Table:
    """Storage, keys, limits, waiting, closing and snapshots; a subclass is a selector
    (``_select``) with its own bookkeeping (``_on_insert``, ``_on_remove``, ``_on_priorities``)."""

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

    def __init__(self, max_size: int, rate_limiter: RateLimiter | None = None, seed: int | None = None, *,
                 max_times_sampled: int = 0, signature: Any = None) -> None:
        self.max_size = _check_count("max_size", max_size, 1)
        self.max_times_sampled = _check_count("max_times_sampled", max_times_sampled, 0)
        self.rate_limiter = MinSize(1) if rate_limiter is None else rate_limiter
        if self.rate_limiter.min_size > self.max_size:
            raise ValueError(f"{self.rate_limiter!r} waits for {self.rate_limiter.min_size} items but "
                             f"max_size is {self.max_size}, so samplers would wait forever")
        self.signature = signature
        self._cond = threading.Condition()
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._closed = False
        self._slot_key = np.arange(-self.max_size, 0, dtype=np.int64)  # the last key each slot held
        self._counts = dict(inserts=0, samples=0, evictions=0, deletes=0, expirations=0, insert_waits=0,
                            sample_waits=0, room_waits=0, timeouts=0, stale_priority_updates=0)
        # The counts the rate limiter sees, and Reverb's num_unique_samples: items sampled at least once.
        self._since_reset = dict(inserts=0, samples=0, unique_samples=0)
        self._reserved = 0  # samples taken from the limiter by oversized samplers not yet drawn
        self._held = HeldRoom()
        self._empty()

    def _empty(self) -> None:
        """No items; keys go on from where they were, so none is ever given twice."""
        size = self.max_size
        self._items = _Items(size, self.signature)
        self._live = np.zeros(size, bool)
        self._times = np.zeros(size, np.int64)
        self._priorities = np.zeros(size)
        self._free = _FreeSlots(size)
        self._order = _Order(size)
        self._size = 0
        self._draws_left = 0  # with max_times_sampled: draws the live items have left

    # --- Reverb's alternative constructors --------------------------------------------------------

    @staticmethod
    def queue(max_size: int, *, signature: Any = None) -> "Fifo":
        """Reverb's ``Table.queue``: oldest first, each item sampled once, samples wait while it is
        empty and inserts while it is full."""
        return Fifo(max_size, signature=signature)

    @staticmethod
    def stack(max_size: int, *, signature: Any = None) -> "Lifo":
        """Reverb's ``Table.stack``: the same as ``queue``, newest first."""
        return Lifo(max_size, Stack(max_size), max_times_sampled=1, signature=signature)

    # --- inserting -------------------------------------------------------------------------------

    def insert(self, item: Any, priority: float | None = None, timeout: float | None = None) -> int:
        """Stores a copy of ``item`` and returns its key; blocks while the limiter refuses inserts."""
        priorities = None if priority is None else [priority]
        return int(self._insert(rows_of_item(item), 1, priorities, timeout)[0])

    def insert_many(self, items: Sequence[Any], priorities: Sequence[float] | None = None,
                    timeout: float | None = None) -> np.ndarray:
        """Stores copies of ``items`` all at once (or none of them) and returns their keys, int64.

        Waits until the whole batch is admitted; a batch that could never be admitted at once (more
        than ``max_size`` items, or more than the rate limiter's window allows) is refused at once.
        """
        items = list(items)
        return self._insert(rows_of_items(items), len(items), priorities, timeout)

    def insert_batch(self, batch: Any, priorities: Sequence[float] | None = None,
                     timeout: float | None = None) -> np.ndarray:
        """``insert_many`` for items stacked along a leading axis of every leaf of ``batch``."""
        rows = rows_of_batch(batch)
        return self._insert(rows, len(rows[0].index), priorities, timeout)

    def _insert(self, rows: list[_Rows], n: int, priorities: Any, timeout: float | None) -> np.ndarray:
        return insert_rows_into([self], rows, n, [priorities], timeout)[0]

    def _prepare(self, rows: list[_Rows], n: int, priorities: Any) -> np.ndarray | None:
        """Checks a batch before anything is stored; returns its priorities (None: the default)."""
        if priorities is not None:
            priorities = check_priorities(priorities)
            if priorities.shape != (n,):
                raise ValueError(f"got {priorities.shape} priorities for {n} items; pass one per item")
        if n > self.max_size:
            raise ValueError(f"a batch of {n} items exceeds {self!r}'s max_size; insert fewer items per call")
        if n > self.rate_limiter.max_insert_batch:
            raise ValueError(f"a batch of {n} inserts can never be admitted at once under {self.rate_limiter!r}: "
                             f"its window leaves room for at most {self.rate_limiter.max_insert_batch}; insert "
                             "fewer items per call or widen error_buffer")
        for group in rows:
            self._items.check(group)
        self._items.check_room(rows, repr(self))
        return priorities

    def _commit(self, rows: list[_Rows], n: int, priorities: np.ndarray | None) -> np.ndarray:
        """Stores an admitted batch (the lock held); returns its keys in the batch's order."""
        overflow = self._size + n - self.max_size
        evicted = self._order.take(overflow, self._live, consume=True) if overflow > 0 else np.empty(0, np.int64)
        self._remove(evicted, "evictions", hook=False)  # the remover: oldest first
        slots = self._free.pop(n)
        keys = self._slot_key[slots] + self.max_size
        self._slot_key[slots] = keys
        for group in rows:
            self._items.write(slots[group.index], group)
        self._live[slots] = True
        self._times[slots] = 0
        self._priorities[slots] = self._default_priority() if priorities is None else priorities
        self._order.push(slots, self._live)
        self._size += n
        self._draws_left += self.max_times_sampled * n
        self._counts["inserts"] += n
        self._since_reset["inserts"] += n
        self._on_insert(slots, evicted)
        self._cond.notify_all()
        return keys

    # --- sampling --------------------------------------------------------------------------------

    def sample(self, batch_size: int, timeout: float | None = None, info: bool = False) -> Sample:
        """Returns ``batch_size`` draws stacked; blocks while the table cannot provide them. With
        ``info``, ``Sample.info`` holds each draw's priority and times sampled (else None: ranking
        the repeats within a batch costs more than the rest of a small draw)."""
        batch_size = _check_count("batch_size", batch_size, 1)
        if batch_size > MAX_SAMPLE_ITEMS:
            raise ValueError(f"a sample of {batch_size} items is more than one call may take ({MAX_SAMPLE_ITEMS}); "
                             "sample fewer items per call")
        oversized = batch_size > self.rate_limiter.max_sample_batch
        if oversized and self.max_times_sampled:
            raise ValueError(f"batch_size {batch_size} can never be sampled at once under {self.rate_limiter!r}, "
                             f"and {self!r} removes what it samples, so it cannot be served piece by piece either; "
                             f"sample at most {self.rate_limiter.max_sample_batch} items per call")
        with self._cond:
            self._check_sample_bytes(batch_size)
            if oversized:
                self._reserve(batch_size, timeout)
            else:
                self._wait(lambda: self._can_sample(batch_size), timeout, "sample_waits",
                           lambda: self._sample_blocked(batch_size))
            try:
                self._check_sample_bytes(batch_size)  # the first insert may have come meanwhile
                return self._draw(batch_size, info)
            finally:
                if oversized:
                    self._reserved -= batch_size

    def _reserve(self, n: int, timeout: float | None) -> None:
        """Takes the limiter's allowance as it comes until it holds n (see the module doc)."""
        got = 0

        def ready() -> bool:
            nonlocal got
            grant = min(n - got, self.rate_limiter.sample_allowance(**self._limiter_counts()))
            if grant > 0:
                got += int(grant)
                self._reserved += int(grant)
                self._cond.notify_all()
            return got == n and self._size > 0  # a delete or reset meanwhile may have emptied it

        try:
            self._wait(ready, timeout, "sample_waits",
                       lambda: f"{self._sample_blocked(n)}; {got} of the {n} had been granted")
        except BaseException:
            self._reserved -= got
            self._cond.notify_all()
            raise

    def _draw(self, n: int, info: bool) -> Sample:
        """n draws, sampled items counted (and removed at ``max_times_sampled``), with their info."""
        size = self._size
        slots, probabilities, times, expired = self._draw_round(n, info)
        if len(slots) < n:  # random draws passed an item's limit: the rest are drawn again
            parts = [(slots, probabilities, times)]
            while sum(len(part[0]) for part in parts) < n:
                *part, gone = self._draw_round(n - sum(len(part[0]) for part in parts), info)
                parts.append(tuple(part))
                expired = np.concatenate([expired, gone])
            slots, probabilities, times = (None if part[0] is None else np.concatenate(part) for part in zip(*parts))
        keys = self._slot_key[slots]
        data, stacked = self._items.read(slots)
        self._items.release(expired)  # after the read: no insert can reuse their slots while the lock is held
        described = SampleInfo(self._priorities[slots], times.astype(np.int32), size) if info else None
        self._counts["samples"] += n
        self._since_reset["samples"] += n
        self._cond.notify_all()
        return Sample(keys, data, probabilities, described, stacked)

    def _draw_round(self, n: int, info: bool) -> tuple[np.ndarray, np.ndarray | None, Any, np.ndarray]:
        """Up to n draws (fewer only when a random draw passes an item's ``max_times_sampled``): the
        slots, their probabilities, each draw's times sampled (with ``info`` or a limit, else None),
        and the slots that expired (their rows still to be released)."""
        slots, probabilities = self._select(n)
        if not info and not self.max_times_sampled:  # counting alone needs no ranks
            self._since_reset["unique_samples"] += len(np.unique(slots[self._times[slots] == 0]))
            np.add.at(self._times, slots, 1)
            return slots, probabilities, None, np.empty(0, np.int64)
        rank, distinct, counts = _occurrences(slots)
        self._since_reset["unique_samples"] += int(np.count_nonzero(self._times[distinct] == 0))
        times = self._times[slots] + rank + 1
        limit = self.max_times_sampled
        if limit and times.max() > limit:
            kept = times <= limit
            slots, times = slots[kept], times[kept]
            probabilities = None if probabilities is None else probabilities[kept]
            counts = np.minimum(counts, limit - self._times[distinct])
        self._times[distinct] += counts
        expired = slots[times == limit] if limit else np.empty(0, np.int64)  # in draw order: slots, keys cycle
        self._draws_left -= len(slots) if limit else 0
        self._remove(expired, "expirations", keep_items=True)
        return slots, probabilities, times, expired

    def _repeat_in_order(self, candidates: np.ndarray, n: int) -> np.ndarray:
        """An ordered selector's n draws: each candidate in turn, as often as it may still be sampled."""
        if not self.max_times_sampled:
            return np.repeat(candidates[:1], n)
        return np.repeat(candidates, self.max_times_sampled - self._times[candidates])[:n]

    # --- removing and priorities -----------------------------------------------------------------

    def delete(self, keys: Any) -> int:
        """Removes the items with these keys; keys of items already gone are skipped. Returns how many
        were removed."""
        with self._cond:
            self._check_open()
            slots = np.unique(self._live_slots(keys)[0])
            self._remove(slots, "deletes")
            return len(slots)

    def reset(self) -> None:
        """Removes every item and zeroes the rate limiter's counts, as Reverb's ``reset`` does."""
        with self._cond:
            self._check_open()
            slots = np.flatnonzero(self._live)
            self._counts["deletes"] += len(slots)
            self._empty()
            self._on_reset()
            self._since_reset = dict(inserts=0, samples=0, unique_samples=0)
            self._held.clear()
            self._cond.notify_all()

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Sets priorities by key; keys of items gone are skipped (counted as stale_priority_updates)."""
        priorities = check_priorities(priorities)
        if np.ndim(keys) != 1 or np.shape(keys) != priorities.shape:
            raise ValueError(f"keys and priorities must be 1-D and the same length, got {np.shape(keys)} and "
                             f"{priorities.shape}")
        with self._cond:
            self._check_open()
            slots, live = self._live_slots(keys)
            self._counts["stale_priority_updates"] += int(np.count_nonzero(~live))
            slots, values = last_write_wins(slots, priorities[live])
            self._priorities[slots] = values
            self._on_priorities(slots)
            self._cond.notify_all()

    def _live_slots(self, keys: Any) -> tuple[np.ndarray, np.ndarray]:
        """The slots of the keys that name live items, and which of ``keys`` those were."""
        keys = np.asarray(keys)
        if keys.size and not np.issubdtype(keys.dtype, np.integer):
            raise TypeError(f"keys must be integers (from Sample.keys), got dtype {keys.dtype}")
        keys = keys.astype(np.int64).ravel()
        slots = keys % self.max_size
        live = (keys >= 0) & self._live[slots] & (self._slot_key[slots] == keys)
        return slots[live], live

    def _remove(self, slots: np.ndarray, counter: str, keep_items: bool = False, hook: bool = True) -> None:
        """Frees the slots; ``keep_items`` leaves their rows to be read and released by the caller,
        ``hook=False`` the selector's bookkeeping to the ``_on_insert`` that follows."""
        if not len(slots):
            return
        if not keep_items:
            self._items.release(slots)
        self._live[slots] = False
        if self.max_times_sampled:
            self._draws_left -= int((self.max_times_sampled - self._times[slots]).sum())
        self._free.push(slots)
        self._size -= len(slots)
        self._counts[counter] += len(slots)
        if hook:
            self._on_remove(slots)
        self._cond.notify_all()

    # --- queries ---------------------------------------------------------------------------------

    def can_sample(self, n: int = 1) -> bool:
        """Whether a sample of n would proceed now (Reverb's ``Table.can_sample``)."""
        with self._cond:
            return self._can_sample(n)

    def can_insert(self, n: int = 1, wait: float = 0.0, hold: float = 0.0) -> bool:
        """Whether an insert of n would proceed now (Reverb's ``Table.can_insert``), or, with
        ``wait`` > 0, once it would within ``wait`` seconds: a producer that waits for room before
        it makes its data (an actor playing a trajectory) hands over fresher data than one whose
        finished data waits in a blocked insert. With ``hold`` > 0 a True answer also holds the
        room for the next inserts, at most ``hold`` seconds (see the module doc)."""
        for name, seconds in (("wait", wait), ("hold", hold)):
            if not 0 <= seconds < float("inf"):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {seconds!r}")

        def settled() -> bool:
            return self._closed or self._can_insert(n)

        with self._cond:
            if wait > 0 and not settled():
                self._counts["room_waits"] += 1
            room = self._wait_for(settled, wait) and not self._closed
            if room and hold > 0:
                self._held.add(n, hold)
            return room

    def size(self) -> int:
        with self._cond:
            return self._size

    def stats(self) -> dict[str, int | bool]:
        """Counters since creation (``samples`` counts draws, ``*_waits`` calls that had to block,
        ``room_waits`` among them ``can_insert`` calls that waited; removals: ``evictions`` by the
        remover, ``expirations`` at max_times_sampled, ``deletes``)."""
        with self._cond:
            return dict(self._counts, size=self._size, max_size=self.max_size, closed=self._closed)

    def info(self) -> dict[str, Any]:
        """What Reverb's ``Table.info`` tells: sizes, limits, the limiter's view and the counters."""
        with self._cond:
            counts = self._limiter_counts()
            return dict(kind=type(self).__name__, max_size=self.max_size, current_size=self._size,
                        max_times_sampled=self.max_times_sampled, rate_limiter=repr(self.rate_limiter),
                        limiter_inserts=counts["inserts"], limiter_samples=counts["samples"],
                        held_room=self._held.total(), num_unique_samples=self._since_reset["unique_samples"],
                        signature=None if self.signature is None else _describe(self._items.fixed[0]),
                        **self._counts)

    def close(self) -> None:
        """Wakes every waiter with TableClosedError and refuses later inserts, samples and updates."""
        with self._cond:
            self._closed = True
            self._held.clear()
            self._cond.notify_all()

    def share_lock(self, *others: "_Table") -> None:
        """Makes ``others`` use this table's lock, so ``insert_into`` can wait on them all at once.
        Only for tables not yet in use (a waiter on the old lock would never be woken)."""
        for other in others:
            if other.stats()["inserts"] or other.stats()["samples"]:
                raise ValueError(f"{other!r} is in use; share locks before the first call")
            other._cond = self._cond

    # --- snapshots -------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """A snapshot of plain arrays and ints: live items in insertion order (per signature, with
        their positions), their keys, times sampled and priorities, the slots' key history and free
        order (so no key is given twice after a restore), counters, RNG and the selector's state."""
        with self._cond:
            slots = self._order.ordered(self._live)
            groups = [{"index": index, "items": items} for index, items in self._items.by_group(slots)]
            return dict(keys=self._slot_key[slots], times_sampled=self._times[slots],
                        priorities=self._priorities[slots], groups=groups, slot_keys=self._slot_key.copy(),
                        free=self._free.ordered(), counters=dict(self._counts),
                        since_reset=dict(self._since_reset), rng=_rng_state(self._rng), **self._extra_state(slots))

    def load_state(self, state: dict[str, Any]) -> None:
        """Replaces the contents with a ``state()`` snapshot taken from a table built the same way.

        Container types must survive the checkpoint (a tuple restored as a list is a different
        structure for later inserts): restore with a target, or rebuild them before loading.
        """
        keys = np.asarray(state["keys"], np.int64)
        slot_keys = np.asarray(state["slot_keys"], np.int64)
        if slot_keys.shape != (self.max_size,) or len(keys) > self.max_size:
            raise ValueError(f"state is of a table of {len(slot_keys)} slots holding {len(keys)} items; this one "
                             f"has max_size {self.max_size}")
        slots = keys % self.max_size
        if not np.array_equal(slot_keys[slots], keys):
            raise ValueError("state's keys do not match its slots' keys; it is corrupt")
        groups = [(np.asarray(group["index"], np.int64), group["items"]) for group in state["groups"]]
        rows = [(index, rows_of_batch(items)[0]) for index, items in groups]
        with self._cond:
            self._check_open()
            self._empty()
            self._on_reset()
            for index, group in rows:
                self._items.check(group)
                self._items.write(slots[index], group)
            self._slot_key = slot_keys.copy()
            self._live[slots] = True
            self._times[slots] = np.asarray(state["times_sampled"], np.int64)
            self._priorities[slots] = check_priorities(state["priorities"])
            self._free.load(np.asarray(state["free"], np.int64))
            self._order.push(slots, self._live)
            self._size = len(slots)
            if self.max_times_sampled:
                self._draws_left = int((self.max_times_sampled - self._times[slots]).sum())
            self._counts = {name: int(state["counters"].get(name, 0)) for name in self._counts}
            self._since_reset = {name: int(state["since_reset"].get(name, 0)) for name in self._since_reset}
            self._rng = _rng_from_state(state["rng"])
            self._on_insert(slots, np.empty(0, np.int64))
            self._load_extra_state(state, slots)
            self._held.clear()
            self._cond.notify_all()

    # --- waiting ---------------------------------------------------------------------------------

    def _limiter_counts(self) -> dict[str, int]:
        return dict(size=self._size, inserts=self._since_reset["inserts"],
                    samples=self._since_reset["samples"] + self._reserved)

    def _can_insert(self, n: int) -> bool:
        """Room held for others counts as inserted already."""
        counts, held = self._limiter_counts(), self._held.total()
        counts["size"] += held
        counts["inserts"] += held
        return self.rate_limiter.can_insert(n, **counts)

    def _can_sample(self, n: int) -> bool:
        if self.max_times_sampled and self._draws_left < n:
            return False
        return self._size > 0 and self.rate_limiter.can_sample(n, **self._limiter_counts())

    def _insert_blocked(self, n: int) -> str:
        if isinstance(self.rate_limiter, Queue):
            room = self.max_size - self._size
            state = f"full ({self.max_size} items)" if room == 0 else f"short of room ({room} free, {n} to insert)"
            return (f"{type(self).__name__} is {state} and no sampler took any; "
                    "sample faster, raise max_size, or pass a longer timeout")
        return (f"insert of {n} blocked by {self.rate_limiter!r}: samplers are behind ({self._limiter_counts()}); "
                "sample more, widen error_buffer, or pass a longer timeout")

    def _sample_blocked(self, n: int) -> str:
        if isinstance(self.rate_limiter, Queue):
            return (f"{type(self).__name__} holds {self._size} of the {n} items asked for; "
                    "insert more, ask for fewer, or pass a longer timeout")
        if self._size < self.rate_limiter.min_size:
            return (f"{type(self).__name__} holds {self._size} items and {self.rate_limiter!r} waits for "
                    f"{self.rate_limiter.min_size}; insert more or pass a longer timeout")
        if self.max_times_sampled and self._draws_left < n:
            return (f"{type(self).__name__}'s items may be sampled {self._draws_left} more times in all "
                    f"(max_times_sampled={self.max_times_sampled}), fewer than the {n} asked for; insert more, "
                    "ask for fewer, or pass a longer timeout")
        return (f"sample of {n} blocked by {self.rate_limiter!r}: inserters are behind "
                f"({self._limiter_counts()}); insert more, widen error_buffer, or pass a longer timeout")

    def _check_sample_bytes(self, batch_size: int) -> None:
        row = self._items.row_bytes()
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
        if not self._wait_for(lambda: self._closed or ready(), timeout):
            self._counts["timeouts"] += 1
            raise TimeoutError(f"{blocked()} (gave up after {timeout} s)")
        self._check_open()

    def _wait_for(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        """``Condition.wait_for``, also waking when held room lapses (nothing notifies that)."""
        end = None if timeout is None else time.monotonic() + timeout
        while not ready():
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return False
            self._cond.wait(self._held.until_next_lapse(left))
        return True

    # --- what a selector may add -----------------------------------------------------------------

    def _select(self, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        raise NotImplementedError

    def _default_priority(self) -> float:
        return 1.0

    def _on_insert(self, slots: np.ndarray, evicted: np.ndarray) -> None:
        """New items in ``slots``; ``evicted``: the slots the remover freed for them (not yet told)."""
        self._on_remove(evicted)

    def _on_remove(self, slots: np.ndarray) -> None:
        pass

    def _on_priorities(self, slots: np.ndarray) -> None:
        pass

    def _on_reset(self) -> None:
        pass

    def _extra_state(self, slots: np.ndarray) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: dict[str, Any], slots: np.ndarray) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_size={self.max_size}, rate_limiter={self.rate_limiter!r})"


def insert_into(tables: Sequence[_Table], item: Any, priorities: Sequence[float | None] | None = None,
                timeout: float | None = None) -> list[int]:
    """Reverb's ``client.insert(data, priorities={table: p, ...})``: stores ``item`` in every one of
    ``tables`` (which share a lock, see ``share_lock``) or, until all admit it, in none. One
    priority per table (None: that table's default). Returns the item's key in each table."""
    priorities = [None] * len(tables) if priorities is None else list(priorities)
    if len(priorities) != len(tables):
        raise ValueError(f"got {len(priorities)} priorities for {len(tables)} tables; pass one per table (or None)")
    wrapped = [None if p is None else [p] for p in priorities]
    return [int(keys[0]) for keys in insert_rows_into(tables, rows_of_item(item), 1, wrapped, timeout)]


def insert_rows_into(tables: Sequence[_Table], rows: list[_Rows], n: int, priorities: Sequence[Any],
                     timeout: float | None) -> list[np.ndarray]:
    """``insert_into`` for a batch of n items already grouped by signature (``rows_of_*``), with
    one priorities entry (None, or n values) per table. Returns each table's keys."""
    lock = tables[0]._cond
    if any(table._cond is not lock for table in tables):
        raise ValueError("an insert into several tables needs tables that share a lock (table.share_lock(...))")
    with lock:
        prepared = [table._prepare(rows, n, p) for table, p in zip(tables, priorities, strict=True)]
        if n == 0:
            return [np.empty(0, np.int64) for _ in tables]
        for table in tables:
            table._held.use(n)

        def blocked() -> str:
            return next(t._insert_blocked(n) for t in tables if not t._can_insert(n))

        tables[0]._wait(lambda: any(t._closed for t in tables) or all(t._can_insert(n) for t in tables),
                        timeout, "insert_waits", blocked)
        for table in tables:
            table._check_open()
        return [table._commit(rows, n, p) for table, p in zip(tables, prepared)]


class HeldRoom:
    """Room ``can_insert(..., hold=...)`` keeps for the next inserts: [lapse time, items] in the
    order it was asked for. Guarded by its table's lock."""

    def __init__(self) -> None:
        self._holds: list[list] = []

    def add(self, items: int, seconds: float) -> None:
        self._holds.append([time.monotonic() + seconds, items])

    def use(self, items: int) -> None:
        """An insert of ``items`` takes the oldest held room first."""
        self._drop_lapsed()
        while items > 0 and self._holds:
            taken = min(items, self._holds[0][1])
            self._holds[0][1] -= taken
            items -= taken
            if not self._holds[0][1]:
                self._holds.pop(0)

    def total(self) -> int:
        self._drop_lapsed()
        return sum(items for _, items in self._holds)

    def until_next_lapse(self, timeout: float | None) -> float | None:
        """How long a waiter may sleep before held room lapses (at most ``timeout``)."""
        self._drop_lapsed()
        if not self._holds:
            return timeout
        left = min(lapse for lapse, _ in self._holds) - time.monotonic()
        return max(0.0, left) if timeout is None else max(0.0, min(timeout, left))

    def clear(self) -> None:
        self._holds.clear()

    def _drop_lapsed(self) -> None:
        if self._holds:
            now = time.monotonic()
            self._holds = [hold for hold in self._holds if hold[0] > now]


class Fifo(_Table):
    """Oldest first. By default Reverb's queue: ``sample(n)`` waits for n items and removes them
    (``max_times_sampled=1``), and inserts wait while it is full, so slow learners push back on
    actors. Pass another ``rate_limiter`` and ``max_times_sampled`` for Reverb's Fifo selector
    in a sampled table."""

    def __init__(self, max_size: int, rate_limiter: RateLimiter | None = None, *, max_times_sampled: int = 1,
                 signature: Any = None) -> None:
        super().__init__(max_size, Queue(max_size) if rate_limiter is None else rate_limiter,
                         max_times_sampled=max_times_sampled, signature=signature)

    def __repr__(self) -> str:
        if isinstance(self.rate_limiter, Queue) and self.max_times_sampled == 1:
            return f"Fifo(max_size={self.max_size})"
        return super().__repr__()

    def _select(self, n: int) -> tuple[np.ndarray, None]:
        return self._repeat_in_order(self._order.take(n if self.max_times_sampled else 1, self._live), n), None


class Lifo(_Table):
    """Newest first (Reverb's Lifo selector); ``Table.stack(n)`` makes it a stack."""

    def _select(self, n: int) -> tuple[np.ndarray, None]:
        candidates = self._order.take(n if self.max_times_sampled else 1, self._live, newest=True)
        return self._repeat_in_order(candidates, n), None


class Uniform(_Table):
    """Every live item is equally likely; ``probabilities`` is ``1 / size`` for each draw.

    ``rate_limiter`` defaults to ``MinSize(1)``; ``seed`` fixes the sampling stream.
    """

    def _select(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        return self._order.uniform(n, self._live, self._size, self._rng), np.full(n, 1.0 / self._size)


class Prioritized(_Table):
    """Draws key k with probability p_k**priority_exponent / sum_j p_j**priority_exponent.

    ``insert(item)`` without a priority gives the largest priority set so far (1.0 before any is
    positive), so new data is seen soon, as in prioritized experience replay.
    """

    def __init__(self, max_size: int, priority_exponent: float = 0.6, rate_limiter: RateLimiter | None = None,
                 seed: int | None = None, *, max_times_sampled: int = 0, signature: Any = None) -> None:
        if not (np.isfinite(priority_exponent) and priority_exponent >= 0):
            raise ValueError(f"priority_exponent must be finite and >= 0, got {priority_exponent!r}")
        self.priority_exponent = float(priority_exponent)
        super().__init__(max_size, rate_limiter, seed, max_times_sampled=max_times_sampled, signature=signature)
        self._on_reset()

    def _on_reset(self) -> None:
        self._tree = SumTree(self.max_size)  # holds p**exponent by slot, 0 for free slots
        self._max_priority = 0.0

    def _default_priority(self) -> float:
        return self._max_priority if self._max_priority > 0 else 1.0

    def _on_insert(self, slots: np.ndarray, evicted: np.ndarray) -> None:
        """One tree update for both (a full table's new items mostly take the evicted slots)."""
        weights = self._priorities[slots] ** self.priority_exponent
        self._tree.set(np.concatenate([evicted, slots]), np.concatenate([np.zeros(len(evicted)), weights]))
        self._note_max(slots)

    def _on_priorities(self, slots: np.ndarray) -> None:
        self._tree.set(slots, self._priorities[slots] ** self.priority_exponent)
        self._note_max(slots)

    def _note_max(self, slots: np.ndarray) -> None:
        if slots.size:
            self._max_priority = max(self._max_priority, float(self._priorities[slots].max()))

    def _on_remove(self, slots: np.ndarray) -> None:
        self._tree.set(slots, 0.0)

    def _select(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        slots = self._tree.sample(self._rng.random(n))
        return slots, self._tree.get(slots) / self._tree.total()

    def _extra_state(self, slots: np.ndarray) -> dict[str, Any]:
        return dict(max_priority=self._max_priority)

    def _load_extra_state(self, state: dict[str, Any], slots: np.ndarray) -> None:
        self._max_priority = float(state["max_priority"])


class MaxHeap(_Table):
    """The item of highest priority (Reverb's MaxHeap selector); of equal priorities, the one
    inserted or updated least recently. Each draw scans the live priorities (O(size))."""

    _sign = -1.0  # ranks by sign * priority, ascending

    def __init__(self, max_size: int, rate_limiter: RateLimiter | None = None, *, max_times_sampled: int = 0,
                 signature: Any = None) -> None:
        super().__init__(max_size, rate_limiter, max_times_sampled=max_times_sampled, signature=signature)
        self._on_reset()

    def _on_reset(self) -> None:
        self._stamps = np.zeros(self.max_size, np.int64)  # when each slot was last inserted or updated
        self._clock = 0

    def _on_insert(self, slots: np.ndarray, evicted: np.ndarray) -> None:
        self._on_priorities(slots)

    def _on_priorities(self, slots: np.ndarray) -> None:
        self._stamps[slots] = self._clock + np.arange(len(slots))
        self._clock += len(slots)

    def _select(self, n: int) -> tuple[np.ndarray, None]:
        live = np.flatnonzero(self._live)
        rank = self._sign * self._priorities[live]
        wanted = n if self.max_times_sampled else 1
        if wanted < len(live):  # only the best `wanted` priorities (and their ties) need ordering
            threshold = np.partition(rank, wanted - 1)[wanted - 1]
            live, rank = live[rank <= threshold], rank[rank <= threshold]
        return self._repeat_in_order(live[np.lexsort((self._stamps[live], rank))], n), None

    def _extra_state(self, slots: np.ndarray) -> dict[str, Any]:
        return dict(stamps=self._stamps[slots], clock=self._clock)

    def _load_extra_state(self, state: dict[str, Any], slots: np.ndarray) -> None:
        self._stamps[slots] = np.asarray(state["stamps"], np.int64)
        self._clock = int(state["clock"])


class MinHeap(MaxHeap):
    """The item of lowest priority (Reverb's MinHeap selector); ties as in ``MaxHeap``."""

    _sign = 1.0


Table = _Table
"""The base class of every table, for ``isinstance`` checks, type hints, and ``Table.queue`` /
``Table.stack``."""
