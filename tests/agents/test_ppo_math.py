"""PPO's math against NumPy references: GAE across autoreset boundaries, the clipped loss, and
the update (lag bound, direction, data-parallel agreement)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist import parallel
from jaxdist.agents.ppo import learning
from jaxdist.agents.ppo.config import PPOHyperparams

HP = PPOHyperparams(num_actions=2, obs_shape=(4,), hidden=(16, 16), epochs=2, minibatches=2, total_updates=10)


# GAE -------------------------------------------------------------------------------------------


def gae_reference(reward, value, terminated, truncated, gamma, lam):
    """A plain loop over rows (T + 1, B), written from the definitions in learning.py."""
    rows, envs = reward.shape
    advantages = np.zeros((rows - 1, envs))
    for b in range(envs):
        following = 0.0
        for t in reversed(range(rows - 1)):
            if terminated[t, b] or truncated[t, b]:  # row t ended: t -> t+1 was an autoreset
                advantages[t, b] = following = 0.0
                continue
            bootstrap = 0.0 if terminated[t + 1, b] else value[t + 1, b]
            delta = reward[t + 1, b] + gamma * bootstrap - value[t, b]
            ends = terminated[t + 1, b] or truncated[t + 1, b]
            following = delta + gamma * lam * (0.0 if ends else following)
            advantages[t, b] = following
    return advantages, advantages + value[:-1]


def test_gae_matches_a_numpy_loop_across_many_boundaries():
    rng = np.random.default_rng(0)
    rows, envs = 40, 6
    reward = rng.normal(size=(rows, envs)).astype(np.float32)
    value = rng.normal(size=(rows, envs)).astype(np.float32)
    terminated = rng.random((rows, envs)) < 0.1
    truncated = (rng.random((rows, envs)) < 0.05) & ~terminated
    advantages, targets, real = jax.jit(learning.gae, static_argnums=(4, 5))(
        reward, value, terminated, truncated, 0.97, 0.9)
    expected_advantages, expected_targets = gae_reference(reward, value, terminated, truncated, 0.97, 0.9)
    np.testing.assert_allclose(advantages, expected_advantages, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(targets, expected_targets, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(real, ~(terminated | truncated)[:-1])


@pytest.mark.parametrize("kind, expected", [("terminated", [0.5, -1.0, 0.0]), ("truncated", [1.25, 0.5, 0.0])])
def test_gae_by_hand_a_terminal_row_cuts_and_a_truncated_one_bootstraps(kind, expected):
    # Rows: start, middle, last of the episode (row 2), first of the next (row 3, after autoreset).
    reward = np.array([0, 1, 1, 1], np.float32)[:, None]  # reward[t]: earned arriving at row t
    value = np.array([1, 2, 3, 4], np.float32)[:, None]
    ended = np.array([False, False, True, False])[:, None]
    terminated, truncated = (ended, ~ended & False) if kind == "terminated" else (~ended & False, ended)
    advantages, _, real = learning.gae(reward, value, terminated, truncated, 0.5, 1.0)
    # gamma 0.5, lambda 1. terminated: A1 = 1 + 0 - 2 = -1, A0 = (1 + 0.5*2 - 1) + 0.5*A1 = 0.5;
    # truncated: A1 = 1 + 0.5*3 - 2 = 0.5 (bootstrap from the last observation), A0 = 1 + 0.25.
    # Row 2 -> 3 crossed the autoreset: advantage 0 and not real.
    np.testing.assert_allclose(np.asarray(advantages)[:, 0], expected, atol=1e-6)
    assert np.asarray(real)[:, 0].tolist() == [True, True, False]


# Loss ------------------------------------------------------------------------------------------


def mlp_reference(layers: dict, x: np.ndarray) -> np.ndarray:
    names = sorted(layers)  # Dense_0, Dense_1, ..., the last one the head
    for name in names[:-1]:
        x = np.tanh(x @ np.asarray(layers[name]["kernel"], np.float64) + np.asarray(layers[name]["bias"], np.float64))
    return x @ np.asarray(layers[names[-1]]["kernel"], np.float64) + np.asarray(layers[names[-1]]["bias"], np.float64)


def ppo_loss_reference(params, minibatch, hp):
    obs = np.asarray(minibatch["obs"], np.float64)
    logits = mlp_reference(params["params"]["policy"], obs)
    value = mlp_reference(params["params"]["critic"], obs)[:, 0]
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    logp = log_probs[np.arange(len(obs)), minibatch["action"]]
    w = minibatch["weight"]
    mean = lambda x: float((x * w).sum() / max(w.sum(), 1.0))  # noqa: E731
    advantage = minibatch["advantage"]
    mu = mean(advantage)
    advantage = (advantage - mu) / (np.sqrt(mean((advantage - mu) ** 2)) + 1e-8)
    ratio = np.exp(logp - minibatch["logp"])
    clipped = np.clip(ratio, 1 - hp.clip_eps, 1 + hp.clip_eps)
    policy_loss = -mean(np.minimum(ratio * advantage, clipped * advantage))
    value_loss = 0.5 * mean((value - minibatch["target"]) ** 2)
    entropy = mean(-(np.exp(log_probs) * log_probs).sum(-1))
    return {"loss": policy_loss + hp.vf_coef * value_loss - hp.ent_coef * entropy, "policy_loss": policy_loss,
            "value_loss": value_loss, "entropy": entropy,
            "clip_fraction": mean((np.abs(ratio - 1) > hp.clip_eps).astype(float))}


def test_ppo_loss_matches_numpy():
    hp = dataclass_replace(HP, ent_coef=0.01)
    params = learning.init(hp, jax.random.key(0))["params"]
    rng = np.random.default_rng(1)
    n = 64
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    logits = mlp_reference(params["params"]["policy"], obs.astype(np.float64))
    action = rng.integers(0, 2, n)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    # Acting log-probabilities a little off the current policy, some beyond the clip range.
    behaviour_logp = log_probs[np.arange(n), action] + rng.normal(scale=0.3, size=n)
    minibatch = {"obs": obs, "action": action.astype(np.int32), "logp": behaviour_logp.astype(np.float32),
                 "advantage": rng.normal(size=n).astype(np.float32), "target": rng.normal(size=n).astype(np.float32),
                 "weight": (rng.random(n) < 0.8).astype(np.float32)}
    loss, info = jax.jit(learning.ppo_loss, static_argnums=2)(params, minibatch, hp)
    expected = ppo_loss_reference(params, minibatch, hp)
    assert 0 < expected["clip_fraction"] < 1  # both branches of the clip are exercised
    for name, value in expected.items():
        np.testing.assert_allclose(float(info[name]), value, rtol=2e-4, atol=2e-5, err_msg=name)
    np.testing.assert_allclose(float(loss), expected["loss"], rtol=2e-4, atol=2e-5)


def dataclass_replace(hp: PPOHyperparams, **changes) -> PPOHyperparams:
    import dataclasses

    return dataclasses.replace(hp, **changes)


# Update ----------------------------------------------------------------------------------------


def bandit_batch(rng: np.random.Generator, trajectories: int = 8, rows: int = 17, version: int = 0) -> dict:
    """One-step episodes (every other row ends one): action 1 pays 1, action 0 pays 0."""
    shape = (trajectories, rows)
    action = rng.integers(0, 2, shape).astype(np.int32)
    ends = np.zeros(shape, bool)
    ends[:, 1::2] = True
    reward = np.zeros(shape, np.float32)
    reward[:, 1::2] = action[:, 0::2][:, :reward[:, 1::2].shape[1]]
    return {"obs": rng.normal(size=(*shape, 4)).astype(np.float32), "action": action, "reward": reward,
            "terminated": ends, "truncated": np.zeros(shape, bool),
            "logp": np.full(shape, np.log(0.5), np.float32), "version": np.full(shape, version, np.int32)}


def prob_of_action_one(params, obs) -> float:
    logits = HP.network().apply(params, obs, method="logits")
    return float(jnp.mean(jax.nn.softmax(logits)[:, 1]))


def test_the_update_moves_the_policy_toward_the_better_action_and_counts_versions():
    rng = np.random.default_rng(0)
    hp = dataclass_replace(HP, learning_rate=1e-2, anneal_lr=False)
    update = jax.jit(functools.partial(learning.update, hp))
    state = learning.init(hp, jax.random.key(0))
    probe = rng.normal(size=(256, 4)).astype(np.float32)
    before = prob_of_action_one(state["params"], probe)
    for i in range(5):
        state, metrics = update(state, bandit_batch(rng, version=i), jax.random.key(i))
    assert int(state["version"]) == 5
    assert prob_of_action_one(state["params"], probe) > before + 0.1
    assert float(metrics["transitions"]) == 8 * 8  # half the steps cross a boundary
    assert float(metrics["policy_lag_mean"]) == 0.0 and float(metrics["stale_fraction"]) == 0.0


def test_transitions_older_than_the_lag_bound_are_not_learned_from():
    rng = np.random.default_rng(0)
    hp = dataclass_replace(HP, max_policy_lag=2)
    update = jax.jit(functools.partial(learning.update, hp))
    state = learning.init(hp, jax.random.key(0))
    for i in range(3):  # learner version 3 afterwards, with some momentum in Adam
        state, _ = update(state, bandit_batch(rng, version=i), jax.random.key(i))
    params = jax.tree.map(np.asarray, state["params"])
    stale = bandit_batch(rng, version=0)  # lag 3 > 2
    state, metrics = update(state, stale, jax.random.key(9))
    assert float(metrics["stale_fraction"]) == 1.0 and float(metrics["transitions"]) == 0.0
    assert float(metrics["policy_lag_mean"]) == 3.0 and float(metrics["policy_lag_max"]) == 3.0
    jax.tree.map(np.testing.assert_array_equal, params, jax.tree.map(np.asarray, state["params"]))
    assert int(state["version"]) == 4  # the learner's step still advanced
    mixed = bandit_batch(rng, version=4)
    mixed["version"][:4] = 1  # half the trajectories lag 3 behind version 4... then 4 - 1 = 3 > 2
    _, metrics = update(state, mixed, jax.random.key(10))
    assert float(metrics["stale_fraction"]) == pytest.approx(0.5)


def test_the_update_runs_data_parallel_through_parallel_py():
    rng = np.random.default_rng(0)
    batch = bandit_batch(rng)
    step = parallel.data_parallel(functools.partial(learning.update, HP))
    state = step.replicate(learning.init(HP, jax.random.key(0)))
    state, metrics = step(state, step.shard_batch(batch), jax.random.key(1))
    reference, expected = jax.jit(functools.partial(learning.update, HP))(
        learning.init(HP, jax.random.key(0)), batch, jax.random.key(1))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), state["params"],
                 reference["params"])
    np.testing.assert_allclose(float(metrics["loss"]), float(expected["loss"]), rtol=1e-5)


EIGHT_DEVICES = textwrap.dedent("""
    import functools, sys, jax, numpy as np
    sys.path.insert(0, {tests!r})
    from agents.test_ppo_math import HP, bandit_batch
    from jaxdist import parallel
    from jaxdist.agents.ppo import learning
    assert jax.device_count() == 8
    out = {{}}
    for mode in ("jit", "pmap"):
        step = parallel.data_parallel(functools.partial(learning.update, HP), mode=mode)
        state = step.replicate(learning.init(HP, jax.random.key(0)))
        state, metrics = step(state, step.shard_batch(bandit_batch(np.random.default_rng(0))), jax.random.key(1))
        out[mode] = step.unreplicate(state)["params"]
    np.savez({path!r}, **{{f"{{m}}/{{'/'.join(str(k.key) for k in p)}}": np.asarray(v)
             for m, tree in out.items() for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}})
""")


@pytest.mark.slow
def test_eight_devices_jit_and_pmap_agree_with_one(tmp_path):
    path = str(tmp_path / "params.npz")
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    done = subprocess.run([sys.executable, "-c", EIGHT_DEVICES.format(tests=tests, path=path)], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    reference, _ = jax.jit(functools.partial(learning.update, HP))(
        learning.init(HP, jax.random.key(0)), bandit_batch(np.random.default_rng(0)), jax.random.key(1))
    flat = {"/".join(str(k.key) for k in p): np.asarray(v)
            for p, v in jax.tree_util.tree_flatten_with_path(reference["params"])[0]}
    with np.load(path) as got:
        for name, value in flat.items():
            np.testing.assert_allclose(got[f"jit/{name}"], value, rtol=1e-4, atol=1e-5, err_msg=f"jit {name}")
            # pmap: each device permutes its own shard, so minibatches differ; same direction only.
            assert np.all(np.isfinite(got[f"pmap/{name}"]))
