"""Chaos: a barrage of hostile input at a courier server in another process.

Several threads throw hundreds of random and mutated frames at a real server through raw gRPC
channels -- unknown ext codes, deep nesting, pickles of an object that calls ``os.system``,
frames claiming huge sizes, uploads announcing sizes they never send, downloads never read,
unknown methods -- while a well-behaved client keeps calling. Afterwards the server must be
healthy (gRPC health SERVING, a normal call works, every pool thread answers), its memory and
thread count must not have grown, and its handler must have run exactly for the valid calls:
the well-behaved ones plus any random frame that happens to decode to a valid call (decided here
with the same codec), never for garbage.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import multiprocessing
import os
import pathlib
import pickle
import random
import struct
import threading
import time
from typing import Callable, Iterator

import grpc
import msgpack
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import chaos_nodes as cn
from jaxdist import courier
from jaxdist.courier import codec, wire

pytestmark = pytest.mark.slow

POOL = 16
# More upload slots than attacker threads: the barrage checks outcomes, not the upload limit
# (tests/courier/test_server_limits.py does).
SERVER_OPTIONS = dict(thread_pool_size=POOL, max_message_bytes=4 << 20, inline_limit=256 << 10,
                      chunk_timeout=2.0, staging_ttl=4.0, max_uploads=8)
RAW_OPTIONS = [("grpc.max_send_message_length", 16 << 20), ("grpc.max_receive_message_length", 64 << 20)]
STALL_BYTES = 16 << 20  # a download this large outgrows gRPC's flow-control windows: unread, it stalls
CALL_TIMEOUT = 10.0
REFUSALS = {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "UNIMPLEMENTED", "NOT_FOUND"}


def proc_status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def python_threads(pid: int) -> int:
    """Threads named like the process: Python's, not gRPC core's own pool (which grows on demand)."""
    name = pathlib.Path(f"/proc/{pid}/comm").read_text()
    return sum(1 for task in pathlib.Path(f"/proc/{pid}/task").iterdir() if (task / "comm").read_text() == name)


def rss_mb(pid: int) -> float:
    return proc_status(pid, "VmRSS") / 1024


@dataclasses.dataclass
class RemoteServer:
    address: str
    pid: int
    process: multiprocessing.Process


@contextlib.contextmanager
def remote_server_process(options: dict) -> Iterator[RemoteServer]:
    """A courier server of a CountingService in a spawned process."""
    spawn = multiprocessing.get_context("spawn")
    parent, child = spawn.Pipe()
    process = spawn.Process(target=cn.serve_counting, args=(child, options), daemon=True)
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    # A fixed threshold: large buffers are mmapped and given back when freed, so the server's
    # RSS shows what it still holds rather than what glibc keeps for later.
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)
    try:
        process.start()
    finally:
        if saved is None:
            del os.environ["MALLOC_MMAP_THRESHOLD_"]
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
    child.close()
    try:
        assert parent.poll(60), "the server process did not start"
        address, pid = parent.recv()
        yield RemoteServer(address, pid, process)
    finally:
        with contextlib.suppress(OSError):
            parent.send("stop")
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join()


@pytest.fixture
def remote_server() -> Iterator[RemoteServer]:
    with remote_server_process(SERVER_OPTIONS) as server:
        yield server


class Evil:
    """Unpickling this runs a shell command that leaves a marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


# --- Telling what reaches the handler ------------------------------------------------------------

def reaches_handler(request: bytes) -> bool:
    """Whether the server would call ``record`` for this unary request, by the server's own rules."""
    if request[:1] != wire.INLINE:
        return False
    try:
        call = codec.decode(request[1:])
    except Exception:  # noqa: BLE001 - whatever the codec refuses here, the server must refuse too
        return False
    return (type(call) is list and len(call) == 2 and type(call[0]) is list and type(call[1]) is dict
            and all(type(key) is str for key in call[1]))


def header_frame(header: bytes, data: bytes = b"") -> bytes:
    """A codec frame around raw msgpack bytes (valid or not)."""
    frame = struct.pack("<I", len(header)) + header
    if data:
        frame += bytes(-len(frame) % 64) + data
    return frame


# --- The attacks ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Attack:
    label: str
    run: Callable[[grpc.Channel], str]  # the outcome: "ok:<frame kind>", "stalled" or a gRPC status name
    expect: str  # handler | refused | cut (stalled, cut off by the server) | stalled | staged


def unary(method: str, request: bytes) -> Callable[[grpc.Channel], str]:
    def run(channel: grpc.Channel) -> str:
        try:
            answer = channel.unary_unary(wire.path(method))(request, timeout=CALL_TIMEOUT)
        except grpc.RpcError as error:
            return error.code().name
        return f"ok:{answer[:1].hex()}"
    return run


def call_attack(label: str, request: bytes, method: str = "record") -> Attack:
    expect = "handler" if method == "record" and reaches_handler(request) else "refused"
    return Attack(label, unary(method, request), expect)


def upload(announced: str | None, pieces: list[bytes], then_call: bool = False) -> Callable[[grpc.Channel], str]:
    """An upload announcing `announced` bytes and sending `pieces`; then, optionally, a call naming it."""
    def run(channel: grpc.Channel) -> str:
        metadata = () if announced is None else ((wire.SIZE_KEY, announced),)
        try:
            blob_id = channel.stream_unary(wire.path(wire.UPLOAD))(iter(pieces), metadata=metadata,
                                                                   timeout=CALL_TIMEOUT)
        except grpc.RpcError as error:
            return error.code().name
        if not then_call:
            return "ok:upload"
        return unary("record", wire.staged_frame(blob_id, int(announced)))(channel)
    return run


def pieces_then_wait(pieces: list[bytes], release: threading.Event) -> Iterator[bytes]:
    yield from pieces
    release.wait()


def stalled_upload(announced: int, first: bytes, release: threading.Event) -> Callable[[grpc.Channel], str]:
    """Announces `announced` bytes, sends `first`, then neither sends nor ends, with no deadline."""
    def run(channel: grpc.Channel) -> str:
        try:
            channel.stream_unary(wire.path(wire.UPLOAD))(pieces_then_wait([first], release),
                                                         metadata=((wire.SIZE_KEY, str(announced)),))
        except grpc.RpcError as error:
            return error.code().name
        return "ok:upload"
    return run


def unread_download(read_chunks: int, keep: list) -> Callable[[grpc.Channel], str]:
    """Asks for a large answer, opens its download, reads `read_chunks` chunks and stops reading."""
    def run(channel: grpc.Channel) -> str:
        answer = channel.unary_unary(wire.path("big"))(wire.INLINE + codec.encode([[STALL_BYTES], {}]),
                                                       timeout=CALL_TIMEOUT)
        blob_id, size = wire.parse_staged(memoryview(answer))
        assert size >= STALL_BYTES
        stream = channel.unary_stream(wire.path(wire.DOWNLOAD))(blob_id)
        for _ in range(read_chunks):
            next(stream)
        keep.append(stream)  # never read again, never cancelled by us
        return "stalled"
    return run


def download(blob_id: bytes) -> Callable[[grpc.Channel], str]:
    def run(channel: grpc.Channel) -> str:
        try:
            for _ in channel.unary_stream(wire.path(wire.DOWNLOAD))(blob_id, timeout=CALL_TIMEOUT):
                pass
        except grpc.RpcError as error:
            return error.code().name
        return "ok:download"
    return run


def mutate(frame: bytes, rng: random.Random) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randint(1, 5)):
        choice = rng.randrange(6)
        if choice == 0 and data:  # overwrite a byte
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif choice == 1 and len(data) > 1:  # truncate
            del data[rng.randrange(1, len(data)):]
        elif choice == 2:  # append junk
            data += rng.randbytes(rng.randint(1, 64))
        elif choice == 3 and len(data) >= 5:  # another header length
            data[1:5] = struct.pack("<I", rng.choice([0, 1, len(data), 2**31, 2**32 - 1, rng.randrange(2**32)]))
        elif choice == 4 and data:  # insert bytes
            at = rng.randrange(len(data))
            data[at:at] = rng.randbytes(rng.randint(1, 16))
        elif choice == 5 and len(data) > 2:  # drop a slice
            at = rng.randrange(1, len(data))
            del data[at:at + rng.randint(1, 8)]
    return bytes(data)


def valid_bases() -> list[bytes]:
    values = [
        [["base", 7], {}],
        [[1, 2.5, None, True, b"raw", "text"], {"k": (1, (2, 3)), "z": [{"a": -1}]}],
        [[np.arange(12, dtype=np.float32).reshape(3, 4)], {"s": np.int64(5), "b": np.zeros(3, np.bool_)}],
        [[(np.ones(2, np.uint8), np.float16(1.5))], {"nested": {"x": [np.arange(3)]}}],
    ]
    return [wire.INLINE + codec.encode(value) for value in values]


def make_attacks(rng: random.Random, marker: str, release: threading.Event, keep: list) -> list[Attack]:
    attacks: list[Attack] = []
    ext = msgpack.ExtType
    # Random bytes, behind each frame kind and behind none.
    for _ in range(150):
        kind = rng.choice([wire.INLINE, wire.STAGED, wire.ERROR, bytes([rng.randrange(3, 256)]), b""])
        attacks.append(call_attack("random", kind + rng.randbytes(rng.randint(0, 2048))))
    # Mutations of valid calls.
    bases = valid_bases()
    for _ in range(250):
        attacks.append(call_attack("mutated", mutate(rng.choice(bases), rng)))
    # Ext types: unknown codes, payloads on known tags, tags out of place or lying.
    for _ in range(60):
        code, payload = rng.randrange(-128, 128), rng.randbytes(rng.choice([0, 1, 4, 8, 12, 17]))
        raw_ext = struct.pack(">BBb", 0xC7, len(payload), code) + payload  # ext 8: any code, -128..127
        attacks.append(call_attack("ext", wire.INLINE + header_frame(b"\x92\x91" + raw_ext + b"\x80")))
    for tags in ([ext(1, b"")], [1, ext(2, b"")], {"k": ext(3, b"")}, [ext(2, b""), "float32", [2**40], 0, 2**42],
                 [ext(4, b""), "posix.system", "touch " + marker], [ext(3, b""), "float64", b"\x00"],
                 [ext(2, b""), "object", [1], 0, 8], [ext(2, b""), "<f8", [1], 0, 8]):
        attacks.append(call_attack("tags", wire.INLINE + header_frame(msgpack.packb([[tags], {}]))))
    # Deep nesting: lists, maps, tuple tags.
    for depth in (100, 1000, 1023, 1024, 1025, 5000, 100_000, 1_000_000):
        nested = b"\x91" * depth + b"\xc0"
        attacks.append(call_attack("deep-list", wire.INLINE + header_frame(b"\x92\x91" + nested + b"\x80")))
    tuple_tag = msgpack.packb(ext(1, b""))
    for depth in (1000, 2000, 50_000):
        nested = b"\x81\xa1k" * depth + b"\xc0"
        attacks.append(call_attack("deep-map", wire.INLINE + header_frame(b"\x92\x91" + nested + b"\x80")))
        nested = (b"\x92" + tuple_tag) * depth + b"\xc0"
        attacks.append(call_attack("deep-tuple", wire.INLINE + header_frame(b"\x92\x91" + nested + b"\x80")))
    # Pickles of an object whose unpickling runs os.system, wherever a frame could hide one.
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        evil = pickle.dumps(Evil(marker), protocol=protocol)
        for prefix in (b"", wire.INLINE, wire.STAGED, wire.ERROR):
            attacks.append(call_attack("pickle", prefix + evil))
        attacks.append(call_attack("pickle-header", wire.INLINE + header_frame(evil)))
        attacks.append(call_attack("pickle-as-bytes", wire.INLINE + codec.encode([[evil], {"p": evil}])))  # valid
        attacks.append(Attack("pickle-upload", upload(str(len(evil)), [evil], then_call=True), "refused"))
    # Frames claiming huge sizes.
    for claimed in (2**31, 2**32 - 1):
        attacks.append(call_attack("huge-header", wire.INLINE + struct.pack("<I", claimed) + b"\x90"))
    for value in ([ext(2, b""), "float64", [2**40, 2**20], 0, 2**63], [ext(2, b""), "uint8", [2**62, 2**62, 0], 0, 0],
                  [ext(2, b""), "uint8", [2**64 - 1], 64, 2**64 - 1], [ext(2, b""), "uint8", [1] * 65, 0, 1]):
        frame = header_frame(msgpack.packb([[value], {}]), b"\x01" * 64)
        attacks.append(call_attack("huge-array", wire.INLINE + frame))
    for claimed in (b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff"):
        attacks.append(call_attack("huge-container", wire.INLINE + header_frame(b"\x92" + claimed)))
    attacks.append(call_attack("staged-huge", wire.staged_frame(rng.randbytes(16), 2**64 - 1)))
    for size in (5 << 20, 9 << 20):  # over the server's 4 MiB max_message_bytes
        attacks.append(Attack("oversized", unary("record", wire.INLINE + bytes(size)), "refused"))
    # Uploads announcing sizes they do not send, or no size at all.
    for announced, pieces in ((1000, [b"x" * 10]), (10, [b"x" * 1000]), (1 << 20, []),
                              (1 << 20, [b"x" * 4096] * 3), (5, [b"abc", b"defgh"])):
        attacks.append(Attack("upload-lies", upload(str(announced), pieces), "refused"))
    for announced in (None, "", "abc", "-1", "1e6", str(2**64), str((4 << 20) + 1), str(2**40)):
        attacks.append(Attack("upload-bad-size", upload(announced, [b"x"]), "refused"))
    for _ in range(3):
        announced = rng.choice([1000, 1 << 20])
        attacks.append(Attack("upload-stalled", stalled_upload(announced, b"x" * 100, release), "cut"))
    # Downloads never read, answers never fetched, downloads of nothing.
    for chunks in (0, 1, 2):
        attacks.append(Attack("download-unread", unread_download(chunks, keep), "stalled"))
    for _ in range(5):
        request = wire.INLINE + codec.encode([[STALL_BYTES // 8], {}])
        attacks.append(Attack("answer-unfetched", unary("big", request), "staged"))
        attacks.append(Attack("download-unknown", download(rng.randbytes(rng.choice([0, 3, 16, 40]))), "refused"))
    # Unknown methods and paths.
    for name in ("nope", "_private", "run", "__init__", "record/extra", "", "../record", "x" * 1000):
        attacks.append(call_attack("unknown-method", bases[0], method=name))
    return attacks


def outcome_ok(attack: Attack, outcome: str | None) -> bool:
    if attack.expect == "handler":
        return outcome == "ok:" + wire.INLINE.hex()
    if attack.expect == "refused":
        return outcome in REFUSALS
    if attack.expect == "cut":  # the server's chunk_timeout cut it off
        return outcome == "CANCELLED"
    if attack.expect == "stalled":
        return outcome == "stalled"
    return outcome == "ok:" + wire.STAGED.hex()  # a large answer, staged and never fetched


# --- The tests -----------------------------------------------------------------------------------

def check_health(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", wire.SERVICE):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def pool_answers(client: courier.Client, seconds: float) -> float:
    """Time for POOL concurrent calls that each sleep `seconds`: about `seconds` if every thread is free."""
    began = time.monotonic()
    calls = [client.futures.sleep(seconds) for _ in range(POOL)]
    assert [call.result(timeout=60) for call in calls] == [seconds] * POOL
    return time.monotonic() - began


def test_a_barrage_of_hostile_frames_leaves_the_server_healthy_and_its_handler_untouched(remote_server, tmp_path):
    server = remote_server
    marker = str(tmp_path / "pickle-ran")
    client = courier.Client(server.address, timeout=30, inline_limit=256 << 10)
    # Warm up every path the barrage uses, then take the baseline.
    nonces = [0]
    client.record("valid", 0)
    client.record(np.zeros(1 << 20, np.uint8))  # uploaded
    assert client.big(STALL_BYTES).nbytes == STALL_BYTES  # staged and downloaded
    pool_answers(client, 0.1)
    client.collect()
    rss_before, threads_before = rss_mb(server.pid), proc_status(server.pid, "Threads")
    valid_calls = 2

    release, keep = threading.Event(), []
    attacks = make_attacks(random.Random(20240501), marker, release, keep)
    random.Random(7).shuffle(attacks)
    outcomes: list[str | None] = [None] * len(attacks)
    barrage_done = threading.Event()
    valid_failures: list[BaseException] = []

    def well_behaved() -> None:
        nonce = 1
        while not barrage_done.is_set():
            try:
                client.record("valid", nonce)
                nonces.append(nonce)
            except BaseException as exc:  # noqa: BLE001 - reported below
                valid_failures.append(exc)
            nonce += 1
            time.sleep(0.005)

    def attacker(index: int, workers: int) -> None:
        with grpc.insecure_channel(server.address, options=RAW_OPTIONS) as channel:
            for i in range(index, len(attacks), workers):
                outcomes[i] = attacks[i].run(channel)

    caller = threading.Thread(target=well_behaved, daemon=True)
    caller.start()
    began = time.monotonic()
    workers = 6
    try:
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            for done in [pool.submit(attacker, i, workers) for i in range(workers)]:
                done.result(timeout=300)
    finally:
        barrage_done.set()
        caller.join(30)
    barrage_seconds = time.monotonic() - began
    valid_calls += len(nonces) - 1

    # Stalled transfers are cut off after the server's chunk_timeout; unfetched answers expire
    # after its staging_ttl (dropped by the server's janitor).
    time.sleep(SERVER_OPTIONS["staging_ttl"] + 0.5)
    release.set()
    check_health(server.address)
    assert client.record("valid", -1) and client.big(1 << 20).nbytes == 1 << 20  # a normal call, staged too
    nonces.append(-1)
    valid_calls += 1
    pool_seconds = pool_answers(client, 1.0)
    client.collect()
    rss_after, threads_after = rss_mb(server.pid), proc_status(server.pid, "Threads")
    peak = proc_status(server.pid, "VmHWM") / 1024
    stats = client.stats()
    for stream in keep:
        stream.cancel()

    by_label: dict[str, dict[str, int]] = {}
    for attack, outcome in zip(attacks, outcomes):
        counts = by_label.setdefault(attack.label, {})
        counts[str(outcome)] = counts.get(str(outcome), 0) + 1
    to_handler = sum(1 for attack in attacks if attack.expect == "handler")
    print(f"\ncourier barrage: {len(attacks)} hostile requests from {workers} threads in {barrage_seconds:.1f} s, "
          f"{valid_calls} valid calls alongside; {to_handler} hostile frames decode to valid calls\n"
          f"  handler calls {stats['calls']} (expected {valid_calls + to_handler}), garbage {stats['garbage']}\n"
          f"  server RSS {rss_before:.0f} -> {rss_after:.0f} MB (peak {peak:.0f} MB), "
          f"threads {threads_before} -> {threads_after}, {POOL} concurrent 1 s calls took {pool_seconds:.2f} s after")
    for label, counts in by_label.items():
        print(f"  {label:17s} {counts}")

    wrong = [(a.label, a.expect, o) for a, o in zip(attacks, outcomes) if not outcome_ok(a, o)]
    assert wrong == [], wrong[:20]
    assert valid_failures == [], valid_failures[:3]
    assert server.process.is_alive()
    assert not os.path.exists(marker), "a pickle was unpickled"
    assert stats["garbage"] == 0
    assert stats["calls"] == valid_calls + to_handler
    assert set(nonces) <= set(stats["nonces"])
    assert pool_seconds < 1.9, "some server threads are still held"
    assert rss_after - rss_before < 32, (rss_before, rss_after)
    assert threads_after <= threads_before + 4, (threads_before, threads_after)


def test_an_upload_announcing_a_huge_size_allocates_nothing_before_the_bytes_arrive():
    """An announced size is a claim: a peer that announces 512 MiB and sends 1 KiB must not make
    the server hold 512 MiB (sixteen such uploads, one per server thread, would hold 8 GiB)."""
    with remote_server_process(dict(SERVER_OPTIONS, max_message_bytes=1 << 30, chunk_timeout=30.0)) as server:
        client = courier.Client(server.address, timeout=30)
        client.record("valid", 0)
        before = rss_mb(server.pid)
        release = threading.Event()
        with grpc.insecure_channel(server.address) as channel:
            stalled = channel.stream_unary(wire.path(wire.UPLOAD)).future(
                pieces_then_wait([b"x" * 1024], release), metadata=((wire.SIZE_KEY, str(512 << 20)),))
            time.sleep(1.5)
            during = rss_mb(server.pid)
            release.set()
            stalled.cancel()
        check_health(server.address)
        assert client.record("valid", 1) == 2
        assert during - before < 64, f"server RSS grew {during - before:.0f} MB while 1 KiB of 512 MiB arrived"


def test_the_barrage_without_the_token_is_refused_before_anything_is_read(tmp_path):
    """The same attacks at a server with a token, from peers without it: every one is refused
    (UNAUTHENTICATED) before its request is read, nothing reaches the object, and the server
    keeps its memory, its threads and its well-behaved caller."""
    token = "barrage-token"
    with remote_server_process(dict(SERVER_OPTIONS, token=token)) as server:
        client = courier.Client(server.address, timeout=30, inline_limit=256 << 10, token=token)
        client.record("valid", 0)
        pool_answers(client, 0.1)
        client.collect()
        rss_before, threads_before = rss_mb(server.pid), python_threads(server.pid)
        release = threading.Event()
        attacks = [attack for attack in make_attacks(random.Random(11), str(tmp_path / "pickle-ran"), release, [])
                   if attack.label != "download-unread"]  # it needs an answer from `big` first
        attacks += [Attack("stream-never-sends", stalled_upload(1 << 20, b"", release), "unauthenticated")
                    for _ in range(2 * POOL)]
        outcomes: list[str | None] = [None] * len(attacks)

        def attacker(index: int, workers: int) -> None:
            with grpc.insecure_channel(server.address, options=RAW_OPTIONS) as channel:
                for i in range(index, len(attacks), workers):
                    outcomes[i] = attacks[i].run(channel)

        try:
            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                for done in [pool.submit(attacker, i, 6) for i in range(6)]:
                    done.result(timeout=120)
            assert client.record("valid", 1) == 2
            pool_seconds = pool_answers(client, 1.0)
        finally:
            release.set()
        client.collect()
        rss_after, threads_after = rss_mb(server.pid), python_threads(server.pid)
        stats = client.stats()
    assert sorted(set(outcomes)) == ["UNAUTHENTICATED"], {o: outcomes.count(o) for o in set(outcomes)}
    assert stats["calls"] == 2 and stats["garbage"] == 0
    assert not (tmp_path / "pickle-ran").exists()
    assert pool_seconds < 1.9, "some server threads are still held"
    assert rss_after - rss_before < 32, (rss_before, rss_after)
    assert threads_after <= threads_before, (threads_before, threads_after)
