"""MapReduce word count (Launchpad paper, listings 5 and 9).

A coordinator splits a corpus into shards and sends each to a mapper with futures; mappers count
words and partition the counts by key among the reducers; reducers sum their partitions. The
coordinator checks the total against a single-process count and stops the program.

    python experiments/mapreduce_wordcount.py --launcher processes --num-mappers 4 --num-reducers 2
"""

from __future__ import annotations

import argparse
import collections
import random
import threading
import zlib

import jaxdist as jd


def partition_of(word: str, num_partitions: int) -> int:
    """A stable partition (Python's hash() differs from process to process)."""
    return zlib.crc32(word.encode()) % num_partitions


class Mapper:
    def __init__(self, num_partitions: int) -> None:
        self._num_partitions = num_partitions

    def map(self, lines: list[str]) -> list[dict[str, int]]:
        partitions: list[collections.Counter] = [collections.Counter() for _ in range(self._num_partitions)]
        for line in lines:
            for word in line.lower().split():
                partitions[partition_of(word, self._num_partitions)][word] += 1
        return [dict(counts) for counts in partitions]


class Reducer:
    """Courier serves calls on a pool of threads, and Counter.update is a read-modify-write loop
    in Python: without the lock, two mappers' partitions arriving together lose counts."""

    def __init__(self) -> None:
        self._counts: collections.Counter = collections.Counter()
        self._lock = threading.Lock()

    def reduce(self, counts: dict[str, int]) -> None:
        with self._lock:
            self._counts.update(counts)

    def result(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class Coordinator:
    def __init__(self, mappers: list, reducers: list, lines: list[str], shard_size: int) -> None:
        self._mappers, self._reducers = mappers, reducers
        self._lines, self._shard_size = lines, shard_size

    def run(self) -> None:
        shards = [self._lines[i:i + self._shard_size] for i in range(0, len(self._lines), self._shard_size)]
        mapped = [self._mappers[i % len(self._mappers)].futures.map(shard) for i, shard in enumerate(shards)]
        reduced = []
        for future in mapped:
            for reducer, counts in zip(self._reducers, future.result()):
                reduced.append(reducer.futures.reduce(counts))
        for future in reduced:
            future.result()
        totals: collections.Counter = collections.Counter()
        for reducer in self._reducers:
            totals.update(reducer.result())
        expected = collections.Counter(word for line in self._lines for word in line.lower().split())
        print(f"{len(shards)} shards, {sum(totals.values())} words, {len(totals)} distinct", flush=True)
        print("top words:", totals.most_common(5), flush=True)
        print("matches a single-process count:", totals == expected, flush=True)
        jd.stop()


def synthetic_corpus(num_lines: int, seed: int) -> list[str]:
    """Zipf-like text made here, so the example needs no download."""
    vocabulary = [f"w{i}" for i in range(2000)]
    weights = [1.0 / (rank + 1) for rank in range(len(vocabulary))]
    rng = random.Random(seed)
    return [" ".join(rng.choices(vocabulary, weights, k=12)) for _ in range(num_lines)]


def make_program(num_mappers: int, num_reducers: int, lines: list[str], shard_size: int) -> jd.Program:
    program = jd.Program("mapreduce_wordcount")
    with program.group("mapper"):
        mappers = [program.add_node(jd.CourierNode(Mapper, num_reducers)) for _ in range(num_mappers)]
    with program.group("reducer"):
        reducers = [program.add_node(jd.CourierNode(Reducer)) for _ in range(num_reducers)]
    with program.group("coordinator"):
        program.add_node(jd.CourierNode(Coordinator, mappers, reducers, lines, shard_size))
    return program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launcher", choices=["threads", "processes"], default="processes")
    parser.add_argument("--num-mappers", type=int, default=4)
    parser.add_argument("--num-reducers", type=int, default=2)
    parser.add_argument("--input", help="a text file to count (default: a synthetic corpus)")
    parser.add_argument("--lines", type=int, default=20000, help="lines of synthetic corpus")
    parser.add_argument("--shard-size", type=int, default=1000)
    parser.add_argument("--run-dir", default=None)
    args = parser.parse_args()
    if args.input:
        with open(args.input, encoding="utf-8") as text:
            lines = text.read().splitlines()
    else:
        lines = synthetic_corpus(args.lines, seed=0)
    program = make_program(args.num_mappers, args.num_reducers, lines, args.shard_size)
    jd.launch(program, launcher=args.launcher, run_dir=args.run_dir).wait()


if __name__ == "__main__":
    main()
