import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxdist.nodes.replay.sum_tree import SumTree


def reference_sample(priorities: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Prefix-sum search: the leaf whose cumulative interval [c_{i-1}, c_i) holds u * total."""
    cumulative = np.cumsum(priorities)
    return np.searchsorted(cumulative, uniforms * cumulative[-1], side="right")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 100)), min_size=1, max_size=60))))
def test_vectorised_updates_match_a_sequential_reference_and_last_write_wins(case):
    capacity, writes = case
    tree, reference = SumTree(capacity), np.zeros(capacity)
    for index, priority in writes:  # sequential writes: the last one to an index wins
        reference[index] = priority
    indices, priorities = np.array(writes).T
    tree.set(indices, priorities.astype(float))  # one vectorised call, duplicates included
    np.testing.assert_array_equal(tree.get(np.arange(capacity)), reference)
    assert tree.total() == reference.sum()  # integer-valued priorities sum exactly


@pytest.mark.parametrize("capacity", [1, 2, 7, 64, 1000])
def test_sampling_matches_prefix_sum_search_exactly(capacity):
    rng = np.random.default_rng(capacity)
    priorities = rng.integers(0, 10, capacity).astype(float)
    priorities[0] = 1.0  # total > 0
    tree = SumTree(capacity)
    tree.set(np.arange(capacity), priorities)
    uniforms = np.concatenate([rng.random(5000), [0.0, np.nextafter(1.0, 0.0)]])
    np.testing.assert_array_equal(tree.sample(uniforms), reference_sample(priorities, uniforms))


def test_sampling_frequencies_follow_priorities():
    rng = np.random.default_rng(0)
    priorities = rng.random(50) + 0.05
    tree = SumTree(50)
    tree.set(np.arange(50), priorities)
    draws = 100_000
    counts = np.bincount(tree.sample(rng.random(draws)), minlength=50)
    expected = draws * priorities / priorities.sum()
    chi_square = ((counts - expected) ** 2 / expected).sum()
    assert chi_square < 49 + 5 * np.sqrt(2 * 49)  # mean + 5 sd for 49 degrees of freedom


def test_zero_priority_leaves_are_never_drawn_even_at_rounding_edges():
    tree = SumTree(6)
    priorities = np.array([0.1, 0.0, 0.2, 0.0, 0.3, 0.0])  # 0.1 + 0.2 + 0.3 does not round exactly
    tree.set(np.arange(6), priorities)
    uniforms = np.concatenate([np.linspace(0, 1, 10_001)[:-1], [np.nextafter(1.0, 0.0)]])
    drawn = tree.sample(uniforms)
    assert set(drawn.tolist()) == {0, 2, 4}


def test_padding_leaves_beyond_capacity_are_never_drawn():
    tree = SumTree(5)  # 8 leaves inside, 3 of them padding
    tree.set(np.arange(5), np.ones(5))
    assert tree.sample(np.array([np.nextafter(1.0, 0.0)])).item() == 4


def test_updates_after_updates_keep_totals_exact():
    tree = SumTree(3)
    tree.set(np.array([0, 1, 2]), np.array([1.0, 2.0, 3.0]))
    tree.set(np.array([1]), np.array([0.0]))
    assert tree.total() == 4.0
    np.testing.assert_array_equal(tree.sample(np.array([0.0, 0.24, 0.25, 0.99])), [0, 0, 2, 2])


def test_the_tree_depends_only_on_its_leaves_so_a_rebuilt_tree_samples_identically():
    rng = np.random.default_rng(1)
    one_by_one, rebuilt = SumTree(300), SumTree(300)
    for index in rng.integers(0, 300, 2000):  # single-leaf updates in some history
        one_by_one.set(np.array([index]), np.array([rng.random()]))
    rebuilt.set(np.arange(300), one_by_one.get(np.arange(300)))  # one batched update
    uniforms = rng.random(10_000)
    assert one_by_one.total() == rebuilt.total()
    np.testing.assert_array_equal(one_by_one.sample(uniforms), rebuilt.sample(uniforms))


def test_bad_input_is_refused_with_clear_errors():
    tree = SumTree(4)
    with pytest.raises(ValueError, match=r"priority must be finite and >= 0, got -1.0"):
        tree.set(np.array([0]), np.array([-1.0]))
    with pytest.raises(ValueError, match="got nan"):
        tree.set(np.array([0]), np.array([np.nan]))
    with pytest.raises(IndexError, match=r"\[0, 4\)"):
        tree.set(np.array([4]), np.array([1.0]))
    with pytest.raises(ValueError, match="every priority is 0"):
        tree.sample(np.array([0.5]))
    with pytest.raises(ValueError, match="capacity"):
        SumTree(0)


# Against a NumPy reference over whole histories, and through the prioritized table --------------


def test_a_history_of_batched_updates_and_draws_matches_a_numpy_reference():
    """Rounds of batched writes (duplicates included) and draws: after each, the leaves, the total
    and every draw agree with plain arrays, a cumulative sum and a prefix-sum search. Priorities
    are multiples of 1/8, so every sum is exact whatever the order of additions."""
    rng = np.random.default_rng(7)
    capacity = 37
    tree, reference = SumTree(capacity), np.zeros(capacity)
    for _ in range(50):
        indices = rng.integers(0, capacity, rng.integers(1, 20))
        priorities = rng.integers(0, 64, len(indices)) / 8
        tree.set(indices, priorities)
        for index, priority in zip(indices, priorities):  # one at a time: the last write wins
            reference[index] = priority
        np.testing.assert_array_equal(tree.get(np.arange(capacity)), reference)
        assert tree.total() == reference.sum()
        if reference.sum() > 0:
            uniforms = rng.random(200)
            np.testing.assert_array_equal(tree.sample(uniforms), reference_sample(reference, uniforms))


@pytest.mark.parametrize("exponent", [0.0, 0.6, 1.0])
def test_prioritized_draw_probabilities_are_priority_to_the_exponent_over_their_sum(exponent):
    """Through the table: inserts with priorities, evictions and priority updates, then each draw's
    reported probability is p_i^alpha / sum_j p_j^alpha over the live items, and the draws follow it."""
    from jaxdist.nodes.replay.tables import Prioritized

    rng = np.random.default_rng(8)
    table = Prioritized(max_size=20, priority_exponent=exponent, seed=3)
    priorities = {}
    for key in range(30):  # keys 0..9 are evicted
        priorities[key] = float(rng.random() * 5 + 0.1)
        table.insert({"x": np.float32(key)}, priority=priorities[key])
    updated = np.array([12, 15, 29, 3])  # key 3 is gone: skipped
    for key, value in zip(updated, [0.01, 9.0, 2.5, 100.0]):
        if key >= 10:
            priorities[int(key)] = value
    table.update_priorities(updated, np.array([0.01, 9.0, 2.5, 100.0]))
    live = np.arange(10, 30)
    weights = np.array([priorities[k] for k in live]) ** exponent
    expected = weights / weights.sum()
    draws = 50_000
    sample = table.sample(draws)
    np.testing.assert_allclose(sample.probabilities, expected[sample.keys - 10], rtol=1e-12)
    counts = np.bincount(sample.keys - 10, minlength=20)
    chi_square = ((counts - draws * expected) ** 2 / (draws * expected)).sum()
    assert chi_square < 19 + 5 * np.sqrt(2 * 19)  # mean + 5 sd for 19 degrees of freedom
