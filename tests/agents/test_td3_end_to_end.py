"""TD3 end to end: a discrete env is refused before anything launches. Its script's run on
processes, through a SIGKILL of its learner and replay, to its target and its best policy's
playback is in ``tests/chaos/test_off_policy_kills.py``."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "experiments", "td3.py")


def test_a_discrete_env_is_refused_before_launch_with_one_line(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT, "--env-id", "CartPole-v1", "--run-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and not os.listdir(tmp_path)
    assert done.stderr.strip().splitlines() == [
        "error: TD3 acts in continuous (Box) action spaces and CartPole-v1's actions are discrete: use PPO "
        "(experiments/ppo.py), IMPALA (experiments/impala.py) or Ape-X DQN (experiments/apex_dqn.py)"], done.stderr
