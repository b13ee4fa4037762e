"""Ape-X DQN end to end under the threads launcher: actors with their own epsilons insert n-step
transitions with priorities, the learner samples them, learns and writes priorities back, and
the greediest actor's return clearly improves."""

from __future__ import annotations

import dataclasses
import io
import re
import time

import numpy as np
import pytest

from jaxdist.agents.apex import ApexConfig, builder, train
from jaxdist.metrics import read_metrics


class RecordingReplay:
    """Stands in for a replay node's courier client: records the calls it gets."""

    def __init__(self):
        self.calls = []

    def call(self, method, *args, **kwargs):
        self.calls.append((method, args, kwargs))

    def with_timeout(self, seconds):
        return self


def test_priority_writer_sends_each_batchs_new_priorities_home_in_order():
    replay = RecordingReplay()
    writer = builder.PriorityWriter(replay, max_pending=2)
    for step in range(5):
        keys = np.arange(4) + 10 * step
        writer({"keys": keys, "data": {}, "probabilities": np.full(4, 0.25)}, {"priorities": keys / 10.0, "loss": 1.0})
    deadline = time.monotonic() + 10
    while len(replay.calls) < 5 and time.monotonic() < deadline:  # the writes happen on the writer's thread
        time.sleep(0.01)
    assert [method for method, _, _ in replay.calls] == ["update_priorities"] * 5
    for step, (_, (keys, priorities), kwargs) in enumerate(replay.calls):
        np.testing.assert_array_equal(keys, np.arange(4) + 10 * step)
        np.testing.assert_allclose(priorities, keys / 10.0)
        assert kwargs == {"table": "default"}
    assert writer.errors == 0


@pytest.mark.slow
def test_threads_launcher_run_clearly_improves_the_greedy_return(tmp_path):
    start = time.monotonic()
    out = io.StringIO()
    config = ApexConfig(num_actors=2, envs_per_actor=4, report_actors=1, total_steps=60_000, min_replay=500, seed=1,
                        log_every_updates=20)  # epsilons 0.4 and 0.4^8; the return is the second's
    summary = train(config, launcher="threads", run_dir=str(tmp_path), target_return=150.0, stop_at_target=True,
                    echo=False, out=out)
    elapsed = time.monotonic() - start
    # A random policy averages ~22 on CartPole; the run stops once the greedy actor's last 20
    # episodes average 150 (about 30k env steps and 50 s here).
    assert summary["steps_to_target"] is not None, out.getvalue()
    assert summary["final_return"] >= 150
    assert elapsed < 150, out.getvalue()
    rows = read_metrics(tmp_path / "metrics.csv")  # the learner's
    assert rows and {"loss", "q_mean", "td_abs_mean", "priorities", "importance_weight_mean"} <= set(rows[-1])
    assert rows[-1]["q_mean"] > rows[0]["q_mean"]  # values grow as episodes lengthen
    assert (tmp_path / "learning_curve.png").read_bytes().startswith(b"\x89PNG")
    assert "[apex]" in out.getvalue()


@pytest.mark.slow
def test_a_relaunched_run_resumes_with_its_replay_and_learner_step(tmp_path, capsys):
    # The first run ends at its step budget and saves the replay at the stop; the second, on
    # the same run directory, starts from both instead of refilling min_replay.
    config = ApexConfig(num_actors=2, envs_per_actor=4, report_actors=1, total_steps=4_000, min_replay=500,
                        seed=2, log_every_updates=50)
    train(config, launcher="threads", run_dir=str(tmp_path), echo=False, out=io.StringIO())
    assert "restored" not in capsys.readouterr().out
    first = read_metrics(tmp_path / "metrics.csv")[-1]["step"]
    train(dataclasses.replace(config, total_steps=6_000), launcher="threads", run_dir=str(tmp_path), echo=False,
          out=io.StringIO())
    log = capsys.readouterr().out  # the threads launcher's nodes print here
    restored = re.findall(r"replay node learner/0/0 restored checkpoint step \d+ \(default: (\d+)", log)
    assert restored and int(restored[-1]) >= config.min_replay, log[-3000:]
    assert f"learner/0/1: restored step {first}" in log
