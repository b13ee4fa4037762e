import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxdist.nodes.replay.rate_limiters import MinSize, Queue, RateLimiter, SampleToInsertRatio


def test_min_size_blocks_samplers_until_enough_items_and_never_blocks_inserters():
    limiter = MinSize(3)
    assert not limiter.can_sample(1, size=2, inserts=2, samples=0)
    assert limiter.can_sample(1000, size=3, inserts=3, samples=0)
    assert limiter.can_insert(1, size=10**6, inserts=10**6, samples=0)
    assert limiter.max_sample_batch == limiter.max_insert_batch == math.inf


def test_ratio_lets_inserts_fill_up_to_min_size_freely_then_tracks_samples():
    limiter = SampleToInsertRatio(samples_per_insert=2.0, min_size=3, error_buffer=4)  # window [2, 10]
    counters = dict(size=2, inserts=2, samples=0)
    assert limiter.can_insert(1, **counters)  # reaching min_size is free
    assert not limiter.can_sample(1, **counters)  # below min_size
    assert limiter.can_sample(4, size=3, inserts=3, samples=0)  # d = 6 - 4 = 2 = min_diff
    assert not limiter.can_sample(5, size=3, inserts=3, samples=0)
    assert limiter.can_insert(1, size=3, inserts=3, samples=0)  # (3+1)*2 - 0 = 8 <= 10
    assert limiter.can_insert(1, size=4, inserts=4, samples=0)  # 10 <= 10
    assert not limiter.can_insert(1, size=5, inserts=5, samples=0)  # 12 > 10: samplers are behind
    assert limiter.can_insert(1, size=5, inserts=5, samples=2)


def test_ratio_refuses_windows_that_could_block_both_sides():
    with pytest.raises(ValueError, match="widen error_buffer"):
        SampleToInsertRatio(samples_per_insert=4.0, min_size=10, error_buffer=3)
    SampleToInsertRatio(samples_per_insert=4.0, min_size=10, error_buffer=4)
    with pytest.raises(ValueError, match="min_size"):
        MinSize(0)


def test_the_largest_batches_granted_at_once_follow_from_the_window():
    limiter = SampleToInsertRatio(samples_per_insert=4.0, min_size=100, error_buffer=100)
    assert limiter.max_sample_batch == 196  # window 200 - spi
    assert limiter.max_insert_batch == 49  # (200 - max(1, spi)) / spi
    assert Queue(8).max_sample_batch == Queue(8).max_insert_batch == 8  # each sample frees its item


def test_the_allowance_is_what_one_sample_may_take_now():
    limiter = SampleToInsertRatio(samples_per_insert=2.0, min_size=3, error_buffer=4)  # window [2, 10]
    assert limiter.sample_allowance(size=2, inserts=2, samples=0) == 0  # below min_size
    assert limiter.sample_allowance(size=3, inserts=3, samples=0) == 4
    assert limiter.sample_allowance(size=3, inserts=3, samples=5) == 0
    assert MinSize(1).sample_allowance(size=1, inserts=1, samples=10**9) == math.inf


def test_ratio_refuses_a_window_above_the_target_as_reverb_does():
    # Reverb: min_diff > samples_per_insert * min_size deadlocks once min_size items are in
    # (inserts stop being free, samples are still below the window).
    with pytest.raises(ValueError, match=r"lower edge min_diff = 21.0 is above samples_per_insert \* min_size = 20"):
        SampleToInsertRatio(samples_per_insert=2.0, min_size=10, error_buffer=(21.0, 40.0))
    limiter = SampleToInsertRatio(samples_per_insert=2.0, min_size=10, error_buffer=(20.0, 40.0))
    assert limiter.can_sample(0 + 1, size=10, inserts=10, samples=0) is False  # 20 - 1 < 20 ...
    assert limiter.can_insert(1, size=10, inserts=10, samples=0)  # ... but inserts go on: no deadlock
    with pytest.raises(ValueError, match=r"min_diff \(3.0\) must be <= max_diff \(1.0\)"):
        RateLimiter(1.0, 1, 3.0, 1.0)


def test_an_explicit_min_max_window_is_used_as_given():
    limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size=1, error_buffer=(-5.0, 5.0))
    assert (limiter.min_diff, limiter.max_diff) == (-5.0, 5.0)
    assert "error_buffer=(-5.0, 5.0)" in repr(limiter)


@settings(max_examples=200, deadline=None)
@given(spi=st.floats(0.1, 8.0), min_size=st.integers(1, 50), buffer_extra=st.floats(0.0, 50.0),
       batch=st.integers(1, 60), script=st.lists(st.booleans(), max_size=300))
def test_an_allowed_batch_never_leaves_both_sides_blocked(spi, min_size, buffer_extra, batch, script):
    """Whatever the history, either one insert or one sample of ``batch`` can go ahead."""
    limiter = SampleToInsertRatio(spi, min_size, error_buffer=max(1.0, spi) + buffer_extra)
    if batch > limiter.max_sample_batch:
        return
    inserts = samples = 0
    for prefer_insert in script:
        counters = dict(size=inserts, inserts=inserts, samples=samples)
        can_insert, can_sample = limiter.can_insert(1, **counters), limiter.can_sample(batch, **counters)
        assert can_insert or can_sample, (counters, limiter)
        if can_insert and (prefer_insert or not can_sample):
            inserts += 1
        else:
            samples += batch
