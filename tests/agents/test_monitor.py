"""The run monitor's figures that are computed, not read: the steady throughput."""

from __future__ import annotations

from jaxdist.agents.monitor import steady_rate


def test_steady_throughput_counts_env_steps_from_the_first_update_seen_to_the_last_env_step():
    assert steady_rate((10.0, 2_000), (12.0, 42_000)) == 20_000


def test_a_run_with_no_env_step_after_its_first_update_has_no_steady_throughput_rather_than_zero():
    assert steady_rate((20.0, 20_480), (21.1, 20_480)) is None  # every update landed between two polls
    assert steady_rate((20.0, 20_480), (20.0, 20_480)) is None
