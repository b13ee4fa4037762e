"""IMPALA's loss and update: the loss against a NumPy mirror (importance weights from the
behaviour logits, masks across autoresets, coefficients), the update's direction on a bandit
acted by an older policy, the policy step's behaviour logits, and data-parallel agreement."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist import parallel
from jaxdist.agents.impala import learning
from jaxdist.agents.impala.acting import PolicyStep
from jaxdist.agents.impala.config import IMPALAConfig, IMPALAHyperparams
from jaxdist.agents.impala.vtrace import vtrace

HP = IMPALAHyperparams(num_actions=2, obs_shape=(4,), hidden=(16, 16), total_updates=10)


def mlp_reference(layers: dict, x: np.ndarray) -> np.ndarray:
    names = sorted(layers)  # Dense_0, Dense_1, ..., the last one the head
    for name in names[:-1]:
        x = np.tanh(x @ np.asarray(layers[name]["kernel"], np.float64) + np.asarray(layers[name]["bias"], np.float64))
    return x @ np.asarray(layers[names[-1]]["kernel"], np.float64) + np.asarray(layers[names[-1]]["bias"], np.float64)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def bandit_batch(rng: np.random.Generator, trajectories: int = 8, rows: int = 17, version: int = 0,
                 behaviour_logits: tuple[float, float] = (0.0, 0.0)) -> dict:
    """One-step episodes (every other row ends one): action 1 pays 1, action 0 pays 0; actions
    drawn from the behaviour policy ``softmax(behaviour_logits)``."""
    shape = (trajectories, rows)
    probs = np.exp(log_softmax(np.asarray(behaviour_logits, np.float64)))
    action = (rng.random(shape) < probs[1]).astype(np.int32)
    ends = np.zeros(shape, bool)
    ends[:, 1::2] = True
    reward = np.zeros(shape, np.float32)
    reward[:, 1::2] = action[:, 0::2][:, :reward[:, 1::2].shape[1]]
    return {"obs": rng.normal(size=(*shape, 4)).astype(np.float32), "action": action, "reward": reward,
            "terminated": ends, "truncated": np.zeros(shape, bool),
            "logits": np.broadcast_to(np.asarray(behaviour_logits, np.float32), (*shape, 2)).copy(),
            "version": np.full(shape, version, np.int32)}


def random_batch(rng: np.random.Generator, trajectories: int = 4, rows: int = 12) -> dict:
    shape = (trajectories, rows)
    terminated = rng.random(shape) < 0.1
    return {"obs": rng.normal(size=(*shape, 4)).astype(np.float32),
            "action": rng.integers(0, 2, shape).astype(np.int32),
            "reward": rng.normal(size=shape).astype(np.float32), "terminated": terminated,
            "truncated": (rng.random(shape) < 0.05) & ~terminated,
            "logits": rng.normal(size=(*shape, 2)).astype(np.float32), "version": np.zeros(shape, np.int32)}


def test_impala_loss_matches_numpy_with_rhos_from_the_behaviour_logits():
    hp = dataclasses.replace(HP, ent_coef=0.03, baseline_cost=0.7, rho_bar=1.2, c_bar=0.9, pg_rho_bar=1.5)
    params = learning.init(hp, jax.random.key(0))["params"]
    batch = random_batch(np.random.default_rng(1))
    loss, info = jax.jit(learning.impala_loss, static_argnums=2)(params, batch, hp)

    obs = batch["obs"].astype(np.float64)
    log_probs = log_softmax(mlp_reference(params["params"]["policy"], obs))[:, :-1]
    value = mlp_reference(params["params"]["critic"], obs)[..., 0]
    action = batch["action"][:, :-1]
    pick = lambda lp: np.take_along_axis(lp, action[..., None], -1)[..., 0]  # noqa: E731
    log_rho = pick(log_probs) - pick(log_softmax(batch["logits"][:, :-1].astype(np.float64)))
    t = lambda x: np.swapaxes(np.asarray(x), 0, 1)  # noqa: E731
    targets, advantages, _ = (t(x) for x in vtrace(
        t(value).astype(np.float32), t(batch["reward"]), t(batch["terminated"]), t(batch["truncated"]),
        t(log_rho).astype(np.float32), hp.gamma, rho_bar=1.2, c_bar=0.9, pg_rho_bar=1.5))
    real = ~(batch["terminated"] | batch["truncated"])[:, :-1]
    mean = lambda x: float(x[real].mean())  # noqa: E731
    expected = {"policy_loss": -mean(pick(log_probs) * advantages),
                "baseline_loss": 0.5 * mean((targets - value[:, :-1]) ** 2),
                "entropy": mean(-(np.exp(log_probs) * log_probs).sum(-1)),
                "rho_mean": mean(np.exp(log_rho)), "transitions": float(real.sum())}
    expected["loss"] = expected["policy_loss"] + 0.7 * expected["baseline_loss"] - 0.03 * expected["entropy"]
    assert 0 < real.mean() < 1  # autoreset steps present and masked
    for name, value in expected.items():
        np.testing.assert_allclose(float(info[name]), value, rtol=2e-4, atol=2e-5, err_msg=name)
    np.testing.assert_allclose(float(loss), expected["loss"], rtol=2e-4, atol=2e-5)


def prob_of_action_one(params, obs) -> float:
    logits = HP.network().apply(params, obs, method="logits")
    return float(jnp.mean(jax.nn.softmax(logits)[:, 1]))


def test_the_update_learns_the_better_action_from_an_older_policy_and_counts_versions():
    rng = np.random.default_rng(0)
    hp = dataclasses.replace(HP, learning_rate=1e-2, anneal_lr=False)
    update = jax.jit(functools.partial(learning.update, hp))
    state = learning.init(hp, jax.random.key(0))
    probe = rng.normal(size=(256, 4)).astype(np.float32)
    before = prob_of_action_one(state["params"], probe)
    for i in range(20):  # acted by a behaviour policy that prefers the worse action, 2 versions ago
        batch = bandit_batch(rng, version=max(0, i - 2), behaviour_logits=(1.0, -1.0))
        state, metrics = update(state, batch, jax.random.key(i))
    assert int(state["version"]) == 20
    assert prob_of_action_one(state["params"], probe) > before + 0.1
    assert float(metrics["transitions"]) == 8 * 8  # half the steps cross a boundary
    assert float(metrics["policy_lag_mean"]) == 2.0 and float(metrics["policy_lag_max"]) == 2.0


def test_the_policy_step_samples_and_sends_the_behaviour_logits():
    hp = dataclasses.replace(HP)
    params = learning.init(hp, jax.random.key(0))["params"]
    obs = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    action, extras = jax.jit(PolicyStep(2, hp.hidden))(params, obs, jax.random.key(1))
    assert action.shape == (6,) and action.dtype == jnp.int32 and set(extras) == {"logits"}
    np.testing.assert_allclose(extras["logits"], hp.network().apply(params, obs, method="logits"), rtol=1e-6)


def test_the_update_runs_data_parallel_through_parallel_py():
    batch = bandit_batch(np.random.default_rng(0))
    step = parallel.data_parallel(functools.partial(learning.update, HP))
    state = step.replicate(learning.init(HP, jax.random.key(0)))
    state, metrics = step(state, step.shard_batch(batch), jax.random.key(1))
    reference, expected = jax.jit(functools.partial(learning.update, HP))(
        learning.init(HP, jax.random.key(0)), batch, jax.random.key(1))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), state["params"],
                 reference["params"])
    np.testing.assert_allclose(float(metrics["loss"]), float(expected["loss"]), rtol=1e-5)


def test_the_config_refuses_a_queue_that_cannot_hold_a_batch():
    config = IMPALAConfig(batch_trajectories=8)
    assert config.queue_size >= 8 and config.steps_per_update == 8 * config.trajectory_length
    with pytest.raises(ValueError, match="must hold one batch"):
        IMPALAConfig(batch_trajectories=8, queue_trajectories=4)
