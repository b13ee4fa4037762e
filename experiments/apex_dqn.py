"""Ape-X DQN across local processes, on CartPole-v1 by default or any gymnasium env with
discrete actions.

A learner (with the prioritized replay colocated in its process) runs double-DQN updates on
prioritized samples, writes the sampled transitions' new priorities back and serves its
parameters; N actors, actor i exploring with epsilon 0.4^(1 + 7 i / (N - 1)), step vector envs
with a jitted epsilon-greedy policy and insert n-step transitions with priorities computed
from their own Q-values; an evaluator plays the greedy policy every 1,000 updates. Every
field of ``ApexConfig`` is a flag (``--help``).

    python experiments/apex_dqn.py                        # 2 actors x 8 envs, 400k env steps
    python experiments/apex_dqn.py --stop-at-target       # stop once the evaluation hits 475

Everything lands in runs/apex-<env>-seed<seed>/ (--run-dir); running the same command again
resumes from the learner's checkpoint and the replay's (--replay-checkpoint-seconds); --fresh
starts over.
"""

from __future__ import annotations

import time

START = time.time()  # the clock starts before the imports: start-up counts

from jaxdist.agents import apex, run  # noqa: E402

if __name__ == "__main__":
    run.main(apex.agent, apex.ApexConfig, apex.PRESETS, __doc__, START)
