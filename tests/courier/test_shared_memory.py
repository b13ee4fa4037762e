"""Same-host messages through shared memory: the same API and semantics as the socket, the
token still required, hostile references refused, and no segment left behind when either side
is SIGKILLed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest

from jaxdist import courier
from jaxdist.courier import codec, shared_memory, wire

pytestmark = pytest.mark.skipif(not shared_memory.available(), reason="shared memory needs Linux's /dev/shm")

PEER = os.path.join(os.path.dirname(__file__), "shm_peer.py")
TOKEN = "shm-peer-token"
BIG = 2 << 18  # float32 elements: 2 MB, over the threshold


class Store:
    def echo(self, value):
        return value

    def keep(self, value):
        self.kept = value
        return float(value.sum())

    def kept_sum(self):
        return float(self.kept.sum())

    def big(self, megabytes):
        return np.full(megabytes << 18, 7.0, np.float32)


def segments_of(pid: int) -> list[str]:
    return [name for name in os.listdir(shared_memory.DIRECTORY) if name.startswith(f"{shared_memory.PREFIX}{pid}-")]


def wait_for(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def server():
    server = courier.Server(Store(), token=TOKEN, chunk_timeout=0.4).start()  # its janitor sweeps every 0.1 s
    yield server
    server.stop(grace=0)


@pytest.fixture
def client(server):
    client = courier.Client(server.address, token=TOKEN, timeout=30)
    yield client
    client.close()


def test_large_messages_go_both_ways_through_shared_memory_and_arrive_whole(server, client):
    value = {"params": np.arange(BIG, dtype=np.float32), "ids": np.arange(BIG, dtype=np.int64), "step": 3}
    echoed = client.echo(value)  # over the threshold: the client probes the server first
    assert client.shares_memory
    assert echoed["step"] == 3
    np.testing.assert_array_equal(echoed["params"], value["params"])
    np.testing.assert_array_equal(echoed["ids"], value["ids"])
    assert segments_of(os.getpid())  # the request's segment and the answer's
    future = client.futures.echo(value["params"]).result(timeout=30)
    np.testing.assert_array_equal(future, value["params"])
    assert not courier.Client(server.address, token=TOKEN, shared_memory_bytes=0).shares_memory


def test_small_messages_never_probe(server, client):
    assert client.echo(np.ones(4, np.float32)).sum() == 4
    assert not client.shares_memory


def test_the_callee_keeps_what_it_was_given_and_the_caller_keeps_what_it_got(server, client):
    sent = np.ones(BIG, np.float32)
    assert client.keep(sent) == BIG
    sent[:] = 5  # the caller's buffer was copied into the segment: the kept value is not aliased
    first = client.echo(np.full(BIG, 2.0, np.float32))
    assert client.keep(np.full(BIG, 3.0, np.float32)) == 3 * BIG  # segments in use are not reused
    second = client.echo(np.full(BIG, 4.0, np.float32))
    assert client.kept_sum() == 3 * BIG
    assert float(first.sum()) == 2 * BIG and float(second.sum()) == 4 * BIG


def test_a_segment_is_reused_once_its_receiver_let_go(server, client):
    before = set(segments_of(os.getpid()))  # other tests' servers in this process may hold some
    for _ in range(20):
        client.echo(np.ones(BIG, np.float32))
    assert len(set(segments_of(os.getpid())) - before) == 2  # one request segment, one answer segment
    client.close()
    server.stop(grace=0)
    assert set(segments_of(os.getpid())) <= before


def test_the_token_is_still_required(server, client):
    client.echo(np.ones(BIG, np.float32))
    segment = shared_memory.probe_segment(b"secret")
    try:
        with grpc.insecure_channel(server.address) as channel:
            for method, request in ((wire.SHARED_MEMORY_PROBE, codec.encode([segment, 6, shared_memory.pid_namespace()])),
                                    ("echo", codec.encode([[1], {}]))):
                with pytest.raises(grpc.RpcError) as raised:
                    channel.unary_unary(wire.path(method))(wire.INLINE + request, timeout=10)
                assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        shared_memory.unlink(segment)
    with pytest.raises(courier.AuthenticationError):
        courier.Client(server.address, token="wrong", timeout=10).echo(np.ones(BIG, np.float32))


@pytest.mark.parametrize("frame", [
    wire.shared_frame("../../etc/passwd", 1, 10),
    wire.shared_frame(f"{shared_memory.PREFIX}{os.getpid()}-{'0' * 16}", 1, 10),  # no such segment
    wire.SHARED + b"\x00" * 3,
], ids=["outside-dev-shm", "no-such-segment", "truncated"])  # ids without the pid: xdist's workers agree
def test_a_reference_to_no_segment_of_ours_is_refused_and_the_server_serves_on(server, client, frame):
    with grpc.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            channel.unary_unary(wire.path("echo"))(frame, metadata=((wire.TOKEN_KEY, TOKEN),), timeout=10)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert client.echo(np.ones(BIG, np.float32)).sum() == BIG


def test_a_stale_or_expired_message_is_refused():
    pool = shared_memory.Pool(64 << 20)
    try:
        parts = codec.encode_parts(np.ones(4, np.float32))
        expired = pool.send(parts, codec.frame_size(parts), expires_in=-1.0)
        with pytest.raises(ValueError, match="expired"):
            shared_memory.READER.claim(memoryview(expired))
        first = pool.send(parts, codec.frame_size(parts), expires_in=30.0)
        name, generation, size = wire.parse_shared(memoryview(first))
        with pytest.raises(ValueError, match="no longer holds"):
            shared_memory.READER.claim(memoryview(wire.shared_frame(name, generation + 1, size)))
        assert codec.decode(shared_memory.READER.claim(memoryview(first))).sum() == 4
    finally:
        pool.close()


def _peer(*args: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, PEER, *args], stdout=subprocess.PIPE, text=True)
    return process, process.stdout.readline().strip()


def test_a_sigkilled_senders_segments_are_swept_by_the_server(server):
    sender, said = _peer("send", server.address, "4")
    try:
        assert said == "sent"
        assert segments_of(sender.pid)  # its pool keeps the segment for reuse
    finally:
        sender.kill()
        sender.wait()
    wait_for(lambda: not segments_of(sender.pid), "the server's janitor to sweep the dead sender's segment")


def test_a_sigkilled_servers_segments_go_when_a_server_starts_again_and_what_was_read_stays_readable():
    peer, address = _peer("server")
    try:
        client = courier.Client(address, token=TOKEN, timeout=60)
        client.big(4)
        wait_for(lambda: client.shares_memory, "the probe")
        held = client.big(4)
        assert segments_of(peer.pid)
    finally:
        peer.kill()
        peer.wait()
    assert segments_of(peer.pid)  # until someone sweeps
    restarted = courier.Server(Store()).start()  # as a restarted node does
    try:
        assert segments_of(peer.pid) == []
        assert float(held.sum()) == 7.0 * (4 << 18)  # the mapping outlives the name
    finally:
        restarted.stop(grace=0)
        client.close()


def test_a_segment_held_by_a_sigkilled_receiver_is_reused(server):
    client = courier.Client(server.address, token=TOKEN, timeout=60)
    holder, said = _peer("hold", server.address, "4")
    try:
        assert said.startswith("held")
        answers = len(segments_of(os.getpid()))  # the server's: the holder's answer is still held
        holder.kill()
        holder.wait()
        client.big(4)
        wait_for(lambda: client.shares_memory, "the probe")
        for _ in range(3):
            assert float(client.big(4)[0]) == 7.0
        assert len(segments_of(os.getpid())) == answers  # the dead holder's segment was taken back
    finally:
        holder.kill()
        client.close()


def test_a_message_beyond_the_pools_budget_goes_by_the_socket(server):
    client = courier.Client(server.address, token=TOKEN, timeout=30, shared_memory_bytes=2 << 20)
    before = set(segments_of(os.getpid()))
    try:
        assert client.keep(np.full(BIG, 1.0, np.float32)) == BIG  # a 3 MB segment would be over 2 MB
        assert client.shares_memory and set(segments_of(os.getpid())) == before
    finally:
        client.close()


def test_killing_the_server_mid_call_leaves_the_callers_segment_to_its_caller():
    peer, address = _peer("server")
    client = courier.Client(address, token=TOKEN, timeout=60)
    before = set(segments_of(os.getpid()))
    try:
        client.keep(np.ones(BIG, np.float32))
        assert client.shares_memory
        os.kill(peer.pid, signal.SIGKILL)
        peer.wait()
        with pytest.raises(courier.UnavailableError):
            client.failing_fast().keep(np.ones(BIG, np.float32))
    finally:
        peer.kill()
        client.close()
    assert set(segments_of(os.getpid())) <= before and segments_of(peer.pid) == []


def test_a_server_made_with_shared_memory_bytes_0_shares_memory_neither_way():
    server = courier.Server(Store(), token=TOKEN, shared_memory_bytes=0).start()
    client = courier.Client(server.address, token=TOKEN, timeout=30)
    before = set(segments_of(os.getpid()))
    try:
        for _ in range(2):  # the first large call has the client probe; the second would use what it found
            np.testing.assert_array_equal(client.echo(np.arange(BIG, dtype=np.float32)), np.arange(BIG))
            assert float(client.big(4)[-1]) == 7.0
        assert not client.shares_memory
        assert set(segments_of(os.getpid())) == before  # no request's segment, no answer's
    finally:
        client.close()
        server.stop(grace=0)


def _unshare_pid() -> list[str]:
    """The command prefix that runs a process in a new pid namespace (dying with its launcher)."""
    command = ["unshare", "--pid", "--fork", "--kill-child"]
    if shutil.which("unshare") is None or subprocess.run([*command, "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare --pid is not permitted here (not root, or no user namespaces): no second pid "
                    "namespace to put a server in")
    return command


def test_a_server_in_another_pid_namespace_gets_no_shared_memory_though_dev_shm_is_the_same():
    """Pids name a segment's holder (the sweep of a dead peer's segments reads them), so a peer
    whose pids mean other processes must stay on the socket, although it can read our /dev/shm."""
    peer = subprocess.Popen([*_unshare_pid(), sys.executable, PEER, "server"], stdout=subprocess.PIPE, text=True)
    client = courier.Client(peer.stdout.readline().strip(), token=TOKEN, timeout=60)
    try:
        for _ in range(2):
            assert client.keep(np.arange(BIG, dtype=np.float32)) == BIG - 1
        assert float(client.big(4)[-1]) == 7.0
        assert not client.shares_memory
    finally:
        client.close()
        peer.kill()
        peer.wait()
