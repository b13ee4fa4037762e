"""A sweep in one Anakin run against its runs one after another, in the same run of this script.

    python experiments/benchmarks/sweep.py [--total-steps 20480] [--measured 32] [--picture docs/images/sweep.png]

16 PPO configurations (learning rate x clip range x GAE lambda) x 2 seeds on CartPole-v1, the
Anakin preset (16 envs, T = 32):
* sweep: one program, ``--sweep`` over the three fields and ``--num-seeds 2``: 32 runs in one
  learner and one compilation;
* one after another: each configuration and seed its own program, as ``experiments/ppo.py`` runs
  it. All 32 are run and timed, or the first ``--measured`` of them, whose mean wall time x 32
  then stands for all 32 (said so in the table), as they differ in float values only.
Both launch with the processes launcher, without the persistent compilation cache (every one of
the 32 programs differs in a constant baked into it, so each would miss it anyway), wall time
from the launch to the program's end, start-up and compilation included.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import shutil
import tempfile
import time

from results import add_commit_argument, commit, machine  # this directory's: the commit and machine measured

GRID = {"learning_rate": (3e-4, 1e-3, 3e-3, 1e-2), "clip_eps": (0.1, 0.2), "gae_lambda": (0.8, 0.95)}
SEEDS = 2


def timed(config: object, run_dir: str) -> tuple[float, dict]:
    from jaxdist.agents import ppo, run

    began = time.perf_counter()
    summary = run.train(ppo.agent(config), launcher="processes", run_dir=run_dir, echo=False,
                        out=open(os.devnull, "w"))
    return time.perf_counter() - began, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-steps", type=int, default=20_480, help="env steps per run")
    parser.add_argument("--measured", type=int, default=32, help="runs of the 32 timed one after another")
    parser.add_argument("--picture", help="copy the sweep's picture (sweep.png: each configuration's mean curve) here")
    add_commit_argument(parser)
    args = parser.parse_args()
    measured_at = commit(args.commit)  # before the runs: the tree they measure, and a copy without git fails now

    import dataclasses

    from jaxdist.agents import ppo, sweep
    from jaxdist.agents.experiment import with_preset

    base = with_preset(ppo.PPOConfig, "CartPole-v1", ppo.PRESETS, architecture="anakin",
                       total_steps=args.total_steps)
    specs = tuple(f"{name}={','.join(map(str, values))}" for name, values in GRID.items())
    swept = dataclasses.replace(base, sweep=specs, num_seeds=SEEDS)
    runs = len(sweep.configurations(swept)) * SEEDS
    root = tempfile.mkdtemp(prefix="jaxdist-bench-sweep-")
    sweep_seconds, _ = timed(swept, os.path.join(root, "sweep"))
    table = sweep.summarize(os.path.join(root, "sweep"), swept)
    alone = []
    combos = [dict(zip(GRID, values)) for values in itertools.product(*GRID.values())]
    for index, (values, seed) in enumerate(itertools.product(combos, range(SEEDS))):
        if index == args.measured:
            break
        seconds, _ = timed(dataclasses.replace(base, seed=seed, **values), os.path.join(root, f"alone-{index}"))
        alone.append(seconds)
    one_after_another = sum(alone) / len(alone) * runs
    print(f"Measured by `experiments/benchmarks/sweep.py --total-steps {args.total_steps} --measured {args.measured}` "
          f"at commit `{measured_at}` on {datetime.date.today()} ({machine()}, processes launcher)\n")
    scaled = "" if len(alone) == runs else f"; their mean x {runs}"
    print(f"| {runs} runs of PPO CartPole-v1 ({args.total_steps:,} env steps each) | wall time (s) | runs/min |")
    print("| --- | ---: | ---: |")
    print(f"| one after another ({len(alone)} measured: {', '.join(f'{s:.1f}' for s in alone)} s{scaled}) | "
          f"{one_after_another:.1f} | {runs / one_after_another * 60:.1f} |")
    print(f"| one sweep under Anakin (one learner, one compilation) | {sweep_seconds:.1f} | "
          f"{runs / sweep_seconds * 60:.1f} |")
    print(f"\nratio: the sweep is {one_after_another / sweep_seconds:.1f}x faster\n")
    print(sweep.format_table(table, SEEDS))
    if args.picture:
        shutil.copyfile(os.path.join(root, "sweep", sweep.SWEEP_PLOT), args.picture)
    print(f"\nthe runs are in {root}")


if __name__ == "__main__":
    main()
