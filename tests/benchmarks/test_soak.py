"""The soak benchmark's readings: its slope within lives and the threads it counts.

A soak kills its nodes every few minutes, so a growth within one life has a few minutes of
samples to show in; these tests hold what lets it show there and nothing else does: one slope
fitted over every life at once, and thread counts without the workers that come and go with a
checkpoint save.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from waiting import wait_until

SOAK_PATH = Path(__file__).resolve().parents[2] / "experiments" / "benchmarks" / "soak.py"
spec = importlib.util.spec_from_file_location("soak_benchmark", SOAK_PATH)
soak = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look their module up
spec.loader.exec_module(soak)

LIVES, LIFE_MINUTES, EVERY, WARMUP = 6, 5.0, 0.5, 2.0  # the soak's defaults: learner kills every 5 min


def lives(growth_per_minute: float, seed: int = 0, noise: float = 1.0, base: float = 40.0) -> "soak.Series":
    """A node restarted every LIFE_MINUTES whose reading grows by `growth_per_minute` in each
    life and moves by up to `noise`, at random, between samples (by one thread: a pool's worker
    coming and going; by a few MiB: resident memory on a loaded machine)."""
    rng = np.random.default_rng(seed)
    series = soak.Series()
    for life in range(LIVES):
        for step in range(int(LIFE_MINUTES / EVERY)):
            age = step * EVERY
            wobble = rng.integers(0, 2) if noise == 1.0 else rng.uniform(-noise, noise)
            series.add(life * LIFE_MINUTES + age, base + growth_per_minute * age + wobble, life)
    return series


def test_a_count_that_only_moves_by_a_thread_is_flat_within_lives():
    bound = soak.BOUNDS["threads"]
    for seed in range(5):
        assert lives(0.0, seed).life_slope(WARMUP) < bound, f"seed {seed}"


def test_a_count_that_grows_in_every_life_is_caught_though_the_restarts_hide_it_across_lives():
    series = lives(0.5)
    assert series.life_slope(WARMUP) > soak.BOUNDS["threads"]
    assert series.slope(WARMUP) < soak.BOUNDS["threads"]  # each restart starts it again from 40


def test_memory_that_leaks_twice_its_bound_is_caught_in_five_minute_lives_and_flat_memory_is_not():
    # Resident memory settled (the nodes' glibc arenas capped) moves by up to 2 MiB between
    # samples; three settled minutes a life, six lives. A leak at the bound itself is a coin's
    # toss for any fit of this noise (one and a half times it is caught in 19 of these 20 draws);
    # twice it, in each.
    bound = soak.BOUNDS["rss_mib"]
    for seed in range(20):
        assert lives(0.0, seed, noise=2.0, base=525.0).life_slope(WARMUP) < bound, f"seed {seed}"
        assert lives(2 * bound, seed, noise=2.0, base=525.0).life_slope(WARMUP) > bound, f"seed {seed}"


CHILD = f"""
import sys, threading
release, named = threading.Event(), threading.Event()

def pool_worker():  # named as tensorstore names its workers
    with open(f"/proc/self/task/{{threading.get_native_id()}}/comm", "w") as comm:
        comm.write({soak.TENSORSTORE_POOL!r})
    named.set()
    release.wait()

threads = [threading.Thread(target=release.wait), threading.Thread(target=pool_worker)]
print("ready", flush=True)
sys.stdin.readline()
for thread in threads:
    thread.start()
named.wait()
print("started", flush=True)
sys.stdin.readline()
release.set()
for thread in threads:
    thread.join()
print("ended", flush=True)
sys.stdin.readline()
"""


class Child:
    """A child process of its own that runs `script` a stage at a time, each on a line of its
    stdin, and says which stage it reached: this test process's threads and descriptors come and
    go with the tests beside it."""

    def __init__(self, script: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.pid = self.process.pid

    def step(self, expected: str) -> None:
        if expected != "ready":
            self.process.stdin.write("go\n")
            self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == expected

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait()


def test_threads_count_from_their_second_sample_and_tensorstores_pool_apart():
    with Child(CHILD) as child:
        seen = {}
        child.step("ready")
        first, pool = soak.lasting_threads(child.pid, seen)
        assert (first, pool) == (len(os.listdir(f"/proc/{child.pid}/task")), 0)  # a first sample: every thread
        child.step("started")
        assert soak.lasting_threads(child.pid, seen) == (first, 1)  # the new thread has not lived a sample period
        assert soak.lasting_threads(child.pid, seen) == (first + 1, 1)  # now it has: a leaked thread would count
        child.step("ended")  # joined, though the kernel may list a thread a moment longer
        wait_until(lambda: soak.lasting_threads(child.pid, seen) == (first, 0), "the threads' end to show")


DESCRIPTORS = """
import os, socket, sys
print("ready", flush=True)
sys.stdin.readline()
read_end, write_end = os.pipe()
print("opened", flush=True)
sys.stdin.readline()
reconnected = socket.socket()
os.dup2(reconnected.fileno(), read_end)  # the same number, another socket: a reconnection
print("replaced", flush=True)
sys.stdin.readline()
os.close(read_end)
os.close(write_end)
reconnected.close()
print("closed", flush=True)
sys.stdin.readline()
"""


def test_descriptors_count_from_their_second_sample_on_the_same_file():
    with Child(DESCRIPTORS) as child:
        seen = {}
        child.step("ready")
        first = soak.lasting_fds(child.pid, seen)
        assert first == len(os.listdir(f"/proc/{child.pid}/fd"))  # a first sample: every descriptor
        child.step("opened")
        assert soak.lasting_fds(child.pid, seen) == first  # a pipe opened since the last sample
        assert soak.lasting_fds(child.pid, seen) == first + 2  # held over a sample period: a leak would count
        child.step("replaced")
        assert soak.lasting_fds(child.pid, seen) == first + 2 - 1  # one number, another socket
        child.step("closed")
        assert soak.lasting_fds(child.pid, seen) == first
