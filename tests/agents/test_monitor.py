"""The run monitor's figures that are computed, not read: the steady throughput, the closing
line on the last evaluation, where the learning curve draws each evaluation, and whether a run
is over."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from matplotlib.image import imread

from jaxdist.agents import es, ppo
from jaxdist.agents.run import last_evaluation, report
from jaxdist.agents.run import (evaluation_curve, finished_summary, learning_curves, plot_learning_curve, recent_rate,
                                steady_rate, steps_at)
from jaxdist.records.metrics import MetricsWriter, metrics_path
from jaxdist.nodes import evaluator
from jaxdist.nodes.evaluator import BEST_POLICY


def test_steady_throughput_counts_env_steps_from_the_first_update_seen_to_the_last_env_step():
    assert steady_rate((10.0, 2_000), (12.0, 42_000)) == 20_000


def test_a_run_with_no_env_step_after_its_first_update_has_no_steady_throughput_rather_than_zero():
    assert steady_rate((20.0, 20_480), (21.1, 20_480)) is None  # every update landed between two polls
    assert steady_rate((20.0, 20_480), (20.0, 20_480)) is None


def test_the_progress_lines_rate_is_that_of_the_latest_seconds_not_of_a_slow_start():
    readings = [(0.1 * i, 100 * i) for i in range(100)]  # 1,000/s for 10 s (compiling, say) ...
    readings += [(10.0 + 0.1 * i, 9_900 + 3_000 * i) for i in range(1, 101)]  # ... then 30,000/s for 10 s
    assert recent_rate(readings) == pytest.approx(30_000)
    assert recent_rate(readings[:1]) is None


def test_the_closing_line_says_which_policy_the_last_evaluation_scored():
    """Before, it printed ``last evaluation return 234.6999969482422``, whichever version that was."""
    summary = {"final_return": 234.6999969482422, "final_return_version": 23, "learner_version": 23}
    assert last_evaluation(summary) == "last evaluation return 234.7, of learner version 23 (the final policy)"
    stopped_at_target = dict(summary, final_return_version=20)
    assert last_evaluation(stopped_at_target).endswith("of learner version 20 (the learner went on to version 23)")
    assert last_evaluation({"final_return": None, "learner_version": 0}) == "no evaluation finished"


def test_the_learning_curve_has_every_evaluation_at_the_env_steps_of_its_time():
    """Before, it drew progress.csv's ``eval_return`` column: evaluations between two of its rows
    (half a second apart) were dropped, the others drawn at the next row's env steps."""
    progress = [{"wall_time": 100.0, "step": 0}, {"wall_time": 100.5, "step": 1_000},
                {"wall_time": 101.0, "step": 3_000}]
    evaluations = [{"wall_time": 100.1, "mean_return": 20.0}, {"wall_time": 100.2, "mean_return": 40.0},
                   {"wall_time": 100.75, "mean_return": 90.0}, {"wall_time": 101.0, "mean_return": None}]
    assert evaluation_curve(progress, evaluations) == [(pytest.approx(200.0), 20.0), (pytest.approx(400.0), 40.0),
                                                       (pytest.approx(2_000.0), 90.0)]
    assert evaluation_curve([], evaluations) == [] and evaluation_curve(progress, []) == []


def test_an_evaluation_is_placed_at_the_env_steps_of_the_version_it_scored():
    """Before, at those of the time its row was written: after the evaluation's episodes (half
    a second of CartPole episodes at 475, some 13k env steps of the demo's actors, later)."""
    progress = [{"wall_time": 100.0, "step": 0}, {"wall_time": 101.0, "step": 10_000}]
    evaluations = [{"wall_time": 100.9, "version_time": 100.4, "mean_return": 480.0},
                   {"wall_time": 101.0, "mean_return": 20.0}]  # Anakin's rows: made with their version
    assert evaluation_curve(progress, evaluations) == [(4_000, 480.0), (10_000, 20.0)]
    assert steps_at([(100.0, 0), (101.0, 10_000)], 100.25) == 2_500
    assert steps_at([(100.0, 0), (101.0, 10_000)], 99.0) == 0 and steps_at([(100.0, 0)], 100.5) == 0


def test_a_run_of_several_seeds_draws_each_seeds_evaluations_beside_their_mean(tmp_path):
    """--num-seeds stops at the target on the mean over the seeds: each seed's own curve shows
    one that never reached it."""
    with MetricsWriter(metrics_path(tmp_path, "progress")) as progress:
        for step in range(0, 4_000, 1_000):
            progress.write(step, {"run_seconds": step / 1000})
    with MetricsWriter(metrics_path(tmp_path, evaluator.EVALUATIONS)) as evaluations:
        for version, returns in enumerate([[[10.0], [30.0]], [[480.0], [200.0]], [[500.0], [460.0]]]):
            evaluator.record(evaluations, version, returns, 475.0, stop_at_target=False, env_steps=1_000 * version)
    curves = learning_curves(str(tmp_path))
    assert sorted(curves) == ["evaluation return (mean over seeds)", "seed 0", "seed 1"]
    assert curves["seed 0"][1] == [10.0, 480.0, 500.0] and curves["seed 1"][1] == [30.0, 200.0, 460.0]
    assert curves["evaluation return (mean over seeds)"][1] == [20.0, 340.0, 480.0]
    plot_learning_curve(str(tmp_path), "PPO CartPole-v1", 475.0)  # the seeds faint, in one legend entry
    assert imread(tmp_path / "learning_curve.png").shape[:2] == (440, 720)


def test_the_closing_lines_name_the_saved_best_policy_only_when_it_beat_the_final_one(tmp_path, capsys):
    summary = {"target_return": 475.0, "wall_time_to_target": 6.6, "steps_to_target": 27_712, "final_return": 366.9,
               "final_return_version": 49, "learner_version": 49, "best_return": 500.0, "best_return_version": 28,
               "env_steps": 28_160, "wall_time": 7.7, "steps_per_second": 18_202, "stop_reason": "done",
               "keeps_best": True}
    report(summary, str(tmp_path))
    assert f"best evaluation return 500.0, of learner version 28: python -m jaxdist.tools.evaluate {tmp_path} --best" \
        in capsys.readouterr().out
    report(dict(summary, final_return=500.0), str(tmp_path))  # as good: the final policy is the one to play
    assert "best evaluation" not in capsys.readouterr().out
    report(dict(summary, final_return=None, final_return_version=None), str(tmp_path))  # a segment that evaluated nothing
    assert "no evaluation finished" in capsys.readouterr().out
    report(dict(summary, keeps_best=False), str(tmp_path))  # nothing saved to play
    assert "best evaluation" not in capsys.readouterr().out


def test_where_a_run_keeps_its_best_policy_is_its_topology_s_to_say(tmp_path):
    """Sebulba's evaluator saves it beside the checkpoints; Anakin's learner state keeps each
    seed's; ES keeps none."""
    sebulba = ppo.agent(ppo.PPOConfig()).topology()
    assert not sebulba.keeps_best(str(tmp_path))
    (tmp_path / "checkpoints" / BEST_POLICY).mkdir(parents=True)
    assert sebulba.keeps_best(str(tmp_path))
    assert ppo.agent(ppo.PPOConfig(architecture="anakin")).topology().keeps_best(str(tmp_path))
    assert not es.agent(es.ESConfig()).topology().keeps_best(str(tmp_path))


def _run_dir(path, saved_update: int, summary_version: int, evaluations: list[tuple[int, float]]):
    (path / "checkpoints" / "learner" / "0" / "1" / str(saved_update)).mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({"learner_version": summary_version, "stop_reason": "ended"}))
    writer = MetricsWriter(str(path / "evaluations.csv"))
    for version, mean in evaluations:
        writer.write(version, {"mean_return": mean})
    writer.close()
    return str(path)


def test_a_run_is_over_at_its_last_update_or_with_stop_at_target_at_the_target(tmp_path):
    config = ppo.PPOConfig(total_steps=512 * 40, target_return=100.0)
    topology = ppo.agent(config).topology()
    assert topology.last_update == 40
    trained = _run_dir(tmp_path / "trained", 40, 40, [(20, 50.0), (40, 90.0)])
    assert finished_summary(trained, topology, config)["stop_reason"].startswith(
        "nothing launched: the run has trained to its last update (40)")
    at_target = _run_dir(tmp_path / "at_target", 23, 23, [(20, 150.0), (23, 80.0)])
    assert finished_summary(at_target, topology, config) is None  # without stop_at_target it trains on
    stopping = dataclasses.replace(config, stop_at_target=True)
    assert "reached its target 100 at the evaluation of version 20 and stopped at update 23" in (
        finished_summary(at_target, topology, stopping)["stop_reason"])
    # Ctrl-C before the target, or a summary.json that is not the saved update's (the launching
    # process was killed after the learner's last save): launched again, which writes the record.
    assert finished_summary(_run_dir(tmp_path / "short", 23, 23, [(20, 60.0)]), topology, stopping) is None
    assert finished_summary(_run_dir(tmp_path / "stale", 40, 23, [(20, 150.0)]), topology, stopping) is None
    assert finished_summary(str(tmp_path / "none"), topology, stopping) is None


def test_the_launching_process_reads_a_runs_state_without_importing_jax_or_orbax(tmp_path):
    """Every run's start-up waits on the launching process: finding where a run's checkpoints and
    best policy live imported Orbax and JAX there (0.6 s more to a run of the demo)."""
    code = f"""
import sys
from jaxdist.agents import es, ppo, run
agents = ppo.agent(ppo.PPOConfig()), ppo.agent(ppo.PPOConfig(architecture="anakin")), es.agent(es.ESConfig())
for index, agent in enumerate(agents):
    topology = agent.topology()
    run.prepare_run_dir({str(tmp_path)!r} + f"/{{index}}", agent.factory, agent.config, run.RunOptions())
    run.finished_summary({str(tmp_path)!r}, topology, agent.config)
    topology.keeps_best({str(tmp_path)!r})
print(sorted(name for name in ("jax", "flax", "optax", "orbax") if name in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
