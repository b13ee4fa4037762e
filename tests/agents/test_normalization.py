"""jaxdist.agents.actor_critic: running stats against NumPy, masks, jit vs pmap on 8 devices,
clipping, and reward scaling on a hand-computed example."""

import json
import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from actor_critic_math import moments

from jaxdist.agents import actor_critic as N


def batches(seed: int = 0) -> list[np.ndarray]:
    """Uneven batches of (B, T, 3) features far from mean 0 / var 1."""
    rng = np.random.default_rng(seed)
    scale, offset = np.array([0.1, 3.0, 50.0]), np.array([5.0, -2.0, 300.0])
    return [(rng.normal(size=(b, 4, 3)) * scale + offset).astype(np.float32) for b in (5, 17, 1, 32)]


def test_incremental_updates_match_numpy_over_all_samples():
    stats, xs = N.init_stats((3,)), batches()
    update = jax.jit(N.update_stats)
    for x in xs:
        stats = update(stats, x)
    flat = np.concatenate(xs).reshape(-1, 3)
    mean, var = moments(flat)
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-5)
    np.testing.assert_allclose(stats.var, var, rtol=1e-5)
    np.testing.assert_allclose(stats.count, len(flat) + 1e-4, rtol=1e-6)


def test_masked_update_counts_only_weighted_rows():
    x = batches()[3]
    mask = np.random.default_rng(1).random(x.shape[:2]) < 0.4
    stats = N.update_stats(N.update_stats(N.init_stats((3,)), x[:5, 0]), x, jnp.asarray(mask))
    expected = np.concatenate([x[:5, 0], x[mask]])
    mean, var = moments(expected)
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-5)
    np.testing.assert_allclose(stats.var, var, rtol=1e-5)
    np.testing.assert_allclose(stats.count, len(expected) + 1e-4, rtol=1e-6)


def test_a_fully_masked_batch_leaves_the_stats_unchanged():
    stats, x = N.update_stats(N.init_stats((3,)), batches()[1]), batches()[2]
    again = N.update_stats(stats, x, jnp.zeros(x.shape[:2]))
    chex.assert_trees_all_close(again, stats, rtol=1e-7)


def test_scalar_stats_reduce_over_every_axis():
    x = np.random.default_rng(2).normal(size=(6, 7)).astype(np.float32) * 2 + 1
    stats = N.update_stats(N.init_stats(), x)
    np.testing.assert_allclose([stats.mean, stats.var], moments(x.reshape(-1)), rtol=1e-5)


def test_samples_or_weights_of_the_wrong_shape_are_refused():
    stats = N.init_stats((3,))
    with pytest.raises(AssertionError, match=r"shape \(4, 2\) but expected \(\.\.\., 3\)"):
        jax.jit(N.update_stats)(stats, jnp.zeros((4, 2)))
    with pytest.raises(AssertionError, match=r"shape \(4, 2\) but expected \(\.\.\., 3\)"):
        jax.jit(N.normalize)(stats, jnp.zeros((4, 2)))
    with pytest.raises(AssertionError, match=r"shape \(5, 4\) but expected \(1, 4\)"):
        jax.jit(N.update_stats)(stats, jnp.zeros((1, 4, 3)), jnp.zeros((5, 4)))
    with pytest.raises(AssertionError, match=r"different shapes: \[\(4, 2\), \(3, 2\)\]"):
        N.discounted_returns(jnp.zeros((4, 2)), jnp.zeros((3, 2), bool), 0.9)


def test_normalize_standardises_and_clips():
    stats = N.RunningStats(jnp.array([1.0, -2.0]), jnp.array([4.0, 0.25]), jnp.asarray(10.0))
    x = jnp.array([[3.0, -2.5], [1.0, 100.0]], jnp.float32)
    np.testing.assert_allclose(N.normalize(stats, x), [[1.0, -1.0], [0.0, 10.0]], rtol=1e-6)
    np.testing.assert_allclose(N.normalize(stats, x, clip=0.5), [[0.5, -0.5], [0.0, 0.5]], rtol=1e-6)
    assert N.normalize(stats, jnp.zeros((2,), jnp.uint8)).dtype == jnp.float32


def test_discounted_returns_restart_after_an_ended_row():
    reward = jnp.array([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0], [4.0, 1.0]])
    ended = jnp.array([[0, 0], [1, 0], [0, 0], [0, 1]], bool)
    # env 0: 1; 2 + .5 * 1; 3 (row 1 ended); 4 + .5 * 3.   env 1: 1, 1.5, 1.75, 1.875.
    expected = [[1.0, 1.0], [2.5, 1.5], [3.0, 1.75], [5.5, 1.875]]
    np.testing.assert_allclose(jax.jit(N.discounted_returns, static_argnums=2)(reward, ended, 0.5), expected)


def test_rewards_are_divided_by_the_std_of_the_returns_and_clipped():
    reward = jnp.array([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0], [4.0, 1.0]])
    ended = jnp.array([[0, 0], [1, 0], [0, 0], [0, 1]], bool)
    stats = N.update_stats(N.init_stats(), N.discounted_returns(reward, ended, 0.5))
    # The eight returns 1, 2.5, 3, 5.5, 1, 1.5, 1.75, 1.875: mean 18.125 / 8, variance
    # 56.328125 / 8 - (18.125 / 8)^2 = 1.907958984375.
    np.testing.assert_allclose(stats.var, 1.907958984375, rtol=1e-4)
    np.testing.assert_allclose(N.scale_rewards(stats, reward), reward / np.sqrt(1.907958984375), rtol=1e-4)
    unit = N.RunningStats(jnp.zeros(()), jnp.ones(()), jnp.ones(()))
    np.testing.assert_allclose(N.scale_rewards(unit, jnp.array([-30.0, 3.0, 30.0])), [-10.0, 3.0, 10.0],
                               rtol=1e-6)


PMAP_VS_JIT = """
import json, sys
import jax
jax.config.update("jax_num_cpu_devices", 8)
import numpy as np
from jaxdist.learning import parallel
from jaxdist.agents import actor_critic as N

def update(stats, batch, rng):
    return N.update_stats(stats, batch["x"], batch["w"]), {}

rng = np.random.default_rng(0)
xs = [(rng.normal(size=(16, 5, 3)) * [0.1, 3.0, 50.0] + [5.0, -2.0, 300.0]).astype(np.float32)
      for _ in range(3)]
ws = [(rng.random((16, 5)) < 0.7).astype(np.float32) for _ in range(3)]
out = {}
for mode in ("jit", "pmap"):
    step = parallel.data_parallel(update, mode=mode, donate=False)
    stats = step.replicate(N.init_stats((3,)))
    for x, w in zip(xs, ws):
        stats, _ = step(stats, step.shard_batch({"x": x, "w": w}), jax.random.key(0))
    out[mode] = [np.asarray(a).tolist() for a in step.unreplicate(stats)]
kept = np.concatenate([x[w > 0] for x, w in zip(xs, ws)]).astype(np.float64)
out["kept"] = kept.tolist()
out["devices"] = jax.device_count()
print(json.dumps(out))
"""


def test_pmap_over_8_devices_with_shards_equals_jit_on_the_global_batch():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", PMAP_VS_JIT], env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["devices"] == 8
    kept = np.array(out["kept"])
    jit, pmap = (N.RunningStats(*map(np.asarray, out[mode])) for mode in ("jit", "pmap"))
    chex.assert_trees_all_close(pmap, jit, rtol=1e-5)
    chex.assert_trees_all_close(jit, N.RunningStats(*moments(kept), np.asarray(len(kept) + 1e-4)), rtol=1e-5)
