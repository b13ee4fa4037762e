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


def lives(growth_per_minute: float, seed: int = 0) -> "soak.Series":
    """A node restarted every LIFE_MINUTES whose thread count grows by `growth_per_minute` in
    each life and moves by one thread, at random, between samples (a pool's worker coming and
    going)."""
    rng = np.random.default_rng(seed)
    series = soak.Series()
    for life in range(LIVES):
        for step in range(int(LIFE_MINUTES / EVERY)):
            age = step * EVERY
            series.add(life * LIFE_MINUTES + age, 40 + growth_per_minute * age + rng.integers(0, 2), life)
    return series


def test_a_count_that_only_moves_by_a_thread_is_flat_within_lives():
    bound = soak.BOUNDS["threads"]
    for seed in range(5):
        assert lives(0.0, seed).life_slope(WARMUP) < bound, f"seed {seed}"


def test_a_count_that_grows_in_every_life_is_caught_though_the_restarts_hide_it_across_lives():
    series = lives(0.5)
    assert series.life_slope(WARMUP) > soak.BOUNDS["threads"]
    assert series.slope(WARMUP) < soak.BOUNDS["threads"]  # each restart starts it again from 40


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


def test_threads_count_from_their_second_sample_and_tensorstores_pool_apart():
    # A child of its own: this test process's threads come and go with the tests beside it.
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def step(expected: str) -> None:
        if expected != "ready":
            child.stdin.write("go\n")
            child.stdin.flush()
        assert child.stdout.readline().strip() == expected

    try:
        seen = {}
        step("ready")
        first, pool = soak.lasting_threads(child.pid, seen)
        assert (first, pool) == (len(os.listdir(f"/proc/{child.pid}/task")), 0)  # a first sample: every thread
        step("started")
        assert soak.lasting_threads(child.pid, seen) == (first, 1)  # the new thread has not lived a sample period
        assert soak.lasting_threads(child.pid, seen) == (first + 1, 1)  # now it has: a leaked thread would count
        step("ended")  # joined, though the kernel may list a thread a moment longer
        wait_until(lambda: soak.lasting_threads(child.pid, seen) == (first, 0), "the threads' end to show")
    finally:
        child.kill()
        child.wait()
