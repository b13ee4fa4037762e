"""CacherNode: a transparent cache in front of any courier node (Launchpad's Figure 2).

    params = p.add_node(jd.CacherNode(learner, refresh_interval=0.5, stale_after=5.0))

The cacher serves every public method of its target under the same name. N requesters then
cost the target about one call per key per `refresh_interval`, however large N is.

Semantics, for one cache key (method name + arguments), by the age of its entry (seconds since
the upstream call that produced it returned):

* age < `refresh_interval`: served from the cache.
* `refresh_interval` <= age < `stale_after`: served from the cache at once, and one background
  call refreshes the entry (one at a time per key). A failed refresh keeps the old entry.
* no entry, or age >= `stale_after`: never served. The caller waits for a fresh upstream call
  and gets its result, or its error (the target's own exception type when builtin; a target
  that is down yields TimeoutError after `upstream_timeout` s, since courier waits for a
  restarting server, or ConnectionError). Errors are not cached.
* Concurrent callers of one key share one upstream call (misses and refreshes are coalesced).

`stale_after=None` (the default) never expires entries: while the target is away callers get
the last good value. Arguments are keyed by value and type (1, 1.0 and True differ; numpy arrays
by dtype, shape and bytes); a call with any other argument type (a registered dataclass, ...)
bypasses the cache: it goes upstream uncached and uncoalesced. Methods named in `uncached`
(writes such as `push`) always go upstream. Memory: at most `max_entries` results and
`max_bytes` of them with their keys (least recently used evicted first; arrays, bytes and
strings counted by size), each held as received; a result larger than `max_bytes` alone is
passed on to its callers and not kept.

The target's method names are read once, from the target itself, after it is constructed;
calls reaching the cacher before then wait (within their deadline), like calls to any node
still being built. The target may restart on its address: later calls reach the new one.
"""

from __future__ import annotations

import builtins
import collections
import logging
import struct
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from concurrent import futures
from typing import Any

import numpy as np

from jaxdist import courier
from jaxdist.launch.restart import Restart
from jaxdist.program import AddressTable, Executable, Handle, Node, NodeContext

log = logging.getLogger(__name__)

UpstreamCall = Callable[[str, tuple, dict], futures.Future]
"""(method, args, kwargs) -> Future of the target's answer."""


class CacherNode(Node):
    """`CacherNode(handle, refresh_interval, stale_after)`: serves `handle`'s node from a cache."""

    def __init__(
        self,
        handle: Handle,
        refresh_interval: float = 1.0,
        stale_after: float | None = None,
        *,
        upstream_timeout: float = 30.0,
        max_entries: int = 64,
        max_bytes: int = 1 << 30,
        uncached: Iterable[str] = (),
        thread_pool_size: int = 64,
    ) -> None:
        if not isinstance(handle, Handle):
            raise TypeError(f"CacherNode caches a node: pass the handle add_node returned, got {handle!r}")
        _check_timing(refresh_interval, stale_after)
        self.handle = handle
        self.refresh_interval, self.stale_after = float(refresh_interval), stale_after
        self.upstream_timeout, self.max_entries, self.max_bytes = upstream_timeout, max_entries, max_bytes
        self.uncached = tuple(uncached)
        self.thread_pool_size = thread_pool_size

    def default_label(self) -> str:
        return "cacher"

    def default_restart(self) -> Restart:
        return Restart(max_restarts=10, backoff=0.5)

    def create_handle(self) -> Handle:
        return Handle(self)

    def executable(self, context: NodeContext) -> Executable:
        return _CacherExecutable(self, context)

    def shipped_arguments(self) -> dict[str, Any]:
        return {"handle": self.handle, "uncached=": self.uncached}


class Cache:
    """The cache itself, usable without a program: `cache.call(method, args, kwargs)`."""

    def __init__(
        self,
        upstream: UpstreamCall,
        refresh_interval: float = 1.0,
        stale_after: float | None = None,
        *,
        max_entries: int = 64,
        max_bytes: int = 1 << 30,
        uncached: Iterable[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _check_timing(refresh_interval, stale_after)
        if max_entries < 1 or max_bytes < 1:
            raise ValueError(f"max_entries and max_bytes must be >= 1, got {max_entries} and {max_bytes}")
        self._upstream = upstream
        self._refresh_interval, self._stale_after = refresh_interval, stale_after
        self._max_entries, self._max_bytes, self._bytes = max_entries, max_bytes, 0
        self._uncached = frozenset(uncached)
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[Hashable, tuple[float, Any, int]] = collections.OrderedDict()
        self._in_flight: dict[Hashable, futures.Future] = {}
        self._counts = dict.fromkeys(
            ["hits", "misses", "coalesced", "refreshes", "upstream_calls", "upstream_errors", "bypassed", "evicted",
             "too_large"], 0
        )

    def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        key = cache_key(method, args, kwargs) if method not in self._uncached else None
        if key is None:
            with self._lock:
                self._counts["bypassed"] += 1
                self._counts["upstream_calls"] += 1
            return _result(self._upstream(method, args, kwargs))
        with self._lock:
            fresh, value = self._lookup(key)
            pending = None if fresh else self._in_flight.get(key)
            if fresh:
                self._counts["hits"] += 1
                due = self._clock() - fresh[0] >= self._refresh_interval and key not in self._in_flight
                start = self._begin(key) if due else None
                self._counts["refreshes"] += due
            elif pending is not None:
                self._counts["misses"] += 1
                self._counts["coalesced"] += 1
                start = None
            else:
                self._counts["misses"] += 1
                start = pending = self._begin(key)
        if start is not None:
            self._launch(key, start, method, args, kwargs)
        return value if fresh else _result(pending)

    def _lookup(self, key: Hashable) -> tuple[tuple[float, Any, int] | None, Any]:
        """(entry, value) when `key` holds an entry young enough to serve, else (None, None)."""
        entry = self._entries.get(key)
        if entry is None or (self._stale_after is not None and self._clock() - entry[0] >= self._stale_after):
            return None, None
        self._entries.move_to_end(key)
        return entry, entry[1]

    def stats(self) -> dict[str, int]:
        """hits, misses, coalesced (misses that joined a call in flight), refreshes, upstream_calls,
        upstream_errors, bypassed, evicted, too_large (results not kept), entries, bytes."""
        with self._lock:
            return dict(self._counts, entries=len(self._entries), bytes=self._bytes)

    def _begin(self, key: Hashable) -> futures.Future:
        """Register a call in flight for `key` (under the lock); `_launch` sends it."""
        pending: futures.Future = futures.Future()
        self._in_flight[key] = pending
        self._counts["upstream_calls"] += 1
        return pending

    def _launch(self, key: Hashable, pending: futures.Future, method: str, args: tuple, kwargs: dict) -> None:
        try:
            upstream = self._upstream(method, args, kwargs)
        except Exception as exc:  # e.g. an argument the codec refuses
            self._settle(key, pending, None, exc)
            return

        def done(call: futures.Future) -> None:
            try:
                value = call.result()
            except BaseException as exc:
                self._settle(key, pending, None, exc)
            else:
                self._settle(key, pending, value, None)

        upstream.add_done_callback(done)

    def _settle(self, key: Hashable, pending: futures.Future, value: Any, error: BaseException | None) -> None:
        with self._lock:
            self._in_flight.pop(key, None)
            if error is None:
                self._keep(key, value)
            else:
                self._counts["upstream_errors"] += 1
        if error is None:
            pending.set_result(value)
        else:  # waiters get it; a background refresh's error only counts (the entry stays)
            log.debug("upstream call failed: %s", error)
            pending.set_exception(error)


    def _keep(self, key: Hashable, value: Any) -> None:
        """Hold `value` under `key` (under the lock), evicting the least recently used beyond the bounds."""
        size = _size(key) + _size(value)
        old = self._entries.pop(key, None)
        self._bytes -= old[2] if old is not None else 0
        if size > self._max_bytes:
            self._counts["too_large"] += 1
            return
        self._entries[key] = (self._clock(), value, size)
        self._bytes += size
        while len(self._entries) > self._max_entries or self._bytes > self._max_bytes:
            self._bytes -= self._entries.popitem(last=False)[1][2]
            self._counts["evicted"] += 1


def _size(value: Any) -> int:
    """Bytes a value holds, roughly: arrays, bytes and strings by size, 8 for anything else."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if isinstance(value, dict):
        return sum(_size(k) + _size(v) for k, v in value.items()) + 8
    if isinstance(value, (list, tuple)):
        return sum(_size(item) for item in value) + 8
    return 8


def cache_key(method: str, args: tuple, kwargs: dict) -> Hashable | None:
    """A hashable key of a call, or None when an argument is not a plain wire type."""
    try:
        return (method, _freeze(tuple(args)), _freeze(dict(kwargs)))
    except (_Unkeyable, RecursionError):
        return None


class _Unkeyable(Exception):
    pass


def _freeze(value: Any) -> Hashable:
    """Tagged by type, so that 1, 1.0, True, (1,) and [1] are different keys."""
    kind = type(value)
    if value is None or kind is str or kind is bytes:
        return value
    if kind is bool:
        return ("b", value)
    if kind is int:
        return ("i", value)
    if kind is float:
        return ("f", struct.pack("<d", value))  # bytes: NaN equals itself, -0.0 differs from 0.0
    if kind is list or kind is tuple:
        return ("l" if kind is list else "t", tuple(_freeze(item) for item in value))
    if kind is dict:
        return ("d", tuple((_freeze(k), _freeze(v)) for k, v in value.items()))
    if kind is np.ndarray:
        return ("a", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, np.generic):
        return ("n", value.dtype.str, value.tobytes())
    raise _Unkeyable(kind.__name__)


def _result(future: futures.Future) -> Any:
    """The future's value; courier's transport errors become their builtin bases for the caller."""
    try:
        return future.result()
    except courier.CourierError as exc:
        base = next((t for t in type(exc).__mro__ if getattr(builtins, t.__name__, None) is t), Exception)
        if base is Exception:
            raise
        raise base(f"{type(exc).__name__}: {exc}") from None


def _check_timing(refresh_interval: float, stale_after: float | None) -> None:
    if refresh_interval < 0:
        raise ValueError(f"refresh_interval must be >= 0 seconds, got {refresh_interval}")
    if stale_after is not None and stale_after < refresh_interval:
        raise ValueError(
            f"stale_after ({stale_after}) must be >= refresh_interval ({refresh_interval}): an entry goes "
            f"stale before it is refreshed; use stale_after=None to serve the last value forever"
        )


class _Facade:
    """The object the cacher's server serves: one attribute per method of the target."""


class _CacherExecutable(Executable):
    def __init__(self, node: CacherNode, context: NodeContext) -> None:
        self._node, self._context = node, context
        self._server: courier.Server | None = None
        self._stopping = threading.Event()
        self.cache: Cache | None = None

    def bind(self) -> AddressTable:
        self._server = courier.Server(
            None,
            self._context.address_for(self._node.name),
            token=self._context.token,
            thread_pool_size=self._node.thread_pool_size,
        ).start()
        return {self._node.name: self._server.address}

    def construct(self, addresses: AddressTable, make_client: Callable[[str], Any]) -> None:
        node = self._node
        target = node.handle.dereference(make_client).with_timeout(node.upstream_timeout)

        def upstream(method: str, args: tuple, kwargs: dict) -> futures.Future:
            return getattr(target.futures, method)(*args, **kwargs)

        self.cache = Cache(
            upstream, node.refresh_interval, node.stale_after, max_entries=node.max_entries,
            max_bytes=node.max_bytes, uncached=node.uncached,
        )
        # The target may still be under construction (its listing is empty until then): learn
        # its methods in the background, so a program whose nodes call each other while being
        # built cannot deadlock on the cacher.
        threading.Thread(target=self._attach_when_listed, args=(target,), name="cacher-attach", daemon=True).start()

    def _attach_when_listed(self, target: courier.Client) -> None:
        lister, began, warned = target.with_timeout(5.0), time.monotonic(), False
        while not self._stopping.is_set():
            try:
                methods = lister.methods()
            except courier.CourierError as exc:
                methods, reason = [], str(exc)
            else:
                reason = "it serves no method yet"
            if methods:
                facade = _Facade()
                for name in methods:
                    setattr(facade, name, _CachedMethod(self.cache, name))
                self._server.attach(facade)
                return
            if not warned and time.monotonic() - began > 30:
                warned = True
                log.warning("cacher %s still cannot list %s: %s", self._node.name, self._node.handle.node_name, reason)
            self._stopping.wait(0.02)

    def shutdown(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.stop(grace=0.5)


class _CachedMethod:
    __slots__ = ("_cache", "_name")

    def __init__(self, cache: Cache, name: str) -> None:
        self._cache, self._name = cache, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._cache.call(self._name, args, kwargs)
