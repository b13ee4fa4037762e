"""Replay items/s across processes, each beside its limits measured in the same run.

    python experiments/benchmarks/replay.py [--quick]

A child process serves a ``ReplayNode`` (tables ``uniform`` and ``prioritized``, 200,000 items
each, the default ``MinSize(1)`` limiter) and a courier echo server; the calls come from this
process through ``ReplayClient``. Items are small: one CartPole transition, 44 bytes
(``obs``, ``action``, ``reward``, ``discount``, ``next_obs``). Each row is one kind of call with
its items per call, in items/s:

* table: the same call on a table in this process (no RPC): what the replay's own work costs;
* echo: a courier call moving the same bytes (the request's, and the answer's for samples):
  the transport floor no replay call can beat;
* node: the call to the replay node.

Trials of echo and node take turns (this 2-core machine is shared); each figure is a median.
The target for small items is >= 20k items/s inserted and sampled per replay node.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from typing import Any, Callable

import numpy as np

import jaxdist as jd
from jaxdist import courier
from jaxdist.nodes.replay import Prioritized, ReplayClient, Uniform

CAPACITY = 200_000


def transitions(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.normal(size=(n, 4)).astype(np.float32), "action": rng.integers(0, 2, n).astype(np.int32),
            "reward": rng.normal(size=n).astype(np.float32), "discount": np.full(n, 0.99, np.float32),
            "next_obs": rng.normal(size=(n, 4)).astype(np.float32)}


def one(batch: dict[str, np.ndarray], i: int) -> dict[str, np.ndarray]:
    return {name: leaf[i] for name, leaf in batch.items()}


class Echo:
    """The transport floor: ``echo`` sends the request back; ``answer(n)`` sends a sample-sized answer."""

    def __init__(self) -> None:
        self._answers: dict[int, dict] = {}

    def echo(self, value: Any) -> Any:
        return value

    def answer(self, n: int) -> dict:
        if n not in self._answers:
            self._answers[n] = {"keys": np.arange(n, dtype=np.int64), "data": transitions(n),
                                "probabilities": np.full(n, 1.0 / n)}
        return self._answers[n]


def serve(pipe: Any) -> None:
    """Child process: the replay node (a threads launch) and the echo server, until told to stop."""
    program = jd.Program("bench-replay")
    program.add_node(jd.ReplayNode({"uniform": Uniform(CAPACITY), "prioritized": Prioritized(CAPACITY)}),
                     label="replay")
    running = jd.launch(program, launcher="threads", echo=False)
    echo = courier.Server(Echo(), token=running.token).start()
    pipe.send((running.addresses["replay/0"], echo.address, running.token))
    pipe.recv()
    echo.stop(0)
    running.stop()


def rate(call: Callable[[], Any], items: int, calls: int) -> float:
    began = time.perf_counter()
    for _ in range(calls):
        call()
    return items * calls / (time.perf_counter() - began)


def measure(echo: Callable[[], Any], node: Callable[[], Any], items: int, calls: int,
            trials: int) -> tuple[float, float]:
    """Median items/s of echo and node, their trials taking turns after one warm-up each."""
    echo(), node()
    rates: tuple[list[float], list[float]] = ([], [])
    for _ in range(trials):
        rates[0].append(rate(echo, items, calls))
        rates[1].append(rate(node, items, calls))
    return statistics.median(rates[0]), statistics.median(rates[1])


def measured_rows(replay: ReplayClient, echo: courier.Client, trials: int, seconds_scale: float) -> list[tuple]:
    """``(call, table items/s, echo items/s, node items/s, target)`` for each kind of call."""
    local = {"uniform": Uniform(CAPACITY), "prioritized": Prioritized(CAPACITY)}
    fill = transitions(CAPACITY, seed=1)
    for name in local:  # full tables: sampling and evicting as in a long run
        for start in range(0, CAPACITY, 20_000):
            chunk = {key: leaf[start:start + 20_000] for key, leaf in fill.items()}
            replay.insert_batch(chunk, table=name)
            local[name].insert_batch(chunk)

    rows = []

    def row(name: str, items: int, calls: int, table_call: Callable[[], Any], echo_call: Callable[[], Any],
            node_call: Callable[[], Any], target: str = "") -> None:
        calls = max(1, int(calls * seconds_scale))
        table_call()
        in_process = statistics.median(rate(table_call, items, calls) for _ in range(3))
        floor, node = measure(echo_call, node_call, items, calls, trials)
        rows.append((name, in_process, floor, node, target))

    item = one(transitions(1), 0)
    row("insert, 1 item a call", 1, 1000, lambda: local["uniform"].insert(item),
        lambda: echo.echo(item), lambda: replay.insert(item, table="uniform"))
    sixteen = [one(transitions(16), i) for i in range(16)]
    row("insert_many, 16 items a call", 16, 300, lambda: local["uniform"].insert_many(sixteen),
        lambda: echo.echo(sixteen), lambda: replay.insert_many(sixteen, table="uniform"))
    for table in ("uniform", "prioritized"):
        for n in (256, 4096):
            batch, priorities = transitions(n, seed=n), np.ones(n)
            weights = {"priorities": priorities} if table == "prioritized" else {}
            row(f"insert_batch {table}, {n} items a call", n, 40_000 // n,
                lambda: local[table].insert_batch(batch, **weights),
                lambda: echo.echo(batch), lambda: replay.insert_batch(batch, table=table, **weights),
                ">= 20k")
    for table in ("uniform", "prioritized"):
        for n in (32, 1024):
            row(f"sample {table}, {n} items a call", n, max(20, 40_000 // n),
                lambda: local[table].sample(n), lambda: echo.answer(n),
                lambda: replay.sample(n, table=table), ">= 20k" if n > 32 else "")
    new = np.random.default_rng(2).uniform(0.1, 2, 1024)  # for live keys: sampled ones
    local_keys, keys = local["prioritized"].sample(1024).keys, replay.sample(1024, table="prioritized")["keys"]
    row("update_priorities, 1024 keys a call", 1024, 40,
        lambda: local["prioritized"].update_priorities(local_keys, new),
        lambda: echo.echo((keys, new)), lambda: replay.update_priorities(keys, new, table="prioritized"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    args = parser.parse_args()
    trials, seconds_scale = (3, 0.25) if args.quick else (7, 1.0)

    parent_end, child_end = multiprocessing.get_context("spawn").Pipe()
    child = multiprocessing.get_context("spawn").Process(target=serve, args=(child_end,))
    child.start()
    try:
        replay_address, echo_address, token = parent_end.recv()
        rows = measured_rows(ReplayClient(courier.Client(replay_address, token=token, timeout=120)),
                             courier.Client(echo_address, token=token, timeout=120), trials, seconds_scale)
    finally:
        parent_end.send("stop")
        child.join()
    print(f"{'items/s':44} {'table':>10} {'echo':>10} {'node':>10} {'node/echo':>9}  target")
    for name, in_process, floor, node, target in rows:
        print(f"{name:44} {in_process:10.0f} {floor:10.0f} {node:10.0f} {node / floor:9.2f}  {target}")


if __name__ == "__main__":
    main()
