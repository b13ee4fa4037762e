"""Starting a node's process: forked from the preloaded forkserver, against spawned.

    python experiments/benchmarks/startup.py [--starts 8]

What the processes launcher pays for every node process it starts, restarts or adds: the time
from ``start()`` until the child has taken its inheritance (environment, streams, JAX's config)
and imported what a PPO learner's process imports (the worker, the learner and actor nodes,
the agent), and the CPU the child spent on it. The baseline, measured in the same run and
interleaved start by start, is multiprocessing's spawn: what the launcher did before, and
still does inside a Ray actor. The forkserver's own start (its imports, once per launching
process, paid by its first fork) is a row of its own.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import multiprocessing.connection
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jaxdist.launch import node_processes  # noqa: E402  (imports nothing heavy)
from results import commit, machine  # noqa: E402

NODE_MODULES = ["jaxdist.launch.worker", "jaxdist.nodes.learner", "jaxdist.nodes.actor", "jaxdist.agents.ppo"]


def child(conn: multiprocessing.connection.Connection, inheritance: node_processes.Inheritance) -> None:
    inheritance.take()
    for module in NODE_MODULES:
        importlib.import_module(module)
    times = os.times()
    conn.send(times.user + times.system)
    conn.close()


def start(method: str) -> tuple[float, float]:
    """Seconds from start() to the child's word, and the CPU seconds the child spent."""
    context = node_processes.context(method)
    parent_end, child_end = context.Pipe()
    began = time.monotonic()
    process = context.Process(target=child, args=(child_end, node_processes.Inheritance.now({})))
    process.start()
    child_end.close()
    cpu = parent_end.recv()
    wall = time.monotonic() - began
    process.join()
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=8, help="processes started each way")
    args = parser.parse_args()
    first_fork, _ = start("forkserver")
    runs: dict[str, list[tuple[float, float]]] = {"spawn": [], "forkserver": []}
    for _ in range(args.starts):
        for method in runs:
            runs[method].append(start(method))
    print(f"experiments/benchmarks/startup.py --starts {args.starts} at commit `{commit()}` on "
          f"{datetime.date.today()} ({machine()})\n")
    print("| node process started by | processes | wall, start to ready (median s) | child CPU (median s) "
          "| wall / spawn's |")
    print("| --- | ---: | ---: | ---: | ---: |")
    spawn_wall = statistics.median(wall for wall, _ in runs["spawn"])
    for method, label in (("spawn", "spawn (baseline)"), ("forkserver", "fork of the preloaded forkserver")):
        wall, cpu = (statistics.median(values) for values in zip(*runs[method]))
        print(f"| {label} | {args.starts} | {wall:.3f} | {cpu:.3f} | {wall / spawn_wall:.2f}x |")
    print(f"| the first fork: the forkserver's own start and imports, once per launching process | 1 | "
          f"{first_fork:.3f} | | {first_fork / spawn_wall:.2f}x |")


if __name__ == "__main__":
    main()
