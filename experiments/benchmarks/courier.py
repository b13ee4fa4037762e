"""Courier against raw grpcio, measured in the same run on this machine.

The servers run in a child process (nodes are processes), the clients here. Raw grpcio is the
floor courier is built on: a generic handler moving bytes in and out, with the same message
limits. Latency is a tiny call; throughput is blocking calls and futures; bandwidth is an echo
of a float32 array (counted both ways) against an echo of the same number of raw bytes.

    python experiments/benchmarks/courier.py [--quick]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from concurrent import futures
from typing import Callable

import grpc
import numpy as np

from jaxdist import courier

RAW_LIMIT = 1 << 30
RAW_OPTIONS = [("grpc.max_send_message_length", RAW_LIMIT), ("grpc.max_receive_message_length", RAW_LIMIT)]


class Echo:
    def echo(self, value):
        return value


def _raw_echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    return request


def serve(addresses: "multiprocessing.connection.Connection") -> None:
    """Child process: a raw grpcio echo server and a courier echo server, until told to stop."""
    raw = grpc.server(futures.ThreadPoolExecutor(16), options=RAW_OPTIONS + [("grpc.so_reuseport", 0)])
    raw.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("raw", {"echo": grpc.unary_unary_rpc_method_handler(_raw_echo)})]
    )
    raw_port = raw.add_insecure_port("127.0.0.1:0")
    raw.start()
    server = courier.Server(Echo()).start()
    addresses.send((f"127.0.0.1:{raw_port}", server.address))
    addresses.recv()
    server.stop(0)
    raw.stop(0)


def paired_latencies(
    baseline: Callable[[], object], candidate: Callable[[], object], count: int
) -> tuple[list[float], list[float]]:
    """Latencies of the two calls taken alternately, so both see the same machine load."""
    for _ in range(min(200, count)):
        baseline()
        candidate()
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(count):
        for call, into in ((baseline, samples[0]), (candidate, samples[1])):
            began = time.perf_counter()
            call()
            into.append(time.perf_counter() - began)
    return samples


def futures_per_second(submit: Callable[[], object], count: int, window: int = 64) -> float:
    """Calls/s with up to `window` futures in flight."""
    began = time.perf_counter()
    pending = []
    for _ in range(count):
        pending.append(submit())
        if len(pending) >= window:
            pending.pop(0).result()
    for future in pending:
        future.result()
    return count / (time.perf_counter() - began)


def bandwidth(call: Callable[[], object], nbytes: int, repeats: int) -> float:
    """MB/s of an echo round trip, counting the payload both ways; best of `repeats`."""
    call()
    best = min(_timed(call) for _ in range(repeats))
    return 2 * nbytes / best / 1e6


def _timed(call: Callable[[], object]) -> float:
    began = time.perf_counter()
    call()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    args = parser.parse_args()
    calls = 500 if args.quick else 3000
    repeats = 1 if args.quick else 3

    parent_end, child_end = multiprocessing.get_context("spawn").Pipe()
    child = multiprocessing.get_context("spawn").Process(target=serve, args=(child_end,))
    child.start()
    raw_address, courier_address = parent_end.recv()
    channel = grpc.insecure_channel(raw_address, options=RAW_OPTIONS)
    raw_echo = channel.unary_unary("/raw/echo")
    client = courier.Client(courier_address, timeout=120)

    rows = []
    tiny = np.float32(1.0)
    raw_lat, jd_lat = paired_latencies(lambda: raw_echo(b"\x00" * 8), lambda: client.echo(tiny), calls)
    for name, pick in [("tiny call p50 (us)", 0.5), ("tiny call p99 (us)", 0.99)]:
        raw_value = np.quantile(raw_lat, pick) * 1e6
        jd_value = np.quantile(jd_lat, pick) * 1e6
        rows.append((name, raw_value, jd_value, jd_value / raw_value, "<= 1.15x" if pick == 0.5 else ""))
    raw_rate, jd_rate = 1 / statistics.mean(raw_lat), 1 / statistics.mean(jd_lat)
    rows.append(("blocking calls/s", raw_rate, jd_rate, jd_rate / raw_rate, ""))
    raw_futures = futures_per_second(lambda: raw_echo.future(b"\x00" * 8), calls)
    jd_futures = futures_per_second(lambda: client.futures.echo(tiny), calls)
    rows.append(("futures calls/s", raw_futures, jd_futures, jd_futures / raw_futures, ">= 0.9x"))
    for megabytes in (1, 16, 256):
        array = np.ones(megabytes << 18, np.float32)
        payload = array.tobytes()
        raw_mbs = bandwidth(lambda: raw_echo(payload), array.nbytes, repeats)
        jd_mbs = bandwidth(lambda: client.echo(array), array.nbytes, repeats)
        rows.append((f"echo {megabytes} MB float32 (MB/s)", raw_mbs, jd_mbs, jd_mbs / raw_mbs, ">= 0.8x"))

    parent_end.send("stop")
    child.join()
    print(f"{'metric':32} {'raw grpcio':>12} {'jaxdist':>12} {'ratio':>7}  target")
    for name, raw_value, jd_value, ratio, target in rows:
        print(f"{name:32} {raw_value:12.1f} {jd_value:12.1f} {ratio:7.2f}  {target}")


if __name__ == "__main__":
    main()
