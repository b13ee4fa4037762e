"""IMPALA (V-trace) on CartPole-v1 or Acrobot-v1 across local processes.

A learner (with the FIFO replay queue colocated in its process) takes one SGD step per batch of
unrolls and serves its parameters; actors step vector envs with the newest parameters they
hold, never waiting for the learner's next version, and send unrolls with their behaviour
logits, from which the learner's V-trace corrects for the policy lag. A progress line shows env
steps, env steps/s, the mean return of the last 20 episodes across actors, the learner's
version, the policy lag and restarts.

    python experiments/impala.py                                # CartPole, 4 actors x 8 envs
    python experiments/impala.py --env Acrobot-v1 --stop-at-target
    python experiments/impala.py --launcher threads --num-actors 1 --total-steps 100000

On several hosts, the same command on each (README: "Running on several hosts"): the learner
runs on host 0, the actors round-robin over the hosts:

    JAXDIST_TOKEN=secret python experiments/impala.py --launcher multihost --hosts m0,m1 --host-index 0

The target return defaults to 475 on CartPole-v1 and -100 on Acrobot-v1. Everything lands in
runs/impala-<env>-seed<seed>/ (--run-dir): logs/ (one log per node), metrics.csv (the learner:
losses, importance weights, policy lag, ...), progress.csv and tensorboard/ (env steps, return,
steps/s), learning_curve.png, summary.json, checkpoints/. Running again with the same --run-dir
resumes from the learner's latest checkpoint; --fresh starts over.
"""

from __future__ import annotations

import time

START = time.time()  # the clock starts before the imports: start-up counts

import argparse  # noqa: E402

from jaxdist.agents import cli  # noqa: E402
from jaxdist.agents.impala import IMPALAConfig, builder, train  # noqa: E402

TARGETS = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0}


def parse_args() -> argparse.Namespace:
    defaults = IMPALAConfig()
    parser = cli.parser(__doc__, num_actors=defaults.num_actors, total_steps=defaults.total_steps,
                        target_return=TARGETS[defaults.env_id])
    parser.set_defaults(target_return=None)  # the env's, below
    parser.add_argument("--env", choices=sorted(TARGETS), default=defaults.env_id)
    parser.add_argument("--envs-per-actor", type=int, default=defaults.envs_per_actor)
    parser.add_argument("--env-backend", choices=["auto", "vector", "sync", "async", "envpool"],
                        default=defaults.env_backend)
    parser.add_argument("--trajectory-length", type=int, default=defaults.trajectory_length)
    parser.add_argument("--batch-trajectories", type=int, default=defaults.batch_trajectories)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--ent-coef", type=float, default=defaults.ent_coef)
    args = parser.parse_args()
    if args.target_return is None:
        args.target_return = TARGETS[args.env]
    return args


def main() -> None:
    args = parse_args()
    config = IMPALAConfig(env_id=args.env, num_actors=args.num_actors, envs_per_actor=args.envs_per_actor,
                          total_steps=args.total_steps, seed=args.seed, env_backend=args.env_backend,
                          trajectory_length=args.trajectory_length, batch_trajectories=args.batch_trajectories,
                          learning_rate=args.learning_rate, ent_coef=args.ent_coef)
    cli.train_and_report(args, "impala", config, train, START, builder.placement(config))


if __name__ == "__main__":
    main()
