"""Stable-Baselines3's SAC or TD3 on a gymnasium env with jaxdist's preset for it where both have
the field (rl-baselines3-zoo's settings: Pendulum-v1 2x64 MLPs, Adam at 1e-3, 500 random steps
first, a 50k replay; HalfCheetah-v5 2x256 MLPs, Adam at 3e-4, 10k random steps first, a 1M
replay; both batch 256, one gradient update per env step, tau 0.005, gamma 0.99, TD3's
exploration noise of std 0.1 in [-1, 1] actions), PyTorch on the CPU. Every ``PEERS_EVAL_EVERY``
updates (as jaxdist's preset evaluates) the deterministic policy plays 10 episodes; the run
stops at the target. Run by ``experiments/benchmarks/peers.py`` in a venv with
stable-baselines3, torch, gymnasium and MuJoCo.

    python sb3_off_policy.py sac|td3 ENV_ID SEED
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

AGENTS = {"sac": SAC, "td3": TD3}
SETTINGS = {  # env id -> (learning rate, replay size, random steps first, hidden layers)
    "Pendulum-v1": (1e-3, 50_000, 500, [64, 64]),
    "HalfCheetah-v5": (3e-4, 1_000_000, 10_000, [256, 256]),
}


class StopAtTarget(BaseCallback):
    def __init__(self, eval_env: gym.Env, learning_starts: int) -> None:
        super().__init__()
        self.eval_env, self.learning_starts, self.clock = eval_env, learning_starts, Clock()

    def _on_step(self) -> bool:
        updates = self.num_timesteps - self.learning_starts  # one a step once learning starts
        if updates <= 0:
            return True
        self.clock.updated(self.num_timesteps)
        if updates % EVAL_EVERY == 0:
            self.clock.evaluate(lambda: evaluate_policy(self.model, self.eval_env, n_eval_episodes=EVAL_EPISODES,
                                                        deterministic=True)[0], self.num_timesteps)
        return self.clock.reached is None


def main(agent: str, env_id: str, seed: int) -> None:
    torch.set_num_threads(1)  # as sb3_ppo.py: a small MLP runs slower over two threads here
    learning_rate, replay_size, learning_starts, hidden = SETTINGS[env_id]
    env = gym.make(env_id)
    actions = env.action_space.shape
    noise = {"td3": dict(action_noise=NormalActionNoise(np.zeros(actions), np.full(actions, 0.1)))}.get(agent, {})
    model = AGENTS[agent]("MlpPolicy", env, learning_rate=learning_rate, buffer_size=replay_size,
                          learning_starts=learning_starts, batch_size=256, tau=0.005, gamma=0.99, train_freq=1,
                          gradient_steps=1, policy_kwargs=dict(net_arch=hidden), seed=seed, device="cpu", **noise)
    eval_env = gym.make(env_id)
    eval_env.reset(seed=seed + 1000)
    stop = StopAtTarget(eval_env, learning_starts)
    model.learn(MAX_ENV_STEPS, callback=stop)
    stop.clock.report(model.num_timesteps)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
