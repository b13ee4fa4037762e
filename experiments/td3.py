"""TD3 across local processes, on Pendulum-v1 by default or any gymnasium env with continuous
(Box) actions.

A learner (with the replay colocated in its process) runs TD3 updates (twin critics, target
policy smoothing, the policy and targets updated every --policy-delay critic updates) on
transitions sampled from the replay, ``--replay-ratio`` updates per env step; actors step
vector envs with the deterministic policy plus Gaussian noise of their own scale
(--exploration-noise up to --exploration-noise-max across actors; uniform random actions until
learning starts) and insert n-step transitions; an evaluator plays the policy without noise.
Every field of ``TD3Config`` is a flag (``--help``).

    python experiments/td3.py                    # Pendulum-v1, 20k env steps
    python experiments/td3.py --stop-at-target   # stop once the evaluation hits -200

Everything lands in runs/td3-<env>-seed<seed>/ (--run-dir); running the same command again
resumes from the learner's checkpoint and the replay's; --fresh starts over.
"""

from __future__ import annotations

import time

START = time.time()  # the clock starts before the imports: start-up counts

from jaxdist.agents import run, td3  # noqa: E402

if __name__ == "__main__":
    run.main(td3.agent, td3.TD3Config, td3.PRESETS, __doc__, START)
