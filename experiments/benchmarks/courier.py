"""Courier against raw grpcio, measured in the same run on this machine.

The servers run in a child process (nodes are processes), the clients here. Raw grpcio is the
floor courier is built on: a generic handler moving bytes in and out, with the same message
limits. Courier runs as under a launcher: with a token, and its default limits (request cap,
calls in flight, uploads, staged bytes, per-chunk timeout). Latency is a tiny call; throughput
is blocking calls and futures; bandwidth is an echo of a float32 array (counted both ways)
against an echo of the same number of raw bytes, over the socket (a client with shared memory
off) and through shared memory (the default between processes of one host). The TLS rows run
both sides with mutual TLS (certificates from ``jaxdist.tools.certs``, as ``--tls-dir`` uses them).
A second table sets courier on 127.0.0.1 against courier on a Unix socket, where the processes
launcher binds its nodes. Every comparison alternates the two trial by trial and reports medians.

    python experiments/benchmarks/courier.py [--quick]
"""

from __future__ import annotations

import argparse
import multiprocessing
import secrets
import statistics
import tempfile
import time
from concurrent import futures
from typing import Callable

import grpc
import numpy as np

from jaxdist.tools import certs

from jaxdist import courier
from jaxdist.courier.tls import TLS

HOST = "127.0.0.1"
RAW_LIMIT = 1 << 30
RAW_OPTIONS = [("grpc.max_send_message_length", RAW_LIMIT), ("grpc.max_receive_message_length", RAW_LIMIT)]
# Bursts of futures vary more than single calls: 10 trials a side gave 0.75-1.20x from run to
# run on this machine, 30 gave 0.98x (same hour).
FUTURES_TRIALS = 30


class Echo:
    def echo(self, value):
        return value


def _raw_echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    return request


def serve(addresses: "multiprocessing.connection.Connection", token: str, tls_dir: str) -> None:
    """Child process: raw grpcio and courier echo servers, plaintext and with mutual TLS, and a
    courier server on a Unix socket (as the processes launcher binds nodes), until told to stop."""
    tls = TLS.load(tls_dir, HOST)
    raws, found = [], []
    for credentials in (None, tls.server_credentials()):
        raw = grpc.server(futures.ThreadPoolExecutor(16), options=RAW_OPTIONS + [("grpc.so_reuseport", 0)])
        raw.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("raw", {"echo": grpc.unary_unary_rpc_method_handler(_raw_echo)})]
        )
        port = (raw.add_insecure_port(f"{HOST}:0") if credentials is None
                else raw.add_secure_port(f"{HOST}:0", credentials))
        raws.append(raw.start() or raw)
        found.append(f"{HOST}:{port}")
    servers = [courier.Server(Echo(), token=token).start(), courier.Server(Echo(), token=token, tls=tls).start(),
               courier.Server(Echo(), f"unix:{tls_dir}/echo.sock", token=token).start()]
    addresses.send((*found, *(server.address for server in servers)))
    addresses.recv()
    for server in servers:
        server.stop(0)
    for raw in raws:
        raw.stop(0)


def alternating(baseline: Callable[[], object], candidate: Callable[[], object], trials: int) -> tuple[list, list]:
    """Seconds per trial of the two, taken turn about, so both see the same machine load (this
    machine is shared and noisy: compare medians of many alternating trials, not single runs)."""
    baseline()
    candidate()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(trials):
        for call, into in ((baseline, times[0]), (candidate, times[1])):
            began = time.perf_counter()
            call()
            into.append(time.perf_counter() - began)
    return times


def futures_burst(submit: Callable[[], object], count: int, window: int = 64) -> Callable[[], None]:
    """A trial of `count` calls with up to `window` futures in flight."""

    def burst() -> None:
        pending: list = []
        for _ in range(count):
            pending.append(submit())
            if len(pending) >= window:
                pending.pop(0).result()
        for future in pending:
            future.result()

    return burst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    args = parser.parse_args()
    calls = 500 if args.quick else 3000
    repeats_divisor = 3 if args.quick else 1

    token, tls_dir = secrets.token_hex(16), tempfile.mkdtemp(prefix="jaxdist-bench-certs-")
    certs.make(tls_dir, [HOST])
    tls = TLS.load(tls_dir, HOST)
    parent_end, child_end = multiprocessing.get_context("spawn").Pipe()
    child = multiprocessing.get_context("spawn").Process(target=serve, args=(child_end, token, tls_dir))
    child.start()
    raw_address, raw_tls_address, courier_address, courier_tls_address, unix_address = parent_end.recv()
    raw_echo = grpc.insecure_channel(raw_address, options=RAW_OPTIONS).unary_unary("/raw/echo")
    raw_tls_echo = grpc.secure_channel(raw_tls_address, tls.channel_credentials(),
                                       options=RAW_OPTIONS).unary_unary("/raw/echo")
    client = courier.Client(courier_address, timeout=120, token=token, shared_memory_bytes=0)
    tls_client = courier.Client(courier_tls_address, timeout=120, token=token, tls=tls, shared_memory_bytes=0)
    shared_client = courier.Client(courier_address, timeout=120, token=token)

    rows = []
    for prefix, raw_call, jd_client in (("", raw_echo, client), ("TLS ", raw_tls_echo, tls_client)):
        raw_lat, jd_lat = alternating(lambda: raw_call(b"\x00" * 8), lambda: jd_client.echo(1), calls)
        for name, pick, target in [("tiny call p50 (us)", 0.5, "<= 1.1x"), ("tiny call p99 (us)", 0.99, "")]:
            raw_value, jd_value = np.quantile(raw_lat, pick) * 1e6, np.quantile(jd_lat, pick) * 1e6
            rows.append((prefix + name, raw_value, jd_value, jd_value / raw_value, target))
        if not prefix:
            raw_rate, jd_rate = 1 / statistics.mean(raw_lat), 1 / statistics.mean(jd_lat)
            rows.append(("blocking calls/s", raw_rate, jd_rate, jd_rate / raw_rate, ""))
            burst = calls // 10
            raw_bursts, jd_bursts = alternating(futures_burst(lambda: raw_echo.future(b"\x00" * 8), burst),
                                                futures_burst(lambda: client.futures.echo(1), burst),
                                                FUTURES_TRIALS)
            raw_futures, jd_futures = burst / statistics.median(raw_bursts), burst / statistics.median(jd_bursts)
            rows.append(("futures calls/s", raw_futures, jd_futures, jd_futures / raw_futures, ">= 0.9x"))
        for kilobytes, trials in ((128, 200), (1 << 10, 100), (16 << 10, 12), (256 << 10, 3)) if not prefix else \
                ((16 << 10, 12),):
            array = np.ones(kilobytes << 8, np.float32)
            payload = array.tobytes()
            raw_times, jd_times = alternating(lambda: raw_call(payload), lambda: jd_client.echo(array),
                                              trials // repeats_divisor)
            raw_mbs, jd_mbs = (2 * array.nbytes / statistics.median(t) / 1e6 for t in (raw_times, jd_times))
            rows.append((f"{prefix}echo {size_name(kilobytes)} float32 (MB/s)", raw_mbs, jd_mbs, jd_mbs / raw_mbs,
                         ">= 0.8x"))
    shared_client.echo(np.ones(1 << 18, np.float32))  # over the threshold: the client probes its server
    # From the threshold (wire.SHARED_MEMORY_THRESHOLD, 128 KiB) up: where shared memory begins to pay, and how much.
    for kilobytes, trials, target in ((128, 200, ""), (1 << 10, 100, ""), (16 << 10, 40, ">= 5x"), (256 << 10, 4, ">= 5x")):
        array = np.ones(kilobytes << 8, np.float32)
        payload = array.tobytes()
        raw_times, jd_times = alternating(lambda: raw_echo(payload), lambda: shared_client.echo(array),
                                          max(2, trials // repeats_divisor))
        raw_mbs, jd_mbs = (2 * array.nbytes / statistics.median(t) / 1e6 for t in (raw_times, jd_times))
        rows.append((f"shared memory echo {size_name(kilobytes)} (MB/s)", raw_mbs, jd_mbs, jd_mbs / raw_mbs, target))

    print(f"{'metric':36} {'raw grpcio':>12} {'jaxdist':>12} {'ratio':>7}  target")
    for name, raw_value, jd_value, ratio, target in rows:
        print(f"{name:36} {raw_value:12.1f} {jd_value:12.1f} {ratio:7.2f}  {target}")
    print()
    unix_client = courier.Client(unix_address, timeout=120, token=token, shared_memory_bytes=0)
    unix_socket(client, unix_client, calls)
    for done in (client, tls_client, shared_client, unix_client):
        done.close()  # before the servers go: a server's goodbye to a connected client is logged
    parent_end.send("stop")
    child.join()
    print()
    colocated(token, calls)


def size_name(kilobytes: int) -> str:
    return f"{kilobytes} KB" if kilobytes < 1 << 10 else f"{kilobytes >> 10} MB"


def unix_socket(tcp: courier.Client, unix: courier.Client, calls: int) -> None:
    """Courier on 127.0.0.1 against courier on a Unix socket, where the processes launcher binds
    its nodes (no local user can take a socket in a private directory, as one can a port)."""
    rows = []
    tcp_lat, unix_lat = alternating(lambda: tcp.echo(1), lambda: unix.echo(1), calls)
    rows.append(("tiny call p50 (us)", *(np.quantile(t, 0.5) * 1e6 for t in (tcp_lat, unix_lat))))
    burst = calls // 10
    tcp_bursts, unix_bursts = alternating(futures_burst(lambda: tcp.futures.echo(1), burst),
                                          futures_burst(lambda: unix.futures.echo(1), burst), FUTURES_TRIALS)
    rows.append(("futures calls/s", *(burst / statistics.median(t) for t in (tcp_bursts, unix_bursts))))
    array = np.ones(16 << 18, np.float32)
    tcp_times, unix_times = alternating(lambda: tcp.echo(array), lambda: unix.echo(array), 12)
    rows.append(("echo 16 MB float32 (MB/s)", *(2 * array.nbytes / statistics.median(t) / 1e6
                                                 for t in (tcp_times, unix_times))))
    print(f"{'courier, shared memory off':32} {'127.0.0.1':>12} {'unix socket':>12} {'speed-up':>8}")
    for name, tcp_value, unix_value in rows:
        speedup = unix_value / tcp_value if "/s" in name else tcp_value / unix_value
        print(f"{name:32} {tcp_value:12.1f} {unix_value:12.1f} {speedup:7.1f}x")


def colocated(token: str, calls: int) -> None:
    """A node calling another in its own process (a colocation): courier over loopback gRPC, as
    before, against the direct call launchers now make (``Client(local=True)``)."""
    server = courier.Server(Echo(), token=token).start()
    over_grpc = courier.Client(server.address, timeout=120, token=token)
    in_process = courier.Client(server.address, timeout=120, token=token, local=True)
    batch = {"obs": np.ones((16, 33, 4), np.float32), "action": np.ones((16, 33), np.int32),
             "reward": np.ones((16, 33), np.float32)}  # a PPO CartPole batch from its colocated queue
    rows = []
    grpc_lat, local_lat = alternating(lambda: over_grpc.echo(1), lambda: in_process.echo(1), calls)
    rows.append(("tiny call p50 (us)", *(np.quantile(t, 0.5) * 1e6 for t in (grpc_lat, local_lat))))
    grpc_lat, local_lat = alternating(lambda: over_grpc.echo(batch), lambda: in_process.echo(batch), calls // 3)
    rows.append(("PPO batch echo p50 (us)", *(np.quantile(t, 0.5) * 1e6 for t in (grpc_lat, local_lat))))
    array = np.ones(1 << 18, np.float32)
    grpc_times, local_times = alternating(lambda: over_grpc.echo(array), lambda: in_process.echo(array), 50)
    rows.append(("echo 1 MB float32 (MB/s)", *(2 * array.nbytes / statistics.median(t) / 1e6
                                                for t in (grpc_times, local_times))))
    server.stop(0)
    print(f"{'colocated call':32} {'over gRPC':>12} {'local':>12} {'speed-up':>8}")
    for name, grpc_value, local_value in rows:
        speedup = local_value / grpc_value if "MB/s" in name else grpc_value / local_value
        print(f"{name:32} {grpc_value:12.1f} {local_value:12.1f} {speedup:7.1f}x")


if __name__ == "__main__":
    main()
