"""What a courier server spends on a peer: a refusal for a peer without the token, bounded
uploads, staging and decoding for one with it; and the server goes on serving.

Every test runs a real courier.Server on 127.0.0.1 and talks to it through raw gRPC where a
well-behaved client would not send what the test needs.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from typing import Iterator

import grpc
import numpy as np
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from jaxdist import courier
from jaxdist.courier import server as server_module
from jaxdist.courier import wire

TOKEN = "s3cret"
PEER = os.path.join(os.path.dirname(__file__), "shm_peer.py")
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
    assert seconds < 10, f"refusing took {seconds:.1f} s"  # refused, not left to the call's 30 s deadline
    assert client.add(1) == 2


# --- A peer without the token costs no more than a refusal (item 2) -----------------------------

def blocked(release: threading.Event) -> Iterator[bytes]:
    """A request stream that sends nothing until released."""
    release.wait(30)
    yield b""


@pytest.fixture
def probe_server() -> Iterator[tuple[str, int]]:
    """memory_probe's echo server in its own process, with the token: (address, pid)."""
    probe = os.path.join(os.path.dirname(__file__), "memory_probe.py")
    process = subprocess.Popen([sys.executable, probe, "server", TOKEN], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        yield process.stdout.readline().strip(), process.pid
    finally:
        process.stdin.close()
        process.wait(timeout=30)


@pytest.mark.parametrize("metadata", [(), ((wire.TOKEN_KEY, "wrong"),)], ids=["no-token", "wrong-token"])
def test_a_tokenless_96_mib_request_is_refused_before_the_server_reads_it(probe_server, metadata):
    """What it may cost is the stream's flow-control window (gRPC's transport reads that much
    before the refusal reaches the peer), not the request: it used to cost two copies of it.
    BDP probing grows that window to several MB (peak growth 8.2 MB once in CI), so the bound
    is 24 MB: a quarter of the request, an eighth of what reading it cost."""
    address, pid = probe_server
    client = courier.Client(address, token=TOKEN, timeout=30)
    client.echo(1)
    client.reset_peak()
    rss_before = psutil.Process(pid).memory_info().rss
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 128 << 20)]) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            channel.unary_unary(wire.path("echo"))(bytes(96 << 20), metadata=metadata, timeout=30)
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    rss_growth_mb = (psutil.Process(pid).memory_info().rss - rss_before) / 2**20
    peak_growth_mb = client.peak_growth_mb()
    assert peak_growth_mb < 24 and rss_growth_mb < 24, (peak_growth_mb, rss_growth_mb)
    assert client.echo(2) == 2


def test_tokenless_streams_that_never_send_hold_no_server_thread(server):
    release = threading.Event()
    tokenless: list[grpc.Future] = []
    with grpc.insecure_channel(server.address) as channel:
        try:
            for i in range(24):  # more than the server's 16 threads
                path = wire.path(wire.UPLOAD if i % 2 else "add")
                tokenless.append(channel.stream_unary(path).future(blocked(release), timeout=30))
            # Were the server's threads held, this call would wait for one until its deadline.
            assert courier.Client(server.address, token=TOKEN, timeout=20).add(1) == 2
            for call in tokenless:
                assert call.exception(timeout=5).code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            release.set()


@pytest.mark.parametrize("path", ["/grpc.health.v1.Health/Check", wire.path(wire.HELLO)], ids=["health", "hello"])
def test_tokenless_calls_answered_without_the_token_hold_no_server_thread_when_their_request_never_ends(server, path):
    """A health check and a hello answer without the token, so they must not wait for their
    request either: 16 checks that never finished sending held all 16 threads, and every caller
    timed out."""
    release = threading.Event()
    with grpc.insecure_channel(server.address) as channel:
        call = channel.stream_unary(path)
        try:
            stalled = [call.future(blocked(release), timeout=30) for _ in range(24)]
            began = time.monotonic()
            assert courier.Client(server.address, token=TOKEN, timeout=5).add(1) == 2
            assert time.monotonic() - began < 2.0
            for answer in stalled:
                assert answer.result(timeout=5)  # answered, not refused
        finally:
            release.set()


def pool_threads() -> int:
    return sum(thread.name.startswith("courier_") for thread in threading.enumerate())


def test_clients_killed_mid_call_and_reconnecting_leave_no_thread_behind(server):
    """A node restarted after a SIGKILL reconnects to its peers' servers: neither its new
    connection nor the calls its old one left cut leave a thread behind. The server's pool
    grows to what the calls in flight at once need, and never past its 16 threads; every other
    thread of this process stays as it was."""
    others, pools = [], []
    for _ in range(4):
        peer = subprocess.Popen([sys.executable, PEER, "call", server.address, TOKEN], stdout=subprocess.PIPE, text=True)
        try:
            assert peer.stdout.readline().strip() == "calling"
        finally:
            peer.kill()
            peer.wait()
            peer.stdout.close()
        pools.append(pool_threads())
        others.append(len(os.listdir("/proc/self/task")) - pools[-1])
    assert others == others[:1] * 4, f"threads outside the pool after each killed client: {others}"
    assert max(pools) <= 16, f"the pool's threads after each killed client: {pools}"


def test_an_empty_token_is_refused_at_construction():
    with pytest.raises(ValueError, match="empty token"):
        courier.Server(Service(), token="")


def test_health_checks_answer_without_the_token_but_watches_need_it(server):
    with grpc.insecure_channel(server.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        assert stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as raised:
            next(stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=5))
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), metadata=AUTH, timeout=5)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()


def test_unary_requests_are_capped_near_the_inline_limit_and_large_calls_still_upload():
    server = courier.Server(Service(), token=TOKEN, inline_limit=1 << 20).start()
    try:
        with grpc.insecure_channel(server.address, options=[("grpc.max_send_message_length", 16 << 20)]) as channel:
            with pytest.raises(grpc.RpcError) as raised:
                channel.unary_unary(wire.path("add"))(bytes(3 << 20), metadata=AUTH, timeout=10)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        client = courier.Client(server.address, token=TOKEN, timeout=20, inline_limit=1 << 20)
        array = np.arange(4 << 20, dtype=np.uint8)
        np.testing.assert_array_equal(client.add(array, 0), array)  # 4 MiB: uploaded in chunks
    finally:
        server.stop(grace=0)


def test_calls_beyond_max_concurrent_calls_are_refused_as_busy():
    class Sleepy:
        def sleep(self, seconds):
            time.sleep(seconds)
            return seconds

    server = courier.Server(Sleepy(), thread_pool_size=2, max_concurrent_calls=3).start()
    try:
        client = courier.Client(server.address, timeout=10)
        waiting = [client.futures.sleep(1.0) for _ in range(3)]
        time.sleep(0.3)
        with pytest.raises(courier.ServerBusyError, match="busy"):
            client.sleep(0)
        assert [call.result(timeout=10) for call in waiting] == [1.0] * 3
        assert client.sleep(0) == 0
    finally:
        server.stop(grace=0)


def test_a_connection_that_never_speaks_http2_is_closed(monkeypatch):
    monkeypatch.setattr(server_module, "HANDSHAKE_TIMEOUT_MS", 500)
    server = courier.Server(Service()).start()
    try:
        host, port = server.address.rsplit(":", 1)
        # A connection left open would end this loop by the socket's 30 s timeout (TimeoutError).
        with socket.create_connection((host, int(port)), timeout=30) as silent:
            received = b""
            while chunk := silent.recv(1024):  # the server's settings, its goaway, then the close
                received += chunk
        assert b"handshake timeout" in received
    finally:
        server.stop(grace=0)


# --- Uploads and staged payloads are bounded (item 3) -------------------------------------------

def stalled_upload(channel: grpc.Channel, announced: int, release: threading.Event) -> grpc.Future:
    """An authorised upload that sends one chunk of `announced` bytes and then nothing."""
    def pieces() -> Iterator[bytes]:
        yield b"x" * 1024
        release.wait(30)

    return channel.stream_unary(wire.path(wire.UPLOAD)).future(
        pieces(), metadata=((wire.SIZE_KEY, str(announced)), *AUTH), timeout=30)


def upload(channel: grpc.Channel, payload: bytes) -> bytes:
    return channel.stream_unary(wire.path(wire.UPLOAD))(
        wire.chunks([payload]), metadata=((wire.SIZE_KEY, str(len(payload))), *AUTH), timeout=10)


def test_uploads_beyond_max_uploads_are_refused_as_busy_and_a_client_waits_for_room():
    server = courier.Server(Service(), token=TOKEN, max_uploads=2, chunk_timeout=1.5, inline_limit=1 << 20).start()
    release = threading.Event()
    try:
        with grpc.insecure_channel(server.address) as channel:
            stalled = [stalled_upload(channel, 1 << 20, release) for _ in range(2)]
            time.sleep(0.3)
            with pytest.raises(grpc.RpcError) as raised:
                upload(channel, b"y" * 10)
            assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            client = courier.Client(server.address, token=TOKEN, timeout=10, inline_limit=1 << 20,
                                    shared_memory_bytes=0)  # the socket path: uploads
            big = np.ones(2 << 20, np.uint8)
            with pytest.raises(courier.ServerBusyError, match="2 uploads at once"):
                client.with_timeout(0.5).add(big, 0)
            began = time.monotonic()
            np.testing.assert_array_equal(client.add(big, 0), big)  # waits until the stalled ones are cut
            assert time.monotonic() - began > 0.3  # it waited (the client's 10 s deadline bounds the wait)
            for call in stalled:
                assert call.exception(timeout=5).code() == grpc.StatusCode.CANCELLED
    finally:
        release.set()
        server.stop(grace=0)


def test_staged_bytes_are_bounded_by_max_staged_bytes():
    server = courier.Server(Service(), token=TOKEN, max_staged_bytes=3 << 20).start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            first = upload(channel, bytes(2 << 20))  # finished, not claimed yet
            with pytest.raises(grpc.RpcError) as raised:
                upload(channel, bytes(2 << 20))
            assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (wire.BUSY_KEY, "1") in raised.value.trailing_metadata()
            with pytest.raises(grpc.RpcError) as raised:
                upload(channel, bytes(4 << 20))
            assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_staged_bytes" in raised.value.details()
            with pytest.raises(grpc.RpcError):  # claiming it: not a call, but the bytes are taken
                channel.unary_unary(wire.path("add"))(wire.staged_frame(first, 2 << 20), metadata=AUTH, timeout=10)
            upload(channel, bytes(2 << 20))
        client = courier.Client(server.address, token=TOKEN, timeout=10, inline_limit=1 << 20,
                                shared_memory_bytes=0)  # the socket path: uploads
        with pytest.raises(courier.MessageTooLargeError, match="max_staged_bytes"):
            client.add(np.ones(4 << 20, np.uint8), 0)
    finally:
        server.stop(grace=0)


def test_a_transfer_is_cut_off_when_no_chunk_comes_for_chunk_timeout_however_long_it_lasts():
    server = courier.Server(Service(), token=TOKEN, chunk_timeout=1.0).start()
    release = threading.Event()
    try:
        with grpc.insecure_channel(server.address) as channel:
            def steady() -> Iterator[bytes]:
                for _ in range(8):  # 2.4 s in all, never 1 s without a chunk
                    time.sleep(0.3)
                    yield b"z" * 1024

            blob_id = channel.stream_unary(wire.path(wire.UPLOAD))(
                steady(), metadata=((wire.SIZE_KEY, str(8 * 1024)), *AUTH), timeout=30)
            assert len(blob_id) == 16
            began = time.monotonic()
            stalled = stalled_upload(channel, 1 << 20, release)
            assert stalled.exception(timeout=10).code() == grpc.StatusCode.CANCELLED  # cut, not left to its 30 s
            assert time.monotonic() - began > 0.9  # after the chunk timeout, not before
    finally:
        release.set()
        server.stop(grace=0)


def test_unclaimed_uploads_are_evicted_on_a_timer():
    server = courier.Server(Service(), token=TOKEN, staging_ttl=0.5, max_staged_bytes=3 << 20).start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            unclaimed = upload(channel, bytes(2 << 20))
            time.sleep(1.5)  # nothing else happens on the server meanwhile
            with pytest.raises(grpc.RpcError) as raised:
                channel.unary_unary(wire.path("add"))(wire.staged_frame(unclaimed, 2 << 20), metadata=AUTH, timeout=10)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "expired" in raised.value.details()
            upload(channel, bytes(2 << 20))  # the budget it held is free again
    finally:
        server.stop(grace=0)
