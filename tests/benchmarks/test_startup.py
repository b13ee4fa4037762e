"""The start-up benchmark runs and prints its table: spawn's row, the forkserver's and its first fork."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_startup_benchmark_times_both_ways_of_starting_a_node_process():
    done = subprocess.run([sys.executable, os.path.join(REPO, "experiments", "benchmarks", "startup.py"), "--starts", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row[0].strip() for row in rows[1:]] == [
        "spawn (baseline)", "fork of the preloaded forkserver",
        "the first fork: the forkserver's own start and imports, once per launching process"]
    spawn, fork = (float(row[2]) for row in rows[1:3])
    assert spawn > 0 and fork > 0
    assert rows[1][4].strip() == "1.00x"
