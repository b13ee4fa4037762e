"""Ape-X DQN on CartPole-v1 across local processes.

A learner (with the prioritized replay colocated in its process) runs double-DQN updates on
prioritized samples, writes the sampled transitions' new priorities back and serves its
parameters; N actors, actor i exploring with epsilon 0.4^(1 + 7 i / (N - 1)), step vector envs
with a jitted epsilon-greedy policy and insert n-step transitions with priorities computed
from their own Q-values. The progress line's return is the mean of the last 20 episodes of the
two greediest actors (epsilons ~ 0.006 and ~ 0.0007), which stand in for an evaluation.

    python experiments/apex_dqn.py                        # 4 actors x 4 envs, 400k env steps
    python experiments/apex_dqn.py --stop-at-target       # stop once the mean return hits 475
    python experiments/apex_dqn.py --launcher threads --total-steps 50000

Everything lands in runs/<name>/ (--run-dir, default runs/apex-cartpole-seed<seed>): logs/,
metrics.csv (the learner: loss, Q, |TD|, priorities), progress.csv and tensorboard/,
learning_curve.png, summary.json, checkpoints/. Running again with the same --run-dir resumes
from the learner's latest checkpoint and the replay's (--replay-checkpoint-seconds); --fresh
starts over.
"""

from __future__ import annotations

import time

START = time.time()  # the clock starts before the imports: start-up counts

import argparse  # noqa: E402

from jaxdist.agents import cli  # noqa: E402
from jaxdist.agents.apex import ApexConfig, train  # noqa: E402


def parse_args() -> argparse.Namespace:
    defaults = ApexConfig()
    parser = cli.parser(__doc__, num_actors=defaults.num_actors, total_steps=defaults.total_steps, target_return=475.0)
    parser.add_argument("--envs-per-actor", type=int, default=defaults.envs_per_actor)
    parser.add_argument("--env-backend", choices=["auto", "vector", "sync", "async", "envpool"],
                        default=defaults.env_backend)
    parser.add_argument("--n-step", type=int, default=defaults.n_step)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--samples-per-insert", type=float, default=defaults.samples_per_insert)
    parser.add_argument("--target-update-period", type=int, default=defaults.target_update_period)
    parser.add_argument("--replay-checkpoint-seconds", type=float, default=defaults.replay_checkpoint_seconds,
                        help="save the replay this often and at a stop (0: do not save it)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    config = ApexConfig(num_actors=args.num_actors, envs_per_actor=args.envs_per_actor, total_steps=args.total_steps,
                        seed=args.seed, env_backend=args.env_backend, n_step=args.n_step,
                        learning_rate=args.learning_rate, batch_size=args.batch_size,
                        samples_per_insert=args.samples_per_insert, target_update_period=args.target_update_period,
                        replay_checkpoint_seconds=args.replay_checkpoint_seconds or None)
    cli.train_and_report(args, "apex", config, train, START)


if __name__ == "__main__":
    main()
