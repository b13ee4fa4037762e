"""PPO on CartPole-v1 across local processes: the jaxdist demo.

A learner (with the FIFO replay queue colocated in its process) runs data-parallel PPO updates
and serves its parameters; actors step vector envs with a jitted policy and send trajectories
to the queue. A progress line shows env steps, env steps/s, the mean return of the last 20
episodes across actors, the learner's version, the policy lag and restarts.

    python experiments/ppo_cartpole.py                        # 2 actors x 8 envs, 500k env steps
    python experiments/ppo_cartpole.py --stop-at-target       # stop once the mean return hits 475
    python experiments/ppo_cartpole.py --launcher threads --num-actors 1 --total-steps 100000

On several hosts, the same command on each (README: "Running on several hosts"), e.g. a learner
spanning two machines, each with its own actors:

    JAXDIST_TOKEN=secret python experiments/ppo_cartpole.py --launcher multihost --learner-hosts 2 \
        --hosts m0,m1 --host-index 0        # and --host-index 1 on m1

Everything lands in runs/<name>/ (--run-dir): logs/ (one log per node), metrics.csv (the
learner: losses, policy lag, ...), progress.csv and tensorboard/ (env steps, return, steps/s),
learning_curve.png, summary.json, checkpoints/. Running again with the same --run-dir resumes
from the learner's latest checkpoint; --fresh starts over.
"""

from __future__ import annotations

import time

START = time.time()  # the clock starts before the imports: start-up counts

import argparse  # noqa: E402

from jaxdist.agents import cli  # noqa: E402
from jaxdist.agents.ppo import PPOConfig, builder, train  # noqa: E402


def parse_args() -> argparse.Namespace:
    defaults = PPOConfig()
    parser = cli.parser(__doc__, num_actors=defaults.num_actors, total_steps=defaults.total_steps, target_return=475.0)
    parser.add_argument("--envs-per-actor", type=int, default=defaults.envs_per_actor)
    parser.add_argument("--env-backend", choices=["auto", "vector", "sync", "async", "envpool"],
                        default=defaults.env_backend)
    parser.add_argument("--trajectory-length", type=int, default=defaults.trajectory_length)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument("--minibatches", type=int, default=defaults.minibatches)
    parser.add_argument("--max-policy-lag", type=int, default=defaults.max_policy_lag)
    parser.add_argument("--checkpoint-every", type=int, default=defaults.checkpoint_every_updates,
                        help="learner updates between checkpoints")
    parser.add_argument("--learner-hosts", type=int, default=defaults.learner_hosts,
                        help="learner processes, one per host, as one jax.distributed learner (multihost)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    config = PPOConfig(num_actors=args.num_actors, envs_per_actor=args.envs_per_actor, total_steps=args.total_steps,
                       seed=args.seed, env_backend=args.env_backend, trajectory_length=args.trajectory_length,
                       learning_rate=args.learning_rate, epochs=args.epochs, minibatches=args.minibatches,
                       max_policy_lag=args.max_policy_lag, learner_hosts=args.learner_hosts,
                       checkpoint_every_updates=args.checkpoint_every)
    cli.train_and_report(args, "ppo", config, train, START, builder.placement(config))


if __name__ == "__main__":
    main()
