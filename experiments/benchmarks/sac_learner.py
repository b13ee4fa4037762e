"""SAC's learner fed by its replay node against SAC's bare jitted update loop (updates/s, ratio),
as ``learner.py`` measures Ape-X's.

    python experiments/benchmarks/sac_learner.py [--steps 1000] [--rounds 5] [--steps-per-call 1 8]
    python experiments/benchmarks/sac_learner.py --env-id HalfCheetah-v5 --steps-per-call 8

Both run SAC's update with the env's preset (Pendulum-v1: batch 256, 2x64 MLPs; HalfCheetah-v5:
batch 256, 2x256 MLPs) on transitions of a uniform table of 20,000 transitions of the env's
shapes:
* baseline: ``jax.jit(update, donate_argnums=0)`` in a plain Python loop over 16 samples drawn
  once (cycled): the loop no learner can beat, with no replay in it;
* jaxdist: ``Learner.run()`` whose source is a ``ReplayNode`` serving the ``Uniform`` table as a
  thread of this process (as the Sebulba topology colocates it), for each ``--steps-per-call``:
  every dispatch's batches sampled in one request and fetched ahead (``prefetch=2``),
  parameters published every 8 updates and metrics written every 200, as the preset does.
Rounds alternate the two after a warm-up that compiles each; each side's figure is its best
round (this shared machine only ever slows a round down).
"""

from __future__ import annotations

import argparse
import datetime

import numpy as np
from learner import replay_fed_updates_per_second  # this directory's: Ape-X's rows are measured the same way
from results import add_commit_argument, commit, machine  # this directory's: the commit and machine measured


def transitions(size: int, obs_shape: tuple[int, ...], actions: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.normal(size=(size, *obs_shape)).astype(np.float32),
            "action": rng.uniform(-1, 1, size=(size, actions)).astype(np.float32),
            "reward": rng.normal(size=size).astype(np.float32), "discount": np.full(size, 0.99, np.float32),
            "next_obs": rng.normal(size=(size, *obs_shape)).astype(np.float32)}


def measure(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    import jaxdist as jd
    from jaxdist.agents import sac
    from jaxdist.agents.experiment import with_preset
    from jaxdist.agents.sac import learning
    from jaxdist.envs.spaces import env_info

    config = with_preset(sac.SACConfig, args.env_id, sac.PRESETS, update_batch=args.batch)
    info, size = env_info(args.env_id), 20_000
    rows = replay_fed_updates_per_second(learning.logic(config, info), jd.replay.Uniform(size, seed=0),
                                         transitions(size, info.obs_shape, info.action.shape[-1]), config,
                                         args.steps_per_call, args.steps, args.rounds)
    return [(f"SAC updates/s, replay node, steps_per_call {k}", bare, ours) for k, bare, ours in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env-id", default="Pendulum-v1", help="the env whose preset and shapes the update has")
    ap.add_argument("--steps", type=int, default=1_000, help="updates per timed round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps-per-call", type=int, nargs="+", default=[1, 8])
    add_commit_argument(ap)
    args = ap.parse_args()
    measured_at = commit(args.commit)  # before the runs: a copy of the tree without git fails now
    rows = measure(args)
    print(f"`python experiments/benchmarks/sac_learner.py --env-id {args.env_id} --steps {args.steps} --rounds {args.rounds} --batch "
          f"{args.batch}` at commit `{measured_at}` on {datetime.date.today()} ({machine()}); "
          f"baseline = SAC's jitted update in a Python loop on pre-drawn samples")
    print(f"{'metric':44} {'baseline':>10} {'jaxdist':>10} {'ratio':>6}  target")
    for name, base, ours in rows:
        print(f"{name:44} {base:10.1f} {ours:10.1f} {ours / base:6.2f}  >= 0.80")


if __name__ == "__main__":
    main()
