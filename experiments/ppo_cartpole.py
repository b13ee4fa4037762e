"""PPO on CartPole-v1 across local processes: the jaxdist demo.

A learner (with the FIFO replay queue colocated in its process) runs data-parallel PPO updates
and serves its parameters; actors step vector envs with a jitted policy and send trajectories
to the queue. A progress line shows env steps, env steps/s, the mean return of the last 20
episodes across actors, the learner's version, the policy lag and restarts.

    python experiments/ppo_cartpole.py                        # 2 actors x 8 envs, 500k env steps
    python experiments/ppo_cartpole.py --stop-at-target       # stop once the mean return hits 475
    python experiments/ppo_cartpole.py --launcher threads --num-actors 1 --total-steps 100000

Everything lands in runs/<name>/ (--run-dir): logs/ (one log per node), metrics.csv (the
learner: losses, policy lag, ...), progress.csv and tensorboard/ (env steps, return, steps/s),
learning_curve.png, summary.json, checkpoints/. Running again with the same --run-dir resumes
from the learner's latest checkpoint; --fresh starts over.
"""

from __future__ import annotations

import time

START = time.time()  # the clock starts before the imports: start-up counts

import argparse  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402

from jaxdist.agents.ppo import PPOConfig, train  # noqa: E402


def parse_args() -> argparse.Namespace:
    defaults = PPOConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launcher", choices=["threads", "processes"], default="processes")
    parser.add_argument("--num-actors", type=int, default=defaults.num_actors)
    parser.add_argument("--envs-per-actor", type=int, default=defaults.envs_per_actor)
    parser.add_argument("--total-steps", type=int, default=defaults.total_steps,
                        help="env steps the learner learns from (sets its number of updates)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--run-dir", default=None, help="default: runs/ppo-cartpole-seed<seed>")
    parser.add_argument("--fresh", action="store_true", help="delete the run directory's checkpoints first")
    parser.add_argument("--env-backend", choices=["auto", "vector", "sync", "async", "envpool"],
                        default=defaults.env_backend)
    parser.add_argument("--trajectory-length", type=int, default=defaults.trajectory_length)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument("--minibatches", type=int, default=defaults.minibatches)
    parser.add_argument("--max-policy-lag", type=int, default=defaults.max_policy_lag)
    parser.add_argument("--target-return", type=float, default=475.0,
                        help="the mean return (last 20 episodes) whose first crossing is timed")
    parser.add_argument("--stop-at-target", action="store_true", help="stop as soon as the target is reached")
    parser.add_argument("--compilation-cache", default=os.path.expanduser("~/.cache/jaxdist/jax"),
                        help="JAX's persistent compilation cache ('' to turn it off)")
    parser.add_argument("--quiet", action="store_true", help="do not echo the nodes' output")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    config = PPOConfig(num_actors=args.num_actors, envs_per_actor=args.envs_per_actor, total_steps=args.total_steps,
                       seed=args.seed, env_backend=args.env_backend, trajectory_length=args.trajectory_length,
                       learning_rate=args.learning_rate, epochs=args.epochs, minibatches=args.minibatches,
                       max_policy_lag=args.max_policy_lag)
    run_dir = args.run_dir or os.path.join("runs", f"ppo-cartpole-seed{args.seed}")
    if args.fresh:
        shutil.rmtree(os.path.join(run_dir, "checkpoints"), ignore_errors=True)
    summary = train(config, launcher=args.launcher, run_dir=run_dir, target_return=args.target_return,
                    stop_at_target=args.stop_at_target, start_time=START,
                    compilation_cache=args.compilation_cache or None, echo=not args.quiet)
    if summary["stop_reason"] == "the run had already finished":
        return
    if summary["wall_time_to_target"] is not None:
        print(f"reached mean return {args.target_return:g} after {summary['wall_time_to_target']:.1f} s "
              f"(start-up included) and {summary['steps_to_target']:,} env steps")
    else:
        print(f"did not reach mean return {args.target_return:g}; last mean return {summary['final_return']}")
    rate = summary["steps_per_second"]
    print(f"{summary['env_steps']:,} env steps in {summary['wall_time']:.1f} s; steady throughput "
          f"{'-' if rate is None else f'{rate:,}'} env steps/s; {summary['stop_reason']}; results in {run_dir}")


if __name__ == "__main__":
    main()
