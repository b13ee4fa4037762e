"""The benchmarks page's table writer (``experiments/benchmarks/results.py``): the page written by
several processes at once, the commit of a tree without its git directory, the accelerator in
the machine's words, and the rows and curves of a launch of vmapped seeds."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxdist.nodes.evaluator import EVALUATIONS, record
from jaxdist.records.metrics import MetricsWriter, metrics_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "experiments", "benchmarks", "results.py")


def load(path: str = SCRIPT):
    spec = importlib.util.spec_from_file_location(f"results_{abs(hash(path))}", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


results = load()

WRITER = """
import importlib.util, os, sys, time
spec = importlib.util.spec_from_file_location("results", sys.argv[1])
results = sys.modules["results"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(results)
open(sys.argv[5] + "." + sys.argv[3], "w").close()  # ready
while not os.path.exists(sys.argv[5]):  # all start writing together
    time.sleep(0.001)
for i in range(int(sys.argv[4])):
    results.write_page(results.Measurement("ppo", sys.argv[3]), f"written {i}", page=sys.argv[2])
"""


def test_the_page_keeps_every_block_when_four_processes_write_it_at_once(tmp_path) -> None:
    """Each writer reads, changes and writes the whole page: without the lock a writer that read
    before another wrote puts back the page without the other's block."""
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n\n## Agents to their target\n\n## Micro-benchmarks\n\nthe rest\n")
    writes, envs = 300, ["Breakout-MinAtar", "SpaceInvaders-MinAtar", "Asterix-MinAtar", "Freeway-MinAtar"]
    go = tmp_path / "go"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, SCRIPT, str(page), env, str(writes), str(go)])
               for env in envs]
    while not all(os.path.exists(f"{go}.{env}") for env in envs):
        assert all(writer.poll() is None for writer in writers), "a writer ended before it was ready"
        time.sleep(0.01)
    go.touch()
    assert [writer.wait(timeout=60) for writer in writers] == [0] * len(envs)
    content = page.read_text()
    for env in envs:
        assert content.count(f"<!-- results: ppo {env} -->") == 1
        assert f"<!-- results: ppo {env} -->\nwritten {writes - 1}\n<!-- /results -->" in content
    assert content.endswith("## Micro-benchmarks\n\nthe rest\n")


def test_a_copy_without_its_git_directory_needs_the_commit_named(tmp_path) -> None:
    copy = tmp_path / "tree" / "experiments" / "benchmarks"
    copy.mkdir(parents=True)
    shutil.copy(SCRIPT, copy / "results.py")
    copied = load(str(copy / "results.py"))
    with pytest.raises(SystemExit, match="not a git checkout.*pass --commit HASH"):
        copied.commit()
    assert copied.commit("0c25fa6") == "0c25fa6"
    assert results.commit().split("+")[0] == subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def test_the_machine_names_the_gpus_nvidia_smi_lists(tmp_path, monkeypatch) -> None:
    """nvidia-smi is asked, not JAX: the runs need the device's memory, which a JAX started in
    this process would hold. This machine has no GPU, so a script in nvidia-smi's place answers
    as nvidia-smi does on a machine of two."""
    monkeypatch.setenv("PATH", str(tmp_path))
    cpus = results.machine()
    assert cpus.startswith(f"{os.cpu_count()} cores of ")
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\n[ "$1 $2" = "--query-gpu=name --format=csv,noheader" ] && '
                    'printf "NVIDIA H200\\nNVIDIA H200\\n"\n')
    fake.chmod(0o755)
    assert results.machine() == f"2 x NVIDIA H200 and {cpus}"


def test_a_launch_of_vmapped_seeds_is_a_row_per_seed_with_its_curve(tmp_path) -> None:
    """The rows and picture of one launch of three vmapped seeds, from the files such a run
    writes (evaluations.csv by the learner's recorder, progress.csv by the monitor)."""
    run_dir = str(tmp_path / "ppo-Breakout-MinAtar-3seeds")
    progress = MetricsWriter(metrics_path(run_dir, "progress"))
    evaluations = MetricsWriter(metrics_path(run_dir, EVALUATIONS))
    for version in range(1, 6):
        progress.write(version * 8192, {"run_seconds": float(version)})
        record(evaluations, version, np.array([[version * 2.0] * 2, [version * 3.0] * 2, [version * 7.0] * 2]),
               28.0, stop_at_target=False, env_steps=version * 8192)
    progress.close()
    evaluations.close()
    summary = {"target_return": 28.0, "num_seeds": 3, "env_steps": 40960, "steps_per_second": 5000,
               "steps_to_target": 32768, "wall_time_to_target": 4.0, "final_return": 20.0, "stopped": 301,
               "seeds": [{"seed": 0, "steps_to_target": None, "wall_time_to_target": None, "final_return": 10.0},
                         {"seed": 1, "steps_to_target": None, "wall_time_to_target": None, "final_return": 15.0},
                         {"seed": 2, "steps_to_target": 32768, "wall_time_to_target": 4.0, "final_return": 35.0}]}
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f)
    rows = results.vmapped_rows(dict(summary, run_dir=run_dir))
    measurement = results.Measurement("ppo", "Breakout-MinAtar", ("--architecture", "anakin", "--num-seeds", "3"))
    text = results.table(measurement, rows, "abc1234", time_limit=300)
    lines = text.splitlines()
    assert "one Anakin launch of 3 vmapped seeds" in lines[0] and "1 of 3 seeds reached the evaluation return 28" in lines[0]
    assert "--time-limit 300 -- --architecture anakin --num-seeds 3" in lines[0] and "`abc1234`" in lines[0]
    assert lines[0].endswith("The launch was stopped after 301 s, short of the target.")
    assert lines[4:] == ["| 0 | - | - | 5,000 | 10.0 | 40,960 |", "| 1 | - | - | 5,000 | 15.0 | 40,960 |",
                         "| 2 | 32,768 | 4.0 | 5,000 | 35.0 | 40,960 |", "| mean of 3 | 32,768 | 4.0 | 5,000 | 20.0 | 40,960 |"]
    picture = tmp_path / "curves.png"
    results.curves(str(picture), "ppo on Breakout-MinAtar", rows)
    from matplotlib.image import imread

    assert imread(str(picture)).shape[:2] == (400, 720)


def test_the_command_under_a_table_names_the_seeds_it_launched_where_they_are_not_the_default() -> None:
    """Its command is how to measure the table again: without ``--seeds`` it would run five."""
    row = {"seed": 3, "target_return": 18.0, "steps_per_second": 850, "final_return": -16.5, "env_steps": 2_500_160}
    measurement = results.Measurement("impala", "Pong-v5", ("--total-steps", "2500000"))
    command = results.table(measurement, [row], "abc1234").splitlines()[0]
    assert "results.py --agent impala --env-id Pong-v5 --seeds 3 -- --total-steps 2500000`" in command
    default = [dict(row, seed=seed) for seed in results.DEFAULT_SEEDS]
    assert "--seeds" not in results.table(measurement, default, "abc1234").splitlines()[0]


def test_seeds_and_vmapped_seeds_are_not_both_asked_for(tmp_path) -> None:
    with pytest.raises(SystemExit, match="--seeds launches once per seed.*--num-seeds 4"):
        results.measure(results.Measurement("ppo", "Breakout-MinAtar", ("--architecture", "anakin", "--num-seeds", "4")),
                        [0, 1], str(tmp_path), None)
    assert results.vmapped_seeds(["--architecture", "anakin", "--num-seeds=4"]) == 4
    assert results.vmapped_seeds(["--total-steps", "1000"]) == 1


@pytest.mark.slow
def test_sigterm_stops_a_launch_of_vmapped_seeds_in_order_and_its_table_shows_what_it_reached(tmp_path) -> None:
    """``timeout``'s SIGTERM reaches the benchmark before its runs have reached the target: the
    launch stops in order (its summary written) and the table is of what the seeds had reached.
    A target above CartPole-v1's highest return keeps the run from ending by itself."""
    command = [sys.executable, SCRIPT, "--agent", "ppo", "--env-id", "CartPole-v1", "--run-root", str(tmp_path),
               "--time-limit", "600", "--", "--architecture", "anakin", "--num-seeds", "2", "--target-return", "1000",
               "--compilation-cache", ""]
    benchmark = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    evaluations = metrics_path(str(tmp_path / "ppo-CartPole-v1-2seeds"), EVALUATIONS)
    while not (os.path.exists(evaluations) and len(open(evaluations).read().splitlines()) > 2):  # two evaluations
        assert benchmark.poll() is None, benchmark.stdout.read()
        time.sleep(0.2)
    benchmark.terminate()
    out, _ = benchmark.communicate(timeout=180)
    assert benchmark.returncode == 0, out
    lines = out[out.index("Measured by"):].splitlines()
    assert "one Anakin launch of 2 vmapped seeds" in lines[0] and "0 of 2 seeds reached the evaluation return 1000" in lines[0]
    assert "The launch was stopped after " in lines[0]
    assert [line.split(" | ")[0] for line in lines[4:]] == ["| 0", "| 1", "| mean of 2"]
    assert all(int(line.split(" | ")[-1].strip(" |").replace(",", "")) > 0 for line in lines[4:])  # env steps made


def test_a_whole_budget_table_is_a_block_of_its_own_beside_the_one_stopped_at_the_target(tmp_path) -> None:
    """A 1M-step run's table sits beside the 5-seed table of the same agent, env and arguments
    (stopped at the target), and says it ran to the end."""
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n\n## Agents to their target\n\n## Micro-benchmarks\n")
    extra = ("--total-steps", "1000000")
    results.write_page(results.Measurement("sac", "HalfCheetah-v5", extra), "stopped at the target", page=str(page))
    results.write_page(results.Measurement("sac", "HalfCheetah-v5", extra, whole_budget=True), "run to the end",
                       page=str(page))
    content = page.read_text()
    assert ("### SAC on HalfCheetah-v5 (--total-steps 1000000)\n\n<!-- results: sac HalfCheetah-v5 --total-steps 1000000 "
            "-->\nstopped at the target\n<!-- /results -->") in content
    assert ("### SAC on HalfCheetah-v5 (to the end of its env steps, --total-steps 1000000)\n\n<!-- results: sac "
            "HalfCheetah-v5 whole-budget --total-steps 1000000 -->\nrun to the end\n<!-- /results -->") in content
    whole_budget = results.Measurement("sac", "HalfCheetah-v5", whole_budget=True)
    assert whole_budget.picture_name == "sac-halfcheetah-v5-whole-budget.png"
    row = {"seed": 0, "target_return": 5000.0, "steps_to_target": 130208, "wall_time_to_target": 393.0,
           "steps_per_second": 330, "final_return": 9612.5, "env_steps": 1000000}
    first = results.table(whole_budget, [row], "abc1234").splitlines()[0]
    assert "--env-id HalfCheetah-v5 --seeds 0 --whole-budget`" in first
    assert "each launch run to its total env steps" in first
    assert "--stop-at-target" not in first and "1 of 1 seeds reached the evaluation return 5000" in first


def test_one_seeds_picture_is_its_curve_alone_not_a_spread_over_one_seed(tmp_path) -> None:
    """A 1M-step run is one seed: its picture says "seed 0", not "min-max over 1 seeds" and a
    mean of one."""
    run_dir = str(tmp_path / "sac-HalfCheetah-v5-seed0")
    progress = MetricsWriter(metrics_path(run_dir, "progress"))
    evaluations = MetricsWriter(metrics_path(run_dir, EVALUATIONS))
    for version in range(1, 5):
        progress.write(version * 10_000, {"run_seconds": float(version)})
        record(evaluations, version, np.array([version * 2000.0] * 5), 5000.0, stop_at_target=False,
               env_steps=version * 10_000)
    progress.close()
    evaluations.close()
    row = {"seed": 0, "target_return": 5000.0, "run_dir": run_dir, "curve": "evaluation return"}
    figure = results.curves(str(tmp_path / "curves.png"), "sac on HalfCheetah-v5", [row])
    labels = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert labels == ["seed 0", "target 5000"]
    assert (tmp_path / "curves.png").exists()
