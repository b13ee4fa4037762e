"""Node processes with two glibc malloc arenas, against glibc's default.

    python experiments/benchmarks/malloc_arenas.py [--agent r2d2] [--total-steps 150000] [--runs 3]

Node processes run with ``MALLOC_ARENA_MAX=2`` unless their environment sets it
(``jaxdist.launch.node_processes``). This runs an agent's script to a fixed number of env steps,
alternating run by run between that default and glibc's (``MALLOC_ARENA_MAX=0``: eight arenas
per core), and prints a table of the env steps and the learner's updates per second over the
whole run and the peak memory of the run's process tree (its proportional set sizes, as the peers table measures it),
each the mean over the runs, with the ratio to glibc's default. The default's effect on a long life's memory is the
soak's (``soak.py``); this shows what it costs in speed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import measure  # noqa: E402
from results import REPO, commit, machine  # noqa: E402

SETTINGS = {"glibc's default (MALLOC_ARENA_MAX=0)": "0", "jaxdist's default (2 arenas)": "2"}


def run(agent: str, total_steps: int, arenas: str) -> dict[str, float]:
    """One run of the agent's script: its env steps and updates per second, and its tree's peak memory."""
    with tempfile.TemporaryDirectory(prefix="jaxdist-arenas-") as run_dir:
        command = [sys.executable, os.path.join(REPO, "experiments", f"{agent}.py"), "--quiet", "--run-dir", run_dir,
                   "--total-steps", str(total_steps)]
        _, peak, _ = measure(command, REPO, dict(os.environ, MALLOC_ARENA_MAX=arenas))
        with open(os.path.join(run_dir, "summary.json")) as file:
            summary = json.load(file)
    seconds = summary["wall_time"]
    return {"env steps/s": summary["env_steps"] / seconds, "updates/s": summary["learner_version"] / seconds,
            "peak MiB": peak / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", default="r2d2", help="a script of experiments/ (a replay's allocations: r2d2)")
    parser.add_argument("--total-steps", type=int, default=150_000)
    parser.add_argument("--runs", type=int, default=3, help="runs of each setting, alternating")
    args = parser.parse_args()
    measured: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    for index in range(args.runs):
        order = list(SETTINGS) if index % 2 == 0 else list(reversed(SETTINGS))  # neither always first
        for name in order:
            measured[name].append(run(args.agent, args.total_steps, SETTINGS[name]))
            print(f"run {index + 1}, {name}: {measured[name][-1]}", flush=True)
    columns = ["env steps/s", "updates/s", "peak MiB"]
    baseline = {column: statistics.mean(r[column] for r in measured[next(iter(SETTINGS))]) for column in columns}
    print(f"\n`python experiments/benchmarks/malloc_arenas.py --agent {args.agent} --total-steps {args.total_steps} "
          f"--runs {args.runs}` at commit `{commit()}` on {datetime.date.today()} ({machine()}); mean of "
          f"{args.runs} runs each, alternating.\n")
    print("| node processes | " + " | ".join(columns) + " | " + " | ".join(f"{c} / glibc's" for c in columns) + " |")
    print("| --- " * (1 + 2 * len(columns)) + "|")
    for name, rows in measured.items():
        means = {column: statistics.mean(r[column] for r in rows) for column in columns}
        print(f"| {name} | " + " | ".join(f"{means[c]:,.1f}" for c in columns) + " | "
              + " | ".join(f"{means[c] / baseline[c]:.2f}x" for c in columns) + " |")


if __name__ == "__main__":
    main()
