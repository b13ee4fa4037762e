"""TD3 end to end: its experiment script as a user runs it (processes, Pendulum-v1's preset)
learns, and its best policy plays back through ``python -m jaxdist.tools.evaluate``; a discrete
env is refused before anything launches."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jaxdist.records.metrics import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "experiments", "td3.py")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_script_learns_pendulum_across_processes_and_its_best_policy_plays(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT, "--run-dir", str(tmp_path), "--total-steps", "4000", "--quiet",
                           "--compilation-cache", ""], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    evaluations = [row["mean_return"] for row in read_metrics(tmp_path / "evaluations.csv")]
    assert max(evaluations[1:]) > evaluations[0] + 400, evaluations  # random: about -1,300
    played = subprocess.run([sys.executable, "-m", "jaxdist.tools.evaluate", str(tmp_path), "--best", "--episodes",
                             "2"], capture_output=True, text=True, timeout=120)
    assert played.returncode == 0 and played.stdout.count("episode ") == 2, played.stdout + played.stderr


def test_a_discrete_env_is_refused_before_launch_with_one_line(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT, "--env-id", "CartPole-v1", "--run-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and not os.listdir(tmp_path)
    assert done.stderr.strip().splitlines() == [
        "error: TD3 acts in continuous (Box) action spaces and CartPole-v1's actions are discrete: use PPO "
        "(experiments/ppo.py), IMPALA (experiments/impala.py) or Ape-X DQN (experiments/apex_dqn.py)"], done.stderr
