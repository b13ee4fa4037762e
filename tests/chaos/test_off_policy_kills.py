"""Chaos: TD3's script as a user runs it (processes, Pendulum-v1's preset, ``--stop-at-target``)
has its learner process -- the learner, the replay colocated with it and the evaluator -- SIGKILLed
while it learns; the launcher restarts it, the learner restores its checkpoint and the replay its
contents, and the run still reaches -200, with parameters that the restarted learner made. Its
best policy then plays back through ``python -m jaxdist.tools.evaluate``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from jaxdist.learning.layout import checkpoint_dir
from jaxdist.records.metrics import read_metrics
from orphans import node_process
from resume_checks import committed_steps
from waiting import wait_until

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "experiments", "td3.py")
TARGET = -200.0


@pytest.mark.timeout(400)
def test_td3_reaches_its_target_through_a_sigkill_of_its_learner_and_replay_and_its_best_policy_plays(tmp_path):
    run_dir = str(tmp_path)
    learner_checkpoints = checkpoint_dir(run_dir, "learner/0/1")
    replay_checkpoints = checkpoint_dir(run_dir, "learner/0/0")
    # Checkpoints often enough that the kill lands between saves of both, long before the target.
    script = subprocess.Popen([sys.executable, SCRIPT, "--run-dir", run_dir, "--total-steps", "15000", "--seed", "1",
                               "--stop-at-target", "--checkpoint-every-updates", "400",
                               "--replay-checkpoint-seconds", "2", "--quiet", "--compilation-cache", ""],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Learning has begun and both have saved since: the learner its first checkpoint, then the
        # replay (every 2 s) the transitions learned from.
        wait_until(lambda: committed_steps(learner_checkpoints), "the learner's first checkpoint", timeout=240)
        replay_step = max(committed_steps(replay_checkpoints), default=0)
        wait_until(lambda: max(committed_steps(replay_checkpoints), default=0) > replay_step,
                   "the replay's next checkpoint")
        process = wait_until(lambda: node_process(script.pid, run_dir, "learner/0"), "the learner's process")
        killed_at = time.time()
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        saved = committed_steps(learner_checkpoints)[-1]  # the newest complete one: what a restart restores
        output, _ = script.communicate(timeout=300)
    finally:
        if script.poll() is None:
            script.kill()
            script.communicate()
    assert script.returncode == 0, output[-3000:]
    assert "reached evaluation return -200" in output, output[-3000:]

    log = open(os.path.join(run_dir, "logs", "learner-0.log")).read()
    restored = [int(step) for step in re.findall(r"learner/0/1: restored step (\d+)", log)]
    assert restored == [saved], (restored, saved, log[-3000:])
    sizes = [int(size) for size in re.findall(r"replay node learner/0/0 restored checkpoint step \d+ "
                                               r"\(default: (\d+)\)", log)]
    assert len(sizes) == 1 and sizes[0] >= 500, log[-3000:]  # the learning_starts transitions, and more
    evaluations = read_metrics(os.path.join(run_dir, "evaluations.csv"))
    assert max([row["mean_return"] for row in evaluations if row["wall_time"] < killed_at], default=-2000) < TARGET
    solved = next(row for row in evaluations if row["mean_return"] >= TARGET)
    assert solved["step"] > restored[0], (solved, restored)  # by the restarted learner's updates
    print(f"\nSIGKILL after the learner's checkpoint of update {saved}; restored update {restored[0]} and "
          f"{sizes[0]} transitions; -200 reached by version {solved['step']} ({solved['mean_return']:.1f})")

    played = subprocess.run([sys.executable, "-m", "jaxdist.tools.evaluate", run_dir, "--best", "--episodes", "2"],
                            capture_output=True, text=True, timeout=120)
    assert played.returncode == 0 and played.stdout.count("episode ") == 2, played.stdout + played.stderr
