"""OpenAI-ES (Salimans et al. 2017) on CartPole-v1 or Pendulum-v1 across local processes.

A master node runs the generations: it maps tasks of noise seeds over the worker nodes
(``--num-workers``: ES's actors) with futures through ``jd.Pool``, which re-queues the task of a
worker that dies; workers regenerate the noise from the seeds, run the antithetic perturbations
as one jitted batch of episodes of the env's JAX port, and send back only the fitnesses. The
master steps the mean parameters along the rank-shaped gradient estimate with Adam and scores
the mean policy on 20 fresh episodes: the evaluation return. Every field of ``ESConfig`` is a
flag (``--help``); ``--env-id`` picks the env's preset first.

    python experiments/es.py --stop-at-target                        # CartPole-v1: mean return >= 475
    python experiments/es.py --env-id Pendulum-v1 --stop-at-target   # mean return >= -200
    python experiments/es.py --launcher threads --num-workers 1 --seed 2
    JAXDIST_TOKEN=secret python experiments/es.py --launcher multihost --hosts h0,h1 --host-index 0  # on h0

Everything lands in runs/es-<env>-seed<seed>/ (--run-dir), as for the other agents: config.json,
logs/, metrics.csv (a row per generation), evaluations.csv, progress.csv, tensorboard/,
learning_curve.png, summary.json, checkpoints/master/. Running the same command again resumes
from the master's latest checkpoint; --fresh starts over.
"""

from __future__ import annotations

import time

START = time.time()  # the clock starts before the imports: start-up counts

from jaxdist.agents import es, run  # noqa: E402

if __name__ == "__main__":
    run.main(es.agent, es.ESConfig, es.PRESETS, __doc__, START)
