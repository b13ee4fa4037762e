"""PBT's exploit and explore steps as pure functions, and the lineage they leave."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist.learning import pbt
from jaxdist.records.metrics import read_metrics


def test_truncation_replaces_the_bottom_fraction_by_members_of_the_top_and_keeps_the_rest():
    scores = jnp.asarray([5.0, 1.0, 9.0, 3.0, jnp.nan, 7.0, 2.0, 8.0])  # best: 2, 7, 5, 0; worst: 4 (NaN), 1, 6, 3
    for seed in range(20):
        parents = np.asarray(pbt.truncation(jax.random.key(seed), scores, 0.25))
        bottom, top = [4, 1], {2, 7}
        assert set(parents[bottom]) <= top
        keep = [i for i in range(8) if i not in bottom]
        assert list(parents[keep]) == keep
    drawn = {tuple(np.asarray(pbt.truncation(jax.random.key(seed), scores, 0.25))[[4, 1]]) for seed in range(20)}
    assert len(drawn) > 1  # the parent is drawn, not always the best


def test_perturbing_multiplies_by_0_8_or_1_2_inside_the_range_and_resampling_draws_from_it():
    values = jnp.full(200, 0.5)
    perturbed = np.asarray(pbt.perturb(jax.random.key(0), values, pbt.Range(0.1, 0.55)))
    assert set(np.round(perturbed.astype(float), 6)) == {0.4, 0.55}  # 0.6 clipped to the range's top
    drawn = np.asarray(pbt.resample(jax.random.key(1), values, pbt.Range(1e-4, 1e-2, log=True)))
    assert drawn.min() >= 1e-4 and drawn.max() <= 1e-2 and np.mean(drawn < 1e-3) > 0.3  # log-uniform
    listed = np.asarray(pbt.resample(jax.random.key(2), values, pbt.Range(0.9, 0.99, values=(0.9, 0.95, 0.99))))
    assert set(np.round(listed.astype(float), 6)) == {0.9, 0.95, 0.99}


def test_a_step_copies_the_parents_state_and_hyperparameters_and_explores_only_the_copies():
    scores = jnp.asarray([1.0, 4.0, 2.0, 3.0])
    state = {"params": jnp.arange(4.0)[:, None] * jnp.ones((4, 3)), "opt_state": jnp.arange(4)}
    hyperparams = {"learning_rate": jnp.asarray([1e-3, 2e-3, 3e-3, 4e-3]),
                   "gamma": jnp.asarray([0.9, 0.91, 0.92, 0.93])}
    ranges = {"learning_rate": pbt.Range(1e-4, 1e-2, log=True), "gamma": pbt.Range(0.8, 0.999)}
    step = jax.jit(lambda key, s, h: pbt.exploit_and_explore(key, scores, s, h, fraction=0.25, rule="perturb",
                                                             ranges=ranges))
    new_state, new_hyper, parents = jax.device_get(step(jax.random.key(0), state, hyperparams))
    assert list(parents) == [1, 1, 2, 3]  # the worst (0) copies the best (1)
    np.testing.assert_array_equal(new_state["params"][0], state["params"][1])
    assert new_state["opt_state"][0] == 1
    for name, values in hyperparams.items():
        np.testing.assert_allclose(new_hyper[name][1:], values[1:])  # the others keep theirs
        choices = np.clip(values[1] * np.array(pbt.PERTURB_FACTORS), ranges[name].low, ranges[name].high)
        assert np.isclose(choices, new_hyper[name][0]).any(), (name, new_hyper[name][0], choices)


def test_the_lineage_has_a_row_per_member_at_the_start_and_at_each_exploit_and_hands_the_rest_on(tmp_path):
    handed = []

    class Recorder:
        def __call__(self, batch, metrics):
            handed.append(metrics)
            return metrics

        def flush(self):
            pass

    lineage = pbt.Lineage(str(tmp_path), interval=4, then=Recorder())
    for version in range(1, 9):
        parents = np.array([1, 1, 2]) if version % 4 == 0 else np.arange(3)
        lineage(None, {"version": np.int32(version), "loss": 0.5, "pbt/parent": parents,
                       "pbt/learning_rate": np.full(3, version * 1e-3)})
    rows = read_metrics(tmp_path / "lineage.csv")
    assert [(row["step"], row["member"], row["parent"]) for row in rows] == [
        (1, 0, 0), (1, 1, 1), (1, 2, 2), (4, 0, 1), (4, 1, 1), (4, 2, 2), (8, 0, 1), (8, 1, 1), (8, 2, 2)]
    np.testing.assert_allclose([row["learning_rate"] for row in rows if row["step"] == 8], 8e-3)
    assert all(set(metrics) == {"version", "loss"} for metrics in handed)  # the rest goes on to the recorder
