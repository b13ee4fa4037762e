"""Launchpad's Figure 2: parameter server throughput against the number of requesters.

    python experiments/benchmarks/param_server_scaling.py [--work busy|sleep] [--duration 1.5]

A parameter server whose `get` does 1 ms of work under a lock (a CPU-bound server: a busy loop,
no sleep), served to 1, 2, 4, ... 32 requesters in three topologies, each one program launched
with the processes launcher (every server, cacher and requester host a node process of its own):

* one server: every requester calls the same server; the lock caps it near 1000 QPS;
* partitioned: min(requesters, --max-servers) servers, requesters split among them round-robin;
* cached: one server behind a `CacherNode(refresh_interval=...)`; the server sees about one
  call per refresh interval and the cacher answers the rest from memory.

A requester is a thread in a closed loop (one `get(-1)` in flight, each returning the
parameters); requester threads live in `--requester-processes` nodes, because a process per
requester would only add scheduling noise on a small machine. QPS is printed normalised to one
requester on one server, and plotted to a PNG.

What the numbers mean on a 2-core machine: every process shares two cores, so nothing can go
past the work two cores do. One server stays flat (its lock admits 1 ms of work at a time; the
step from 1 to 2 requesters is the network round trip being overlapped with the work).
Partitioned servers rise with the number of servers only until both cores are busy spinning
(about 2x); `--work sleep` holds the lock without spinning, which shows how partitioning scales
when the work is not competing for the cores the requesters need. The cacher rises with
requesters until the cacher's and requesters' gRPC handling fills the cores; on a many-core
machine each curve keeps its shape further out.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import threading
import time

import numpy as np

import jaxdist as jd
from jaxdist import courier
from jaxdist.nodes.cacher import CacherNode
from jaxdist.nodes.parameter_server import ParameterServer
from jaxdist.records.plotting import line_plot

TOPOLOGIES = ("one server", "partitioned", "cached")


class BusyParameterServer(ParameterServer):
    """A ParameterServer whose `get` first does `work` seconds of work under one lock."""

    def __init__(self, params, work: float, kind: str) -> None:
        super().__init__(params, version=1)
        self._work, self._kind = work, kind
        self._work_lock = threading.Lock()
        self._block = bytes(16384)

    def get(self, min_version: int = -1, wait: float = 0.0) -> dict:
        with self._work_lock:
            end = time.perf_counter() + self._work
            if self._kind == "cpu":  # hashing releases the GIL: the server's other threads go on
                while time.perf_counter() < end:
                    hashlib.sha256(self._block).digest()
            elif self._kind == "spin":  # pure Python: holds the GIL too
                while time.perf_counter() < end:
                    pass
            else:
                time.sleep(self._work)
        return super().get(min_version, wait)


class Requesters:
    """Requester threads in one process; `measure` runs one round and counts completed calls."""

    def __init__(self, targets: list) -> None:
        self._targets = targets

    def measure(self, assignment: list[int], warmup: float, duration: float) -> int:
        """Thread i calls target `assignment[i]` in a loop; calls completed in the window count."""
        start = time.monotonic() + warmup
        end = start + duration
        counts = [0] * len(assignment)

        def loop(slot: int, target) -> None:
            while True:
                target.get(-1)
                now = time.monotonic()
                if now >= end:
                    return
                if now >= start:
                    counts[slot] += 1

        threads = [
            threading.Thread(target=loop, args=(slot, self._targets[index]), daemon=True)
            for slot, index in enumerate(assignment)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(counts)


def make_program(topology: str, args: argparse.Namespace) -> jd.Program:
    params = {"w": np.zeros(args.param_floats, np.float32)}
    server_count = args.max_servers if topology == "partitioned" else 1
    program = jd.Program(f"param-server-{topology.replace(' ', '-')}")
    with program.group("server"):
        servers = [
            program.add_node(
                jd.CourierNode(BusyParameterServer, params, args.work_ms / 1000, args.work).with_server(
                    thread_pool_size=64
                )
            )
            for _ in range(server_count)
        ]
    if topology == "cached":
        with program.group("cacher"):
            servers = [program.add_node(CacherNode(servers[0], refresh_interval=args.refresh_interval))]
    with program.group("requesters"):
        for _ in range(args.requester_processes):
            program.add_node(jd.CourierNode(Requesters, servers))
    return program


def measure_topology(topology: str, args: argparse.Namespace) -> dict[int, float]:
    """QPS by number of requesters, for one launched program."""
    running = jd.launch(make_program(topology, args), launcher="processes", run_dir=os.path.join(args.run_dir, topology.replace(" ", "-")), echo=False)
    try:
        requesters = [
            courier.Client(running.addresses[f"requesters/{i}"], token=running.token, timeout=120)
            for i in range(args.requester_processes)
        ]
        servers = args.max_servers if topology == "partitioned" else 1
        results = {}
        for count in args.requesters:
            used = min(count, servers)
            plans = [[] for _ in requesters]
            for j in range(count):
                plans[j % len(requesters)].append(j % used)
            calls = [
                requester.futures.measure(plan, args.warmup, args.duration)
                for requester, plan in zip(requesters, plans)
                if plan
            ]
            results[count] = sum(call.result() for call in calls) / args.duration
            print(f"  {topology:<12} {count:>3} requesters: {results[count]:8.0f} QPS", flush=True)
        return results
    finally:
        running.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requesters", default="1,2,4,8,16,32", help="comma-separated requester counts")
    parser.add_argument("--work", choices=["cpu", "spin", "sleep"], default="cpu", help="how get() spends its work time")
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--max-servers", type=int, default=8, help="servers of the partitioned topology")
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
    parser.add_argument("--requester-processes", type=int, default=2)
    parser.add_argument("--refresh-interval", type=float, default=0.1, help="the cacher's, in seconds")
    parser.add_argument("--param-floats", type=int, default=1000, help="float32 parameters each get returns")
    parser.add_argument("--duration", type=float, default=1.5, help="seconds measured per point")
    parser.add_argument("--warmup", type=float, default=0.3)
    parser.add_argument("--run-dir", default="runs/param_server_scaling")
    parser.add_argument("--plot", default=None, help="PNG path (default <run-dir>/param_server_scaling.png)")
    args = parser.parse_args()
    args.requesters = [int(n) for n in args.requesters.split(",")]
    os.makedirs(args.run_dir, exist_ok=True)

    began = time.monotonic()
    print(f"get() = {args.work_ms} ms of {args.work} work under a lock; {args.duration} s per point; "
          f"{os.cpu_count()} cores", flush=True)
    topologies = [t for t in TOPOLOGIES if t in args.topologies.split(",")]
    qps = {topology: measure_topology(topology, args) for topology in topologies}
    base = qps["one server"][args.requesters[0]]

    print(f"\nQPS normalised to {args.requesters[0]} requester(s) on one server ({base:.0f} QPS):")
    print(f"{'requesters':>10} | " + " | ".join(f"{t:>11}" for t in topologies))
    for count in args.requesters:
        print(f"{count:>10} | " + " | ".join(f"{qps[t][count] / base:>11.2f}" for t in topologies))

    path = args.plot or os.path.join(args.run_dir, "param_server_scaling.png")
    labels = {"one server": "one server", "partitioned": f"partitioned (up to {args.max_servers})",
              "cached": f"cached ({args.refresh_interval:g} s)"}
    line_plot(
        path,
        {labels[t]: (args.requesters, [qps[t][n] / base for n in args.requesters]) for t in topologies},
        title=f"Parameter server, {args.work_ms:g} ms {args.work} get",
        xlabel="requesters",
        ylabel="QPS / QPS(1 requester, 1 server)",
    )
    print(f"\nplot: {path}   ({time.monotonic() - began:.0f} s in all)")


if __name__ == "__main__":
    main()
