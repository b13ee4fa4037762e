"""Whoever answers at a node's address (a port another local user took while the node
restarted) learns nothing that reveals the token, cannot use what it learned once the node is
back, and cannot hand a client an answer in shared memory.

The squatter is a raw gRPC server that records what callers send and answers every call with
one frame."""

from __future__ import annotations

import os
import socket
import time
from concurrent import futures

import grpc
import numpy as np
import pytest

from jaxdist import courier
from jaxdist.courier import shared_memory, wire

TOKEN = "the-programs-token"


class Echo:
    def echo(self, value):
        return value


class Squatter(grpc.GenericRpcHandler):
    """Answers every call with `frame`, and keeps each call's metadata."""

    def __init__(self, frame: bytes) -> None:
        self._frame = frame
        self.seen: list[tuple] = []

    def service(self, details):
        self.seen.append(tuple(details.invocation_metadata))
        return grpc.unary_unary_rpc_method_handler(lambda request, context: self._frame)


def squat(frame: bytes) -> tuple[grpc.Server, Squatter, str]:
    squatter = Squatter(frame)
    server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[squatter])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, squatter, f"127.0.0.1:{port}"


def test_a_client_sends_nothing_that_reveals_its_token_to_a_server_that_cannot_prove_it_holds_it():
    server, squatter, address = squat(wire.INLINE + b"\x00\x00\x00\x00")
    try:
        with courier.Client(address, token=TOKEN, timeout=10) as client:
            with pytest.raises(courier.CourierError) as blocking:
                client.echo(np.ones(4))
            with pytest.raises(courier.CourierError) as future:
                client.futures.echo(1).result(timeout=30)
        sent = " ".join(f"{key}={value}" for call in squatter.seen for key, value in call)
        assert squatter.seen and wire.TOKEN_KEY not in sent and TOKEN not in sent, sent
        for raised in (blocking, future):
            assert raised.type is courier.AuthenticationError
            assert "did not prove it holds this client's token" in str(raised.value)
    finally:
        server.stop(0)


def test_a_session_key_is_refused_by_the_next_instance_at_the_address_and_clients_carry_on():
    first = courier.Server(Echo(), token=TOKEN).start()
    client = courier.Client(first.address, token=TOKEN, timeout=30)
    assert client.echo(1) == 1
    heard = wire.session_key(TOKEN.encode(), first._instance)  # what a squatter could have heard
    first.stop(grace=0)
    second = courier.Server(Echo(), first.address, token=TOKEN).start()
    try:
        with grpc.insecure_channel(second.address) as channel:
            with pytest.raises(grpc.RpcError) as raised:
                channel.unary_unary(wire.path("echo"))(wire.INLINE, metadata=((wire.TOKEN_KEY, heard),), timeout=10)
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert client.echo(2) == 2 and client.futures.echo(3).result(timeout=30) == 3
    finally:
        client.close()
        second.stop(grace=0)


@pytest.mark.skipif(os.geteuid() != 0 or not shared_memory.available(),
                    reason="planting another user's file in /dev/shm needs root (chown) and Linux")
def test_a_client_refuses_a_shared_answer_it_never_negotiated():
    """Without a token there is no hello: the answer itself must be refused."""
    name = f"{shared_memory.PREFIX}{shared_memory.pid_namespace()}-{os.getpid()}-{os.urandom(8).hex()}"
    path = os.path.join(shared_memory.DIRECTORY, name)
    header = np.zeros(8, np.int64)
    header[shared_memory.EXPIRY] = np.iinfo(np.int64).max
    header[shared_memory.SENT] = 1
    with open(path, "wb") as segment:
        segment.write(header.tobytes() + bytes(64))
    os.chown(path, 12345, 12345)
    os.chmod(path, 0o666)
    server, _, address = squat(wire.shared_frame(name, 1, 8))
    try:
        with courier.Client(address, timeout=10) as client:
            with pytest.raises(courier.MalformedMessageError, match="never agreed on"):
                client.echo(1)
    finally:
        server.stop(0)
        os.unlink(path)


def test_a_hello_waiting_for_its_server_holds_up_no_other_call_on_the_connection():
    """A liveness probe with a short deadline must fail in time while another call's hello waits
    for ever for the server to come up (a multihost peer's launcher watches its peers so)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"  # nothing listens there once it is closed
    client = courier.Client(address, token=TOKEN, timeout=None)
    try:
        waiting = client.futures.echo(1)
        began = time.monotonic()
        with pytest.raises(courier.UnavailableError):
            client.with_timeout(1.0).failing_fast().echo(2)
        assert time.monotonic() - began < 5
        assert not waiting.done()
    finally:
        client.close()
