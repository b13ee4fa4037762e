"""ES end to end: the whole program (master and evaluator nodes) learns CartPole under the
threads launcher and resumes from its checkpoint; under the processes launcher it carries on
through an evaluator killed mid-run."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import time

import pytest

import jaxdist as jd
from jaxdist import courier
from jaxdist.agents.es import ESConfig, builder, train
from jaxdist.agents.es.master import ALREADY_FINISHED
from jaxdist.metrics import read_metrics
from jaxdist.metrics_tensorboard import read_scalars


@pytest.mark.slow
def test_a_threads_run_solves_cartpole_then_a_rerun_resumes_from_the_masters_checkpoint(tmp_path):
    out = io.StringIO()
    config = ESConfig(seed=1, stop_at_target=True)
    summary = train(config, launcher="threads", run_dir=str(tmp_path), echo=False, out=out)
    assert summary["stop_reason"] == "the mean return reached 475", out.getvalue()
    assert summary["steps_to_target"] is not None
    assert summary["final_return"] >= 475 and summary["final_return_episodes"] == 100  # fresh gymnasium episodes
    progress = read_metrics(tmp_path / "progress.csv")
    assert progress[0]["episode_return"] < 300 <= 475 <= progress[-1]["episode_return"]  # clearly improved
    assert [row["generation"] for row in progress] == list(range(1, summary["generations"] + 1))
    assert "progress/episode_return" in read_scalars(tmp_path / "tensorboard" / "progress")
    assert (tmp_path / "learning_curve.png").read_bytes().startswith(b"\x89PNG")
    assert {"wall_time_to_target", "steps_to_target", "env_steps", "wall_time", "steps_per_second", "final_return",
            "stop_reason"} <= set(json.loads((tmp_path / "summary.json").read_text()))

    more = dataclasses.replace(config, stop_at_target=False, total_steps=summary["env_steps"] + 60_000)
    resumed = train(more, launcher="threads", run_dir=str(tmp_path), echo=False, out=out)
    assert resumed["restored_generation"] == summary["generations"]
    assert resumed["generations"] > summary["generations"] and resumed["env_steps"] >= more.total_steps
    rows = read_metrics(tmp_path / "progress.csv")  # one row per generation across both runs
    assert [row["generation"] for row in rows] == list(range(1, resumed["generations"] + 1))

    again = train(more, launcher="threads", run_dir=str(tmp_path), echo=False, out=out)
    assert again["stop_reason"] == ALREADY_FINISHED and "pass --fresh" in out.getvalue()


@pytest.mark.slow
def test_a_processes_run_carries_on_through_an_evaluator_killed_mid_run(tmp_path):
    config = ESConfig(seed=0, num_evaluators=2, total_steps=1_200_000, backup_after=1.0)
    running = jd.launch(builder.make_program(config), launcher="processes", run_dir=str(tmp_path), echo=False,
                        resources=builder.resources(), restart=builder.restarts())
    try:
        master = courier.Client(running.addresses[builder.MASTER], token=running.token, timeout=10)
        deadline = time.monotonic() + 120
        while (master.status().get("generation") or 0) < 3:
            assert time.monotonic() < deadline, running.status()
            time.sleep(0.05)
        os.kill(running.status()["evaluator/0"]["pid"], signal.SIGKILL)
        assert running.wait(timeout=240)
    finally:
        running.stop()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stop_reason"] == "trained for 1,200,000 env steps"
    assert running.status()["evaluator/0"]["restarts"] == 1
    assert summary["requeued"] + summary["backups"] >= 1  # the dead evaluator's task was done by the other
    assert summary["final_return"] >= 475
