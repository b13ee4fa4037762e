"""What a finished agent run must show, shared by the end-to-end tests of the agent scripts."""

from __future__ import annotations

import json
import os

from jaxdist.records.metrics import read_metrics


def check_solved_and_final_policy_evaluated(run_dir: str | os.PathLike, target: float = 475.0) -> dict:
    """An evaluation reached ``target`` (the time and env steps to it are reported), and the last
    evaluation scored the policy the learner saved, the one ``load_policy`` restores: after
    ``--stop-at-target`` that is the version the learner finished at, a few updates past the
    one that reached the target, and it may score below it. The run's summary."""
    summary = json.loads(open(os.path.join(run_dir, "summary.json")).read())
    evaluations = read_metrics(os.path.join(run_dir, "evaluations.csv"))
    assert max(row["mean_return"] for row in evaluations) >= target, evaluations
    assert summary["steps_to_target"] is not None and summary["wall_time_to_target"] is not None, summary
    assert summary["final_return"] == evaluations[-1]["mean_return"], (summary, evaluations[-1])
    assert summary["final_return_version"] == summary["learner_version"], summary
    return summary
