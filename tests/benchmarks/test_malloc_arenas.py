"""The malloc-arenas benchmark runs an agent both ways and prints its table against glibc's default."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_arenas_benchmark_runs_the_agent_both_ways_and_rates_jaxdists_default_against_glibcs():
    done = subprocess.run([sys.executable, os.path.join(REPO, "experiments", "benchmarks", "malloc_arenas.py"),
                           "--agent", "ppo", "--total-steps", "1024", "--runs", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row[0].strip() for row in rows[1:]] == ["glibc's default (MALLOC_ARENA_MAX=0)",
                                                    "jaxdist's default (2 arenas)"]
    assert [cell.strip() for cell in rows[1][4:]] == ["1.00x"] * 3  # the baseline's own ratios
    assert all(float(cell.replace(",", "")) > 0 for row in rows[1:] for cell in row[1:4])
