"""ES end to end: its script's command line is generated from ``ESConfig`` with per-env
presets and refuses to resume with another config; the program wires the master by its handle;
the whole program (master and worker nodes), watched by the agents' shared monitor, learns
CartPole under the threads launcher and resumes from its checkpoint, counting the target over
the whole run; under the processes launcher Ctrl-C is an ordered stop, and a run carries on
through a worker killed mid-run."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import jaxdist as jd
from jaxdist import courier
from jaxdist.agents.run import parse
from jaxdist.agents import experiment, es
from jaxdist.agents.es import PRESETS, ESConfig
from jaxdist.agents.run import train
from jaxdist.records.metrics import read_metrics
from jaxdist.records.metrics_tensorboard import read_scalars
from interruptible import popen_interruptible

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "experiments", "es.py")


def test_every_config_field_is_a_flag_and_the_env_picks_its_preset():
    help_text = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=60).stdout
    for field in dataclasses.fields(ESConfig):
        assert "--" + field.name.replace("_", "-") in help_text, field.name
    config, run = parse(ESConfig, PRESETS, None, args=["--env-id", "Pendulum-v1", "--sigma", "0.05"])
    assert config.env_id == "Pendulum-v1" and config.target_return == -200.0
    assert config.episodes_per_member == 8 and config.total_steps == 40_000_000
    assert config.sigma == 0.05  # a flag overrides the class default
    assert run.launcher == "processes"
    config, _ = parse(ESConfig, PRESETS, None, args=["--env-id", "Pendulum-v1", "--total-steps", "1000"])
    assert config.total_steps == 1000  # and the preset


def test_a_resume_with_another_config_names_the_fields_and_refuses(tmp_path):
    experiment.save(str(tmp_path), "jaxdist.agents.es:agent", ESConfig(sigma=0.1))
    done = subprocess.run([sys.executable, SCRIPT, "--quiet", "--run-dir", str(tmp_path), "--sigma", "0.2"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "sigma: 0.1 -> 0.2" in done.stderr and "--allow-config-change" in done.stderr, done.stderr


def test_the_workers_call_the_master_by_the_handle_add_node_gave_it():
    topology = es.agent(ESConfig(num_workers=3)).topology()
    (master,) = topology.program.groups["master"]
    workers = topology.program.groups["worker"]
    assert topology.learner.node_name == master.name 
    assert [handle.node_name for handle in topology.acting] == [node.name for node in workers]
    assert all(node.args[0] is topology.learner for node in workers)
    assert [handle.node_name for handle in master.args[0]] == [node.name for node in workers]
    assert master.default_restart() == es.MASTER_RESTART and master.stops_first()  # node options
    assert all(node.default_restart() == es.WORKER_RESTART for node in workers)


@pytest.mark.slow
def test_a_threads_run_solves_cartpole_then_a_rerun_resumes_and_counts_the_target_over_the_whole_run(tmp_path):
    out = io.StringIO()
    config = ESConfig(seed=1, stop_at_target=True)
    summary = train(es.agent(config), launcher="threads", run_dir=str(tmp_path), echo=False, out=out)
    assert summary["final_return"] >= 475, out.getvalue()
    assert summary["stop_reason"] == (f"the evaluation of version {summary['learner_version']} reached the target 475 "
                                      f"(node 'master/0')")
    assert summary["steps_to_target"] is not None and summary["wall_time_to_target"] is not None
    evaluations = read_metrics(tmp_path / "evaluations.csv")  # the mean policy's, one row per generation
    assert evaluations[0]["mean_return"] < 300 <= 475 <= evaluations[-1]["mean_return"]  # clearly improved
    generations = [row["step"] for row in evaluations]
    assert generations == list(range(1, summary["learner_version"] + 1))
    metrics = read_metrics(tmp_path / "metrics.csv")
    assert [row["step"] for row in metrics] == generations and metrics[-1]["workers_live"] == 2
    assert summary["train_return"] is not None  # the population's returns, as the workers report them
    assert "learner/population_return" in read_scalars(tmp_path / "tensorboard" / "learner")
    assert "progress/eval_return" in read_scalars(tmp_path / "tensorboard" / "progress")
    assert (tmp_path / "learning_curve.png").read_bytes().startswith(b"\x89PNG")
    saved = experiment.load(str(tmp_path))
    assert (saved.factory, saved.fields) == ("jaxdist.agents.es:agent", experiment.to_dict(config))  # the resolved config is saved

    more = dataclasses.replace(config, stop_at_target=False, total_steps=metrics[-1]["env_steps"] + 60_000)
    resumed = train(es.agent(more), launcher="threads", run_dir=str(tmp_path), echo=False, out=out)
    assert resumed["restored_step"] == summary["learner_version"]
    assert resumed["learner_version"] > summary["learner_version"] and resumed["env_steps"] >= more.total_steps
    # Time and steps to the target are the first segment's: counted over the whole run.
    assert resumed["steps_to_target"] == summary["steps_to_target"]
    assert resumed["wall_time_to_target"] == pytest.approx(summary["wall_time_to_target"], abs=0.1)
    assert resumed["wall_time"] > summary["wall_time"]
    metrics = read_metrics(tmp_path / "metrics.csv")  # one row per generation across both runs
    assert [row["step"] for row in metrics] == list(range(1, resumed["learner_version"] + 1))
    assert metrics[-1]["env_steps"] >= more.total_steps

    again = train(es.agent(more), launcher="threads", run_dir=str(tmp_path), echo=True, out=out)
    assert again["learner_version"] == resumed["learner_version"]
    # Its last evaluation is the run's, not "no evaluation finished" for a segment that made none.
    assert (again["final_return"], again["final_return_version"]) == (resumed["final_return"],
                                                                       resumed["final_return_version"])
    assert "pass --fresh" in (tmp_path / "logs" / "master-0.log").read_text()


def test_the_script_stopped_at_its_target_ends_with_its_summary_and_exit_code_zero(tmp_path):
    """The agent scripts' end reads a sweep's fields, which ES's config has not: a run that
    stopped at its target printed its summary, then a traceback, and exited 1."""
    done = subprocess.run([sys.executable, SCRIPT, "--run-dir", str(tmp_path), "--quiet", "--stop-at-target",
                           "--launcher", "threads", "--seed", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "reached evaluation return 475" in done.stdout and "Traceback" not in done.stderr, done.stderr[-3000:]


@pytest.mark.slow
def test_ctrl_c_is_the_ordered_stop_with_one_line_and_a_summary(tmp_path):
    process = popen_interruptible([sys.executable, SCRIPT, "--quiet", "--compilation-cache", "", "--run-dir",
                                   str(tmp_path), "--env-id", "Pendulum-v1", "--total-steps", "1000000000"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        rows = []
        while time.monotonic() < deadline and len(rows) < 3:  # a few generations in
            time.sleep(0.5)
            if (tmp_path / "evaluations.csv").exists():
                rows = read_metrics(tmp_path / "evaluations.csv")
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, stdout + stderr
    assert "Traceback" not in stdout + stderr, stdout + stderr
    assert "stopped by Ctrl-C at update" in stdout and "(checkpoint saved)" in stdout, stdout
    generation = int(stdout.split("stopped by Ctrl-C at update ")[1].split()[0])
    assert generation >= 3 and str(generation) in os.listdir(tmp_path / "checkpoints" / "master" / "0")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stop_reason"].startswith("stopped by Ctrl-C") and summary["learner_version"] == generation


@pytest.mark.slow
def test_a_processes_run_carries_on_through_a_worker_killed_mid_run(tmp_path):
    config = ESConfig(seed=0, num_workers=2, total_steps=1_200_000, backup_after=1.0)
    topology = es.agent(config).topology()
    running = jd.launch(topology.program, launcher="processes", run_dir=str(tmp_path), echo=False,
                        resources=experiment.resources(topology.program))
    try:
        master = courier.Client(running.addresses[topology.learner.node_name], token=running.token, timeout=10)
        deadline = time.monotonic() + 120
        while master.status()["step"] < 3:
            assert time.monotonic() < deadline, running.status()
            time.sleep(0.05)
        os.kill(running.status()["worker/0"]["pid"], signal.SIGKILL)
        assert running.wait(timeout=240)
    finally:
        running.stop()
    assert running.stop_reason.startswith("training is over at generation ") and \
        running.stop_reason.endswith(" env steps) (node 'master/0')"), running.stop_reason
    assert running.status()["worker/0"]["restarts"] == 1
    last = read_metrics(tmp_path / "metrics.csv")[-1]
    assert last["env_steps"] >= 1_200_000
    assert last["requeued"] + last["backups"] >= 1  # the dead worker's task was done by the other
    assert read_metrics(tmp_path / "evaluations.csv")[-1]["mean_return"] >= 475
