"""R2D2 across local processes, on CartPoleNoVel-v1 by default (CartPole without its
velocities: a task that needs memory) or any gymnasium env with discrete actions.

A learner (with the prioritized sequence replay colocated in its process) unrolls the LSTM
Q-network over sampled sequences from their stored states, after a burn-in, learns n-step
double-Q targets through the value rescaling and writes the sequences' new priorities back;
N actors explore as Ape-X's (epsilon 0.4^(1 + 7 i / (N - 1))), carry each env's LSTM state and
insert overlapping sequences with their initial priorities; an evaluator plays the greedy
policy. Every field of ``R2D2Config`` is a flag (``--help``).

    python experiments/r2d2.py                            # CartPoleNoVel-v1, 2 actors x 8 envs
    python experiments/r2d2.py --stop-at-target           # stop once the evaluation hits 475

Everything lands in runs/r2d2-<env>-seed<seed>/ (--run-dir); running the same command again
resumes; --fresh starts over.
"""

from __future__ import annotations

import time

START = time.time()  # the clock starts before the imports: start-up counts

from jaxdist.agents import r2d2, run  # noqa: E402

if __name__ == "__main__":
    run.main(r2d2.agent, r2d2.R2D2Config, r2d2.PRESETS, __doc__, START)
