"""V-trace against a NumPy reference written straight from the paper's equation 1 (a sum per
start step, not the backward recursion the JAX code uses), and against returns worked out by
hand: on-policy n-step returns, truncation levels, terminated and truncated episode ends."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist.agents.impala.vtrace import vtrace


def vtrace_reference(value, reward, terminated, truncated, log_rho, gamma, rho_bar=1.0, c_bar=1.0,
                     pg_rho_bar=None, lam=1.0):
    """Rows (T + 1, B) in, (targets, pg advantages) (T, B) out, from the definitions:

    v_s = V(x_s) + sum_{t=s}^{end} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t,
    delta_t = rho_t (r_t + gamma V(x_{t+1}) - V(x_t)), with r_t = reward[t + 1], the sum stopping
    at the row that ends the episode (V = 0 there if it terminated) or at the last row.
    """
    pg_rho_bar = rho_bar if pg_rho_bar is None else pg_rho_bar
    value, reward, rho = (np.asarray(x, np.float64) for x in (value, reward, np.exp(log_rho)))
    rows, envs = value.shape
    steps = rows - 1
    ended = terminated | truncated
    targets, advantages = value[:-1].copy(), np.zeros((steps, envs))

    def bootstrap(t, b):  # V(x_{t+1}) as transition t sees it
        return 0.0 if terminated[t + 1, b] else value[t + 1, b]

    for b in range(envs):
        for s in range(steps):
            if ended[s, b]:  # s -> s+1 is the autoreset step: nothing to learn
                continue
            total = value[s, b]
            for t in range(s, steps):
                traces = np.prod([lam * min(c_bar, rho[i, b]) for i in range(s, t)])
                delta = min(rho_bar, rho[t, b]) * (reward[t + 1, b] + gamma * bootstrap(t, b) - value[t, b])
                total += gamma ** (t - s) * traces * delta
                if ended[t + 1, b]:
                    break
            targets[s, b] = total
        for s in range(steps):
            if ended[s, b]:
                continue
            if terminated[s + 1, b]:
                next_target = 0.0
            elif truncated[s + 1, b] or s + 1 == steps:
                next_target = value[s + 1, b]
            else:
                next_target = targets[s + 1, b]
            advantages[s, b] = min(pg_rho_bar, rho[s, b]) * (reward[s + 1, b] + gamma * next_target - value[s, b])
    return targets, advantages


def random_rows(seed, rows=30, envs=5, terminate=0.08, truncate=0.04, log_rho_scale=1.0):
    rng = np.random.default_rng(seed)
    terminated = rng.random((rows, envs)) < terminate
    return {"value": rng.normal(size=(rows, envs)).astype(np.float32),
            "reward": rng.normal(size=(rows, envs)).astype(np.float32),
            "terminated": terminated, "truncated": (rng.random((rows, envs)) < truncate) & ~terminated,
            "log_rho": (log_rho_scale * rng.normal(size=(rows - 1, envs))).astype(np.float32)}


def run_vtrace(rows, gamma, **levels):
    jitted = jax.jit(functools.partial(vtrace, gamma=gamma, **levels))
    out = jitted(rows["value"], rows["reward"], rows["terminated"], rows["truncated"], rows["log_rho"])
    return np.asarray(out.targets), np.asarray(out.pg_advantages), np.asarray(out.real)


@pytest.mark.parametrize("levels", [
    {},
    {"rho_bar": 1.0, "c_bar": 1.0, "pg_rho_bar": 1.0},
    {"rho_bar": 2.0, "c_bar": 0.5},
    {"rho_bar": 0.7, "c_bar": 0.3, "pg_rho_bar": 1.5},
    {"rho_bar": 1e6, "c_bar": 1e6},
    {"rho_bar": 1.0, "c_bar": 1.0, "lam": 0.8},
])
def test_vtrace_matches_the_papers_sum_across_episode_boundaries(levels):
    rows = random_rows(0)
    assert rows["terminated"].any() and rows["truncated"].any()
    targets, advantages, real = run_vtrace(rows, 0.95, **levels)
    expected_targets, expected_advantages = vtrace_reference(**rows, gamma=0.95, **levels)
    np.testing.assert_allclose(targets, expected_targets, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(advantages, expected_advantages, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(real, ~(rows["terminated"] | rows["truncated"])[:-1])


def test_on_policy_vtrace_is_the_n_step_return_bootstrapped_from_the_last_row():
    rows = random_rows(1, terminate=0.0, truncate=0.0)
    rows["log_rho"][:] = 0.0  # pi = mu
    gamma, steps = 0.9, len(rows["value"]) - 1
    targets, advantages, _ = run_vtrace(rows, gamma)
    reward, value = rows["reward"].astype(np.float64), rows["value"].astype(np.float64)
    n_step = np.stack([sum(gamma ** (t - s) * reward[t + 1] for t in range(s, steps))
                       + gamma ** (steps - s) * value[steps] for s in range(steps)])
    np.testing.assert_allclose(targets, n_step, rtol=1e-4, atol=1e-4)
    # The policy-gradient advantage is then r_s + gamma v_{s+1} - V(x_s) = v_s - V(x_s).
    np.testing.assert_allclose(advantages, n_step - value[:-1], rtol=1e-4, atol=1e-4)


def test_truncation_levels_clip_the_importance_weights():
    rows = random_rows(2, terminate=0.0, truncate=0.0)
    on_policy = dict(rows, log_rho=np.zeros_like(rows["log_rho"]))
    ahead = dict(rows, log_rho=np.full_like(rows["log_rho"], 3.0))  # pi/mu = e^3 everywhere
    # With every weight above both levels of 1, the weights are all 1: the on-policy targets.
    np.testing.assert_allclose(run_vtrace(ahead, 0.9)[0], run_vtrace(on_policy, 0.9)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run_vtrace(ahead, 0.9)[1], run_vtrace(on_policy, 0.9)[1], rtol=1e-5, atol=1e-5)
    # c_bar = 0 cuts every trace: one-step targets V(x_s) + rho_s (r_s + gamma V(x_{s+1}) - V(x_s)).
    value, reward = rows["value"], rows["reward"]
    rho = np.minimum(0.8, np.exp(rows["log_rho"]))
    one_step = value[:-1] + rho * (reward[1:] + 0.9 * value[1:] - value[:-1])
    np.testing.assert_allclose(run_vtrace(rows, 0.9, rho_bar=0.8, c_bar=0.0)[0], one_step, rtol=1e-5, atol=1e-5)
    # pg_rho_bar clips the policy-gradient weight alone.
    low = run_vtrace(ahead, 0.9, pg_rho_bar=0.25)
    np.testing.assert_allclose(low[0], run_vtrace(on_policy, 0.9)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(low[1], 0.25 * run_vtrace(on_policy, 0.9)[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind, targets, advantages", [
    # gamma 0.5; rows: start, middle, last of the episode (row 2), first of the next (row 3).
    # terminated: v1 = 1 + 0 = 1, v0 = 1 + 0.5 * v1 = 1.5 (a return, no bootstrap).
    ("terminated", [1.5, 1.0, 3.0], [0.5, -1.0, 0.0]),
    # truncated: v1 = 1 + 0.5 * V(x2) = 2.5 (bootstrap from the true last observation), v0 = 2.25.
    ("truncated", [2.25, 2.5, 3.0], [1.25, 0.5, 0.0]),
])
def test_a_terminated_episode_cuts_and_a_truncated_one_bootstraps(kind, targets, advantages):
    reward = np.array([0, 1, 1, 1], np.float32)[:, None]
    value = np.array([1, 2, 3, 4], np.float32)[:, None]
    ended = np.array([False, False, True, False])[:, None]
    none = np.zeros_like(ended)
    terminated, truncated = (ended, none) if kind == "terminated" else (none, ended)
    rows = {"value": value, "reward": reward, "terminated": terminated, "truncated": truncated,
            "log_rho": np.zeros((3, 1), np.float32)}
    got_targets, got_advantages, real = run_vtrace(rows, 0.5)
    # Row 2 -> 3 crossed the autoreset: not real; its target is V(x_2) (no loss) and advantage 0.
    np.testing.assert_allclose(got_targets[:, 0], targets, atol=1e-6)
    np.testing.assert_allclose(got_advantages[:, 0], advantages, atol=1e-6)
    assert real[:, 0].tolist() == [True, True, False]


def test_no_gradient_flows_through_the_targets():
    rows = random_rows(3)

    def total(value, log_rho):
        out = vtrace(value, rows["reward"], rows["terminated"], rows["truncated"], log_rho, 0.9)
        return jnp.sum(out.targets) + jnp.sum(out.pg_advantages)

    grads = jax.grad(total, argnums=(0, 1))(jnp.asarray(rows["value"]), jnp.asarray(rows["log_rho"]))
    for grad in grads:
        np.testing.assert_array_equal(np.asarray(grad), 0.0)


def test_vtrace_takes_any_trailing_batch_shape():
    rows = random_rows(4, envs=6)
    reshaped = {k: v.reshape(v.shape[0], 2, 3) for k, v in rows.items()}
    flat = run_vtrace(rows, 0.9, rho_bar=1.2)
    nested = run_vtrace(reshaped, 0.9, rho_bar=1.2)
    chex.assert_trees_all_close(flat, jax.tree.map(lambda x: x.reshape(len(x), 6), nested), rtol=1e-6)


def test_vtrace_refuses_rows_and_transitions_of_the_wrong_shapes_or_dtypes():
    rows = random_rows(5, rows=6, envs=2)
    with pytest.raises(AssertionError, match=r"different shapes: \[\(6, 2\), \(5, 2\), \(6, 2\), \(6, 2\)\]"):
        run_vtrace(dict(rows, reward=rows["reward"][1:]), 0.9)  # rewards per transition, not per row
    with pytest.raises(AssertionError, match=r"shape \(6, 2\) but expected \(5, 2\)"):
        run_vtrace(dict(rows, log_rho=np.zeros((6, 2), np.float32)), 0.9)  # log rho per row
    with pytest.raises(AssertionError, match="input 2 has type float32 but expected bool"):
        run_vtrace(dict(rows, terminated=rows["terminated"].astype(np.float32)), 0.9)
