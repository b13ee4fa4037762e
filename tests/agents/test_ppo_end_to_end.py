"""PPO end to end: the whole program (actors, FIFO replay, learner) learns CartPole, under the
threads launcher in this process and under the processes launcher through the demo script."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time

import pytest

from jaxdist.agents.ppo import PPOConfig, train
from jaxdist.metrics import read_metrics
from jaxdist.metrics_tensorboard import read_scalars

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_threads_launcher_run_clearly_improves_the_return_in_under_two_minutes(tmp_path):
    start = time.monotonic()
    out = io.StringIO()
    config = PPOConfig(num_actors=2, envs_per_actor=4, total_steps=60_000, seed=1)
    summary = train(config, launcher="threads", run_dir=str(tmp_path), target_return=200.0, stop_at_target=True,
                    echo=False, out=out)
    elapsed = time.monotonic() - start
    assert elapsed < 120, out.getvalue()
    # A random policy averages ~22 on CartPole; the run stops once the last 20 episodes average 200.
    assert summary["steps_to_target"] is not None, out.getvalue()
    assert summary["final_return"] >= 200
    rows = read_metrics(tmp_path / "metrics.csv")  # the learner's: losses and the measured lag
    assert rows and {"policy_lag_mean", "policy_lag_max", "stale_fraction", "loss"} <= set(rows[-1])
    assert max(row["policy_lag_max"] for row in rows) <= 20
    progress = read_metrics(tmp_path / "progress.csv")
    assert progress[-1]["episode_return"] >= 200
    assert "progress/episode_return" in read_scalars(tmp_path / "tensorboard" / "progress")
    assert (tmp_path / "learning_curve.png").read_bytes().startswith(b"\x89PNG")
    assert "[ppo]" in out.getvalue() and "return" in out.getvalue()


@pytest.mark.slow
def test_the_demo_script_solves_cartpole_across_processes_and_resumes(tmp_path):
    script = os.path.join(REPO, "experiments", "ppo_cartpole.py")
    run = [sys.executable, script, "--run-dir", str(tmp_path), "--stop-at-target", "--quiet", "--compilation-cache", ""]
    done = subprocess.run(run, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reached mean return 475" in done.stdout, done.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps_to_target"] <= 500_000
    for name in ("actor-0.log", "actor-1.log", "learner-0.log"):
        assert (tmp_path / "logs" / name).exists()
    stopped = re.findall(r"stopped at step (\d+)", (tmp_path / "logs" / "learner-0.log").read_text())
    version = int(stopped[-1])  # saved when it stopped
    # Again with the same run directory: the learner resumes from its checkpoint.
    total = (version + 20) * PPOConfig().steps_per_update
    again = subprocess.run([sys.executable, script, "--run-dir", str(tmp_path), "--quiet", "--compilation-cache", "",
                            "--total-steps", str(total)], capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"restored step {version}" in (tmp_path / "logs" / "learner-0.log").read_text()
    resumed = json.loads((tmp_path / "summary.json").read_text())
    assert resumed["learner_version"] == version + 20 and resumed["env_steps"] >= total


@pytest.mark.slow
def test_actors_keep_acting_while_the_learner_is_killed_and_comes_back_from_its_checkpoint(tmp_path):
    import signal

    import jaxdist as jd
    from jaxdist import courier
    from jaxdist.agents.ppo import builder

    config = PPOConfig(total_steps=10**8, checkpoint_every_updates=20)
    running = jd.launch(builder.make_program(config), launcher="processes", run_dir=str(tmp_path), echo=False,
                        resources=builder.resources(config), restart=builder.restarts())
    try:
        learner = courier.Client(running.addresses[builder.LEARNER], token=running.token, timeout=5)
        actors = [courier.Client(running.addresses[f"actor/{i}"], token=running.token, timeout=5) for i in range(2)]

        def wait_for(condition, what, timeout=60.0):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    if condition():
                        return
                except courier.CourierError:
                    pass
                time.sleep(0.05)
            raise AssertionError(f"timed out waiting for {what}; status {running.status()}")

        checkpoints = tmp_path / "checkpoints" / builder.LEARNER
        wait_for(lambda: checkpoints.is_dir() and any(name.isdigit() for name in os.listdir(checkpoints)),
                 "a committed checkpoint (saves are asynchronous)", timeout=120)
        os.kill(running.status()["learner/0"]["pid"], signal.SIGKILL)
        steps = [a.stats()["env_steps"] for a in actors]
        wait_for(lambda: running.status()["learner/0"]["restarts"] == 1, "the supervisor to restart the learner")
        # The actors never stopped: they acted on, with the parameters they held.
        wait_for(lambda: all(a.stats()["env_steps"] > s + 2000 for a, s in zip(actors, steps)), "acting on")
        wait_for(lambda: (learner.status()["restored_step"] or 0) >= 20, "a learner restored from its checkpoint",
                 timeout=120)
        restored = learner.status()["restored_step"]
        wait_for(lambda: learner.status()["step"] > restored + 10, "learning again")
        # ... and follow the new learner's parameters.
        wait_for(lambda: all(abs(a.stats()["version"] - learner.status()["step"]) <= 5 for a in actors),
                 "actors on the restarted learner's parameters")
    finally:
        running.stop()
