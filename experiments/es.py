"""OpenAI-ES (Salimans et al. 2017) on CartPole-v1 or Pendulum-v1 across local processes.

A master node runs the generations: it maps tasks of noise seeds over the evaluator nodes
(``--num-actors``: ES's actors) with futures through ``jd.Pool``, which re-queues the task of
an evaluator that dies; evaluators regenerate the noise from the seeds, run the antithetic
perturbations as one jitted batch of episodes of the env's JAX port, and send back only the
fitnesses. The master steps the mean parameters along the rank-shaped gradient estimate with
Adam and scores the mean policy on 20 episodes (the target is confirmed on gymnasium's env).

    python experiments/es.py --env CartPole-v1 --stop-at-target     # mean return >= 475
    python experiments/es.py --env Pendulum-v1 --stop-at-target     # mean return >= -200
    python experiments/es.py --launcher threads --num-actors 1 --seed 2
    JAXDIST_TOKEN=secret python experiments/es.py --launcher multihost --hosts h0,h1 --host-index 0  # on h0

Everything lands in runs/es-<env>-seed<seed>/ (--run-dir): logs/ (one log per node),
progress.csv and tensorboard/ (one row per generation: env steps, mean-policy return, ...),
learning_curve.png, summary.json, checkpoints/master/. Running again with the same --run-dir
resumes from the master's latest checkpoint; --fresh starts over.
"""

from __future__ import annotations

import time

START = time.time()  # the clock starts before the imports: start-up counts

import argparse  # noqa: E402

from jaxdist.agents import cli  # noqa: E402
from jaxdist.agents.es import ESConfig, builder, train  # noqa: E402
from jaxdist.agents.es.config import ENV_DEFAULTS  # noqa: E402


def parse_args() -> argparse.Namespace:
    known = argparse.ArgumentParser(add_help=False)
    known.add_argument("--env", choices=sorted(ENV_DEFAULTS), default="CartPole-v1")
    defaults = ESConfig(env_id=known.parse_known_args()[0].env)  # the env sets total steps and target
    parser = cli.parser(__doc__, num_actors=defaults.num_evaluators, total_steps=defaults.total_steps,
                        target_return=defaults.target_return)
    parser.add_argument("--env", choices=sorted(ENV_DEFAULTS), default="CartPole-v1")
    parser.add_argument("--population", type=int, default=defaults.population,
                        help="perturbations per generation (antithetic pairs: half as many)")
    parser.add_argument("--sigma", type=float, default=defaults.sigma)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--optimizer", choices=["adam", "sgd"], default=defaults.optimizer)
    parser.add_argument("--weight-decay", type=float, default=defaults.weight_decay)
    parser.add_argument("--episodes-per-member", type=int, default=defaults.episodes_per_member)
    parser.add_argument("--pairs-per-task", type=int, default=defaults.pairs_per_task)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    config = ESConfig(env_id=args.env, seed=args.seed, num_evaluators=args.num_actors, total_steps=args.total_steps,
                      target_return=args.target_return, stop_at_target=args.stop_at_target,
                      population=args.population, sigma=args.sigma, learning_rate=args.learning_rate,
                      optimizer=args.optimizer, weight_decay=args.weight_decay,
                      episodes_per_member=args.episodes_per_member, pairs_per_task=args.pairs_per_task)
    run_dir = cli.prepare_run_dir(args, "es", config.env_id)
    summary = train(config, launcher=args.launcher, run_dir=run_dir, start_time=START,
                    compilation_cache=args.compilation_cache or None, echo=not args.quiet,
                    launch_options=cli.launch_options(args, builder.placement()))
    cli.report(summary, config.target_return, run_dir)


if __name__ == "__main__":
    main()
