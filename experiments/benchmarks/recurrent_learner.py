"""The recurrent PPO learner's update against a bare jitted loop of the same update.

    python experiments/benchmarks/recurrent_learner.py [--steps 100] [--rounds 6]

Updates/s of PPO with an LSTM core (CartPoleNoVel-v1's preset: 16 trajectories of 32 steps, an
LSTM of 64 units over a 64-unit torso, 10 epochs of 4 minibatches of whole trajectories, each
unrolled from its stored state), on the same host batches (cycled, episodes ending inside them),
fed to
* baseline: ``jax.jit(update, donate_argnums=0)`` in a plain Python loop;
* jaxdist: the learner node's own loop, ``Learner.run()``, in this process, the batches read by
  its feeder thread, parameters published and metrics written every 50 updates.
Rounds alternate the two after a warm-up that compiles both; each side's figure is its best
round, the median of the per-round ratios beside. The table ends with the command, the commit,
the date and the machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from learner import Cycle, paired_rounds  # noqa: E402  (the feed-forward learner benchmark's batch source and rounds)
from results import commit, machine  # noqa: E402

ENV_ID = "CartPoleNoVel-v1"


def make_batches(config, count: int) -> list[dict]:
    """CartPole-shaped trajectories with episodes ending about every 20 rows."""
    from jaxdist.agents.recurrent import initial_carry

    rng = np.random.default_rng(0)
    b, rows = config.batch_size, config.trajectory_length + 1
    batches = []
    for _ in range(count):
        terminated = rng.random((b, rows)) < 0.05
        first = np.zeros((b, rows), bool)
        first[:, 1:] = terminated[:, :-1]
        carry = initial_carry(config.core, config.core_size, b)
        batches.append({"obs": rng.normal(size=(b, rows, 4)).astype(np.float32),
                        "action": rng.integers(0, 2, (b, rows)).astype(np.int32),
                        "reward": np.ones((b, rows), np.float32), "terminated": terminated,
                        "truncated": np.zeros((b, rows), bool), "first": first,
                        "logp": np.full((b, rows), np.log(0.5), np.float32), "version": np.zeros((b, rows), np.int32),
                        "core_state": tuple(np.asarray(x) for x in carry)})
    return batches


def updates_per_second(args: argparse.Namespace) -> dict:
    import jax

    from jaxdist.agents.experiment import with_preset
    from jaxdist.agents.ppo import PPOConfig, PRESETS, learning
    from jaxdist.envs.spaces import env_info
    from jaxdist.nodes.learner import Learner, PublishOptions

    config = with_preset(PPOConfig, ENV_ID, PRESETS, max_policy_lag=1_000_000)
    logic = learning.logic(config, env_info(ENV_ID))
    batches = make_batches(config, 8)
    bare = jax.jit(logic.update, donate_argnums=0)
    key = jax.random.key(1)
    state = logic.init(jax.random.key(0))

    def baseline(steps: int) -> float:
        nonlocal state
        began = time.perf_counter()
        for i in range(steps):
            state, _ = bare(state, batches[i % len(batches)], key)
        jax.block_until_ready(state)
        return steps / (time.perf_counter() - began)

    learner = Learner(logic, Cycle(batches), max_steps=args.steps, publishing=PublishOptions(every=50, log_every=50),
                      run_dir=tempfile.mkdtemp(prefix="jaxdist-bench-recurrent-"), name="learner", prefetch=2)
    return {**paired_rounds(baseline, learner, args.steps, args.rounds), "config": config}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100, help="updates per timed round")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    result = updates_per_second(args)
    config = result["config"]
    print(f"recurrent PPO update ({config.core} {config.core_size} over mlp {config.hidden}; {config.batch_size} "
          f"trajectories x {config.trajectory_length} steps; {config.epochs} epochs x {config.minibatches} "
          f"minibatches of trajectories)")
    print(f"{'metric':30} {'baseline':>10} {'jaxdist':>10} {'ratio':>6}")
    print(f"{'updates/s (best round)':30} {result['baseline']:10.1f} {result['jaxdist']:10.1f} {result['ratio']:6.2f}"
          f"  (median of rounds {result['median_ratio']:.2f})")
    print(f"`python experiments/benchmarks/recurrent_learner.py --steps {args.steps} --rounds {args.rounds}` at "
          f"commit {commit()} on {datetime.date.today()} ({machine()})")


if __name__ == "__main__":
    main()
