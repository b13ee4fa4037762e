"""What a courier server spends on a peer: bounded decoding, and the server goes on serving.

Every test runs a real courier.Server on 127.0.0.1 and talks to it through raw gRPC where a
well-behaved client would not send what the test needs.
"""

from __future__ import annotations

import time

import grpc
import pytest

from jaxdist import courier
from jaxdist.courier import wire

TOKEN = "s3cret"
AUTH = ((wire.TOKEN_KEY, TOKEN),)


class Service:
    def add(self, a, b=1):
        return a + b


def staged_call(channel: grpc.Channel, method: str, frame: bytes, metadata: tuple = AUTH) -> bytes:
    """Upload `frame` as a client would for a large request, then call `method` with it."""
    upload = channel.stream_unary(wire.path(wire.UPLOAD))
    blob_id = upload(wire.chunks([frame]), metadata=((wire.SIZE_KEY, str(len(frame))), *metadata), timeout=30)
    return channel.unary_unary(wire.path(method))(wire.staged_frame(blob_id, len(frame)), metadata=metadata,
                                                 timeout=30)


@pytest.fixture
def server():
    server = courier.Server(Service(), token=TOKEN).start()
    yield server
    server.stop(grace=0)


@pytest.mark.parametrize("builder, count", [("empty_lists_frame", 16 << 20), ("colliding_keys_frame", 20_000)],
                         ids=["16-MiB-of-0x90", "20000-colliding-tuple-keys"])
def test_amplifying_requests_are_refused_fast_and_the_server_keeps_serving(server, request, builder, count):
    frame = request.getfixturevalue(builder)(count)
    client = courier.Client(server.address, token=TOKEN, timeout=10)
    with grpc.insecure_channel(server.address) as channel:
        began = time.monotonic()
        with pytest.raises(grpc.RpcError) as raised:
            if len(frame) < wire.DEFAULT_INLINE_LIMIT:
                channel.unary_unary(wire.path("add"))(wire.INLINE + frame, metadata=AUTH, timeout=30)
            else:
                staged_call(channel, "add", frame)
        seconds = time.monotonic() - began
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed request to add" in raised.value.details()
    assert seconds < 2.0, f"refusing took {seconds:.1f} s"
    assert client.add(1) == 2
