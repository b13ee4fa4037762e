"""SB3-contrib's RecurrentPPO (an LSTM policy) on CartPoleNoVel-v1 with the RL Zoo's tuned
hyperparameters (``hyperparams/ppo_lstm.yml``: 8 envs x 32 steps, 20 epochs, batch 256,
GAE(0.98, 0.8), learning rate and clip range decayed linearly from 1e-3 and 0.2 over the Zoo's
100k env steps, the default ``MlpLstmPolicy``), PyTorch on the CPU. CartPoleNoVel-v1 is the
Zoo's: CartPole-v1 with the cart and pole velocities (entries 1 and 3) zeroed. Every 2,048 env
steps the deterministic policy plays 10 episodes, its LSTM state carried; the run stops at the
target. Run by ``experiments/benchmarks/peers.py`` in a venv with sb3-contrib, torch and gymnasium.

    python sb3_recurrent_ppo.py SEED
"""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import torch
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppo import StopAtTarget

ZOO_TIMESTEPS = 100_000  # the Zoo's n_timesteps, over which its lin_ schedules decay


def linear(start: float):
    """The Zoo's ``lin_START``: START times the fraction of the run still to go."""
    return lambda remaining: remaining * start


class MaskVelocity(gym.ObservationWrapper):
    """The Zoo's ``MaskVelocityWrapper`` for CartPole: the velocities read 0."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.mask = np.array([1.0, 0.0, 1.0, 0.0], dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation * self.mask


def main(seed: int) -> None:
    # One thread: on the shared 2-core machine torch's default two made a 32-step LSTM's forward
    # and backward pass 14x slower (threads spinning for a core another process holds).
    torch.set_num_threads(1)
    envs = lambda n, s: make_vec_env("CartPole-v1", n_envs=n, seed=s, wrapper_class=MaskVelocity)  # noqa: E731
    model = RecurrentPPO("MlpLstmPolicy", envs(8, seed), n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
                        n_epochs=20, ent_coef=0.0, learning_rate=linear(1e-3),
                        clip_range=linear(0.2), seed=seed, device="cpu")
    stop = StopAtTarget(envs(1, seed + 1000))
    model.learn(ZOO_TIMESTEPS, callback=stop)
    stop.clock.report(model.num_timesteps)


if __name__ == "__main__":
    main(int(sys.argv[1]))
