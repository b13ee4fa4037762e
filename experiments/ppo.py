"""PPO across local processes (the jaxdist demo: CartPole-v1), or on any gymnasium env.

A learner (with the FIFO replay queue colocated in its process) runs data-parallel PPO updates
and serves its parameters; actors step vector envs with a jitted policy and send trajectories
to the queue; an evaluator plays the deterministic policy on fresh episodes every few updates.
Every field of ``PPOConfig`` is a flag (``--help``); ``--env-id`` picks the env's preset of
tuned defaults first (CartPole-v1, Pendulum-v1, HalfCheetah-v5).

    python experiments/ppo.py                                   # CartPole-v1, 1 actor x 16 envs
    python experiments/ppo.py --stop-at-target                  # stop once the evaluation hits 475
    python experiments/ppo.py --env-id Pendulum-v1              # continuous actions
    python experiments/ppo.py --env-id my_envs:Maze-v0 --network my_nets:torso   # your own

Everything lands in runs/ppo-<env>-seed<seed>/ (--run-dir): config.json, logs/, metrics.csv,
progress.csv, tensorboard/, learning_curve.png, summary.json, checkpoints/. Running the same
command again resumes; --fresh starts over. ``python -m jaxdist.tools.evaluate RUN_DIR`` plays the
trained policy.
"""

from __future__ import annotations

import time

START = time.time()  # the clock starts before the imports: start-up counts

from jaxdist.agents import ppo, run  # noqa: E402

if __name__ == "__main__":
    run.main(ppo.agent, ppo.PPOConfig, ppo.PRESETS, __doc__, START)
