"""Courier: msgpack over gRPC between nodes. Usable alone: `Server(obj).start()`, `Client(address)`."""

from jaxdist.courier.batching import batched_handler
from jaxdist.courier.client import Client
from jaxdist.courier.codec import CodecError, register
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
)
from jaxdist.courier.server import Server

__all__ = [
    "AuthenticationError",
    "Client",
    "CodecError",
    "CourierError",
    "DeadlineExceededError",
    "MalformedMessageError",
    "MessageTooLargeError",
    "RemoteError",
    "Server",
    "ServerBusyError",
    "UnavailableError",
    "UnknownMethodError",
    "batched_handler",
    "register",
]
