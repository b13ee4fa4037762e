"""Stable-Baselines3's SAC or TD3 on gymnasium's Pendulum-v1 with jaxdist's Pendulum-v1 preset
where both have the field (rl-baselines3-zoo's: 2x64 MLPs, Adam at 1e-3, batch 256, 500 random
steps first, one gradient update per env step, tau 0.005, gamma 0.99, a 50k replay; TD3's
exploration noise of std 0.1 in [-1, 1] actions), PyTorch on the CPU. Every ``PEERS_EVAL_EVERY``
updates (as jaxdist's preset evaluates) the deterministic policy plays 10 episodes; the run stops at the target. Run by ``experiments/benchmarks/peers.py``
in a venv with stable-baselines3, torch and gymnasium.

    python sb3_off_policy.py sac|td3 SEED
"""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import SAC, TD3
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.noise import NormalActionNoise

from peer_clock import EVAL_EPISODES, EVAL_EVERY, MAX_ENV_STEPS, Clock

LEARNING_STARTS = 500
AGENTS = {"sac": SAC, "td3": TD3}


class StopAtTarget(BaseCallback):
    def __init__(self, eval_env: gym.Env) -> None:
        super().__init__()
        self.eval_env, self.clock = eval_env, Clock()

    def _on_step(self) -> bool:
        updates = self.num_timesteps - LEARNING_STARTS  # one a step once learning starts
        if updates <= 0:
            return True
        self.clock.updated(self.num_timesteps)
        if updates % EVAL_EVERY == 0:
            self.clock.evaluate(lambda: evaluate_policy(self.model, self.eval_env, n_eval_episodes=EVAL_EPISODES,
                                                        deterministic=True)[0], self.num_timesteps)
        return self.clock.reached is None


def main(agent: str, seed: int) -> None:
    torch.set_num_threads(1)  # as sb3_ppo.py: a tiny MLP runs slower over two threads here
    noise = {"td3": dict(action_noise=NormalActionNoise(np.zeros(1), np.full(1, 0.1)))}.get(agent, {})
    model = AGENTS[agent]("MlpPolicy", gym.make("Pendulum-v1"), learning_rate=1e-3, buffer_size=50_000,
                          learning_starts=LEARNING_STARTS, batch_size=256, tau=0.005, gamma=0.99, train_freq=1,
                          gradient_steps=1, policy_kwargs=dict(net_arch=[64, 64]), seed=seed, device="cpu", **noise)
    eval_env = gym.make("Pendulum-v1")
    eval_env.reset(seed=seed + 1000)
    stop = StopAtTarget(eval_env)
    model.learn(MAX_ENV_STEPS, callback=stop)
    stop.clock.report(model.num_timesteps)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
