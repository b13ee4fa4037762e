"""The masked tasks: the no-velocity tasks registered with gymnasium by importing jaxdist.envs,
their JAX versions against them step for step, and masking a task of one's choice."""

from __future__ import annotations

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdist.envs  # noqa: F401 - registers the no-velocity tasks
from jaxdist.envs import masked, ports
from jaxdist.envs.jax_envs import State, jax_env
from jaxdist.envs.vector import EnvSpec, resolve_backend


def compare_masked_episode(env_id: str, seed: int, choose) -> int:
    """gymnasium's masked task and its JAX version side by side (float64), each step from
    gymnasium's state: observations (hidden entries 0), rewards and flags agree."""
    env, port = gym.make(env_id), jax_env(env_id)
    obs, _ = env.reset(seed=seed)
    state = State(jnp.asarray(env.unwrapped.state, jnp.float64), jnp.zeros((), jnp.int32))
    np.testing.assert_allclose(np.asarray(port.observe(state.physics), np.float32), obs, rtol=1e-6, atol=1e-7)
    step_fn = jax.jit(port.step)
    for t in range(1, 1000):
        action = choose(env.unwrapped.state, t)
        obs, reward, terminated, truncated, _ = env.step(action)
        out = step_fn(state, jnp.asarray(action) if port.discrete else jnp.asarray(action, jnp.float32))
        np.testing.assert_allclose(np.asarray(out.obs, np.float32), obs, rtol=1e-6, atol=1e-6, err_msg=str(t))
        assert float(out.reward) == pytest.approx(reward, rel=1e-9, abs=1e-12), t
        assert (bool(out.terminated), bool(out.truncated)) == (terminated, truncated), f"{env_id} flags at step {t}"
        state = State(jnp.asarray(env.unwrapped.state, jnp.float64), out.state.t)
        if terminated or truncated:
            return t
    raise AssertionError("the episode never ended")


def test_cartpole_no_vel_hides_both_velocities_and_its_jax_version_matches_step_for_step():
    env = gym.make("CartPoleNoVel-v1")
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4,) and obs[1] == 0 and obs[3] == 0 and obs[0] != 0 and obs[2] != 0
    rng = np.random.default_rng(0)
    controller = lambda s, t: int(s[2] + 0.5 * s[3] + 0.05 * s[0] + 0.1 * s[1] > 0)  # noqa: E731 - full state
    with jax.enable_x64(True):
        short = [compare_masked_episode("CartPoleNoVel-v1", seed, lambda s, t: int(rng.integers(2)))
                 for seed in range(3)]
        full = compare_masked_episode("CartPoleNoVel-v1", 11, controller)
    assert all(length < 100 for length in short) and full == 500  # terminated, then truncated at 500


def test_pendulum_no_vel_hides_the_angular_velocity_and_its_jax_version_matches_to_truncation():
    rng = np.random.default_rng(1)
    torque = lambda s, t: rng.uniform(-3, 3, size=1).astype(np.float32)  # noqa: E731
    with jax.enable_x64(True):
        assert compare_masked_episode("PendulumNoVel-v1", 2, torque) == 200
    obs, _ = gym.make("PendulumNoVel-v1").reset(seed=0)
    assert obs[2] == 0 and abs(obs[0] ** 2 + obs[1] ** 2 - 1) < 1e-5


def test_no_velocity_tasks_have_a_jax_version_a_config_can_check_without_jax():
    assert ports.jax_version_missing("CartPoleNoVel-v1") is None
    assert ports.jax_version_missing("PendulumNoVel-v1") is None
    assert jax_env("CartPoleNoVel-v1").max_steps == 500 and jax_env("PendulumNoVel-v1").action_bounds == (-2.0, 2.0)


def test_a_task_of_ones_choice_is_masked_for_gymnasium_actors_and_the_jax_backend():
    masked.register_masked("CartPoleNoAngle-v1", "CartPole-v1", (2, 3))
    vector = EnvSpec("CartPoleNoAngle-v1", 3, backend="sync").make(seed=0)
    first = vector.reset()
    assert (first.obs[:, 2:] == 0).all() and (first.obs[:, :2] != 0).any()
    step = vector.step(np.ones(3, np.int64))
    assert (step.obs[:, 2:] == 0).all()
    vector.close()
    port = jax_env("CartPoleNoAngle-v1")
    _, obs = port.reset(jax.random.key(0))
    assert obs[2] == 0 and obs[3] == 0 and obs[0] != 0


def test_masking_refuses_entries_the_observation_does_not_have():
    with pytest.raises(ValueError, match=r"hidden must name entries 0 to 3 of the observation; got \(4,\)"):
        masked.make_masked("CartPole-v1", (4,))


def test_auto_plays_a_masked_task_on_gymnasium_even_where_envpool_is_installed():
    """EnvPool knows CartPole-v1 but not the masked tasks: ``auto`` once chose it for them and
    the actors failed on their first step."""
    assert resolve_backend("CartPoleNoVel-v1") == "sync"
    assert resolve_backend("PendulumNoVel-v1") == "sync"
    env = EnvSpec("CartPoleNoVel-v1", 2).make(seed=0)
    assert (env.reset().obs[:, [1, 3]] == 0).all()
    env.close()
