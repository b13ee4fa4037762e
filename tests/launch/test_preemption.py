"""SIGTERM to a launching script: every stateful node saves, everything exits 0, and a new launch
on the same run directory carries on from the saved step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

import learner_nodes as ln
from waiting import wait_until
from jaxdist.records.metrics import read_metrics

SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")


def latest_logged_step(run_dir: str) -> int:
    try:
        return max((row["step"] for row in read_metrics(os.path.join(run_dir, "metrics.csv"))), default=0)
    except FileNotFoundError:
        return 0


def run_until_steps(run_dir: str, steps: int) -> subprocess.Popen:
    script = subprocess.Popen([sys.executable, "-c", ln.launch_learner_script(run_dir, SUPPORT)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert script.stdout.readline().strip() == "launched"
    wait_until(lambda: latest_logged_step(run_dir) >= steps, f"the learner to log step {steps}", timeout=120)
    return script


@pytest.mark.timeout(300)
def test_sigterm_to_the_launcher_checkpoints_exits_zero_and_a_relaunch_continues(tmp_path):
    run_dir = str(tmp_path)
    script = run_until_steps(run_dir, 15)
    script.send_signal(signal.SIGTERM)
    output, _ = script.communicate(timeout=60)
    assert script.returncode == 0, output
    assert "stopped: the launcher got SIGTERM" in output
    saved = sorted(int(n) for n in os.listdir(os.path.join(run_dir, "checkpoints", "learner", "0")) if n.isdigit())
    assert saved and saved[-1] >= 15  # saved where it stopped, not on the 1000-step interval

    script = run_until_steps(run_dir, saved[-1] + 5)
    script.send_signal(signal.SIGTERM)
    script.communicate(timeout=60)
    with open(os.path.join(run_dir, "logs", "learner-0.log")) as log:
        assert f"restored step {saved[-1]}" in log.read()
