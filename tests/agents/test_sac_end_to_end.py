"""SAC end to end on Pendulum-v1: it learns, its run plays back (``load_policy``, the best
policy, ``python -m jaxdist.tools.evaluate``), and a relaunch resumes from the learner's and
the replay's checkpoints."""

from __future__ import annotations

import dataclasses
import io
import re
import subprocess
import sys

import numpy as np
import pytest

from jaxdist.agents import load_policy, sac
from jaxdist.agents.experiment import with_preset
from jaxdist.agents.run import train
from jaxdist.records.metrics import read_metrics


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sac_learns_pendulum_plays_back_and_resumes_with_its_replay(tmp_path, capsys):
    config = with_preset(sac.SACConfig, "Pendulum-v1", sac.PRESETS, total_steps=4_000, seed=1)
    summary = train(sac.agent(config), launcher="threads", run_dir=str(tmp_path), echo=False, out=io.StringIO())
    evaluations = [row["mean_return"] for row in read_metrics(tmp_path / "evaluations.csv")]
    assert max(evaluations[1:]) > evaluations[0] + 400, evaluations  # random: about -1,300
    assert {"critic_loss", "policy_loss", "alpha", "entropy"} <= set(read_metrics(tmp_path / "metrics.csv")[-1])

    policy = load_policy(str(tmp_path))
    assert policy.step == summary["learner_version"] >= config.total_updates  # whole dispatches of 8
    actions = policy.act(np.zeros((5, 3), np.float32))
    assert actions.shape == (5, 1) and np.all(np.abs(actions) <= 2.0)
    assert load_policy(str(tmp_path), best=True).step == summary["best_return_version"]
    played = subprocess.run([sys.executable, "-m", "jaxdist.tools.evaluate", str(tmp_path), "--best", "--episodes",
                             "2"], capture_output=True, text=True, timeout=120)
    assert played.returncode == 0 and played.stdout.count("episode ") == 2, played.stdout + played.stderr
    capsys.readouterr()

    train(sac.agent(dataclasses.replace(config, total_steps=4_500)), launcher="threads", run_dir=str(tmp_path),
          echo=False, out=io.StringIO())
    log = capsys.readouterr().out  # the threads launcher's nodes print here
    restored = re.findall(r"replay node learner/0/0 restored checkpoint step \d+ \(default: (\d+)", log)
    assert restored and int(restored[-1]) >= config.learning_starts, log[-3000:]
    assert f"restored step {summary['learner_version']}" in log
    assert load_policy(str(tmp_path)).step >= dataclasses.replace(config, total_steps=4_500).total_updates
