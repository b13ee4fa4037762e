"""PBT against the same population trained without exploitation, in the same run of this script.

    python experiments/benchmarks/pbt.py [--population 8] [--total-steps 400000] [--repetitions 3] [--eval-every 1]

Pendulum-v1 under Anakin (its preset), a population of ``--population`` members drawn from the
same ranges with the same seed (so the same initial hyperparameters and parameters), trained
twice: with PBT (truncation, perturb, every ``--interval`` updates) and with ``--pbt-exploit
none``. The figure is env steps per member to an evaluation return of ``--target``: PBT's when
its best member first reaches it, the baseline's the median member's (a member that never does
counts as never); beside them PBT's median member and the baseline's best. Both arms are evaluated
every ``--eval-every`` updates (by default every update, so that members crossing between two
exploit steps are told apart). Repetitions use seeds 0, 1, ...; each one's row is printed as it
ends.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import tempfile

import numpy as np
from results import commit  # this directory's: the commit measured, +changes where the code differs

RANGES = ("learning_rate=1e-4:3e-3:log", "gae_lambda=0.8:0.99", "clip_eps=0.1:0.3")


def steps_to(run_dir: str, members: int, target: float) -> list[float]:
    """Each member's env steps to its first evaluation at ``target`` (inf: never)."""
    from jaxdist.nodes.evaluator import recorded_evaluations

    rows = recorded_evaluations(run_dir)
    return [next((row["env_steps"] for row in rows if row[f"seed/{m}/mean_return"] >= target), np.inf)
            for m in range(members)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--population", type=int, default=8)
    parser.add_argument("--total-steps", type=int, default=400_000, help="env steps per member")
    parser.add_argument("--interval", type=int, default=10, help="updates between exploit steps")
    parser.add_argument("--target", type=float, default=-200.0)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--eval-every", type=int, default=1, help="updates between evaluations (both arms)")
    args = parser.parse_args()

    from jaxdist.agents import ppo, run
    from jaxdist.agents.experiment import with_preset

    root = tempfile.mkdtemp(prefix="jaxdist-bench-pbt-")
    print(f"Measured by `experiments/benchmarks/pbt.py --population {args.population} --total-steps "
          f"{args.total_steps} --interval {args.interval} --repetitions {args.repetitions} --eval-every "
          f"{args.eval_every}` at commit `{commit()}` on {datetime.date.today()} ({os.cpu_count()} cores)\n")
    print(f"| seed | PBT: env steps per member to {args.target:g} | no exploitation: the median member's | ratio | "
          f"PBT's median member | no exploitation's best member |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |", flush=True)
    for seed in range(args.repetitions):
        base = with_preset(ppo.PPOConfig, "Pendulum-v1", ppo.PRESETS, architecture="anakin", seed=seed,
                           total_steps=args.total_steps, sweep=RANGES, pbt=args.population,
                           pbt_interval=args.interval, eval_every_updates=args.eval_every)
        found = {}
        for exploit in ("truncation", "none"):
            run_dir = os.path.join(root, f"seed{seed}-{exploit}")
            run.train(ppo.agent(dataclasses.replace(base, pbt_exploit=exploit)), launcher="processes",
                      run_dir=run_dir, echo=False, out=open(os.devnull, "w"))
            found[exploit] = steps_to(run_dir, args.population, args.target)
        pbt, baseline = min(found["truncation"]), float(np.median(found["none"]))
        print(f"| {seed} | {pbt:,.0f} | {baseline:,.0f} | {baseline / pbt:.2f} | "
              f"{np.median(found['truncation']):,.0f} | {min(found['none']):,.0f} |", flush=True)


if __name__ == "__main__":
    main()
