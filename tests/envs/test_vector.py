"""Vector envs: the autoreset boundary, episode statistics, seeding, and every local backend."""

from __future__ import annotations

import numpy as np
import pytest

from jaxdist.envs import vector
from jaxdist.envs.vector import EnvSpec, VectorEnv, resolve_backend

BACKENDS = ["vector", "sync"]


def rollout(env, steps: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    rows = [env.reset()]
    for _ in range(steps):
        rows.append(env.step(rng.integers(0, 2, env.num_envs)))
    return rows


@pytest.mark.parametrize("backend", [*BACKENDS, "envpool"])
def test_the_step_after_an_episode_ends_is_flagged_first_and_earns_nothing(backend):
    with EnvSpec("CartPole-v1", 4, backend).make(seed=0) as env:
        rows = rollout(env, 300)
    assert rows[0].first.all()
    boundaries = 0
    for before, after in zip(rows, rows[1:]):
        ended = before.terminated | before.truncated
        np.testing.assert_array_equal(after.first, ended)  # exactly the steps that crossed a boundary
        assert (after.reward[after.first] == 0).all()
        assert not (after.terminated | after.truncated)[after.first].any()
        boundaries += int(ended.sum())
    assert boundaries > 20  # random CartPole episodes are short: many boundaries were crossed


@pytest.mark.parametrize("backend", BACKENDS)
def test_episode_returns_and_lengths_are_tracked_per_env(backend):
    with EnvSpec("CartPole-v1", 3, backend).make(seed=1) as env:
        rows = rollout(env, 200)
        returns, lengths = env.pop_episodes()
        assert env.pop_episodes()[0].size == 0  # popped
    # Recompute from the rows: an episode's return sums the rewards earned after its first row.
    expected = []
    for e in range(3):
        total, length = 0.0, 0
        for row in rows[1:]:
            if row.first[e]:
                total, length = 0.0, 0
                continue
            total += float(row.reward[e])
            length += 1
            if row.terminated[e] or row.truncated[e]:
                expected.append((total, length))
    assert sorted(zip(returns.tolist(), lengths.tolist())) == sorted(expected)
    assert np.all(returns == lengths)  # CartPole pays 1 per step


def test_a_truncated_episode_keeps_its_last_observation_as_a_row():
    with EnvSpec("CartPole-v1", 2, "vector", kwargs={"max_episode_steps": 5}).make(seed=0) as env:
        env.reset()
        rows = [env.step(np.zeros(2, np.int64)) for _ in range(12)]
    # Always pushing left, a pole survives 5 steps: truncation at step 5, reset on step 6.
    truncated_at = [i for i, row in enumerate(rows) if row.truncated.any()]
    assert truncated_at and all(rows[i + 1].first[rows[i].truncated].all() for i in truncated_at if i + 1 < len(rows))
    assert not np.array_equal(rows[truncated_at[0]].obs, rows[truncated_at[0] + 1].obs)
    returns, lengths = env.pop_episodes()
    assert set(lengths.tolist()) <= {5} and len(lengths) >= 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_seed_same_trajectory_other_seed_another(backend):
    def observations(seed: int) -> np.ndarray:
        with EnvSpec("CartPole-v1", 2, backend).make(seed=seed) as env:
            return np.stack([row.obs for row in rollout(env, 30)])

    np.testing.assert_array_equal(observations(3), observations(3))
    assert not np.array_equal(observations(3), observations(4))


def test_async_backend_matches_sync_semantics():
    with EnvSpec("CartPole-v1", 2, "async").make(seed=0) as env:
        rows = rollout(env, 60)
        returns, _ = env.pop_episodes()
    for before, after in zip(rows, rows[1:]):
        np.testing.assert_array_equal(after.first, before.terminated | before.truncated)
    assert returns.size > 0


def test_a_mujoco_env_steps_with_continuous_actions_and_its_seed_fixes_the_trajectory():
    pytest.importorskip("mujoco", reason="MuJoCo is not installed: pip install -e '.[mujoco]' in the jaxdist clone to step it here")

    def observations(seed: int, actions_seed: int = 0) -> np.ndarray:
        with EnvSpec("HalfCheetah-v5", 2).make(seed=seed) as env:
            actions = np.random.default_rng(actions_seed).uniform(-1, 1, (40, 2, 6)).astype(np.float32)
            rows = [env.reset(), *(env.step(action) for action in actions)]
        rewards = np.stack([row.reward for row in rows[1:]])
        assert np.isfinite(rewards).all() and (rewards != 0).all()  # a cheetah's every step pays or costs
        return np.stack([row.obs for row in rows])

    first = observations(0)
    assert first.shape == (41, 2, 17) and np.isfinite(first).all()
    np.testing.assert_array_equal(first, observations(0))
    assert not np.array_equal(first, observations(1))
    assert not np.allclose(first[-1], observations(0, actions_seed=1)[-1], atol=0.1)  # the actions drive it


def test_backend_choice_and_bad_input(monkeypatch):
    assert resolve_backend("CartPole-v1") == "vector"  # CartPole has a vector entry point
    assert resolve_backend("Acrobot-v1") == "sync"  # whether EnvPool is installed or not: one command, one env
    with pytest.raises(ValueError, match="unknown env backend 'gpu'"):
        EnvSpec(backend="gpu")
    with pytest.raises(ValueError, match="num_envs must be an int >= 1"):
        EnvSpec(num_envs=0)
    with pytest.raises(RuntimeError, match="reset"):
        EnvSpec(num_envs=1).make(0).step(np.zeros(1, np.int64))
    monkeypatch.setattr(vector, "envpool_installed", lambda: False)  # a machine without EnvPool
    with pytest.raises(ImportError, match="pip install envpool"):
        EnvSpec(backend="envpool").make(0)


def test_episode_statistics_do_not_depend_on_when_they_are_read(monkeypatch):
    def episodes(pop_every: int, backlog: int) -> list:
        monkeypatch.setattr(VectorEnv, "BACKLOG", backlog)
        found = []
        with EnvSpec("CartPole-v1", 5, "vector").make(seed=2) as env:
            rng = np.random.default_rng(0)
            env.reset()
            for step in range(1, 400):
                env.step(rng.integers(0, 2, 5))
                if step % pop_every == 0:
                    found.extend(zip(*(a.tolist() for a in env.pop_episodes())))
            found.extend(zip(*(a.tolist() for a in env.pop_episodes())))
        return found

    once = episodes(pop_every=10_000, backlog=10_000)
    assert len(once) > 50
    assert episodes(pop_every=7, backlog=10_000) == once
    assert episodes(pop_every=10_000, backlog=3) == once
    assert episodes(pop_every=1, backlog=1) == once


def test_envpool_envs_made_with_another_seed_start_elsewhere():
    """EnvPool seeds its envs where it makes them and ignores reset's seed: every actor's envs
    once started from the same states whatever their seed."""
    def first_observations(seed: int) -> np.ndarray:
        with EnvSpec("CartPole-v1", 2, "envpool").make(seed=seed) as env:
            return env.reset().obs

    np.testing.assert_array_equal(first_observations(3), first_observations(3))
    assert not np.array_equal(first_observations(3), first_observations(4))
