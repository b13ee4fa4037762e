"""Sweeps: the grid and the draws, the fields refused, a configuration trained among others as it
trains alone, the summary ranking configurations, and load_policy by configuration."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import jaxdist as jd
from jaxdist.agents import experiment, load_policy, population, ppo, run, sweep
from jaxdist.agents.experiment import anakin_logic, with_preset
from jaxdist.learning import anakin
from jaxdist.nodes.evaluator import EVALUATIONS, record
from jaxdist.nodes.learner import Learner, PublishOptions
from jaxdist.records.metrics import MetricsWriter, metrics_path, read_metrics
from ports import reserve_base_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = with_preset(ppo.PPOConfig, "CartPole-v1", ppo.PRESETS, architecture="anakin", num_actors=1,
                     envs_per_actor=8)


def test_the_grid_is_every_combination_first_field_slowest_times_the_seeds():
    config = dataclasses.replace(CONFIG, sweep=("learning_rate=1e-3,3e-3", "ent_coef=0,0.01,0.02"), num_seeds=2)
    configs = sweep.configurations(config)
    assert configs == [{"learning_rate": lr, "ent_coef": ent} for lr in (1e-3, 3e-3) for ent in (0.0, 0.01, 0.02)]
    assert sweep.layout(config) == (6, 2) and ppo.agent(config).topology().seeds == 12
    runs = sweep.runs(config)  # run c x 2 + s is configuration c's seed s
    assert runs["ent_coef"][:6] == [0.0, 0.0, 0.01, 0.01, 0.02, 0.02] and runs["learning_rate"][5:7] == [1e-3, 3e-3]


def test_random_draws_stay_in_their_ranges_and_are_the_same_for_the_same_seed():
    config = dataclasses.replace(CONFIG, sweep=("learning_rate=1e-4:1e-2:log", "gamma=0.9,0.99", "clip_eps=0.1:0.3"),
                                 sweep_random=50)
    configs = sweep.configurations(config)
    assert len(configs) == 50 and configs == sweep.configurations(config)
    assert all(1e-4 <= c["learning_rate"] <= 1e-2 and c["gamma"] in (0.9, 0.99) and 0.1 <= c["clip_eps"] <= 0.3
               for c in configs)
    assert np.median([c["learning_rate"] for c in configs]) < 3e-3  # log-uniform: half below 1e-3 or so
    assert sweep.configurations(dataclasses.replace(config, seed=1)) != configs


@pytest.mark.parametrize("fields, message", [
    ({"sweep": ("epochs=1,2",)}, r"--sweep epochs: epochs \(int\) sets shapes.*launch one run per value of epochs"),
    ({"sweep": ("hidden=32,64",)}, r"--sweep hidden: hidden \(tuple\[int, ...\]\) sets shapes"),
    ({"sweep": ("target_return=100,200",)}, r"--sweep target_return: target_return is a setting of the system"),
    ({"sweep": ("normalize_advantages=0,1",)}, r"normalize_advantages \(bool\) sets shapes"),
    ({"sweep": ("lr=1e-3",)}, r"PPOConfig has no field 'lr'; it sweeps learning_rate, gamma"),
    ({"sweep": ("learning_rate=1e-4:1e-2",)}, r"is a range: draw N configurations from it with --sweep-random N"),
    ({"sweep": ("gamma=0.9,1.5",)}, r"the configuration gamma=1.5 is refused: gamma must be in \[0, 1\]"),
    ({"sweep": ("gamma=0.9", "gamma=0.8")}, r"--sweep gamma is given twice"),
    ({"sweep": ("gamma",)}, r"--sweep takes FIELD=V1,V2,... or FIELD=LOW:HIGH\[:log\]"),
    ({"sweep_random": 4}, r"name at least one field"),
    ({"sweep": ("gamma=0.9:0.99",), "pbt": 4, "num_seeds": 2}, r"--pbt's members are each a seed of their own"),
])
def test_a_sweep_the_learner_cannot_share_is_refused_in_one_line(fields, message):
    with pytest.raises(ValueError, match=message) as refused:
        dataclasses.replace(CONFIG, **fields)
    assert "\n" not in str(refused.value)


def test_under_sebulba_each_configuration_is_a_run_of_its_own_and_under_anakin_none_is(tmp_path):
    config = dataclasses.replace(CONFIG, architecture="sebulba", sweep=("learning_rate=1e-3,3e-3", "gamma=0.9,0.99"))
    apart = sweep.apart(config, str(tmp_path))
    assert [directory for _, directory in apart] == [str(tmp_path / f"config-{index}") for index in range(4)]
    assert [(child.learning_rate, child.gamma, child.sweep) for child, _ in apart] == [
        (1e-3, 0.9, ()), (1e-3, 0.99, ()), (3e-3, 0.9, ()), (3e-3, 0.99, ())]
    assert sweep.apart(dataclasses.replace(config, architecture="anakin"), str(tmp_path)) == []
    population = dataclasses.replace(config, sweep=("gamma=0.9:0.99",), pbt=4, pbt_interval=20)
    assert sweep.apart(population, str(tmp_path)) == []  # a population is one program
    with pytest.raises(ValueError, match=r"--pbt-interval 7 must be a multiple of --eval-every-updates \(5\)"):
        dataclasses.replace(population, pbt_interval=7)


def test_side_by_side_every_configuration_is_a_learner_process_with_its_actors_in_its_own_directory(tmp_path):
    config = dataclasses.replace(CONFIG, architecture="sebulba", num_actors=2,
                                 sweep=("learning_rate=1e-3,3e-3", "gamma=0.9,0.99"))
    record = population.SideBySide(ppo.agent(config))
    together = record.topology()
    assert [(one.config.learning_rate, one.config.gamma, one.config.sweep) for one in together.runs] == [
        (1e-3, 0.9, ()), (1e-3, 0.99, ()), (3e-3, 0.9, ()), (3e-3, 0.99, ())]
    groups = together.program.groups
    assert len(groups["learner"]) == 4 and len(groups["actor"]) == 8 and len(groups["sweep"]) == 1
    assert together.placement["learner"] == jd.spread() and record.config is config
    # the slowest run says where the sweep is: it is over once every run is
    for index, step in enumerate((10, 4, 10, 10)):
        os.makedirs(os.path.join(together.runs[index].topology().checkpoints(sweep.config_dir(str(tmp_path), index)),
                                 str(step)))
    assert run.saved_update(together.checkpoints(str(tmp_path))) == 4


def test_the_command_line_takes_sweep_again_and_again_and_refuses_a_shape_in_one_line(capsys):
    config, _ = run.parse(ppo.PPOConfig, ppo.PRESETS, None, [
        "--architecture", "anakin", "--sweep", "learning-rate=1e-3,2e-3", "--num-seeds", "2", "--sweep",
        "gamma=0.9,0.99"])
    assert config.sweep == ("learning-rate=1e-3,2e-3", "gamma=0.9,0.99") and sweep.layout(config) == (4, 2)
    with pytest.raises(SystemExit, match=r"error: --sweep epochs: epochs \(int\) sets shapes"):
        run.parse(ppo.PPOConfig, ppo.PRESETS, None, ["--architecture", "anakin", "--sweep", "epochs=2,4"])


def test_the_summary_ranks_configurations_by_their_mean_over_seeds_with_the_spread(tmp_path):
    config = dataclasses.replace(CONFIG, sweep=("learning_rate=1e-3,2e-3,3e-3",), num_seeds=2, target_return=100.0)
    rng = np.random.default_rng(0)
    evaluations = [rng.uniform(0, 200, size=(6, 4)) for _ in range(3)]  # 3 evaluations of 3 configs x 2 seeds
    with MetricsWriter(metrics_path(tmp_path, EVALUATIONS)) as writer:
        for version, returns in enumerate(evaluations, start=1):
            record(writer, version * 10, returns, None, False, env_steps=version * 2560)
    table = sweep.summarize(str(tmp_path), config)
    last = evaluations[-1].mean(axis=1).reshape(3, 2)  # each run's last mean return, by configuration
    order = np.argsort(-last.mean(axis=1))
    assert [row["config_index"] for row in table] == list(order) and [row["rank"] for row in table] == [1, 2, 3]
    for row in table:
        mine = last[row["config_index"]]
        assert row["learning_rate"] == [1e-3, 2e-3, 3e-3][row["config_index"]]
        np.testing.assert_allclose([row["mean_return"], row["std_return"], row["min_return"], row["max_return"]],
                                   [mine.mean(), mine.std(), mine.min(), mine.max()])
        best = np.max([e.mean(axis=1).reshape(3, 2)[row["config_index"]] for e in evaluations], axis=0)
        np.testing.assert_allclose(row["mean_best_return"], best.mean())
        assert row["seeds_at_target"] == int(np.sum(best >= 100.0))
    written = read_metrics(tmp_path / sweep.SWEEP_FILE)
    assert [row["config_index"] for row in written] == list(order)
    assert (tmp_path / sweep.SWEEP_PLOT).stat().st_size > 0
    best_fields = sweep.describe({"learning_rate": table[0]["learning_rate"]})
    assert sweep.format_table(table, 2).splitlines()[1].endswith(best_fields)


def _advance(learner: Learner) -> dict:
    return jax.device_get(learner._advance(learner._feed.place({})))


@pytest.mark.slow
def test_a_configuration_trains_among_others_exactly_as_it_trains_alone_with_the_same_seed():
    """Two configurations x two seeds in one learner; the second configuration alone, two seeds:
    the same keys, the same updates, the same evaluations."""
    unpublished = PublishOptions(every=None, log_every=None, metrics=None)
    base = dataclasses.replace(CONFIG, eval_every_updates=2, epochs=2)
    swept = dataclasses.replace(base, sweep=("learning_rate=1e-3,4e-3", "clip_eps=0.1,0.3"), num_seeds=2)
    alone = dataclasses.replace(base, learning_rate=4e-3, clip_eps=0.1, num_seeds=2)  # configuration 2
    together, by_itself = (Learner(anakin_logic(ppo.agent(c)), anakin.no_batch, publishing=unpublished)
                           for c in (swept, alone))
    for _ in range(4):
        many, one = _advance(together), _advance(by_itself)
    np.testing.assert_allclose(many["eval_returns"][4:6], one["eval_returns"])
    assert not np.allclose(many["eval_returns"][0:2], one["eval_returns"])  # another configuration learns otherwise
    state = jax.device_get(together._train["state"])
    np.testing.assert_allclose(state["hyperparams"]["learning_rate"], np.repeat([1e-3, 1e-3, 4e-3, 4e-3], 2))
    mine = jax.tree.map(lambda leaf: leaf[4:6], state["agent"]["params"])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), mine,
                 jax.device_get(by_itself._train["state"]["agent"]["params"]))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_script_sweeps_resumes_after_sigterm_ranks_the_configurations_and_loads_each_ones_policy(tmp_path):
    command = [sys.executable, os.path.join(REPO, "experiments", "ppo.py"), "--quiet", "--compilation-cache", "",
               "--architecture", "anakin", "--run-dir", str(tmp_path), "--num-actors", "1", "--envs-per-actor", "8",
               "--total-steps", str(8 * 32 * 60), "--eval-every-updates", "4", "--num-seeds", "2",
               "--checkpoint-every-updates", "4", "--sweep", "learning_rate=1e-3,5e-3", "--sweep", "ent_coef=0,0.01"]
    stopped = sigterm_after_a_checkpoint(command, tmp_path / "checkpoints" / "learner" / "0", tmp_path / "first.log")
    assert "4 configurations" not in stopped  # no summary of a sweep that did not end
    done = subprocess.run(command, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resuming from the learner's checkpoint" in done.stdout, done.stdout
    assert "4 configurations x 2 seed(s)" in done.stdout and "learning_rate=0.005 ent_coef=0.01" in done.stdout
    ranked = read_metrics(tmp_path / sweep.SWEEP_FILE)
    assert sorted(row["config_index"] for row in ranked) == [0, 1, 2, 3]
    assert [row["mean_return"] for row in ranked] == sorted((row["mean_return"] for row in ranked), reverse=True)
    observations = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    policies = {(c, s): load_policy(str(tmp_path), config_index=c, run_seed=s) for c in (0, 3) for s in (0, 1)}
    assert {policy.step for policy in policies.values()} == {60}
    assert not np.array_equal(policies[0, 0].act(observations), policies[3, 0].act(observations))
    assert load_policy(str(tmp_path), config_index=3, run_seed=1, best=True).step % 4 == 0
    with pytest.raises(ValueError, match="trained 4 configuration.*config_index must be 0 to 3, got 4"):
        load_policy(str(tmp_path), config_index=4)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_sweep_under_sebulba_runs_each_configuration_after_the_other_and_resumes_after_sigterm(tmp_path):
    """SIGTERM during the first configuration stops the sweep there; the same command resumes
    it, then runs the second, and ranks both."""
    command = [sys.executable, os.path.join(REPO, "experiments", "ppo.py"), "--compilation-cache", "",
               "--run-dir", str(tmp_path), "--num-actors", "1", "--envs-per-actor", "8", "--total-steps",
               str(8 * 32 * 30), "--eval-every-updates", "10", "--checkpoint-every-updates", "5",
               "--sweep", "learning_rate=1e-3,3e-3"]
    learner = tmp_path / "config-0" / "checkpoints" / "learner" / "0" / "1"  # node learner/0/1, beside its replay
    sigterm_after_a_checkpoint(command, learner, tmp_path / "first.log")
    assert not (tmp_path / "config-1").exists()  # the sweep stopped with the configuration it was in
    done = subprocess.run(command + ["--quiet"], capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resuming from the learner's checkpoint" in done.stdout, done.stdout
    assert "2 configurations x 1 seed(s)" in done.stdout
    ranked = read_metrics(tmp_path / sweep.SWEEP_FILE)
    assert sorted(row["config_index"] for row in ranked) == [0, 1]
    assert load_policy(str(tmp_path), config_index=1).step == 30


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_sweep_under_sebulba_on_two_hosts_trains_its_configurations_side_by_side(tmp_path):
    """Two hosts (both on 127.0.0.1) run the same command; configuration c's learner process and
    actor are on host c, and host 0 ranks both runs."""
    base = reserve_base_port()
    command = [sys.executable, os.path.join(REPO, "experiments", "ppo.py"), "--launcher", "multihost", "--hosts",
               "127.0.0.1,127.0.0.1", "--base-port", str(base), "--compilation-cache", "", "--run-dir",
               str(tmp_path), "--num-actors", "1", "--envs-per-actor", "8", "--total-steps", str(8 * 32 * 10),
               "--eval-every-updates", "5", "--sweep", "learning_rate=1e-3,3e-3"]
    env = dict(os.environ, JAXDIST_TOKEN="shared-secret", PYTHONUNBUFFERED="1")
    hosts = [subprocess.Popen(command + ["--host-index", str(index)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env) for index in (0, 1)]
    outputs = [host.communicate(timeout=500)[0] for host in hosts]
    assert [host.returncode for host in hosts] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert "2 configurations x 1 seed(s)" in outputs[0] and "every run's final policy (version 10)" in outputs[0]
    assert "[learner/1] " in outputs[1] and "[actor/1] " in outputs[1], outputs[1][-3000:]  # run 1 on host 1
    assert "[learner/0] " not in outputs[1] and "[learner/0] " in outputs[0]
    assert sorted(row["config_index"] for row in read_metrics(tmp_path / sweep.SWEEP_FILE)) == [0, 1]
    assert [load_policy(str(tmp_path), config_index=index).step for index in (0, 1)] == [10, 10]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_script_trains_a_population_resumes_it_after_sigterm_and_records_its_lineage(tmp_path):
    """The worst member copies the best at each exploit step and perturbs what it copied; the
    lineage starts from the drawn population; a SIGTERM'd population resumes with the
    hyperparameters it had explored."""
    ranges = ("learning_rate=1e-4:1e-2:log", "clip_eps=0.1,0.2,0.3")
    command = [sys.executable, os.path.join(REPO, "experiments", "ppo.py"), "--quiet", "--compilation-cache", "",
               "--architecture", "anakin", "--run-dir", str(tmp_path), "--num-actors", "1", "--envs-per-actor", "8",
               "--total-steps", str(8 * 32 * 80), "--eval-every-updates", "4", "--pbt", "4", "--pbt-interval", "4",
               "--checkpoint-every-updates", "8", *(arg for spec in ranges for arg in ("--sweep", spec))]
    sigterm_after_a_checkpoint(command, tmp_path / "checkpoints" / "learner" / "0", tmp_path / "first.log")
    stopped = read_metrics(tmp_path / "lineage.csv")
    done = subprocess.run(command, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resuming from the learner's checkpoint" in done.stdout, done.stdout
    rows = read_metrics(tmp_path / "lineage.csv")
    drawn = sweep.configurations(dataclasses.replace(CONFIG, sweep=ranges, pbt=4))
    for row in rows[:4]:  # the first update's: the drawn population
        assert row["step"] == 1 and np.isclose(row["learning_rate"], drawn[row["member"]]["learning_rate"], rtol=1e-6)
    resumed_at = min(row["step"] for row in rows[len(stopped):])  # the resumed segment's first row
    saved = max(row["step"] for row in stopped if row["step"] < resumed_at and row["step"] % 4 == 0)
    before = {row["member"]: row["learning_rate"] for row in stopped if row["step"] == saved}
    kept = [row for row in rows[len(stopped):] if row["step"] == resumed_at and row["parent"] == row["member"]]
    assert kept and all(row["learning_rate"] == before[row["member"]] for row in kept)  # as the checkpoint held them
    evaluations = read_metrics(tmp_path / "evaluations.csv")
    copies = [row for row in rows if row["member"] != row["parent"]]
    assert {row["step"] for row in copies} == set(range(4, 81, 4))  # one member of four at each exploit step
    for copy in copies:  # the copier ranked last at that evaluation, its parent first
        scores = [next(row for row in evaluations if row["step"] == copy["step"])[f"seed/{m}/mean_return"]
                  for m in range(4)]
        assert scores[copy["parent"]] == max(scores) and scores[copy["member"]] == min(scores)
        parent = next(row for row in rows if row["step"] == copy["step"] and row["member"] == copy["parent"])
        for field, (low, high) in {"learning_rate": (1e-4, 1e-2), "clip_eps": (0.1, 0.3)}.items():
            explored = np.clip(parent[field] * np.array([0.8, 1.2]), low, high)  # perturbed inside its range
            assert np.isclose(copy[field], explored, rtol=1e-5).any(), (field, copy, parent)
    assert f"PBT: {len(copies)} copies" in done.stdout and (tmp_path / "lineage_learning_rate.png").stat().st_size > 0
    assert load_policy(str(tmp_path), config_index=3).step == 80


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_population_of_sebulba_learners_copies_through_checkpoints_and_a_killed_member_rejoins(tmp_path):
    """Four members, each a learner with its actor and evaluator in one program on processes:
    at every round the worst copies the best's checkpoint and perturbs its values; member 2's
    learner, SIGKILLed after its first round's checkpoint, restarts from it and takes part in
    every later round. SIGTERM to a member's process, once a member has saved its third round's
    checkpoint, stops the program in order (members between rounds or waiting in one); launched
    again, every member resumes from the step it saved with the values it had, the lineage goes
    on without a round lost or repeated, and the run ends as an uninterrupted one."""
    ranges = ("learning_rate=1e-4:1e-2:log", "clip_eps=0.1,0.2,0.3")
    config = dataclasses.replace(CONFIG, architecture="sebulba", total_steps=8 * 32 * 20, eval_every_updates=5,
                                 sweep=ranges, pbt=4, pbt_interval=5)
    running = launch_population(config, tmp_path)
    try:
        while not saved_step(tmp_path, 2, 5):
            assert not running.wait(timeout=0.05), running.status()
        os.kill(running.status()["learner/2"]["pid"], signal.SIGKILL)
        while not any(saved_step(tmp_path, m, 15) for m in range(4)):
            assert not running.wait(timeout=0.05), running.status()
        assert running.status()["learner/2"]["restarts"] == 1
        os.kill(running.status()["learner/1"]["pid"], signal.SIGTERM)  # a preemption notice: the program stops
        assert running.wait(timeout=120)
    finally:
        running.stop()
    assert "restored step 5" in open(jd.log_path(str(tmp_path), "learner/2")).read()
    at_stop = {m: stopped_step(tmp_path, m) for m in range(4)}
    assert 10 <= min(at_stop.values()) and max(at_stop.values()) < 20, at_stop  # some between rounds or waiting
    running = launch_population(config, tmp_path)
    try:
        assert running.wait(timeout=300)  # the coordinator ends the program once every member's last is evaluated
    finally:
        running.stop()
    for m, step in at_stop.items():  # the second life of each member starts where the first stopped
        second = open(jd.log_path(str(tmp_path), f"learner/{m}")).read().split(f"stopped at step {step}:")[-1]
        assert second.split("restored step ", 1)[1].startswith(f"{step} "), second
    rows = read_metrics(tmp_path / "lineage.csv")
    assert [(row["step"], row["member"]) for row in rows] == [(step, m) for step in (0, 5, 10, 15) for m in range(4)]
    for row in rows[4:]:  # a member that kept its state kept its values across the stop too
        if row["parent"] == row["member"]:
            before = next(r for r in rows if r["step"] == row["step"] - 5 and r["member"] == row["member"])
            assert (row["learning_rate"], row["clip_eps"]) == (before["learning_rate"], before["clip_eps"])
    drawn = sweep.configurations(config)
    assert all(np.isclose(row["learning_rate"], drawn[row["member"]]["learning_rate"]) for row in rows[:4])
    rounds = {row["step"]: row for row in read_metrics(tmp_path / "evaluations.csv")}
    copies = [row for row in rows if row["member"] != row["parent"]]
    assert {row["step"] for row in copies} == {5, 10, 15}  # one member of four at every round
    for copy in copies:  # the copier ranked last at that round's evaluations, its parent first
        scores = [rounds[copy["step"]][f"seed/{m}/mean_return"] for m in range(4)]
        assert scores[copy["parent"]] == max(scores) and scores[copy["member"]] == min(scores)
        parent = next(row for row in rows if row["step"] == copy["step"] - 5 and row["member"] == copy["parent"])
        explored = np.clip(parent["learning_rate"] * np.array([0.8, 1.2]), 1e-4, 1e-2)
        assert np.isclose(copy["learning_rate"], explored, rtol=1e-5).any(), (copy, parent)
        log = open(jd.log_path(str(tmp_path), f"learner/{copy['member']}")).read()
        assert f"PBT at update {copy['step']}: member {copy['member']} copies member {copy['parent']}" in log
    assert set(rounds[20]) >= {f"seed/{m}/mean_return" for m in range(4)}  # every member's final version
    assert sweep.plot_lineage(str(tmp_path))[0].startswith("5: member")
    assert (tmp_path / "lineage_learning_rate.png").stat().st_size > 0
    last = copies[-1]  # the member trained on from its copy with the values it was given
    agent = ppo.agent(config)
    saved = experiment.restore_learner(str(tmp_path), population.member_checkpoints(str(tmp_path), last["member"]),
                                       experiment.learner_template(population.logic_of(agent, last["member"])),
                                       None, "")
    assert int(saved["step"]) == 20
    assert np.isclose(saved["state"]["hyperparams"]["learning_rate"], last["learning_rate"])
    for m in range(4):  # every member ends with the values of its last round, those before the stop included
        final = experiment.restore_learner(str(tmp_path), population.member_checkpoints(str(tmp_path), m),
                                           experiment.learner_template(population.logic_of(agent, m)), None, "")
        given = next(row for row in rows if row["step"] == 15 and row["member"] == m)
        assert np.isclose(final["state"]["hyperparams"]["learning_rate"], given["learning_rate"])
    assert load_policy(str(tmp_path), config_index=last["member"]).step == 20
    assert load_policy(str(tmp_path), config_index=last["member"], best=True).step % 5 == 0  # its evaluator's best


def launch_population(config, run_dir):
    """A Sebulba population's program launched on processes in ``run_dir``."""
    topology = ppo.agent(config).topology()
    return jd.launch(topology.program, launcher="processes", run_dir=str(run_dir), echo=False,
                     resources=experiment.resources(topology.program))


def saved_step(run_dir, member: int, step: int) -> bool:
    """Whether member ``member``'s learner has committed its checkpoint of ``step``."""
    saved = run_dir / f"config-{member}" / "checkpoints" / "learner"
    return saved.is_dir() and str(step) in os.listdir(saved)


def stopped_step(run_dir, member: int) -> int:
    """The step member ``member``'s learner last said it stopped at (and saved)."""
    log = open(jd.log_path(str(run_dir), f"learner/{member}")).read()
    return int(log.rsplit("learner: stopped at step ", 1)[1].split(":")[0])


def sigterm_after_a_checkpoint(command: list[str], checkpoints, log) -> str:
    """Run ``command`` until its learner has saved an update in ``checkpoints``, SIGTERM it, and
    return its output once it has exited 0."""
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        while process.poll() is None:
            if checkpoints.is_dir() and any(name.isdigit() and int(name) > 0 for name in os.listdir(checkpoints)):
                process.send_signal(signal.SIGTERM)
                break
            time.sleep(0.05)
        assert process.wait(timeout=120) == 0, open(log).read()
    return open(log).read()
