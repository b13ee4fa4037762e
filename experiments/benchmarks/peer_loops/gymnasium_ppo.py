"""PPO in JAX on gymnasium's CartPole-v1, one file, one process: the env steps in Python
(a synchronous vector env), the policy and the update are jitted, as in CleanRL's JAX files.
Between rollouts the greedy policy plays EVAL_EPISODES episodes; the run stops at the target.
Run by ``experiments/benchmarks/peers.py`` in a venv with jax, optax and gymnasium.

    python gymnasium_ppo.py SEED
"""

from __future__ import annotations

import sys

import gymnasium as gym
import jax
import numpy as np

import ppo_math as ppo
from peer_clock import EVAL_EPISODES, MAX_ENV_STEPS, Clock


def evaluate(params, seed: int) -> float:
    env, returns = gym.make("CartPole-v1"), []
    for episode in range(EVAL_EPISODES):
        obs, _ = env.reset(seed=seed + episode)
        total, over = 0.0, False
        while not over:
            obs, reward, terminated, truncated, _ = env.step(int(ppo.greedy(params, obs[None])[0]))
            total, over = total + reward, terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def main(seed: int) -> None:
    clock = Clock()
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * ppo.NUM_ENVS,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    key = jax.random.PRNGKey(seed)
    key, init_key = jax.random.split(key)
    params = ppo.init(init_key, envs.single_observation_space.shape[0], envs.single_action_space.n)
    opt_state = ppo.optimizer.init(params)
    obs, _ = envs.reset(seed=seed)
    env_steps = 0
    while env_steps < MAX_ENV_STEPS:
        steps = []
        for _ in range(ppo.NUM_STEPS):
            key, act_key = jax.random.split(key)
            action, log_prob, value = ppo.act(params, obs.astype(np.float32), act_key)
            action = np.asarray(action)
            next_obs, reward, terminated, truncated, _ = envs.step(action)
            steps.append((obs, action, np.asarray(log_prob), np.asarray(value), reward, terminated | truncated))
            obs = next_obs
        batch = ppo.Batch(*(np.stack(column).astype(np.float32 if i != 1 else np.int32)
                            for i, column in enumerate(zip(*steps))))
        key, update_key = jax.random.split(key)
        params, opt_state = ppo.update(params, opt_state, batch, ppo.apply(params, obs.astype(np.float32))[1], update_key)
        env_steps += ppo.NUM_STEPS * ppo.NUM_ENVS
        jax.block_until_ready(params)
        clock.updated(env_steps)
        if clock.evaluate(lambda: evaluate(params, seed * 1000 + env_steps), env_steps):
            break
    clock.report(env_steps)


if __name__ == "__main__":
    main(int(sys.argv[1]))
