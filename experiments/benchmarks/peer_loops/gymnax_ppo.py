"""A PureJaxRL-style PPO on gymnax's CartPole-v1, one file, one process: the env steps inside
JAX, a rollout is one jitted ``lax.scan`` over vmapped envs, the update is jitted. Between
rollouts the greedy policy plays EVAL_EPISODES episodes (vmapped, also in JAX); the run stops
at the target. Run by ``experiments/benchmarks/peers.py`` in a venv with jax, optax and gymnax.

    python gymnax_ppo.py SEED
"""

from __future__ import annotations

import sys

import gymnax
import jax
import jax.numpy as jnp

import ppo_math as ppo
from peer_clock import EVAL_EPISODES, MAX_ENV_STEPS, Clock

env, env_params = gymnax.make("CartPole-v1")


@jax.jit
def rollout(params, env_state, obs, key):
    def step(carry, key):
        env_state, obs = carry
        act_key, step_key = jax.random.split(key)
        action, log_prob, value = ppo.act(params, obs, act_key)
        next_obs, env_state, reward, terminated, truncated, _ = jax.vmap(env.step, (0, 0, 0, None))(
            jax.random.split(step_key, ppo.NUM_ENVS), env_state, action, env_params)
        done = jnp.logical_or(terminated, truncated).astype(jnp.float32)
        return (env_state, next_obs), ppo.Batch(obs, action, log_prob, value, reward, done)
    (env_state, obs), batch = jax.lax.scan(step, (env_state, obs), jax.random.split(key, ppo.NUM_STEPS))
    return env_state, obs, batch, ppo.apply(params, obs)[1]


@jax.jit
def evaluate(params, key):
    obs, state = jax.vmap(env.reset, (0, None))(jax.random.split(key, EVAL_EPISODES), env_params)

    def step(carry, key):
        state, obs, total, alive = carry
        obs, state, reward, terminated, truncated, _ = jax.vmap(env.step, (0, 0, 0, None))(
            jax.random.split(key, EVAL_EPISODES), state, ppo.greedy(params, obs), env_params)
        return (state, obs, total + reward * alive, alive * (1 - (terminated | truncated))), None
    carry = (state, obs, jnp.zeros(EVAL_EPISODES), jnp.ones(EVAL_EPISODES))
    return jax.lax.scan(step, carry, jax.random.split(key, env_params.max_steps_in_episode))[0][2].mean()


def main(seed: int) -> None:
    clock = Clock()
    key = jax.random.PRNGKey(seed)
    key, init_key, reset_key = jax.random.split(key, 3)
    params = ppo.init(init_key, env.observation_space(env_params).shape[0], env.num_actions)
    opt_state = ppo.optimizer.init(params)
    obs, env_state = jax.vmap(env.reset, (0, None))(jax.random.split(reset_key, ppo.NUM_ENVS), env_params)
    env_steps = 0
    while env_steps < MAX_ENV_STEPS:
        key, rollout_key, update_key, eval_key = jax.random.split(key, 4)
        env_state, obs, batch, last_value = rollout(params, env_state, obs, rollout_key)
        params, opt_state = ppo.update(params, opt_state, batch, last_value, update_key)
        env_steps += ppo.NUM_STEPS * ppo.NUM_ENVS
        jax.block_until_ready(params)
        clock.updated(env_steps)
        if clock.evaluate(lambda: float(evaluate(params, eval_key)), env_steps):
            break
    clock.report(env_steps)


if __name__ == "__main__":
    main(int(sys.argv[1]))
