"""The run monitor's figures that are computed, not read: the steady throughput; the closing
line on the last evaluation."""

from __future__ import annotations

from jaxdist.agents.cli import last_evaluation
from jaxdist.agents.monitor import steady_rate


def test_steady_throughput_counts_env_steps_from_the_first_update_seen_to_the_last_env_step():
    assert steady_rate((10.0, 2_000), (12.0, 42_000)) == 20_000


def test_a_run_with_no_env_step_after_its_first_update_has_no_steady_throughput_rather_than_zero():
    assert steady_rate((20.0, 20_480), (21.1, 20_480)) is None  # every update landed between two polls
    assert steady_rate((20.0, 20_480), (20.0, 20_480)) is None


def test_the_closing_line_says_which_policy_the_last_evaluation_scored():
    """Before, it printed ``last evaluation return 234.6999969482422``, whichever version that was."""
    summary = {"final_return": 234.6999969482422, "final_return_version": 23, "learner_version": 23}
    assert last_evaluation(summary) == "last evaluation return 234.7, of learner version 23 (the final policy)"
    stopped_at_target = dict(summary, final_return_version=20)
    assert last_evaluation(stopped_at_target).endswith("of learner version 20 (the learner went on to version 23)")
    assert last_evaluation({"final_return": None, "learner_version": 0}) == "no evaluation finished"
