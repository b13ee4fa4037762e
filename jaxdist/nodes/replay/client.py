"""Calling replay nodes: `ReplayClient` for one node, `sample_many` for a batch from several.

A replay node never holds one of its server's threads for long (see ``node.py``): a call that
must wait is answered within about ``max_wait`` seconds, with a ``TimeoutError`` whose message
starts with ``NOT_READY`` (it waited its slice and is still blocked) or ``BUSY`` (enough calls
already wait in the node, so it could not wait at all). Those answers mean "ask again"; the
helpers here do, until the caller's own timeout, and raise a plain ``TimeoutError`` naming what
blocked them when it passes. A timeout the node can serve within one slice is final at the node.
A node shutting down (its tables closed) is, to these calls, a node away: ``ConnectionError``.

``ReplayClient(client)`` wraps the courier client a replay node's handle becomes::

    replay = ReplayClient(queue)                  # inside a node; `queue` was a handle
    replay.insert_many(chunks, timeout=60)        # blocks while the Fifo is full
    batch = replay.sample(32)                     # {"keys", "data", "probabilities", "stacked"}
    future = replay.futures.insert(chunk)         # the same retries, off the caller's thread

``sample_many(clients, n)`` splits a batch over several replay nodes (all asked at once) and
tags each key with its node's index, so ``update_priorities_many`` sends each priority home.
"""

from __future__ import annotations

import random
import re
import threading
import time
from concurrent import futures
from typing import Any, Callable, NoReturn, Sequence

import numpy as np

from jaxdist.courier import CourierError

DEFAULT_TABLE = "default"
NOT_READY = "replay not ready, try again"
BUSY = "replay busy, try again"

MAX_SERVER_WAIT = 10.0
"""The longest slice a node may wait in one call (ReplayNode refuses a larger max_wait)."""

_MIN_BACKOFF, _MAX_BACKOFF = 0.002, 0.05  # after a BUSY answer: the node could not wait at all


def _closed_table(exc: BaseException) -> bool:
    """Whether `exc` is a replay node's table closed as the node shuts down, seen over the wire."""
    return isinstance(exc, CourierError) and str(exc).startswith("TableClosedError: ")


def try_again_kind(exc: BaseException) -> str | None:
    """"busy" or "not_ready" when `exc` is a replay node's ask-again answer; None otherwise."""
    if not isinstance(exc, TimeoutError) or isinstance(exc, CourierError):  # a courier deadline is not one
        return None
    message = str(exc)
    if message.startswith(BUSY):
        return "busy"
    if message.startswith(NOT_READY):
        return "not_ready"
    return None


def _reason(exc: BaseException) -> str:
    """The node's explanation, without the marker, the slice's own time and the remote traceback."""
    text = str(exc).split("\n\nRemote traceback", 1)[0]
    for marker in (BUSY, NOT_READY):
        if text.startswith(marker):
            text = text[len(marker):].lstrip(": ")
    return re.sub(r" \(gave up after [^)]* s\)$", "", text)


def _is_remote_timeout(exc: BaseException) -> bool:
    """A table's own TimeoutError from the node (not a courier deadline): the last slice ended."""
    return isinstance(exc, TimeoutError) and not isinstance(exc, CourierError) and hasattr(exc, "remote_traceback")


class _Deadline:
    def __init__(self, timeout: float | None) -> None:
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be None or >= 0 seconds, got {timeout!r}")
        self.timeout = timeout
        self._end = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> float | None:
        return None if self._end is None else max(0.0, self._end - time.monotonic())

    def rpc_timeout(self, margin: float) -> float:
        """A courier deadline for one attempt: the node answers within min(remaining, its slice)."""
        remaining = self.remaining()
        return margin + (MAX_SERVER_WAIT if remaining is None else min(remaining, MAX_SERVER_WAIT))


class _Backoff:
    def __init__(self) -> None:
        self._delay = _MIN_BACKOFF

    def after(self, kind: str, deadline: _Deadline) -> float:
        """Seconds to sleep before the next attempt (none after the node waited its slice)."""
        if kind != "busy":
            self._delay = _MIN_BACKOFF
            return 0.0
        delay = self._delay * (0.5 + random.random())
        self._delay = min(2 * self._delay, _MAX_BACKOFF)
        remaining = deadline.remaining()
        return delay if remaining is None else min(delay, remaining)


def _as_priorities(priorities: Any) -> Any:
    """float64 arrays on the wire: one for every table, or a dict of them by table name."""
    if isinstance(priorities, dict):
        return {name: None if p is None else np.asarray(p, np.float64) for name, p in priorities.items()}
    return None if priorities is None else np.asarray(priorities, np.float64)


def _gave_up(method: str, address: str, timeout: float | None, last: BaseException) -> TimeoutError:
    return TimeoutError(f"{method} on replay node {address} gave up after {timeout} s: {_reason(last)}")


class ReplayClient:
    """Blocking replay calls that wait as long as the caller asks, whatever the node's slice.

    `client` is a `courier.Client` of a replay node (what its handle becomes inside a node).
    `rpc_margin` is added to each attempt's courier deadline to cover transport (large chunks).
    `futures` runs the same calls on `max_workers` threads of this client's own.
    """

    def __init__(self, client: Any, *, rpc_margin: float = 30.0, max_workers: int = 4) -> None:
        if isinstance(client, ReplayClient):
            client = client.courier_client
        for needed in ("call", "with_timeout"):
            if not callable(getattr(client, needed, None)):
                raise TypeError(f"ReplayClient takes the courier client of a replay node (a dereferenced "
                                f"handle), got {client!r}")
        self.courier_client = client
        self._rpc_margin = rpc_margin
        self._max_workers = max_workers
        self._executor: futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.futures = _ReplayFutures(self)

    @property
    def address(self) -> str:
        return getattr(self.courier_client, "address", "?")

    def insert(self, item: Any, priority: Any = None, table: str | list[str] = DEFAULT_TABLE,
               timeout: float | None = None) -> int | dict[str, int]:
        """Inserts one item (a pytree of arrays); returns its key once the node has stored it. With a
        list of tables it goes into all of them atomically (``priority``: one value, or a dict by
        table) and the keys come back by table."""
        return self._retrying("insert", (item,), {"priority": priority, "table": table}, timeout)

    def insert_many(self, items: Sequence[Any], priorities: Any = None,
                    table: str | list[str] = DEFAULT_TABLE, timeout: float | None = None) -> list[int]:
        """Inserts a batch in one call, atomically (all stored, or none); returns their keys."""
        priorities = _as_priorities(priorities)
        return self._retrying("insert_many", (list(items),), {"priorities": priorities, "table": table}, timeout)

    def insert_batch(self, batch: Any, priorities: Any = None,
                     table: str | list[str] = DEFAULT_TABLE, timeout: float | None = None) -> list[int]:
        """``insert_many`` for items already stacked along a leading axis (one array per leaf on
        the wire, not one per item per leaf: far cheaper for many small items)."""
        priorities = _as_priorities(priorities)
        return self._retrying("insert_batch", (batch,), {"priorities": priorities, "table": table}, timeout)

    def sample(self, batch_size: int, table: str = DEFAULT_TABLE, timeout: float | None = None,
               info: bool = False) -> dict[str, Any]:
        """``{"keys": int64 (batch_size,), "data", "probabilities": array or None, "stacked": bool}``:
        ``data`` is the items' pytree, every leaf stacked, when ``stacked``; else (the items'
        signatures differ) a list of the items. With ``info`` also ``"info": {"priorities",
        "times_sampled", "table_size"}``."""
        return self._retrying("sample", (batch_size,), {"table": table, "info": info}, timeout)

    def update_priorities(self, keys: Any, priorities: Any, table: str = DEFAULT_TABLE) -> None:
        self._call("update_priorities", np.asarray(keys, np.int64), np.asarray(priorities, np.float64),
                   table=table)

    def delete(self, keys: Any, table: str = DEFAULT_TABLE) -> int:
        """Removes the items with these keys (those already gone are skipped); returns how many went."""
        return self._call("delete", np.asarray(keys, np.int64), table=table)

    def reset(self, table: str = DEFAULT_TABLE) -> None:
        """Empties the table and zeroes its rate limiter's counts."""
        self._call("reset", table=table)

    def can_sample(self, n: int = 1, table: str = DEFAULT_TABLE) -> bool:
        return self._call("can_sample", n, table=table)

    def can_insert(self, n: int = 1, table: str = DEFAULT_TABLE, wait: float = 0.0, hold: float = 0.0) -> bool:
        """Whether an insert of n would proceed now, or (``wait`` > 0) within ``wait`` seconds
        (the node waits one slice at most); with ``hold``, a True answer keeps that room for the
        next inserts for ``hold`` seconds. The call's deadline is ``wait`` plus ``rpc_margin``:
        a node that dies mid-call does not hold the caller for the client's whole timeout."""
        return self.futures.can_insert(n, table, wait, hold).result()

    def info(self, table: str = DEFAULT_TABLE) -> dict[str, Any]:
        return self._call("info", table=table)

    def size(self, table: str = DEFAULT_TABLE) -> int:
        return self._call("size", table=table)

    def stats(self) -> dict[str, dict[str, Any]]:
        return self._call("stats")

    def checkpoint(self, timeout: float = 300.0) -> int:
        """Checkpoints every table of the node now; returns the committed step."""
        return self.courier_client.with_timeout(timeout).call("checkpoint")

    def close(self) -> None:
        """Stops this client's future threads (the courier client belongs to the node's handle)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.courier_client.call(method, *args, **kwargs)

    def __reduce__(self) -> NoReturn:
        raise TypeError(f"{self!r} holds a live connection to its replay node, so it does not pickle: pass the "
                        f"replay node's handle (it becomes a courier client where it is used) and wrap that in "
                        f"ReplayClient there")

    def _retrying(self, method: str, args: tuple, kwargs: dict, timeout: float | None) -> Any:
        deadline, backoff = _Deadline(timeout), _Backoff()
        while True:
            rpc = self.courier_client.with_timeout(deadline.rpc_timeout(self._rpc_margin))
            try:
                return rpc.call(method, *args, timeout=deadline.remaining(), **kwargs)
            except TimeoutError as exc:
                kind = try_again_kind(exc)
                if kind is None:
                    if _is_remote_timeout(exc):
                        raise _gave_up(method, self.address, timeout, exc) from None
                    raise
                if deadline.remaining() == 0:
                    raise _gave_up(method, self.address, timeout, exc) from None
                delay = backoff.after(kind, deadline)
                if delay:
                    time.sleep(delay)
            except CourierError as exc:
                if _closed_table(exc):  # the node is shutting down: away, as a restarting node is
                    raise ConnectionError(f"{method} on {self.address}: the replay node is shutting down "
                                          f"({_reason(exc)})") from exc
                raise

    def _submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> futures.Future:
        with self._lock:
            if self._executor is None:
                self._executor = futures.ThreadPoolExecutor(self._max_workers, thread_name_prefix="replay-client")
            return self._executor.submit(fn, *args, **kwargs)

    def __repr__(self) -> str:
        return f"ReplayClient({self.address!r})"


class _ReplayFutures:
    """``replay.futures.insert(...)`` etc.: the blocking calls as `concurrent.futures.Future`s."""

    def __init__(self, replay: ReplayClient) -> None:
        self._replay = replay

    def insert(self, *args: Any, **kwargs: Any) -> futures.Future:
        return self._replay._submit(self._replay.insert, *args, **kwargs)

    def insert_many(self, *args: Any, **kwargs: Any) -> futures.Future:
        return self._replay._submit(self._replay.insert_many, *args, **kwargs)

    def sample(self, *args: Any, **kwargs: Any) -> futures.Future:
        return self._replay._submit(self._replay.sample, *args, **kwargs)

    def can_insert(self, n: int = 1, table: str = DEFAULT_TABLE, wait: float = 0.0,
                   hold: float = 0.0) -> futures.Future:
        """Courier's own future (no thread of this client's: an actor asks before every trajectory)."""
        rpc = self._replay.courier_client.with_timeout(wait + self._replay._rpc_margin)
        return rpc.futures.can_insert(n, table=table, wait=wait, hold=hold)


# Several nodes ------------------------------------------------------------------------------


class SampleError(Exception):
    """Mixin of `sample_many`'s failures: ``partial`` holds what the other nodes delivered.

    Sampling a Fifo removes items, so those are gone from their nodes; insert them again if
    they matter.
    """

    partial: dict[str, Any] | None = None


class SampleTimeoutError(SampleError, TimeoutError):
    """`sample_many` ran out of time before every node delivered its share."""


def split_batch(batch_size: int, nodes: int) -> list[int]:
    """Shares as equal as possible, the first nodes taking one more."""
    if nodes < 1:
        raise ValueError("sample_many needs at least one replay client")
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    base, extra = divmod(int(batch_size), nodes)
    return [base + (i < extra) for i in range(nodes)]


def sample_many(clients: Sequence[Any], batch_size: int, table: str = DEFAULT_TABLE,
                timeout: float | None = None, *, rpc_margin: float = 30.0) -> dict[str, Any]:
    """One batch from several replay nodes, asked in parallel; shares as equal as possible.

    Returns ``{"keys": int64 (batch_size, 2) rows of [node index, key], "data": the shares
    concatenated in node order, "probabilities": each draw's chance under the whole batch (its
    node's share of the batch times its chance within the node), or None for Fifo tables,
    "stacked": as ``ReplayClient.sample`` says}`` (a list of the items when a share was one, or
    the shares' items differ).
    On failure raises the first node's error (a `SampleTimeoutError` when time ran out) after
    every call has ended, with ``error.partial`` set to what the other nodes delivered.
    """
    clients = [ReplayClient(c, rpc_margin=rpc_margin) if not isinstance(c, ReplayClient) else c for c in clients]
    shares = split_batch(batch_size, len(clients))
    deadline = _Deadline(timeout)
    backoffs = {i: _Backoff() for i in range(len(clients))}
    pending: dict[futures.Future, int] = {}
    due: dict[int, float] = {}  # node -> when to ask again
    parts: dict[int, dict[str, Any]] = {}
    errors: dict[int, BaseException] = {}

    def ask(i: int) -> None:
        rpc = clients[i].courier_client.with_timeout(deadline.rpc_timeout(rpc_margin))
        pending[rpc.futures.sample(shares[i], table=table, timeout=deadline.remaining())] = i

    for i, share in enumerate(shares):
        if share:
            ask(i)
    while pending or due:
        wait = None if not due else max(0.0, min(due.values()) - time.monotonic())
        done, _ = futures.wait(list(pending), timeout=wait, return_when=futures.FIRST_COMPLETED)
        for future in done:
            i = pending.pop(future)
            try:
                parts[i] = future.result()
                continue
            except Exception as exc:  # noqa: BLE001 - classified below, raised after the others end
                error = exc
            kind = try_again_kind(error)
            if kind is None:
                errors[i] = _gave_up("sample", clients[i].address, timeout, error) if _is_remote_timeout(error) else error
            elif errors:
                pass  # another node failed: ask no more
            elif deadline.remaining() == 0:
                errors[i] = _gave_up("sample", clients[i].address, timeout, error)
            else:
                due[i] = time.monotonic() + backoffs[i].after(kind, deadline)
        for i, when in list(due.items()):
            if errors:  # someone failed: ask no more
                del due[i]
            elif when <= time.monotonic():
                del due[i]
                ask(i)
    result = _concatenate(parts, shares, batch_size) if parts else None
    if errors:
        error = errors[min(errors)]
        if isinstance(error, TimeoutError) and not isinstance(error, SampleError):
            wrapped = SampleTimeoutError(f"sample_many: node {min(errors)}: {error}")
            wrapped.partial = result
            raise wrapped from error
        try:
            error.partial = result
        except AttributeError:
            pass
        raise error
    return result


def update_priorities_many(clients: Sequence[Any], keys: Any, priorities: Any, table: str = DEFAULT_TABLE,
                           timeout: float | None = 30.0) -> None:
    """Sends each priority to the node its key came from (``keys`` as ``sample_many`` returned them)."""
    keys = np.asarray(keys, np.int64)
    priorities = np.asarray(priorities, np.float64)
    if keys.ndim != 2 or keys.shape[1] != 2 or priorities.shape != keys.shape[:1]:
        raise ValueError(f"keys must be sample_many's (n, 2) rows of [node, key] and priorities (n,); got "
                         f"{keys.shape} and {priorities.shape}")
    clients = [c.courier_client if isinstance(c, ReplayClient) else c for c in clients]
    nodes = keys[:, 0]
    if keys.size and (nodes.min() < 0 or nodes.max() >= len(clients)):
        raise ValueError(f"keys name node {int(nodes.max() if nodes.max() >= len(clients) else nodes.min())} "
                         f"but there are {len(clients)} clients; pass the clients given to sample_many, in order")
    calls = [
        clients[node].with_timeout(timeout).futures.update_priorities(
            keys[nodes == node, 1], priorities[nodes == node], table=table)
        for node in np.unique(nodes)
    ]
    for call in calls:
        call.result()


def _concatenate(parts: dict[int, dict[str, Any]], shares: list[int], batch_size: int) -> dict[str, Any]:
    order = sorted(parts)
    keys = np.concatenate([np.stack([np.full(len(parts[i]["keys"]), i, np.int64),
                                     np.asarray(parts[i]["keys"], np.int64)], axis=1) for i in order])
    if any(parts[i]["probabilities"] is None for i in order):
        probabilities = None
    else:
        probabilities = np.concatenate([np.asarray(parts[i]["probabilities"]) * (shares[i] / batch_size)
                                        for i in order])
    stacked = all(parts[i].get("stacked", True) for i in order) and len(
        {repr(_zip_trees([parts[i]["data"]], _leaf_signature)) for i in order}) == 1
    if stacked:
        data = _zip_trees([parts[i]["data"] for i in order], np.concatenate)
    else:
        data = [item for i in order for item in (_items_of(parts[i]) if parts[i].get("stacked", True)
                                                 else parts[i]["data"])]
    return {"keys": keys, "data": data, "probabilities": probabilities, "stacked": stacked}


def _leaf_signature(leaves: list[np.ndarray]) -> tuple:
    return leaves[0].shape[1:], leaves[0].dtype.str


def _items_of(part: dict[str, Any]) -> list[Any]:
    """A stacked share as a list of its items."""
    return [_zip_trees([part["data"]], lambda leaves, j=j: leaves[0][j]) for j in range(len(part["keys"]))]


def _zip_trees(trees: list[Any], combine: Callable[[list[np.ndarray]], np.ndarray]) -> Any:
    """The trees' common structure, each leaf ``combine`` of the trees' leaves there."""
    first = trees[0]
    if isinstance(first, dict):
        return {key: _zip_trees([tree[key] for tree in trees], combine) for key in first}
    if isinstance(first, (list, tuple)):
        children = [_zip_trees([tree[i] for tree in trees], combine) for i in range(len(first))]
        if isinstance(first, list):
            return children
        return type(first)(*children) if hasattr(first, "_fields") else tuple(children)
    return combine([np.asarray(tree) for tree in trees])
