"""Calls to a server in the caller's own process, without gRPC: what a colocated node's handle
becomes (``Client(address, local=True)``, as the launchers make them).

The semantics are the wire's: the token is checked; arguments and results are copied through
the codec (the callee may keep what it was given, and only wire types pass); the method runs on
the server's thread pool (so ``thread_pool_size=1`` still serialises calls); its exception comes
back as the same type the wire would give; a deadline is a ``DeadlineExceededError``; a stopped
server is ``UnavailableError``. What it saves is the loopback RPC: a tiny call costs a
thread hand-off instead of a gRPC round trip.
"""

from __future__ import annotations

import heapq
import hmac
import itertools
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any, Protocol

from jaxdist.courier import codec
from jaxdist.courier.errors import (
    AuthenticationError,
    CourierError,
    DeadlineExceededError,
    UnavailableError,
    UnknownMethodError,
    describe_exception,
    rebuild_exception,
)


class Serving(Protocol):
    """What local calls need of a server (`courier.Server` is one): defined here, so that this
    module needs nothing of the server's and the server may register with it."""

    address: str
    token: str | None
    methods: list[str]

    def local_method(self, name: str, timeout: float | None) -> Callable[..., Any] | None: ...

    def unknown_method_message(self, name: str) -> str: ...

    def submit(self, call: Callable[[], None]) -> None: ...


_SERVING: dict[str, Serving] = {}
_CHANGED = threading.Condition()


def register(server: Serving) -> None:
    with _CHANGED:
        _SERVING[server.address] = server
        _CHANGED.notify_all()


def unregister(server: Serving) -> None:
    with _CHANGED:
        if _SERVING.get(server.address) is server:
            del _SERVING[server.address]


def serving(address: str, wait: float = 0.0) -> Serving | None:
    """The started server of this process bound to ``address``, waiting up to ``wait`` seconds
    for one (a node restarting on its address), or None."""
    with _CHANGED:
        _CHANGED.wait_for(lambda: address in _SERVING, timeout=wait)
        return _SERVING.get(address)


def _copy(value: Any, root: str) -> Any:
    return codec.decode(b"".join(codec.encode_parts(value, root=root)))


class LocalConnection:
    """The client side of local calls to ``server`` (a ``courier.client`` connection's interface).
    Closing it fails the calls still waiting, as closing a channel does (a stop's way to free
    callers blocked on a node that is going away)."""

    shares_memory = False  # nothing crosses a process boundary

    def __init__(self, address: str, token: str | None) -> None:
        self._address, self._token = address, token
        self._lock = threading.Lock()
        self._pending: set[futures.Future] = set()
        self._closed = False

    def call(self, name: str, args: tuple, kwargs: dict, options: Any) -> Any:
        return self.call_future(name, args, kwargs, options).result()

    def call_future(self, name: str, args: tuple, kwargs: dict, options: Any) -> futures.Future:
        outcome: futures.Future = futures.Future()
        try:
            server = self._server_for(name, options)
            call = _copy([list(args), kwargs], root="args")  # the callee may keep them
            method = server.local_method(name, options.timeout)
            if method is None:
                raise UnknownMethodError(server.unknown_method_message(name))
            with self._lock:
                self._pending.add(outcome)
            server.submit(lambda: self._run(outcome, name, method, call))
            if options.timeout is not None:  # a future misses its deadline as it would over the wire
                _DEADLINES.add(outcome, options.timeout, DeadlineExceededError(
                    f"{name} on {self._address} (local) did not answer within {options.timeout} s"))
        except RuntimeError:  # the pool shut down: the server stopped
            _settle(outcome, error=UnavailableError(f"{name}: the server at {self._address} has stopped"))
        except CourierError as error:
            _settle(outcome, error=error)
        return outcome

    def list_methods(self, options: Any) -> list[str]:
        return list(self._server_for("methods", options).methods)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pending, self._pending = self._pending, set()
        for outcome in pending:
            _settle(outcome, error=UnavailableError(f"the client of {self._address} was closed"))

    def _run(self, outcome: futures.Future, name: str, method: Any, call: list) -> None:
        try:
            result = _copy(method(*call[0], **call[1]), root="result")
        except Exception as exc:  # noqa: BLE001 - the caller gets what the wire would give it
            _settle(outcome, error=rebuild_exception(_copy(describe_exception(exc), root="error"), name,
                                                     self._address))
        else:
            _settle(outcome, result=result)
        with self._lock:
            self._pending.discard(outcome)

    def _server_for(self, name: str, options: Any) -> Serving:
        """The server now serving the address (one restarted on it too), as a wire client waits
        for it with ``wait_for_ready`` within its deadline; the token checked as the wire does."""
        wait = (60.0 if options.timeout is None else options.timeout) if options.wait_for_ready else 0.0
        server = None if self._closed else serving(self._address, wait)
        if server is None:
            raise UnavailableError(f"{name}: no server at {self._address} in this process (stopped?), or this "
                                   f"client was closed")
        expected = server.token
        if expected is not None and not (self._token is not None
                                         and hmac.compare_digest(self._token.encode(), expected.encode())):
            raise AuthenticationError(f"{name} on {self._address}: wrong or missing token; pass the program's "
                                      f"token to Client(token=...)")
        return server


def _settle(outcome: futures.Future, result: Any = None, error: BaseException | None = None) -> None:
    """Settle `outcome` unless a close settled it first."""
    try:
        if error is None:
            outcome.set_result(result)
        else:
            outcome.set_exception(error)
    except futures.InvalidStateError:
        pass


class _Deadlines:
    """One thread that fails the local futures whose deadline passed (a timer per call would cost
    a thread each)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, futures.Future, BaseException]] = []
        self._changed = threading.Condition()
        self._count = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, outcome: futures.Future, timeout: float, error: BaseException) -> None:
        with self._changed:
            heapq.heappush(self._heap, (time.monotonic() + timeout, next(self._count), outcome, error))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="courier-local-deadlines", daemon=True)
                self._thread.start()
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while self._heap and self._heap[0][2].done():
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._changed.wait()
                    continue
                due, _, outcome, error = self._heap[0]
                if due > time.monotonic():
                    self._changed.wait(due - time.monotonic())
                    continue
                heapq.heappop(self._heap)
            _settle(outcome, error=error)


_DEADLINES = _Deadlines()
