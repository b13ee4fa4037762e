"""PPO end to end: the Python surface, the experiment script as a user runs it (processes,
the README's configuration and target), resume across segments, Ctrl-C, load_policy and
``python -m jaxdist.tools.evaluate``, continuous control and a pixel env with a CNN."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import jaxdist as jd
from jaxdist import courier
from jaxdist.agents import experiment, load_policy, ppo
from jaxdist.agents.experiment import with_preset
from jaxdist.agents.run import parse
from jaxdist.agents.run import default_run_dir, train
from jaxdist.records.metrics import read_metrics
from jaxdist.records.metrics_tensorboard import read_scalars
from interruptible import popen_interruptible
from run_checks import check_solved_and_final_policy_evaluated

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "experiments", "ppo.py")
SUPPORT = os.path.join(REPO, "tests", "support")


def script(*args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=SUPPORT)
    return subprocess.run([sys.executable, SCRIPT, "--quiet", "--compilation-cache", "", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, **kwargs)


def test_every_config_field_is_a_flag_and_the_env_picks_its_preset():
    help_text = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=60).stdout
    for field in ("gamma", "clip_eps", "ent_coef", "normalize_observations", "network", "eval_episodes", "env_id"):
        assert "--" + field.replace("_", "-") in help_text, field
    config, run = parse(ppo.PPOConfig, ppo.PRESETS, None, ["--env-id", "Pendulum-v1", "--gamma", "0.95"])
    assert config.env_id == "Pendulum-v1" and config.normalize_observations and config.target_return == -250.0
    assert config.gamma == 0.95  # a flag overrides the preset
    assert run.launcher == "processes"


def test_a_resume_with_another_config_names_the_fields_and_refuses(tmp_path):
    experiment.save(str(tmp_path), "jaxdist.agents.ppo:agent", ppo.PPOConfig(gamma=0.98))
    done = script("--run-dir", str(tmp_path), "--gamma", "0.9", "--ent-coef", "0.01", timeout=60)
    assert done.returncode != 0
    assert "gamma: 0.98 -> 0.9" in done.stderr and "ent_coef: 0.0 -> 0.01" in done.stderr, done.stderr
    assert "--allow-config-change" in done.stderr


def test_python_and_the_command_line_default_to_one_run_directory():
    """``train(agent)`` from Python wrote runs/ppo-seed0, the script runs/ppo-cartpole-seed0:
    a resume from the other entry point started over."""
    config, run = parse(ppo.PPOConfig, ppo.PRESETS, None, args=["--env-id", "Pendulum-v1", "--seed", "3"])
    assert run.run_dir is None and default_run_dir(ppo.agent(config)) == os.path.join("runs", "ppo-pendulum-seed3")


def test_the_default_run_directory_names_a_variant_of_the_demo():
    """Before, ``--architecture anakin`` or ``--env-backend jax`` after the demo met the demo's run
    directory and was refused as another config until ``--run-dir`` was given."""
    def run_dir(*flags):
        config, _ = parse(ppo.PPOConfig, ppo.PRESETS, None, args=list(flags))
        return default_run_dir(ppo.agent(config))

    assert run_dir() == os.path.join("runs", "ppo-cartpole-seed0")
    assert run_dir("--architecture", "anakin") == os.path.join("runs", "ppo-cartpole-anakin-seed0")
    assert run_dir("--env-backend", "jax") == os.path.join("runs", "ppo-cartpole-jax-seed0")


def test_the_scripts_usage_names_the_demos_actors_and_envs():
    """The demo script's usage said 2 actors x 8 envs where the CartPole preset plays 1 x 16."""
    config = with_preset(ppo.PPOConfig, "CartPole-v1", ppo.PRESETS)
    with open(os.path.join(REPO, "experiments", "ppo.py")) as f:
        usage = f.read()
    actors = "actor" if config.num_actors == 1 else "actors"
    assert f"CartPole-v1, {config.num_actors} {actors} x {config.envs_per_actor} envs" in usage


def test_the_program_ends_itself_once_the_final_policy_is_evaluated(tmp_path):
    """Before, the learner ended the program after its last update: the final policy (here
    update 6, evaluating every 10), the one ``load_policy`` restores, was never evaluated."""
    config = ppo.PPOConfig(num_actors=1, envs_per_actor=4, total_steps=4 * 32 * 6, checkpoint_every_updates=3)
    running = jd.launch(ppo.make_program(config), launcher="threads", run_dir=str(tmp_path), echo=False)
    assert running.wait(timeout=120), running.status()  # returns by itself: the evaluator called jd.stop()
    # The evaluator, colocated, says why.
    assert running.stop_reason == "training is over: its final policy, version 6, was evaluated (node 'learner/0/2')"
    assert read_metrics(tmp_path / "evaluations.csv")[-1]["step"] == 6
    assert load_policy(str(tmp_path)).step == 6


def test_a_run_that_is_over_is_not_launched_again(tmp_path):
    """Before, relaunching a finished run started every node again to evaluate its final policy
    a second time: a second row for it in evaluations.csv, and a rewritten record."""
    config = ppo.PPOConfig(num_actors=1, envs_per_actor=4, total_steps=4 * 32 * 6, eval_every_updates=10)
    first = train(ppo.agent(config), launcher="threads", run_dir=str(tmp_path), echo=False, out=io.StringIO())
    evaluations = (tmp_path / "evaluations.csv").read_text()
    assert first["learner_version"] == 6 and read_metrics(tmp_path / "evaluations.csv")[-1]["step"] == 6
    again = train(ppo.agent(config), launcher="threads", run_dir=str(tmp_path), echo=False, out=io.StringIO())
    assert again["stop_reason"].startswith("nothing launched: the run has trained to its last update (6)")
    assert "--allow-config-change" in again["stop_reason"]
    assert {k: v for k, v in again.items() if k != "stop_reason"} == {k: v for k, v in first.items()
                                                                       if k != "stop_reason"}
    assert (tmp_path / "evaluations.csv").read_text() == evaluations
    assert json.loads((tmp_path / "summary.json").read_text()) == first  # the record is the run's, unchanged
    # More steps resume it.
    more = dataclasses.replace(config, total_steps=4 * 32 * 9)
    resumed = train(ppo.agent(more), launcher="threads", run_dir=str(tmp_path), echo=False, out=io.StringIO())
    assert resumed["restored_step"] == 6 and resumed["learner_version"] == 9


def test_at_the_target_the_learner_finishes_and_the_policy_it_saved_is_the_last_evaluated(tmp_path):
    """Before, the evaluator stopped the program at the target while the learner ran on, tens of
    updates in the demo: the policy it saved, the one ``load_policy`` restores, went unevaluated."""
    config = ppo.PPOConfig(num_actors=1, envs_per_actor=4, eval_every_updates=2, target_return=60.0,
                           stop_at_target=True)
    running = jd.launch(ppo.make_program(config), launcher="threads", run_dir=str(tmp_path), echo=False)
    assert running.wait(timeout=120), running.status()
    rows = read_metrics(tmp_path / "evaluations.csv")
    assert running.stop_reason == (f"training is over: its final policy, version {rows[-1]['step']}, was evaluated "
                                   f"(node 'learner/0/2')")
    best = max(rows, key=lambda row: row["mean_return"])
    assert best["mean_return"] >= 60.0 and load_policy(str(tmp_path)).step == rows[-1]["step"]
    # The saved policy can score below the one at the target (27.1 once): the best one is kept too.
    assert load_policy(str(tmp_path), best=True).step == best["step"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_demo_script_solves_cartpole_across_processes_and_resumes_its_accounting(tmp_path):
    done = script("--run-dir", str(tmp_path), "--stop-at-target")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reached evaluation return 475" in done.stdout, done.stdout
    first = check_solved_and_final_policy_evaluated(tmp_path)
    assert first["steps_to_target"] <= 200_000
    assert json.loads((tmp_path / "config.json").read_text())["config"]["target_return"] == 475.0
    for name in ("actor-0.log", "learner-0.log"):  # CartPole's preset: one actor of 16 envs
        assert (tmp_path / "logs" / name).exists()
    assert first["stop_reason"] == (f"training is over: its final policy, version {first['learner_version']}, was "
                                    f"evaluated (node 'learner/0/2')")  # the evaluator, colocated
    assert "progress/eval_return" in read_scalars(tmp_path / "tensorboard" / "progress")
    # The same command again has nothing to do: the run stopped at its target.
    again = script("--run-dir", str(tmp_path), "--stop-at-target")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "nothing launched: the run reached its target 475" in again.stdout, again.stdout
    assert json.loads((tmp_path / "summary.json").read_text()) == first
    # Training on resumes: the target and its steps were reached in the first segment and stay so;
    # progress.csv and the wall time continue.
    more = script("--run-dir", str(tmp_path), "--total-steps", str(first["env_steps"] + 20_000),
                  "--allow-config-change")
    assert more.returncode == 0, more.stdout + more.stderr
    assert "resuming from the learner's checkpoint" in more.stdout, more.stdout
    second = json.loads((tmp_path / "summary.json").read_text())
    assert second["learner_version"] > first["learner_version"]
    assert second["steps_to_target"] == first["steps_to_target"]
    assert second["wall_time_to_target"] == first["wall_time_to_target"]
    assert second["wall_time"] > first["wall_time"] and second["env_steps"] >= first["env_steps"]
    rows = read_metrics(tmp_path / "progress.csv")
    seconds = [row["run_seconds"] for row in rows]
    assert seconds == sorted(seconds)  # one clock over both segments
    rates = [row["env_steps_per_second"] for row in rows if row["run_seconds"] > first["wall_time"]]
    known = [rate for rate in rates if rate is not None]  # a segment's first poll has no rate yet
    assert known and max(known) < 200_000  # a resumed segment does not count earlier segments' steps as its own
    # The trained policy, from Python and from the command line.
    policy = load_policy(str(tmp_path))
    assert policy.act(np.zeros((3, 4), np.float32)).shape == (3,)
    with pytest.raises(ValueError, match=r"\(N, 4\)"):
        policy.act(np.zeros(4, np.float32))
    # The best evaluation's policy (>= 475; the latest checkpoint's can score below the target).
    evaluated = subprocess.run([sys.executable, "-m", "jaxdist.tools.evaluate", str(tmp_path), "--best", "--episodes", "3",
                                "--video", str(tmp_path / "video")], capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
    mean = float(evaluated.stdout.split("mean return ")[1].split()[0])
    assert mean >= 400, evaluated.stdout
    assert len([name for name in os.listdir(tmp_path / "video") if name.endswith(".mp4")]) == 3


@pytest.mark.slow
def test_ctrl_c_is_the_ordered_stop_with_one_line_and_a_summary(tmp_path):
    process = popen_interruptible([sys.executable, SCRIPT, "--quiet", "--compilation-cache", "", "--run-dir",
                                   str(tmp_path), "--total-steps", "100000000"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not (tmp_path / "evaluations.csv").exists():
            time.sleep(0.2)
        rows = []
        while time.monotonic() < deadline and len(rows) < 3:  # trained a little: evaluations of several versions
            time.sleep(0.5)
            rows = read_metrics(tmp_path / "evaluations.csv")
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, stdout + stderr
    assert "Traceback" not in stdout + stderr, stdout + stderr
    assert "stopped by Ctrl-C at update" in stdout and "run the same command to resume" in stdout, stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    update = int(stdout.split("stopped by Ctrl-C at update ")[1].split()[0])
    assert update > 0 and str(update) in os.listdir(tmp_path / "checkpoints" / "learner" / "0" / "1")
    assert summary["stop_reason"].startswith("stopped by Ctrl-C")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_cnn_learns_a_pixel_env_given_as_module_colon_id(tmp_path):
    # A coin flip scores ~8 of 16; the side of the block is visible only in the pixels.
    config = ppo.PPOConfig(env_id="pixel_envs:PixelChase-v0", network="cnn", num_actors=1, envs_per_actor=8,
                           trajectory_length=16, total_steps=40_000, learning_rate=2.5e-4, ent_coef=0.01, epochs=4,
                           eval_every_updates=10, env_backend="sync", target_return=13.5, stop_at_target=True)
    summary = train(ppo.agent(config), launcher="threads", run_dir=str(tmp_path), echo=False, out=io.StringIO())
    evaluations = [row["mean_return"] for row in read_metrics(tmp_path / "evaluations.csv")]
    assert evaluations[0] < 11 and summary["wall_time_to_target"] is not None, evaluations


@pytest.mark.slow
def test_actors_keep_acting_while_the_learner_is_killed_and_comes_back_from_its_checkpoint(tmp_path):
    config = ppo.PPOConfig(total_steps=10**8, checkpoint_every_updates=20)
    topology = ppo.agent(config).topology()
    running = jd.launch(topology.program, launcher="processes", run_dir=str(tmp_path), echo=False,
                        resources=experiment.resources(topology.program))
    try:
        learner = courier.Client(running.addresses[topology.learner.node_name], token=running.token, timeout=5)
        actors = [courier.Client(running.addresses[a.node_name], token=running.token, timeout=5)
                  for a in topology.acting]

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

        checkpoints = tmp_path / "checkpoints" / topology.learner.node_name
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


@pytest.mark.slow
def test_track_logs_the_progress_and_config_to_weights_and_biases_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # no account, no network: the run is written locally
    # As a user runs it, in a fresh process: in this one, threads left by earlier tests could
    # compile code while wandb's imports do, which CPython 3.11 fails ("AST constructor
    # recursion depth mismatch").
    done = script("--run-dir", str(tmp_path), "--track", "jaxdist-tests", "--launcher", "threads", "--num-actors", "1",
                  "--envs-per-actor", "4", "--total-steps", str(4 * 32 * 4), "--eval-every-updates", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [name for name in os.listdir(tmp_path / "wandb") if name.startswith("offline-run-")]
    assert len(runs) == 1, os.listdir(tmp_path / "wandb")
    log = tmp_path / "wandb" / runs[0]
    records = b"".join(path.read_bytes() for path in log.glob("*.wandb"))  # the run's record log
    assert b"num_actors" in records and b"CartPole-v1" in records  # the config
    assert b"progress/eval_return" in records  # the progress rows


def test_hosts_saving_the_config_into_one_shared_run_directory_at_once_all_succeed(tmp_path):
    """Every host of a multihost run saves config.json into the shared run directory: with one
    temporary name, a host's replace took another's file away (FileNotFoundError, in CI)."""
    code = ("import sys; from jaxdist.agents import experiment, ppo\n"
            "for _ in range(200): experiment.save(sys.argv[1], 'jaxdist.agents.ppo:agent', ppo.PPOConfig())\n")
    savers = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stderr=subprocess.PIPE, text=True)
              for _ in range(4)]
    errors = [saver.communicate(timeout=120)[1] for saver in savers]
    assert [saver.returncode for saver in savers] == [0] * 4, errors
    assert experiment.load(str(tmp_path)).factory == "jaxdist.agents.ppo:agent"
