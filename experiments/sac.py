"""Soft Actor-Critic across local processes, on Pendulum-v1 by default or any gymnasium env with
continuous (Box) actions.

A learner (with the replay colocated in its process) runs SAC updates (twin critics with
Polyak-averaged targets, a tanh-squashed Gaussian policy, its temperature tuned to a target
entropy) on transitions sampled from the replay, ``--replay-ratio`` updates per env step;
actors step vector envs, sample the policy (uniform random actions until learning starts) and
insert n-step transitions; an evaluator plays the policy's mean. Every field of ``SACConfig``
is a flag (``--help``).

    python experiments/sac.py                                  # Pendulum-v1, 20k env steps
    python experiments/sac.py --stop-at-target                 # stop once the evaluation hits -200
    python experiments/sac.py --architecture anakin --num-seeds 8   # all in JAX, 8 seeds vmapped

Everything lands in runs/sac-<env>-seed<seed>/ (--run-dir); running the same command again
resumes from the learner's checkpoint and the replay's; --fresh starts over.
"""

from __future__ import annotations

import time

START = time.time()  # the clock starts before the imports: start-up counts

from jaxdist.agents import run, sac  # noqa: E402

if __name__ == "__main__":
    run.main(sac.agent, sac.SACConfig, sac.PRESETS, __doc__, START)
