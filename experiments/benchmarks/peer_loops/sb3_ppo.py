"""Stable-Baselines3's PPO on gymnasium's CartPole-v1 with the RL Zoo's tuned CartPole
hyperparameters (8 envs x 32 steps, 20 epochs, batch 256, GAE(0.98, 0.8), learning rate 1e-3),
PyTorch on the CPU. Every 2,048 env steps (as the JAX loops) the deterministic policy plays 10
episodes; the run stops at the target. Run by ``experiments/benchmarks/peers.py`` in a venv with stable-baselines3,
torch and gymnasium.

    python sb3_ppo.py SEED
"""

from __future__ import annotations

import sys

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from peer_clock import EVAL_EPISODES, EVAL_EVERY, MAX_ENV_STEPS, Clock


class StopAtTarget(BaseCallback):
    def __init__(self, eval_env) -> None:
        super().__init__()
        self.eval_env, self.clock, self.next_evaluation = eval_env, Clock(), EVAL_EVERY

    def _on_step(self) -> bool:
        return self.clock.reached is None

    def _on_rollout_start(self) -> None:  # after the previous rollout's update
        if self.num_timesteps == 0:
            return
        self.clock.updated(self.num_timesteps)
        if self.num_timesteps < self.next_evaluation:
            return
        self.next_evaluation += EVAL_EVERY
        self.clock.evaluate(lambda: evaluate_policy(self.model, self.eval_env, n_eval_episodes=EVAL_EPISODES,
                                                    deterministic=True)[0], self.num_timesteps)


def main(seed: int) -> None:
    torch.set_num_threads(1)  # as sb3_recurrent_ppo.py: a tiny MLP runs slower over two threads here
    model = PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=8, seed=seed), n_steps=32, batch_size=256,
                gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0, learning_rate=1e-3, clip_range=0.2,
                seed=seed, device="cpu")
    stop = StopAtTarget(make_vec_env("CartPole-v1", n_envs=1, seed=seed + 1000))
    model.learn(MAX_ENV_STEPS, callback=stop)
    stop.clock.report(model.num_timesteps)


if __name__ == "__main__":
    main(int(sys.argv[1]))
