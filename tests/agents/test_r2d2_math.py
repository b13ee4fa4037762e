"""R2D2's math against NumPy references: the value rescaling and its inverse, sequence
priorities, n-step double-Q targets over sequences, the burn-in that learns nothing, and the
sink's overlapping sequences with their stored states."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdist.envs  # noqa: F401 - registers CartPoleNoVel-v1
from jaxdist.agents.r2d2 import R2D2Config
from jaxdist.agents.r2d2 import learning
from jaxdist.envs.spaces import env_info

EPS = 1e-3
CONFIG = R2D2Config(hidden=(8,), core_size=8, burn_in=4, sequence_length=8, trajectory_length=4, n_step=3,
                    gamma=0.9, batch_size=4, min_replay=4)
ENV = env_info("CartPoleNoVel-v1")


def h_reference(x: float) -> float:
    return float(np.sign(x) * (np.sqrt(abs(x) + 1) - 1) + EPS * x)


def test_the_value_rescaling_is_the_papers_and_its_inverse_undoes_it():
    xs = np.array([-1e4, -250.0, -3.0, -0.5, 0.0, 0.25, 1.0, 42.0, 500.0, 1e5])
    expected = [h_reference(x) for x in xs]
    np.testing.assert_allclose(learning.rescale(xs, EPS), expected, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(learning.rescale(jnp.asarray(xs, jnp.float32), EPS)), expected, rtol=1e-5)
    np.testing.assert_allclose(learning.unrescale(learning.rescale(xs, EPS), EPS), xs, rtol=1e-9, atol=1e-9)
    back = learning.unrescale(jnp.asarray(expected, jnp.float32), EPS)
    np.testing.assert_allclose(np.asarray(back), xs, rtol=1e-3, atol=1e-4)
    assert h_reference(3.0) == pytest.approx(1.003)  # sqrt(4) - 1 + 0.003


def test_a_sequences_priority_mixes_the_max_and_the_mean_of_its_real_td_errors():
    td = np.array([[1.0, -3.0, 0.5, 9.0], [0.0, 0.0, 0.0, 0.0], [-2.0, 2.0, 2.0, -2.0]])
    real = np.array([[True, True, True, False], [False, False, False, False], [True, True, True, True]])
    expected = [0.9 * 3.0 + 0.1 * 1.5, 0.0, 0.9 * 2.0 + 0.1 * 2.0]  # the 9.0 crosses an episode's end
    np.testing.assert_allclose(learning.sequence_priority(td, real, 0.9), expected, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(learning.sequence_priority(jnp.asarray(td), jnp.asarray(real), 0.9)),
                               expected, rtol=1e-6)


def test_td_errors_are_n_step_double_q_targets_through_the_rescaling_against_a_numpy_loop():
    rng = np.random.default_rng(0)
    batch, steps, actions = 3, 6, 2
    q = rng.normal(size=(batch, steps + 1, actions)).astype(np.float32)
    q_target = rng.normal(size=(batch, steps + 1, actions)).astype(np.float32)
    action = rng.integers(0, actions, (batch, steps))
    returns = rng.normal(size=(batch, steps)).astype(np.float32)
    discounts = rng.choice([0.0, 0.81, 0.729], (batch, steps)).astype(np.float32)
    bootstrap = np.minimum(np.arange(steps)[None] + rng.integers(1, 4, (batch, steps)), steps)
    td = learning.td_errors(*map(jnp.asarray, (q, q_target, action, returns, discounts, bootstrap)), EPS)
    for b in range(batch):
        for t in range(steps):
            s = bootstrap[b, t]
            best = int(np.argmax(q[b, s]))
            target = h_reference(returns[b, t] + discounts[b, t] * learning.unrescale(q_target[b, s, best], EPS))
            assert float(td[b, t]) == pytest.approx(target - q[b, t, action[b, t]], rel=1e-4, abs=1e-5), (b, t)


def trajectory(rng: np.random.Generator, rows: int, start_state: float, ends: tuple[int, ...] = ()) -> dict:
    terminated = np.zeros(rows, bool)
    terminated[list(ends)] = True
    first = np.zeros(rows, bool)
    first[[e + 1 for e in ends if e + 1 < rows]] = True
    return {"obs": rng.normal(size=(rows, 4)).astype(np.float32), "action": rng.integers(0, 2, rows),
            "reward": np.ones(rows, np.float32), "terminated": terminated, "truncated": np.zeros(rows, bool),
            "first": first, "q": rng.normal(size=(rows, 2)).astype(np.float32),
            "core_state": (np.full(8, start_state, np.float32), np.full(8, -start_state, np.float32))}


def test_the_sink_joins_an_envs_trajectories_into_overlapping_sequences_that_keep_their_start_state():
    rng = np.random.default_rng(1)
    period = CONFIG.trajectory_length  # a window of 12 steps is 3 trajectories of 4
    parts = [trajectory(rng, period + 1, float(i), ends=(2,) if i == 1 else ()) for i in range(4)]
    for before, after in zip(parts, parts[1:]):  # consecutive trajectories share a row
        for name in ("obs", "action", "reward", "terminated", "truncated", "first", "q"):
            after[name][0] = before[name][-1]
    sequences, priorities = learning.to_sequences([parts[:3], parts[1:]], CONFIG)
    assert sequences["obs"].shape == (2, 13, 4) and sequences["action"].shape == (2, 8)
    np.testing.assert_array_equal(sequences["obs"][0], np.concatenate([p["obs"][:-1] for p in parts[:2]] +
                                                                      [parts[2]["obs"]]))
    np.testing.assert_array_equal(sequences["obs"][1, :9], sequences["obs"][0, 4:])  # overlapping by all but a period
    np.testing.assert_array_equal(sequences["core_state"][0][:, 0], [0.0, 1.0])  # the first trajectory's state
    # Row 6 of the first sequence (trajectory 1's row 2) terminates: learned step 2 (row 6) is no
    # transition, and the n-step returns of rows 4 and 5 stop there.
    assert not sequences["real"][0, 2] and sequences["real"][0, 1]
    assert sequences["bootstrap"][0, 0] == 6 and sequences["discounts"][0, 0] == 0.0
    np.testing.assert_allclose(sequences["returns"][0, 0], 1 + 0.9)
    q, action = sequences_q(parts[:3]), sequences["action"][0]
    td = [learning.rescale(sequences["returns"][0, t] + sequences["discounts"][0, t] *
                           learning.unrescale(q[sequences["bootstrap"][0, t]].max(), EPS), EPS) - q[4 + t, action[t]]
          for t in range(8)]
    assert priorities[0] == pytest.approx(learning.sequence_priority(np.array(td), sequences["real"][0], 0.9))


def sequences_q(parts: list[dict]) -> np.ndarray:
    return np.concatenate([p["q"][:-1] for p in parts[:-1]] + [parts[-1]["q"]])


def test_the_burn_in_only_refreshes_the_stored_state_and_the_update_moves_the_network():
    rng = np.random.default_rng(2)
    parts = [trajectory(rng, 5, 0.1 * i, ends=(3,) if i == 2 else ()) for i in range(6)]
    sequences, _ = learning.to_sequences([parts[i:i + 3] for i in range(4)], CONFIG)
    state = learning.init(CONFIG, ENV, jax.random.key(0))
    batch = {"data": sequences, "probabilities": np.full(4, 0.25, np.float32)}

    def loss_of_obs(obs):
        data = dict(sequences, obs=obs)
        return learning.r2d2_loss(state["params"], state["target_params"], {**batch, "data": data}, CONFIG, ENV)[0]

    grad = jax.jit(jax.grad(loss_of_obs))(jnp.asarray(sequences["obs"]))
    assert float(jnp.abs(grad[:, :CONFIG.burn_in]).max()) == 0.0  # no gradient flows into the burn-in
    assert float(jnp.abs(grad[:, CONFIG.burn_in:-1]).max()) > 0.0
    new_state, metrics = jax.jit(functools.partial(learning.update, CONFIG, ENV))(state, batch, jax.random.key(1))
    assert metrics["priorities"].shape == (4,) and float(metrics["loss"]) > 0
    assert int(new_state["updates"]) == 1
    assert not np.allclose(jax.tree.leaves(new_state["params"])[0], jax.tree.leaves(state["params"])[0])


def test_r2d2_needs_a_core_and_sequences_that_start_every_period():
    with pytest.raises(ValueError, match="R2D2's Q-network is recurrent"):
        R2D2Config(core="none")
    with pytest.raises(ValueError, match=r"burn_in \+ sequence_length \(30\) must be a multiple of trajectory_length"):
        R2D2Config(burn_in=10, sequence_length=20, trajectory_length=8)
