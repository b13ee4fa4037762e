"""The JAX ports of CartPole-v1 and Pendulum-v1 against gymnasium's envs, step for step."""

from __future__ import annotations

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist.envs import gymnax_as_gym, jax_envs, ports
from jaxdist.envs.jax_envs import State, jax_env


def test_an_env_without_a_jax_version_is_named_with_those_that_have_one_and_what_to_install(monkeypatch):
    with pytest.raises(ValueError, match="no JAX version of 'Ant-v5': jaxdist.envs.jax_envs ports CartPole-v1, Pendulum-v1; "
                                         "gymnax's Acrobot-v1, MountainCar-v0, MountainCarContinuous-v0, Breakout-MinAtar, "
                                         "SpaceInvaders-MinAtar, Asterix-MinAtar, Freeway-MinAtar$"):
        jax_env("Ant-v5")
    for module in (jax_envs, ports):
        monkeypatch.setattr(module, "gymnax_installed", lambda: False)
    with pytest.raises(ValueError, match=r"gymnax's Acrobot-v1, .* with pip install -e '\.\[jaxenv\]' in the jaxdist clone"):
        jax_env("Acrobot-v1")


def test_the_ids_the_configs_check_without_jax_are_those_that_have_a_jax_version():
    """A config refuses an id without a JAX version from these lists, before JAX is imported:
    they must name jaxdist's ports and gymnax's envs that gymnasium knows by the same id."""
    import gymnax

    gymnax_as_gym.register()
    assert tuple(jax_envs.ENVS) == ports.JAX_PORTS
    assert set(ports.GYMNAX_IDS) <= set(gymnax.registered_envs)
    assert set(ports.GYMNAX_IDS) == {env_id for env_id in gymnax.registered_envs if env_id in gym.registry} - set(
        ports.JAX_PORTS)
    for env_id in ports.GYMNAX_IDS:
        assert jax_env(env_id).env_id == env_id


def cartpole_controller(obs: np.ndarray) -> int:
    """Keeps the pole up for the whole 500 steps from gymnasium's start states."""
    x, x_dot, theta, theta_dot = obs
    return int(theta + 0.5 * theta_dot + 0.05 * x + 0.1 * x_dot > 0)


def compare_episode(env_id: str, seed: int, choose) -> int:
    """Step gymnasium's env and the JAX port side by side (float64) with the same actions: each
    step starts from gymnasium's state (the step count carried by the port), and the next
    state, observation, reward and flags must agree. Returns the episode's length."""
    env = gym.make(env_id)
    port = jax_env(env_id)
    obs, _ = env.reset(seed=seed)
    state = State(jnp.asarray(env.unwrapped.state, jnp.float64), jnp.zeros((), jnp.int32))
    np.testing.assert_allclose(np.asarray(port.observe(state.physics), np.float32), obs, rtol=1e-6, atol=1e-7)
    step_fn = jax.jit(port.step)
    for t in range(1, 1000):
        action = choose(obs, t)
        obs, reward, terminated, truncated, _ = env.step(action)
        out = step_fn(state, jnp.asarray(action) if port.discrete else jnp.asarray(action, jnp.float32))
        np.testing.assert_allclose(np.asarray(out.state.physics), env.unwrapped.state, rtol=1e-12, atol=1e-14,
                                   err_msg=f"{env_id} state at step {t}")
        np.testing.assert_allclose(np.asarray(out.obs, np.float32), obs, rtol=1e-6, atol=1e-6)
        assert float(out.reward) == pytest.approx(reward, rel=1e-9, abs=1e-12), t
        assert (bool(out.terminated), bool(out.truncated)) == (terminated, truncated), f"{env_id} flags at step {t}"
        state = State(jnp.asarray(env.unwrapped.state, jnp.float64), out.state.t)
        if terminated or truncated:
            env.close()
            return t
    raise AssertionError("the episode never ended")


def test_cartpole_port_matches_gymnasium_step_for_step_through_termination_and_truncation():
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        short = [compare_episode("CartPole-v1", seed, lambda obs, t: int(rng.integers(2))) for seed in range(5)]
        full = compare_episode("CartPole-v1", 11, lambda obs, t: cartpole_controller(obs))
    assert all(length < 100 for length in short)  # random actions: the pole falls (terminated)
    assert full == 500  # the controller keeps it up: truncated at the time limit


def test_pendulum_port_matches_gymnasium_step_for_step_to_truncation_at_200():
    rng = np.random.default_rng(1)
    torque = lambda obs, t: rng.uniform(-3, 3, size=1).astype(np.float32)  # noqa: E731 - beyond the clip, too
    with jax.enable_x64(True):
        lengths = [compare_episode("Pendulum-v1", seed, torque) for seed in range(3)]
    assert lengths == [200, 200, 200]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_float32_steps_stay_within_float_precision_of_gymnasium(env_id):
    """Training runs the port in float32: one step from gymnasium's state agrees to ~1e-6."""
    env, port = gym.make(env_id), jax_env(env_id)
    env.reset(seed=3)
    rng = np.random.default_rng(3)
    for _ in range(100):
        action = int(rng.integers(2)) if port.discrete else rng.uniform(-2, 2, size=1).astype(np.float32)
        before = jnp.asarray(env.unwrapped.state, jnp.float32)
        obs, reward, terminated, _, _ = env.step(action)
        out = port.step(State(before, jnp.zeros((), jnp.int32)), jnp.asarray(action))
        np.testing.assert_allclose(np.asarray(out.obs), obs, rtol=1e-5, atol=1e-5)
        assert float(out.reward) == pytest.approx(reward, rel=1e-5, abs=1e-5)
        if terminated:
            env.reset(seed=int(rng.integers(1000)))
