"""Courier server: serves an object's public methods over gRPC.

The server can bind before its object exists (`Server(None)`, then `attach(obj)`): launchers
bind every node's port first, publish the address table, and only then build the objects,
whose constructors may already call other nodes. A call that arrives before `attach` waits for
it within the call's deadline.

No token is revealed to a server that has not proven it holds it: a client first says hello
with a nonce, this server answers with a proof keyed by the token and bound to its instance (a
random name, new at each start), and the client's calls then carry a session key derived from the
token and that instance instead of the token (`wire.server_proof`, `wire.session_key`). A
process that takes the address while the node restarts cannot prove the token, and learns at
most the key of an instance that is gone; a restarted server refuses the old key, and its
callers say hello again.

What a peer can make it spend is bounded. A call without the token is refused before gRPC reads
its request, and holds no thread (the standard health `Check` answers without the token: it
tells only whether the server serves, and probes do not carry our token; it answers without
reading its request, so it holds no thread either; `Watch` needs the token, since each watch
holds a thread). A unary request is capped near `inline_limit` (larger ones travel by
upload), calls in flight at `max_concurrent_calls`, uploads at `max_uploads` at once and
`max_staged_bytes` held; a transfer whose peer stalls for `chunk_timeout` seconds is cut off,
and a staged payload nobody claims is dropped after `staging_ttl`. Idle connections are pinged
and closed, and a connection that never completes its handshake is dropped.

A client on the same host (it proves so once, see `jaxdist.courier.shared_memory`) sends and
receives messages over `wire.SHARED_MEMORY_THRESHOLD` through shared memory; the server's own
segments, for answers, hold at most `shared_memory_bytes`. The proof earns the client this
server's shared-memory ticket, which its calls carry: only they are answered in shared memory
(a remote token holder that merely asked would learn segment names, and its unread answers would
pin segments), and an unread answer holds its segment for `staging_ttl` at most, whatever the
caller's deadline.
"""

from __future__ import annotations

import functools
import hmac
import inspect
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health, health_pb2

from jaxdist.courier import codec, local, shared_memory, staging, wire
from jaxdist.courier import tls as tls_module
from jaxdist.courier.tls import TLS
from jaxdist.courier.errors import UnavailableError, describe_exception

log = logging.getLogger(__name__)

_NOT_ATTACHED_WAIT = 60.0
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
KEEPALIVE_TIME_MS = 60_000  # ping a connection quiet this long, to find peers that vanished
KEEPALIVE_TIMEOUT_MS = 20_000
CONNECTION_IDLE_MS = 10 * 60_000  # close a connection without calls this long (clients reconnect)
HANDSHAKE_TIMEOUT_MS = 10_000


REBIND_SECONDS = 5.0
UNIX = "unix:"  # an address of a Unix socket: unix:/absolute/path


class Server:
    """Serves `obj`'s public methods (names not starting with '_', except `run`), and the
    object itself when it is callable (a client's ``client(x)`` calls ``obj(x)``)."""

    def __init__(
        self,
        obj: Any = None,
        address: str = "127.0.0.1:0",
        *,
        thread_pool_size: int = 16,
        token: str | None = None,
        max_message_bytes: int = wire.DEFAULT_MAX_MESSAGE_BYTES,
        inline_limit: int = wire.DEFAULT_INLINE_LIMIT,
        max_concurrent_calls: int = 1024,
        max_uploads: int | None = None,
        max_staged_bytes: int = 2 << 30,
        staging_ttl: float = 60.0,
        chunk_timeout: float = 10.0,
        tls: TLS | None = None,
        shared_memory_bytes: int = wire.DEFAULT_SHARED_MEMORY_BYTES,
    ) -> None:
        """`max_uploads` defaults to a quarter of the threads (at least one), so uploads in
        progress always leave threads for calls. `tls`: mutual TLS (default: the environment's,
        see `jaxdist.courier.tls`; without it, plaintext). `shared_memory_bytes`: 0 keeps every
        message on the socket, even from a client on this host."""
        if thread_pool_size < 1:
            raise ValueError(f"thread_pool_size must be >= 1, got {thread_pool_size}")
        if token == "":
            raise ValueError("an empty token would let every caller in: pass a secret, or token=None for none")
        self._max_message_bytes = max_message_bytes
        self._max_staged_bytes = max_staged_bytes
        self._inline_limit = inline_limit
        self._max_uploads = max(1, thread_pool_size // 4) if max_uploads is None else max_uploads
        self._upload_slots = threading.BoundedSemaphore(self._max_uploads)
        self._staging = staging.StagingArea(staging_ttl, max_staged_bytes)
        self._staging_ttl = staging_ttl
        shares_memory = shared_memory_bytes > 0 and shared_memory.available()
        self._shared = shared_memory.Pool(shared_memory_bytes) if shares_memory else None
        self._shared_ticket = secrets.token_hex(16)
        self._janitor = staging.Janitor(self._staging, chunk_timeout, period=min(chunk_timeout, staging_ttl) / 4,
                                        chore=_forget_dead_segments if shares_memory else None)
        self.token = token
        self._methods: dict[str, Callable[..., Any]] = {}
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._attached = threading.Event()
        self._executor = futures.ThreadPoolExecutor(thread_pool_size, thread_name_prefix="courier")
        self._grpc = grpc.server(
            self._executor,
            handlers=[_Dispatcher(self)],
            options=_server_options(max_message_bytes, inline_limit),
            maximum_concurrent_rpcs=max_concurrent_calls,
        )
        self._health = health.HealthServicer()
        self._handlers.update(_health_handlers(self._health))
        self._token_bytes = None if token is None else token.encode()
        self._instance = secrets.token_hex(16)
        self._session_bytes = None if token is None else wire.session_key(self._token_bytes, self._instance).encode()
        self._handlers[wire.path(wire.HELLO)] = grpc.stream_unary_rpc_method_handler(self._hello)
        tls = tls or tls_module.from_environment()
        self._credentials = None if tls is None else tls.server_credentials()
        self._address = self._bind(address)
        self._started = False
        if obj is not None:
            self.attach(obj)

    @property
    def address(self) -> str:
        """host:port actually bound (the port is real even when 0 was asked for)."""
        return self._address

    @property
    def methods(self) -> list[str]:
        return sorted(self._methods)

    def attach(self, obj: Any) -> None:
        """Start serving `obj`; calls that were waiting for it proceed."""
        if self._attached.is_set():
            raise RuntimeError(f"server {self._address} already serves an object")
        self._methods = public_methods(obj)
        self._attached.set()
        for service in ("", wire.SERVICE):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)

    def start(self) -> "Server":
        """Begin serving (the port is bound already); returns the server, once started."""
        if not self._started:
            if self._shared is not None:
                shared_memory.sweep()
            self._grpc.start()
            self._janitor.start()
            self._started = True
            local.register(self)
        return self

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop accepting calls; calls in flight get `grace` seconds to finish."""
        local.unregister(self)
        self._health.enter_graceful_shutdown()
        self._grpc.stop(grace).wait()
        self._janitor.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._staging.clear()
        if self._shared is not None:
            self._shared.close()

    # Calls from this process (jaxdist.courier.local) ------------------------------------------

    def local_method(self, name: str, timeout: float | None) -> Callable[..., Any] | None:
        """The served method `name` once the object is attached (within `timeout`), else None."""
        if not self._attached.wait(_NOT_ATTACHED_WAIT if timeout is None else timeout):
            raise UnavailableError(f"{name}: the node at {self._address} is still being constructed")
        return self._methods.get(name)

    def unknown_method_message(self, name: str) -> str:
        """What a call of a method this server does not serve is told (the closest names)."""
        return _unknown_method_message(name, self.methods)

    def submit(self, call: Callable[[], None]) -> None:
        """Run `call` on the server's thread pool, as a served call runs."""
        self._executor.submit(call)

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _bind(self, address: str) -> str:
        """Bind `address`. A given port (a restarted node's old one) is tried for up to
        `REBIND_SECONDS`: while the node was down, its port may serve for a moment as the local
        port of some outgoing connection (clients reconnecting draw from the same range)."""
        deadline = time.monotonic() + (0.0 if address.endswith(":0") else REBIND_SECONDS)
        while True:
            try:
                port = (self._grpc.add_insecure_port(address) if self._credentials is None
                        else self._grpc.add_secure_port(address, self._credentials))
                error = None if port else "the port is taken or the host is not local"
            except RuntimeError as exc:
                port, error = 0, f"{exc}; is the port taken?"
            if port:
                return address if address.startswith(UNIX) else f"{address.rsplit(':', 1)[0]}:{port}"
            if time.monotonic() >= deadline:
                raise OSError(f"courier cannot bind {address}: {error}")
            time.sleep(0.05)

    # Handlers -------------------------------------------------------------------------------

    def handler(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        """The handler of one incoming call; the common case is the token check and one dict
        lookup. A call without the token gets a refusal that reads nothing of its request, so
        whatever the peer sends (a 2 GiB message, a stream that never comes) costs one pool
        thread for a moment. (In this dispatcher rather than a gRPC interceptor, which costs a
        tenth of a tiny call's time.)"""
        if self._token_bytes is not None and details.method not in _WITHOUT_TOKEN and not self._carries_token(details):
            return _REFUSE_TOKEN
        handler = self._handlers.get(details.method)
        if handler is not None:
            return handler
        name = wire.method_name(details.method)
        if name is None or (self._attached.is_set() and name not in self._methods and name not in _INTERNAL):
            return None
        if name == wire.UPLOAD:
            handler = grpc.stream_unary_rpc_method_handler(self._upload)
        elif name == wire.DOWNLOAD:
            handler = grpc.unary_stream_rpc_method_handler(self._download)
        elif name == wire.LIST_METHODS:
            handler = grpc.unary_unary_rpc_method_handler(self._list_methods)
        elif name == wire.SHARED_MEMORY_PROBE:
            handler = grpc.unary_unary_rpc_method_handler(self._probe_shared_memory)
        else:
            handler = grpc.unary_unary_rpc_method_handler(functools.partial(self._call, name))
        self._handlers[details.method] = handler
        return handler

    def _carries_token(self, details: grpc.HandlerCallDetails) -> bool:
        """The session key of this instance (what courier clients send), or the token itself."""
        for key, value in details.invocation_metadata or ():
            if key == wire.TOKEN_KEY:
                given = value.encode()
                return hmac.compare_digest(given, self._session_bytes) or hmac.compare_digest(given, self._token_bytes)
        return False

    def _hello(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        """This instance's name and the proof that it holds the token, for the nonce the caller
        sent in its metadata (None without a token). Answered without the token and without
        reading the request: a peer that never sends one holds no thread."""
        nonce = next((value for key, value in context.invocation_metadata() if key == wire.HELLO_KEY), "")
        answer = None
        if self._token_bytes is not None and 32 <= len(nonce) <= 64 and all(c in _HEX for c in nonce):
            answer = [self._instance, wire.server_proof(self._token_bytes, nonce, self._instance)]
        return wire.INLINE + codec.encode(answer)

    def _call(self, name: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        method = self._methods.get(name) or self._resolve(name, context)
        args, kwargs = self._decode_request(name, request, context)
        try:
            result = method(*args, **kwargs)
        except Exception as exc:  # the caller gets it; the server goes on serving
            return _error_frame(exc)
        try:
            parts = codec.encode_parts(result, root="result")
        except TypeError as exc:
            return _error_frame(TypeError(f"{name} returned a value courier cannot send: {exc}"))
        if len(parts) == 1 and len(parts[0]) <= self._inline_limit:
            return wire.INLINE + parts[0]
        size = codec.frame_size(parts)
        if size > wire.SHARED_MEMORY_THRESHOLD and self._shared is not None:
            frame = self._share(parts, size, context)
            if frame is not None:
                return frame
        if size <= self._inline_limit:
            return b"".join([wire.INLINE, *parts])
        return wire.staged_frame(self._staging.put(parts), size)

    def _share(self, parts: list, size: int, context: grpc.ServicerContext) -> bytes | None:
        """The answer through shared memory, when the caller proved it shares this host's."""
        ticket = next((value for key, value in context.invocation_metadata() if key == wire.SHARED_MEMORY_KEY), None)
        if ticket is None or not hmac.compare_digest(ticket.encode(), self._shared_ticket.encode()):
            return None
        remaining = context.time_remaining()
        expires_in = self._staging_ttl if remaining is None else min(remaining, self._staging_ttl)
        return self._shared.send(parts, size, expires_in)

    def _resolve(self, name: str, context: grpc.ServicerContext) -> Callable[..., Any]:
        """The method, once the object is attached (waiting for it within the deadline)."""
        if not self._attached.is_set():
            remaining = context.time_remaining()  # a call without a deadline has a vast one here
            wait = _NOT_ATTACHED_WAIT if remaining is None else min(max(0.0, remaining), threading.TIMEOUT_MAX)
            if not self._attached.wait(wait):
                context.abort(grpc.StatusCode.UNAVAILABLE, "the node is still being constructed")
        method = self._methods.get(name)
        if method is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, _unknown_method_message(name, self.methods))
        return method

    def _decode_request(
        self, name: str, request: bytes, context: grpc.ServicerContext
    ) -> tuple[list[Any], dict[str, Any]]:
        try:
            call = codec.decode(self._request_frame(request, context))
            if not (
                type(call) is list
                and len(call) == 2
                and type(call[0]) is list
                and type(call[1]) is dict
                and (not call[1] or all(type(key) is str for key in call[1]))
            ):
                raise ValueError("a request must be [args, kwargs] with string keyword names")
        except ValueError as exc:  # CodecError is a ValueError
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request to {name}: {exc}")
        return call[0], call[1]

    def _request_frame(self, request: bytes, context: grpc.ServicerContext) -> memoryview:
        """The codec frame a request carries inline, or the upload it refers to."""
        kind = request[:1]
        frame = memoryview(request)
        if kind == wire.INLINE:
            return frame[1:]
        if kind == wire.STAGED:
            blob_id, _ = wire.parse_staged(frame)
            staged = self._staging.take(blob_id)
            if not isinstance(staged, bytearray):
                raise ValueError("it names an upload this server does not hold (expired?)")
            return memoryview(staged)
        if kind == wire.SHARED and self._shared is not None:
            _, _, size = wire.parse_shared(frame)
            self._check_size(size, context)
            return memoryview(shared_memory.READER.claim(frame))
        raise ValueError(f"unknown frame kind {bytes(kind)!r}")

    def _list_methods(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        return wire.INLINE + codec.encode(self.methods)

    def _probe_shared_memory(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        """What the caller's probe holds and this server's shared-memory ticket, or None: the
        caller then knows whether it may use shared memory with this server."""
        answer = None
        try:
            name, namespace = codec.decode(memoryview(request)[1:])
            if self._shared is not None and namespace == shared_memory.pid_namespace():
                answer = [shared_memory.read_probe(name), self._shared_ticket]
        except (ValueError, TypeError, OSError):  # not on this host, or not a probe
            pass
        return wire.INLINE + codec.encode(answer)

    def _upload(self, chunks: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        size = self._announced_size(context)
        self._check_size(size, context)
        if not self._upload_slots.acquire(blocking=False):
            _refuse_busy(context, f"this server takes at most {self._max_uploads} uploads at once")
        try:
            with self._staging.reserving(size) as stage:
                try:
                    payload = wire.assemble(self._janitor.watch(context, chunks), size)
                except ValueError as exc:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed upload: {exc}")
                return stage(payload)
        except staging.Busy as exc:
            _refuse_busy(context, str(exc))
        finally:
            self._upload_slots.release()

    def _announced_size(self, context: grpc.ServicerContext) -> int:
        metadata = dict(context.invocation_metadata())
        try:
            size = int(metadata.get(wire.SIZE_KEY, ""))
        except ValueError:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"an upload must announce its size in '{wire.SIZE_KEY}'")
        if size > self._max_staged_bytes:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"a message of {size} bytes exceeds this server's max_staged_bytes={self._max_staged_bytes}")
        return size

    def _check_size(self, size: int, context: grpc.ServicerContext) -> None:
        if not 0 <= size <= self._max_message_bytes:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"a message of {size} bytes exceeds this server's max_message_bytes={self._max_message_bytes}")

    def _download(self, blob_id: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        parts = self._staging.take(bytes(blob_id))
        if parts is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "no such staged response (expired or already fetched)")
        yield from self._janitor.watch(context, wire.chunks(parts))


def _health_handlers(servicer: health.HealthServicer) -> dict[str, grpc.RpcMethodHandler]:
    """The standard health service, served by courier's dispatcher so that its token check
    covers `Watch` (gRPC's generated registration would be looked up before it).

    `Check` answers without the token, so it must not wait for its request either: a unary
    handler holds a pool thread until the request has arrived, and peers that never finish
    sending one would hold them all. It answers for the whole server without reading the
    request (every service a courier server names shares one status)."""
    request, response = health_pb2.HealthCheckRequest.FromString, health_pb2.HealthCheckResponse.SerializeToString

    def check(requests: Iterator[health_pb2.HealthCheckRequest], context: grpc.ServicerContext) -> Any:
        return servicer.Check(health_pb2.HealthCheckRequest(), context)

    return {
        _HEALTH_CHECK: grpc.stream_unary_rpc_method_handler(check, request, response),
        _HEALTH_WATCH: grpc.unary_stream_rpc_method_handler(servicer.Watch, request, response),
    }


class _Dispatcher(grpc.GenericRpcHandler):
    def __init__(self, server: Server) -> None:
        self._server = server

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._server.handler(details)


LIFECYCLE = ("run", "close")


def public_methods(obj: Any) -> dict[str, Callable[..., Any]]:
    """The methods courier serves: public callables, except the lifecycle that belongs to the
    node alone (`run`, which it runs, and `close`, which it calls at shutdown): no caller with
    the token may close a learner or an actor under its program."""
    methods = {}
    for name in dir(obj):
        if name.startswith("_") or name in LIFECYCLE:
            continue
        if isinstance(inspect.getattr_static(obj, name, None), property):
            continue  # reading a property runs user code; it is state, not a method
        attribute = getattr(obj, name, None)
        if callable(attribute):
            methods[name] = attribute
    if any("__call__" in vars(klass) for klass in type(obj).__mro__[:-1]):
        methods["__call__"] = obj.__call__
    return methods


def _error_frame(exc: BaseException) -> bytes:
    return wire.ERROR + codec.encode(describe_exception(exc))


def _server_options(max_message_bytes: int, inline_limit: int) -> list[tuple[str, int]]:
    """A unary request carries at most an inline frame or one upload chunk (and its kind byte)."""
    request_cap = min(max_message_bytes, max(inline_limit, wire.CHUNK_BYTES)) + 1
    return wire.grpc_options(max_message_bytes, request_cap) + [
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.max_connection_idle_ms", CONNECTION_IDLE_MS),
        ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
    ]


def _refuse_busy(context: grpc.ServicerContext, message: str) -> NoReturn:
    """A refusal the client may retry: RESOURCE_EXHAUSTED marked busy (gRPC's own size refusals
    use the same code, unmarked)."""
    context.set_trailing_metadata(((wire.BUSY_KEY, "1"),))
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


def _refuse_token(requests: Iterator[bytes], context: grpc.ServicerContext) -> NoReturn:
    context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong courier token")


_REFUSE_TOKEN = grpc.stream_unary_rpc_method_handler(_refuse_token)
_WITHOUT_TOKEN = frozenset({_HEALTH_CHECK, wire.path(wire.HELLO)})
_HEX = frozenset("0123456789abcdef")
_INTERNAL = frozenset({wire.UPLOAD, wire.DOWNLOAD, wire.LIST_METHODS, wire.SHARED_MEMORY_PROBE})


def _forget_dead_segments() -> None:
    shared_memory.sweep()
    shared_memory.READER.forget_unlinked()


def _unknown_method_message(name: str, methods: list[str]) -> str:
    return f"no method {name!r}; this server serves: {', '.join(methods) or '(nothing)'}"
