"""Same-host messages through shared memory: the same API and semantics as the socket, the
token still required, hostile references refused, no segment left behind when either side is
SIGKILLed, and nothing that another local user plants in /dev/shm opened, read or in the way."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
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
AUTH = ((wire.TOKEN_KEY, TOKEN),)
OTHER_UID = 12345
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's file needs root (chown)")


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
    prefix = f"{shared_memory.PREFIX}{shared_memory.pid_namespace()}-{pid}-"
    return [name for name in os.listdir(shared_memory.DIRECTORY) if name.startswith(prefix)]


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
    segment = shared_memory.probe_segment(b"a secret nonce!!")
    try:
        with grpc.insecure_channel(server.address) as channel:
            for method, request in ((wire.SHARED_MEMORY_PROBE, codec.encode([segment, shared_memory.pid_namespace()])),
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
    wire.shared_frame(f"{shared_memory.PREFIX}{shared_memory.pid_namespace()}-{os.getpid()}-{'0' * 16}", 1, 10),
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


# --- A hostile host: files other users plant in /dev/shm, callers that never proved they share it,
# other pid namespaces, a full /dev/shm. Another user's file is planted as root (chown); another pid
# namespace or a private /dev/shm comes from unshare(1). Each test skips, saying why, where it cannot.

def dead_pid() -> int:
    """A pid no process of this pid namespace holds now."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def segment_name(pid: int) -> str:
    """A name as courier gives its segments, for a process `pid` of this pid namespace."""
    return f"{shared_memory.PREFIX}{shared_memory.pid_namespace()}-{pid}-{os.urandom(8).hex()}"


def plant_segment(name: str, value: object, uid: int, mode: int) -> str:
    """A file laid out as a segment holding `value` (generation 1, unclaimed, expiring in a
    minute), owned by `uid` with `mode`: what another local user can leave in /dev/shm."""
    frame = b"".join(codec.encode_parts(value))
    header = np.zeros(8, np.int64)
    header[shared_memory.SENT] = 1
    header[shared_memory.EXPIRY] = time.monotonic_ns() + 60_000_000_000
    path = os.path.join(shared_memory.DIRECTORY, name)
    with open(path, "wb") as segment:
        segment.write(header.tobytes() + frame)
    os.chown(path, uid, uid)
    os.chmod(path, mode)
    return wire.shared_frame(name, 1, len(frame))


def negotiated(client: courier.Client) -> courier.Client:
    client.echo(np.ones(BIG, np.float32))
    deadline = time.monotonic() + 20
    while not client.shares_memory:
        assert time.monotonic() < deadline, "the client never linked shared memory"
        time.sleep(0.02)
    return client


# --- The sweep skips what it cannot or must not remove --------------------------------------------

def test_a_planted_directory_stops_neither_the_sweep_nor_a_server_nor_its_large_calls(server):
    planted = os.path.join(shared_memory.DIRECTORY, segment_name(dead_pid()))
    os.mkdir(planted)
    try:
        shared_memory.sweep()
        with courier.Server(Store(), token=TOKEN).start() as second:
            with courier.Client(second.address, token=TOKEN, timeout=30) as client:
                assert negotiated(client).echo(np.ones(BIG, np.float32)).sum() == BIG
        assert os.path.isdir(planted)
    finally:
        os.rmdir(planted)


@AS_ROOT
def test_the_sweep_leaves_another_users_file_alone():
    path = os.path.join(shared_memory.DIRECTORY, segment_name(dead_pid()))
    plant_segment(os.path.basename(path), 1, OTHER_UID, 0o600)
    try:
        shared_memory.sweep()
        assert os.path.exists(path)
    finally:
        os.unlink(path)


def test_the_janitor_goes_on_when_its_chore_fails():
    from jaxdist.courier import staging

    calls = []

    def chore() -> None:
        calls.append(time.monotonic())
        raise OSError("a planted file")

    janitor = staging.Janitor(staging.StagingArea(60.0, 1 << 20), chunk_timeout=1.0, period=0.02, chore=chore)
    janitor.start()
    try:
        deadline = time.monotonic() + 5
        while len(calls) < 3:
            assert time.monotonic() < deadline, "the janitor died with its first failed chore"
            time.sleep(0.02)
    finally:
        janitor.stop()


OTHER_NAMESPACE_OWNER = textwrap.dedent("""
    import sys
    import numpy as np
    from jaxdist.courier import codec, shared_memory, wire
    pool = shared_memory.Pool(64 << 20)
    parts = codec.encode_parts(np.ones(1 << 19, np.float32))
    frame = pool.send(parts, codec.frame_size(parts), expires_in=600.0)
    print(wire.parse_shared(memoryview(frame))[0], flush=True)
    sys.stdin.read()
""")


def in_another_pid_namespace(script: str) -> subprocess.Popen:
    """`script` run by a process of a new pid namespace whose pid there (999991) is no pid here."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("another pid namespace needs root and unshare(1)")
    command = f"echo 999990 > /proc/sys/kernel/ns_last_pid && {sys.executable} -c \"$0\""
    return subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", command, script],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def test_the_sweep_leaves_the_live_segments_of_another_pid_namespace_alone():
    owner = in_another_pid_namespace(OTHER_NAMESPACE_OWNER)
    try:
        name = owner.stdout.readline().strip()
        if not name:
            pytest.skip("unshare could not make a pid namespace here")
        path = os.path.join(shared_memory.DIRECTORY, name)
        assert os.path.exists(path)
        shared_memory.sweep()
        assert os.path.exists(path), "a live process's segment was unlinked"
    finally:
        owner.stdin.close()
        owner.wait(timeout=30)


# --- Nobody maps or reads a file that is not a segment of this user -------------------------------

@AS_ROOT
def test_a_server_refuses_a_request_in_another_users_file_and_serves_on(server, client):
    frame = plant_segment(segment_name(os.getpid()), [[np.ones(4, np.float32)], {}], OTHER_UID, 0o666)
    try:
        with grpc.insecure_channel(server.address) as channel:
            with pytest.raises(grpc.RpcError) as raised:
                channel.unary_unary(wire.path("echo"))(frame, metadata=AUTH, timeout=10)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert client.echo(np.ones(BIG, np.float32)).sum() == BIG
    finally:
        shared_memory.unlink(wire.parse_shared(memoryview(frame))[0])


def test_the_reader_refuses_a_symlink_and_a_file_others_may_write(tmp_path):
    target = tmp_path / "only-mine"
    target.write_bytes(bytes(4096))
    link = segment_name(os.getpid())
    os.symlink(target, os.path.join(shared_memory.DIRECTORY, link))
    loose = plant_segment(segment_name(os.getpid()), 1, os.geteuid(), 0o666)
    try:
        for frame in (wire.shared_frame(link, 0, 8), loose):
            with pytest.raises(ValueError):
                shared_memory.READER.claim(memoryview(frame))
        assert target.read_bytes() == bytes(4096)
    finally:
        shared_memory.unlink(link)
        shared_memory.unlink(wire.parse_shared(memoryview(loose))[0])


def probe(server: courier.Server, name: str) -> object:
    request = wire.INLINE + codec.encode([name, shared_memory.pid_namespace()])
    with grpc.insecure_channel(server.address) as channel:
        answer = channel.unary_unary(wire.path(wire.SHARED_MEMORY_PROBE))(request, metadata=AUTH, timeout=10)
    return codec.decode(memoryview(answer)[1:])


def test_the_probe_reads_back_no_file_but_a_callers_probe(server, client, tmp_path):
    secret = tmp_path / "key"
    secret.write_bytes(b"-----BEGIN PRIVATE KEY-----")
    link = segment_name(os.getpid())
    os.symlink(secret, os.path.join(shared_memory.DIRECTORY, link))
    negotiated(client)
    segments = [name for name in os.listdir(shared_memory.DIRECTORY) if name.startswith(shared_memory.PREFIX)
                and os.path.getsize(os.path.join(shared_memory.DIRECTORY, name)) > 64]
    try:
        assert probe(server, link) is None
        for name in segments:  # a segment's header is no probe either
            assert probe(server, name) is None
    finally:
        shared_memory.unlink(link)


# --- Answers in shared memory go only to callers that proved they share it -----------------------

def test_a_caller_that_never_proved_it_shares_memory_gets_no_answer_in_it(server):
    """A remote token holder that only says it shares memory would learn the answer's segment,
    and could name it back to free it under another client."""
    request = wire.INLINE + codec.encode([[4], {}])
    with grpc.insecure_channel(server.address, options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
        answer = channel.unary_unary(wire.path("big"))(
            request, metadata=AUTH + ((wire.SHARED_MEMORY_KEY, "1"),), timeout=10)
    assert answer[:1] != wire.SHARED


def test_a_message_is_claimed_once():
    pool = shared_memory.Pool(64 << 20)
    try:
        parts = codec.encode_parts(np.ones(4, np.float32))
        frame = memoryview(pool.send(parts, codec.frame_size(parts), expires_in=30.0))
        held = shared_memory.READER.claim(frame)
        with pytest.raises(ValueError, match="claimed"):
            shared_memory.READER.claim(frame)
        assert codec.decode(held).sum() == 4
    finally:
        pool.close()


def test_a_shared_answer_waits_no_longer_than_the_servers_staging_ttl():
    """A caller's deadline may be months away: its unread answer must not pin a segment as long."""
    server = courier.Server(Store(), token=TOKEN, staging_ttl=5.0).start()
    try:
        with courier.Client(server.address, token=TOKEN, timeout=30) as client:
            negotiated(client).with_timeout(1e7).big(4)
        expiries = [_expiry(name) for name in os.listdir(shared_memory.DIRECTORY)
                    if name.startswith(shared_memory.PREFIX)]
        assert expiries and min(expiries) - time.monotonic_ns() < 10e9, expiries
    finally:
        server.stop(grace=0)


def _expiry(name: str) -> int:
    with open(os.path.join(shared_memory.DIRECTORY, name), "rb") as segment:
        return int(np.frombuffer(segment.read(64), np.int64)[shared_memory.EXPIRY])


# --- A full /dev/shm -------------------------------------------------------------------------------

FULL_SHM_CALLER = textwrap.dedent("""
    import os
    import numpy as np
    from jaxdist import courier

    with open("/dev/shm/filler", "wb", buffering=0) as filler:  # fill the private /dev/shm to the last byte
        try:
            while True:
                filler.write(bytes(4096))
        except OSError:
            pass

    class Echo:
        def echo(self, value):
            return value

    with courier.Server(Echo(), token="t") as server, courier.Client(server.address, token="t", timeout=30) as c:
        total = sum(float(c.echo(np.ones(1 << 19, np.float32)).sum()) for _ in range(3))
        print("ok", total, c.shares_memory, flush=True)
""")


def test_a_full_dev_shm_sends_large_calls_by_the_socket():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a private /dev/shm needs root and unshare(1)")
    command = f"mount -t tmpfs -o size=64k tmpfs /dev/shm && {sys.executable} -c \"$0\""
    result = subprocess.run(["unshare", "--mount", "sh", "-c", command, FULL_SHM_CALLER], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert result.stdout.strip() == f"ok {3.0 * (1 << 19)} False", result.stderr[-3000:]


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
