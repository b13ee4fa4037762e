"""The evaluator node: the deterministic policy's returns on seeded episodes, its row in
``evaluations.csv``, the stop at the target and after the learner's final version, and no row
for an evaluation a stop cut short, in a launched program."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import chex
import best_policy_life as life
import jax
import numpy as np
import pytest
import slow_envs

import jaxdist as jd
from jaxdist.agents.actor_critic import ActorCritic
from jaxdist.agents.actor_critic import ActorCriticPolicy
from jaxdist.envs.vector import EnvSpec
from jaxdist.records.metrics import read_metrics
from jaxdist.learning.checkpoint import Checkpointer
from jaxdist.learning.layout import checkpoint_dir
from jaxdist.records.metrics import MetricsWriter, metrics_path
from jaxdist.nodes.evaluator import BEST_POLICY, EVALUATIONS, Evaluator, BestPolicy
from jaxdist.nodes.parameter_server import ParameterServer, VersionedParams
from jaxdist.envs.spaces import ActionSpace, EnvInfo

CARTPOLE = EnvInfo((4,), "float32", ActionSpace(num_actions=2))
POLICY = ActorCriticPolicy(CARTPOLE, "mlp", (8,), deterministic=True)  # as agents give evaluators


def params(seed: int = 0):
    network = ActorCritic(action=CARTPOLE.action, hidden=(8,))
    return {"network": jax.tree.map(np.asarray, network.init(jax.random.key(seed), np.zeros((1, 4), np.float32)))}


@pytest.mark.parametrize("backend", ["auto", "jax"])
def test_an_evaluation_plays_one_episode_per_env_and_its_seed_fixes_the_returns(tmp_path, backend):
    """gymnasium's envs stepped from Python, or (the JAX backend) the port's episodes in one call."""
    evaluator = Evaluator(POLICY, EnvSpec("CartPole-v1", 4, backend=backend), ParameterServer(params()),
                          every_updates=1, seed=3, run_dir=str(tmp_path))
    try:
        first = evaluator.evaluate(params(), episode_seed=100)
        again = evaluator.evaluate(params(), episode_seed=100)
        other = evaluator.evaluate(params(), episode_seed=200)
    finally:
        evaluator.close()
    assert first.shape == (4,) and (first >= 8).all() and (first <= 500).all()  # whole CartPole episodes
    np.testing.assert_array_equal(first, again)  # deterministic policy, same start states
    assert not np.array_equal(first, other)


def ended_by_the_evaluator(program: jd.Program, run_dir) -> bool:
    """Launch ``program`` (threads) and wait for it to end: whether the evaluator ended it."""
    running = jd.launch(program, launcher="threads", run_dir=str(run_dir), echo=False)
    try:
        assert running.wait(timeout=60)
    finally:
        running.stop()
    return running.stop_reason.endswith("(node 'evaluator/0')")


def test_in_a_program_it_writes_each_evaluation_and_ends_the_program_at_the_target(tmp_path):
    program = jd.Program("evaluation")
    server = program.add_node(jd.CourierNode(ParameterServer, params(), 1), label="params")
    program.add_node(jd.CourierNode(Evaluator, POLICY, EnvSpec("CartPole-v1", 4), server, every_updates=1, seed=0,
                                    target_return=5.0, stop_at_target=True), label="evaluator")
    assert ended_by_the_evaluator(program, tmp_path)
    (row,) = read_metrics(tmp_path / "evaluations.csv")
    assert row["step"] == 1 and row["episodes"] == 4 and row["min_return"] <= row["mean_return"] <= row["max_return"]
    assert row["mean_return"] >= 5.0
    # When the version was fetched, before its episodes were played: the env steps of the policy
    # are those made by then (the run's monitor used to take those made by the time it read the row).
    assert row["wall_time"] - 60 < row["version_time"] <= row["wall_time"]


def test_it_evaluates_the_learners_final_version_off_the_interval_and_then_ends_the_program(tmp_path):
    """Before, the evaluator waited for the next multiple of ``every_updates``: a final version
    between two (here 7, evaluating every 5) was never evaluated, and the program ended only when
    the learner stopped it."""
    program = jd.Program("evaluation")
    server = program.add_node(jd.CourierNode(VersionedParams, params(), 3), label="params")
    program.add_node(jd.CourierNode(Evaluator, POLICY, EnvSpec("CartPole-v1", 2), server, every_updates=5, seed=0,
                                    final_version=7, save_best=True), label="evaluator")
    program.add_node(jd.PyNode(publish_later, server, params(seed=1), 7), label="learner")
    assert ended_by_the_evaluator(program, tmp_path)
    rows = read_metrics(tmp_path / "evaluations.csv")
    assert [row["step"] for row in rows] == [3, 7]
    # The better of the two evaluations' parameters are saved, as their version.
    best = max(rows, key=lambda row: row["mean_return"])
    assert saved_best(tmp_path) == best["step"]
    with Checkpointer(checkpoint_dir(tmp_path, BEST_POLICY)) as saved:
        restored = saved.restore(params(seed=0 if best["step"] == 3 else 1))
    chex.assert_trees_all_equal(restored, params(seed=0 if best["step"] == 3 else 1))


def publish_later(server, parameters, version):
    """A learner's last publish, once the evaluator has evaluated the version it started at."""
    evaluations = os.path.join(jd.current_node().run_dir, "evaluations.csv")
    while not jd.stop_requested() and not (os.path.exists(evaluations) and read_metrics(evaluations)):
        time.sleep(0.05)
    server.push(parameters, version)


def test_an_evaluation_cut_short_by_a_stop_is_not_recorded(tmp_path):
    """Before, the episodes' returns so far were recorded as the evaluation: a stop (Ctrl-C)
    mid-evaluation wrote a low return for the version."""
    slow_envs.STEPPED.clear()
    program = jd.Program("evaluation")
    server = program.add_node(jd.CourierNode(ParameterServer, params(), 1), label="params")
    program.add_node(jd.CourierNode(Evaluator, POLICY, EnvSpec("slow_envs:SlowEpisodes-v0", 2, backend="sync"),
                                    server, every_updates=1, seed=0), label="evaluator")
    running = jd.launch(program, launcher="threads", run_dir=str(tmp_path), echo=False)
    try:
        assert slow_envs.STEPPED.wait(timeout=60)
        time.sleep(0.2)
        running.stop()
    finally:
        running.stop()
    assert read_metrics(tmp_path / "evaluations.csv") == []


def test_a_restarted_evaluator_replaces_the_saved_best_policy_only_with_a_better_one(tmp_path):
    with MetricsWriter(metrics_path(tmp_path, EVALUATIONS)) as writer:  # the run's evaluations so far
        writer.write(4, {"mean_return": 50.0})
    first = BestPolicy(str(tmp_path))
    first.offer(4, params(0), np.array([40.0, 60.0]))  # nothing saved yet: the first is the best
    first.close()
    again = BestPolicy(str(tmp_path))  # a restart: the best so far is evaluations.csv's 50
    again.offer(9, params(1), np.array([30.0]))
    again.close()
    assert saved_best(tmp_path) == 4
    again = BestPolicy(str(tmp_path))
    again.offer(12, params(1), np.array([60.0]))
    again.close()
    assert saved_best(tmp_path) == 12


def saved_best(run_dir) -> int | None:
    with Checkpointer(checkpoint_dir(run_dir, BEST_POLICY)) as saved:
        return saved.latest_step()


@pytest.mark.timeout(120)
def test_a_best_policy_save_cut_short_by_a_kill_and_republished_versions_leave_the_best_saved(tmp_path):
    """A learner restored from its checkpoint republishes versions its evaluator has already
    seen, with other parameters, while the learner's own saves go on in the same process. A
    better republished version replaces the one saved under its number (before, the save was
    skipped: the policy kept was not the one that scored), and the next life's saves survive
    the temporaries that a kill mid-save left (before, saves of two managers in one process at
    once failed with ``Directory not empty``)."""
    best_dir = checkpoint_dir(tmp_path, BEST_POLICY)
    killed = subprocess.run([sys.executable, life.__file__, str(tmp_path)], timeout=90)
    assert killed.returncode == -9
    assert any("orbax-checkpoint-tmp" in name for name in os.listdir(best_dir)), "the save ended before the kill"

    learner_errors: list[BaseException] = []

    def learner_saves() -> None:  # the colocated learner checkpoints meanwhile
        with Checkpointer(checkpoint_dir(tmp_path, "learner"), keep=1) as learner:
            for step in range(1, 31):
                try:
                    learner.save(step, {"w": np.full(1000, step, np.float32)})
                except Exception as error:  # noqa: BLE001 - a failed save is the finding
                    learner_errors.append(error)

    learner = threading.Thread(target=learner_saves)
    learner.start()
    again = BestPolicy(str(tmp_path))  # the saved best: version 4's return, 10
    again.offer(4, life.params(40), np.array([15.0]))  # republished and better: it replaces 4
    again.offer(8, life.params(80), np.array([12.0]))  # republished, not better than 15
    again.close()
    learner.join()
    assert not learner_errors, learner_errors
    with Checkpointer(best_dir) as saved:
        assert saved.latest_step() == 4
        assert saved.restore(life.params(0))["w"][0] == 40.0  # the parameters that scored 15
    assert not [name for name in os.listdir(best_dir) if "orbax-checkpoint-tmp" in name]
