"""Courier client: `client.method(x)` blocks, `client.futures.method(x)` returns a Future.

Every call carries a deadline and waits for the server to be ready, so a client may be made
before its server starts and survives the server restarting on the same address: reconnection
backoff is capped at one second instead of gRPC's 120 s.

A client with a token never sends it: it says hello first, and calls only a server that proves
it holds the token, with a key bound to that server's instance (`jaxdist.courier.server`). A
restarted server refuses the old key once; the client says hello again and calls again.

A client that sends or receives a message over `wire.SHARED_MEMORY_THRESHOLD` asks its server,
once, whether they share a host's memory; if so, such messages go both ways through shared
memory from then on (`courier.shared_memory`).
"""

from __future__ import annotations

import dataclasses
import hmac
import itertools
import secrets
import threading
import time
from concurrent import futures
from typing import Any, Callable, NoReturn

import grpc

from jaxdist.courier import codec, shared_memory, wire
from jaxdist.courier import local as local_module
from jaxdist.courier import tls as tls_module
from jaxdist.courier.tls import TLS
from jaxdist.courier.errors import (
    AuthenticationError,
    CourierError,
    DeadlineExceededError,
    MalformedMessageError,
    MessageTooLargeError,
    RemoteError,
    ServerBusyError,
    UnavailableError,
    UnknownMethodError,
    rebuild_exception,
)

DEFAULT_TIMEOUT = 30.0
_BUSY_PAUSES = (0.05, 0.1, 0.2, 0.5, 1.0)  # between tries of an upload refused as busy; then 1 s each
_SHARED_EXPIRY_WITHOUT_DEADLINE = 3600.0  # seconds a call without a deadline gives its server to read it

_RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class Client:
    """A connection to one courier server."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        token: str | None = None,
        wait_for_ready: bool = True,
        max_message_bytes: int = wire.DEFAULT_MAX_MESSAGE_BYTES,
        inline_limit: int = wire.DEFAULT_INLINE_LIMIT,
        tls: TLS | None = None,
        local: bool = False,
        shared_memory_bytes: int = wire.DEFAULT_SHARED_MEMORY_BYTES,
    ) -> None:
        """`tls`: mutual TLS (default: the environment's, see `jaxdist.courier.tls`; without it,
        plaintext). The address's host must be one the server's certificate names. `local`:
        when a server of this process serves `address`, call it directly, with the wire's
        semantics but no RPC (see `jaxdist.courier.local`); launchers give colocated nodes these.
        `shared_memory_bytes`: what this client's segments for large requests may hold; 0 keeps
        every message on the socket."""
        self.address = address
        self._options = _CallOptions(timeout, wait_for_ready)
        here = local and local_module.serving(address) is not None
        self._connection = (local_module.LocalConnection(address, token) if here else
                            _Connection(address, token, max_message_bytes, inline_limit,
                                        tls or tls_module.from_environment(), shared_memory_bytes))
        self.futures = _FutureMethods(self)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise _private(name)
        method = _BlockingMethod(self._connection, name, self._options)
        self.__dict__[name] = method  # later lookups skip __getattr__
        return method

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """`client.call("m", x)` is `client.m(x)`, for method names held in variables."""
        return self._connection.call(method, args, kwargs, self._options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the served object itself (its ``__call__``)."""
        return self._connection.call("__call__", args, kwargs, self._options)

    def with_timeout(self, timeout: float | None) -> "Client":
        """A client on the same connection whose calls have another deadline (None: none)."""
        return self._with(_CallOptions(timeout, self._options.wait_for_ready))

    def failing_fast(self) -> "Client":
        """A client on the same connection whose calls fail at once (`UnavailableError`) while
        the server is unreachable, instead of waiting for it within their deadline: for callers
        with somewhere else to go, such as a pool of evaluators."""
        return self._with(_CallOptions(self._options.timeout, False))

    @property
    def shares_memory(self) -> bool:
        """Whether large messages to and from this server go through shared memory (known
        after the first message over `wire.SHARED_MEMORY_THRESHOLD`)."""
        return self._connection.shares_memory

    def methods(self) -> list[str]:
        """The method names the server serves."""
        return self._connection.list_methods(self._options)

    def close(self) -> None:
        """Close the channel; calls after it fail. Clients made by ``with_timeout`` share it."""
        self._connection.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"courier.Client({self.address!r})"

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            f"{self!r} holds a live connection and its launch's token, so it does not pickle (the token would "
            f"travel with the pickle): pass the node's handle, which becomes a client where it is used, or make "
            f"courier.Client(address, token=...) in the process that calls")

    def _with(self, options: "_CallOptions") -> "Client":
        clone = object.__new__(Client)
        clone.address, clone._options, clone._connection = self.address, options, self._connection
        clone.futures = _FutureMethods(clone)
        return clone


@dataclasses.dataclass(frozen=True)
class _CallOptions:
    timeout: float | None
    wait_for_ready: bool


class _BlockingMethod:
    __slots__ = ("_connection", "_name", "_options")

    def __init__(self, connection: "_Connection", name: str, options: _CallOptions) -> None:
        self._connection, self._name, self._options = connection, name, options

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._connection.call(self._name, args, kwargs, self._options)

    def __getattr__(self, attribute: str) -> NoReturn:
        """`client.future.m()` reads as a namespace but names a remote method `future`."""
        hint = f"; for a future, call client.futures.{attribute}(...)" if self._name == "future" else ""
        raise AttributeError(
            f"client.{self._name} is the remote method {self._name!r}, which has no attribute {attribute!r}{hint}"
        )


class _FutureMethods:
    """`client.futures.method(...)` -> `concurrent.futures.Future` of the result."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def __call__(self, *args: Any, **kwargs: Any) -> futures.Future:
        """A future of calling the served object itself."""
        return self._client._connection.call_future("__call__", args, kwargs, self._client._options)

    def __getattr__(self, name: str) -> Callable[..., futures.Future]:
        if name.startswith("_"):
            raise _private(name)
        connection, options = self._client._connection, self._client._options

        def submit(*args: Any, **kwargs: Any) -> futures.Future:
            return connection.call_future(name, args, kwargs, options)

        self.__dict__[name] = submit
        return submit


class _Connection:
    """One gRPC channel and the encoding, staging and error translation around it."""

    def __init__(self, address: str, token: str | None, max_message_bytes: int, inline_limit: int,
                 tls: TLS | None, shared_memory_bytes: int) -> None:
        self._address = address
        self._token = None if token is None else token.encode()
        self._session: tuple = ()  # (TOKEN_KEY, key) for the server instance that proved the token
        self._ticket: tuple = ()  # (SHARED_MEMORY_KEY, ticket) once the server shares memory with us
        self._metadata: tuple | None = None  # what calls carry: the two above
        self._max_message_bytes = max_message_bytes
        self._inline_limit = inline_limit
        options = wire.grpc_options(max_message_bytes, max_message_bytes) + _RECONNECT_OPTIONS
        self._channel = (grpc.insecure_channel(address, options=options) if tls is None
                         else grpc.secure_channel(address, tls.channel_credentials(), options=options))
        self._unary: dict[str, grpc.UnaryUnaryMultiCallable] = {}
        self._upload = self._channel.stream_unary(wire.path(wire.UPLOAD))
        self._download = self._channel.unary_stream(wire.path(wire.DOWNLOAD))
        self._background: futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._shared_memory_bytes = shared_memory_bytes
        self._probe = _PENDING if shared_memory_bytes > 0 and shared_memory.available() else _DONE
        self._shared: shared_memory.Pool | None = None

    def call(self, name: str, args: tuple, kwargs: dict, options: _CallOptions) -> Any:
        deadline = _Deadline(options.timeout)
        parts = _encode_call(args, kwargs)
        if self._probe is _PENDING and _over_threshold(parts):
            self._probe_shared_memory(options, deadline)
        request = self._request(name, parts, deadline, options)
        return self._send(name, request, deadline, options)

    def call_future(self, name: str, args: tuple, kwargs: dict, options: _CallOptions) -> futures.Future:
        deadline = _Deadline(options.timeout)
        parts = _encode_call(args, kwargs)
        if self._token is not None and not self._session:  # the hello blocks
            return self._executor().submit(self.call, name, args, kwargs, options)
        if self._probe is _PENDING and _over_threshold(parts):
            self._executor().submit(self._probe_shared_memory, options, _Deadline(options.timeout))
        request = self._frame_in_place(parts, deadline)
        if request is None:  # it needs an upload first, which blocks
            return self._executor().submit(self.call, name, args, kwargs, options)
        outcome: futures.Future = futures.Future()
        session = self._session
        call = self._stub(name).future(
            request,
            timeout=deadline.remaining(),
            metadata=self._metadata,
            wait_for_ready=options.wait_for_ready,
        )
        call.add_done_callback(lambda done: self._settle(outcome, done, name, request, session, deadline, options))
        return outcome

    @property
    def shares_memory(self) -> bool:
        return self._shared is not None

    def list_methods(self, options: _CallOptions) -> list[str]:
        response = self.call_raw(wire.LIST_METHODS, options)
        return self._result(wire.LIST_METHODS, response, _Deadline(options.timeout))

    def call_raw(self, name: str, options: _CallOptions) -> bytes:
        deadline = _Deadline(options.timeout)
        try:
            return self._with_session(lambda metadata: self._stub(name)(
                b"", timeout=deadline.remaining(), metadata=metadata, wait_for_ready=options.wait_for_ready),
                options, deadline)
        except grpc.RpcError as error:
            raise self._translate(error, name, options.timeout) from None

    def close(self) -> None:
        self._channel.close()
        if self._background is not None:
            self._background.shutdown(wait=False)
        if self._shared is not None:
            self._shared.close()

    # The token, proven held before it is used (see the module's docstring) ------------------

    def _send(self, name: str, request: bytes, deadline: "_Deadline", options: _CallOptions) -> Any:
        """The result of the unary call `request` to `name`, under this client's session."""
        try:
            response = self._with_session(lambda metadata: self._stub(name)(
                request, timeout=deadline.remaining(), metadata=metadata, wait_for_ready=options.wait_for_ready),
                options, deadline)
        except grpc.RpcError as error:
            raise self._translate(error, name, options.timeout) from None
        return self._result(name, response, deadline)

    def _with_session(self, attempt: Callable[[tuple | None], Any], options: _CallOptions,
                      deadline: "_Deadline") -> Any:
        """`attempt(metadata)`, after a hello when no server proved the token yet; once more
        after a new hello when the server refused the session (it restarted: a new instance)."""
        if self._token is not None and not self._session:
            self._renew((), options, deadline)
        session = self._session
        try:
            return attempt(self._metadata)
        except grpc.RpcError as error:
            if self._token is None or error.code() != grpc.StatusCode.UNAUTHENTICATED:
                raise
        self._renew(session, options, deadline)
        return attempt(self._metadata)

    def _renew(self, stale: tuple, options: _CallOptions, deadline: "_Deadline") -> None:
        """A session with the server now at the address, unless another call made one since
        `stale`. The hello runs outside the lock: a call with a short deadline (a liveness probe)
        must not wait behind one that waits for ever for the server to come up."""
        if self._session != stale:
            return
        session = self._hello(options, deadline)
        with self._lock:
            if self._session == stale:
                self._session = session
                self._metadata = (self._session + self._ticket) or None

    def _hello(self, options: _CallOptions, deadline: "_Deadline") -> tuple:
        """The session metadata for the server that proves, for a fresh nonce, that it holds the token."""
        nonce = secrets.token_hex(16)
        try:
            response = self._stub(wire.HELLO)(b"", timeout=deadline.remaining(), metadata=((wire.HELLO_KEY, nonce),),
                                              wait_for_ready=options.wait_for_ready)
            answer = codec.decode(memoryview(response)[1:]) if response[:1] == wire.INLINE else None
        except grpc.RpcError as error:
            raise self._translate(error, wire.HELLO, deadline.timeout) from None
        except ValueError:  # CodecError: not a courier server's answer
            answer = None
        if not (type(answer) is list and len(answer) == 2 and all(type(part) is str for part in answer)
                and hmac.compare_digest(answer[1].encode(), wire.server_proof(self._token, nonce, answer[0]).encode())):
            raise AuthenticationError(
                f"{self._address} did not prove it holds this client's token, which was not sent: missing or "
                f"wrong courier token on one side, or another process serves this address (a port taken while "
                f"its node restarted?); pass the program's token to Client(token=...)")
        return ((wire.TOKEN_KEY, wire.session_key(self._token, answer[0])),)

    def _stub(self, name: str) -> grpc.UnaryUnaryMultiCallable:
        stub = self._unary.get(name)
        if stub is None:
            stub = self._unary[name] = self._channel.unary_unary(wire.path(name))
        return stub

    def _executor(self) -> futures.ThreadPoolExecutor:
        with self._lock:
            if self._background is None:
                self._background = futures.ThreadPoolExecutor(4, thread_name_prefix="courier-client")
            return self._background

    def _request(self, name: str, parts: list, deadline: "_Deadline", options: _CallOptions) -> bytes:
        frame = self._frame_in_place(parts, deadline)
        if frame is not None:
            return frame
        size = codec.frame_size(parts)
        return wire.staged_frame(self._upload_parts(name, parts, size, deadline, options), size)

    def _frame_in_place(self, parts: list, deadline: "_Deadline") -> bytes | None:
        """The request as the unary call carries it, or None when it must be uploaded first."""
        if len(parts) == 1 and len(parts[0]) <= self._inline_limit:
            return wire.INLINE + parts[0]
        size = codec.frame_size(parts)
        if size > wire.SHARED_MEMORY_THRESHOLD and self._shared is not None:
            remaining = deadline.remaining()
            frame = self._shared.send(parts, size, _SHARED_EXPIRY_WITHOUT_DEADLINE if remaining is None else remaining)
            if frame is not None:
                return frame
        if size <= self._inline_limit:
            return b"".join([wire.INLINE, *parts])
        return None

    def _probe_shared_memory(self, options: _CallOptions, deadline: "_Deadline") -> None:
        """Ask the server, once, whether it reads what this process writes in shared memory;
        if it does, large messages go that way from now on. A server that cannot be reached
        is asked again at the next call."""
        with self._lock:
            if self._probe is not _PENDING:
                return
            self._probe = _PROBING
        nonce = secrets.token_bytes(shared_memory.PROBE_BYTES)
        try:
            segment = shared_memory.probe_segment(nonce)
        except OSError:  # /dev/shm is full (Docker gives 64 MiB) or missing: the socket it is
            with self._lock:
                self._probe = _DONE
            return
        outcome = _PENDING
        try:
            request = wire.INLINE + codec.encode([segment, shared_memory.pid_namespace()])
            response = self._with_session(lambda metadata: self._stub(wire.SHARED_MEMORY_PROBE)(
                request, timeout=deadline.remaining(), metadata=metadata, wait_for_ready=options.wait_for_ready),
                options, deadline)
            answer = self._result(wire.SHARED_MEMORY_PROBE, response, deadline)
            if type(answer) is list and len(answer) == 2 and answer[0] == nonce and type(answer[1]) is str:
                self._shared = shared_memory.Pool(self._shared_memory_bytes)
                with self._lock:
                    self._ticket = ((wire.SHARED_MEMORY_KEY, answer[1]),)
                    self._metadata = self._session + self._ticket
            outcome = _DONE
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:  # a courier without shared memory
                outcome = _DONE
        except CourierError:
            outcome = _DONE
        finally:
            shared_memory.unlink(segment)
            with self._lock:
                self._probe = outcome

    def _upload_parts(self, name: str, parts: list, size: int, deadline: "_Deadline", options: _CallOptions) -> bytes:
        """The id of the upload; one refused for lack of room is tried again within the deadline."""
        pauses = itertools.chain(_BUSY_PAUSES, itertools.repeat(_BUSY_PAUSES[-1]))
        while True:
            try:
                return self._with_session(lambda metadata: self._upload(
                    wire.chunks(parts), timeout=deadline.remaining(),
                    metadata=((wire.SIZE_KEY, str(size)),) + (metadata or ()), wait_for_ready=options.wait_for_ready,
                ), options, deadline)
            except grpc.RpcError as error:
                pause = next(pauses)
                remaining = deadline.remaining()
                if not _is_busy(error) or (remaining is not None and remaining < pause):
                    raise self._translate(error, name, deadline.timeout) from None
            time.sleep(pause)

    def _settle(self, outcome: futures.Future, call: grpc.Future, name: str, request: bytes, session: tuple,
                deadline: "_Deadline", options: _CallOptions) -> None:
        try:
            response = call.result()
        except grpc.RpcError as error:
            if self._token is not None and error.code() == grpc.StatusCode.UNAUTHENTICATED:  # a restarted server
                self._executor().submit(_settle_with, outcome, self._send_again, name, request, session, deadline,
                                        options)
            else:
                outcome.set_exception(self._translate(error, name, options.timeout))
            return
        except futures.CancelledError:
            outcome.cancel()
            return
        if response[:1] == wire.STAGED:  # fetching blocks: not on gRPC's callback thread
            self._executor().submit(_settle_with, outcome, self._result, name, response, deadline)
        else:
            _settle_with(outcome, self._result, name, response, deadline)

    def _send_again(self, name: str, request: bytes, stale: tuple, deadline: "_Deadline",
                    options: _CallOptions) -> Any:
        """A future's call that the server refused for its session, sent again after a hello."""
        self._renew(stale, options, deadline)
        return self._send(name, request, deadline, options)

    def _result(self, name: str, response: bytes, deadline: "_Deadline") -> Any:
        kind = response[:1]
        frame = memoryview(response)
        if self._probe is _PENDING and (kind == wire.STAGED or len(response) > wire.SHARED_MEMORY_THRESHOLD):
            self._executor().submit(self._probe_shared_memory, _CallOptions(DEFAULT_TIMEOUT, True),
                                    _Deadline(DEFAULT_TIMEOUT))
        try:
            if kind == wire.INLINE:
                return codec.decode(frame[1:])
            if kind == wire.ERROR:
                error = rebuild_exception(codec.decode(frame[1:]), name, self._address)
            elif kind == wire.STAGED:
                return codec.decode(self._fetch(name, frame, deadline))
            elif kind == wire.SHARED:
                if self._shared is None:
                    raise ValueError("an answer in shared memory, which this client never agreed on with the "
                                     "server (is another process serving this address?)")
                self._check_size(name, wire.parse_shared(frame)[2])
                return codec.decode(shared_memory.READER.claim(frame))
            else:
                raise ValueError(f"unknown frame kind {bytes(kind)!r}")
        except ValueError as exc:  # CodecError is a ValueError
            raise MalformedMessageError(f"{name} on {self._address} answered with a malformed message: {exc}") from None
        raise error

    def _fetch(self, name: str, frame: memoryview, deadline: "_Deadline") -> bytearray:
        blob_id, size = wire.parse_staged(frame)
        self._check_size(name, size)
        try:
            return wire.assemble(
                self._download(blob_id, timeout=deadline.remaining(), metadata=self._metadata), size
            )
        except grpc.RpcError as error:
            raise self._translate(error, name, deadline.timeout) from None

    def _check_size(self, name: str, size: int) -> None:
        if size > self._max_message_bytes:
            raise MessageTooLargeError(
                f"{name} on {self._address} answered with {size} bytes, over this client's "
                f"max_message_bytes={self._max_message_bytes}; raise Client(max_message_bytes=...)"
            )

    def _translate(self, error: grpc.RpcError, name: str, timeout: float | None) -> Exception:
        code, details = error.code(), error.details()
        where = f"{name} on {self._address}"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return DeadlineExceededError(
                f"{where} got no answer within {timeout} s (the server may be busy, down or not started; "
                f"use client.with_timeout(...) for longer calls)"
            )
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return UnknownMethodError(f"{where}: {details}{_never_served(name)}{self._listing_hint(name, details)}")
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return MalformedMessageError(f"{where}: {details}")
        if _is_busy(error):
            return ServerBusyError(f"{where}: the server is busy: {details}")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return MessageTooLargeError(f"{where}: {details}")
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return AuthenticationError(f"{where}: {details}; pass the program's token to Client(token=...)")
        if code == grpc.StatusCode.UNAVAILABLE:
            return UnavailableError(f"{where}: server unavailable ({details})")
        if code == grpc.StatusCode.CANCELLED:
            return futures.CancelledError(f"{where}: cancelled ({details})")
        return RemoteError(f"{where}: {code.name}: {details}")

    def _listing_hint(self, name: str, details: str) -> str:
        if "serves:" in (details or "") or name in (wire.LIST_METHODS, wire.HELLO):
            return ""
        try:
            return f"; this server serves: {', '.join(self.list_methods(_CallOptions(5.0, True)))}"
        except UnknownMethodError:  # not even the listing: some other gRPC service is there
            return " (this is not a courier server)"
        except CourierError:
            return ""


_PENDING, _PROBING, _DONE = "pending", "probing", "done"  # a connection's shared-memory probe


def _private(name: str) -> AttributeError:
    if name.startswith("__"):  # Python's own protocols (copy, pickle, ...) probing the client
        return AttributeError(name)
    return AttributeError(f"{name!r} is private: courier serves only public methods of the server's object "
                          f"(names not starting with '_'); make it public there to call it")


def _never_served(name: str) -> str:
    if name == "run":
        return " (run() is the node's own loop, never served)"
    if name == "__call__":
        return " (the server's object is not callable)"
    if name.startswith("_") and name not in (wire.UPLOAD, wire.DOWNLOAD, wire.LIST_METHODS):
        return " (names starting with '_' are never served)"
    return ""


def _is_busy(error: grpc.RpcError) -> bool:
    """A refusal for lack of room: courier's own (marked busy) or gRPC's limit on calls in flight."""
    if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return False
    return error.details() == wire.GRPC_CONCURRENCY_LIMIT or any(
        key == wire.BUSY_KEY for key, _ in error.trailing_metadata() or ()
    )


def _over_threshold(parts: list) -> bool:
    """Whether a frame is large enough for shared memory (a plain one is a single small part)."""
    return (len(parts) > 1 or len(parts[0]) > wire.SHARED_MEMORY_THRESHOLD) and (
        codec.frame_size(parts) > wire.SHARED_MEMORY_THRESHOLD)


def _encode_call(args: tuple, kwargs: dict) -> list:
    return codec.encode_parts([list(args), kwargs], root=("args", "kwargs"))


def _settle_with(outcome: futures.Future, result: Callable, *args: Any) -> None:
    try:
        outcome.set_result(result(*args))
    except Exception as exc:
        outcome.set_exception(exc)


class _Deadline:
    """One deadline shared by the steps of a call (upload, call, download)."""

    __slots__ = ("timeout", "_end")

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self._end = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> float | None:
        return None if self._end is None else max(0.0, self._end - time.monotonic())
