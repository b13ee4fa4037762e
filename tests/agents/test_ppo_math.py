"""PPO's math against NumPy references: GAE across autoreset boundaries, the clipped loss, and
the update (lag bound, direction, data-parallel agreement, a continuous action space with
observation normalisation and reward scaling)."""

from __future__ import annotations

import dataclasses
import functools
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from actor_critic_math import (CARTPOLE, PENDULUM, acting_logp, assert_data_parallel_matches_jit,
                               assert_moved_and_merged_statistics, mlp_reference, pendulum_batch,
                               prob_of_action_one)
from eight_devices import assert_pmap_equals_jit, flat_tree, on_eight_devices
from resume_checks import assert_resumes_exactly

from jaxdist.agents import actor_critic
from jaxdist.agents.ppo import learning
from jaxdist.agents.ppo import PPOConfig
from jaxdist.envs.spaces import EnvInfo

# Bandit batches of 8 trajectories x 16 transitions; total_steps makes 10 updates (the schedule).
CONFIG = PPOConfig(hidden=(16, 16), epochs=2, minibatches=2, batch_trajectories=8, trajectory_length=16,
                   total_steps=10 * 8 * 16)
ENV = CARTPOLE


def init(config: PPOConfig = CONFIG, env: EnvInfo = ENV, seed: int = 0) -> dict:
    return actor_critic.init(config, env, learning.optimizer, jax.random.key(seed))


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


def test_gae_refuses_rows_of_unequal_shapes_or_float_episode_ends():
    rows = np.zeros((5, 2), np.float32)
    ends = np.zeros((5, 2), bool)
    gae = jax.jit(learning.gae, static_argnums=(4, 5))
    with pytest.raises(AssertionError, match=r"different shapes: \[\(4, 2\), \(5, 2\), \(5, 2\), \(5, 2\)\]"):
        gae(rows[1:], rows, ends, ends, 0.9, 0.9)  # rewards per transition instead of per row
    with pytest.raises(AssertionError, match="input 2 has type float32 but expected bool"):
        gae(rows, rows, rows, ends, 0.9, 0.9)


# Loss ------------------------------------------------------------------------------------------


def ppo_loss_reference(params, minibatch, config):
    obs = np.asarray(minibatch["obs"], np.float64)
    layers = params["params"]
    logits = mlp_reference(layers["torso"], layers["head"], obs)
    value = mlp_reference(layers["value_torso"], layers["value_head"], obs)[:, 0]
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    logp = log_probs[np.arange(len(obs)), minibatch["action"]]
    w = minibatch["weight"]
    mean = lambda x: float((x * w).sum() / max(w.sum(), 1.0))  # noqa: E731
    advantage = minibatch["advantage"]
    mu = mean(advantage)
    advantage = (advantage - mu) / (np.sqrt(mean((advantage - mu) ** 2)) + 1e-8)
    ratio = np.exp(logp - minibatch["logp"])
    clipped = np.clip(ratio, 1 - config.clip_eps, 1 + config.clip_eps)
    policy_loss = -mean(np.minimum(ratio * advantage, clipped * advantage))
    value_loss = 0.5 * mean((value - minibatch["target"]) ** 2)
    entropy = mean(-(np.exp(log_probs) * log_probs).sum(-1))
    return {"loss": policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy, "policy_loss": policy_loss,
            "value_loss": value_loss, "entropy": entropy,
            "clip_fraction": mean((np.abs(ratio - 1) > config.clip_eps).astype(float))}


def test_ppo_loss_matches_numpy():
    hp = dataclasses.replace(CONFIG, ent_coef=0.01)
    params = init(hp)["params"]
    rng = np.random.default_rng(1)
    n = 64
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    logits = mlp_reference(params["params"]["torso"], params["params"]["head"], obs.astype(np.float64))
    action = rng.integers(0, 2, n)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    # Acting log-probabilities a little off the current policy, some beyond the clip range.
    behaviour_logp = log_probs[np.arange(n), action] + rng.normal(scale=0.3, size=n)
    minibatch = {"obs": obs, "action": action.astype(np.int32), "logp": behaviour_logp.astype(np.float32),
                 "advantage": rng.normal(size=n).astype(np.float32), "target": rng.normal(size=n).astype(np.float32),
                 "weight": (rng.random(n) < 0.8).astype(np.float32)}
    loss, info = jax.jit(learning.ppo_loss, static_argnums=(2, 3))(params, minibatch, hp, ENV)
    expected = ppo_loss_reference(params, minibatch, hp)
    assert 0 < expected["clip_fraction"] < 1  # both branches of the clip are exercised
    chex.assert_trees_all_close({name: info[name] for name in expected}, expected, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(float(loss), expected["loss"], rtol=2e-4, atol=2e-5)


def test_ppo_loss_refuses_a_minibatch_that_is_not_flat_transitions():
    params = init()["params"]
    n = 8
    minibatch = {"obs": np.zeros((n, 4), np.float32), "action": np.zeros(n, np.int32),
                 **{name: np.zeros(n, np.float32) for name in ("logp", "advantage", "target", "weight")}}
    loss = jax.jit(learning.ppo_loss, static_argnums=(2, 3))
    loss(params, minibatch, CONFIG, ENV)
    with pytest.raises(AssertionError, match=r"input 0 has rank 2 \(shape \(2, 4\)\) but expected 1"):
        loss(params, dict(minibatch, logp=np.zeros((2, 4), np.float32)), CONFIG, ENV)  # (B, T), not flat
    with pytest.raises(AssertionError, match=r"different shape prefixes"):
        loss(params, dict(minibatch, action=np.zeros(n - 1, np.int32)), CONFIG, ENV)
    with pytest.raises(AssertionError, match=r"shape \(8, 3\) but expected \(None, 4\)"):
        loss(params, dict(minibatch, obs=np.zeros((n, 3), np.float32)), CONFIG, ENV)


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


def test_the_update_moves_the_policy_toward_the_better_action_and_counts_versions():
    rng = np.random.default_rng(0)
    hp = dataclasses.replace(CONFIG, learning_rate=1e-2, anneal_lr=False)
    update = jax.jit(functools.partial(learning.update, hp, ENV))
    state = init(hp)
    probe = rng.normal(size=(256, 4)).astype(np.float32)
    before = prob_of_action_one(hp, state["params"], probe)
    for i in range(5):
        state, metrics = update(state, bandit_batch(rng, version=i), jax.random.key(i))
    assert int(state["version"]) == 5
    assert prob_of_action_one(hp, state["params"], probe) > before + 0.1
    assert float(metrics["transitions"]) == 8 * 8  # half the steps cross a boundary
    assert float(metrics["policy_lag_mean"]) == 0.0 and float(metrics["stale_fraction"]) == 0.0


def test_transitions_older_than_the_lag_bound_are_not_learned_from():
    rng = np.random.default_rng(0)
    hp = dataclasses.replace(CONFIG, max_policy_lag=2)
    update = jax.jit(functools.partial(learning.update, hp, ENV))
    state = init(hp)
    for i in range(3):  # learner version 3 afterwards, with some momentum in Adam
        state, _ = update(state, bandit_batch(rng, version=i), jax.random.key(i))
    params = jax.tree.map(np.asarray, state["params"])
    stale = bandit_batch(rng, version=0)  # lag 3 > 2
    state, metrics = update(state, stale, jax.random.key(9))
    assert float(metrics["stale_fraction"]) == 1.0 and float(metrics["transitions"]) == 0.0
    assert float(metrics["policy_lag_mean"]) == 3.0 and float(metrics["policy_lag_max"]) == 3.0
    chex.assert_trees_all_equal(params, state["params"])
    assert int(state["version"]) == 4  # the learner's step still advanced
    mixed = bandit_batch(rng, version=4)
    mixed["version"][:4] = 1  # half the trajectories lag 3 behind version 4... then 4 - 1 = 3 > 2
    _, metrics = update(state, mixed, jax.random.key(10))
    assert float(metrics["stale_fraction"]) == pytest.approx(0.5)
    assert float(metrics["policy_lag_max"]) == 3.0 and float(metrics["policy_lag_mean"]) == pytest.approx(1.5)


def test_the_update_runs_data_parallel_through_parallel_py():
    update = functools.partial(learning.update, CONFIG, ENV)
    assert_data_parallel_matches_jit(update, init(), bandit_batch(np.random.default_rng(0)))


def test_the_update_refuses_a_batch_whose_leaves_are_not_all_trajectories_of_one_length():
    batch = bandit_batch(np.random.default_rng(0))
    batch["logp"] = batch["logp"][:, :-1]  # per transition, not per row
    with pytest.raises(AssertionError, match="different shape prefixes"):
        jax.jit(functools.partial(learning.update, CONFIG, ENV))(init(), batch, jax.random.key(0))


# A continuous action space --------------------------------------------------------------------


# One SGD step per update: its ratio is pi / mu on the first minibatch step, read in the metrics.
PENDULUM_CONFIG = PPOConfig(env_id="Pendulum-v1", hidden=(16, 16), epochs=1, minibatches=1, batch_trajectories=4,
                            trajectory_length=32, total_steps=10 * 4 * 32, gamma=0.9,
                            normalize_observations=True, scale_rewards=True)


def test_a_continuous_update_normalises_with_the_actors_statistics_and_merges_the_batchs_in():
    config = PENDULUM_CONFIG
    update = jax.jit(functools.partial(learning.update, config, PENDULUM))
    rng = np.random.default_rng(0)
    state, seen = init(config, PENDULUM), []
    for i in range(2):  # the second batch meets statistics the first one set
        batch = pendulum_batch(rng, trajectories=4, rows=33)
        batch["logp"] = acting_logp(config, state, batch)
        new_state, metrics = update(state, batch, jax.random.key(i))
        assert np.isfinite(float(metrics["loss"])) and float(metrics["transitions"]) == 4 * 32 - 1
        # mu = pi: the ratio is 1 (no KL, nothing clipped, and the surrogate is the mean of the
        # normalised advantages, 0); the learner normalised as the actor did.
        assert abs(float(metrics["approx_kl"])) < 1e-8 and float(metrics["clip_fraction"]) == 0.0
        assert abs(float(metrics["policy_loss"])) < 1e-6
        seen.append(batch["obs"][:, :-1].reshape(-1, 3))  # the last row is the next batch's first
        assert_moved_and_merged_statistics(state, new_state, seen)
        state = new_state
    # The same batch acted on raw observations (not as the learner normalises): the ratio is not 1.
    batch["logp"] = acting_logp(config, state, batch, normalize=False)
    _, metrics = update(state, batch, jax.random.key(2))
    assert float(metrics["approx_kl"]) > 1e-5 and abs(float(metrics["policy_loss"])) > 1e-4


# One minibatch per epoch: under pmap each device permutes its own shard, so with several
# minibatches the devices' minibatches are not jit's; with one, both learn from the same
# transitions. Stale trajectories and random episode ends leave the shards unequal weights.
SHARDED_CONFIG = dataclasses.replace(CONFIG, minibatches=1, max_policy_lag=2, normalize_observations=True,
                                     scale_rewards=True)
SHARDED_VERSION = 3  # the learner's version when it meets uneven_batch()


def uneven_batch(seed: int = 0) -> dict:
    """A bandit batch whose trajectories (one per device of 8) differ in how many transitions
    count: episode ends at random, versions 0 (lag 3: stale) to 3; observations far from 0/1."""
    rng = np.random.default_rng(seed)
    batch = bandit_batch(rng)
    batch["terminated"] = rng.random(batch["terminated"].shape) < 0.3
    batch["version"][:] = np.array([0, 3, 1, 2, 0, 3, 3, 2], np.int32)[:, None]
    batch["obs"] = batch["obs"] * np.array([0.5, 2.0, 5.0, 1.0], np.float32) + np.array([1, -3, 10, 0], np.float32)
    return batch


def uneven_state() -> dict:
    return dict(init(SHARDED_CONFIG), version=jnp.asarray(SHARDED_VERSION, jnp.int32))


def eight_device_cases() -> dict:
    """For ``eight_devices``: the bandit batch (jit on 8 devices must equal one device) and the
    uneven one (shards of unequal weight)."""
    return {"bandit": (functools.partial(learning.update, CONFIG, ENV), init(), bandit_batch(np.random.default_rng(0))),
            "uneven": (functools.partial(learning.update, SHARDED_CONFIG, ENV), uneven_state(), uneven_batch())}


@pytest.mark.slow
def test_eight_devices_jit_and_pmap_agree_with_one(tmp_path):
    got = on_eight_devices("agents.test_ppo_math", tmp_path)
    reference, _ = jax.jit(functools.partial(learning.update, CONFIG, ENV))(
        init(), bandit_batch(np.random.default_rng(0)), jax.random.key(1))
    # jit on 8 devices: the one-device update on the global batch, minibatches and all.
    expected = flat_tree(reference["params"])
    chex.assert_trees_all_close({name: got[f"jit/bandit/['state']['params']{name}"] for name in expected}, expected,
                                rtol=1e-4, atol=1e-5)
    # pmap on shards of unequal weight equals jit on the global batch (one minibatch per epoch,
    # see SHARDED_CONFIG).
    assert 0 < float(got["jit/uneven/['metrics']['stale_fraction']"]) < 1
    names = assert_pmap_equals_jit(got, "uneven")
    assert any("obs_norm" in name for name in names) and len(names) > 20


# Resume ----------------------------------------------------------------------------------------


class BanditBatches:
    """Batch ``i`` is the bandit batch of seed ``i``, acted on by version ``i`` (no lag); a
    restored learner seeks it to its step, so a resumed run meets the batches an uninterrupted
    one does."""

    def __init__(self) -> None:
        self._index = 0

    def seek(self, step: int) -> None:
        self._index = step

    def __call__(self) -> dict:
        self._index += 1
        return bandit_batch(np.random.default_rng(self._index - 1), version=self._index - 1)


@pytest.mark.slow  # three learners, each compiling the update: ~16 s of CPU
def test_a_restored_ppo_learner_goes_on_exactly_as_one_that_never_stopped(tmp_path):
    """Its checkpoint is its whole state: parameters, the optimizer's moments and its schedule's
    count, the version, the observation and return statistics (the config normalises
    observations and scales rewards), and the step that the update's keys are folded from."""
    resumed = assert_resumes_exactly(learning.logic(SHARDED_CONFIG, ENV), BanditBatches, tmp_path)
    assert int(resumed["step"]) == int(resumed["state"]["version"]) == 6
    assert float(resumed["state"]["obs_norm"].count) > 6 * 8 * 16  # the statistics of every batch seen


def test_float64_observations_initialise_without_jaxs_float64_warning():
    """MuJoCo's observations are float64; JAX without x64 truncates them, and warned in every learner."""
    env = dataclasses.replace(PENDULUM, obs_dtype="float64")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = init(env=env)
    assert jax.tree.leaves(state["params"])[0].dtype == jnp.float32


def test_a_run_longer_than_optax_can_count_anneals_instead_of_crashing_its_first_update():
    """``--total-steps 10**12``: the schedule's 39,062,500,000 SGD steps overflowed optax's int32
    count, and the learner crashed at its first update on every restart."""
    optimizer = actor_critic.clipped_adam(1e-3, 0.5, 39_062_500_000)
    params = {"w": jnp.ones(3)}
    updates, _ = optimizer.update({"w": jnp.ones(3)}, optimizer.init(params), params)
    assert np.isfinite(np.asarray(updates["w"])).all() and float(jnp.abs(updates["w"]).max()) > 0
