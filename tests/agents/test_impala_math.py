"""IMPALA's loss and update: the loss against a NumPy mirror (importance weights from the
behaviour log-probabilities, masks across autoresets, coefficients), the update's direction on a
bandit acted by an older policy, the actors' policy sending its log-probabilities, data-parallel
agreement, and a continuous action space with observation normalisation and reward scaling."""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from actor_critic_math import (CARTPOLE, PENDULUM, acting_logp, assert_data_parallel_matches_jit,
                               assert_moved_and_merged_statistics, mlp_reference, pendulum_batch,
                               prob_of_action_one)
from eight_devices import assert_pmap_equals_jit, flat_tree, on_eight_devices

from jaxdist.agents import actor_critic
from jaxdist.agents.impala import learning
from jaxdist.agents.impala import IMPALAConfig
from jaxdist.agents.impala.vtrace import vtrace
from jaxdist.agents.actor_critic import ActorCriticPolicy
from jaxdist.envs.spaces import EnvInfo

# total_steps makes 10 updates of 8 trajectories x 16 transitions (the learning-rate schedule).
CONFIG = IMPALAConfig(hidden=(16, 16), batch_trajectories=8, trajectory_length=16, total_steps=10 * 8 * 16)
ENV = CARTPOLE


def init(config: IMPALAConfig = CONFIG, env: EnvInfo = ENV, seed: int = 0) -> dict:
    return actor_critic.init(config, env, learning.optimizer, jax.random.key(seed))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def bandit_batch(rng: np.random.Generator, trajectories: int = 8, rows: int = 17, version: int = 0,
                 behaviour_logits: tuple[float, float] = (0.0, 0.0)) -> dict:
    """One-step episodes (every other row ends one): action 1 pays 1, action 0 pays 0; actions
    drawn from the behaviour policy ``softmax(behaviour_logits)``, whose log-probabilities the
    batch carries."""
    shape = (trajectories, rows)
    log_probs = log_softmax(np.asarray(behaviour_logits, np.float64))
    action = (rng.random(shape) < np.exp(log_probs[1])).astype(np.int32)
    ends = np.zeros(shape, bool)
    ends[:, 1::2] = True
    reward = np.zeros(shape, np.float32)
    reward[:, 1::2] = action[:, 0::2][:, :reward[:, 1::2].shape[1]]
    return {"obs": rng.normal(size=(*shape, 4)).astype(np.float32), "action": action, "reward": reward,
            "terminated": ends, "truncated": np.zeros(shape, bool), "logp": log_probs[action].astype(np.float32),
            "version": np.full(shape, version, np.int32)}


def random_batch(rng: np.random.Generator, trajectories: int = 4, rows: int = 12) -> dict:
    shape = (trajectories, rows)
    terminated = rng.random(shape) < 0.1
    behaviour = log_softmax(rng.normal(size=(*shape, 2)))  # a behaviour policy per row
    action = rng.integers(0, 2, shape).astype(np.int32)
    return {"obs": rng.normal(size=(*shape, 4)).astype(np.float32), "action": action,
            "reward": rng.normal(size=shape).astype(np.float32), "terminated": terminated,
            "truncated": (rng.random(shape) < 0.05) & ~terminated,
            "logp": np.take_along_axis(behaviour, action[..., None], -1)[..., 0].astype(np.float32),
            "version": np.zeros(shape, np.int32)}


def loss_inputs(config: IMPALAConfig, state: dict, batch: dict):
    """``(obs, time-major reward)`` as the update hands them to ``impala_loss``."""
    obs, reward, _ = actor_critic.normalized(config, state, batch,
                                             np.swapaxes(batch["terminated"] | batch["truncated"], 0, 1))
    return obs, reward


def test_impala_loss_matches_numpy_with_rhos_from_the_behaviour_log_probabilities():
    config = dataclasses.replace(CONFIG, ent_coef=0.03, baseline_cost=0.7, rho_bar=1.2, c_bar=0.9, pg_rho_bar=1.5)
    state = init(config)
    params = state["params"]
    batch = random_batch(np.random.default_rng(1))
    obs, reward = loss_inputs(config, state, batch)
    loss, info = jax.jit(learning.impala_loss, static_argnums=(4, 5))(params, batch, obs, reward, config, ENV)

    obs = batch["obs"].astype(np.float64)
    layers = params["params"]
    log_probs = log_softmax(mlp_reference(layers["torso"], layers["head"], obs))[:, :-1]
    value = mlp_reference(layers["value_torso"], layers["value_head"], obs)[..., 0]
    action = batch["action"][:, :-1]
    pick = lambda lp: np.take_along_axis(lp, action[..., None], -1)[..., 0]  # noqa: E731
    log_rho = pick(log_probs) - batch["logp"][:, :-1].astype(np.float64)
    t = lambda x: np.swapaxes(np.asarray(x), 0, 1)  # noqa: E731
    targets, advantages, _ = (t(x) for x in vtrace(
        t(value).astype(np.float32), t(batch["reward"]), t(batch["terminated"]), t(batch["truncated"]),
        t(log_rho).astype(np.float32), config.gamma, rho_bar=1.2, c_bar=0.9, pg_rho_bar=1.5))
    real = ~(batch["terminated"] | batch["truncated"])[:, :-1]
    mean = lambda x: float(x[real].mean())  # noqa: E731
    expected = {"policy_loss": -mean(pick(log_probs) * advantages),
                "baseline_loss": 0.5 * mean((targets - value[:, :-1]) ** 2),
                "entropy": mean(-(np.exp(log_probs) * log_probs).sum(-1)),
                "rho_mean": mean(np.exp(log_rho)), "transitions": float(real.sum())}
    expected["loss"] = expected["policy_loss"] + 0.7 * expected["baseline_loss"] - 0.03 * expected["entropy"]
    assert 0 < real.mean() < 1  # autoreset steps present and masked
    chex.assert_trees_all_close({name: info[name] for name in expected}, expected, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(float(loss), expected["loss"], rtol=2e-4, atol=2e-5)


def test_impala_loss_refuses_rewards_that_are_not_time_major_and_trajectories_of_unequal_lengths():
    state = init()
    batch = random_batch(np.random.default_rng(2))  # 4 trajectories of 12 rows
    obs, reward = loss_inputs(CONFIG, state, batch)
    loss = jax.jit(learning.impala_loss, static_argnums=(4, 5))
    with pytest.raises(AssertionError, match=r"shape \(4, 12\) but expected \(12, 4\)"):
        loss(state["params"], batch, obs, reward.T, CONFIG, ENV)
    with pytest.raises(AssertionError, match="different shape prefixes"):
        loss(state["params"], dict(batch, logp=batch["logp"][:, :-1]), obs, reward, CONFIG, ENV)


def test_the_update_learns_the_better_action_from_an_older_policy_and_counts_versions():
    rng = np.random.default_rng(0)
    config = dataclasses.replace(CONFIG, learning_rate=1e-2, anneal_lr=False)
    update = jax.jit(functools.partial(learning.update, config, ENV))
    state = init(config)
    probe = rng.normal(size=(256, 4)).astype(np.float32)
    before = prob_of_action_one(config, state["params"], probe)
    for i in range(20):  # acted by a behaviour policy that prefers the worse action, 2 versions ago
        batch = bandit_batch(rng, version=max(0, i - 2), behaviour_logits=(1.0, -1.0))
        state, metrics = update(state, batch, jax.random.key(i))
    assert int(state["version"]) == 20
    assert prob_of_action_one(config, state["params"], probe) > before + 0.1
    assert float(metrics["transitions"]) == 8 * 8  # half the steps cross a boundary
    assert float(metrics["policy_lag_mean"]) == 2.0 and float(metrics["policy_lag_max"]) == 2.0


def test_the_policy_samples_and_sends_the_behaviour_log_probabilities():
    params = init()["params"]
    obs = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    policy = ActorCriticPolicy(ENV, CONFIG.network, CONFIG.hidden)
    action, extras = jax.jit(policy)({"network": params}, obs, jax.random.key(1))
    assert action.shape == (6,) and action.dtype == jnp.int32 and set(extras) == {"logp"}
    logits = actor_critic.network(CONFIG, ENV).apply(params, obs, method="policy")
    expected = jax.nn.log_softmax(logits)[np.arange(6), action]
    np.testing.assert_allclose(extras["logp"], expected, rtol=1e-6)


def test_the_update_runs_data_parallel_through_parallel_py():
    update = functools.partial(learning.update, CONFIG, ENV)
    assert_data_parallel_matches_jit(update, init(), bandit_batch(np.random.default_rng(0)))


# Normalisation on, and shards of unequal weight: random episode ends, observations far from 0/1.
SHARDED_CONFIG = dataclasses.replace(CONFIG, normalize_observations=True, scale_rewards=True)


def uneven_batch(seed: int = 0) -> dict:
    batch = random_batch(np.random.default_rng(seed), trajectories=8, rows=17)
    batch["terminated"] |= np.random.default_rng(seed + 1).random(batch["terminated"].shape) < 0.2
    batch["truncated"] &= ~batch["terminated"]
    batch["obs"] = batch["obs"] * np.array([0.5, 2.0, 5.0, 1.0], np.float32) + np.array([1, -3, 10, 0], np.float32)
    return batch


def eight_device_cases() -> dict:
    """For ``eight_devices``: a batch whose shards weigh unequally."""
    return {"uneven": (functools.partial(learning.update, SHARDED_CONFIG, ENV), init(SHARDED_CONFIG), uneven_batch())}


@pytest.mark.slow
def test_eight_devices_pmap_on_shards_equals_jit_on_the_global_batch(tmp_path):
    got = on_eight_devices("agents.test_impala_math", tmp_path)
    reference, _ = jax.jit(functools.partial(learning.update, SHARDED_CONFIG, ENV))(
        init(SHARDED_CONFIG), uneven_batch(), jax.random.key(1))
    expected = flat_tree(reference)  # jit on 8 devices: the one-device update
    chex.assert_trees_all_close({name: got[f"jit/uneven/['state']{name}"] for name in expected}, expected,
                                rtol=1e-5, atol=1e-6)
    names = assert_pmap_equals_jit(got, "uneven")
    assert any("obs_norm" in name for name in names) and len(names) > 20


# A continuous action space --------------------------------------------------------------------


PENDULUM_CONFIG = IMPALAConfig(env_id="Pendulum-v1", hidden=(16, 16), batch_trajectories=4, trajectory_length=20,
                               total_steps=10 * 4 * 20, gamma=0.9, ent_coef=0.0, normalize_observations=True,
                               scale_rewards=True)


def test_a_continuous_update_normalises_with_the_actors_statistics_and_merges_the_batchs_in():
    config = PENDULUM_CONFIG
    update = jax.jit(functools.partial(learning.update, config, PENDULUM))
    rng = np.random.default_rng(0)
    state, seen = init(config, PENDULUM), []
    for i in range(2):  # the second batch meets statistics the first one set
        batch = pendulum_batch(rng, trajectories=4, rows=21)
        batch["logp"] = acting_logp(config, state, batch)
        new_state, metrics = update(state, batch, jax.random.key(i))
        assert np.isfinite(float(metrics["loss"])) and float(metrics["transitions"]) == 4 * 20 - 1
        # mu = pi, the learner normalising as the actor did: every importance weight is 1.
        np.testing.assert_allclose(float(metrics["rho_mean"]), 1.0, rtol=1e-6)
        seen.append(batch["obs"][:, :-1].reshape(-1, 3))  # the last row is the next batch's first
        assert_moved_and_merged_statistics(state, new_state, seen)
        state = new_state


def test_the_config_refuses_a_queue_that_cannot_hold_a_batch():
    config = IMPALAConfig(batch_trajectories=8)
    assert config.queue_size >= 8 and config.steps_per_update == 8 * config.trajectory_length
    with pytest.raises(ValueError, match="must hold one batch"):
        IMPALAConfig(batch_trajectories=8, queue_trajectories=4)
