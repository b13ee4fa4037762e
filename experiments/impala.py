"""IMPALA (V-trace) across local processes, on CartPole-v1 by default or any gymnasium env.

A learner (with the FIFO replay queue colocated in its process) takes one SGD step per batch of
unrolls and serves its parameters; actors step vector envs with the newest parameters they
hold, never waiting for the learner's next version, and send unrolls with their behaviour
log-probs, from which the learner's V-trace corrects for the policy lag; an evaluator plays the
deterministic policy every few updates. Every field of ``IMPALAConfig`` is a flag (``--help``);
``--env-id`` picks the env's preset first (CartPole-v1, Acrobot-v1, Pendulum-v1).

    python experiments/impala.py                                # CartPole, 4 actors x 8 envs
    python experiments/impala.py --env-id Acrobot-v1 --stop-at-target

Everything lands in runs/impala-<env>-seed<seed>/ (--run-dir); running the same command again
resumes, --fresh starts over.
"""

from __future__ import annotations

import time

START = time.time()  # the clock starts before the imports: start-up counts

from jaxdist.agents import impala, run  # noqa: E402

if __name__ == "__main__":
    run.main(impala.agent, impala.IMPALAConfig, impala.PRESETS, __doc__, START)
